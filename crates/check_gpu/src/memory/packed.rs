//! dpo-train's own activations and LM head, the terms that differ from transformers' under TRL
//! ([`super`]'s table holds the shared ones): what its libtorch graph saves for the backward,
//! counted from its layers (`crates/model/src/llama.rs`, `linear.rs`, `src/dpo/logps.rs`) and held
//! against peaks measured on an H100 (`results/gpu/memory-*.json`, `tests/measured.rs`).
//!
//! dpo-train packs each pair into one row without padding, the prompt once (`T = b*(p + 2c)`
//! tokens for prompts of `p` and completions of `c` tokens; on CUDA `T` and `N` are rounded up to
//! one of few lengths, `dpo_vocab::shapes`), and runs the LM head only where a completion token
//! is scored (`N = 2b*c` positions), `n` rows at a time (`n = 2^24/V`, on CUDA
//! at least 512). Nothing vocabulary-wide lives from its forward to its hand-written backward,
//! which recomputes each block's softmax: `G` rows of logit gradients at a time (`c*G*V` bytes),
//! with one block's logits and log-softmax in flight (`8*min(N, n)*V`, two fp32 tensors). A
//! frozen head (LoRA) takes a block at a time (`G = min(N, n)`); a trained one
//! groups up to `8h/c` rows, in even groups (`dpo_vocab::head`), and past one group a group's
//! fp32 weight gradient exists beside the sum (`4*V*h`).
//!
//! A decoder layer keeps per token, with `c` bytes of the compute dtype:
//! - each RMSNorm its input (`c*h`, in the compute dtype: the norm is one graph node,
//!   `crates/model/src/norm.rs`), `1/rms` (4), and, when its weight trains, the normalised values
//!   (`c*h`), plus its output where a trained projection reads it (`c*h`);
//! - attention: q and k after RoPE, v and the kernel's output (`c*d*(2a + 2kv)`; in fp32 the
//!   memory-efficient kernel takes k and v repeated to `a` heads) and its log-sum-exp (`4a`);
//! - the MLP: gate and up (`silu(gate)*up` is one graph node that recomputes the SiLU,
//!   `crates/model/src/swiglu.rs`), and, when `down` trains, their product: `3c*i` (LoRA on
//!   q,k,v,o: `2c*i`).
//!
//! Full fine-tuning: `A = 2*(3c*h + 4) + c*d*(2a+2kv) + 4a + 3c*i`; LoRA on q,k,v,o:
//! `A = (2c*h + 4) + (c*h + 4) + c*d*(2a+2kv) + 4a + 2c*i`. The final norm keeps `(4+c)*h` a token.
//! With checkpointing (zero3 always) each layer keeps its input (`c*h` a token) and the backward
//! recomputes one layer at a time, after the head's buffers are freed: the larger of the two counts.
//!
//! The peak is where the backward starts: the activations and the head's buffers are alive, and of the
//! gradients only the LM head's (`4*V*h`, the first computed; 0 under LoRA). The full gradients
//! exist only once the activations are freed, so the gradient term is the larger of the head's and
//! what the full gradients exceed the activations by.

use serde::{Deserialize, Serialize};

use dpo_vocab::{head, shapes};

use super::{FineTune, MemoryRequest, Sharding, mul};
use crate::model::ModelShape;

/// The version of what dpo-train's layers keep for the backward, as [`layer_bytes`] counts it. A
/// measured row records the version it ran with (`layout` in `results/*/memory-*.json`); a row of
/// an older one measured layers that kept more. 1: RMSNorm and SiLU composed of burn's
/// operations (the norm's input kept in f32; the gate, its sigmoid and its SiLU kept); 2: each
/// one graph node (the input in the compute dtype; the gate and `up`); 3: the LM head's
/// backward recomputes its softmax (kept for all `N` scored positions in fp32 before).
pub const LAYOUT: u64 = 3;

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

    /// A micro-batch of `b` such pairs.
    pub fn batch(self, b: u64) -> BatchTokens {
        let packed = mul(&[b, self.prompt.saturating_add(mul(&[2, self.completion]))]);
        BatchTokens { packed, scored: mul(&[2, b, self.completion]), from_data: false }
    }
}

/// One micro-batch's tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchTokens {
    /// Tokens of the packed row, `T`.
    pub packed: u64,
    /// Positions the LM head scores (the completions' tokens), `N`.
    pub scored: u64,
    /// Counted from the data's longest pairs (`check-gpu --data`), not bounded by `--seq-len`.
    pub from_data: bool,
}

