//! Root-mean-square layer norm as transformers' `LlamaRMSNorm` computes it: `x / rms(x)` in f32
//! whatever the input's dtype, rounded to the input's dtype, then times the weight (in that dtype).
//!
//! One graph node with its derivative written out, `r = 1/rms(x)`, `n = x·r`:
//! `dw = Σ g·n` over the positions, `dx = r·(dn − x·r²·mean(dn·x))` with `dn = g·w`.
//! burn's autodiff built the norm from a cast, a square, a mean, a square root, a reciprocal and
//! two products, each differentiated on its own (about twenty f32 operations a norm, and the
//! input kept in f32); the node keeps the input in its own dtype and `r`, and on CUDA the
//! normalisation is one kernel each way (`torch._fused_rms_norm` and its backward), the weight's
//! product and its gradient one or two more.

// burn marks burn-tch deprecated in favour of CubeCL backends; this project runs on LibTorch on
// purpose, so the deprecation is expected here.
#![allow(deprecated)]

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::{Autodiff, Backend, backend_extension, tensor::FloatTensor};
use burn::module::{Module, Param};
use burn::tensor::{Device, Tensor};
use burn_tch::{LibTorch, TchTensor};

use crate::ModelError;
use crate::weights::TensorSource;
use dpo_torch::dtype::{as_kind, grad_kind};
use dpo_torch::fallback::FastPath;

/// Root-mean-square layer norm over the last dimension, with a learned scale.
#[derive(Module, Debug)]
pub struct RmsNorm {
    /// `[N]`
    pub weight: Param<Tensor<1>>,
    #[module(skip)]
    eps: f64,
}

impl RmsNorm {
    pub(crate) fn load(
        w: &dyn TensorSource,
        prefix: &str,
        size: usize,
        eps: f64,
        device: &Device,
    ) -> Result<Self, ModelError> {
        Ok(Self { weight: Param::from_tensor(w.tensor(&format!("{prefix}.weight"), [size], device)?), eps })
    }

    /// The weight is cast to the input's dtype as it is used (an f32 master under mixed precision).
    ///
    /// # Shapes
    /// - x: `[..., N]` → `[..., N]`
    pub fn forward<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        let weight = self.weight.val().into_dispatch();
        Tensor::from_dispatch(<burn::backend::Dispatch as NormOps>::rms_norm(x.into_dispatch(), weight, self.eps))
    }
}

/// The norm, per backend.
#[backend_extension(LibTorch, Autodiff)]
pub trait NormOps: Backend {
    /// See [`RmsNorm::forward`].
    fn rms_norm(x: FloatTensor<Self>, weight: FloatTensor<Self>, eps: f64) -> FloatTensor<Self>;
}

impl NormOps for LibTorch {
    fn rms_norm(x: TchTensor, weight: TchTensor, eps: f64) -> TchTensor {
        TchTensor::new(Normed::of(&x.tensor, &weight.tensor, eps).y)
    }
}

/// One forward's values.
struct Normed {
    /// `w·n`, `[..., N]` in x's dtype
    y: tch::Tensor,
    /// `n = x·r` rounded to x's dtype, `[..., N]`
    n: tch::Tensor,
    /// `r = 1/rms(x)`, f32 `[..., 1]`
    r: tch::Tensor,
    /// The weight in x's dtype, `[N]`
    w: tch::Tensor,
}

impl Normed {
    fn of(x: &tch::Tensor, weight: &tch::Tensor, eps: f64) -> Self {
        let size = x.size();
        let (n, r) = x.internal_fused_rms_norm(&size[size.len() - 1..], None::<tch::Tensor>, eps);
        let w = as_kind(weight, x.kind());
        Self { y: &n * &w, n, r, w }
    }
}

