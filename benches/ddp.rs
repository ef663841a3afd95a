//! `make bench`: data-parallel throughput on this machine.
//!
//! - DPO training pairs/s of the demo's model on the demo task with `cpu:1` and `cpu:2` (one and
//!   two worker processes, the cores divided between them), the same global batch;
//! - the all-reduce bandwidth of the Gloo path for 1, 16 and 64 MB buffers, 2 processes;
//! - the all-gather and reduce-scatter bandwidth ZeRO's slices travel by (`dpo-train
//!   bench-comm`, the same flat collectives), 2 and 4 processes.
//!
//! Timings are printed, never asserted.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use dpo_train::dist::{DistConfig, ProcessGroup, allreduce_bandwidth, launch};

const ROLE: &str = "DPO_TRAIN_BENCH_ROLE";

fn main() {
    if std::env::var(ROLE).is_ok_and(|r| r == "allreduce") {
        allreduce_worker();
        return;
    }
    let exe = env!("CARGO_BIN_EXE_dpo-train");
    let dir = tempfile::tempdir().expect("a temporary directory");
    println!("data-parallel DPO training (demo model, global batch 32, 60 steps after 1 warm-up run)");
    let mut rates = Vec::new();
    for world in [1usize, 2] {
        let rate = train_rate(exe, dir.path(), world);
        println!("  cpu:{world}  {rate:8.1} pairs/s");
        rates.push(rate);
    }
    println!("  scaling efficiency cpu:2 / (2 x cpu:1) = {:.2}", rates[1] / (2.0 * rates[0]));
    println!("Gloo all-reduce bandwidth, 2 processes on 127.0.0.1");
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    if let Err(e) = launch(2, |_| vec![(ROLE.to_owned(), "allreduce".to_owned())], &args) {
        eprintln!("all-reduce benchmark failed: {e}");
        std::process::exit(1);
    }
    for world in [2, 4] {
        zero_collectives(exe, world);
    }
}

/// The bus bandwidth of the flat all-gather and reduce-scatter over `world` CPU processes.
fn zero_collectives(exe: &str, world: usize) {
    let out = Command::new(exe)
        .args(["bench-comm", "--devices", &format!("cpu:{world}"), "--max-bytes", "67108864"])
        .output()
        .expect("dpo-train bench-comm runs");
    let text = String::from_utf8_lossy(&out.stdout);
    let bench: Option<check_gpu::bench::Bench> = text.lines().find_map(|l| serde_json::from_str(l).ok());
    let Some(bench) = bench.filter(|_| out.status.success()) else {
        eprintln!("bench-comm failed:\n{}", String::from_utf8_lossy(&out.stderr));
        std::process::exit(1);
    };
    println!(
        "ZeRO's collectives (all-gather of parameter slices, reduce-scatter of gradients), {world} processes: busbw"
    );
    for op in [check_gpu::bench::Collective::AllGather, check_gpu::bench::Collective::ReduceScatter] {
        let sizes: Vec<String> =
            bench.of(op).iter().map(|m| format!("{} MiB {:.2} GB/s", m.bytes >> 20, m.busbw(world))).collect();
        println!("  {:<15} {}", op.name(), sizes.join(", "));
    }
}

/// Pairs per second of 60 DPO steps (the demo's data and model, no SFT, no evaluation).
fn train_rate(exe: &str, dir: &Path, world: usize) -> f64 {
    let micro = (32 / world).to_string();
    let run = format!("bench-{world}");
    let mut args = vec![
        "train",
        "--output-dir",
        dir.to_str().unwrap_or("."),
        "--run-name",
        &run,
        "--sft-steps",
        "0",
        "--max-steps",
        "60",
        "--eval-steps",
        "0",
        "--save-steps",
        "0",
        "--logging-steps",
        "60",
        "--num-samples",
        "0",
        "--per-device-train-batch-size",
        &micro,
        "--global-batch-size",
        "32",
    ];
    let devices = format!("cpu:{world}");
    if world > 1 {
        args.extend(["--devices", &devices]);
    }
    // The first run builds the demo's assets; time the second.
    for attempt in 0..2 {
        let _ = std::fs::remove_dir_all(dir.join(&run));
        let started = Instant::now();
        let out = Command::new(exe).args(&args).output().expect("dpo-train runs");
        if !out.status.success() {
            eprintln!("{}", String::from_utf8_lossy(&out.stderr));
            std::process::exit(1);
        }
        if attempt == 1 {
            // Read the trainer's own rate for the 60 steps (start-up excluded).
            let rows = dpo_train::train::log::read_metrics(&dir.join(&run).join("metrics.csv")).expect("metrics.csv");
            return rows
                .iter()
                .rev()
                .find_map(|r| r.pairs_per_second)
                .unwrap_or_else(|| 60.0 * 32.0 / started.elapsed().as_secs_f64());
        }
    }
    unreachable!("two attempts")
}

fn allreduce_worker() {
    let env = dpo_train::dist::env::detect().expect("worker environment");
    let group = ProcessGroup::new(&DistConfig {
        rank: env.rank,
        world_size: env.world_size,
        local_rank: env.local_rank,
        master_addr: env.master_addr.clone(),
        master_port: env.master_port,
        backend: dpo_train::dist::Backend::Gloo,
        timeout: std::time::Duration::from_secs(120),
    })
    .expect("process group");
    for mb in [1usize, 16, 64] {
        let rate = allreduce_bandwidth(&group, mb << 20).expect("all-reduce");
        if env.rank == 0 {
            println!("  {mb:3} MB  {rate:8.1} MB/s");
        }
    }
}
