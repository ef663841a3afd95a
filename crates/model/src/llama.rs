//! Decoder-only transformers of the Llama family: Llama 2/3 (TinyLlama, SmolLM), Mistral, Qwen2 and
//! Qwen3, following `transformers/models/{llama,mistral,qwen2,qwen3}/modeling_*.py`.
//!
//! The four differ only in a few switches, so they share one module tree: q/k/v biases (qwen2,
//! llama's `attention_bias`), per-head q/k RMSNorm (qwen3), an explicit `head_dim` (qwen3, newer
//! llama/mistral configs), tied or untied `lm_head`. Field paths equal safetensors keys
//! (`model.layers.{i}.self_attn.q_proj.weight`); HF stores linear weights `[out, in]` and burn
//! multiplies by `[in, out]`: the one transposing rule is in [`super::hf`].

use std::path::Path;
use std::sync::Arc;

use burn::module::{Module, ModuleMapper, Param};
use burn::nn::Embedding;
use burn::tensor::{Device, FloatDType, Int, Tensor};
use dpo_torch::graph::split;
use hf_config::HfConfig;

use super::ModelError;
use super::fused::Spans;
use super::head::LmHead;
use super::hf::load_linear;
use super::kv_cache::{KvCache, LayerCache};
use super::linear::Linear;
use super::norm::RmsNorm;
use super::rope::{Angles, Rope, rotate, rotate_heads};
use super::rope_scaling::{self, RopeScaling};
use super::swiglu::swiglu;
use super::weights::TensorSource;

/// The `model_type` values this module implements.
pub const SUPPORTED_MODEL_TYPES: [&str; 4] = ["llama", "mistral", "qwen2", "qwen3"];

/// Which of the supported families a checkpoint belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    Llama,
    Mistral,
    Qwen2,
    Qwen3,
}

impl Family {
    /// The `model_type` of `config.json`.
    pub fn model_type(self) -> &'static str {
        match self {
            Self::Llama => "llama",
            Self::Mistral => "mistral",
            Self::Qwen2 => "qwen2",
            Self::Qwen3 => "qwen3",
        }
    }
}

/// A resolved configuration: no optional values left, every family switch explicit.
#[derive(Debug, Clone, PartialEq)]
pub struct LlamaConfig {
    pub family: Family,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub rope_scaling: RopeScaling,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    /// Bias on q/k/v projections (qwen2 always; llama/qwen3 with `attention_bias`).
    pub qkv_bias: bool,
    /// Bias on the output projection (llama/qwen3 with `attention_bias`; never qwen2).
    pub o_bias: bool,
    pub mlp_bias: bool,
    /// Per-head RMSNorm on queries and keys before RoPE (qwen3).
    pub qk_norm: bool,
    /// Tokens each query may look back; longer sequences are refused rather than silently wrong.
    pub sliding_window: Option<usize>,
}

impl LlamaConfig {
    /// Reads and resolves `dir/config.json`.
    pub fn read(dir: &Path) -> Result<Self, ModelError> {
        let path = dir.join("config.json");
        if !path.is_file() {
            return Err(ModelError::NoConfig { path, hint: dpo_base::hub::incomplete_download_hint(dir) });
        }
        let text = std::fs::read_to_string(&path).map_err(|source| ModelError::Io { path: path.clone(), source })?;
        Self::parse(&text, &path)
    }

    /// Parses and resolves `config.json` text; `path` names it in errors.
    pub fn parse(text: &str, path: &Path) -> Result<Self, ModelError> {
        let hf = HfConfig::parse(text)
            .map_err(|e| ModelError::BadConfig { path: path.to_owned(), message: e.to_string() })?;
        Self::from_hf(&hf, path)
    }

