//! Per-sequence completion log-probabilities from one forward pass over the concatenated
//! [chosen; rejected] batch (TRL `DPOTrainer._compute_loss` and its fused LM head), in any of the
//! batch layouts of [`crate::data::batch`].
//!
//! Only the positions that predict a completion token go through the LM head: they are gathered
//! from the hidden states ([`DeviceBatch::at`]), projected a block at a time on torch's fused
//! log-softmax (so at most one block's vocabulary-wide tensors are alive), and summed per
//! sequence by index. Prompt and padding positions never reach the head.

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use burn::tensor::activation::log_softmax;
use burn::tensor::kind::Basic;
use burn::tensor::{Device, FloatDType, IndexingUpdateOp, Int, Tensor};
use dpo_torch::{bridge, transfers};

use super::shapes;
use crate::data::{self, Batch, Packing, TokenizedPair, Truncation};
use crate::model::{Llama, LmHead, Placement, fused::Spans};

/// A batch on the device, with the per-token weights of the summed log-probs.
#[derive(Debug, Clone)]
pub struct DeviceBatch {
    /// Pairs in the batch.
    pub pairs: usize,
    /// Sequences scored (2B for a preference batch, chosen ones first; B for a chosen-only one).
    pub sequences: usize,
    /// `[R, L]` token ids: padded rows, or one packed row.
    pub input_ids: Tensor<2, Int>,
    /// `[L]` each column's position.
    pub positions: Tensor<1, Int>,
    /// One past the largest position (the rotary tables' rows the batch needs).
    pub position_end: usize,
    /// The attention spans of a packed row (empty: rows).
    pub spans: Arc<Spans>,
    /// `[N']` flat index (`row * L + column`) of the hidden state that predicts each scored token,
    /// then (`N' > N` on CUDA, [`shapes`]) position 0 for the padding's predictions.
    pub at: Tensor<1, Int>,
    /// `[N']` the scored tokens, then token 0 for the padding's predictions.
    pub labels: Tensor<1, Int>,
    /// `[N]` the sequence of each scored token.
    pub seq: Tensor<1, Int>,
    /// `[N]` weight of each scored token in its sequence's log-prob: 1 on the tokens both
    /// completions of a pair share in length, `ld_alpha` on the longer one's tail (LD-DPO,
    /// Liu et al. 2024); 1 everywhere without `ld_alpha`.
    pub weights: Tensor<1>,
    /// `[2B]` scored tokens of each sequence (with ORPO's rows, a chosen prompt's too).
    pub tokens: Tensor<1>,
    /// `[2B]` [`DeviceBatch::completion_lengths`] on the device.
    pub lengths: Tensor<1>,
    /// Completion tokens per sequence before the shift (`completion_mask.sum(1)`), as IPO
    /// normalises.
    pub completion_lengths: Vec<f32>,
    /// KTO's rows: 1 for a desirable row, 0 for an undesirable one; empty for pairs.
    pub desirable: Vec<f32>,
}

impl DeviceBatch {
    /// Uploads a host batch, deriving the LD-DPO weights on the host; on CUDA padded to few
    /// shapes ([`shapes`]).
    pub fn new(batch: &Batch, ld_alpha: Option<f64>, device: &Device) -> Self {
        Self::upload(batch, ld_alpha, device, shapes::pads(device))
    }

