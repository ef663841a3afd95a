//! `config.json` of a Hugging Face causal language model, with the key names and defaults of
//! transformers (`models/{llama,mistral,qwen2,qwen3}/configuration_*.py`): the one definition
//! that both `dpo-train` (which builds the model from it, `model::llama`) and `check-gpu` (which
//! counts its parameters for the memory plan, `check_gpu::model`) read. What a field means for a
//! model is each reader's to resolve and check; this crate only parses.

use serde::Deserialize;

/// The fields of `config.json` the two programs use; unknown keys are ignored, as transformers
/// keeps them as attributes.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct HfConfig {
    /// `llama`, `mistral`, `qwen2`, `qwen3`, ...
    pub model_type: Option<String>,
    pub vocab_size: u64,
    pub hidden_size: u64,
    pub intermediate_size: u64,
    pub num_hidden_layers: u64,
    pub num_attention_heads: u64,
    /// Grouped-query attention; `num_attention_heads` when absent.
    pub num_key_value_heads: Option<u64>,
    /// Width of one head; `hidden_size / num_attention_heads` when absent.
    pub head_dim: Option<u64>,
    #[serde(default = "default_rms_norm_eps")]
    pub rms_norm_eps: f64,
    /// Older configs keep `rope_theta` at the top level; transformers 5 moves it into
    /// `rope_parameters`.
    pub rope_theta: Option<f64>,
    pub rope_scaling: Option<serde_json::Value>,
    pub rope_parameters: Option<serde_json::Value>,
    #[serde(default = "default_max_positions")]
    pub max_position_embeddings: u64,
    /// The pretraining length of a scaled RoPE, where a config keeps it at the top level (Phi-3's
    /// layout, which transformers prefers to the rope's own).
    pub original_max_position_embeddings: Option<u64>,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// Biases on q, k, v and o (llama, qwen3); qwen2 has q, k, v biases whatever this says.
    pub attention_bias: Option<bool>,
    /// Biases on the MLP projections (llama).
    #[serde(default)]
    pub mlp_bias: bool,
    #[serde(default = "default_act")]
    pub hidden_act: String,
    /// Tokens each query may look back (mistral; qwen only with `use_sliding_window`).
    pub sliding_window: Option<u64>,
    #[serde(default)]
    pub use_sliding_window: bool,
    /// Qwen: the layers from this index on slide (28 when absent), unless `layer_types` says.
    pub max_window_layers: Option<u64>,
    /// Qwen: each layer's `full_attention` or `sliding_attention`.
    pub layer_types: Option<Vec<String>>,
    /// The share of each head the rotary embedding turns (top level, or in `rope_parameters`).
    pub partial_rotary_factor: Option<f64>,
}

impl HfConfig {
    /// Parses `config.json` text.
    pub fn parse(text: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(text)
    }

