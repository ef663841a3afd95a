//! torch's fused AdamW kernel (`torch._fused_adamw_`) and the multi-tensor norm and scale that
//! clip gradients (`_foreach_norm`, `_foreach_mul_`) through the shim: tch leaves torch's
//! `_fused_*` and `_foreach_*` operations unbound (also `_foreach_copy_`, which writes the
//! compute-dtype copies of updated masters). The update written as separate tensor
//! operations makes about fourteen passes over each parameter's memory where the kernel makes one,
//! and on a GPU each operation per parameter is a kernel launch and its host time. Also torch's
//! variable-length attention kernels (`_flash_attention_forward`, `_efficient_attention_forward`
//! with cumulative sequence lengths) and their backward, the fused RMS norm's backward, and autograd's gradients given
//! an output's gradient, none of which tch binds.

use crate::{TorchError, check, ffi};

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

/// One parameter's tensors for [`fused_adamw`]: its values and moments, updated in place, and its
/// gradient, read.
#[derive(Debug)]
pub struct AdamWEntry {
    pub param: tch::Tensor,
    pub grad: tch::Tensor,
    pub exp_avg: tch::Tensor,
    pub exp_avg_sq: tch::Tensor,
}

/// Updates every entry's parameter and moments in place from its gradient, as
/// `torch.optim.AdamW(fused=True)` does for one parameter group: one call of torch's multi-tensor
/// kernel for them all. Each entry's four tensors are contiguous and of one size, and every tensor
/// has one dtype and device (the shim checks before anything is written, and a mismatch is an
/// error, not a crash).
pub fn fused_adamw(entries: &mut [AdamWEntry], s: &AdamWStep) -> Result<(), TorchError> {
    // The kernel only reads the gradients; the C signature shares one pointer type for every list.
    let list =
        |f: fn(&AdamWEntry) -> &tch::Tensor| entries.iter().map(|e| f(e).as_ptr().cast_mut()).collect::<Vec<_>>();
    let (p, g) = (list(|e| &e.param), list(|e| &e.grad));
    let (m, v) = (list(|e| &e.exp_avg), list(|e| &e.exp_avg_sq));
    // SAFETY: each pointer is a live `at::Tensor` of `entries`, borrowed mutably for the call; the
    // shim checks definedness, contiguity, sizes, dtypes and devices and catches every C++ exception.
    let code = unsafe {
        ffi::c10d_fused_adamw(
            p.as_ptr(),
            g.as_ptr(),
            m.as_ptr(),
            v.as_ptr(),
            entries.len(),
            s.step as f64,
            s.lr,
            s.beta1,
            s.beta2,
            s.weight_decay,
            s.eps,
        )
    };
    check("fused_adamw", code)
}

/// The L2 norm of each tensor, `[n]` on their device (`torch._foreach_norm`: one multi-tensor
/// kernel on CUDA). The tensors share a dtype and a device; there is at least one.
pub fn foreach_norms(tensors: &[tch::Tensor]) -> Result<tch::Tensor, TorchError> {
    let ptrs: Vec<_> = tensors.iter().map(|t| t.as_ptr().cast_mut()).collect();
    let mut out = std::ptr::null_mut();
    // SAFETY: the pointers are live tensors borrowed for the call, read only; on success `out`
    // is a new `at::Tensor` whose ownership passes to the returned handle.
    check("foreach_norms", unsafe { ffi::c10d_foreach_norms(ptrs.as_ptr(), ptrs.len(), &mut out) })?;
    // SAFETY: `out` was just allocated by the shim for the caller.
    Ok(unsafe { tch::Tensor::from_ptr(out) })
}

/// Multiplies each tensor in place by the one-element `scale` on their device
/// (`torch._foreach_mul_`), without reading it on the host.
pub fn foreach_mul(tensors: &mut [tch::Tensor], scale: &tch::Tensor) -> Result<(), TorchError> {
    let ptrs: Vec<_> = tensors.iter_mut().map(|t| t.as_mut_ptr()).collect();
    // SAFETY: the tensors are borrowed mutably for the call and `scale` shared; the shim checks
    // them and catches every C++ exception.
    check("foreach_mul", unsafe { ffi::c10d_foreach_mul(ptrs.as_ptr(), ptrs.len(), scale.as_ptr().cast_mut()) })
}

