//! Per-sequence completion log-probabilities from one forward pass over the concatenated
//! [chosen; rejected] batch (TRL `DPOTrainer._compute_loss` and its fused LM head).
//!
//! Position `t` predicts token `t + 1`, so the completion mask is shifted by one: the first
//! completion token is scored from the last prompt position. The LM head runs a few rows at a time
//! on torch's fused log-softmax, so at most one row block's vocabulary-wide tensors are alive.

use std::ops::Range;

use burn::tensor::activation::log_softmax;
use burn::tensor::{Device, FloatDType, Int, Tensor, TensorData};

use crate::data::{self, Batch, TokenizedPair};
use crate::model::{Llama, LmHead};

/// A collated batch on the device, with the per-token weights of the summed log-probs.
pub struct DeviceBatch {
    /// Pairs in the batch (a preference batch holds 2B rows, chosen rows first).
    pub pairs: usize,
    /// Rows held (2B, or B for a chosen-only supervised batch).
    pub rows: usize,
    /// `[2B, S]` token ids, right-padded.
    pub input_ids: Tensor<2, Int>,
    /// `[2B, S-1]` 1.0 where position `t` predicts a completion token.
    pub scored: Tensor<2>,
    /// `[2B, S-1]` weight of each scored token in the sequence log-prob: 1 on the tokens both
    /// completions of a pair share in length, `ld_alpha` on the longer one's tail (LD-DPO,
    /// Liu et al. 2024); equal to `scored` without `ld_alpha`.
    pub weights: Tensor<2>,
    /// Completion tokens per row before the shift (`completion_mask.sum(1)`), as IPO normalises.
    pub completion_lengths: Vec<f32>,
}

impl DeviceBatch {
    /// Uploads a host batch, deriving the shifted masks and LD-DPO weights on the host.
    pub fn new(batch: &Batch, ld_alpha: Option<f64>, device: &Device) -> Self {
        let (rows, s) = (batch.rows, batch.seq_len);
        let b = batch.batch_size;
        // Row r, position t (0..S-1) scores label t+1.
        let scored: Vec<f32> =
            (0..rows).flat_map(|r| (1..s).map(move |t| batch.completion_mask[r * s + t] as f32)).collect();
        let scored_counts: Vec<usize> =
            scored.chunks(s.saturating_sub(1).max(1)).map(|row| row.iter().filter(|&&m| m > 0.0).count()).collect();
        let weights = match ld_alpha {
            // LD-DPO pairs a row with its partner; a chosen-only batch has none.
            Some(alpha) if rows == 2 * b => {
                let mut w = scored.clone();
                for r in 0..rows {
                    // The pair's shared length: the shorter of its two (shifted, truncated) completions.
                    let pair = r % b;
                    let shared = scored_counts[pair].min(scored_counts[pair + b]);
                    let mut position = 0;
                    for t in 0..s - 1 {
                        let i = r * (s - 1) + t;
                        if scored[i] > 0.0 {
                            position += 1;
                            if position > shared {
                                w[i] = alpha as f32;
                            }
                        }
                    }
                }
                w
            }
            _ => scored.clone(),
        };
        let completion_lengths =
            batch.completion_mask.chunks(s).map(|row| row.iter().filter(|&&m| m != 0).count() as f32).collect();
        let shifted = [rows, s - 1];
        Self {
            pairs: b,
            rows,
            input_ids: Tensor::from_data(TensorData::new(batch.input_ids.clone(), [rows, s]), device),
            scored: Tensor::from_data(TensorData::new(scored, shifted), device),
            weights: Tensor::from_data(TensorData::new(weights, shifted), device),
            completion_lengths,
        }
    }
}

/// Per-row results of one forward pass, each `[2B]`.
#[derive(Debug, Clone)]
pub struct SequenceScores {
    /// `Σ_t w_t · log p(y_t)`: the sequence log-prob DPO compares (differentiable).
    pub logps: Tensor<1>,
    /// `Σ_t log p(y_t)` over scored tokens, unweighted (the `sft` term; differentiable).
    pub token_logps: Tensor<1>,
    /// Token statistics for the metrics; only computed for the policy.
    pub stats: Option<TokenStats>,
}

