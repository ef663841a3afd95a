//! The DPO loss family, one formula per `loss_type`, as TRL 1.16 `DPOTrainer._compute_loss`
//! defines them. The log-ratios are computed once; each loss maps them to a per-pair loss whose
//! mean over pairs is weighted by `loss_weights` and summed.

use burn::tensor::Tensor;
use burn::tensor::activation::{log_sigmoid, relu, sigmoid};

pub use super::pair_scores::PairScores;
use crate::config::{FDivergence, LossConfig, LossType};

/// The scalar training loss, `Σ_k w_k · mean_i ℓ_k(i)`.
///
/// # Shapes
/// - every field of `s`: `[B]`; returns `[1]`
pub fn dpo_loss(s: &PairScores, cfg: &LossConfig) -> Tensor<1> {
    if cfg.is_kto() {
        return super::kto::loss(s, cfg);
    }
    if let Some(family) = cfg.family() {
        return super::ref_free::loss(s, cfg, family);
    }
    let ratios = Ratios::of(s, cfg);
    let mut total: Option<Tensor<1>> = None;
    for (loss_type, weight) in cfg.weighted_types() {
        let Some(per_pair) = ratios.per_pair(loss_type, s, cfg) else { continue };
        let per_pair =
            if cfg.use_weighting { per_pair * (s.chosen_wpo.clone() + s.rejected_wpo.clone()).exp() } else { per_pair };
        let term = per_pair.mean() * weight;
        total = Some(match total {
            Some(t) => t + term,
            None => term,
        });
    }
    // `validate` guarantees at least one loss type.
    total.expect("LossConfig::validate ensures a loss type")
}

/// The log-ratios against the reference, computed once for every loss of a weighted sum.
///
/// # Shapes
/// - every field: `[B]`
struct Ratios {
    chosen: Tensor<1>,
    rejected: Tensor<1>,
    /// Their f-divergence scores ([`f_score`]).
    chosen_scores: Tensor<1>,
    rejected_scores: Tensor<1>,
    /// `chosen_scores − rejected_scores`.
    delta: Tensor<1>,
}

impl Ratios {
    fn of(s: &PairScores, cfg: &LossConfig) -> Self {
        let chosen = s.chosen_logps.clone() - s.ref_chosen_logps.clone();
        let rejected = s.rejected_logps.clone() - s.ref_rejected_logps.clone();
        let chosen_scores = f_score(chosen.clone(), cfg);
        let rejected_scores = f_score(rejected.clone(), cfg);
        let delta = chosen_scores.clone() - rejected_scores.clone();
        Ratios { chosen, rejected, chosen_scores, rejected_scores, delta }
    }