/// Copies each `src[i]` into `dst[i]` in place, converting the dtype (`torch._foreach_copy_`: on
/// CUDA multi-tensor kernels, where a cast each is a launch each). Each list has one dtype and
/// device, entry i of both one size; a mismatch is an error before anything is written.
pub fn foreach_copy(dst: &mut [tch::Tensor], src: &[tch::Tensor]) -> Result<(), TorchError> {
    if dst.len() != src.len() {
        // The shim takes one length for both lists: checked here, nothing written.
        let message = format!("{} destinations for {} sources", dst.len(), src.len());
        return Err(TorchError::Shim { op: "foreach_copy", code: -1, message });
    }
    let d: Vec<_> = dst.iter_mut().map(|t| t.as_mut_ptr()).collect();
    let s: Vec<_> = src.iter().map(|t| t.as_ptr().cast_mut()).collect();
    // SAFETY: the destinations are borrowed mutably for the call and the sources shared; the shim
    // checks them and catches every C++ exception.
    check("foreach_copy", unsafe { ffi::c10d_foreach_copy(d.as_ptr(), s.as_ptr(), d.len()) })
}

/// The input gradient of an RMS norm over the last dimension, without weight, by torch's fused
/// CUDA kernel (`torch._fused_rms_norm_backward`): `grad` and `input` in their own dtype, read in
/// f32 in the kernel; `rstd` as `torch._fused_rms_norm` returned it. CUDA only (an error
/// elsewhere: torch has no CPU kernel).
pub fn rms_norm_backward(
    grad: &tch::Tensor,
    input: &tch::Tensor,
    rstd: &tch::Tensor,
) -> Result<tch::Tensor, TorchError> {
    let ptr = |t: &tch::Tensor| t.as_ptr().cast_mut();
    let mut out = std::ptr::null_mut();
    // SAFETY: the tensors are live and only read; on success `out` is a new `at::Tensor` whose
    // ownership passes to the returned handle. The shim catches every C++ exception.
    check("rms_norm_backward", unsafe { ffi::c10d_rms_norm_backward(ptr(grad), ptr(input), ptr(rstd), &mut out) })?;
    // SAFETY: `out` was just allocated by the shim for the caller.
    Ok(unsafe { tch::Tensor::from_ptr(out) })
}

/// The gradients of `inputs` (leaves requiring gradients) given `grad_output`, the gradient of
/// `output` computed from them by torch's autograd (`torch.autograd.grad(output, inputs,
/// grad_output)`), one per input; the graph is freed. tch's `run_backward` takes no output
/// gradient, so differentiating a non-scalar output there costs a product and a sum more.
pub fn autograd_grad(
    output: &tch::Tensor,
    grad_output: &tch::Tensor,
    inputs: &[&tch::Tensor],
) -> Result<Vec<tch::Tensor>, TorchError> {
    let ins: Vec<_> = inputs.iter().map(|t| t.as_ptr().cast_mut()).collect();
    let (out, gout) = ([output.as_ptr().cast_mut()], [grad_output.as_ptr().cast_mut()]);
    let mut grads = vec![std::ptr::null_mut(); ins.len()];
    // SAFETY: every pointer is a live tensor borrowed for the call; on success each `grads[i]` is a
    // new `at::Tensor` whose ownership passes to the caller. The shim catches every C++ exception.
    let code =
        unsafe { ffi::c10d_autograd_grad(out.as_ptr(), gout.as_ptr(), 1, ins.as_ptr(), ins.len(), grads.as_mut_ptr()) };
    check("autograd_grad", code)?;
    // SAFETY: each pointer was just allocated by the shim for the caller.
    Ok(grads.into_iter().map(|g| unsafe { tch::Tensor::from_ptr(g) }).collect())
}

