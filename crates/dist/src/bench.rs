//! What `check-gpu --bench` measures (through `dpo-train bench-comm`): all-reduce, all-gather and
//! reduce-scatter of flat f32 buffers over the process group training uses, timed as nccl-tests
//! times them (a warm-up call, then the mean of timed calls; the slowest rank's time), each result
//! checked; and per device the copy bandwidth and a bf16 matmul rate.

use std::time::{Duration, Instant};

use burn::tensor::{Device, Tensor};
use check_gpu::bench::{Bench, Collective, DeviceSpeed, Measurement, sizes};
use tch::{Device as TchDevice, Kind};

use super::launcher::{PORT_TRIES, free_port, says_port_taken};
use super::process_group::{Backend, DistConfig, DistError, ProcessGroup, tch_err};
use dpo_torch::bridge;

/// Timed calls per size: enough for about 1 GiB moved, between 3 and nccl-tests' 20.
fn iterations(bytes: u64) -> u32 {
    u32::try_from(((1_u64 << 30) / bytes.max(1)).clamp(3, 20)).unwrap_or(20)
}

/// The libtorch device under a burn device.
pub fn tch_device(device: &Device) -> Result<TchDevice, DistError> {
    let probe = Tensor::<1>::zeros([1], device);
    let (t, _) = bridge::to_tch(probe).map_err(|reason| DistError::NotLibTorch { index: 0, reason })?;
    Ok(t.device())
}

/// A group of this process alone on `device` (NCCL on CUDA), so one device is measured the same way.
pub fn single_rank_group(device: TchDevice, timeout: Duration) -> Result<ProcessGroup, DistError> {
    let (backend, local_rank) = match device {
        TchDevice::Cuda(i) => (Backend::Nccl, i),
        _ => (Backend::Gloo, 0),
    };
    // The free port can be taken by another process before the store listens there: another one.
    for attempt in 1.. {
        let master_port = free_port().map_err(|e| DistError::C10d { op: "bench", code: -1, message: e.to_string() })?;
        let master_addr = "127.0.0.1".to_owned();
        let config = DistConfig { rank: 0, world_size: 1, local_rank, master_addr, master_port, backend, timeout };
        match ProcessGroup::new(&config) {
            Err(e) if attempt < PORT_TRIES && says_port_taken(&e.to_string()) => continue,
            done => return done,
        }
    }
    unreachable!("the last try returns")
}

/// Waits for the device's queued work, so a timer read afterwards covers it.
fn sync(device: TchDevice) {
    if let TchDevice::Cuda(i) = device {
        tch::Cuda::synchronize(i64::try_from(i).unwrap_or(0));
    }
}

/// Measures everything on every rank; `label(rank)` names rank's device (`cuda:3`, `cpu`).
/// Collective: every rank calls it with the same sizes.
pub fn measure(
    pg: &ProcessGroup,
    label: &dyn Fn(usize) -> String,
    (min_bytes, max_bytes): (u64, u64),
) -> Result<Bench, DistError> {
    pg.set_context(0, "bandwidth test");
    let device = pg.device();
    let local = device_speed(device, max_bytes)?;
    let speeds = pg.all_gather_f32(&[local.0 as f32, local.1 as f32])?;
    let devices = speeds
        .iter()
        .enumerate()
        .map(|(rank, s)| DeviceSpeed {
            device: label(rank),
            copy_gbps: f64::from(s[0]),
            matmul_tflops: f64::from(s[1]),
            matmul_dtype: "bf16".to_owned(),
        })
        .collect();
    let mut collectives = Vec::new();
    for op in Collective::ALL {
        for bytes in sizes(min_bytes, max_bytes) {
            collectives.push(collective(pg, op, bytes)?);
        }
    }
    let backend = if matches!(device, TchDevice::Cuda(_)) { "nccl" } else { "gloo" };
    Ok(Bench { backend: backend.to_owned(), world_size: pg.world_size(), devices, collectives })
}

/// One (collective, size) point: checked once, then timed; the slowest rank's mean time.
fn collective(pg: &ProcessGroup, op: Collective, bytes: u64) -> Result<Measurement, DistError> {
    let world = pg.world_size() as i64;
    // f32 elements, a multiple of the world size so every rank's slice is equal.
    let numel = ((i64::try_from(bytes / 4).unwrap_or(i64::MAX) / world) * world).max(world);
    let mut call = prepare(pg, op, numel)?;
    let correct = call(pg, true)?;
    pg.barrier()?;
    let iters = iterations(bytes);
    sync(pg.device());
    pg.record_to_file(false);
    let started = Instant::now();
    let timed: Result<(), DistError> = (0..iters).try_for_each(|_| call(pg, false).map(drop));
    sync(pg.device());
    let secs = started.elapsed().as_secs_f64() / f64::from(iters);
    pg.record_to_file(true);
    timed?;
    let all = pg.all_gather_f32(&[secs as f32, f32::from(u8::from(correct))])?;
    let slowest = all.iter().map(|r| f64::from(r[0])).fold(0.0, f64::max);
    let correct = all.iter().all(|r| r[1] == 1.0);
    Ok(Measurement { op, bytes: numel as u64 * 4, seconds: slowest, correct })
}

/// A call of `op` on buffers of `numel` elements (the whole buffer: the gathered output, the
/// scattered input); with `true` it reports whether the result is the exact expected one.
type Call = Box<dyn FnMut(&ProcessGroup, bool) -> Result<bool, DistError>>;