    /// The heads sharing each key/value head's group: `num_key_value_heads`, or one per head.
    pub fn kv_heads(&self) -> u64 {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    /// `head_dim`, or `hidden_size / num_attention_heads` (0 when there are no heads).
    pub fn head_dim(&self) -> u64 {
        self.head_dim.unwrap_or_else(|| self.hidden_size.checked_div(self.num_attention_heads).unwrap_or(0))
    }

    /// Whether q, k and v carry biases: always for qwen2, never for mistral (transformers' Mistral
    /// has none whatever `attention_bias` says), else `attention_bias`.
    pub fn qkv_bias(&self) -> bool {
        match self.model_type.as_deref() {
            Some("qwen2") => true,
            Some("mistral") => false,
            _ => self.attention_bias.unwrap_or(false),
        }
    }

    /// Whether the output projection carries a bias: `attention_bias` for llama and qwen3 (qwen2's
    /// and mistral's never do).
    pub fn o_bias(&self) -> bool {
        !matches!(self.model_type.as_deref(), Some("qwen2" | "mistral")) && self.attention_bias.unwrap_or(false)
    }

    /// Whether the MLP projections carry biases: `mlp_bias` for llama; the other families' MLPs
    /// have none.
    pub fn mlp_bias(&self) -> bool {
        self.model_type.as_deref() == Some("llama") && self.mlp_bias
    }

    /// The attention window, where a layer slides (transformers' `layer_types`): mistral's
    /// `sliding_window` on every layer; qwen's only with `use_sliding_window` and on the layers
    /// `layer_types` marks `sliding_attention`, else those from `max_window_layers` (28) on.
    pub fn attention_window(&self) -> Option<u64> {
        match self.model_type.as_deref() {
            Some("mistral") => self.sliding_window,
            Some("qwen2" | "qwen3") if self.use_sliding_window => {
                let slides = match &self.layer_types {
                    Some(types) => types.iter().any(|t| t == "sliding_attention"),
                    None => self.max_window_layers.unwrap_or(28) < self.num_hidden_layers,
                };
                self.sliding_window.filter(|_| slides)
            }
            _ => None,
        }
    }
}

fn default_rms_norm_eps() -> f64 {
    1e-6
}

fn default_max_positions() -> u64 {
    2048
}

fn default_act() -> String {
    "silu".to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transformers_defaults_fill_what_is_absent() {
        let cfg = HfConfig::parse(
            r#"{"model_type": "qwen2", "vocab_size": 10, "hidden_size": 64, "intermediate_size": 128,
                "num_hidden_layers": 2, "num_attention_heads": 4, "extra": [1, 2]}"#,
        )
        .unwrap();
        assert_eq!((cfg.kv_heads(), cfg.head_dim(), cfg.max_position_embeddings), (4, 16, 2048));
        assert_eq!((cfg.rms_norm_eps, cfg.hidden_act.as_str(), cfg.tie_word_embeddings), (1e-6, "silu", false));
        assert!(cfg.qkv_bias(), "qwen2 has q/k/v biases");
        assert!(HfConfig::parse(r#"{"vocab_size": 1}"#).unwrap_err().to_string().starts_with("missing field"));
    }

    fn config(model_type: &str, extra: &str) -> HfConfig {
        HfConfig::parse(&format!(
            r#"{{"model_type": "{model_type}", "vocab_size": 10, "hidden_size": 64, "intermediate_size": 128,
                "num_hidden_layers": 2, "num_attention_heads": 4{extra}}}"#
        ))
        .unwrap()
    }

    /// transformers' Qwen2/Qwen3 configs slide only the layers `layer_types` marks, by default
    /// those from `max_window_layers` (28) on: a 2-layer model with the window switched on attends
    /// in full. Mistral slides every layer.
    #[test]
    fn the_window_applies_where_a_layer_slides() {
        let on = r#", "use_sliding_window": true, "sliding_window": 8"#;
        for family in ["qwen2", "qwen3"] {
            assert_eq!(config(family, on).attention_window(), None, "{family}: layers 0-1 are below 28");
            assert_eq!(config(family, &format!(r#"{on}, "max_window_layers": 1"#)).attention_window(), Some(8));
            let types = r#", "layer_types": ["full_attention", "sliding_attention"], "max_window_layers": 28"#;
            assert_eq!(config(family, &format!("{on}{types}")).attention_window(), Some(8));
            let off = r#", "sliding_window": 8, "max_window_layers": 0"#;
            assert_eq!(config(family, off).attention_window(), None, "{family}: use_sliding_window is false");
        }
        assert_eq!(config("mistral", r#", "sliding_window": 8"#).attention_window(), Some(8));
        assert_eq!(config("mistral", r#", "sliding_window": null"#).attention_window(), None);
        assert_eq!(config("llama", on).attention_window(), None);
    }

    /// Which projections carry biases, as each family's modeling code builds them: Mistral's never
    /// (its `attention_bias` is ignored), Qwen2's q/k/v always and its o never, `mlp_bias` only
    /// in Llama.
    #[test]
    fn biases_as_each_family_builds_them() {
        let both = r#", "attention_bias": true, "mlp_bias": true"#;
        let bias = |c: HfConfig| (c.qkv_bias(), c.o_bias(), c.mlp_bias());
        assert_eq!(bias(config("llama", both)), (true, true, true));
        assert_eq!(bias(config("qwen3", both)), (true, true, false));
        assert_eq!(bias(config("qwen2", both)), (true, false, false));
        assert_eq!(bias(config("qwen2", "")), (true, false, false));
        assert_eq!(bias(config("mistral", both)), (false, false, false));
        assert_eq!(bias(config("llama", "")), (false, false, false));
    }
}