/// The cumulative sequence lengths of a [`varlen_attention`] call: sequence `i` is rows
/// `cu_q[i]..cu_q[i + 1]` of the queries and `cu_k[i]..cu_k[i + 1]` of the keys and values.
#[derive(Debug)]
pub struct VarlenSeqs {
    /// `[n + 1]` int32 on the tensors' device, from 0 to the query rows.
    pub cu_q: tch::Tensor,
    /// `[n + 1]` int32 on the tensors' device, from 0 to the key rows.
    pub cu_k: tch::Tensor,
    /// The longest sequence's queries and keys.
    pub max_q: i64,
    pub max_k: i64,
}

/// Causal attention over sequences packed end to end without padding, by torch's
/// variable-length CUDA kernels (flash attention in half precision, memory-efficient attention in
/// f32): q `[Tq, H, D]`, k and v `[Tk, Hkv, D]` → `[Tq, H, D]`. Each sequence's queries are its
/// last keys (the mask aligned bottom right): keys before its first query are a prefix every
/// query sees. f32 needs `Hkv == H`. Differentiable by torch's autograd where the inputs require
/// gradients. q, k and v may be views with rows and heads strided (of one joined projection):
/// only the head dimension must be dense. CUDA only (an error elsewhere: torch has no CPU kernel).
pub fn varlen_attention(qkv: [&tch::Tensor; 3], seqs: &VarlenSeqs) -> Result<tch::Tensor, TorchError> {
    varlen_call(qkv, seqs, None)
}

/// What [`varlen_attention_backward`] reads of a [`varlen_attention_saving`] call besides its
/// operands and output: the kernel's log-sum-exp and random state (tensors torch's autograd would
/// save), and the sequence maxima the memory-efficient kernel's backward takes.
#[derive(Debug)]
pub struct VarlenSaved {
    tensors: [tch::Tensor; 3],
    max: [i64; 2],
}

impl Clone for VarlenSaved {
    fn clone(&self) -> Self {
        Self { tensors: self.tensors.each_ref().map(tch::Tensor::shallow_clone), max: self.max }
    }
}

/// [`varlen_attention`] for training: the output and what its backward reads
/// ([`varlen_attention_backward`]), with no autograd graph (the inputs need not require
/// gradients).
pub fn varlen_attention_saving(
    qkv: [&tch::Tensor; 3],
    seqs: &VarlenSeqs,
) -> Result<(tch::Tensor, VarlenSaved), TorchError> {
    let mut saved = VarlenSaved { tensors: [(); 3].map(|_| tch::Tensor::new()), max: [0; 2] };
    let y = varlen_call(qkv, seqs, Some(&mut saved))?;
    Ok((y, saved))
}

/// The shim's call, saving for the backward into `saved` where given.
fn varlen_call(
    [q, k, v]: [&tch::Tensor; 3],
    seqs: &VarlenSeqs,
    saved: Option<&mut VarlenSaved>,
) -> Result<tch::Tensor, TorchError> {
    let ptr = |t: &tch::Tensor| t.as_ptr().cast_mut();
    let (mut out, mut tensors) = (std::ptr::null_mut(), [std::ptr::null_mut(); 3]);
    let mut max = [0i64; 2];
    let (saved_ptr, max_ptr) = match saved.is_some() {
        true => (tensors.as_mut_ptr(), max.as_mut_ptr()),
        false => (std::ptr::null_mut(), std::ptr::null_mut()),
    };
    // SAFETY: the tensors are live and only read; on success `out` (and, where asked, the three
    // saved tensors) are new `at::Tensor`s whose ownership passes to the returned handles. The
    // shim catches every C++ exception.
    let code = unsafe {
        ffi::c10d_varlen_attention(
            ptr(q),
            ptr(k),
            ptr(v),
            ptr(&seqs.cu_q),
            ptr(&seqs.cu_k),
            seqs.max_q,
            seqs.max_k,
            &mut out,
            saved_ptr,
            max_ptr,
        )
    };
    check("varlen_attention", code)?;
    if let Some(saved) = saved {
        // SAFETY: each pointer was just allocated by the shim for the caller.
        saved.tensors = tensors.map(|t| unsafe { tch::Tensor::from_ptr(t) });
        saved.max = max;
    }
    // SAFETY: `out` was just allocated by the shim for the caller.
    Ok(unsafe { tch::Tensor::from_ptr(out) })
}