    /// [`DeviceBatch::new`], padded to few shapes where `few_shapes`. Two uploads, the integers
    /// and the floats, each field a view of its part: a GPU copies them without waiting for the
    /// queued kernels ([`dpo_torch::transfers`]), where a copy a field waited on them each.
    fn upload(batch: &Batch, ld_alpha: Option<f64>, device: &Device, few_shapes: bool) -> Self {
        let mut counts = vec![0usize; batch.sequences];
        for &s in &batch.seq {
            counts[s as usize] += 1;
        }
        let weights = token_weights(batch, ld_alpha, &counts);
        let row = few_shapes.then(|| shapes::padded_row(batch)).flatten();
        let row = row.unwrap_or_else(|| shapes::Row {
            input_ids: batch.input_ids.clone(),
            positions: batch.positions.clone(),
            spans: batch.spans.clone(),
        });
        let len = row.positions.len();
        let (at, labels) = match few_shapes {
            true => shapes::padded_scored(&batch.at, &batch.labels),
            false => (batch.at.clone(), batch.labels.clone()),
        };
        let completion_lengths: Vec<f32> = batch.completion_lengths.iter().map(|&c| c as f32).collect();
        let tokens: Vec<f32> = counts.iter().map(|&c| c as f32).collect();
        let [input_ids, positions, at, labels, seq] =
            packed([&row.input_ids, &row.positions, &at, &labels, &batch.seq], |v| transfers::upload_ints(v, device));
        let [weights, tokens, lengths] =
            packed([&weights, &tokens, &completion_lengths], |v| transfers::upload_floats(v, device));
        Self {
            pairs: batch.pairs,
            sequences: batch.sequences,
            input_ids: input_ids.reshape([batch.rows, len]),
            positions,
            position_end: row.positions.iter().max().map_or(0, |&p| p as usize + 1),
            spans: Arc::new(Spans::new(row.spans)),
            at,
            labels,
            seq,
            weights,
            tokens,
            lengths,
            completion_lengths,
            desirable: batch.desirable.iter().map(|&d| f32::from(u8::from(d))).collect(),
        }
    }

    /// The same batch outside autodiff (views of the same uploads), for a model without a graph.
    pub fn plain(&self) -> Self {
        Self {
            input_ids: self.input_ids.clone().inner(),
            positions: self.positions.clone().inner(),
            at: self.at.clone().inner(),
            labels: self.labels.clone().inner(),
            seq: self.seq.clone().inner(),
            weights: self.weights.clone().inner(),
            tokens: self.tokens.clone().inner(),
            lengths: self.lengths.clone().inner(),
            ..self.clone()
        }
    }

    /// Scored predictions, `N` (without the padding's).
    pub fn scored(&self) -> usize {
        self.seq.dims()[0]
    }

    /// Token positions the forward computes (rows × columns, any padding included).
    pub fn computed_tokens(&self) -> usize {
        self.input_ids.dims().iter().product()
    }

    /// Where the batch's tokens sit, for `model`'s forward pass.
    pub fn placement(&self, model: &Llama) -> Placement {
        model.place(self.positions.clone(), self.position_end, self.spans.clone())
    }

    /// `[sequences]` sums of the per-token values `t` (`[N]`) by sequence.
    fn per_sequence(&self, t: Tensor<1>) -> Tensor<1> {
        let zeros = Tensor::zeros([self.sequences], &t.device());
        zeros.select_assign(0, self.seq.clone(), t, IndexingUpdateOp::Add)
    }
}

/// Each scored token's weight in its sequence's log-prob: 1, LD-DPO's `ld_alpha` past the
/// shorter completion of its pair, 0 on ORPO's prompt tokens (they count in its NLL, the
/// unweighted sum, only). `counts`: scored tokens per sequence.
fn token_weights(batch: &Batch, ld_alpha: Option<f64>, counts: &[usize]) -> Vec<f32> {
    let b = batch.pairs;
    let weights: Vec<f32> = match ld_alpha {
        // LD-DPO pairs a sequence with its partner; a chosen-only batch has none.
        Some(alpha) if batch.sequences == 2 * b => {
            // A token past the pair's shared length (the shorter completion's) weighs `alpha`.
            let mut seen = vec![0usize; batch.sequences];
            batch
                .seq
                .iter()
                .map(|&s| {
                    let s = s as usize;
                    seen[s] += 1;
                    let shared = counts[s % b].min(counts[s % b + b]);
                    if seen[s] > shared { alpha as f32 } else { 1.0 }
                })
                .collect()
        }
        _ => vec![1.0; batch.labels.len()],
    };
    match batch.prompt_token.is_empty() {
        true => weights,
        false => weights.iter().zip(&batch.prompt_token).map(|(&w, &p)| if p { 0.0 } else { w }).collect(),
    }
}

/// `parts` laid end to end and uploaded once, each part then a `[len]` view of the upload.
fn packed<const P: usize, T: Copy, K: Basic>(
    parts: [&[T]; P],
    upload: impl FnOnce(&[T]) -> Tensor<1, K>,
) -> [Tensor<1, K>; P] {
    let all: Vec<T> = parts.iter().flat_map(|p| p.iter().copied()).collect();
    let whole = upload(&all);
    let mut start = 0;
    parts.map(|p| {
        let view = whole.clone().narrow(0, start, p.len());
        start += p.len();
        view
    })
}