    /// Checks every value of `config.json` against what the model implements and fills in the
    /// defaults. `path` only names the file in errors.
    pub fn from_hf(hf: &HfConfig, path: &Path) -> Result<Self, ModelError> {
        let path = path.to_owned();
        let family = match hf.model_type.as_deref() {
            Some("llama") => Family::Llama,
            Some("mistral") => Family::Mistral,
            Some("qwen2") => Family::Qwen2,
            Some("qwen3") => Family::Qwen3,
            Some(other) => return Err(ModelError::UnsupportedModelType { path, found: other.to_owned() }),
            None => return Err(ModelError::BadConfig { path, message: "missing field `model_type`".to_owned() }),
        };
        let size = |v: u64| usize::try_from(v).unwrap_or(usize::MAX);
        if hf.hidden_act != "silu" {
            return Err(ModelError::Unsupported {
                path,
                key: "hidden_act",
                found: format!("`{}`", hf.hidden_act),
                supported: "`silu`",
            });
        }
        let (num_heads, num_kv_heads) = (size(hf.num_attention_heads), size(hf.kv_heads()));
        if num_heads == 0 || num_kv_heads == 0 || !num_heads.is_multiple_of(num_kv_heads) {
            return Err(ModelError::BadConfig {
                path,
                message: format!(
                    "`num_attention_heads` ({num_heads}) must be a positive multiple of `num_key_value_heads` ({num_kv_heads})"
                ),
            });
        }
        let head_dim = size(hf.head_dim());
        if head_dim == 0 || !head_dim.is_multiple_of(2) {
            return Err(ModelError::BadConfig {
                path,
                message: format!("`head_dim` must be even and positive, got {head_dim}"),
            });
        }
        let (rope_theta, rope_scaling) = rope_scaling::parse(hf, &path)?;
        // Qwen configs carry a `sliding_window` that is inert unless `use_sliding_window` and a
        // layer slides.
        let sliding_window = hf.attention_window().map(size);
        // A sequence needs a token to predict from and one to score: fewer positions is a broken file.
        let positions =
            [("max_position_embeddings", Some(size(hf.max_position_embeddings))), ("sliding_window", sliding_window)];
        if let Some((key, n)) = positions.into_iter().find_map(|(key, n)| n.filter(|&n| n < 2).map(|n| (key, n))) {
            return Err(ModelError::BadConfig { path, message: format!("`{key}` must be at least 2, got {n}") });
        }
        Ok(LlamaConfig {
            family,
            vocab_size: size(hf.vocab_size),
            hidden_size: size(hf.hidden_size),
            intermediate_size: size(hf.intermediate_size),
            num_layers: size(hf.num_hidden_layers),
            num_heads,
            num_kv_heads,
            head_dim,
            rms_norm_eps: hf.rms_norm_eps,
            rope_theta,
            rope_scaling,
            max_position_embeddings: size(hf.max_position_embeddings),
            tie_word_embeddings: hf.tie_word_embeddings,
            qkv_bias: hf.qkv_bias(),
            o_bias: hf.o_bias(),
            mlp_bias: hf.mlp_bias(),
            qk_norm: family == Family::Qwen3,
            sliding_window,
        })
    }
}

/// Where the tokens of a forward pass sit: the rotary angles of each column's position and the
/// attention spans of a packed row (empty: every row attends causally on its own). Built once per
/// batch ([`Llama::place`]) and shared by every layer.
#[derive(Debug, Clone)]
pub struct Placement {
    /// The rotary cos and sin, `[1, 1, L, D]` each, in the compute dtype.
    angles: Arc<Angles>,
    spans: Arc<Spans>,
}

/// Multi-head self-attention with grouped-query key/value heads.
#[derive(Module, Debug)]
pub struct Attention {
    pub q_proj: Linear,
    pub k_proj: Linear,
    pub v_proj: Linear,
    pub o_proj: Linear,
    pub q_norm: Option<RmsNorm>,
    pub k_norm: Option<RmsNorm>,
    #[module(skip)]
    num_heads: usize,
    #[module(skip)]
    num_kv_heads: usize,
    #[module(skip)]
    head_dim: usize,
}

