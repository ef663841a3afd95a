//! dpo-train's own activations and LM head, the terms that differ from transformers' under TRL
//! ([`super`]'s table holds the shared ones): what its libtorch graph saves for the backward,
//! counted from its layers (`crates/model/src/llama.rs`, `linear.rs`, `src/dpo/logps.rs`) and held
//! against peaks measured on an H100 (`results/gpu/memory-*.json`, `tests/measured.rs`).
//!
//! dpo-train packs each pair into one row without padding, the prompt once (`T = b*(p + 2c)`
//! tokens for prompts of `p` and completions of `c` tokens), and runs the LM head only where a
//! completion token is scored (`N = 2b*c` positions), `2^24` logits at a time, keeping each
//! chunk's softmax in fp32 for its hand-written backward: `4*N*V` bytes, plus one chunk's logits
//! (compute dtype) and log-softmax (fp32) in flight.
//!
//! A decoder layer keeps per token, with `c` bytes of the compute dtype:
//! - each RMSNorm its fp32 input (`4h`), `1/rms` (4), and, when its weight trains, the
//!   normalised values (`c*h`), plus its output where a trained projection reads it (`c*h`);
//! - attention: q and k after RoPE, v and the kernel's output (`c*d*(2a + 2kv)`; in fp32 the
//!   memory-efficient kernel takes k and v repeated to `a` heads) and its log-sum-exp (`4a`);
//! - the MLP: gate, sigmoid(gate) and silu(gate) (SiLU is `x*sigmoid(x)` in burn), up, and, when
//!   `down` trains, their product: `5c*i` (LoRA on q,k,v,o: `4c*i`).
//!
//! Full fine-tuning: `A = 2*(4h + 4 + 2c*h) + c*d*(2a+2kv) + 4a + 5c*i`; LoRA on q,k,v,o:
//! `A = (4h + 4 + c*h) + (4h + 4) + c*d*(2a+2kv) + 4a + 4c*i`. The final norm keeps `8h` a token.
//! With checkpointing (zero3 always) each layer keeps its input (`c*h` a token) and the backward
//! recomputes one layer at a time, after the head's softmax is freed: the larger of the two counts.
//!
//! The peak is where the backward starts: the activations and the softmax are alive, and of the
//! gradients only the LM head's (`4*V*h`, the first computed; 0 under LoRA). The full gradients
//! exist only once the activations are freed, so the gradient term is the larger of the head's and
//! what the full gradients exceed the activations by.

use super::{FineTune, MemoryRequest, Sharding, mul};
use crate::model::ModelShape;

/// Elements of the `[chunk, V]` logits dpo-train scores at once (`HEAD_CHUNK_ELEMENTS`).
pub const HEAD_CHUNK_ELEMENTS: u64 = 1 << 24;

/// Scratch the kernels keep (cuBLAS workspaces, attention's), measured about constant.
pub const WORKSPACE_BYTES: u64 = 128 << 20;

/// The tokens of the longest pair a micro-batch holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PairTokens {
    /// Prompt tokens (counted once: the pair's completions share them).
    pub prompt: u64,
    /// Tokens of each completion (scored), its end-of-sequence token included.
    pub completion: u64,
}

impl PairTokens {
    /// Without the data's lengths: sequences of `seq_len` tokens each, none of them shared, all
    /// scored (a bound: real prompts make both counts smaller).
    pub fn bound(seq_len: u64) -> Self {
        Self { prompt: 0, completion: seq_len }
    }

    /// Packed tokens of a micro-batch of `b` such pairs, `T`.
    pub fn packed(self, b: u64) -> u64 {
        mul(&[b, self.prompt.saturating_add(mul(&[2, self.completion]))])
    }

    /// Scored positions of a micro-batch of `b` pairs, `N`.
    pub fn scored(self, b: u64) -> u64 {
        mul(&[2, b, self.completion])
    }
}

/// Bytes a decoder layer keeps per token (`A` of the module doc).
pub fn layer_bytes(m: &ModelShape, c: u64, finetune: FineTune) -> u64 {
    let (h, a, d, i) = (m.hidden_size, m.num_heads, m.head_dim, m.intermediate_size);
    let kv = if c == 4 { a } else { m.num_kv_heads };
    let attention = mul(&[c, d, 2 * a + 2 * kv]).saturating_add(4 * a);
    let norm = |kept: u64| mul(&[4, h]).saturating_add(4).saturating_add(mul(&[kept, c, h]));
    let (norms, mlp) = match finetune {
        FineTune::Full => (mul(&[2, norm(2)]), mul(&[5, c, i])),
        FineTune::Lora { .. } => (norm(1).saturating_add(norm(0)), mul(&[4, c, i])),
    };
    norms.saturating_add(attention).saturating_add(mlp)
}

/// dpo-train's `(activations, logits, first gradient)` for `req` at `tokens` per pair.
pub fn dynamic(req: &MemoryRequest<'_>, tokens: PairTokens) -> (u64, u64, u64) {
    let (m, c, b) = (req.model, req.dtype.bytes(), req.micro_batch);
    let (t, n) = (tokens.packed(b), tokens.scored(b));
    let logits = mul(&[4, n, m.vocab_size]).saturating_add(mul(&[HEAD_CHUNK_ELEMENTS, c + 4]));
    let layer = mul(&[t, layer_bytes(m, c, req.finetune)]);
    let activations = if req.gradient_checkpointing || req.sharding == Sharding::Zero3 {
        mul(&[m.num_layers, t, m.hidden_size, c]).saturating_add(layer.saturating_sub(logits))
    } else {
        mul(&[m.num_layers, layer]).saturating_add(mul(&[8, m.hidden_size, t]))
    };
    let first_gradient = match req.finetune {
        FineTune::Full => mul(&[4, m.vocab_size, m.hidden_size]),
        FineTune::Lora { .. } => 0,
    };
    (activations, logits, first_gradient)
}