    /// `loss_type`'s loss of each pair; None for the reference-free family, which
    /// `LossConfig::validate` keeps alone (handled before these).
    fn per_pair(&self, loss_type: LossType, s: &PairScores, cfg: &LossConfig) -> Option<Tensor<1>> {
        let (beta, eps) = (cfg.beta, cfg.label_smoothing);
        let Ratios { chosen: chosen_logratios, rejected: rejected_logratios, delta, .. } = self;
        // Per-token averaged scores, as IPO and sigmoid_norm use them.
        let normalised = || {
            self.chosen_scores.clone() / s.chosen_lengths.clone().clamp_min(1.0)
                - self.rejected_scores.clone() / s.rejected_lengths.clone().clamp_min(1.0)
        };
        // `-(1-ε)·log σ(βd) - ε·log σ(-βd)`, shared by aot and aot_unpaired.
        let smoothed_sigmoid =
            |d: Tensor<1>| log_sigmoid(d.clone() * beta) * -(1.0 - eps) - log_sigmoid(d * -beta) * eps;
        Some(match loss_type {
            LossType::Sigmoid => -log_sigmoid(delta.clone() * beta),
            LossType::Hinge => relu((delta.clone() * beta).neg() + 1.0),
            LossType::Ipo => (normalised() - 1.0 / (2.0 * beta)).square(),
            LossType::ExoPair => {
                let x = delta.clone() * beta;
                sigmoid(x.clone()) * (log_sigmoid(x.clone()) - (-eps).ln_1p())
                    + sigmoid(x.clone().neg()) * (log_sigmoid(x.neg()) - eps.ln())
            }
            LossType::NcaPair => {
                let chosen = chosen_logratios.clone() * beta;
                let rejected = rejected_logratios.clone() * beta;
                -log_sigmoid(chosen.clone()) - log_sigmoid(chosen.neg()) * 0.5 - log_sigmoid(rejected.neg()) * 0.5
            }
            LossType::Robust => {
                let x = delta.clone() * beta;
                (log_sigmoid(x.clone()) * -(1.0 - eps) + log_sigmoid(x.neg()) * eps) / (1.0 - 2.0 * eps)
            }
            LossType::BcoPair => {
                -log_sigmoid(chosen_logratios.clone() * beta) - log_sigmoid(rejected_logratios.clone() * -beta)
            }
            LossType::SppoHard => {
                (chosen_logratios.clone() - 0.5 / beta).square() + (rejected_logratios.clone() + 0.5 / beta).square()
            }
            LossType::Aot => {
                let policy = (s.chosen_logps.clone() - s.rejected_logps.clone()).sort(0);
                let reference = (s.ref_chosen_logps.clone() - s.ref_rejected_logps.clone()).sort(0);
                smoothed_sigmoid(policy - reference)
            }
            LossType::AotUnpaired => {
                smoothed_sigmoid(chosen_logratios.clone().sort(0) - rejected_logratios.clone().sort(0))
            }
            LossType::ApoZero => {
                -sigmoid(chosen_logratios.clone() * beta) + 1.0 + sigmoid(rejected_logratios.clone() * beta)
            }
            LossType::ApoDown => {
                sigmoid(chosen_logratios.clone() * beta)
                    - sigmoid((chosen_logratios.clone() - rejected_logratios.clone()) * beta)
                    + 1.0
            }
            LossType::Discopop => {
                let x = delta.clone() * beta;
                let mix = sigmoid(x.clone() / cfg.discopop_tau);
                -log_sigmoid(x.clone()) * (mix.clone().neg() + 1.0) + x.neg().exp() * mix
            }
            LossType::Sft => {
                // A token mean over every chosen completion token of the batch, the same for each pair.
                let nll = -s.chosen_token_logps.clone().sum() / s.chosen_tokens.clone().sum().clamp_min(1.0);
                nll.expand([s.chosen_logps.dims()[0]])
            }
            LossType::SigmoidNorm => -log_sigmoid(normalised() * beta),
            // `LossConfig::validate` keeps the reference-free family alone: handled above.
            LossType::Cpo
            | LossType::Simpo
            | LossType::Alphapo
            | LossType::Orpo
            | LossType::Kto
            | LossType::ApoZeroUnpaired => return None,
        })
    }
}

/// The f-divergence score of a log-ratio (TRL: reverse KL keeps it, the others transform it).
fn f_score(logratio: Tensor<1>, cfg: &LossConfig) -> Tensor<1> {
    match cfg.f_divergence_type {
        FDivergence::ReverseKl => logratio,
        FDivergence::ForwardKl => logratio.neg().exp().neg() + 1.0,
        FDivergence::JsDivergence => log_sigmoid(logratio) + std::f64::consts::LN_2,
        FDivergence::AlphaDivergence => {
            let a = cfg.f_alpha_divergence_coef;
            if (a - 1.0).abs() < 1e-6 {
                logratio
            } else {
                // TRL clamps the exponent at 80 in f32 so exp cannot overflow.
                ((logratio * (a - 1.0)).clamp_max(80.0).exp() - 1.0) / (a - 1.0)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_names_the_key() {
        let bad_beta = LossConfig { beta: 0.0, ..Default::default() };
        assert_eq!(bad_beta.validate().unwrap_err().to_string(), "`beta`: must be finite and > 0, got 0");
        let robust = LossConfig { loss_type: vec![LossType::Robust], label_smoothing: 0.5, ..Default::default() };
        assert_eq!(robust.validate().unwrap_err().key, "label_smoothing");
        let exo = LossConfig { loss_type: vec![LossType::ExoPair], ..Default::default() };
        assert_eq!(exo.validate().unwrap_err().key, "label_smoothing");
        let fdiv = LossConfig {
            loss_type: vec![LossType::NcaPair],
            f_divergence_type: FDivergence::ForwardKl,
            ..Default::default()
        };
        assert_eq!(
            fdiv.validate().unwrap_err().to_string(),
            "`f_divergence_type`: `nca_pair` only supports `reverse_kl`"
        );
        let weights = LossConfig { loss_weights: vec![1.0, 2.0], ..Default::default() };
        assert_eq!(weights.validate().unwrap_err().key, "loss_weights");
    }
}
