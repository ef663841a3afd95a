//! dpo-torch: what this project calls in libtorch beyond burn and tch, through one C++ shim
//! (`csrc/`: `c10d.cpp`, `ops.cpp`, `runtime.cpp`, built by `build.rs` against the venv's torch):
//! the raw C ABI ([`ffi`]) that `dpo-dist` wraps as c10d process groups, and the safe wrappers of
//! the rest: torch's fused AdamW and multi-tensor norm and scale, the variable-length attention
//! kernels and the cuDNN-attention switch ([`kernels`]), half-precision matrix products fast on
//! every CPU ([`product`]), the CUDA caching allocator's peak ([`allocator`]), torch's profiler
//! ([`profiler`]), a fast kernel's fallback once it fails ([`fallback`]), threads that run as their
//! caller's ([`threads`]), copies to a GPU that do not wait for it ([`transfers`]), the bridge
//! between burn tensors and the `tch::Tensor`s they wrap ([`bridge`]), and autodiff nodes that are
//! plumbing rather than layers ([`graph`]).

pub mod allocator;
pub mod bridge;
pub mod dtype;
pub mod fallback;
pub mod ffi;
pub mod graph;
pub mod kernels;
pub mod product;
pub mod profiler;
pub mod threads;
pub mod transfers;

use std::ffi::CStr;

/// A failure of a shim call, or of libtorch preparing one.
#[derive(Debug, thiserror::Error)]
pub enum TorchError {
    /// The shim reported a failure (a mismatched tensor, a CUDA error, a c10d timeout or lost peer).
    #[error("c10d `{op}` failed (code {code}): {message}")]
    Shim { op: &'static str, code: i32, message: String },
    /// libtorch failed while the arguments of `op` were prepared.
    #[error("libtorch failed while preparing `{op}`")]
    Tch {
        op: &'static str,
        #[source]
        source: tch::TchError,
    },
    /// A tensor is not a LibTorch tensor (another burn backend).
    #[error("tensor {index} is not a LibTorch tensor: {reason}")]
    NotLibTorch { index: usize, reason: String },
}

/// A libtorch failure where no error can be returned (a graph node's backward, whose signature
/// is burn's): the panic's payload, which the binary's hook reports as one line, exit 2, as it
/// does tch's own panics (a CUDA out-of-memory in the backward is the common one).
#[derive(Debug)]
pub struct LibtorchPanic(pub String);

/// Panics with a [`LibtorchPanic`]: `error` of the work described by `what`.
pub fn libtorch_failed(what: &str, error: &TorchError) -> ! {
    std::panic::panic_any(LibtorchPanic(format!("{what}: {error}")))
}

/// The message of the last failed shim call on this thread.
fn last_error() -> String {
    // SAFETY: `c10d_last_error` returns a pointer to a thread-local, NUL-terminated `std::string`
    // buffer that stays valid until the next failing call on this thread; it is copied out at once.
    unsafe { CStr::from_ptr(ffi::c10d_last_error()) }.to_string_lossy().into_owned()
}

/// Maps a shim status code of `op` to a result, with the shim's message.
pub fn check(op: &'static str, code: i32) -> Result<(), TorchError> {
    if code == 0 { Ok(()) } else { Err(TorchError::Shim { op, code, message: last_error() }) }
}

/// Wraps a libtorch error of `op` (for `map_err`).
pub fn tch_err(op: &'static str) -> impl Fn(tch::TchError) -> TorchError {
    move |source| TorchError::Tch { op, source }
}

/// Whether NCCL is in this build, and if not why (from `build.rs`: a CPU build of torch, its
/// CUDA headers missing, or `DPO_TRAIN_NCCL=0`).
pub const NCCL_BUILD: &str = env!("DPO_TORCH_NCCL");

/// The `lib/` folder of the torch this build links (and records an rpath to).
pub const TORCH_LIB: &str = env!("DPO_TORCH_LIB");

/// Whether this build has c10d's NCCL backend.
pub fn has_nccl() -> bool {
    // SAFETY: a pure query of a compile-time constant, no arguments.
    unsafe { ffi::c10d_has_nccl() != 0 }
}
