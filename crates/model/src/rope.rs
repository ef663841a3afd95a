//! Rotary position embeddings in Hugging Face's rotate-half convention
//! (`transformers/modeling_rope_utils.py` and `apply_rotary_pos_emb` in `modeling_llama.py`),
//! with the `llama3` frequency bands (`_compute_llama3_parameters`).
//!
//! cos/sin are computed once for every position; a forward pass gathers the rows of its tokens'
//! positions once ([`Rope::at`]) and every layer rotates with them ([`rotate`]).

use std::f64::consts::PI;

use burn::tensor::{Device, FloatDType, Int, Tensor, TensorData};

/// How the inverse frequencies are derived from `rope_theta`.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    /// Plain RoPE: `inv_freq[i] = theta^(-2i/D)`.
    Default,
    /// Llama 3.1: long wavelengths divided by `factor`, a smooth blend between the two bands.
    Llama3 { factor: f64, low_freq_factor: f64, high_freq_factor: f64, original_max_position_embeddings: usize },
}

/// Precomputed cos/sin tables, `[max_positions, D]` each, in f32.
#[derive(Debug, Clone)]
pub struct Rope {
    cos: Tensor<2>,
    sin: Tensor<2>,
}

impl Rope {
    /// Tables for positions `0..max_positions` of a `head_dim`-wide head.
    pub fn new(head_dim: usize, theta: f64, scaling: &RopeScaling, max_positions: usize, device: &Device) -> Self {
        let inv_freq = inverse_frequencies(head_dim, theta, scaling);
        let half = inv_freq.len();
        // Each row is [freqs, freqs] (the two halves share frequencies), as HF's `emb = cat(freqs, freqs)`.
        let mut cos = Vec::with_capacity(max_positions * head_dim);
        let mut sin = Vec::with_capacity(max_positions * head_dim);
        for pos in 0..max_positions {
            for j in 0..head_dim {
                // HF computes `positions (f32) @ inv_freq (f32)` in f32; do the same so the
                // angles round identically.
                let angle = (pos as f32) * inv_freq[j % half];
                cos.push(angle.cos());
                sin.push(angle.sin());
            }
        }
        let shape = [max_positions, head_dim];
        // Constants, never differentiated: kept off the autodiff graph even when the model is
        // built on an autodiff device, so `Module::valid` (which does not visit them) yields a
        // model with no autodiff tensor left.
        let table = |values| Tensor::from_data(TensorData::new(values, shape), device).without_autodiff();
        Self { cos: table(cos), sin: table(sin) }
    }

    /// Number of positions the tables cover.
    pub fn max_positions(&self) -> usize {
        self.cos.dims()[0]
    }

    /// cos and sin at each of `positions`, in `dtype` (transformers casts them to the activations'
    /// dtype under mixed precision).
    ///
    /// # Shapes
    /// - positions: `[L]` → `[1, 1, L, D]` each
    pub fn at(&self, positions: Tensor<1, Int>, dtype: FloatDType) -> (Tensor<4>, Tensor<4>) {
        let (l, d) = (positions.dims()[0], self.cos.dims()[1]);
        let positions = positions.inner();
        let gather = |table: &Tensor<2>| table.clone().select(0, positions.clone()).reshape([1, 1, l, d]).cast(dtype);
        (gather(&self.cos), gather(&self.sin))
    }
}

/// Rotates queries or keys by the angles of their positions (`x·cos + rotate_half(x)·sin`).
///
/// # Shapes
/// - x: `[B, H, L, D]`, cos, sin: `[1, 1, L, D]` → `[B, H, L, D]`
pub fn rotate(x: Tensor<4>, cos: &Tensor<4>, sin: &Tensor<4>) -> Tensor<4> {
    let d = x.dims()[3];
    let x1 = x.clone().narrow(3, 0, d / 2); // [B, H, L, D/2]
    let x2 = x.clone().narrow(3, d / 2, d / 2); // [B, H, L, D/2]
    let rotated = Tensor::cat(vec![x2.neg(), x1], 3); // [B, H, L, D]
    x * cos.clone() + rotated * sin.clone()
}

/// `inv_freq` as transformers computes it (f32 arithmetic on the exponent, as there).
fn inverse_frequencies(head_dim: usize, theta: f64, scaling: &RopeScaling) -> Vec<f32> {
    let base: Vec<f32> =
        (0..head_dim).step_by(2).map(|i| 1.0 / (theta as f32).powf(i as f32 / head_dim as f32)).collect();
    match *scaling {
        RopeScaling::Default => base,
        RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings } => {
            let old_len = original_max_position_embeddings as f64;
            let low_freq_wavelen = old_len / low_freq_factor;
            let high_freq_wavelen = old_len / high_freq_factor;
            base.into_iter()
                .map(|f| {
                    let f = f as f64;
                    let wavelen = 2.0 * PI / f;
                    let scaled = if wavelen > low_freq_wavelen { f / factor } else { f };
                    // The band between the two wavelengths (both bounds included), as transformers' `is_medium_freq`.
                    let medium = (high_freq_wavelen..=low_freq_wavelen).contains(&wavelen);
                    if medium {
                        let smooth = (old_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
                        ((1.0 - smooth) * scaled / factor + smooth * scaled) as f32
                    } else {
                        scaled as f32
                    }
                })
                .collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama3_leaves_high_frequencies_and_divides_low_ones() {
        let scaling = RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 64,
        };
        let plain = inverse_frequencies(32, 10_000.0, &RopeScaling::Default);
        let scaled = inverse_frequencies(32, 10_000.0, &scaling);
        // Wavelength 2π < 16: untouched.
        assert_eq!(plain[0], scaled[0]);
        // The longest wavelength (> 64) is divided by the factor.
        let last = plain.len() - 1;
        assert!((scaled[last] - plain[last] / 8.0).abs() < 1e-12);
    }
}
