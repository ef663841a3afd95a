//! The RoPE scaling types of `config.json` (`rope_scaling`, or transformers 5's
//! `rope_parameters`): read once into [`RopeScaling`], and turned into inverse frequencies and the
//! scale of cos and sin as `transformers/modeling_rope_utils.py` computes them (its
//! `_compute_*_parameters`, in the same f32/f64 arithmetic so the angles round alike).
//!
//! `tests/gen/make_rope_fixture.py` records transformers' cos and sin for each type; the test
//! below reads them back through [`crate::LlamaConfig::parse`].

use std::f64::consts::PI;
use std::path::Path;

use hf_config::HfConfig;

use super::ModelError;

/// How the inverse frequencies are derived from `rope_theta`.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    /// Plain RoPE: `inv_freq[i] = theta^(-2i/D)`.
    Default,
    /// Positions divided by `factor` (Llama 2 long-context fine-tunes).
    Linear { factor: f64 },
    /// Dynamic NTK. transformers changes the frequencies only for a sequence longer than
    /// `max_position_embeddings`, which dpo-train refuses, so every position it runs has the
    /// frequencies of that length: the default ones.
    Dynamic { factor: f64, max_position_embeddings: usize },
    /// Llama 3.1: long wavelengths divided by `factor`, a smooth blend between the two bands.
    Llama3 { factor: f64, low_freq_factor: f64, high_freq_factor: f64, original_max_position_embeddings: usize },
    /// YaRN (Qwen2.5/Qwen3's long-context recipe).
    Yarn(Yarn),
}

/// YaRN's settings as `config.json` gives them (`None`: the key is absent).
#[derive(Debug, Clone, PartialEq)]
pub struct Yarn {
    pub factor: f64,
    pub original_max_position_embeddings: usize,
    pub attention_factor: Option<f64>,
    pub mscale: Option<f64>,
    pub mscale_all_dim: Option<f64>,
    pub beta_fast: f64,
    pub beta_slow: f64,
    pub truncate: bool,
}

/// The types [`parse`] reads.
const SUPPORTED: &str = "`default`, `linear`, `dynamic`, `llama3`, `yarn`";

/// `rope_theta` and the scaling type, from either the old (`rope_theta` + `rope_scaling`) or the
/// transformers 5 (`rope_parameters`) layout, with transformers' precedence
/// (`convert_rope_params_to_dict`): a non-empty `rope_scaling` replaces `rope_parameters`, and a
/// value inside them beats the top-level one. `path` only names the file in errors.
pub fn parse(hf: &HfConfig, path: &Path) -> Result<(f64, RopeScaling), ModelError> {
    let present = |v: &&serde_json::Value| !v.is_null() && v.as_object().is_none_or(|o| !o.is_empty());
    let params = hf.rope_scaling.as_ref().filter(present).or(hf.rope_parameters.as_ref().filter(present));
    let value = |key: &str| params.and_then(|p| p.get(key)).filter(|v| !v.is_null());
    let get = |key: &str| value(key).and_then(|v| v.as_f64());
    let bad = |message: String| ModelError::BadConfig { path: path.to_owned(), message };
    if let Some(layer) = ["full_attention", "sliding_attention"].into_iter().find(|k| value(k).is_some()) {
        return Err(bad(format!("rope parameters per layer type (`{layer}`) are not supported")));
    }
    let theta = get("rope_theta").or(hf.rope_theta).unwrap_or(10_000.0);
    let rope_type = value("rope_type").or_else(|| value("type")).and_then(|v| v.as_str()).unwrap_or("default");
    // transformers' Llama-family code ignores the factor for plain RoPE; a scaled type computes
    // frequencies for the partial width, which its attention then cannot apply.
    let partial = get("partial_rotary_factor").or(hf.partial_rotary_factor).unwrap_or(1.0);
    let head_dim = hf.head_dim();
    if rope_type != "default" && (head_dim as f64 * partial) as u64 != head_dim {
        return Err(bad(format!(
            "`partial_rotary_factor` {partial} with `{rope_type}` rope scaling: these models turn the whole head (transformers fails on it too)"
        )));
    }
    let need = |key: &'static str| {
        get(key).ok_or_else(|| ModelError::BadConfig {
            path: path.to_owned(),
            message: format!("`{rope_type}` rope scaling needs `{key}`"),
        })
    };
    let max_positions = usize::try_from(hf.max_position_embeddings).unwrap_or(usize::MAX);
    // transformers takes a top-level value first (Phi-3's layout), then the rope's, then
    // `max_position_embeddings`.
    let original = hf
        .original_max_position_embeddings
        .or_else(|| get("original_max_position_embeddings").map(|v| v as u64))
        .map_or(max_positions, |v| usize::try_from(v).unwrap_or(usize::MAX));
    let scaling = match rope_type {
        "default" => RopeScaling::Default,
        "linear" => RopeScaling::Linear { factor: need("factor")? },
        "dynamic" => RopeScaling::Dynamic { factor: need("factor")?, max_position_embeddings: max_positions },
        "llama3" => RopeScaling::Llama3 {
            factor: need("factor")?,
            low_freq_factor: need("low_freq_factor")?,
            high_freq_factor: need("high_freq_factor")?,
            original_max_position_embeddings: original,
        },
        "yarn" => RopeScaling::Yarn(Yarn {
            // An absent factor is the ratio of the two lengths, as there.
            factor: get("factor").unwrap_or(max_positions as f64 / original as f64),
            original_max_position_embeddings: original,
            attention_factor: get("attention_factor"),
            mscale: get("mscale"),
            mscale_all_dim: get("mscale_all_dim"),
            // `or`: a 0 or null takes the default, as Python's `or` does.
            beta_fast: get("beta_fast").filter(|&b| b != 0.0).unwrap_or(32.0),
            beta_slow: get("beta_slow").filter(|&b| b != 0.0).unwrap_or(1.0),
            truncate: value("truncate").and_then(|v| v.as_bool()).unwrap_or(true),
        }),
        other => {
            return Err(ModelError::Unsupported {
                path: path.to_owned(),
                key: "rope_type",
                found: format!("`{other}`"),
                supported: SUPPORTED,
            });
        }
    };
    Ok((theta, scaling))
}

