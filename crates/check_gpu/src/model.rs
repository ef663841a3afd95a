//! Model shapes for memory planning: read from a Hugging Face `config.json` (Llama, Mistral,
//! Qwen2/3 key names, as in `transformers/models/llama/configuration_llama.py`) or guessed from a
//! parameter count (`--model-params 1.5B`) by picking the nearest well-known architecture.
//!
//! Parameter count (per decoder layer, GQA aware):
//! attention `h*(a*d) + 2*h*(kv*d) + (a*d)*h` (+ `a*d + 2*kv*d` q/k/v biases for Qwen2 or
//! `attention_bias`), MLP `3*h*i` (gate, up, down), two RMSNorms `2*h`; plus embeddings `V*h`,
//! the final norm `h`, and `V*h` for an untied `lm_head`. ZeRO-3 gathers the largest of one layer,
//! the embedding and the head at a time ([`ModelShape::gathered_piece_params`]).

use std::path::{Path, PathBuf};

use hf_config::HfConfig;
use serde::{Deserialize, Serialize};

/// The `model_type` values dpo-train builds (`src/model/llama.rs`, `SUPPORTED_MODEL_TYPES`).
pub const SUPPORTED_MODEL_TYPES: [&str; 4] = ["llama", "mistral", "qwen2", "qwen3"];

/// Errors reading a model description.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// `config.json` could not be read.
    #[error("cannot read `{path}`")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// `config.json` is not the expected JSON.
    #[error("{path}:{line}:{column}: expected a Hugging Face config.json: {message}")]
    Json { path: PathBuf, line: usize, column: usize, message: String },
    /// A shape value is zero or inconsistent.
    #[error("{path}:{line}: `{key}` must be {expected}")]
    Invalid { path: PathBuf, line: usize, key: &'static str, expected: &'static str },
    /// Sizes whose model has more parameters than the estimate handles (1e15).
    #[error(
        "{path}:{line}: `{key}` = {value} makes a model of more than 1e15 parameters, the most the estimate handles"
    )]
    TooLarge { path: PathBuf, line: usize, key: &'static str, value: u64 },
    /// `model_type` names an architecture dpo-train does not build (its parameters would be
    /// counted as a Llama's, and the printed command would fail).
    #[error("{path}:{line}: unsupported `model_type` {found}: dpo-train trains {}", SUPPORTED_MODEL_TYPES.join(", "))]
    ModelType { path: PathBuf, line: usize, found: String },
    /// `--model-params` text that is not a count.
    #[error("invalid parameter count `{0}`: expected a number with an optional K, M, B or T suffix, e.g. `1.5B`")]
    Count(String),
    /// `--model-params` outside the range the estimate handles.
    #[error("parameter count `{0}` is out of range: expected 1 to 1e15 (`1000T`)")]
    CountRange(String),
}

/// The numbers the memory estimate needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelShape {
    /// Where the shape came from: `from <config.json path>` or `shaped like <preset>`.
    pub source: String,
    /// Total parameters.
    pub params: u64,
    /// Hidden size `h`.
    pub hidden_size: u64,
    /// Decoder layers `L`.
    pub num_layers: u64,
    /// Attention heads `a`.
    pub num_heads: u64,
    /// Key/value heads (GQA).
    pub num_kv_heads: u64,
    /// Per-head dimension `d`.
    pub head_dim: u64,
    /// MLP width `i`.
    pub intermediate_size: u64,
    /// Vocabulary `V`.
    pub vocab_size: u64,
    /// Whether `lm_head` shares the embedding matrix.
    pub tied_embeddings: bool,
    /// Whether q/k/v projections carry biases.
    pub qkv_bias: bool,
}

impl ModelShape {
    /// Counts parameters from the shape fields (see the module doc for the formula).
    pub fn count_params(&self) -> u64 {
        let (h, v) = (self.hidden_size, self.vocab_size);
        let lm_head = if self.tied_embeddings { 0 } else { m(&[v, h]) };
        sum(&[m(&[v, h]), m(&[self.num_layers, self.layer_params()]), h, lm_head])
    }

