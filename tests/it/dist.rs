//! Multi-process tests of `dpo_train::dist` on CPU with Gloo, after `torch.distributed`'s own
//! tests (`MultiProcessTestCase`): real processes, real TCP rendezvous.
//!
//! Each test launches copies of this test executable through `dist::launch` with the harness
//! arguments `--exact dist::worker_entry`, and `DIST_TEST_ROLE` says which scenario the worker runs;
//! `worker_entry` returns at once in a normal test run. A failing worker assertion exits the worker
//! with code 101, which `launch` reports with the rank.

use std::ffi::OsString;
use std::time::{Duration, Instant};

use burn::tensor::{Device, Tensor, TensorData};
use dpo_train::dist::{self, Backend, Compression, DistConfig, LaunchError, ProcessGroup};

const ROLE: &str = "DIST_TEST_ROLE";
const TIMEOUT: Duration = Duration::from_secs(3);

#[allow(deprecated)] // LibTorch is this project's backend on purpose.
fn device() -> Device {
    Device::libtorch()
}

fn worker_args() -> Vec<OsString> {
    ["--exact", "dist::worker_entry", "--nocapture", "--test-threads=1"].map(OsString::from).to_vec()
}

/// Launches `world` workers running `role` (plus `extra` variables), timing the run.
fn run(world: usize, role: &str, extra: &[(&str, &str)]) -> (Result<(), LaunchError>, Duration) {
    let started = Instant::now();
    let env = |_rank| {
        let mut vars = vec![(ROLE.to_string(), role.to_string()), ("DIST_TEST_BUCKET".into(), "40".into())];
        vars.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        vars
    };
    let result = dist::launch(world, env, &worker_args()).map(|_| ());
    (result, started.elapsed())
}

/// A Gloo group config for the worker `env` describes.
fn config(env: dist::WorkerEnv, timeout: Duration) -> DistConfig {
    DistConfig {
        rank: env.rank,
        world_size: env.world_size,
        local_rank: env.local_rank,
        master_addr: env.master_addr,
        master_port: env.master_port,
        backend: Backend::Gloo,
        timeout,
    }
}

fn group(timeout: Duration) -> ProcessGroup {
    let env = dist::env::detect().expect("the launcher sets the worker variables");
    ProcessGroup::new(&config(env, timeout)).expect("rendezvous")
}

fn values(t: &Tensor<1>) -> Vec<f32> {
    t.to_data().try_to_vec::<f32>().expect("f32 tensor")
}

/// Tensor `i` of rank `r`: element j is (r + 1)(i + 1) + j·W, so every sum and mean is an exact
/// f32 integer: the mean is (i + 1)(W + 1)/2 + j·W.
fn rank_tensor(rank: usize, world: usize, i: usize, len: usize) -> Vec<f32> {
    (0..len).map(|j| ((rank + 1) * (i + 1) + j * world) as f32).collect()
}

/// The worker side of every scenario.
#[test]
fn worker_entry() {
    let Ok(role) = std::env::var(ROLE) else { return };
    match role.as_str() {
        "collectives" => collectives(),
        "exit3" => {
            let rank = dist::env::detect().map(|e| e.rank).unwrap_or(0);
            if rank == 1 {
                eprintln!("rank 1 gives up on purpose");
                std::process::exit(3);
            }
            // The others would wait far longer than the test allows: the launcher must kill them.
            std::thread::sleep(Duration::from_secs(60));
        }
        "expect_rendezvous_failure" => {
            let env = dist::env::detect().expect("worker variables");
            let cfg = config(env.clone(), TIMEOUT);
            let started = Instant::now();
            let err = ProcessGroup::new(&cfg).expect_err("a world size of 3 with 2 processes must fail");
            let took = started.elapsed();
            eprintln!("rank {} failed as expected after {took:?}: {err}", env.rank);
            assert!(err.to_string().starts_with("c10d `init_process_group` failed"), "{err}");
            // Rank 0 serves the store: it names the missing rank (the other may see the store go first).
            if env.rank == 0 {
                assert!(err.to_string().contains("rank(s) 2 of 3 never joined the rendezvous at 127.0.0.1:"), "{err}");
            }
            assert!(took < Duration::from_secs(15), "took {took:?}");
        }
        "late_rank" => {
            let env = dist::env::detect().expect("worker variables");
            if env.rank == 1 {
                // Never arrives: the launcher kills it once rank 0 gives up.
                std::thread::sleep(Duration::from_secs(60));
            }
            let cfg = config(env, TIMEOUT);
            let err = ProcessGroup::new(&cfg).expect_err("rank 1 never comes");
            eprintln!("{err}");
            std::process::exit(4);
        }
        other => panic!("unknown role {other}"),
    }
}