/// `inv_freq` (`[head_dim / 2]`) and the factor cos and sin are multiplied by (transformers'
/// `attention_scaling`), as transformers computes them for a sequence within
/// `max_position_embeddings`.
pub fn inverse_frequencies(head_dim: usize, theta: f64, scaling: &RopeScaling) -> (Vec<f32>, f32) {
    // `theta ** (arange(0, D, 2).float() / D)`: the exponent and the power in f32.
    let powers = |theta: f64| (0..head_dim).step_by(2).map(move |i| (theta as f32).powf(i as f32 / head_dim as f32));
    let plain = |theta: f64| -> Vec<f32> { powers(theta).map(|p| 1.0 / p).collect() };
    match scaling {
        RopeScaling::Default => (plain(theta), 1.0),
        RopeScaling::Linear { factor } => (plain(theta).into_iter().map(|f| f / *factor as f32).collect(), 1.0),
        RopeScaling::Dynamic { factor, max_position_embeddings } => {
            // The base at `seq_len = max_position_embeddings`, in transformers' f64 arithmetic.
            let (d, len) = (head_dim as f64, *max_position_embeddings as f64);
            (plain(theta * (factor * len / len - (factor - 1.0)).powf(d / (d - 2.0))), 1.0)
        }
        RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings } => {
            let bands = Llama3Bands {
                factor: *factor,
                low: *low_freq_factor,
                high: *high_freq_factor,
                old_len: *original_max_position_embeddings as f64,
            };
            (plain(theta).into_iter().map(|f| bands.scale(f)).collect(), 1.0)
        }
        RopeScaling::Yarn(yarn) => yarn.frequencies(head_dim, theta, powers(theta)),
    }
}

/// `_compute_llama3_parameters`' bands.
struct Llama3Bands {
    factor: f64,
    low: f64,
    high: f64,
    old_len: f64,
}

impl Llama3Bands {
    fn scale(&self, f: f32) -> f32 {
        let (f, factor) = (f as f64, self.factor);
        let (low_freq_wavelen, high_freq_wavelen) = (self.old_len / self.low, self.old_len / self.high);
        let wavelen = 2.0 * PI / f;
        let scaled = if wavelen > low_freq_wavelen { f / factor } else { f };
        // The band between the two wavelengths (both bounds included), as transformers' `is_medium_freq`.
        if (high_freq_wavelen..=low_freq_wavelen).contains(&wavelen) {
            let smooth = (self.old_len / wavelen - self.low) / (self.high - self.low);
            ((1.0 - smooth) * scaled / factor + smooth * scaled) as f32
        } else {
            scaled as f32
        }
    }
}

