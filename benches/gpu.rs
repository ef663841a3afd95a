//! `make gpu-check`: the GPU path run end to end on `cuda:0`, written to
//! `results/gpu/<date>-<gpu>.md`:
//! 1. check-gpu's live probe of this machine (NVML, topology, NCCL);
//! 2. a one-process NCCL group: an all-reduce checked against its expected sum, then
//!    all-reduce / all-gather / reduce-scatter bandwidth as `check-gpu --bench` measures it;
//! 3. 20 training steps of the medium model on `cuda:0` in f32 and in bf16, each step's loss and
//!    chosen log-prob next to the same run on the CPU (equal within the precision's round-off);
//! 4. throughput and model-FLOPs utilisation next to TRL's `DPOTrainer` on the same GPU
//!    (the chat-sized workload of `make bench-trl`).
//!
//! Without a CUDA device it says so and exits 0. Failures of the checks are printed and make the
//! exit status 1, after the results file is written.

mod common;

use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use burn::tensor::{Device, FloatDType, Tensor, TensorData};
use common::{GQA32M, MEDIUM, dpo_train_rate_at, pair_forward_flops, passes, trl_rate};
use dpo_train::dist::bench::{measure, single_rank_group};
use dpo_train::train::log::{Split, read_metrics};

/// Training steps compared with the CPU.
const STEPS: usize = 20;

#[allow(deprecated)] // burn's libtorch device is deprecated upstream; it is this project's backend.
fn main() {
    if !tch::Cuda::is_available() {
        println!("gpu-check: libtorch sees no CUDA device here, so there is nothing to check (exit 0)");
        return;
    }
    let gpu = gpu_name();
    let mut report = format!("# GPU check: {gpu}\n\n");
    let mut failures = Vec::new();
    let _ = writeln!(report, "{}\n", versions());
    section(&mut report, "check-gpu (live probe)", &probe());
    section(&mut report, "NCCL, one process", &nccl(&mut failures));
    let work = common::root().join("target/bench-assets");
    std::fs::create_dir_all(&work).expect("target/bench-assets");
    let out = tempfile::tempdir().expect("a temporary directory");
    section(&mut report, "Training on cuda:0 against the CPU", &parity(&work, out.path(), &mut failures));
    section(&mut report, "Throughput against TRL on this GPU", &throughput(&work, out.path()));
    let _ = writeln!(
        report,
        "## Checks\n\n{}",
        if failures.is_empty() { "all passed".to_owned() } else { failures.join("\n") }
    );

    let dir = common::root().join("results/gpu");
    std::fs::create_dir_all(&dir).expect("results/gpu");
    let slug: String =
        gpu.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' }).collect();
    let path = dir.join(format!("{}-{slug}.md", today()));
    let tmp = path.with_extension("md.tmp");
    std::fs::write(&tmp, &report).and_then(|()| std::fs::rename(&tmp, &path)).expect("the results file is written");
    println!("{report}\nwritten to {}", path.display());
    if !failures.is_empty() {
        std::process::exit(1);
    }
}

fn section(report: &mut String, title: &str, body: &str) {
    let _ = writeln!(report, "## {title}\n\n```\n{}\n```\n", body.trim_end());
}

/// A command's output, or what went wrong running it.
fn output(program: &Path, args: &[&str]) -> String {
    match Command::new(program).args(args).output() {
        Ok(o) => String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr),
        Err(e) => format!("{} did not run: {e}", program.display()),
    }
}

fn gpu_name() -> String {
    let text = output(Path::new("nvidia-smi"), &["--query-gpu=name", "--format=csv,noheader", "-i", "0"]);
    text.lines().next().map_or("unknown GPU".to_owned(), |l| l.trim().to_owned())
}

fn today() -> String {
    output(Path::new("date"), &["+%F"]).trim().to_owned()
}

/// The libtorch and driver this check ran on.
fn versions() -> String {
    let python = common::python();
    let torch = output(&python, &["-c", "import torch; print(torch.__version__, 'CUDA', torch.version.cuda)"]);
    let driver = output(Path::new("nvidia-smi"), &["--query-gpu=driver_version", "--format=csv,noheader", "-i", "0"]);
    format!("torch {} (the libtorch dpo-train links), NVIDIA driver {}", torch.trim(), driver.trim())
}

/// check-gpu's table for this machine (the binary `make gpu-check` builds beside this bench).
fn probe() -> String {
    let exe = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| common::root().join("target"), std::path::PathBuf::from)
        .join("release/check-gpu");
    output(&exe, &[])
}

/// A group of this process alone, over NCCL: one checked all-reduce, then the bandwidth sweep.
#[allow(deprecated)] // burn's libtorch device is deprecated upstream; it is this project's backend.
fn nccl(failures: &mut Vec<String>) -> String {
    let group = match single_rank_group(tch::Device::Cuda(0), Duration::from_secs(120)) {
        Ok(g) => g,
        Err(e) => {
            failures.push(format!("NCCL group: {e}"));
            return format!("the NCCL group did not start: {e}");
        }
    };
    let device = Device::libtorch_cuda(0);
    let values: Vec<f32> = (0..1 << 20).map(|i| (i % 97) as f32).collect();
    let mut t = [Tensor::<1>::from_data(TensorData::new(values.clone(), [values.len()]), &device)];
    let mut text = String::new();
    match group.all_reduce_sum(&mut t) {
        Ok(()) => {
            let got = t[0].clone().into_data().to_vec::<f32>().expect("f32");
            let ok = got == values;
            let _ = writeln!(
                text,
                "all-reduce of 1 Mi f32 over 1 rank: {}",
                if ok { "equal to the input" } else { "WRONG" }
            );
            if !ok {
                failures.push("NCCL all-reduce returned other values".to_owned());
            }
        }
        Err(e) => failures.push(format!("NCCL all-reduce: {e}")),
    }
    match measure(&group, &|_| "cuda:0".to_owned(), (1 << 20, 1 << 28)) {
        Ok(bench) => text + &serde_json::to_string_pretty(&bench).unwrap_or_default(),
        Err(e) => {
            failures.push(format!("NCCL bandwidth: {e}"));
            text
        }
    }
}

