//! [`ProcessGroup`]: a c10d process group (PyTorch's `torch.distributed` engine) owned from Rust.
//!
//! Rendezvous is a `TCPStore` served by rank 0 at `master_addr:master_port`, as in
//! `torch.distributed.init_process_group(init_method="tcp://..")`. The backend is Gloo (CPU tensors;
//! CUDA tensors go through a host copy, for ranks sharing a GPU) or NCCL (CUDA tensors, `nccl`
//! feature). Gradients are all-reduced in flat buckets of at most
//! [`DEFAULT_BUCKET_BYTES`], like DDP's `bucket_cap_mb=25`.
//!
//! Tensors reach c10d without passing through Rust memory: a burn `Tensor` on the LibTorch backend
//! wraps a `tch::Tensor`, which is a pointer to an `at::Tensor`, and that pointer is what the shim
//! receives. A bucket costs one device-side copy in (`cat` of the bucket's tensors, which DDP does
//! too) and none out: the results are views of the reduced bucket.
//!
//! Every rank must call the same collectives in the same order with tensors of the same sizes.
//! A peer that dies or never arrives makes the pending call fail after [`DistConfig::timeout`]
//! (Gloo), or the NCCL watchdog tear the process down, so a lost rank ends the job instead of
//! hanging it.

use std::ffi::CString;
use std::time::{Duration, Instant};

use burn::tensor::Tensor;
use tch::{Device as TchDevice, Kind};

use crate::flight::{FlightRecorder, State, now_ms};
use dpo_torch::bridge::{self, Origin};
use dpo_torch::{TorchError, ffi, has_nccl};

/// DDP's default bucket size (`bucket_cap_mb=25`).
pub const DEFAULT_BUCKET_BYTES: usize = 25 * 1024 * 1024;

/// The collective backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// Gloo: TCP transport, host memory (the shim copies a CUDA tensor to the host and back:
    /// ranks that share a GPU, which NCCL refuses). Always available.
    Gloo,
    /// NCCL: CUDA tensors on device `local_rank`. Needs the `nccl` feature and a GPU.
    Nccl,
}

/// The wire format of gradient buckets (DDP's communication hooks): as they are, or cast to half
/// precision after dividing by the world size, summed in it, and cast back (torch's
/// `fp16_compress_hook` / `bf16_compress_hook`), which halves the bytes sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Compression {
    #[default]
    None,
    Bf16,
    Fp16,
}

impl Compression {
    pub(crate) fn wire_kind(self) -> Option<Kind> {
        match self {
            Compression::None => None,
            Compression::Bf16 => Some(Kind::BFloat16),
            Compression::Fp16 => Some(Kind::Half),
        }
    }
}

/// How to join a process group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DistConfig {
    /// This process's rank in `0..world_size`.
    pub rank: usize,
    /// The number of processes.
    pub world_size: usize,
    /// The CUDA device this process uses with [`Backend::Nccl`] (torchrun's `LOCAL_RANK`); ignored by
    /// Gloo.
    pub local_rank: usize,
    /// Host or address of rank 0, which serves the rendezvous store.
    pub master_addr: String,
    /// Port of the rendezvous store on `master_addr`.
    pub master_port: u16,
    /// Gloo for CPU tensors, NCCL for CUDA tensors.
    pub backend: Backend,
    /// The limit for the rendezvous and for every collective.
    pub timeout: Duration,
}

/// A failure of the process group or of a collective.
#[derive(Debug, thiserror::Error)]
pub enum DistError {
    #[error("rank `{rank}` is not below the world size `{world_size}`")]
    RankOutOfRange { rank: usize, world_size: usize },
    #[error("the master address `{0}` contains a NUL byte")]
    BadMasterAddr(String),
    #[error("the timeout must be between 1 ms and i64::MAX ms, got {0:?}")]
    BadTimeout(Duration),
    #[error("the broadcast root `{root}` is not below the world size `{world_size}`")]
    BadRoot { root: usize, world_size: usize },
    #[error("the bucket size must be positive")]
    ZeroBucket,
    #[error(
        "the NCCL backend is not compiled in ({}): `dpo-train env` says what this build has",
        dpo_torch::NCCL_BUILD
    )]
    NcclNotCompiled,
    /// The shim reported a failure (timeouts, lost peers and rendezvous errors included).
    #[error("c10d `{op}` failed (code {code}): {message}")]
    C10d { op: &'static str, code: i32, message: String },
    /// A tensor is not a LibTorch tensor (another burn backend).
    #[error("tensor {index} is not a LibTorch tensor: {reason}")]
    NotLibTorch { index: usize, reason: String },
    /// A collective failed (timed out, lost a peer): where this rank was, and for how long.
    #[error("rank {rank} gave up after {secs:.0} s in {place}")]
    During {
        rank: usize,
        place: String,
        secs: f64,
        #[source]
        source: Box<DistError>,
    },
    #[error("libtorch failed while preparing `{op}`")]
    Tch {
        op: &'static str,
        #[source]
        source: tch::TchError,
    },
}

