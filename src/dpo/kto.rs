//! KTO (Ethayarajh et al. 2024) as TRL 1.16's `KTOTrainer._compute_loss` computes it
//! (`trl/trainer/kto_trainer.py` lines 1370-1563), on a batch of `[own; KL]` sequences (see
//! `data::kto`): the KL estimate `z = max(0, mean(log π(y'|x) - log π_ref(y'|x)))` over the
//! batch's mismatched rows, detached, then per row `1 - σ(β(r - z))` where desirable and
//! `1 - σ(β(z - r))` where not (`r` its log-ratio), weighted and averaged over the rows.
//!
//! `apo_zero_unpaired` (`KTOTrainer`'s other loss) is the same with `z = 0`: `1 - σ(βr)` and
//! `1 - σ(-βr) = σ(βr)`; its rows carry no KL sequence.
//!
//! TRL averages `z` over the ranks' batches of a step; here each micro-batch's own rows give it,
//! so N ranks compute what one device computes for the same micro-batches.

use burn::tensor::Tensor;
use burn::tensor::activation::sigmoid;

use super::pair_scores::PairScores;
use crate::config::LossConfig;

/// The scalar loss of one batch of KTO rows.
///
/// # Shapes
/// - every tensor field of `s`: `[B]` (the `rejected_*` ones are the KL rows); returns `[1]`
pub fn loss(s: &PairScores, cfg: &LossConfig) -> Tensor<1> {
    let device = s.chosen_logps.device();
    let b = s.desirable.len();
    // A copy that does not wait for a GPU's queued kernels (the loss runs mid-step).
    let desirable = dpo_torch::transfers::upload_floats(&s.desirable, &device); // [B]
    let kl = match cfg.kl_rows() {
        // TRL scores the KL rows under no_grad.
        true => (s.rejected_logps.clone().detach() - s.ref_rejected_logps.clone()).mean().clamp_min(0.0).detach(), // [1]
        // apo_zero_unpaired: no KL term, and then KTO's formula is APO-zero's unpaired one.
        false => Tensor::zeros([1], &device),
    };
    let kl = kl.expand([b]); // [B]
    let logratios = s.chosen_logps.clone() - s.ref_chosen_logps.clone(); // [B]
    let desirable_losses = sigmoid((logratios.clone() - kl.clone()) * cfg.beta).neg() + 1.0;
    let undesirable_losses = sigmoid((kl - logratios) * cfg.beta).neg() + 1.0;
    let weights = desirable.clone() * (cfg.desirable_weight - cfg.undesirable_weight) + cfg.undesirable_weight;
    let per_row = desirable_losses * desirable.clone() + undesirable_losses * (desirable.neg() + 1.0);
    (per_row * weights).mean()
}

/// The KL estimate of rows whose KL sequences scored `policy` and `reference` (host values).
pub fn kl_estimate(policy: &[f32], reference: &[f32]) -> f64 {
    let n = policy.len().max(1) as f64;
    let sum: f64 = policy.iter().zip(reference).map(|(&p, &r)| p as f64 - r as f64).sum();
    (sum / n).max(0.0)
}
