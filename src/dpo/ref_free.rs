//! The reference-free family as TRL 1.16's `CPOTrainer.cpo_loss` / `get_batch_loss_metrics` and
//! `ORPOTrainer.odds_ratio_loss` compute it (`trl/experimental/{cpo,orpo}/*_trainer.py`): the
//! policy's own sequence log-probs, summed (cpo) or averaged per completion token (simpo, alphapo,
//! orpo), and the NLL of the chosen sequences as a token mean over the batch (completions for
//! CPO, prompt and completion for ORPO, whose rows score the chosen prompts too).

use burn::tensor::Tensor;
use burn::tensor::activation::log_sigmoid;

use super::pair_scores::PairScores;
use crate::config::{LossConfig, LossType};

/// The scalar loss of `family`.
///
/// # Shapes
/// - every field of `s`: `[B]`; returns `[1]`
pub fn loss(s: &PairScores, cfg: &LossConfig, family: LossType) -> Tensor<1> {
    let (beta, eps) = (cfg.beta, cfg.label_smoothing);
    let (chosen, rejected) = if family.averages_logps() {
        (
            s.chosen_logps.clone() / s.chosen_lengths.clone().clamp_min(1.0),
            s.rejected_logps.clone() / s.rejected_lengths.clone().clamp_min(1.0),
        )
    } else {
        (s.chosen_logps.clone(), s.rejected_logps.clone())
    }; // [B]
    let nll = -s.chosen_token_logps.clone().sum() / s.chosen_tokens.clone().sum().clamp_min(1.0); // [1]
    if family == LossType::Orpo {
        let log_odds = (chosen.clone() - rejected.clone()) - (log1mexp(chosen) - log1mexp(rejected));
        return nll - (log_sigmoid(log_odds) * beta).mean();
    }
    let mut logits = shape(chosen, cfg.alpha) - shape(rejected, cfg.alpha);
    if family != LossType::Cpo {
        logits = logits - cfg.simpo_gamma / beta;
    }
    let per_pair = log_sigmoid(logits.clone() * beta) * -(1.0 - eps) - log_sigmoid(logits * -beta) * eps;
    let weight = cfg.nll_weight();
    if weight == 0.0 { per_pair.mean() } else { per_pair.mean() + nll * weight }
}

/// AlphaPO's reward of a log-prob `x`: `(1 - p^(-α)) / α` with `p = e^x`, computed as
/// `(1 - e^(-αx)) / α` (TRL's `exp(x).pow(-α)` overflows where `e^x` underflows); `x` at α = 0.
fn shape(x: Tensor<1>, alpha: f64) -> Tensor<1> {
    if alpha == 0.0 { x } else { ((x * -alpha).exp().neg() + 1.0) / alpha }
}

/// `log(1 - e^x)` for `x < 0`, branching at `-ln 2` as TRL's `log1mexp`: `log1p(-e^x)` below,
/// `log(-expm1(x))` above, with `expm1(x) = 2 tanh(x/2) / (1 - tanh(x/2))` (burn has no expm1;
/// this form keeps the small differences `1 - e^x` exact where `x` is near 0).
fn log1mexp(x: Tensor<1>) -> Tensor<1> {
    // A log-prob of exactly 0 (a certain completion) would give log 0.
    let x = x.clamp_max(-1e-30);
    let low = x.clone().exp().neg().log1p();
    let t = (x.clone() / 2.0).tanh();
    let high = ((t.clone() * -2.0) / (t.neg() + 1.0)).log();
    high.mask_where(x.lower_elem(-std::f64::consts::LN_2), low)
}

/// What TRL logs for each pair, from its sequence values on the host.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PairValues {
    /// The log-probs the loss compares (averaged where the loss averages): `logps/*`.
    pub chosen: f64,
    pub rejected: f64,
    /// `β` times their reward (AlphaPO's shape where α ≠ 0): `rewards/*`.
    pub reward_chosen: f64,
    pub reward_rejected: f64,
    /// ORPO's log-odds ratio of the pair.
    pub log_odds: f64,
}

impl PairValues {
    /// The values of one pair: summed log-probs and completion lengths of each side.
    pub fn of(family: LossType, cfg: &LossConfig, logps: [f64; 2], lengths: [f64; 2]) -> Self {
        let value = |i: usize| if family.averages_logps() { logps[i] / lengths[i].max(1.0) } else { logps[i] };
        let (chosen, rejected) = (value(0), value(1));
        let alpha = if family == LossType::Orpo { 0.0 } else { cfg.alpha };
        let reward = |x: f64| cfg.beta * if alpha == 0.0 { x } else { (1.0 - (-alpha * x).exp()) / alpha };
        let log1mexp = |x: f64| if x < -std::f64::consts::LN_2 { (-x.exp()).ln_1p() } else { (-x.exp_m1()).ln() };
        let log_odds = (chosen - rejected) - (log1mexp(chosen) - log1mexp(rejected));
        Self { chosen, rejected, reward_chosen: reward(chosen), reward_rejected: reward(rejected), log_odds }
    }
}

/// `log σ(x)`, for the host-side metric.
pub fn log_sigmoid_f64(x: f64) -> f64 {
    if x >= 0.0 { -(-x).exp().ln_1p() } else { x - x.exp().ln_1p() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::TensorData;

    /// `log1mexp` on both sides of its branch and near 0, against f64.
    #[test]
    fn log1mexp_is_accurate_on_both_branches() {
        let xs = [-30.0f32, -2.0, -0.7, -0.69, -0.1, -1e-3, -1e-6];
        let device = Default::default();
        let got =
            crate::model::host(&log1mexp(Tensor::<1>::from_data(TensorData::new(xs.to_vec(), [xs.len()]), &device)));
        for (x, g) in xs.iter().zip(got) {
            let want = (-(*x as f64).exp_m1()).ln();
            // f32 unit round-off relative to the value, a few operations deep.
            assert!(((g as f64) - want).abs() <= 8.0 * f32::EPSILON as f64 * want.abs().max(1.0), "{x}: {g} vs {want}");
        }
    }
}
