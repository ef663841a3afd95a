//! Copies between the host and the training device, made one way and counted.
//!
//! torch's blocking copy to a GPU (`.to(cuda)`, what burn's `from_data` runs) is a
//! `cudaMemcpyAsync` followed by `cudaStreamSynchronize`: the host waits until every kernel queued
//! before it has run, and the GPU, its queue drained, then waits for the host. A step that
//! uploaded each of a batch's index tensors, the reference's inputs again and the loss's inputs
//! (about 24 uploads and 33 synchronisations a step in the H200 profile of the 0.5B row) kept the
//! host from ever running ahead of the GPU. [`upload`] copies from page-locked memory without
//! waiting (torch's caching host allocator keeps the block until the copy has run); a read back
//! ([`count_read`]) is the one wait left, on the steps that log.

// burn marks burn-tch deprecated in favour of CubeCL backends; this project runs on LibTorch on
// purpose, so the deprecation is expected here.
#![allow(deprecated)]

use std::sync::atomic::{AtomicU64, Ordering};

use burn::tensor::{Device, Int, Tensor};
use burn_tch::{LibTorch, TchTensor};

static UPLOADS: AtomicU64 = AtomicU64::new(0);
static READS: AtomicU64 = AtomicU64::new(0);

/// Copies made so far in this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Transfers {
    /// Host values put on a device by [`upload`].
    pub uploads: u64,
    /// Device values read back to the host ([`count_read`]).
    pub reads: u64,
}

impl Transfers {
    /// The copies made since `earlier`.
    pub fn since(self, earlier: Transfers) -> Transfers {
        Transfers { uploads: self.uploads - earlier.uploads, reads: self.reads - earlier.reads }
    }
}

/// The counts so far.
pub fn counts() -> Transfers {
    Transfers { uploads: UPLOADS.load(Ordering::Relaxed), reads: READS.load(Ordering::Relaxed) }
}

/// Counts a read of device values back to the host (the caller makes it).
pub fn count_read() {
    READS.fetch_add(1, Ordering::Relaxed);
}

/// `host` (a CPU tensor) on `device`: to a GPU from page-locked memory without waiting for the
/// queued kernels, or, where pinning fails, by torch's plain copy; on the CPU the tensor itself.
pub fn upload(host: &tch::Tensor, device: tch::Device) -> tch::Tensor {
    UPLOADS.fetch_add(1, Ordering::Relaxed);
    if !device.is_cuda() {
        return host.to_device(device);
    }
    match crate::kernels::pinned_copy(host) {
        Ok(pinned) => pinned.to_device_(device, pinned.kind(), true, false),
        Err(_) => host.to_device(device),
    }
}

/// `values` as a `[N]` integer tensor on `device`, on its side of autodiff, in one [`upload`].
pub fn upload_ints(values: &[i64], device: &Device) -> Tensor<1, Int> {
    let t = upload(&tch::Tensor::from_slice(values), tch_device(device));
    let t = Tensor::<1, Int>::from_primitive::<LibTorch>(TchTensor::new(t));
    if device.is_autodiff() { t.autodiff() } else { t }
}

/// `values` as a `[N]` f32 tensor on `device`, on its side of autodiff, in one [`upload`].
pub fn upload_floats(values: &[f32], device: &Device) -> Tensor<1> {
    let t = upload(&tch::Tensor::from_slice(values), tch_device(device));
    let t = Tensor::<1>::from_primitive::<LibTorch>(TchTensor::new(t));
    if device.is_autodiff() { t.autodiff() } else { t }
}

/// The libtorch device behind `device` (LibTorch is this project's one backend): its CUDA device,
/// else the CPU.
fn tch_device(device: &Device) -> tch::Device {
    crate::allocator::cuda_index(device).map_or(tch::Device::Cpu, tch::Device::Cuda)
}
