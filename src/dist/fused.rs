//! torch's fused AdamW kernel (`torch._fused_adamw_`) through the shim: tch leaves torch's
//! `_fused_*` and `_foreach_*` operations unbound, and the update written as separate tensor
//! operations makes about fourteen passes over each parameter's memory where the kernel makes one.

use super::process_group::{DistError, check, ffi};

/// One AdamW update's settings (`torch.optim.AdamW`'s, with decoupled weight decay).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWStep {
    /// The update's count, 1 for the first (for the bias corrections).
    pub step: u64,
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub weight_decay: f64,
    pub eps: f64,
}

/// Updates `param` and its moments `[exp_avg, exp_avg_sq]` in place from `grad`, as
/// `torch.optim.AdamW(fused=True)` does: the four tensors contiguous, of one dtype and size, on
/// one device (the shim checks, and a mismatch is an error, not a crash).
pub fn fused_adamw(
    param: &mut tch::Tensor,
    grad: &tch::Tensor,
    [exp_avg, exp_avg_sq]: [&mut tch::Tensor; 2],
    s: &AdamWStep,
) -> Result<(), DistError> {
    // The kernel only reads `grad`; the C signature shares one pointer type for every list.
    let (p, g) = (param.as_mut_ptr(), grad.as_ptr().cast_mut());
    let (m, v) = (exp_avg.as_mut_ptr(), exp_avg_sq.as_mut_ptr());
    // SAFETY: each pointer is a live `at::Tensor` borrowed for the call (one-element lists); the
    // shim checks definedness, contiguity and sizes and catches every C++ exception.
    let code = unsafe {
        ffi::c10d_fused_adamw(&p, &g, &m, &v, 1, s.step as f64, s.lr, s.beta1, s.beta2, s.weight_decay, s.eps)
    };
    check("fused_adamw", code)
}

/// Whether torch's attention may choose cuDNN's kernel (`torch.backends.cuda.enable_cudnn_sdp`),
/// for this whole process.
pub fn use_cudnn_attention(enable: bool) -> Result<(), DistError> {
    // SAFETY: a plain flag setter; the shim catches every C++ exception.
    check("sdp_use_cudnn", unsafe { ffi::c10d_sdp_use_cudnn(i32::from(enable)) })
}

#[cfg(test)]
mod tests {
    use super::*;

    use tch::{Device, Kind, Tensor};

    /// Tensors the kernel cannot pair (another dtype, another size) are an error from the shim,
    /// and nothing is written.
    #[test]
    fn mismatched_tensors_are_an_error() {
        let mut p = Tensor::zeros([3], (Kind::Float, Device::Cpu));
        let (mut m, mut v) = (p.zeros_like(), p.zeros_like());
        let s = AdamWStep { step: 1, lr: 0.1, beta1: 0.9, beta2: 0.999, weight_decay: 0.0, eps: 1e-8 };
        for grad in [Tensor::ones([3], (Kind::Double, Device::Cpu)), Tensor::ones([4], (Kind::Float, Device::Cpu))] {
            let err = fused_adamw(&mut p, &grad, [&mut m, &mut v], &s).expect_err("a mismatch fails");
            assert!(err.to_string().contains("fused_adamw"), "{err}");
        }
        assert_eq!(p.abs().sum(Kind::Double).double_value(&[]), 0.0);
        // Matched, the first step moves each value by lr against its gradient's sign.
        fused_adamw(&mut p, &Tensor::ones([3], (Kind::Float, Device::Cpu)), [&mut m, &mut v], &s).unwrap();
        assert!((p.double_value(&[0]) + 0.1).abs() < 1e-6, "{p}");
    }
}
