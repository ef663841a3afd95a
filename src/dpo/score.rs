//! Scoring whole datasets: every pair's policy scores against precomputed reference log-probs,
//! collected on the host, and the loss computed once over all of them, as TRL's
//! `DPOTrainer.evaluate` reports it with every pair in one batch (batches only bound memory).

use burn::tensor::Device;

use super::logps::{Collation, RefLogps, Stats, score};
use super::loss::dpo_loss;
use super::metrics::{MetricSums, Metrics, ScoredPairs};
use crate::config::LossConfig;
use crate::data::TokenizedPair;
use crate::model::Llama;

/// The loss and metrics of `policy` on `pairs` against precomputed reference log-probs. The
/// loss is computed once over every pair, so the batch size only bounds memory.
pub fn evaluate_pairs(
    policy: &Llama,
    pairs: &[TokenizedPair],
    ref_logps: &RefLogps,
    collation: &Collation,
    loss: &LossConfig,
    device: &Device,
) -> Metrics {
    let indices: Vec<usize> = (0..pairs.len()).collect();
    metrics_of(&score_pairs(policy, pairs, &indices, ref_logps, collation, device), loss, device)
}

/// Scores the pairs at `indices` (in that order) under `policy`.
pub fn score_pairs(
    policy: &Llama,
    pairs: &[TokenizedPair],
    indices: &[usize],
    ref_logps: &RefLogps,
    collation: &Collation,
    device: &Device,
) -> ScoredPairs {
    let mut scored = ScoredPairs::default();
    for chunk in indices.chunks(collation.batch_size.max(1)) {
        let chunk_pairs: Vec<TokenizedPair> = chunk.iter().map(|&i| pairs[i].clone()).collect();
        let batch = collation.batch(&chunk_pairs, device);
        let policy_scores = score(policy, &batch, Stats::ALL);
        scored.extend(ScoredPairs::from_batch(&batch, &policy_scores, &ref_logps.rows(chunk)));
    }
    scored
}

/// The loss over every scored pair at once, and the metrics.
pub fn metrics_of(scored: &ScoredPairs, loss: &LossConfig, device: &Device) -> Metrics {
    let value = dpo_loss(&scored.to_pair_scores(device), loss).into_scalar::<f32>() as f64;
    let mut sums = MetricSums::default();
    sums.add(scored, value, loss);
    sums.finish(loss)
}
