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

    /// Whether q, k and v carry biases: always for qwen2, else `attention_bias`.
    pub fn qkv_bias(&self) -> bool {
        self.model_type.as_deref() == Some("qwen2") || self.attention_bias.unwrap_or(false)
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
}