impl<C: CheckpointStrategy> NormOps for Autodiff<LibTorch, C> {
    fn rms_norm(x: FloatTensor<Self>, weight: FloatTensor<Self>, eps: f64) -> FloatTensor<Self> {
        let (x_tracked, w_tracked) = (x.is_tracked(), weight.is_tracked());
        let (x, x_node) = x.into_parts();
        let (weight, w_node) = weight.into_parts();
        match NormBackward.prepare::<C>([x_node, w_node]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let f = Normed::of(&x.tensor, &weight.tensor, eps);
                // Each direction keeps only what it reads.
                let saved = Saved {
                    for_x: x_tracked.then(|| (x.clone(), TchTensor::new(f.r), TchTensor::new(f.w))),
                    for_w: w_tracked.then(|| (TchTensor::new(f.n), grad_kind(weight.tensor.kind()))),
                };
                prep.finish(saved, TchTensor::new(f.y))
            }
            OpsKind::UnTracked(prep) => prep.finish(LibTorch::rms_norm(x, weight, eps)),
        }
    }
}

/// [`RmsNorm`]'s graph node.
#[derive(Debug)]
struct NormBackward;

/// What the backward reads: for the input, x, `r` and the weight in x's dtype; for the weight, `n`
/// and the dtype its gradient comes back in ([`grad_kind`]).
#[derive(Debug, Clone)]
struct Saved {
    for_x: Option<(TchTensor, TchTensor, TchTensor)>,
    for_w: Option<(TchTensor, tch::Kind)>,
}

impl Backward<LibTorch, 2> for NormBackward {
    type State = Saved;

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let g = grads.consume::<LibTorch>(&ops.node).tensor;
        let [x_parent, w_parent] = ops.parents;
        if let (Some(parent), Some((n, kind))) = (w_parent, &ops.state.for_w) {
            // Summed over every position into the gradient's dtype (f32 for a bf16 weight): the
            // sum accumulates in f32 either way, and a sum rounded to bf16, then cast, was one
            // more operator a norm (a cast of 45 us of host time each on an H200).
            let leading: Vec<i64> = (0..g.dim() as i64 - 1).collect();
            let dw = (&g * &n.tensor).sum_dim_intlist(leading.as_slice(), false, *kind);
            grads.register::<LibTorch>(parent.id, TchTensor::new(dw));
        }
        if let (Some(parent), Some((x, r, w))) = (x_parent, &ops.state.for_x) {
            let dx = input_grad(&(&g * &w.tensor), &x.tensor, &r.tensor);
            grads.register::<LibTorch>(parent.id, TchTensor::new(dx));
        }
    }
}

/// torch's fused RMS-norm backward, until it fails (the tensor operations then take over, as the CPU's).
static FUSED_BACKWARD: FastPath = FastPath::new("torch's fused RMS-norm backward", "tensor operations take over");

/// `dx = r·(dn − x·r²·mean(dn·x))` in f32, returned in x's dtype: torch's fused kernel on CUDA,
/// the same arithmetic as tensor operations elsewhere (and on CUDA should the kernel fail: a
/// warning, once, rather than a run lost to a kernel this build of torch lacks).
///
/// # Shapes
/// - dn, x: `[..., N]`, r: `[..., 1]` → `[..., N]`
fn input_grad(dn: &tch::Tensor, x: &tch::Tensor, r: &tch::Tensor) -> tch::Tensor {
    input_grad_by(dn, x, r, x.device().is_cuda())
}

/// [`input_grad`], by torch's fused kernel where `fused` (and it has not failed before).
fn input_grad_by(dn: &tch::Tensor, x: &tch::Tensor, r: &tch::Tensor, fused: bool) -> tch::Tensor {
    if fused && FUSED_BACKWARD.usable() {
        match dpo_torch::kernels::rms_norm_backward(dn, x, r) {
            Ok(dx) => return dx,
            Err(e) => FUSED_BACKWARD.give_up(e),
        }
    }
    let f32 = tch::Kind::Float;
    let (dn32, x32) = (as_kind(dn, f32), as_kind(x, f32));
    let mean = (&dn32 * &x32).mean_dim(-1, true, None); // [..., 1]
    let coef = mean * r * r; // [..., 1]
    as_kind(&((dn32 - x32 * coef) * r), x.kind())
}

#[cfg(test)]
mod tests {
    use burn::tensor::FloatDType;

    use super::*;
    use crate::testing::{max_rel, normal};