/// Every collective, checked for exact values on every rank.
fn collectives() {
    let mut pg = group(Duration::from_secs(20));
    let (rank, world) = (pg.rank(), pg.world_size());
    let dev = device();
    let bucket: usize = std::env::var("DIST_TEST_BUCKET").ok().and_then(|b| b.parse().ok()).unwrap_or(40);
    pg.set_bucket_bytes(bucket).expect("positive bucket");

    // (e) barrier.
    pg.barrier().expect("barrier");

    // (a) all_reduce_mean: 7 tensors of 1..=13 elements, 40-byte buckets (≤ 10 f32): several
    // buckets, some holding several tensors, the 13-element one alone.
    let lens = [3, 1, 13, 5, 2, 9, 4];
    let mut grads: Vec<Tensor<1>> = lens
        .iter()
        .enumerate()
        .map(|(i, &n)| Tensor::from_data(TensorData::new(rank_tensor(rank, world, i, n), [n]), &dev))
        .collect();
    pg.all_reduce_mean(&mut grads).expect("all_reduce_mean");
    for (i, (g, &n)) in grads.iter().zip(&lens).enumerate() {
        let want: Vec<f32> = (0..n).map(|j| ((i + 1) * (world + 1)) as f32 / 2.0 + (j * world) as f32).collect();
        assert_eq!(values(g), want, "rank {rank}, tensor {i}");
    }
    // The results are independent tensors: later arithmetic on one leaves the others alone.
    let bumped = grads[0].clone() + 1.0;
    assert_eq!(values(&grads[0])[0] + 1.0, values(&bumped)[0]);

    // Shapes and autodiff state survive: a [2, 3] tensor that requires grad.
    let mut params: Vec<Tensor<2>> =
        vec![Tensor::<2>::from_data(TensorData::new(vec![rank as f32; 6], [2, 3]), &dev).autodiff().require_grad()];
    pg.all_reduce_sum(&mut params).expect("all_reduce_sum");
    assert_eq!(params[0].dims(), [2, 3]);
    assert!(params[0].is_autodiff() && params[0].is_require_grad());
    let total = (world * (world - 1) / 2) as f32;
    assert_eq!(params[0].to_data().try_to_vec::<f32>().expect("f32"), vec![total; 6]);

    // (b) broadcast from rank 0, then from the last rank.
    let mut init: Vec<Tensor<1>> =
        (0..3).map(|i| Tensor::from_data(TensorData::new(rank_tensor(rank, world, i, 4 + i), [4 + i]), &dev)).collect();
    pg.broadcast(&mut init, 0).expect("broadcast");
    for (i, t) in init.iter().enumerate() {
        assert_eq!(values(t), rank_tensor(0, world, i, 4 + i), "rank {rank}, tensor {i}");
    }
    let mut last = vec![Tensor::<1>::from_data(TensorData::new(vec![rank as f32; 3], [3]), &dev)];
    pg.broadcast(&mut last, world - 1).expect("broadcast from the last rank");
    assert_eq!(values(&last[0]), vec![(world - 1) as f32; 3]);
    let err = pg.broadcast(&mut last, world).expect_err("root out of range");
    assert_eq!(err.to_string(), format!("the broadcast root `{world}` is not below the world size `{world}`"));

    // (c) all_reduce_sum_f64.
    let mut sums = [rank as f64 + 0.25, 1.0, -(rank as f64) * 1e10];
    pg.all_reduce_sum_f64(&mut sums).expect("all_reduce_sum_f64");
    let ranks: f64 = (0..world).map(|r| r as f64).sum();
    assert_eq!(sums, [ranks + 0.25 * world as f64, world as f64, -ranks * 1e10]);

    // (d) all_gather_f32, equal then unequal lengths, then all empty.
    let local: Vec<f32> = vec![rank as f32, 10.0 * rank as f32];
    let gathered = pg.all_gather_f32(&local).expect("all_gather_f32");
    assert_eq!(gathered, (0..world).map(|r| vec![r as f32, 10.0 * r as f32]).collect::<Vec<_>>());
    let uneven: Vec<f32> = (0..rank).map(|j| j as f32 + 0.5).collect();
    let gathered = pg.all_gather_f32(&uneven).expect("uneven all_gather_f32");
    assert_eq!(gathered, (0..world).map(|r| (0..r).map(|j| j as f32 + 0.5).collect()).collect::<Vec<Vec<f32>>>());
    assert_eq!(pg.all_gather_f32(&[]).expect("empty all_gather_f32"), vec![Vec::<f32>::new(); world]);

    // (f) gradient buckets in half precision (ddp_comm_hook): the sum to the wire format's
    // round-off, half the bytes of f32 on the wire.
    for (compression, eps) in [(Compression::Bf16, 2f32.powi(-8)), (Compression::Fp16, 2f32.powi(-11))] {
        let exact: Vec<Vec<f32>> = (0..lens.len())
            .map(|i| {
                (0..lens[i]).map(|j| (0..world).map(|r| rank_tensor(r, world, i, lens[i])[j] / 3.0).sum()).collect()
            })
            .collect();
        let mut grads: Vec<Tensor<1>> = lens
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                let v: Vec<f32> = rank_tensor(rank, world, i, n).iter().map(|x| x / 3.0).collect();
                Tensor::from_data(TensorData::new(v, [n]), &dev)
            })
            .collect();
        let before = pg.payload_bytes();
        pg.all_reduce_sum_compressed(&mut grads, compression).expect("compressed all-reduce");
        let sent = pg.payload_bytes() - before;
        assert_eq!(sent, 2 * lens.iter().sum::<usize>() as u64, "{compression:?}: two bytes per element");
        for (i, g) in grads.iter().enumerate() {
            for (got, want) in values(g).iter().zip(&exact[i]) {
                // Each rank's value and the sum are rounded once each: a few units of round-off.
                assert!((got - want).abs() <= 4.0 * eps * want.abs(), "{compression:?} tensor {i}: {got} vs {want}");
            }
        }
    }
    let before = pg.payload_bytes();
    let mut plain = vec![Tensor::<1>::from_data(TensorData::new(vec![1.0_f32; 10], [10]), &dev)];
    pg.all_reduce_sum(&mut plain).expect("all_reduce_sum");
    assert_eq!(pg.payload_bytes() - before, 40, "f32: four bytes per element");

    // The benchmark helper runs (its value depends on the machine).
    let mbps = dist::allreduce_bandwidth(&pg, 1 << 20).expect("bandwidth");
    assert!(mbps > 0.0, "{mbps}");
    eprintln!("rank {rank}: all-reduce of 1 MiB over Gloo/loopback: {mbps:.0} MB/s");

    pg.barrier().expect("final barrier");
}

