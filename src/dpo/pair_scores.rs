//! The loss's inputs per pair, gathered from one scored batch (or from a whole evaluated set).

use burn::tensor::Tensor;

use super::logps::{DeviceBatch, SequenceScores};

/// The per-pair inputs of the loss, each `[B]`.
#[derive(Debug, Clone)]
pub struct PairScores {
    pub chosen_logps: Tensor<1>,
    pub rejected_logps: Tensor<1>,
    pub ref_chosen_logps: Tensor<1>,
    pub ref_rejected_logps: Tensor<1>,
    /// Completion tokens of each chosen / rejected row (IPO and sigmoid_norm normalise by them).
    pub chosen_lengths: Tensor<1>,
    pub rejected_lengths: Tensor<1>,
    /// Unweighted summed log-probs of the chosen rows, and their scored token counts (sft).
    pub chosen_token_logps: Tensor<1>,
    pub chosen_tokens: Tensor<1>,
    /// WPO weight exponents of each side (used with `use_weighting`).
    pub chosen_wpo: Tensor<1>,
    pub rejected_wpo: Tensor<1>,
    /// KTO's rows: 1 where desirable, 0 where not (the `rejected_*` fields are then its KL rows);
    /// empty for pairs.
    pub desirable: Vec<f32>,
}

impl PairScores {
    /// The loss inputs of one preference batch, keeping the policy's graph: `ref_logps` are the
    /// reference's `[2B]` log-probs on the device. WPO's exponents are the policy's statistics',
    /// zeros where it was scored without them (only `use_weighting` reads them, and it scores
    /// them: `Stats::Metrics { wpo: true }`).
    pub fn from_scores(batch: &DeviceBatch, policy: &SequenceScores, ref_logps: &Tensor<1>) -> Self {
        let b = batch.pairs;
        let half = |t: &Tensor<1>, start: usize| t.clone().narrow(0, start, b); // [B]
        // On the policy's side of autodiff (the reference's rows come from a plain model).
        let autodiff = policy.logps.is_autodiff();
        let side = |t: &Tensor<1>| if autodiff { Tensor::from_inner(t.clone().inner()) } else { t.clone().inner() };
        let (ref_logps, lengths, tokens) = (side(ref_logps), side(&batch.lengths), side(&batch.tokens));
        let wpo = match &policy.stats {
            Some(stats) => stats.wpo.clone(),
            None => Tensor::zeros([batch.sequences], &policy.logps.device()),
        };
        PairScores {
            chosen_logps: half(&policy.logps, 0),
            rejected_logps: half(&policy.logps, b),
            ref_chosen_logps: half(&ref_logps, 0),
            ref_rejected_logps: half(&ref_logps, b),
            chosen_lengths: half(&lengths, 0),
            rejected_lengths: half(&lengths, b),
            chosen_token_logps: half(&policy.token_logps, 0),
            chosen_tokens: half(&tokens, 0),
            chosen_wpo: half(&wpo, 0),
            rejected_wpo: half(&wpo, b),
            desirable: batch.desirable.clone(),
        }
    }
}
