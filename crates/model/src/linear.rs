//! The projection every transformer block is made of: `y = x·W + b`, optionally with a LoRA
//! adapter added beside the frozen weight (Hu et al. 2021, as PEFT's `lora.Linear`):
//!
//! `y = x·W + b + dropout(x)·A·B · α/r`
//!
//! `W` is stored `[in, out]` (burn's orientation; HF checkpoints hold `[out, in]` and are
//! transposed on the way in and out). The weight is cast to the input's dtype, so one module
//! serves f32 training, mixed precision over f32 master weights, and a frozen half-precision base.

use burn::module::{Module, Param};
use burn::tensor::module::linear;
use burn::tensor::{Distribution, FloatDType, Tensor};

/// A linear layer, with an optional LoRA adapter.
#[derive(Module, Debug)]
pub struct Linear {
    /// `[in, out]`
    pub weight: Param<Tensor<2>>,
    /// `[out]`
    pub bias: Option<Param<Tensor<1>>>,
    pub lora: Option<Lora>,
}

/// A low-rank update `A·B` scaled by `α/r`. `B` starts at zero, so a fresh adapter leaves the
/// layer's output unchanged.
#[derive(Module, Debug)]
pub struct Lora {
    /// `[in, r]` (PEFT's `lora_A.weight` is `[r, in]`)
    pub a: Param<Tensor<2>>,
    /// `[r, out]` (PEFT's `lora_B.weight` is `[out, r]`)
    pub b: Param<Tensor<2>>,
    /// `α / r`
    #[module(skip)]
    pub scale: f64,
    /// Probability of zeroing an input feature of the adapter path; only ever non-zero on the
    /// policy being trained (evaluation copies switch it off).
    #[module(skip)]
    pub dropout: f64,
}

impl Linear {
    /// # Shapes
    /// - x: `[..., in]` → `[..., out]`
    pub fn forward<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        let dtype = FloatDType::from(x.dtype());
        let bias = self.bias.as_ref().map(|b| b.val().cast(dtype));
        let y = linear_rows(x.clone(), self.weight.val().cast(dtype), bias); // [..., out]
        match &self.lora {
            Some(lora) => y + lora.forward(x),
            None => y,
        }
    }

    /// Folds the adapter into the weight and removes it: `W + A·B·α/r`, in f32 (a half-precision
    /// base would round the update away).
    pub fn merge(&mut self) {
        let Some(lora) = self.lora.take() else { return };
        let f32 = |p: &Param<Tensor<2>>| p.val().cast(FloatDType::F32);
        self.weight = Param::from_tensor(f32(&self.weight) + f32(&lora.a).matmul(f32(&lora.b)) * lora.scale);
    }
}

impl Lora {
    /// # Shapes
    /// - x: `[..., in]` → `[..., out]`
    fn forward<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        let dtype = FloatDType::from(x.dtype());
        let x = if self.dropout > 0.0 {
            let keep = 1.0 - self.dropout;
            // Drawn from the device generator: a checkpointed layer reseeds it to redraw the same mask.
            let mask = x.random_like(Distribution::Bernoulli(keep));
            x * mask / keep
        } else {
            x
        };
        let down = linear_rows(x, self.a.val().cast(dtype), None); // [..., r]
        linear_rows(down, self.b.val().cast(dtype), None) * self.scale // [..., out]
    }
}

/// `x·W + b` as one matrix product over every leading position. burn's `linear` keeps a batched
/// input batched (`[B, S, in] @ [1, in, out]`), which torch runs as a `bmm` against the weight
/// expanded per batch, and its half-precision (oneDNN) kernels copy that expansion on every call,
/// forward and backward.
///
/// # Shapes
/// - x: `[..., in]`, weight: `[in, out]`, bias: `[out]` → `[..., out]`
pub fn linear_rows<const D: usize>(x: Tensor<D>, weight: Tensor<2>, bias: Option<Tensor<1>>) -> Tensor<D> {
    let mut dims = x.dims();
    let rows = dims[..D - 1].iter().product();
    let y = linear(x.reshape([rows, dims[D - 1]]), weight, bias); // [rows, out]
    dims[D - 1] = y.dims()[1];
    y.reshape(dims)
}
