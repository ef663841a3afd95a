//! The gated activation of the Llama MLP, `silu(gate)·up`, as one graph node: torch's `silu`
//! kernel (transformers' `nn.SiLU`) and its backward, `d_up = dy·silu(gate)` and
//! `d_gate = silu'(gate)·dy·up`, with `silu(gate)` recomputed rather than kept.
//!
//! burn's `silu` is `x·sigmoid(x)`: its graph kept the gate, its sigmoid and their product beside
//! `up` (four `[tokens, intermediate]` tensors, the largest activations of a layer) and
//! differentiated three operations; the node keeps the gate and `up`, and computes the forward
//! the way transformers does (one rounding of `silu` in half precision, where `x·sigmoid(x)`
//! rounded the sigmoid first).

// burn marks burn-tch deprecated in favour of CubeCL backends; this project runs on LibTorch on
// purpose, so the deprecation is expected here.
#![allow(deprecated)]

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::{Autodiff, Backend, backend_extension, tensor::FloatTensor};
use burn::tensor::Tensor;
use burn_tch::{LibTorch, TchTensor};

/// `silu(gate)·up`.
///
/// # Shapes
/// - gate, up: `[..., I]` → `[..., I]`
pub fn swiglu<const D: usize>(gate: Tensor<D>, up: Tensor<D>) -> Tensor<D> {
    Tensor::from_dispatch(<burn::backend::Dispatch as SwigluOps>::swiglu(gate.into_dispatch(), up.into_dispatch()))
}

/// The activation, per backend.
#[backend_extension(LibTorch, Autodiff)]
pub trait SwigluOps: Backend {
    /// See [`swiglu`].
    fn swiglu(gate: FloatTensor<Self>, up: FloatTensor<Self>) -> FloatTensor<Self>;
}

impl SwigluOps for LibTorch {
    fn swiglu(gate: TchTensor, up: TchTensor) -> TchTensor {
        TchTensor::new(gate.tensor.silu() * &up.tensor)
    }
}

impl<C: CheckpointStrategy> SwigluOps for Autodiff<LibTorch, C> {
    fn swiglu(gate: FloatTensor<Self>, up: FloatTensor<Self>) -> FloatTensor<Self> {
        let (gate, gate_node) = gate.into_parts();
        let (up, up_node) = up.into_parts();
        match Swiglu.prepare::<C>([gate_node, up_node]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let y = LibTorch::swiglu(gate.clone(), up.clone());
                prep.finish((gate, up), y)
            }
            OpsKind::UnTracked(prep) => prep.finish(LibTorch::swiglu(gate, up)),
        }
    }
}

/// [`swiglu`]'s graph node; its state is `(gate, up)`.
#[derive(Debug)]
struct Swiglu;

impl Backward<LibTorch, 2> for Swiglu {
    type State = (TchTensor, TchTensor);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let dy = grads.consume::<LibTorch>(&ops.node).tensor;
        let (gate, up) = (&ops.state.0.tensor, &ops.state.1.tensor);
        let [gate_parent, up_parent] = ops.parents;
        if let Some(parent) = up_parent {
            grads.register::<LibTorch>(parent.id, TchTensor::new(&dy * gate.silu()));
        }
        if let Some(parent) = gate_parent {
            grads.register::<LibTorch>(parent.id, TchTensor::new(gate.silu_backward(&(&dy * up))));
        }
    }
}

#[cfg(test)]
mod tests {
    use burn::tensor::activation::silu;
    use burn::tensor::{Device, FloatDType};

    use super::*;
    use crate::testing::{max_rel, normal};

    /// Output and both gradients are as close to the f32 values as burn's `silu(gate)·up` in the
    /// same dtype (equal in f32 to its round-off; in bf16 within four roundings of the largest
    /// value, u = 2^-8: the casts of gate, up and g, and the node's rounding of g·up or of its
    /// output, where the composite also rounds the sigmoid and each product on the way); a frozen
    /// `up` gets no gradient.
    #[test]
    fn the_node_equals_the_composite() {
        let device = Device::libtorch().autodiff();
        let random = |name| normal([2, 5, 24], (0.0, 3.0), name, &device);
        let (gate, up, g) = (random("gate"), random("up"), random("g"));
        // (output, d_gate, d_up) of `f` over the inputs in `dtype`, back in f32.
        let run = |dtype: FloatDType, f: &dyn Fn(Tensor<3>, Tensor<3>) -> Tensor<3>| {
            let (a, b) = (gate.clone().cast(dtype).require_grad(), up.clone().cast(dtype).require_grad());
            let y = f(a.clone(), b.clone());
            let grads = (y.clone() * g.clone().cast(dtype)).sum().backward();
            [y, a.grad(&grads).unwrap(), b.grad(&grads).unwrap()].map(|t| t.cast(FloatDType::F32))
        };
        let truth = run(FloatDType::F32, &|a, b| silu(a) * b);
        for (dtype, bound) in [(FloatDType::F32, 1e-6f32), (FloatDType::BF16, 4.0 / 256.0)] {
            let fused = run(dtype, &|a, b| swiglu(a, b));
            let plain = run(dtype, &|a, b| silu(a) * b);
            for (i, name) in ["output", "gate gradient", "up gradient"].iter().enumerate() {
                let (e_fused, e_plain) =
                    (max_rel(fused[i].clone(), truth[i].clone()), max_rel(plain[i].clone(), truth[i].clone()));
                assert!(e_fused <= bound.max(e_plain), "{dtype:?} {name}: {e_fused} from f32, composite {e_plain}");
            }
        }
        let (gate, up) = (Tensor::<3>::ones([1, 2, 3], &device).require_grad(), Tensor::<3>::ones([1, 2, 3], &device));
        let grads = swiglu(gate.clone(), up.clone()).sum().backward();
        assert!(up.grad(&grads).is_none() && gate.grad(&grads).is_some());
    }
}