/// Standard deviations above the mean a planned micro-batch's tokens sit (see
/// [`DataLengths::batch`]).
pub const BATCH_SIGMAS: f64 = 4.0;

/// The data's pairs as `dpo-train data lengths` counts them.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct DataLengths {
    pub pairs: u64,
    /// Each of the longest pairs' packed tokens, longest first.
    pub packed_longest: Vec<u64>,
    /// Each of the pairs' scored tokens, most first.
    pub scored_longest: Vec<u64>,
    /// Mean and standard deviation of a pair's packed tokens (absent: the longest pairs alone).
    #[serde(default)]
    pub packed_mean_std: Option<(f64, f64)>,
    /// The same of its scored tokens.
    #[serde(default)]
    pub scored_mean_std: Option<(f64, f64)>,
}

impl DataLengths {
    /// The tokens of the largest micro-batch of `b` shuffled pairs a run meets: the mean plus
    /// [`BATCH_SIGMAS`] standard deviations of a sum of `b` pairs (a batch past it about once in
    /// 30,000), at most the `b` longest pairs together (each count over its own longest pairs;
    /// past those listed, each further pair counts as the last), and at most every pair.
    pub fn batch(&self, b: u64) -> BatchTokens {
        // A micro-batch larger than the data takes all of it (each step takes the whole data).
        let b = b.min(self.pairs.max(1));
        let sum = |list: &[u64], spread: Option<(f64, f64)>| {
            let n = usize::try_from(b).unwrap_or(usize::MAX).min(list.len());
            let rest = mul(&[b.saturating_sub(n as u64), list.last().copied().unwrap_or(0)]);
            let longest = list[..n].iter().fold(0u64, |a, &x| a.saturating_add(x)).saturating_add(rest);
            let likely = spread.map(|(mean, std)| (mean * b as f64 + BATCH_SIGMAS * std * (b as f64).sqrt()).ceil());
            likely.map_or(longest, |l| longest.min(l as u64))
        };
        let packed = sum(&self.packed_longest, self.packed_mean_std);
        BatchTokens { packed, scored: sum(&self.scored_longest, self.scored_mean_std), from_data: true }
    }
}

/// Bytes a decoder layer keeps per token (`A` of the module doc).
pub fn layer_bytes(m: &ModelShape, c: u64, finetune: FineTune) -> u64 {
    let (h, a, d, i) = (m.hidden_size, m.num_heads, m.head_dim, m.intermediate_size);
    let kv = if c == 4 { a } else { m.num_kv_heads };
    let attention = mul(&[c, d, 2 * a + 2 * kv]).saturating_add(4 * a);
    let norm = |kept: u64| mul(&[1 + kept, c, h]).saturating_add(4);
    let (norms, mlp) = match finetune {
        FineTune::Full => (mul(&[2, norm(2)]), mul(&[3, c, i])),
        FineTune::Lora { .. } => (norm(1).saturating_add(norm(0)), mul(&[2, c, i])),
    };
    norms.saturating_add(attention).saturating_add(mlp)
}

/// dpo-train's `(activations, logits, first gradient)` for `req` over a micro-batch of `tokens`.
pub fn dynamic(req: &MemoryRequest<'_>, tokens: BatchTokens) -> (u64, u64, u64) {
    let (m, c) = (req.model, req.dtype.bytes());
    let (t, n) = (tokens.packed, tokens.scored);
    // CUDA pads a micro-batch to one of few lengths (`dpo_vocab::shapes`).
    let (t, n) = match req.cuda {
        true => (padded(t, shapes::padded_tokens), padded(n, shapes::padded_scored)),
        false => (t, n),
    };
    let logits = head_bytes(m, c, n, req.finetune, req.cuda);
    let layer = mul(&[t, layer_bytes(m, c, req.finetune)]);
    let activations = if req.gradient_checkpointing || req.sharding == Sharding::Zero3 {
        mul(&[m.num_layers, t, m.hidden_size, c]).saturating_add(layer.saturating_sub(logits))
    } else {
        mul(&[m.num_layers, layer]).saturating_add(mul(&[4 + c, m.hidden_size, t]))
    };
    let first_gradient = match req.finetune {
        FineTune::Full => mul(&[4, m.vocab_size, m.hidden_size]),
        FineTune::Lora { .. } => 0,
    };
    (activations, logits, first_gradient)
}