impl Attention {
    fn load(w: &dyn TensorSource, prefix: &str, cfg: &LlamaConfig, device: &Device) -> Result<Self, ModelError> {
        let (h, d, q, kv) =
            (cfg.hidden_size, cfg.head_dim, cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim);
        let norm = |name: &str| RmsNorm::load(w, &format!("{prefix}.{name}"), d, cfg.rms_norm_eps, device);
        Ok(Self {
            q_proj: load_linear(w, &format!("{prefix}.q_proj"), h, q, cfg.qkv_bias, device)?,
            k_proj: load_linear(w, &format!("{prefix}.k_proj"), h, kv, cfg.qkv_bias, device)?,
            v_proj: load_linear(w, &format!("{prefix}.v_proj"), h, kv, cfg.qkv_bias, device)?,
            o_proj: load_linear(w, &format!("{prefix}.o_proj"), q, h, cfg.o_bias, device)?,
            q_norm: if cfg.qk_norm { Some(norm("q_norm")?) } else { None },
            k_norm: if cfg.qk_norm { Some(norm("k_norm")?) } else { None },
            num_heads: cfg.num_heads,
            num_kv_heads: cfg.num_kv_heads,
            head_dim: d,
        })
    }

    /// Causal self-attention over right-padded rows (a real token only ever sees earlier real
    /// tokens, so the padding needs no mask of its own), or over the spans of a packed row.
    ///
    /// With a `cache`, keys and values of earlier positions are reused and the new ones appended
    /// (`at` places the new tokens after them).
    ///
    /// # Shapes
    /// - x: `[B, S, hidden]` → `[B, S, hidden]`
    ///
    /// # Panics
    /// If a cache that already holds positions is given more than one new token.
    pub fn forward(&self, x: Tensor<3>, at: &Placement, cache: Option<&mut LayerCache>) -> Tensor<3> {
        let [b, s, _] = x.dims();
        let (h, d) = (self.num_heads, self.head_dim);
        let [q, k, v] = self.rotated_qkv(x, &at.angles).map(|t| t.swap_dims(1, 2)); // [B, heads, S, D]
        let offset = cache.as_ref().map_or(0, |c| c.len());
        let (k, v) = match cache {
            Some(cache) => cache.append(k, v), // [B, Hkv, T, D]
            None => (k, v),
        };
        assert!(offset == 0 || s == 1, "a filled KV cache takes one token at a time");
        // The S new queries are the last S of the T positions (one at a time with a filled cache).
        let y = super::fused::causal_attention(q, k, v, at.spans.clone()); // [B, H, S, D]
        let y = y.swap_dims(1, 2).reshape([b, s, h * d]); // [B, S, H*D]
        self.o_proj.forward(y)
    }

    /// Queries, keys and values, `[B, S, heads, D]` each, queries and keys rotated (normed
    /// first where the model norms them), in the layout the projections make them.
    ///
    /// Where the projections join and none has an adapter or a norm between it and the
    /// rotation, one rotation turns the queries' and keys' heads of the joined output and passes
    /// the values' through: one pass of the rotary kernels where two were made and v copied,
    /// and q, k and v are views of the one tensor attention saves.
    ///
    /// # Shapes
    /// - x: `[B, S, hidden]` → `[B, S, H, D]`, `[B, S, Hkv, D]`, `[B, S, Hkv, D]`
    fn rotated_qkv(&self, x: Tensor<3>, angles: &Arc<Angles>) -> [Tensor<4>; 3] {
        let [b, s, _] = x.dims();
        let (h, hkv, d) = (self.num_heads, self.num_kv_heads, self.head_dim);
        let group = [&self.q_proj, &self.k_proj, &self.v_proj];
        let normed = self.q_norm.is_some() || self.k_norm.is_some();
        if let Some(y) = (!normed).then(|| Linear::forward_joined(x.clone(), group)).flatten() {
            let y = rotate_heads(y.reshape([b, s, h + 2 * hkv, d]), angles, h + hkv); // [B, S, H+2Hkv, D]
            return split(y, 2, [h, hkv, hkv]);
        }
        let [q, k, v] = Linear::forward_group(x, group);
        let q = q.reshape([b, s, h, d]); // [B, S, H, D]
        let k = k.reshape([b, s, hkv, d]); // [B, S, Hkv, D]
        // Owned: attention keeps v for its backward, and a view would keep the joined projection.
        let v = dpo_torch::graph::owned(v.reshape([b, s, hkv, d])); // [B, S, Hkv, D]
        let (q, k) = match (&self.q_norm, &self.k_norm) {
            (Some(qn), Some(kn)) => (qn.forward(q), kn.forward(k)),
            _ => (q, k),
        };
        [rotate(q, angles), rotate(k, angles), v]
    }
}

