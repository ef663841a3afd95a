//! The output projection as one handle: `lm_head`, or the embedding it is tied to, cast once to
//! the compute dtype. Generation, scoring and the hand-written backward all project through it and
//! name its parameter through it.

use burn::tensor::{DType, FloatDType, Tensor};
use dpo_torch::bridge::{from_tch, on_libtorch};

use super::linear::{f32_weight_grad, linear_rows, mm_f32};

/// The LM head of a model, in one compute dtype.
#[derive(Debug, Clone)]
pub struct LmHead {
    /// `[hidden, V]` in the compute dtype.
    pub weight: Tensor<2>,
    /// The parameter behind it: `lm_head.weight` (`[hidden, V]` in burn's layout), or the tied
    /// `model.embed_tokens.weight` (`[V, hidden]`).
    pub param_name: &'static str,
    /// Whether that parameter trains.
    pub trains: bool,
}

impl LmHead {
    /// The head of a parameter: `lm_head`'s `[hidden, V]` weight, or (`tied`) the `[V, hidden]`
    /// embedding, cast once to `dtype`; then [`LmHead::project`] a few rows at a time (the head's
    /// activations are a model's largest).
    pub fn new(param: Tensor<2>, tied: bool, dtype: FloatDType) -> Self {
        let trains = param.is_require_grad();
        if tied {
            Self { weight: param.cast(dtype).transpose(), param_name: super::hf::EMBEDDING, trains }
        } else {
            Self { weight: param.cast(dtype), param_name: LM_HEAD, trains }
        }
    }

    /// The head without autodiff (for a hand-written backward).
    pub fn inner(self) -> Self {
        Self { weight: self.weight.inner(), ..self }
    }

    /// f32 logits of hidden states (log-softmax and the loss run in f32).
    ///
    /// # Shapes
    /// - hidden: `[..., hidden]` → `[..., V]`
    pub fn project<const D: usize>(&self, hidden: Tensor<D>) -> Tensor<D> {
        linear_rows(hidden, self.weight.clone(), None).cast(FloatDType::F32)
    }

    /// f32 logits of a block of rows outside autodiff (the DPO head's scoring and its
    /// hand-written backward). On CUDA with half-precision operands the product writes f32 itself
    /// (`mm` with `out_dtype`): a product in the compute dtype and its cast pass over the block's
    /// `[c, V]` logits twice, the cast the slower (about 2 TB/s on an H200, 10 ms of the 0.5B
    /// shape's 150 ms of kernels a step). Those logits are then not rounded to the compute dtype
    /// first, as [`LmHead::project`]'s (autocast's) are; elsewhere this is `project`.
    ///
    /// # Shapes
    /// - rows: `[c, hidden]` → `[c, V]`
    pub fn block_logits(&self, rows: Tensor<2>) -> Tensor<2> {
        let half = matches!(rows.dtype(), DType::BF16 | DType::F16);
        if half && !rows.is_autodiff() && !self.weight.is_autodiff() {
            let what = "the LM head's logits";
            let ((x, origin), (w, _)) = (on_libtorch(rows.clone(), what), on_libtorch(self.weight.clone(), what));
            if x.device().is_cuda()
                && let Some(z) = mm_f32(&x, &w)
            {
                return from_tch(z, origin);
            }
        }
        self.project(rows)
    }

    /// The f32 gradient of the parameter behind the head from a group of rows and their logits'
    /// gradient, in the parameter's own layout: `xᵀ·dz` for `lm_head`'s `[hidden, V]`, `dzᵀ·x` for
    /// the tied `[V, hidden]` embedding. The product writes that layout itself: transposing a
    /// `[hidden, V]` product copied the step's largest gradient (1.3 s of a 7.7 s CPU step for
    /// the Qwen2.5-0.5B shape). `partial`: one of several summed ([`f32_weight_grad`]).
    ///
    /// # Shapes
    /// - x: `[g, hidden]`, dz: `[g, V]` → `[hidden, V]` or (tied) `[V, hidden]`
    pub fn weight_grad(&self, x: Tensor<2>, dz: Tensor<2>, partial: bool) -> Tensor<2> {
        match self.param_name == LM_HEAD {
            true => f32_weight_grad(x, dz, partial),
            false => f32_weight_grad(dz, x, partial),
        }
    }
}

/// The untied output projection's parameter.
const LM_HEAD: &str = "lm_head.weight";

#[cfg(test)]
mod tests {
    use burn::tensor::Device;

    use super::*;
    use crate::testing::{max_rel, normal};

    /// A tied head's gradient is the embedding's `[V, hidden]` layout of `xᵀ·dz`, whole and
    /// accumulated over slices (a `V` of 2^20 makes 16 rows a slice); `lm_head`'s is `xᵀ·dz`.
    #[test]
    #[allow(deprecated)] // burn's libtorch device: this project's backend
    fn the_weight_gradient_comes_in_the_parameters_layout() {
        let d = Device::libtorch();
        let (g, h, v) = (17, 3, 1 << 20);
        let x = normal([g, h], (0.0, 1.0), "x", &d).cast(FloatDType::BF16);
        let dz = normal([g, v], (0.0, 1.0), "dz", &d).cast(FloatDType::BF16);
        let exact = x.clone().cast(FloatDType::F32).transpose().matmul(dz.clone().cast(FloatDType::F32)); // [h, V]
        let embedding = normal([v, h], (0.0, 1.0), "embedding", &d);
        let tied = LmHead::new(embedding, true, FloatDType::BF16);
        let untied = LmHead::new(normal([h, v], (0.0, 1.0), "lm_head", &d), false, FloatDType::BF16);
        for partial in [true, false] {
            let dw = tied.weight_grad(x.clone(), dz.clone(), partial);
            assert_eq!(dw.dims(), [v, h]);
            let bound = if partial { 1e-6 } else { 1.0 / 256.0 };
            assert!(max_rel(dw.transpose(), exact.clone()) <= bound, "tied, partial {partial}");
            let dw = untied.weight_grad(x.clone(), dz.clone(), partial);
            assert_eq!(dw.dims(), [h, v]);
            assert!(max_rel(dw, exact.clone()) <= bound, "lm_head, partial {partial}");
        }
    }
}