/// Wraps a libtorch error of `op` (for `map_err`).
pub(crate) fn tch_err(op: &'static str) -> impl Fn(tch::TchError) -> DistError {
    move |source| DistError::Tch { op, source }
}

/// Maps a shim status code of `op` to a result.
fn check(op: &'static str, code: i32) -> Result<(), DistError> {
    dpo_torch::check(op, code).map_err(DistError::from)
}

impl From<TorchError> for DistError {
    fn from(e: TorchError) -> Self {
        match e {
            TorchError::Shim { op, code, message } => Self::C10d { op, code, message },
            TorchError::Tch { op, source } => Self::Tch { op, source },
            TorchError::NotLibTorch { index, reason } => Self::NotLibTorch { index, reason },
        }
    }
}

/// A joined process group. Dropping it leaves the group (NCCL communicators are shut down).
#[derive(Debug)]
pub struct ProcessGroup {
    raw: *mut ffi::C10dGroup,
    rank: usize,
    world_size: usize,
    /// Where scalars, metrics and gather buffers live for this backend.
    device: TchDevice,
    bucket_bytes: usize,
    /// This rank's latest collective, for the report of a hang.
    flight: Box<FlightRecorder>,
    /// Payload bytes of every collective so far (what this rank put on the wire).
    sent: std::cell::Cell<u64>,
}

// SAFETY: the C10dGroup is a heap object with no thread affinity (c10d backends are used from
// whichever thread calls them, and their worker threads are internal). `ProcessGroup` is not
// `Sync`: all calls go through `&self` of one thread at a time, which keeps the collective order.
unsafe impl Send for ProcessGroup {}