/// Per-sequence results of one forward pass, each `[2B]`.
#[derive(Debug, Clone)]
pub struct SequenceScores {
    /// `Σ_t w_t · log p(y_t)`: the sequence log-prob DPO compares (differentiable).
    pub logps: Tensor<1>,
    /// `Σ_t log p(y_t)` over scored tokens, unweighted (the `sft` term; differentiable).
    pub token_logps: Tensor<1>,
    /// Token statistics for the metrics; only computed for the policy.
    pub stats: Option<TokenStats>,
}

/// Per-sequence sums over scored tokens, detached from the graph, each `[2B]`.
#[derive(Debug, Clone)]
pub struct TokenStats {
    /// `Σ_t H(p_t)`, the predictive entropy at each scored position.
    pub entropy: Tensor<1>,
    /// `Σ_t mean_v z_{t,v}`: the mean logit over the whole vocabulary at each scored position.
    pub mean_logits: Tensor<1>,
    /// Number of scored tokens.
    pub tokens: Tensor<1>,
    /// WPO's per-sequence weight exponent (Zhou et al. 2024, eq. 2):
    /// `mean_t (log p(y_t) - log Σ_v p_v²)` over scored tokens; zeros unless [`Stats::Metrics`]
    /// asked for it (only `use_weighting` reads it).
    pub wpo: Tensor<1>,
    /// Scored tokens that are the logits' argmax ([`HeadStats::top1`]).
    pub top1: Tensor<1>,
}

/// The per-token statistics a pass computes beside the log-probs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stats {
    /// None: the reference's and SFT's passes.
    Off,
    /// The policy's, for the metrics: the entropy and the mean logit, and where `wpo`
    /// (`use_weighting`) WPO's `log Σ_v p_v²`, one more vocabulary-wide pass a head block.
    Metrics { wpo: bool },
}

impl Stats {
    /// Every statistic (evaluation, tests).
    pub const ALL: Stats = Stats::Metrics { wpo: true };
}

/// Runs `model` over the batch and scores every completion token.
///
/// # Shapes
/// - batch.input_ids: `[R, L]`; every output: `[2B]`
pub fn score(model: &Llama, batch: &DeviceBatch, stats: Stats) -> SequenceScores {
    let hidden = model.hidden_states(batch.input_ids.clone(), &batch.placement(model));
    score_hidden(model, hidden, batch, stats)
}

/// [`score`] from the model's final hidden states (after the last norm).
///
/// # Shapes
/// - hidden: `[R, L, hidden]`; every output: `[2B]`
pub fn score_hidden(model: &Llama, hidden: Tensor<3>, batch: &DeviceBatch, stats: Stats) -> SequenceScores {
    let head = model.head(FloatDType::from(hidden.dtype()));
    let head = head_forward(hidden, &head, batch, stats);
    assemble(head.token_logps, head.stats, batch)
}

/// The LM head's results at every scored prediction.
pub struct HeadForward {
    /// `[N', h]` the hidden states that predict the scored tokens, then the padding's.
    pub selected: Tensor<2>,
    /// `[N]` `log p(y_t)`, differentiable when the inputs are.
    pub token_logps: Tensor<1>,
    /// With [`Stats::Metrics`], detached.
    pub stats: Option<HeadStats>,
}

/// The head's statistics at every scored prediction, detached, each `[N]`.
#[derive(Debug, Clone)]
pub struct HeadStats {
    /// The predictive entropy `−Σ_v p_v·log p_v`.
    pub entropy: Tensor<1>,
    /// The mean logit over the vocabulary.
    pub mean_logit: Tensor<1>,
    /// `log Σ_v p_v²`, where [`Stats::Metrics`] asked for WPO's.
    pub log_sum_sq: Option<Tensor<1>>,
    /// 1 where the scored token is the logits' argmax (the first largest), else 0: TRL's
    /// `is_top1`, behind `mean_token_accuracy`.
    pub top1: Tensor<1>,
}

impl HeadStats {
    /// Each tensor through `f` (onto or off autodiff).
    pub fn map(self, f: impl Fn(Tensor<1>) -> Tensor<1>) -> Self {
        Self {
            entropy: f(self.entropy),
            mean_logit: f(self.mean_logit),
            log_sum_sq: self.log_sum_sq.map(&f),
            top1: f(self.top1),
        }
    }
}