/// The SiLU-gated feed-forward block: `down(silu(gate(x)) * up(x))`.
#[derive(Module, Debug)]
pub struct Mlp {
    pub gate_proj: Linear,
    pub up_proj: Linear,
    pub down_proj: Linear,
}

impl Mlp {
    fn load(w: &dyn TensorSource, prefix: &str, cfg: &LlamaConfig, device: &Device) -> Result<Self, ModelError> {
        let (h, i, bias) = (cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias);
        Ok(Self {
            gate_proj: load_linear(w, &format!("{prefix}.gate_proj"), h, i, bias, device)?,
            up_proj: load_linear(w, &format!("{prefix}.up_proj"), h, i, bias, device)?,
            down_proj: load_linear(w, &format!("{prefix}.down_proj"), i, h, bias, device)?,
        })
    }

    /// # Shapes
    /// - x: `[B, S, hidden]` → `[B, S, hidden]`
    pub fn forward(&self, x: Tensor<3>) -> Tensor<3> {
        // Laid out by columns: SwiGLU's elementwise kernels then read and write dense blocks.
        let [gate, up] = Linear::forward_group_by_columns(x, [&self.gate_proj, &self.up_proj]); // [B, S, I] each
        self.down_proj.forward(swiglu(gate, up))
    }
}

/// One pre-norm transformer block.
#[derive(Module, Debug)]
pub struct DecoderLayer {
    pub self_attn: Attention,
    pub mlp: Mlp,
    pub input_layernorm: RmsNorm,
    pub post_attention_layernorm: RmsNorm,
}

impl DecoderLayer {
    fn load(w: &dyn TensorSource, prefix: &str, cfg: &LlamaConfig, device: &Device) -> Result<Self, ModelError> {
        let norm =
            |name: &str| RmsNorm::load(w, &format!("{prefix}.{name}"), cfg.hidden_size, cfg.rms_norm_eps, device);
        Ok(Self {
            self_attn: Attention::load(w, &format!("{prefix}.self_attn"), cfg, device)?,
            mlp: Mlp::load(w, &format!("{prefix}.mlp"), cfg, device)?,
            input_layernorm: norm("input_layernorm")?,
            post_attention_layernorm: norm("post_attention_layernorm")?,
        })
    }

    /// # Shapes
    /// - x: `[B, S, hidden]` → `[B, S, hidden]`
    pub fn forward(&self, x: Tensor<3>, at: &Placement, cache: Option<&mut LayerCache>) -> Tensor<3> {
        let x = x.clone() + self.self_attn.forward(self.input_layernorm.forward(x), at, cache);
        x.clone() + self.mlp.forward(self.post_attention_layernorm.forward(x))
    }
}

/// The seven projections of each layer under their HF names, borrowed with `$($borrow)+` (`&` or
/// `&mut`): one list for [`Llama::linears`] and [`Llama::linears_mut`].
macro_rules! projections {
    ($layers:expr, $($borrow:tt)+) => {{
        let mut out = Vec::new();
        for (i, layer) in $layers.enumerate() {
            let (a, m) = ($($borrow)+ layer.self_attn, $($borrow)+ layer.mlp);
            for (name, linear) in [
                ("self_attn.q_proj", $($borrow)+ a.q_proj),
                ("self_attn.k_proj", $($borrow)+ a.k_proj),
                ("self_attn.v_proj", $($borrow)+ a.v_proj),
                ("self_attn.o_proj", $($borrow)+ a.o_proj),
                ("mlp.gate_proj", $($borrow)+ m.gate_proj),
                ("mlp.up_proj", $($borrow)+ m.up_proj),
                ("mlp.down_proj", $($borrow)+ m.down_proj),
            ] {
                out.push((format!("model.layers.{i}.{name}"), linear));
            }
        }
        out
    }};
}

/// The transformer body (HF's `model.` prefix).
#[derive(Module, Debug)]
pub struct Body {
    pub embed_tokens: Embedding,
    pub layers: Vec<DecoderLayer>,
    pub norm: RmsNorm,
}