    /// Parameters of one decoder layer: attention (GQA, optional q/k/v biases), the 3-matrix
    /// MLP and two RMSNorms (see the module doc).
    pub fn layer_params(&self) -> u64 {
        let (h, a, kv, d, i) =
            (self.hidden_size, self.num_heads, self.num_kv_heads, self.head_dim, self.intermediate_size);
        let bias = if self.qkv_bias { sum(&[m(&[a, d]), m(&[2, kv, d])]) } else { 0 };
        let attn = sum(&[m(&[h, a, d]), m(&[2, h, kv, d]), m(&[a, d, h]), bias]);
        sum(&[attn, m(&[3, h, i]), m(&[2, h])])
    }

    /// Parameters of the largest piece ZeRO-3 gathers at one time (`P_part`): one decoder
    /// layer, the embedding `V*h`, or the head (final norm + untied `lm_head`, `h + V*h`; a tied
    /// head is the embedding again). dpo-train gathers one of these, runs it and frees it.
    pub fn gathered_piece_params(&self) -> u64 {
        let embedding = m(&[self.vocab_size, self.hidden_size]);
        let head = if self.tied_embeddings { embedding } else { embedding.saturating_add(self.hidden_size) };
        self.layer_params().max(embedding).max(head)
    }

    /// LoRA adapter parameters for rank `r` on q, k, v and o: `r*(d_in + d_out)` per matrix.
    pub fn lora_params(&self, rank: u64) -> u64 {
        let (h, q, kv) = (self.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim);
        let per_layer = (h + q).saturating_add(h + kv).saturating_add(h + kv).saturating_add(q + h);
        self.num_layers.saturating_mul(rank).saturating_mul(per_layer)
    }

    /// Reads `DIR/config.json` (or a path to the file itself).
    pub fn from_hf_dir(dir: &Path) -> Result<ModelShape, ModelError> {
        let path = if dir.is_dir() { dir.join("config.json") } else { dir.to_path_buf() };
        let text = std::fs::read_to_string(&path).map_err(|source| ModelError::Read { path: path.clone(), source })?;
        ModelShape::from_hf_json(&text, &path)
    }

    /// The model directory `--model` names: `path` itself, or the directory of a `config.json`
    /// given as a file (dpo-train's `--model-name-or-path` wants the directory).
    pub fn hf_dir(path: &Path) -> PathBuf {
        if path.is_dir() {
            return path.to_path_buf();
        }
        match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        }
    }

    /// Parses `config.json` text; `path` names it in errors.
    pub fn from_hf_json(text: &str, path: &Path) -> Result<ModelShape, ModelError> {
        let json_error = |e: serde_json::Error| {
            let m = e.to_string();
            let message = m.rfind(" at line ").map_or(m.clone(), |i| m[..i].to_string());
            ModelError::Json { path: path.to_path_buf(), line: e.line().max(1), column: e.column(), message }
        };
        // The architecture first: a t5 or mixtral config has other keys (or more weights) than
        // the shape fields below describe.
        let head: ModelTypeOnly = serde_json::from_str(text).map_err(json_error)?;
        match head.model_type.as_deref() {
            Some(t) if SUPPORTED_MODEL_TYPES.contains(&t) => {}
            found => {
                let line = key_line(text, "model_type");
                let found = found.map_or("(missing)".to_string(), |t| format!("`{t}`"));
                return Err(ModelError::ModelType { path: path.to_path_buf(), line, found });
            }
        }
        let cfg = HfConfig::parse(text).map_err(json_error)?;
        let invalid =
            |key, expected| ModelError::Invalid { path: path.to_path_buf(), line: key_line(text, key), key, expected };
        let sizes = [
            ("hidden_size", cfg.hidden_size),
            ("num_hidden_layers", cfg.num_hidden_layers),
            ("num_attention_heads", cfg.num_attention_heads),
            ("intermediate_size", cfg.intermediate_size),
            ("vocab_size", cfg.vocab_size),
        ];
        if let Some((key, _)) = sizes.iter().find(|(_, value)| *value == 0) {
            return Err(invalid(key, "greater than zero"));
        }
        let kv = cfg.kv_heads();
        if kv == 0 || !cfg.num_attention_heads.is_multiple_of(kv) {
            return Err(invalid("num_key_value_heads", "a divisor of num_attention_heads"));
        }
        let head_dim = cfg.head_dim();
        if head_dim == 0 {
            return Err(invalid("head_dim", "greater than zero"));
        }
        let qkv_bias = cfg.qkv_bias();
        let mut shape = ModelShape {
            source: format!("from {}", path.display()),
            params: 0,
            hidden_size: cfg.hidden_size,
            num_layers: cfg.num_hidden_layers,
            num_heads: cfg.num_attention_heads,
            num_kv_heads: kv,
            head_dim,
            intermediate_size: cfg.intermediate_size,
            vocab_size: cfg.vocab_size,
            tied_embeddings: cfg.tie_word_embeddings,
            qkv_bias,
        };
        shape.params = shape.count_params();
        if shape.params > MAX_PARAMS {
            // The size that contributes most names the fault.
            let (key, value) = sizes.into_iter().max_by_key(|(_, v)| *v).unwrap_or(("hidden_size", 0));
            return Err(ModelError::TooLarge { path: path.to_path_buf(), line: key_line(text, key), key, value });
        }
        Ok(shape)
    }

    /// A shape for a bare parameter count: the nearest preset (by log ratio), with `params`
    /// set to the requested count so the per-parameter terms use it exactly.
    pub fn from_param_count(params: u64) -> ModelShape {
        let target = (params.max(1) as f64).ln();
        let mut best = preset(&PRESETS[0]);
        let mut best_dist = f64::INFINITY;
        for p in &PRESETS {
            let shape = preset(p);
            let dist = ((shape.params as f64).ln() - target).abs();
            if dist < best_dist {
                best_dist = dist;
                best = shape;
            }
        }
        best.source = format!("shaped like {}", best.source);
        best.params = params;
        best
    }
}