impl ProcessGroup {
    /// Joins the group: blocks until all `world_size` ranks have rendezvoused, or fails after
    /// `config.timeout` (wrong world size, unreachable master, a rank that never starts).
    pub fn new(config: &DistConfig) -> Result<Self, DistError> {
        let DistConfig { rank, world_size, local_rank, master_addr, master_port, backend, timeout } = config;
        if rank >= world_size {
            return Err(DistError::RankOutOfRange { rank: *rank, world_size: *world_size });
        }
        let timeout_ms = i64::try_from(timeout.as_millis()).ok().filter(|&ms| ms > 0);
        let timeout_ms = timeout_ms.ok_or(DistError::BadTimeout(*timeout))?;
        if *backend == Backend::Nccl && !has_nccl() {
            return Err(DistError::NcclNotCompiled);
        }
        let addr = CString::new(master_addr.as_str()).map_err(|_| DistError::BadMasterAddr(master_addr.clone()))?;
        let too_big = |_| DistError::RankOutOfRange { rank: *rank, world_size: *world_size };
        let (rank_i, world_i) = (i32::try_from(*rank).map_err(too_big)?, i32::try_from(*world_size).map_err(too_big)?);
        let device_i = i32::try_from(*local_rank).unwrap_or(i32::MAX);
        let (code, device) = match backend {
            Backend::Gloo => (ffi::BACKEND_GLOO, TchDevice::Cpu),
            Backend::Nccl => (ffi::BACKEND_NCCL, TchDevice::Cuda(*local_rank)),
        };
        let flight = Box::new(FlightRecorder::from_env(*rank));
        flight.enter("rendezvous", (0, 0), 0);
        let mut raw = std::ptr::null_mut();
        // SAFETY: `addr` is a valid NUL-terminated string that outlives the call, and `raw` is a
        // valid out-pointer; the shim writes an owned group to it only on success.
        let status = unsafe {
            ffi::c10d_group_new(addr.as_ptr(), *master_port, rank_i, world_i, code, timeout_ms, device_i, &mut raw)
        };
        flight.leave(if status == 0 { State::Left } else { State::Failed });
        check("init_process_group", status)?;
        let (rank, world_size, bucket_bytes, sent) = (*rank, *world_size, DEFAULT_BUCKET_BYTES, Default::default());
        Ok(Self { raw, rank, world_size, device, bucket_bytes, flight, sent })
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of processes in the group.
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// Names the optimizer step (1-based; 0 before the first) and the phase of the collectives
    /// that follow, for the flight record ([`super::flight`]).
    pub fn set_context(&self, step: u64, phase: &'static str) {
        self.flight.set_context(step, phase);
    }

    /// Names the phase of the collectives that follow, in the same step.
    pub fn set_phase(&self, phase: &'static str) {
        self.flight.set_phase(phase);
    }

    /// This rank's latest collective.
    pub fn last_record(&self) -> Option<super::flight::Record> {
        self.flight.last()
    }

    /// Whether flight records also go to the launcher's file: a benchmark's timed calls keep them
    /// in memory only, so the file write is not part of what is timed.
    pub fn record_to_file(&self, on: bool) {
        self.flight.write_to_file(on);
    }

    /// The largest flat bucket, in bytes, of one gradient collective.
    pub fn bucket_bytes(&self) -> usize {
        self.bucket_bytes
    }

    /// Sets the bucket size (DDP's `bucket_cap_mb`); a tensor larger than it gets a bucket alone.
    pub fn set_bucket_bytes(&mut self, bytes: usize) -> Result<(), DistError> {
        if bytes == 0 {
            return Err(DistError::ZeroBucket);
        }
        self.bucket_bytes = bytes;
        Ok(())
    }

    /// Replaces every tensor with its mean over the ranks (the gradient all-reduce of DDP).
    ///
    /// Tensors are packed in order into flat buckets of at most [`Self::bucket_bytes`] (a new bucket
    /// also starts where the dtype or device changes), with one collective per bucket. The new
    /// tensors are views of the reduced buckets, with the input's shape, dtype, device and autodiff
    /// state. Every rank must pass the same number of tensors with the same shapes.
    ///
    /// On error the slice may hold a mix of reduced and original tensors; the group is then
    /// unusable and the job should end.
    pub fn all_reduce_mean<const D: usize>(&self, tensors: &mut [Tensor<D>]) -> Result<(), DistError> {
        self.all_reduce_bucketed(tensors, ffi::OP_AVG, Compression::None)
    }

    /// Like [`Self::all_reduce_mean`] with the sum over ranks.
    pub fn all_reduce_sum<const D: usize>(&self, tensors: &mut [Tensor<D>]) -> Result<(), DistError> {
        self.all_reduce_bucketed(tensors, ffi::OP_SUM, Compression::None)
    }

    /// Like [`Self::all_reduce_sum`], each bucket sent as `compression` says (the gradients'
    /// all-reduce with `ddp_comm_hook`); the results keep the inputs' dtype.
    pub fn all_reduce_sum_compressed<const D: usize>(
        &self,
        tensors: &mut [Tensor<D>],
        compression: Compression,
    ) -> Result<(), DistError> {
        self.all_reduce_bucketed(tensors, ffi::OP_SUM, compression)
    }

    /// Payload bytes this rank has sent in collectives so far (a compressed bucket counts its
    /// half-precision bytes).
    pub fn payload_bytes(&self) -> u64 {
        self.sent.get()
    }

    /// Replaces every value with its sum over the ranks (loss and metric sums, token counts).
    ///
    /// One collective on a small f64 tensor on the backend's device.
    pub fn all_reduce_sum_f64(&self, values: &mut [f64]) -> Result<(), DistError> {
        if values.is_empty() {
            return Ok(());
        }
        let tch_err = |source| DistError::Tch { op: "all_reduce_sum_f64", source };
        let mut t = tch::Tensor::f_from_slice(values).and_then(|t| t.f_to_device(self.device)).map_err(tch_err)?;
        let bytes = 8 * values.len() as u64;
        self.recorded("all_reduce", (0, 0), bytes, || self.reduce_raw(&mut [&mut t], ffi::OP_SUM))?;
        t.f_to_device(TchDevice::Cpu).and_then(|t| t.f_copy_data(values, values.len())).map_err(tch_err)
    }

    /// Replaces every tensor with rank `root`'s (the initial parameters, so all ranks start equal).
    ///
    /// Bucketed like [`Self::all_reduce_mean`]; on `root` the values are unchanged.
    pub fn broadcast<const D: usize>(&self, tensors: &mut [Tensor<D>], root: usize) -> Result<(), DistError> {
        let root_i = i32::try_from(root).ok().filter(|_| root < self.world_size);
        let root_i = root_i.ok_or(DistError::BadRoot { root, world_size: self.world_size })?;
        self.bucketed(tensors, "broadcast", Compression::None, |flat| {
            let ptr = flat.as_mut_ptr();
            // SAFETY: `self.raw` is a live group (owned by `self`); `ptr` points to a live
            // `at::Tensor` (`flat`, borrowed mutably for the call) and the array has one element.
            check("broadcast", unsafe { ffi::c10d_broadcast(self.raw, &ptr, 1, root_i) })
        })
    }

    /// Blocks until every rank has reached the barrier (or the timeout passes).
    pub fn barrier(&self) -> Result<(), DistError> {
        self.recorded("barrier", (0, 0), 0, || {
            // SAFETY: `self.raw` is a live group owned by `self`.
            check("barrier", unsafe { ffi::c10d_barrier(self.raw) })
        })
    }

    /// Every rank's `local`, indexed by rank (evaluation sums, generated samples).
    ///
    /// Lengths may differ across ranks: the lengths are gathered first (one small collective), the
    /// values are padded to the longest, gathered, and cut back. With equal lengths everywhere that
    /// is still two collectives; f32 values only.
    pub fn all_gather_f32(&self, local: &[f32]) -> Result<Vec<Vec<f32>>, DistError> {
        let tch_err = |source| DistError::Tch { op: "all_gather_f32", source };
        let len = i64::try_from(local.len()).unwrap_or(i64::MAX);
        let lens = self.gather_raw(&tch::Tensor::f_from_slice(&[len]).map_err(tch_err)?, Kind::Int64)?;
        let mut lens_host = vec![0_i64; self.world_size];
        let host_lens = lens.f_to_device(TchDevice::Cpu).and_then(|t| t.f_copy_data(&mut lens_host, self.world_size));
        host_lens.map_err(tch_err)?;
        let lens_host: Vec<usize> = lens_host.iter().map(|&n| usize::try_from(n).unwrap_or(0)).collect();
        let longest = lens_host.iter().copied().max().unwrap_or(0);
        if longest == 0 {
            // Every rank sees the same lengths, so every rank skips the second collective.
            return Ok(vec![Vec::new(); self.world_size]);
        }
        let mut padded = local.to_vec();
        padded.resize(longest, 0.0);
        let out = self.gather_raw(&tch::Tensor::f_from_slice(&padded).map_err(tch_err)?, Kind::Float)?;
        let mut host = vec![0_f32; longest * self.world_size];
        let n = host.len();
        out.f_to_device(TchDevice::Cpu).and_then(|t| t.f_copy_data(&mut host, n)).map_err(tch_err)?;
        Ok(lens_host.iter().zip(host.chunks(longest)).map(|(&n, values)| values[..n.min(longest)].to_vec()).collect())
    }

    /// Sums the contiguous tensor `t` over the ranks in place: one collective, no bucketing.
    pub fn all_reduce_sum_tensor(&self, t: &mut tch::Tensor) -> Result<(), DistError> {
        let bytes = (t.numel() * t.kind().elt_size_in_bytes()) as u64;
        self.recorded("all_reduce", (0, 0), bytes, || self.reduce_raw(&mut [t], ffi::OP_SUM))
    }

    /// Gathers every rank's contiguous `input` into `output`, which holds `world_size` times as
    /// many elements of the same dtype on the same device, rank r's at `[r·n, (r+1)·n)`: one
    /// collective (torch's `all_gather_into_tensor`, c10d's `_allgather_base`).
    pub fn all_gather_into(&self, output: &mut tch::Tensor, input: &mut tch::Tensor) -> Result<(), DistError> {
        self.all_gather_into_at(output, input, (0, 0))
    }

    /// [`Self::all_gather_into`] as bucket `place.0` of `place.1` (for the flight record).
    pub(super) fn all_gather_into_at(
        &self,
        output: &mut tch::Tensor,
        input: &mut tch::Tensor,
        place: (usize, usize),
    ) -> Result<(), DistError> {
        // SAFETY (of the call in `flat`): `group` is this live group; both pointers are to live
        // `at::Tensor`s borrowed for the call; the shim checks sizes, dtypes and devices.
        self.flat("all_gather", place, output, input, |group, input, output| unsafe {
            ffi::c10d_all_gather_flat(group, input, output)
        })
    }

    /// One flat collective between `input` and `output` through `call` (a shim function given
    /// the group, the input and the output), recorded as bucket `place` of `op`.
    fn flat(
        &self,
        op: &'static str,
        place: (usize, usize),
        output: &mut tch::Tensor,
        input: &mut tch::Tensor,
        call: impl FnOnce(*mut ffi::C10dGroup, *mut torch_sys::C_tensor, *mut torch_sys::C_tensor) -> i32,
    ) -> Result<(), DistError> {
        let bytes = (input.numel() * input.kind().elt_size_in_bytes()) as u64;
        let (input_ptr, output_ptr) = (input.as_mut_ptr(), output.as_mut_ptr());
        self.recorded(op, place, bytes, || check(op, call(self.raw, input_ptr, output_ptr)))
    }

    /// Rank r's contiguous `output` becomes the sum over ranks of the r-th of `world_size` equal
    /// slices of their `input`: one collective (torch's `reduce_scatter_tensor`, c10d's
    /// `_reduce_scatter_base`).
    pub fn reduce_scatter_sum(&self, output: &mut tch::Tensor, input: &mut tch::Tensor) -> Result<(), DistError> {
        self.reduce_scatter_sum_at(output, input, (0, 0))
    }

    /// [`Self::reduce_scatter_sum`] as bucket `place.0` of `place.1` (for the flight record).
    pub(super) fn reduce_scatter_sum_at(
        &self,
        output: &mut tch::Tensor,
        input: &mut tch::Tensor,
        place: (usize, usize),
    ) -> Result<(), DistError> {
        // SAFETY: as in `all_gather_into_at`.
        self.flat("reduce_scatter", place, output, input, |group, input, output| unsafe {
            ffi::c10d_reduce_scatter(group, input, output, ffi::OP_SUM)
        })
    }

    /// The device this group's collectives run on (CPU for Gloo, `cuda:local_rank` for NCCL).
    pub fn device(&self) -> TchDevice {
        self.device
    }

    /// All-gathers the 1-D host tensor `local` (moved to the backend's device) into a
    /// `[world_size * numel]` tensor on that device.
    fn gather_raw(&self, local: &tch::Tensor, kind: Kind) -> Result<tch::Tensor, DistError> {
        let tch_err = |source| DistError::Tch { op: "all_gather", source };
        let mut input = local.f_to_device(self.device).map_err(tch_err)?;
        let n = input.numel() * self.world_size;
        let mut output =
            tch::Tensor::f_zeros([i64::try_from(n).unwrap_or(i64::MAX)], (kind, self.device)).map_err(tch_err)?;
        let (input_ptr, output_ptr) = (input.as_mut_ptr(), output.as_mut_ptr());
        let bytes = (input.numel() * kind.elt_size_in_bytes()) as u64;
        self.recorded("all_gather", (0, 0), bytes, || {
            // SAFETY: `self.raw` is a live group; both pointers are to live `at::Tensor`s
            // (`input`, `output`) that outlive the call, and `output` has `world_size` times the
            // input's elements as the shim requires (it checks again and reports a mismatch).
            check("all_gather", unsafe { ffi::c10d_all_gather(self.raw, input_ptr, output_ptr) })
        })?;
        Ok(output)
    }

    /// All-reduces tch tensors in place, one collective each.
    fn reduce_raw(&self, tensors: &mut [&mut tch::Tensor], op: i32) -> Result<(), DistError> {
        let ptrs: Vec<*mut torch_sys::C_tensor> = tensors.iter_mut().map(|t| t.as_mut_ptr()).collect();
        // SAFETY: `self.raw` is a live group; `ptrs` holds `ptrs.len()` pointers to live
        // `at::Tensor`s, each mutably borrowed through `tensors` for the whole call.
        check("all_reduce", unsafe { ffi::c10d_all_reduce(self.raw, ptrs.as_ptr(), ptrs.len(), op) })
    }

    fn all_reduce_bucketed<const D: usize>(
        &self,
        tensors: &mut [Tensor<D>],
        op: i32,
        compression: Compression,
    ) -> Result<(), DistError> {
        self.bucketed(tensors, "all_reduce", compression, |flat| self.reduce_raw(&mut [flat], op))
    }

    /// Runs one collective between flight records: entering before, left or failed after. A
    /// failure says where this rank was and for how long.
    fn recorded(
        &self,
        op: &'static str,
        bucket: (usize, usize),
        bytes: u64,
        call: impl FnOnce() -> Result<(), DistError>,
    ) -> Result<(), DistError> {
        self.flight.enter(op, bucket, bytes);
        self.sent.set(self.sent.get() + bytes);
        let result = call();
        // NCCL returns once the collective is enqueued: whether it completed is not known here.
        let done = if matches!(self.device, TchDevice::Cuda(_)) { State::Issued } else { State::Left };
        self.flight.leave(if result.is_ok() { done } else { State::Failed });
        result.map_err(|source| {
            // Only a failure inside c10d (a timeout, a lost peer) happened while waiting.
            if !matches!(source, DistError::C10d { code: 2 | 3, .. }) {
                return source;
            }
            let record = self.flight.last();
            let (place, secs) = record.map_or((op.to_owned(), 0.0), |r| (r.place(), r.waited(now_ms()).as_secs_f64()));
            DistError::During { rank: self.rank, place, secs, source: Box::new(source) }
        })
    }

    /// Packs `tensors` into flat buckets, runs `collective` on each bucket in place (in the wire
    /// format `compression` gives), and replaces the tensors with views of the results.
    fn bucketed<const D: usize>(
        &self,
        tensors: &mut [Tensor<D>],
        op: &'static str,
        compression: Compression,
        collective: impl Fn(&mut tch::Tensor) -> Result<(), DistError>,
    ) -> Result<(), DistError> {
        let tch_err = |source| DistError::Tch { op, source };
        // Shallow handles on the same storage: no data moves here.
        let mut unwrapped: Vec<(tch::Tensor, Origin)> = Vec::with_capacity(tensors.len());
        for (index, t) in tensors.iter().enumerate() {
            unwrapped.push(bridge::to_tch(t.clone()).map_err(|reason| DistError::NotLibTorch { index, reason })?);
        }
        let mut ends = Vec::new();
        while ends.last().copied().unwrap_or(0) < unwrapped.len() {
            ends.push(bucket_end(&unwrapped, ends.last().copied().unwrap_or(0), self.bucket_bytes));
        }
        let mut start = 0;
        for (index, &end) in ends.iter().enumerate() {
            let flats: Vec<tch::Tensor> = unwrapped[start..end]
                .iter()
                .map(|(t, _)| t.f_reshape([-1]))
                .collect::<Result<_, _>>()
                .map_err(tch_err)?;
            // The one device-side copy: the bucket's tensors side by side.
            let mut bucket = tch::Tensor::f_cat(&flats, 0).map_err(tch_err)?; // [sum of numels]
            let place = (index + 1, ends.len());
            match compression.wire_kind() {
                None => {
                    let bytes = (bucket.numel() * bucket.kind().elt_size_in_bytes()) as u64;
                    self.recorded(op, place, bytes, || collective(&mut bucket))?;
                }
                Some(wire) => {
                    // Divided before the cast, as torch's hooks do, so the sum cannot overflow fp16.
                    let world = self.world_size as f64;
                    let mut half = bucket.f_div_scalar(world).and_then(|b| b.f_to_kind(wire)).map_err(tch_err)?;
                    let bytes = (half.numel() * wire.elt_size_in_bytes()) as u64;
                    self.recorded(op, place, bytes, || collective(&mut half))?;
                    let back = half.f_to_kind(bucket.kind()).and_then(|h| h.f_mul_scalar(world)).map_err(tch_err)?;
                    bucket.f_copy_(&back).map_err(tch_err)?;
                }
            }
            let mut offset = 0_i64;
            for (slot, (t, origin)) in tensors[start..end].iter_mut().zip(&unwrapped[start..end]) {
                let numel = i64::try_from(t.numel()).unwrap_or(i64::MAX);
                let view =
                    bucket.f_narrow(0, offset, numel).and_then(|v| v.f_view(t.size().as_slice())).map_err(tch_err)?;
                *slot = bridge::from_tch(view, *origin);
                offset += numel;
            }
            start = end;
        }
        Ok(())
    }
}

/// The end (exclusive) of the bucket that starts at `start`: tensors of the same dtype and device
/// while they fit in `bucket_bytes`, and at least one tensor.
fn bucket_end(tensors: &[(tch::Tensor, Origin)], start: usize, bucket_bytes: usize) -> usize {
    let bytes = |t: &tch::Tensor| t.numel() * t.kind().elt_size_in_bytes();
    let (first, _) = &tensors[start];
    let (kind, device) = (first.kind(), first.device());
    let mut total = bytes(first);
    let mut end = start + 1;
    while let Some((t, _)) = tensors.get(end) {
        if t.kind() != kind || t.device() != device || total + bytes(t) > bucket_bytes {
            break;
        }
        total += bytes(t);
        end += 1;
    }
    end
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        // SAFETY: `self.raw` came from a successful `c10d_group_new`, is owned by `self` alone and
        // is freed exactly once, here; the shim swallows any C++ exception during teardown.
        unsafe { ffi::c10d_group_free(self.raw) }
    }
}