/// Runs the LM head over the positions that predict scored tokens, [`head_blocks`] of them at a
/// time, in f32 from the projection on. Nothing vocabulary-wide outlives its block: a
/// hand-written backward recomputes a block's softmax from `selected`, projected the same way.
///
/// # Shapes
/// - hidden: `[R, L, h]`, head weight: `[h, V]`
pub fn head_forward(hidden: Tensor<3>, head: &LmHead, batch: &DeviceBatch, stats_wanted: Stats) -> HeadForward {
    let [r, l, h] = hidden.dims();
    // Indices on the hidden states' side of autodiff (a hand-written backward passes plain ones).
    let plain = !hidden.device().is_autodiff();
    let ints = |t: &Tensor<1, Int>| if plain { t.clone().inner() } else { t.clone() };
    let selected = hidden.reshape([r * l, h]).select(0, ints(&batch.at)); // [N, h]
    let n = selected.dims()[0];
    let mut token_logps = Vec::new();
    let mut stats = Vec::new();
    for block in head_blocks(0..n, head_block_rows(&selected, head.weight.dims()[1])) {
        let labels = ints(&batch.labels).slice([block.clone()]).unsqueeze_dim::<2>(1); // [c, 1]
        let (logits, logp) = block_log_softmax(head, &selected, block); // [c, V] each
        token_logps.push(logp.clone().gather(1, labels.clone()).squeeze_dim::<1>(1)); // [c]
        if let Stats::Metrics { wpo } = stats_wanted {
            stats.push(block_stats(logits, logp, labels, wpo));
        }
    }
    let device = selected.device();
    let cat = |parts: Vec<Tensor<1>>| match parts.is_empty() {
        true => Tensor::zeros([0], &device),
        false => Tensor::cat(parts, 0),
    };
    // The padding's predictions ([`shapes`]) end here.
    let scored = |t: Tensor<1>| if n > batch.scored() { t.narrow(0, 0, batch.scored()) } else { t };
    let stats = (stats_wanted != Stats::Off).then(|| {
        let column =
            |i: usize| scored(cat(stats.iter().filter_map(|s: &[Option<Tensor<1>>; 4]| s[i].clone()).collect()));
        let wpo = matches!(stats_wanted, Stats::Metrics { wpo: true });
        HeadStats { entropy: column(0), mean_logit: column(2), log_sum_sq: wpo.then(|| column(1)), top1: column(3) }
    });
    HeadForward { selected, token_logps: scored(cat(token_logps)), stats }
}

/// The f32 logits and log-softmax of the predictions `block` of `selected` (`[N, h]`).
///
/// # Shapes
/// - selected: `[N, h]` → `[c, V]` each, `c = block.len()`
fn block_log_softmax(head: &LmHead, selected: &Tensor<2>, block: Range<usize>) -> (Tensor<2>, Tensor<2>) {
    let h = selected.dims()[1];
    let logits = head.block_logits(selected.clone().slice([block, 0..h])); // [c, V]
    let logp = log_softmax(logits.clone(), 1);
    (logits, logp)
}

/// A block's detached statistics, each `[c]`: the predictive entropy `−Σ_v p_v·log p_v`,
/// `log Σ_v p_v²` (where `wpo`), the mean logit and whether the label (`[c, 1]`) is the logits'
/// first argmax (`torch.argmax`'s, TRL's `is_top1`). Six passes over the `[c, V]` tensors in torch
/// (five without `wpo`), two of them writing one; before the argmax five, where burn's operations
/// made six, three writing: `Σ p²` is the square of one norm's reduction rather than a squared
/// copy summed, and the entropy's product is taken in place in the probabilities. Each
/// vocabulary-wide tensor is dropped as soon as it is used (two alive at once). Evaluation's, and
/// a training step's under `use_weighting` (its loss reads WPO's); other training steps take them
/// from the head's backward (`train::backprop`).
///
/// # Shapes
/// - logits, logp: `[c, V]` f32
fn block_stats(logits: Tensor<2>, logp: Tensor<2>, labels: Tensor<2, Int>, wpo: bool) -> [Option<Tensor<1>>; 4] {
    let what = "the LM head's statistics";
    let ((z, origin), (logp, _)) = (bridge::on_libtorch(logits, what), bridge::on_libtorch(logp, what));
    let labels = bridge::int_on_libtorch(labels, what);
    let f32 = tch::Kind::Float;
    let mean_logit = z.sum_dim_intlist([1i64].as_slice(), false, f32) / z.size()[1] as f64;
    let top1 = z.argmax(1, true).eq_tensor(&labels).to_kind(f32).squeeze_dim(1); // [c]
    drop(z);
    let mut p = logp.exp(); // [c, V]
    let log_sum_sq = wpo.then(|| p.linalg_norm(2.0, [1i64].as_slice(), false, f32).log() * 2.0);
    let entropy = -p.g_mul_(&logp).sum_dim_intlist([1i64].as_slice(), false, f32);
    [Some(entropy), log_sum_sq, Some(mean_logit), Some(top1)].map(|t| t.map(|t| bridge::from_tch(t, origin.detached())))
}