/// `x` as `pad` rounds it (`u64` through `usize`).
fn padded(x: u64, pad: fn(usize) -> usize) -> u64 {
    usize::try_from(x).map_or(x, |x| pad(x) as u64)
}

/// The LM head's buffers at the start of its backward over `n` scored positions (the module
/// doc's logits term): a group's logit gradients (`dpo_vocab::head`, the rule dpo-train runs),
/// one block's logits and log-softmax in flight, and, past one group, a group's weight gradient
/// beside the sum.
pub fn head_bytes(m: &ModelShape, c: u64, n: u64, finetune: FineTune, cuda: bool) -> u64 {
    let (v, h) = (m.vocab_size, m.hidden_size);
    let size = |x: u64| usize::try_from(x).unwrap_or(usize::MAX);
    let trains = finetune == FineTune::Full;
    let rows = head::block_rows(size(v), cuda);
    let group = n.min(mul(&[rows as u64, head::group_blocks(size(n), rows, size(h), size(c), trains) as u64]));
    let in_flight = mul(&[8, n.min(rows as u64), v]);
    let summed = if trains && n > group { mul(&[4, v, h]) } else { 0 };
    mul(&[c, group, v]).saturating_add(in_flight).saturating_add(summed)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The 0.5B shape's head (V 151,936, h 896, blocks of 110 rows on the CPU) over 5300 scored
    /// positions: bf16 full fine-tuning two groups of 25 and 24 blocks, the larger buffered, plus
    /// a group's fp32 weight gradient beside the sum; LoRA one block; fp32 full fine-tuning groups
    /// of 17 blocks; nothing scored, nothing held; on CUDA, blocks of 512 rows.
    #[test]
    fn the_head_holds_a_group_a_block_in_flight_and_a_second_weight_gradient() {
        let m = ModelShape::from_param_count(494_000_000);
        let (v, h) = (151_936u64, 896u64);
        assert_eq!((m.vocab_size, m.hidden_size), (v, h));
        let in_flight = 8 * 110 * v; // a block's logits and log-softmax
        assert_eq!(head_bytes(&m, 2, 5300, FineTune::Full, false), 2 * 25 * 110 * v + in_flight + 4 * v * h);
        assert_eq!(head_bytes(&m, 2, 5300, FineTune::Lora { rank: 16 }, false), 2 * 110 * v + in_flight);
        assert_eq!(head_bytes(&m, 4, 5300, FineTune::Full, false), 4 * 17 * 110 * v + in_flight + 4 * v * h);
        // One group: no second weight gradient; under a block, the scored rows alone.
        assert_eq!(head_bytes(&m, 2, 3000, FineTune::Full, false), 2 * 3000 * v + in_flight);
        assert_eq!(head_bytes(&m, 2, 50, FineTune::Full, false), 2 * 50 * v + 8 * 50 * v);
        assert_eq!(head_bytes(&m, 2, 0, FineTune::Full, false), 0);
        // CUDA's blocks of 512 rows: groups of 6 blocks, a block's logits in flight.
        let in_flight = 8 * 512 * v;
        assert_eq!(head_bytes(&m, 2, 5300, FineTune::Full, true), 2 * 6 * 512 * v + in_flight + 4 * v * h);
        assert_eq!(head_bytes(&m, 2, 5300, FineTune::Lora { rank: 16 }, true), 2 * 512 * v + in_flight);
    }

    /// Shuffled micro-batches of pairs whose packed tokens average 1134 (sd 310.5, the GPU
    /// check's 250-1000-token pairs): 16 of them plan 16*1134 + 4*310.5*4 = 23112 tokens, under
    /// the 16 longest together; one pair plans no more than the longest pair.
    #[test]
    fn a_batch_plans_the_mean_plus_four_deviations_at_most_the_longest() {
        let l = DataLengths {
            pairs: 256,
            packed_longest: vec![1900; 16],
            scored_longest: vec![1700, 1600],
            packed_mean_std: Some((1134.0, 310.5)),
            scored_mean_std: None,
        };
        let b = l.batch(16);
        assert_eq!((b.packed, b.from_data), (23_112, true));
        // No spread given: the longest listed, each further pair as long as the last listed.
        assert_eq!(b.scored, 1700 + 15 * 1600);
        assert_eq!(l.batch(1).packed, 1900);
    }
}
