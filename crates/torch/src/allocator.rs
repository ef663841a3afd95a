//! The CUDA caching allocator's high-water mark through the shim (tch binds no allocator
//! statistics): what `torch.cuda.max_memory_allocated` reports, the figure TRL's and torchtune's
//! users read a GPU run's memory by. The host's resident set says little on a GPU.

use std::sync::{Mutex, PoisonError};

use burn::tensor::{Device, Tensor};

use crate::{TorchError, check, ffi};

/// The CUDA index of `device`; `None` on the CPU. Known once per device: asking torch takes a
/// probe tensor (three operators), and each micro-batch's upload asks.
pub fn cuda_index(device: &Device) -> Option<usize> {
    static KNOWN: Mutex<Vec<(Device, Option<usize>)>> = Mutex::new(Vec::new());
    let mut known = KNOWN.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((_, index)) = known.iter().find(|(d, _)| d == device) {
        return *index;
    }
    let index =
        crate::bridge::to_tch(Tensor::<1>::zeros([1], device)).ok().and_then(|(probe, _)| match probe.device() {
            tch::Device::Cuda(i) => Some(i),
            _ => None,
        });
    known.push((device.clone(), index));
    index
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

/// The CUDA caching allocator's settings where the user gives none: expandable segments. Packed
/// rows change length every micro-batch, and the default allocator caches freed blocks at the
/// sizes they had, then maps new ones: on an H200 the 0.5B shape's run held 48.4 GiB from the
/// driver for a 27.7 GiB peak of tensors at micro-batch 16, 138.9 GiB for 83.0 at 64. Expandable
/// segments grow one mapping per stream instead (torchtitan's and Megatron's launch scripts set
/// the same).
pub const DEFAULT_CUDA_ALLOCATOR: &str = "expandable_segments:True";

/// The variables torch reads allocator settings from: 2.9's name, then the deprecated ones.
pub const ALLOCATOR_VARS: [&str; 3] = ["PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF"];

/// Where this process's CUDA allocator settings come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllocatorSettings {
    /// One of [`ALLOCATOR_VARS`], which torch read itself.
    User { var: &'static str, value: String },
    /// [`DEFAULT_CUDA_ALLOCATOR`], applied by [`configure_cuda_allocator`].
    Default,
    /// Not applied: the reason (a build without CUDA).
    Unavailable(String),
}

/// Applies [`DEFAULT_CUDA_ALLOCATOR`] unless the environment (`var` reads it) sets one of
/// [`ALLOCATOR_VARS`]; at the start of a process, before its first CUDA allocation.
pub fn configure_cuda_allocator(var: impl Fn(&str) -> Option<String>) -> AllocatorSettings {
    if let Some((name, value)) = ALLOCATOR_VARS.iter().find_map(|&name| var(name).map(|v| (name, v))) {
        return AllocatorSettings::User { var: name, value };
    }
    match set_cuda_allocator_settings(DEFAULT_CUDA_ALLOCATOR) {
        Ok(()) => AllocatorSettings::Default,
        Err(e) => AllocatorSettings::Unavailable(e.to_string()),
    }
}

/// Applies `settings` (`PYTORCH_ALLOC_CONF`'s syntax) to the CUDA caching allocator; an error
/// names what torch refused, or that the build has no CUDA.
pub fn set_cuda_allocator_settings(settings: &str) -> Result<(), TorchError> {
    let settings = std::ffi::CString::new(settings).map_err(|_| TorchError::Shim {
        op: "cuda_allocator_settings",
        code: -1,
        message: "a NUL byte in the settings".to_owned(),
    })?;
    // SAFETY: `settings` is a live NUL-terminated string for the call; the shim copies it and
    // catches every C++ exception.
    check("cuda_allocator_settings", unsafe { ffi::c10d_cuda_allocator_settings(settings.as_ptr()) })
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

    /// The default settings reach torch's parser, which refuses a bad value by name; a user's
    /// variable is left to torch. Without CUDA in the build, the call says so.
    #[test]
    fn the_allocator_defaults_to_expandable_segments_unless_the_user_sets_it() {
        let user =
            configure_cuda_allocator(|name| (name == "PYTORCH_CUDA_ALLOC_CONF").then(|| "backend:native".to_owned()));
        assert_eq!(
            user,
            AllocatorSettings::User { var: "PYTORCH_CUDA_ALLOC_CONF", value: "backend:native".to_owned() }
        );
        if !crate::has_nccl() {
            let e = set_cuda_allocator_settings(DEFAULT_CUDA_ALLOCATOR).unwrap_err().to_string();
            assert!(e.contains("no CUDA"), "{e}");
            return;
        }
        assert_eq!(configure_cuda_allocator(|_| None), AllocatorSettings::Default);
        let e = set_cuda_allocator_settings("expandable_segments:Maybe").unwrap_err().to_string();
        assert!(e.contains("cuda_allocator_settings") && e.contains("expandable_segments"), "{e}");
    }
}