/// A causal language model: body plus `lm_head` (absent when tied to the embeddings).
#[derive(Module, Debug)]
pub struct Llama {
    pub model: Body,
    pub lm_head: Option<Linear>,
    #[module(skip)]
    rope: Rope,
    #[module(skip)]
    sliding_window: Option<usize>,
    /// The dtype activations are computed in (f32, or bf16/f16 for mixed precision); logits
    /// leave the model as f32.
    #[module(skip)]
    compute_dtype: FloatDType,
}

impl Llama {
    /// Builds the model from a checkpoint's tensors.
    pub fn load(w: &dyn TensorSource, cfg: &LlamaConfig, device: &Device) -> Result<Self, ModelError> {
        let (v, h) = (cfg.vocab_size, cfg.hidden_size);
        let embed = w.tensor("model.embed_tokens.weight", [v, h], device)?;
        let layers = (0..cfg.num_layers)
            .map(|i| DecoderLayer::load(w, &format!("model.layers.{i}"), cfg, device))
            .collect::<Result<Vec<_>, _>>()?;
        // Some tied checkpoints still store `lm_head.weight`; the embedding is the one that counts.
        let lm_head =
            if cfg.tie_word_embeddings { None } else { Some(load_linear(w, "lm_head", h, v, false, device)?) };
        Ok(Self {
            model: Body {
                embed_tokens: Embedding { weight: Param::from_tensor(embed) },
                layers,
                norm: RmsNorm::load(w, "model.norm", h, cfg.rms_norm_eps, device)?,
            },
            lm_head,
            rope: Rope::new(cfg.head_dim, cfg.rope_theta, &cfg.rope_scaling, cfg.max_position_embeddings, device),
            sliding_window: cfg.sliding_window,
            compute_dtype: FloatDType::F32,
        })
    }

    /// Runs activations in `dtype` over whatever dtype the parameters are stored in (mixed
    /// precision when they are f32: each weight is cast as it is used, the f32 copy stays master).
    pub fn with_compute_dtype(mut self, dtype: FloatDType) -> Self {
        self.compute_dtype = dtype;
        self
    }

    /// The dtype activations are computed in.
    pub fn compute_dtype(&self) -> FloatDType {
        self.compute_dtype
    }

    /// Stores every parameter in `dtype` (a frozen model in half precision takes half the memory).
    pub fn cast_params(self, dtype: FloatDType) -> Self {
        self.map(&mut CastParams(dtype))
    }

    /// Each layer's frozen q/k/v weights, and its gate/up weights, moved into one buffer each
    /// ([`Linear::share_storage`]): a frozen reference or LoRA base then multiplies by them as
    /// they lie, where joining copied them every pass. Weights that train are left as they are.
    pub fn share_frozen_storage(mut self) -> Self {
        for layer in &mut self.model.layers {
            let a = &mut layer.self_attn;
            Linear::share_storage([&mut a.q_proj, &mut a.k_proj, &mut a.v_proj]);
            Linear::share_storage([&mut layer.mlp.gate_proj, &mut layer.mlp.up_proj]);
        }
        self
    }

    /// Every projection of the decoder layers under its HF module name
    /// (`model.layers.0.self_attn.q_proj`), in layer order.
    pub fn linears(&self) -> Vec<(String, &Linear)> {
        projections!(self.model.layers.iter(), &)
    }

    /// [`Llama::linears`], mutably.
    pub fn linears_mut(&mut self) -> Vec<(String, &mut Linear)> {
        projections!(self.model.layers.iter_mut(), &mut)
    }

    /// Tokens at `positions` (one per column, every row alike, each below `end`) attending by
    /// `spans` (empty: each row causally on its own).
    ///
    /// # Shapes
    /// - positions: `[L]`
    ///
    /// # Panics
    /// If `end` exceeds `max_position_embeddings`; callers check [`Llama::max_sequence_length`]
    /// first.
    pub fn place(&self, positions: Tensor<1, Int>, end: usize, spans: Arc<Spans>) -> Placement {
        Placement { angles: self.rope.at(positions, end, self.compute_dtype), spans }
    }