/// The gradients of a [`varlen_attention_saving`] call's q, k and v (shaped as they are) from
/// `dy`, the gradient at its output `y`: the kernel's own backward, called as torch's autograd
/// calls it, on this thread. (Through torch's autograd, each layer's call was handed to the
/// engine's CUDA worker thread and waited on: about 1.1 ms of a 0.5B step's host time a layer on
/// an H200, the largest of its gaps between operators.)
pub fn varlen_attention_backward(
    dy: &tch::Tensor,
    [q, k, v]: [&tch::Tensor; 3],
    y: &tch::Tensor,
    saved: &VarlenSaved,
    seqs: &VarlenSeqs,
) -> Result<[tch::Tensor; 3], TorchError> {
    let ptr = |t: &tch::Tensor| t.as_ptr().cast_mut();
    let kept = saved.tensors.each_ref().map(ptr);
    let mut grads = [std::ptr::null_mut(); 3];
    // SAFETY: the tensors are live and only read; on success the three gradients are new
    // `at::Tensor`s whose ownership passes to the returned handles.
    let code = unsafe {
        ffi::c10d_varlen_attention_backward(
            ptr(dy),
            ptr(q),
            ptr(k),
            ptr(v),
            ptr(y),
            kept.as_ptr(),
            saved.max.as_ptr(),
            ptr(&seqs.cu_q),
            ptr(&seqs.cu_k),
            seqs.max_q,
            seqs.max_k,
            grads.as_mut_ptr(),
        )
    };
    check("varlen_attention_backward", code)?;
    // SAFETY: each pointer was just allocated by the shim for the caller.
    Ok(grads.map(|g| unsafe { tch::Tensor::from_ptr(g) }))
}

/// Whether torch's attention may choose cuDNN's kernel (`torch.backends.cuda.enable_cudnn_sdp`),
/// for this whole process.
pub fn use_cudnn_attention(enable: bool) -> Result<(), TorchError> {
    // SAFETY: a plain flag setter; the shim catches every C++ exception.
    check("sdp_use_cudnn", unsafe { ffi::c10d_sdp_use_cudnn(i32::from(enable)) })
}

/// Whether f32 matrix products and convolutions on CUDA may use TF32 (transformers' `tf32`:
/// `torch.backends.cuda.matmul.allow_tf32` and `torch.backends.cudnn.allow_tf32`), for this
/// whole process.
pub fn set_tf32(enable: bool) -> Result<(), TorchError> {
    // SAFETY: plain flag setters; the shim catches every C++ exception.
    check("set_tf32", unsafe { ffi::c10d_set_tf32(i32::from(enable)) })
}

/// The two TF32 flags [`set_tf32`] sets: `(cuBLAS, cuDNN)`.
pub fn tf32() -> Result<(bool, bool), TorchError> {
    let (mut cublas, mut cudnn) = (0, 0);
    // SAFETY: the shim writes the two ints it is given.
    check("tf32", unsafe { ffi::c10d_tf32(&mut cublas, &mut cudnn) })?;
    Ok((cublas != 0, cudnn != 0))
}

/// A copy of `t` in page-locked host memory, so copies between it and a GPU go by DMA without a
/// staging buffer. Pinned for torch's current accelerator, without the `device` argument torch
/// deprecated (tch's `pin_memory` always passes one, and a CPU one is refused). An error, with
/// nothing allocated, on a machine without an accelerator.
pub fn pinned_copy(t: &tch::Tensor) -> Result<tch::Tensor, TorchError> {
    let mut out = std::ptr::null_mut();
    // SAFETY: `t` is live and only read; on success `out` is a new `at::Tensor` whose ownership
    // passes to the returned handle. The shim catches every C++ exception.
    check("pinned_copy", unsafe { ffi::c10d_pinned_copy(t.as_ptr().cast_mut(), &mut out) })?;
    // SAFETY: `out` was just allocated by the shim for the caller.
    Ok(unsafe { tch::Tensor::from_ptr(out) })
}