fn prepare(pg: &ProcessGroup, op: Collective, numel: i64) -> Result<Call, DistError> {
    let (device, world, rank) = (pg.device(), pg.world_size() as i64, pg.rank() as i64);
    let err = tch_err("bench");
    let chunk = numel / world;
    // Small integers: every sum is exact in f32, so the check is equality.
    let mine = (rank + 1) as f64;
    let ranks_sum = (world * (world + 1) / 2) as f64;
    let all_equal = |t: &tch::Tensor, value: f64| -> Result<bool, DistError> {
        let all = t.f_eq(value).and_then(|e| e.f_all()).and_then(|a| a.f_int64_value(&[]));
        Ok(all.map_err(tch_err("bench"))? == 1)
    };
    // [numel]: element j holds j / chunk, the slice it belongs to.
    let slices = move || {
        tch::Tensor::f_arange(world, (Kind::Float, device)).and_then(|r| r.f_repeat_interleave_self_int(chunk, 0, None))
    };
    Ok(match op {
        Collective::AllReduce => {
            let mut buf = tch::Tensor::f_full([numel], mine, (Kind::Float, device)).map_err(&err)?;
            Box::new(move |pg, check| {
                pg.all_reduce_sum_tensor(&mut buf)?;
                if !check {
                    return Ok(true);
                }
                let ok = all_equal(&buf, ranks_sum)?;
                // Zeros from now on: timed calls cannot overflow.
                buf.f_zero_().map(drop).map_err(tch_err("bench"))?;
                Ok(ok)
            })
        }
        Collective::AllGather => {
            let mut input = tch::Tensor::f_full([chunk], mine, (Kind::Float, device)).map_err(&err)?;
            let mut output = tch::Tensor::f_zeros([numel], (Kind::Float, device)).map_err(&err)?;
            Box::new(move |pg, check| {
                pg.all_gather_into(&mut output, &mut input)?;
                if !check {
                    return Ok(true);
                }
                // Slice r must hold rank r's value, r + 1.
                let expected = slices().and_then(|s| s.f_add_scalar(1.0)).map_err(tch_err("bench"))?;
                let all = output.f_eq_tensor(&expected).and_then(|e| e.f_all()).and_then(|a| a.f_int64_value(&[]));
                Ok(all.map_err(tch_err("bench"))? == 1)
            })
        }
        Collective::ReduceScatter => {
            // Slice s of every rank's input holds rank + 1 + 1000 s: rank r receives the ranks' sum
            // plus world · 1000 r, so a slice sent to the wrong rank shows.
            let input = slices().and_then(|s| s.f_mul_scalar(1000.0)).and_then(|t| t.f_add_scalar(mine));
            let mut input = input.map_err(&err)?;
            let mut output = tch::Tensor::f_zeros([chunk], (Kind::Float, device)).map_err(&err)?;
            let value = ranks_sum + (world * 1000 * rank) as f64;
            Box::new(move |pg, check| {
                pg.reduce_scatter_sum(&mut output, &mut input)?;
                if check { all_equal(&output, value) } else { Ok(true) }
            })
        }
    })
}

/// This device's copy bandwidth (GB/s: bytes copied per second, 1e9) and bf16 matmul TFLOP/s.
fn device_speed(device: TchDevice, max_bytes: u64) -> Result<(f64, f64), DistError> {
    let err = tch_err("bench");
    let cuda = matches!(device, TchDevice::Cuda(_));
    // Large enough to leave the caches: 256 MiB on a GPU, up to 64 MiB of host memory.
    let bytes = if cuda { 256 << 20 } else { (64 << 20).min(max_bytes.max(1 << 20)) };
    let numel = i64::try_from(bytes / 4).unwrap_or(i64::MAX);
    let src = tch::Tensor::f_ones([numel], (Kind::Float, device)).map_err(&err)?;
    let mut dst = tch::Tensor::f_zeros([numel], (Kind::Float, device)).map_err(&err)?;
    dst.f_copy_(&src).map_err(&err)?;
    let copy_gbps = timed(device, 10, || dst.f_copy_(&src).map(drop).map_err(tch_err("bench")))
        .map(|secs| (numel as f64 * 4.0) / secs / 1e9)?;
    // 4096 on a GPU (2·4096³ FLOP a call); 1024 on a CPU, where bf16 is slow.
    let n: i64 = if cuda { 4096 } else { 1024 };
    let a = tch::Tensor::f_ones([n, n], (Kind::BFloat16, device)).map_err(&err)?;
    let b = tch::Tensor::f_ones([n, n], (Kind::BFloat16, device)).map_err(&err)?;
    a.f_matmul(&b).map(drop).map_err(&err)?;
    let iters = if cuda { 20 } else { 3 };
    let flops = 2.0 * (n as f64).powi(3);
    let tflops =
        timed(device, iters, || a.f_matmul(&b).map(drop).map_err(tch_err("bench"))).map(|secs| flops / secs / 1e12)?;
    Ok((copy_gbps, tflops))
}

/// Mean seconds of `iters` calls of `f`, the device's queue drained before and after.
fn timed(device: TchDevice, iters: u32, mut f: impl FnMut() -> Result<(), DistError>) -> Result<f64, DistError> {
    sync(device);
    let started = Instant::now();
    for _ in 0..iters {
        f()?;
    }
    sync(device);
    Ok((started.elapsed().as_secs_f64() / f64::from(iters)).max(f64::MIN_POSITIVE))
}