#[test]
fn collectives_two_ranks() {
    let (result, took) = run(2, "collectives", &[]);
    result.expect("every rank passes");
    eprintln!("2 ranks: {took:?}");
}

#[test]
fn collectives_three_ranks() {
    let (result, took) = run(3, "collectives", &[]);
    result.expect("every rank passes");
    eprintln!("3 ranks: {took:?}");
}

#[test]
fn wrong_world_size_fails_within_the_timeout() {
    // Two processes that both claim a world of three: the rendezvous can never complete.
    let (result, took) = run(2, "expect_rendezvous_failure", &[("WORLD_SIZE", "3")]);
    result.expect("both ranks see a rendezvous error");
    assert!(took < Duration::from_secs(20), "took {took:?}");
}

#[test]
fn a_rank_that_never_joins_is_named_by_the_others_and_the_launcher() {
    let (result, took) = run(2, "late_rank", &[]);
    let err = result.expect_err("rank 0 gives up");
    assert!(took < Duration::from_secs(20), "took {took:?}");
    assert!(
        err.to_string().starts_with("rank 0 failed (exit code 4); its last stderr line: `c10d `init_process_group`")
    );
    assert!(err.to_string().contains("rank(s) 1 of 2 never joined the rendezvous"), "{err}");
    let report = err.report();
    assert_eq!(report.len(), 2, "{report:?}");
    assert_eq!(report[0], "rank 0: gave up after waiting 3 s in the rendezvous (exit code 4)");
    assert_eq!(report[1], "rank 1: running, has not reached the rendezvous");
}

#[test]
fn unreachable_master_fails_within_the_timeout() {
    // A non-zero rank connects to a port nobody serves.
    let port = dist::launcher::free_port().expect("free port");
    let cfg = DistConfig {
        rank: 1,
        world_size: 2,
        local_rank: 0,
        master_addr: "127.0.0.1".into(),
        master_port: port,
        backend: Backend::Gloo,
        timeout: TIMEOUT,
    };
    let started = Instant::now();
    let err = ProcessGroup::new(&cfg).expect_err("nobody serves the store");
    let took = started.elapsed();
    assert!(err.to_string().starts_with("c10d `init_process_group` failed (code 2): rendezvous: "), "{err}");
    assert!(took < Duration::from_secs(15), "took {took:?}: {err}");
}

#[test]
fn launcher_reports_the_failing_rank_and_kills_the_rest() {
    let (result, took) = run(3, "exit3", &[]);
    let err = result.expect_err("rank 1 exits with 3");
    assert_eq!(err.to_string(), "rank 1 failed (exit code 3); its last stderr line: `rank 1 gives up on purpose`");
    // These workers never joined a group: the report says so for each.
    let report = err.report();
    assert_eq!(report[1], "rank 1: exited (exit code 3) before reaching the rendezvous");
    assert_eq!(report[0], "rank 0: running, has not reached the rendezvous");
    assert_eq!(report.len(), 3);
    assert!(took < Duration::from_secs(30), "took {took:?}");
}