    /// The norm as burn's operations composed it before the node.
    fn composite<const D: usize>(x: Tensor<D>, weight: Tensor<1>, eps: f64) -> Tensor<D> {
        let dtype = FloatDType::from(x.dtype());
        let x = x.cast(FloatDType::F32);
        let variance = x.clone().square().mean_dim(D - 1); // [..., 1]
        let normed = (x * (variance + eps).sqrt().recip()).cast(dtype);
        normed * weight.cast(dtype).unsqueeze::<D>()
    }

    fn norm(weight: Tensor<1>) -> RmsNorm {
        RmsNorm { weight: Param::from_tensor(weight), eps: 1e-6 }
    }

    /// Where torch's fused backward fails (the shim refuses the CPU), the tensor operations give
    /// the same gradient, and the failure is remembered.
    #[test]
    fn a_failed_fused_backward_falls_back_to_tensor_operations() {
        let d = Device::libtorch();
        let tch = |t: Tensor<2>| dpo_torch::bridge::on_libtorch(t, "test").0;
        let (dn, x) = (tch(normal([3, 8], (0.0, 1.0), "dn", &d)), tch(normal([3, 8], (0.0, 1.0), "x", &d)));
        let r = x.square().mean_dim(-1, true, None).sqrt().reciprocal(); // [3, 1]
        let want = input_grad_by(&dn, &x, &r, false);
        assert!(input_grad_by(&dn, &x, &r, true).equal(&want));
        let failure = FUSED_BACKWARD.failure();
        assert!(failure.is_some_and(|e| e.contains("rms_norm_backward")), "{failure:?}");
    }

    /// Output and both gradients equal the composite's within the dtype's round-off: f32 to a few
    /// ulps, bf16 to one rounding (2^-8) of the largest value; the f32 master weight's gradient
    /// comes back in f32.
    #[test]
    fn the_norm_node_equals_the_composite() {
        let device = Device::libtorch().autodiff();
        for (dtype, bound) in [(FloatDType::F32, 1e-6), (FloatDType::BF16, 8e-3)] {
            let x = normal([2, 5, 16], (0.5, 2.0), "x", &device).cast(dtype);
            let w = normal([16], (1.0, 0.3), "w", &device);
            let g = normal([2, 5, 16], (0.0, 1.0), "g", &device).cast(dtype);
            let (x, w) = (x.require_grad(), w.require_grad());
            let fused = norm(w.clone()).forward(x.clone());
            let plain = composite(x.clone(), w.clone(), 1e-6);
            assert!(max_rel(fused.clone(), plain.clone()) <= bound, "{dtype:?} output");
            let (g1, g2) = ((fused * g.clone()).sum().backward(), (plain * g).sum().backward());
            let (dx1, dx2) = (x.grad(&g1).unwrap(), x.grad(&g2).unwrap());
            assert!(max_rel(dx1, dx2) <= bound, "{dtype:?} input gradient");
            let (dw1, dw2) = (w.grad(&g1).unwrap(), w.grad(&g2).unwrap());
            assert_eq!(dw1.dtype(), w.dtype());
            let (dw1, dw2) = (dw1.unsqueeze::<3>(), dw2.unsqueeze::<3>());
            assert!(max_rel(dw1, dw2) <= bound, "{dtype:?} weight gradient");
        }
    }

    /// A frozen weight gets no gradient and the input's still flows (LoRA, the reference); a
    /// plain device (no graph) computes the same output.
    #[test]
    fn a_frozen_weight_and_a_plain_device() {
        let device = Device::libtorch().autodiff();
        let x = normal([1, 3, 8], (0.0, 1.0), "x", &device).require_grad();
        let w = normal([8], (1.0, 0.3), "w", &device);
        let y = norm(w.clone()).forward(x.clone());
        let grads = (y.clone() * y.clone()).sum().backward();
        assert!(w.grad(&grads).is_none());
        let (dx, plain_dx) = {
            let p = composite(x.clone(), w.clone(), 1e-6);
            (x.grad(&grads).unwrap(), x.grad(&(p.clone() * p).sum().backward()).unwrap())
        };
        assert!(max_rel(dx, plain_dx) <= 1e-6);
        let cpu = Device::libtorch();
        let plain = norm(w.to_device(&cpu).inner()).forward(x.to_device(&cpu).inner());
        plain.to_data().assert_approx_eq::<f32>(&y.inner().to_data(), burn::tensor::Tolerance::absolute(1e-6));
    }
}