/// All-reduce bandwidth of `pg` for a `bytes`-sized f32 buffer on its backend's device, in MB/s
/// (10^6 bytes per second of payload, as `nccl-tests` reports "algbw").
///
/// One warm-up call, then five timed calls. Collective: every rank must call it with the same `bytes`.
pub fn allreduce_bandwidth(pg: &ProcessGroup, bytes: usize) -> Result<f64, DistError> {
    const TIMED: u32 = 5;
    let tch_err = |source| DistError::Tch { op: "allreduce_bandwidth", source };
    let numel = i64::try_from((bytes / 4).max(1)).unwrap_or(i64::MAX);
    let mut buffer = tch::Tensor::f_ones([numel], (Kind::Float, pg.device)).map_err(tch_err)?;
    pg.set_phase("bandwidth test");
    let bytes = numel as u64 * 4;
    pg.recorded("all_reduce", (0, 0), bytes, || pg.reduce_raw(&mut [&mut buffer], ffi::OP_SUM))?;
    pg.barrier()?;
    let started = Instant::now();
    for _ in 0..TIMED {
        pg.recorded("all_reduce", (0, 0), bytes, || pg.reduce_raw(&mut [&mut buffer], ffi::OP_SUM))?;
    }
    // Reading one element waits for the last collective on CUDA streams too.
    buffer.f_double_value(&[0]).map_err(tch_err)?;
    let secs = started.elapsed().as_secs_f64().max(f64::MIN_POSITIVE);
    Ok((numel as f64 * 4.0 * f64::from(TIMED)) / secs / 1e6)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_bad_configs_before_touching_the_network() {
        let cfg = DistConfig {
            rank: 2,
            world_size: 2,
            local_rank: 0,
            master_addr: "127.0.0.1".into(),
            master_port: 1,
            backend: Backend::Gloo,
            timeout: Duration::from_secs(1),
        };
        let err = ProcessGroup::new(&cfg).unwrap_err();
        assert_eq!(err.to_string(), "rank `2` is not below the world size `2`");
        let err = ProcessGroup::new(&DistConfig { rank: 0, timeout: Duration::ZERO, ..cfg.clone() }).unwrap_err();
        assert_eq!(err.to_string(), "the timeout must be between 1 ms and i64::MAX ms, got 0ns");
        let err = ProcessGroup::new(&DistConfig { rank: 0, master_addr: "a\0b".into(), ..cfg.clone() }).unwrap_err();
        assert!(matches!(err, DistError::BadMasterAddr(_)), "{err}");
        if !has_nccl() {
            let err = ProcessGroup::new(&DistConfig { rank: 0, backend: Backend::Nccl, ..cfg }).unwrap_err();
            assert!(err.to_string().starts_with("The NCCL backend is not compiled in ("), "{err}");
        }
    }

    #[test]
    fn buckets_split_on_size_and_dtype() {
        let t = |n: i64, kind| (tch::Tensor::zeros([n], (kind, TchDevice::Cpu)), Origin::plain());
        let ts = vec![t(4, Kind::Float), t(4, Kind::Float), t(20, Kind::Float), t(2, Kind::Double), t(2, Kind::Float)];
        // 16 B + 16 B fit in 32 B; 80 B is alone; the f64 starts a bucket; the f32 after it another.
        assert_eq!(bucket_end(&ts, 0, 32), 2);
        assert_eq!(bucket_end(&ts, 2, 32), 3);
        assert_eq!(bucket_end(&ts, 3, 1 << 20), 4);
        assert_eq!(bucket_end(&ts, 4, 1 << 20), 5);
        assert_eq!(bucket_end(&ts, 0, 1 << 20), 3);
    }
}