/// A one-rank NCCL group reduces CUDA tensors where a GPU exists, and fails with an error (not a
/// crash) where none does, or where this build has no NCCL (a CPU build of torch).
#[test]
fn nccl_single_rank_or_clean_error() {
    let cfg = DistConfig {
        rank: 0,
        world_size: 1,
        local_rank: 0,
        master_addr: "127.0.0.1".into(),
        master_port: dist::launcher::free_port().expect("free port"),
        backend: Backend::Nccl,
        timeout: Duration::from_secs(20),
    };
    if !dpo_torch::has_nccl() {
        let err = ProcessGroup::new(&cfg).expect_err("no NCCL");
        assert!(err.to_string().starts_with("The NCCL backend is not compiled in"), "{err}");
        return;
    }
    if !tch::Cuda::is_available() {
        let err = ProcessGroup::new(&cfg).expect_err("no GPU");
        assert!(err.to_string().starts_with("c10d `init_process_group` failed"), "{err}");
        return;
    }
    let pg = ProcessGroup::new(&cfg).expect("NCCL on GPU 0");
    #[allow(deprecated)] // LibTorch is this project's backend on purpose.
    let dev = Device::libtorch_cuda(0);
    let mut grads = vec![Tensor::<1>::from_data(TensorData::new(vec![1.0_f32, 2.0, 3.0], [3]), &dev)];
    pg.all_reduce_mean(&mut grads).expect("all_reduce_mean");
    assert_eq!(values(&grads[0]), vec![1.0, 2.0, 3.0]);
    let mut sums = [2.5];
    pg.all_reduce_sum_f64(&mut sums).expect("all_reduce_sum_f64");
    assert_eq!(sums, [2.5]);
    assert_eq!(pg.all_gather_f32(&[4.0]).expect("all_gather_f32"), vec![vec![4.0]]);
    // The flat collectives of NCCL (`_allgather_base`, `_reduce_scatter_base`): a group of one copies.
    let cuda = tch::Device::Cuda(0);
    let mut input = tch::Tensor::from_slice(&[1.0_f32, 2.0]).to_device(cuda);
    let mut output = tch::Tensor::zeros([2], (tch::Kind::Float, cuda));
    pg.all_gather_into(&mut output, &mut input).expect("all_gather_into");
    assert_eq!((output.double_value(&[0]), output.double_value(&[1])), (1.0, 2.0));
    let mut scattered = tch::Tensor::zeros([2], (tch::Kind::Float, cuda));
    pg.reduce_scatter_sum(&mut scattered, &mut input).expect("reduce_scatter_sum");
    assert_eq!((scattered.double_value(&[0]), scattered.double_value(&[1])), (1.0, 2.0));
    pg.barrier().expect("barrier");
}

/// `dpo-train bench-comm` (what `check-gpu --bench --devices cpu:N` runs): every collective at
/// every size, each result exact, on 2 and 3 CPU workers (3 does not divide 1 MiB of f32).
#[test]
fn bench_comm_measures_every_collective_over_gloo() {
    use check_gpu::bench::{Bench, Collective};
    for world in [2_usize, 3] {
        let devices = format!("cpu:{world}");
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_dpo-train"))
            .args(["bench-comm", "--devices", &devices, "--max-bytes", "4194304", "--timeout", "60"])
            .output()
            .expect("dpo-train runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        let bench: Bench = serde_json::from_slice(&out.stdout).expect("one JSON object on stdout");
        bench.validate(world).expect("a valid bench");
        assert_eq!((bench.backend.as_str(), bench.world_size, bench.devices.len()), ("gloo", world, world));
        assert!(bench.devices.iter().all(|d| d.device == "cpu" && d.copy_gbps > 0.0 && d.matmul_tflops > 0.0));
        for op in Collective::ALL {
            let points = bench.of(op);
            let sizes: Vec<u64> = points.iter().map(|m| m.bytes).collect();
            // 1 MiB and 4 MiB, rounded down to a multiple of the ranks' f32 slices.
            let round = |b: u64| b / (4 * world as u64) * (4 * world as u64);
            assert_eq!(sizes, vec![round(1 << 20), round(4 << 20)], "{op:?}");
            assert!(points.iter().all(|m| m.correct && m.seconds > 0.0 && m.busbw(world) > 0.0), "{op:?}: {points:?}");
        }
    }
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dpo-train"))
        .args(["bench-comm", "--devices", "cpu:2", "--min-bytes", "8", "--max-bytes", "4"])
        .output()
        .expect("dpo-train runs");
    // Bad flags: the exit code of every bad input.
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.trim(), "error: `--min-bytes`: 8 is above --max-bytes 4");
}