impl Yarn {
    /// `_compute_yarn_parameters`: each frequency blends the interpolated (`/ factor`) and the
    /// original one by a ramp over the dimensions whose rotations in the original length fall
    /// between `beta_slow` and `beta_fast`; cos and sin are scaled by the attention factor.
    fn frequencies(&self, head_dim: usize, theta: f64, powers: impl Iterator<Item = f32>) -> (Vec<f32>, f32) {
        let d = head_dim as f64;
        let correction_dim = |rotations: f64| {
            d * (self.original_max_position_embeddings as f64 / (rotations * 2.0 * PI)).ln() / (2.0 * theta.ln())
        };
        let (mut low, mut high) = (correction_dim(self.beta_fast), correction_dim(self.beta_slow));
        if self.truncate {
            (low, high) = (low.floor(), high.ceil());
        }
        let (low, mut high) = (low.max(0.0), high.min(d - 1.0));
        if low == high {
            high += 0.001; // as there: no division by zero
        }
        let factor = self.factor as f32;
        let inv = powers
            .enumerate()
            .map(|(i, pos_freq)| {
                let (extra, interp) = (1.0 / pos_freq, 1.0 / (factor * pos_freq));
                let ramp = ((i as f32 - low as f32) / (high - low) as f32).clamp(0.0, 1.0);
                let keep = 1.0 - ramp; // inv_freq_extrapolation_factor
                interp * (1.0 - keep) + extra * keep
            })
            .collect();
        (inv, self.attention_factor() as f32)
    }

    /// The given attention factor, else `0.1·ln(factor) + 1` (or the ratio of two such at
    /// `mscale` and `mscale_all_dim` where both are set), as there.
    fn attention_factor(&self) -> f64 {
        let mscale = |scale: f64, m: f64| if scale <= 1.0 { 1.0 } else { 0.1 * m * scale.ln() + 1.0 };
        match (self.attention_factor, self.mscale, self.mscale_all_dim) {
            (Some(given), _, _) => given,
            (None, Some(m), Some(all)) if m != 0.0 && all != 0.0 => mscale(self.factor, m) / mscale(self.factor, all),
            _ => mscale(self.factor, 1.0),
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
        let (plain, _) = inverse_frequencies(32, 10_000.0, &RopeScaling::Default);
        let (scaled, scale) = inverse_frequencies(32, 10_000.0, &scaling);
        assert_eq!(scale, 1.0);
        // Wavelength 2π < 16: untouched.
        assert_eq!(plain[0], scaled[0]);
        // The longest wavelength (> 64) is divided by the factor.
        let last = plain.len() - 1;
        assert!((scaled[last] - plain[last] / 8.0).abs() < 1e-12);
    }

    /// A partial rotary width with a scaled type is refused (transformers' Llama-family attention
    /// fails on the narrower tables); with plain RoPE it is ignored, as there (rope.json's case).
    #[test]
    fn partial_rotary_factor_is_refused_where_transformers_cannot_run_it() {
        let hf = |extra: &str| {
            HfConfig::parse(&format!(
                r#"{{"model_type": "llama", "vocab_size": 10, "hidden_size": 64, "intermediate_size": 128,
                    "num_hidden_layers": 1, "num_attention_heads": 4{extra}}}"#
            ))
            .unwrap()
        };
        let path = Path::new("m/config.json");
        let scaled = hf(r#", "partial_rotary_factor": 0.5, "rope_scaling": {"rope_type": "linear", "factor": 4.0}"#);
        let err = parse(&scaled, path).unwrap_err().to_string();
        assert!(err.contains("`partial_rotary_factor` 0.5 with `linear` rope scaling"), "{err}");
        let nested = hf(r#", "rope_parameters": {"rope_type": "yarn", "factor": 2.0, "partial_rotary_factor": 0.25}"#);
        assert!(parse(&nested, path).is_err());
        let whole = hf(r#", "partial_rotary_factor": 1.0, "rope_scaling": {"rope_type": "linear", "factor": 4.0}"#);
        assert_eq!(parse(&whole, path).unwrap(), (10_000.0, RopeScaling::Linear { factor: 4.0 }));
        let per_layer = hf(r#", "rope_parameters": {"full_attention": {"rope_type": "default"}}"#);
        assert!(parse(&per_layer, path).unwrap_err().to_string().contains("per layer type"));
    }
}
