//! Scoring whole datasets: every pair's policy scores against precomputed reference log-probs,
//! collected on the host, the loss and each metric the mean of their values over TRL's evaluation
//! batches, as `DPOTrainer.evaluate` and `KTOTrainer.evaluate` report them.

use std::sync::atomic::{AtomicBool, Ordering};

use burn::tensor::Device;

use super::logps::{Collation, RefLogps, Stats, score};
use super::loss::dpo_loss;
use super::metrics::{MetricSums, Metrics, ScoredPairs};
use crate::config::LossConfig;
use crate::data::TokenizedPair;
use crate::model::Llama;

/// Scores the pairs at `indices` (in that order) under `policy`; `None` when `stop` is raised
/// between two batches (a Ctrl-C: a held-out set of thousands of pairs takes minutes).
pub fn score_pairs(
    policy: &Llama,
    pairs: &[TokenizedPair],
    indices: &[usize],
    ref_logps: &RefLogps,
    collation: &Collation,
    device: &Device,
    stop: Option<&AtomicBool>,
) -> Option<ScoredPairs> {
    let mut scored = ScoredPairs::default();
    for chunk in indices.chunks(collation.batch_size.max(1)) {
        if stop.is_some_and(|s| s.load(Ordering::SeqCst)) {
            return None;
        }
        let chunk_pairs: Vec<TokenizedPair> = chunk.iter().map(|&i| pairs[i].clone()).collect();
        let batch = collation.batch(&chunk_pairs, device);
        let policy_scores = score(policy, &batch, Stats::ALL);
        scored.extend(ScoredPairs::from_batch(&batch, &policy_scores, &ref_logps.rows(chunk)));
    }
    Some(scored)
}

/// The loss and each metric as the mean of their values over the batches of `per_batch` pairs
/// in order (TRL's evaluation batches: 17 pairs at 8 a batch are the mean of three batches'
/// values, the last of one pair, not a mean over the 17). The loss weighs each batch by its pairs,
/// as the Trainer's `eval_loss` averages each batch's loss repeated per row: the mean over every
/// pair for a per-pair loss, and for KTO each batch's loss under its own KL estimate.
pub fn metrics_of(scored: &ScoredPairs, loss: &LossConfig, per_batch: usize, device: &Device) -> Metrics {
    let batches = scored.chunks(per_batch.max(1));
    let mut weighted = 0.0;
    let parts: Vec<Metrics> = batches
        .iter()
        .map(|batch| {
            let value = dpo_loss(&batch.to_pair_scores(device), loss).into_scalar::<f32>() as f64;
            weighted += value * batch.len() as f64;
            let mut sums = MetricSums::default();
            sums.add(batch, value, loss);
            sums.finish(loss)
        })
        .collect();
    let mut metrics = Metrics::mean(&parts).unwrap_or_else(|| MetricSums::default().finish(loss));
    metrics.loss = weighted / scored.len().max(1) as f64;
    metrics
}