/// Per-row sums over scored tokens, detached from the graph, each `[2B]`.
#[derive(Debug, Clone)]
pub struct TokenStats {
    /// `Σ_t H(p_t)`, the predictive entropy at each scored position.
    pub entropy: Tensor<1>,
    /// `Σ_t mean_v z_{t,v}`: the mean logit over the whole vocabulary at each scored position.
    pub mean_logits: Tensor<1>,
    /// Number of scored tokens.
    pub tokens: Tensor<1>,
    /// WPO's per-row weight exponent (Zhou et al. 2024, eq. 2):
    /// `mean_t (log p(y_t) - log Σ_v p_v²)` over scored tokens.
    pub wpo: Tensor<1>,
}

/// Runs `model` over the batch and scores every completion token.
///
/// # Shapes
/// - batch.input_ids: `[2B, S]`; every output: `[2B]`
pub fn score(model: &Llama, batch: &DeviceBatch, with_stats: bool) -> SequenceScores {
    score_hidden(model, model.hidden_states(batch.input_ids.clone()), batch, with_stats)
}

/// [`score`] from the model's final hidden states (after the last norm).
///
/// # Shapes
/// - hidden: `[2B, S, hidden]`; every output: `[2B]`
pub fn score_hidden(model: &Llama, hidden: Tensor<3>, batch: &DeviceBatch, with_stats: bool) -> SequenceScores {
    let head = model.head(FloatDType::from(hidden.dtype()));
    let head = head_forward(hidden, &head, batch.input_ids.clone(), with_stats, false);
    assemble(head.token_logps, head.stats, batch)
}

/// The LM head's results at every position that predicts a token.
pub struct HeadForward {
    /// `[2B, S-1]` `log p(y_t)`, differentiable when the inputs are.
    pub token_logps: Tensor<2>,
    /// With `with_stats`, detached, each `[2B, S-1]`: the predictive entropy, `log Σ_v p_v²` and
    /// the mean logit.
    pub stats: Option<[Tensor<2>; 3]>,
    /// With `keep_probs`: each block of rows with its softmax `[c, S-1, V]`, for a hand-written
    /// backward.
    pub probs: Vec<(Range<usize>, Tensor<3>)>,
}

/// Runs the LM head over `hidden`, [`head_chunk_rows`] rows at a time, in f32 from the
/// projection on.
///
/// # Shapes
/// - hidden: `[2B, S, h]`, head weight: `[h, V]`, input_ids: `[2B, S]`
pub fn head_forward(
    hidden: Tensor<3>,
    head: &LmHead,
    input_ids: Tensor<2, Int>,
    with_stats: bool,
    keep_probs: bool,
) -> HeadForward {
    let [rows, s, h] = hidden.dims();
    let v = head.weight.dims()[1];
    let chunk = head_chunk_rows(s, v);
    let mut token_logps = Vec::new();
    let mut stats = Vec::new();
    let mut probs = Vec::new();
    for start in (0..rows).step_by(chunk) {
        let end = (start + chunk).min(rows);
        let x = hidden.clone().slice([start..end, 0..s - 1, 0..h]); // [c, S-1, h]
        let labels = input_ids.clone().slice([start..end, 1..s]).unsqueeze_dim::<3>(2); // [c, S-1, 1]
        let logits = head.project(x); // [c, S-1, V]
        let logp = log_softmax(logits.clone(), 2); // [c, S-1, V]
        token_logps.push(logp.clone().gather(2, labels).squeeze_dim::<2>(2)); // [c, S-1]
        let p = (with_stats || keep_probs).then(|| logp.clone().detach().exp()); // [c, S-1, V]
        if let (true, Some(p)) = (with_stats, &p) {
            stats.push([
                -(p.clone() * logp.detach()).sum_dim(2).squeeze_dim::<2>(2),
                p.clone().square().sum_dim(2).log().squeeze_dim::<2>(2),
                logits.detach().sum_dim(2).squeeze_dim::<2>(2) / v as f64,
            ]);
        }
        probs.extend(p.filter(|_| keep_probs).map(|p| (start..end, p)));
    }
    let stats = with_stats.then(|| {
        let column = |i: usize| Tensor::cat(stats.iter().map(|s: &[Tensor<2>; 3]| s[i].clone()).collect(), 0);
        [column(0), column(1), column(2)]
    });
    HeadForward { token_logps: Tensor::cat(token_logps, 0), stats, probs }
}