/// The one key read before the rest of `config.json`.
#[derive(Deserialize)]
struct ModelTypeOnly {
    model_type: Option<String>,
}

/// The 1-based line of `"key"` in `text` (1 when absent).
fn key_line(text: &str, key: &str) -> usize {
    let quoted = format!("\"{key}\"");
    text.find(&quoted).map_or(1, |at| text[..at].matches('\n').count() + 1)
}

/// The most parameters the estimate handles (`--model-params 1000T`): its byte counts stay far
/// inside u64.
const MAX_PARAMS: u64 = 1_000_000_000_000_000;

/// Product of `x`, saturating: a config.json with absurd sizes gives a count that fits nowhere,
/// not a wrap.
fn m(x: &[u64]) -> u64 {
    x.iter().fold(1u64, |acc, &y| acc.saturating_mul(y))
}

/// Sum of `x`, saturating.
fn sum(x: &[u64]) -> u64 {
    x.iter().fold(0u64, |acc, &y| acc.saturating_add(y))
}

/// `(name, h, L, a, kv, i, V, tied, qkv_bias)` of common open models, from their `config.json`.
type Preset = (&'static str, u64, u64, u64, u64, u64, u64, bool, bool);

const PRESETS: [Preset; 11] = [
    ("SmolLM2-135M", 576, 30, 9, 3, 1536, 49152, true, false),
    ("Qwen2.5-0.5B", 896, 24, 14, 2, 4864, 151936, true, true),
    ("Llama-3.2-1B", 2048, 16, 32, 8, 8192, 128256, true, false),
    ("Qwen2.5-1.5B", 1536, 28, 12, 2, 8960, 151936, true, true),
    ("Qwen2.5-3B", 2048, 36, 16, 2, 11008, 151936, true, true),
    ("Qwen2.5-7B", 3584, 28, 28, 4, 18944, 152064, false, true),
    ("Llama-3.1-8B", 4096, 32, 32, 8, 14336, 128256, false, false),
    ("Qwen2.5-14B", 5120, 48, 40, 8, 13824, 152064, false, true),
    ("Qwen2.5-32B", 5120, 64, 40, 8, 27648, 152064, false, true),
    ("Llama-3.1-70B", 8192, 80, 64, 8, 28672, 128256, false, false),
    ("Llama-3.1-405B", 16384, 126, 128, 8, 53248, 128256, false, false),
];

fn preset(p: &Preset) -> ModelShape {
    let &(name, h, l, a, kv, i, v, tied, bias) = p;
    let mut s = ModelShape {
        source: name.to_string(),
        params: 0,
        hidden_size: h,
        num_layers: l,
        num_heads: a,
        num_kv_heads: kv,
        head_dim: h / a,
        intermediate_size: i,
        vocab_size: v,
        tied_embeddings: tied,
        qkv_bias: bias,
    };
    s.params = s.count_params();
    s
}

/// Parses `1.5B`, `500M`, `135m`, `7e9`, `1500000000`, `1T`.
pub fn parse_param_count(text: &str) -> Result<u64, ModelError> {
    let t = text.trim();
    let bad = || ModelError::Count(text.to_string());
    let (num, mult) = match t.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&t[..t.len() - 1], 1e3),
        Some('M') => (&t[..t.len() - 1], 1e6),
        Some('B') | Some('G') => (&t[..t.len() - 1], 1e9),
        Some('T') => (&t[..t.len() - 1], 1e12),
        _ => (t, 1.0),
    };
    let value: f64 = num.trim().parse().map_err(|_| bad())?;
    let n = value * mult;
    if n.is_nan() {
        return Err(bad());
    }
    if !(1.0..=MAX_PARAMS as f64).contains(&n) {
        return Err(ModelError::CountRange(text.to_string()));
    }
    Ok(n.round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qwen2_5_1_5b_count_matches_published() {
        let text = r#"{"model_type":"qwen2","hidden_size":1536,"num_hidden_layers":28,"num_attention_heads":12,
            "num_key_value_heads":2,"intermediate_size":8960,"vocab_size":151936,"tie_word_embeddings":true}"#;
        let s = ModelShape::from_hf_json(text, Path::new("config.json")).expect("parses");
        // Hugging Face lists Qwen2.5-1.5B at 1.54B parameters.
        assert_eq!(s.params, 1_543_714_304);
        assert_eq!(s.head_dim, 128);
        assert!(s.qkv_bias);
        // Attention 1536*1536*2 + 2*1536*256 + biases 1536+512, MLP 3*1536*8960, norms 2*1536.
        assert_eq!(s.layer_params(), 5_507_072 + 41_287_680 + 3_072);
        // Tied: the largest gathered piece is the embedding, 151936*1536.
        assert_eq!(s.gathered_piece_params(), 233_373_696);
    }

    #[test]
    fn llama_3_1_8b_untied_with_explicit_head_dim() {
        let text = r#"{"model_type":"llama","hidden_size":4096,"num_hidden_layers":32,"num_attention_heads":32,
            "num_key_value_heads":8,"head_dim":128,"intermediate_size":14336,"vocab_size":128256,"tie_word_embeddings":false}"#;
        let s = ModelShape::from_hf_json(text, Path::new("config.json")).expect("parses");
        assert_eq!(s.params, 8_030_261_248);
        // Untied: the head (final norm + lm_head, 4096 + 128256*4096) outweighs a layer (218M).
        assert_eq!(s.layer_params(), 218_112_000);
        assert_eq!(s.gathered_piece_params(), 4096 + 525_336_576);
        // r=16 on q,k,v,o: 32 * 16 * ((4096+4096) + 2*(4096+1024) + (4096+4096)).
        assert_eq!(s.lora_params(16), 32 * 16 * (8192 + 2 * 5120 + 8192));
    }

    #[test]
    fn config_errors() {
        let err = ModelShape::from_hf_json(r#"{"model_type":"llama","hidden_size": 8}"#, Path::new("m/config.json"))
            .expect_err("missing keys");
        assert!(err.to_string().starts_with("m/config.json:1:"), "{err}");
        assert!(err.to_string().contains("missing field"), "{err}");
        let zero = r#"{"model_type":"llama","hidden_size":0,"num_hidden_layers":1,"num_attention_heads":1,"intermediate_size":1,"vocab_size":1}"#;
        assert_eq!(
            ModelShape::from_hf_json(zero, Path::new("c.json")).expect_err("zero").to_string(),
            "c.json:1: `hidden_size` must be greater than zero"
        );
        let gqa = r#"{"model_type":"qwen3","hidden_size":8,"num_hidden_layers":1,"num_attention_heads":4,"num_key_value_heads":3,"intermediate_size":1,"vocab_size":1}"#;
        assert_eq!(
            ModelShape::from_hf_json(gqa, Path::new("c.json")).expect_err("gqa").to_string(),
            "c.json:1: `num_key_value_heads` must be a divisor of num_attention_heads"
        );
        // Sizes past what the estimate handles name the largest, on its line (not a saturated count).
        let huge = "{\n \"model_type\": \"llama\",\n \"hidden_size\": 1000000000,\n \"num_hidden_layers\": 2,\n \"num_attention_heads\": 8,\n \"intermediate_size\": 64,\n \"vocab_size\": 1000000000000000000\n}";
        assert_eq!(
            ModelShape::from_hf_json(huge, Path::new("c.json")).expect_err("huge").to_string(),
            "c.json:7: `vocab_size` = 1000000000000000000 makes a model of more than 1e15 parameters, the most the estimate handles"
        );
    }

    /// A config dpo-train cannot build is refused before its shape is read: a t5 has none of the
    /// Llama keys, a mixtral has 8 experts the Llama count would miss.
    #[test]
    fn unsupported_model_types_are_refused() {
        let t5 = r#"{"model_type":"t5","d_model":512,"num_layers":6}"#;
        assert_eq!(
            ModelShape::from_hf_json(t5, Path::new("t5/config.json")).expect_err("t5").to_string(),
            "t5/config.json:1: unsupported `model_type` `t5`: dpo-train trains llama, mistral, qwen2, qwen3"
        );
        let moe = "{\n  \"hidden_size\": 4096,\n  \"model_type\": \"mixtral\",\n  \"num_local_experts\": 8\n}";
        let err = ModelShape::from_hf_json(moe, Path::new("c.json")).expect_err("mixtral").to_string();
        assert!(err.starts_with("c.json:3: unsupported `model_type` `mixtral`"), "{err}");
        let none = r#"{"hidden_size":8}"#;
        assert_eq!(
            ModelShape::from_hf_json(none, Path::new("c.json")).expect_err("missing").to_string(),
            "c.json:1: unsupported `model_type` (missing): dpo-train trains llama, mistral, qwen2, qwen3"
        );
    }

    #[test]
    fn param_counts() {
        assert_eq!(parse_param_count("1.5B").expect("ok"), 1_500_000_000);
        assert_eq!(parse_param_count("500m").expect("ok"), 500_000_000);
        assert_eq!(parse_param_count("7e9").expect("ok"), 7_000_000_000);
        assert_eq!(parse_param_count("1500000000").expect("ok"), 1_500_000_000);
        assert_eq!(parse_param_count("70B").expect("ok"), 70_000_000_000);
        assert!(parse_param_count("lots").is_err());
        assert!(parse_param_count("-1B").is_err());
        assert_eq!(
            parse_param_count("x").expect_err("bad").to_string(),
            "invalid parameter count `x`: expected a number with an optional K, M, B or T suffix, e.g. `1.5B`"
        );
    }

    #[test]
    fn nearest_preset() {
        let s = ModelShape::from_param_count(1_500_000_000);
        assert_eq!(s.params, 1_500_000_000);
        assert_eq!(s.hidden_size, 1536);
        assert_eq!(s.source, "shaped like Qwen2.5-1.5B");
        assert_eq!(ModelShape::from_param_count(8_000_000_000).hidden_size, 4096);
        assert_eq!(ModelShape::from_param_count(70_000_000_000).num_layers, 80);
        // Llama-3.1-405B: one layer's MLP (3*16384*53248) alone outweighs the embedding.
        let big = ModelShape::from_param_count(405_000_000_000);
        assert!(big.layer_params() > 16384 * 128256);
        assert_eq!(big.gathered_piece_params(), big.layer_params());
    }
}
