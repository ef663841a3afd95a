//! The CUDA caching allocator's high-water mark through the shim (tch binds no allocator
//! statistics): what `torch.cuda.max_memory_allocated` reports, the figure TRL's and torchtune's
//! users read a GPU run's memory by. The host's resident set says little on a GPU.

use burn::tensor::{Device, Tensor};

use crate::{TorchError, check, ffi};

/// The CUDA index of `device`; `None` on the CPU.
pub fn cuda_index(device: &Device) -> Option<usize> {
    let (probe, _) = crate::bridge::to_tch(Tensor::<1>::zeros([1], device)).ok()?;
    match probe.device() {
        tch::Device::Cuda(i) => Some(i),
        _ => None,
    }
}

/// Starts a new mark on CUDA device `index`.
pub fn reset_peak_allocated(index: usize) -> Result<(), TorchError> {
    call(index, true).map(drop)
}

/// The most bytes allocated on CUDA device `index` since the last reset (or the process start).
pub fn peak_allocated(index: usize) -> Result<u64, TorchError> {
    call(index, false).map(|p| p.allocated)
}

/// The high-water marks of CUDA device `index` since the last reset.
pub fn peaks(index: usize) -> Result<Peaks, TorchError> {
    call(index, false)
}

/// The caching allocator's high-water marks, bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peaks {
    /// Handed out to tensors (`torch.cuda.max_memory_allocated`).
    pub allocated: u64,
    /// Held from the driver, cached free blocks included (`torch.cuda.max_memory_reserved`):
    /// what must fit on the GPU.
    pub reserved: u64,
}

/// The name of CUDA device `index` (`torch.cuda.get_device_name`), e.g. "NVIDIA H100 80GB HBM3".
pub fn cuda_device_name(index: usize) -> Result<String, TorchError> {
    let mut out = [0 as std::ffi::c_char; 256];
    let device = i32::try_from(index).unwrap_or(i32::MAX);
    // SAFETY: `out` is a live buffer of `out.len()` bytes for the call, which writes at most that
    // many, NUL included; the shim catches every C++ exception.
    check("cuda_device_name", unsafe { ffi::c10d_cuda_device_name(device, out.as_mut_ptr(), out.len()) })?;
    // SAFETY: the shim NUL-terminates within the buffer on success.
    let name = unsafe { std::ffi::CStr::from_ptr(out.as_ptr()) };
    Ok(name.to_string_lossy().into_owned())
}

fn call(index: usize, reset: bool) -> Result<Peaks, TorchError> {
    let (mut allocated, mut reserved) = (0i64, 0i64);
    let device = i32::try_from(index).unwrap_or(i32::MAX);
    // SAFETY: both outputs are live i64s for the call; the shim checks the device and catches
    // every C++ exception.
    check("cuda_peak_allocated", unsafe {
        ffi::c10d_cuda_peak_allocated(device, i32::from(reset), &mut allocated, &mut reserved)
    })?;
    let bytes = |b: i64| u64::try_from(b).unwrap_or(0);
    Ok(Peaks { allocated: bytes(allocated), reserved: bytes(reserved) })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A CPU device has no CUDA mark, and a build or machine without CUDA answers with an error
    /// naming the call instead of crashing.
    #[test]
    #[allow(deprecated)] // burn's libtorch device is deprecated upstream; it is this project's backend.
    fn the_cpu_has_no_cuda_mark() {
        assert_eq!(cuda_index(&Device::libtorch()), None);
        if !tch::Cuda::is_available() {
            let e = peak_allocated(0).unwrap_err().to_string();
            assert!(e.contains("cuda_peak_allocated"), "{e}");
            let e = cuda_device_name(0).unwrap_err().to_string();
            assert!(e.contains("cuda_device_name"), "{e}");
        }
    }
}