/// Sequence scores from per-position log-probs and, for the policy, the per-position entropy,
/// `log Σ_v p_v²` and mean logit (each `[2B, S-1]`).
pub fn assemble(token_logps: Tensor<2>, stats: Option<[Tensor<2>; 3]>, batch: &DeviceBatch) -> SequenceScores {
    let row_sum = |t: Tensor<2>| (t * batch.scored.clone()).sum_dim(1).squeeze_dim::<1>(1); // [2B]
    let stats = stats.map(|[entropy, log_sum_sq, mean_logits]| {
        let tokens = batch.scored.clone().sum_dim(1).squeeze_dim::<1>(1); // [2B]
        TokenStats {
            entropy: row_sum(entropy),
            mean_logits: row_sum(mean_logits),
            wpo: row_sum(token_logps.clone().detach() - log_sum_sq) / tokens.clone().clamp_min(1.0),
            tokens,
        }
    });
    SequenceScores {
        logps: (token_logps.clone() * batch.weights.clone()).sum_dim(1).squeeze_dim::<1>(1),
        token_logps: row_sum(token_logps),
        stats,
    }
}

/// Rows of a batch of `s` tokens whose logits are computed at once (see [`HEAD_CHUNK_ELEMENTS`]).
fn head_chunk_rows(s: usize, vocab: usize) -> usize {
    (HEAD_CHUNK_ELEMENTS / ((s - 1).max(1) * vocab)).max(1)
}

/// Elements of the `[rows, S-1, V]` logits scored at once (64 MiB of f32). The LM head's
/// vocabulary-wide intermediates are the largest tensors of a step; scoring a few rows at a time
/// keeps one of them alive per row (the softmax the backward needs), not several for the batch.
const HEAD_CHUNK_ELEMENTS: usize = 1 << 24;

/// The reference's sequence log-probs of every pair, in dataset order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RefLogps {
    pub chosen: Vec<f32>,
    pub rejected: Vec<f32>,
}

impl RefLogps {
    /// Zeros, for reference-free training.
    pub fn zeros(pairs: usize) -> Self {
        Self { chosen: vec![0.0; pairs], rejected: vec![0.0; pairs] }
    }

    /// The `[2B]` rows (chosen, then rejected) of the pairs at `indices`.
    pub fn rows(&self, indices: &[usize]) -> Vec<f32> {
        indices.iter().map(|&i| self.chosen[i]).chain(indices.iter().map(|&i| self.rejected[i])).collect()
    }
}

/// How sequences are collated and weighted, shared by every pass over a dataset.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Collation {
    pub batch_size: usize,
    pub pad_id: u32,
    pub max_length: Option<usize>,
    pub ld_alpha: Option<f64>,
}

/// Scores every pair under `model` (no gradients), `collation.batch_size` pairs per pass.
pub fn reference_logps(model: &Llama, pairs: &[TokenizedPair], collation: &Collation, device: &Device) -> RefLogps {
    let mut out = RefLogps::default();
    for chunk in pairs.chunks(collation.batch_size.max(1)) {
        let batch =
            DeviceBatch::new(&data::collate(chunk, collation.pad_id, collation.max_length), collation.ld_alpha, device);
        let logps = crate::model::host(&score(model, &batch, false).logps);
        let b = chunk.len();
        out.chosen.extend_from_slice(&logps[..b]);
        out.rejected.extend_from_slice(&logps[b..]);
    }
    out
}
