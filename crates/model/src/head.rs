//! The output projection as one handle: `lm_head`, or the embedding it is tied to, cast once to
//! the compute dtype. Generation, scoring and the hand-written backward all project through it and
//! name its parameter through it.

use burn::tensor::{FloatDType, Tensor};

use super::linear::linear_rows;

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
            Self { weight: param.cast(dtype), param_name: "lm_head.weight", trains }
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

    /// A gradient of the `[hidden, V]` weight in its parameter's layout, flattened (`[hidden·V]`).
    pub fn param_grad(&self, dweight: Tensor<2>) -> Tensor<1> {
        let [h, v] = dweight.dims();
        let dweight = if self.param_name == "lm_head.weight" { dweight } else { dweight.transpose() };
        dweight.reshape([h * v])
    }
}