/// Sequence scores from per-prediction log-probs (`[N]`) and, for the policy, the head's
/// statistics.
pub fn assemble(token_logps: Tensor<1>, stats: Option<HeadStats>, batch: &DeviceBatch) -> SequenceScores {
    let stats = stats.map(|s| token_stats(&token_logps, s, batch));
    SequenceScores {
        logps: batch.per_sequence(token_logps.clone() * batch.weights.clone()),
        token_logps: batch.per_sequence(token_logps),
        stats,
    }
}

/// Per-sequence statistics from the head's per-prediction ones and the log-probs (`[N]`).
pub fn token_stats(token_logps: &Tensor<1>, s: HeadStats, batch: &DeviceBatch) -> TokenStats {
    let tokens = batch.tokens.clone(); // [2B]
    let wpo = match s.log_sum_sq {
        Some(log_sum_sq) => {
            batch.per_sequence(token_logps.clone().detach() - log_sum_sq) / tokens.clone().clamp_min(1.0)
        }
        None => Tensor::zeros([batch.sequences], &tokens.device()),
    };
    TokenStats {
        entropy: batch.per_sequence(s.entropy),
        mean_logits: batch.per_sequence(s.mean_logit),
        top1: batch.per_sequence(s.top1),
        wpo,
        tokens,
    }
}

/// The blocks of `rows` the head scores at once, `block` rows each ([`head_block_rows`]: the LM
/// head's vocabulary-wide intermediates are the largest tensors of a step; scoring a block at a
/// time keeps them alive for one block, not for the batch).
pub fn head_blocks(rows: Range<usize>, block: usize) -> impl Iterator<Item = Range<usize>> {
    let block = block.max(1);
    let end = rows.end;
    (rows.start..end).step_by(block).map(move |start| start..(start + block).min(end))
}

/// Rows of a head block over a `vocab`-wide head for tensors on `like`'s device
/// ([`dpo_vocab::head::block_rows`]: more on CUDA).
pub fn head_block_rows(like: &Tensor<2>, vocab: usize) -> usize {
    let cuda = dpo_torch::allocator::cuda_index(&like.device()).is_some();
    dpo_vocab::head::block_rows(vocab, cuda)
}

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
    pub truncation: Truncation,
    pub ld_alpha: Option<f64>,
    pub packing: Packing,
}

impl Collation {
    /// The `[chosen; rejected]` batch of `pairs` on `device`.
    pub fn batch(&self, pairs: &[TokenizedPair], device: &Device) -> DeviceBatch {
        let batch = data::collate(pairs, self.pad_id, self.truncation, self.packing);
        DeviceBatch::new(&batch, self.ld_alpha, device)
    }
}

/// Scores every pair under `model` (no gradients), `collation.batch_size` pairs per pass; `None`
/// when `stop` is raised between two passes (a Ctrl-C, as [`super::score::score_pairs`]).
pub fn reference_logps(
    model: &Llama,
    pairs: &[TokenizedPair],
    collation: &Collation,
    device: &Device,
    stop: Option<&AtomicBool>,
) -> Option<RefLogps> {
    let mut out = RefLogps::default();
    for chunk in pairs.chunks(collation.batch_size.max(1)) {
        if stop.is_some_and(|s| s.load(Ordering::SeqCst)) {
            return None;
        }
        let logps = crate::model::host(&score(model, &collation.batch(chunk, device), Stats::Off).logps);
        let b = chunk.len();
        out.chosen.extend_from_slice(&logps[..b]);
        out.rejected.extend_from_slice(&logps[b..]);
    }
    Some(out)
}