#[cfg(test)]
mod tests {
    use super::*;

    use tch::{Device, Kind, Tensor};

    /// The two flags read back as set (the CPU build keeps them too).
    #[test]
    fn tf32_flags_are_set_and_read_back() {
        set_tf32(true).unwrap();
        assert_eq!(tf32().unwrap(), (true, true));
        set_tf32(false).unwrap();
        assert_eq!(tf32().unwrap(), (false, false));
    }

    /// Tensors the kernel cannot pair (another dtype, another size) are an error from the shim,
    /// and nothing is written, not even in the entries that were fine.
    #[test]
    fn mismatched_tensors_are_an_error() {
        let s = AdamWStep { step: 1, lr: 0.1, beta1: 0.9, beta2: 0.999, weight_decay: 0.0, eps: 1e-8 };
        let entry = |n: i64, grad: Tensor| {
            let param = Tensor::zeros([n], (Kind::Float, Device::Cpu));
            AdamWEntry { exp_avg: param.zeros_like(), exp_avg_sq: param.zeros_like(), param, grad }
        };
        for bad in [Tensor::ones([3], (Kind::Double, Device::Cpu)), Tensor::ones([4], (Kind::Float, Device::Cpu))] {
            let mut entries = [entry(2, Tensor::ones([2], (Kind::Float, Device::Cpu))), entry(3, bad)];
            let err = fused_adamw(&mut entries, &s).expect_err("a mismatch fails");
            assert!(err.to_string().contains("fused_adamw"), "{err}");
            assert_eq!(entries[0].param.abs().sum(Kind::Double).double_value(&[]), 0.0);
        }
        // Matched, the first step moves each value by lr against its gradient's sign, in every entry.
        let ones = |n: i64| Tensor::ones([n], (Kind::Float, Device::Cpu));
        let mut entries = [entry(2, ones(2)), entry(3, -ones(3))];
        fused_adamw(&mut entries, &s).unwrap();
        assert!((entries[0].param.double_value(&[1]) + 0.1).abs() < 1e-6, "{}", entries[0].param);
        assert!((entries[1].param.double_value(&[2]) - 0.1).abs() < 1e-6, "{}", entries[1].param);
    }

    /// Per-tensor norms in one call, and an in-place scale by a tensor on the device; tensors of
    /// two dtypes are an error.
    #[test]
    fn foreach_norms_and_scale() {
        let mut ts = [Tensor::from_slice(&[3.0f32, 4.0]), Tensor::from_slice(&[12.0f32])];
        let norms = foreach_norms(&ts).unwrap();
        assert_eq!(Vec::<f32>::try_from(&norms).unwrap(), [5.0, 12.0]);
        foreach_mul(&mut ts, &Tensor::from_slice(&[0.5f32])).unwrap();
        assert_eq!(Vec::<f32>::try_from(&ts[0]).unwrap(), [1.5, 2.0]);
        assert_eq!(Vec::<f32>::try_from(&ts[1]).unwrap(), [6.0]);
        let mixed = [Tensor::from_slice(&[1.0f32]), Tensor::from_slice(&[1.0f64])];
        let err = foreach_norms(&mixed).expect_err("two dtypes fail");
        assert!(err.to_string().contains("foreach_norms"), "{err}");
        assert!(foreach_norms(&[]).is_err());
    }