/// The medium model 20 steps on cuda:0 and on the CPU, f32 and bf16: per-step loss and chosen
/// log-prob side by side, with the largest differences.
fn parity(work: &Path, out: &Path, failures: &mut Vec<String>) -> String {
    let model = common::model_dir(&work.join("medium"), &MEDIUM);
    let data = common::long_pairs(&work.join("long-pairs.jsonl"), 64);
    let mut text = String::new();
    // (precision, flags, loss tolerance, relative log-prob tolerance)
    for (name, flags, loss_tol, logp_tol) in [("f32", &[][..], 1e-3, 1e-3), ("bf16", &["--bf16"][..], 2e-2, 2e-2)] {
        let run = |device: &str| {
            let mut args = flags.to_vec();
            args.extend(["--device", device, "--learning-rate", "1e-5"]);
            dpo_train_rate_at(&model, &data, out, (2, STEPS, 512), &args);
            let dir = out.join(format!("run512{}", args.join("").replace(['-', ':'], "_")));
            let rows = read_metrics(&dir.join("metrics.csv")).expect("metrics.csv");
            let train = rows.into_iter().filter(|r| r.split == Split::Train);
            train
                .map(|r| (r.metric("loss").unwrap_or(f64::NAN), r.metric("logps/chosen").unwrap_or(f64::NAN)))
                .collect::<Vec<_>>()
        };
        let (gpu, cpu) = (run("cuda:0"), run("cpu"));
        let _ = writeln!(text, "{name}: step, loss cuda / cpu, logps/chosen cuda / cpu");
        let (mut dloss, mut dlogp) = (0.0f64, 0.0f64);
        for (step, (g, c)) in gpu.iter().zip(&cpu).enumerate() {
            let _ = writeln!(text, "  {:>2}  {:.6} / {:.6}   {:.3} / {:.3}", step + 1, g.0, c.0, g.1, c.1);
            dloss = dloss.max((g.0 - c.0).abs());
            dlogp = dlogp.max(((g.1 - c.1) / c.1).abs());
        }
        let ok = gpu.len() == STEPS && cpu.len() == STEPS && dloss <= loss_tol && dlogp <= logp_tol;
        let _ = writeln!(
            text,
            "{name}: largest loss difference {dloss:.2e} (allowed {loss_tol:.0e}), largest relative log-prob difference {dlogp:.2e} (allowed {logp_tol:.0e}): {}\n",
            if ok { "ok" } else { "FAILED" }
        );
        if !ok {
            failures.push(format!("{name} on cuda:0 differs from the CPU: loss {dloss:.2e}, log-prob {dlogp:.2e}"));
        }
    }
    text
}

/// `make bench-trl`'s workload on cuda:0, both sides, f32 and bf16 with the reference computed
/// every step, with model-FLOPs utilisation against the best matrix product measured here.
fn throughput(work: &Path, out: &Path) -> String {
    let model = common::model_dir(&work.join("gqa32m"), &GQA32M);
    let data = common::sized_pairs(&work.join("pairs-16-96.jsonl"), &model, 256, 16..=96, 150..=250, 1);
    let flops = pair_forward_flops(&data, &model, &GQA32M, 512) * passes(true);
    let mut text = format!("256 pairs, 4 a step, max_length 512, {:.2} useful GFLOP a pair\n", flops / 1e9);
    for (name, dtype, ours_flags, trl_flags) in [
        ("f32", FloatDType::F32, &["--device", "cuda:0"][..], &["--device", "cuda"][..]),
        ("bf16", FloatDType::BF16, &["--device", "cuda:0", "--bf16"][..], &["--device", "cuda", "--bf16"][..]),
    ] {
        let peak = cuda_matmul_peak(dtype);
        let ours = dpo_train_rate_at(&model, &data, out, (4, 64, 512), ours_flags).pairs_per_second;
        let theirs = trl_rate(&model, &data, (4, 64, 512), trl_flags).pairs_per_second;
        let mfu = |rate: f64| 100.0 * rate * flops / peak;
        let _ = writeln!(
            text,
            "{name}, reference every step: dpo-train {ours:.1} pairs/s (MFU {:.1}%), TRL {theirs:.1} pairs/s (MFU {:.1}%), {:.2}x; matmul peak {:.1} TFLOP/s",
            mfu(ours),
            mfu(theirs),
            ours / theirs,
            peak / 1e12
        );
    }
    text
}

/// The best of a few large square matrix products on `cuda:0` in `dtype`, FLOP/s.
#[allow(deprecated)]
fn cuda_matmul_peak(dtype: FloatDType) -> f64 {
    use burn::tensor::Distribution;
    let device = Device::libtorch_cuda(0);
    let mut best: f64 = 0.0;
    for n in [4096usize, 8192] {
        let a = Tensor::<2>::random([n, n], Distribution::Default, &device).cast(dtype);
        let b = Tensor::<2>::random([n, n], Distribution::Default, &device).cast(dtype);
        for _ in 0..5 {
            tch::Cuda::synchronize(0);
            let started = std::time::Instant::now();
            let c = a.clone().matmul(b.clone());
            let _ = c.slice([0..1, 0..1]).into_data(); // waits for the product
            best = best.max(2.0 * (n * n * n) as f64 / started.elapsed().as_secs_f64());
        }
    }
    best
}