    /// Rows of `len` tokens from position `offset` on, each attending causally on its own.
    pub fn place_rows(&self, offset: usize, len: usize, device: &Device) -> Placement {
        let positions = Tensor::<1, Int>::arange(offset as i64..(offset + len) as i64, device);
        self.place(positions, offset + len, Spans::none())
    }

    /// Final hidden states, after the last norm.
    ///
    /// # Shapes
    /// - input_ids: `[B, S]` → `[B, S, hidden]`
    pub fn hidden_states(&self, input_ids: Tensor<2, Int>, at: &Placement) -> Tensor<3> {
        let mut x = self.embed(input_ids); // [B, S, hidden]
        for layer in &self.model.layers {
            x = layer.forward(x, at, None);
        }
        self.model.norm.forward(x)
    }

    /// Token embeddings in the compute dtype.
    ///
    /// # Shapes
    /// - input_ids: `[B, S]` → `[B, S, hidden]`
    pub fn embed(&self, input_ids: Tensor<2, Int>) -> Tensor<3> {
        self.model.embed_tokens.forward(input_ids).cast(self.compute_dtype)
    }

    /// Decoder layer `i` over the whole sequence (no cache).
    ///
    /// # Shapes
    /// - x: `[B, S, hidden]` → `[B, S, hidden]`
    pub fn layer(&self, i: usize, x: Tensor<3>, at: &Placement) -> Tensor<3> {
        self.model.layers[i].forward(x, at, None)
    }

    /// The final norm.
    ///
    /// # Shapes
    /// - x: `[B, S, hidden]` → `[B, S, hidden]`
    pub fn final_norm(&self, x: Tensor<3>) -> Tensor<3> {
        self.model.norm.forward(x)
    }

    /// Logits of the last position, reusing and extending `cache` (generation).
    ///
    /// # Shapes
    /// - input_ids: `[B, S]` (the prompt, then one token at a time) → `[B, V]`
    pub fn forward_cached(&self, input_ids: Tensor<2, Int>, cache: &mut KvCache) -> Tensor<2> {
        let at = self.place_rows(cache.len(), input_ids.dims()[1], &input_ids.device());
        let mut x = self.embed(input_ids); // [B, S, hidden]
        for (layer, layer_cache) in self.model.layers.iter().zip(cache.layers.iter_mut()) {
            x = layer.forward(x, &at, Some(layer_cache));
        }
        let [b, s, _] = x.dims();
        let last = self.model.norm.forward(x.narrow(1, s - 1, 1)); // [B, 1, hidden]
        self.head(FloatDType::from(last.dtype())).project(last).reshape([b, self.vocab_size()]) // [B, V]
    }

    /// Rows of the output projection.
    pub fn vocab_size(&self) -> usize {
        self.model.embed_tokens.weight.dims()[0]
    }

    /// Number of decoder layers.
    pub fn num_layers(&self) -> usize {
        self.model.layers.len()
    }

    /// The output projection in `dtype` (see [`LmHead`]).
    pub fn head(&self, dtype: FloatDType) -> LmHead {
        match &self.lm_head {
            Some(head) => LmHead::new(head.weight.val(), false, dtype),
            None => LmHead::new(self.model.embed_tokens.weight.val(), true, dtype),
        }
    }

    /// Next-token logits for every position.
    ///
    /// # Shapes
    /// - input_ids: `[B, S]` → `[B, S, V]`
    pub fn forward(&self, input_ids: Tensor<2, Int>) -> Tensor<3> {
        let at = self.place_rows(0, input_ids.dims()[1], &input_ids.device());
        let hidden = self.hidden_states(input_ids, &at); // [B, S, hidden]
        self.head(FloatDType::from(hidden.dtype())).project(hidden)
    }

    /// The longest sequence a forward pass accepts.
    pub fn max_sequence_length(&self) -> usize {
        let positions = self.rope.max_positions();
        self.sliding_window.map_or(positions, |w| w.min(positions))
    }
}

/// Casts every parameter to one dtype, keeping its id and whether it trains.
struct CastParams(FloatDType);

impl ModuleMapper for CastParams {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let (id, t, mapper) = param.consume();
        let tracked = t.is_require_grad();
        let t = t.cast(self.0).detach();
        Param::from_mapped_value(id, if tracked { t.require_grad() } else { t }, mapper)
    }
}