    /// The gradients given an output's gradient are the chain rule's (`y = x²·w`: `dx = 2xw·g`,
    /// `dw = x²·g`); an input the output does not depend on is an error, not a crash.
    #[test]
    fn autograd_grad_takes_the_output_gradient() {
        let x = Tensor::from_slice(&[1.0f32, -2.0, 3.0]).set_requires_grad(true);
        let w = Tensor::from_slice(&[0.5f32, 2.0, -1.0]).set_requires_grad(true);
        let g = Tensor::from_slice(&[1.0f32, 10.0, 100.0]);
        let y = &x * &x * &w;
        let grads = autograd_grad(&y, &g, &[&x, &w]).unwrap();
        assert_eq!(Vec::<f32>::try_from(&grads[0]).unwrap(), [1.0, -80.0, -600.0]);
        assert_eq!(Vec::<f32>::try_from(&grads[1]).unwrap(), [1.0, 40.0, 900.0]);
        let unused = Tensor::from_slice(&[1.0f32]).set_requires_grad(true);
        let y = &x * 2.0;
        let err = autograd_grad(&y, &g, &[&unused]).expect_err("an unused input");
        assert!(err.to_string().contains("autograd_grad"), "{err}");
    }

    /// f32 values land in bf16 tensors rounded as a cast rounds them; sizes that differ, or lists
    /// of two lengths, are an error with nothing written.
    #[test]
    fn foreach_copy_casts_in_place() {
        let src = [Tensor::from_slice(&[1.0f32, 1.3, -3.0]), Tensor::from_slice(&[0.1f32])];
        let mut dst =
            [Tensor::zeros([3], (Kind::BFloat16, Device::Cpu)), Tensor::zeros([1], (Kind::BFloat16, Device::Cpu))];
        foreach_copy(&mut dst, &src).unwrap();
        for (d, s) in dst.iter().zip(&src) {
            assert!(d.equal(&s.to_kind(Kind::BFloat16)), "{d} vs {s}");
        }
        let mut short =
            [Tensor::zeros([2], (Kind::BFloat16, Device::Cpu)), Tensor::zeros([1], (Kind::BFloat16, Device::Cpu))];
        assert!(foreach_copy(&mut short, &src).is_err());
        assert_eq!(short[1].double_value(&[0]), 0.0, "nothing written");
        assert!(foreach_copy(&mut dst[..1], &src).is_err());
    }

    /// Off CUDA the variable-length kernel is an error that says so, not a crash.
    #[test]
    fn varlen_attention_is_an_error_off_cuda() {
        let t = |h: i64| Tensor::randn([5, h, 8], (Kind::Float, Device::Cpu));
        let cu = || Tensor::from_slice(&[0i32, 2, 5]);
        let seqs = VarlenSeqs { cu_q: cu(), cu_k: cu(), max_q: 3, max_k: 3 };
        let err = varlen_attention([&t(2), &t(2), &t(2)], &seqs).expect_err("no CPU kernel");
        assert!(err.to_string().contains("varlen_attention") && err.to_string().contains("CUDA only"), "{err}");
        let err = varlen_attention_saving([&t(2), &t(2), &t(2)], &seqs).expect_err("no CPU kernel");
        assert!(err.to_string().contains("CUDA only"), "{err}");
        // The backward reaches torch's kernel, which has no CPU implementation: an error, not a crash.
        let saved = VarlenSaved { tensors: [t(2), t(2), t(2)].map(|x| x.select(2, 0)), max: [3, 3] };
        let err =
            varlen_attention_backward(&t(2), [&t(2), &t(2), &t(2)], &t(2), &saved, &seqs).expect_err("no CPU kernel");
        assert!(err.to_string().contains("varlen_attention_backward"), "{err}");
    }

    /// Without an accelerator there is nothing to pin for: an error naming the operation, where
    /// tch's `pin_memory(Device::Cpu)` panics (issue 39). On a GPU machine the copy is pinned and equal.
    #[test]
    fn pinned_copy_is_an_error_or_a_pinned_equal_copy() {
        let t = Tensor::from_slice(&[1.5f32, -2.0, 3.0]);
        match pinned_copy(&t) {
            Ok(host) => {
                assert_eq!(host.device(), Device::Cpu);
                assert_eq!(Vec::<f32>::try_from(&host).unwrap(), [1.5, -2.0, 3.0]);
                assert!(tch::Cuda::is_available(), "pinned without an accelerator");
            }
            Err(err) => {
                assert!(!tch::Cuda::is_available(), "{err}");
                assert!(err.to_string().starts_with("c10d `pinned_copy` failed"), "{err}");
            }
        }
    }
}
