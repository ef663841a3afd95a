//! The DPO loss family, one formula per `loss_type`, as TRL 1.16 `DPOTrainer._compute_loss`
//! defines them. The log-ratios are computed once; each loss maps them to a per-pair loss whose
//! mean over pairs is weighted by `loss_weights` and summed.

use burn::tensor::activation::{log_sigmoid, relu, sigmoid};
use burn::tensor::{Tensor, TensorData};
use serde::{Deserialize, Serialize};

use super::logps::{DeviceBatch, SequenceScores};

/// TRL's `loss_type` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum LossType {
    /// DPO (Rafailov et al. 2023): `-log σ(βδ)`.
    Sigmoid,
    /// SLiC (Zhao et al. 2023): `relu(1 - βδ)`.
    Hinge,
    /// IPO (Azar et al. 2023): `(δ̄ - 1/(2β))²` on per-token averaged log-ratios.
    Ipo,
    /// EXO (Ji et al. 2024), pairwise, with `label_smoothing` as ε.
    ExoPair,
    /// NCA (Chen et al. 2024), pairwise.
    NcaPair,
    /// Robust DPO (Chowdhury et al. 2024): unbiased under label-flip rate `label_smoothing`.
    Robust,
    /// BCO (Jung et al. 2024), pairwise, without a running reward mean (as TRL 1.16).
    BcoPair,
    /// SPPO (Wu et al. 2024), hard-label version.
    SppoHard,
    /// AOT (Melnyk et al. 2024), paired: sorted log-ratio differences.
    Aot,
    /// AOT, unpaired: chosen and rejected log-ratios sorted separately.
    AotUnpaired,
    /// APO-zero (D'Oosterlinck et al. 2024).
    ApoZero,
    /// APO-down (D'Oosterlinck et al. 2024).
    ApoDown,
    /// DiscoPOP (Chris Lu et al. 2024), with `discopop_tau`.
    Discopop,
    /// Negative log-likelihood of the chosen completions, a token mean (RPO's extra term).
    Sft,
    /// Sigmoid loss on per-token averaged log-ratios.
    SigmoidNorm,
}

impl LossType {
    /// The name TRL uses, for messages and logs.
    pub fn name(self) -> &'static str {
        match self {
            Self::Sigmoid => "sigmoid",
            Self::Hinge => "hinge",
            Self::Ipo => "ipo",
            Self::ExoPair => "exo_pair",
            Self::NcaPair => "nca_pair",
            Self::Robust => "robust",
            Self::BcoPair => "bco_pair",
            Self::SppoHard => "sppo_hard",
            Self::Aot => "aot",
            Self::AotUnpaired => "aot_unpaired",
            Self::ApoZero => "apo_zero",
            Self::ApoDown => "apo_down",
            Self::Discopop => "discopop",
            Self::Sft => "sft",
            Self::SigmoidNorm => "sigmoid_norm",
        }
    }

    /// Loss types that accept an f-divergence other than reverse KL (TRL's `__init__` check).
    fn allows_f_divergence(self) -> bool {
        matches!(
            self,
            Self::Sigmoid
                | Self::SigmoidNorm
                | Self::Hinge
                | Self::Ipo
                | Self::ExoPair
                | Self::Robust
                | Self::Discopop
                | Self::Sft
        )
    }
}

/// TRL's `f_divergence_type` (Wang et al. 2023, "Beyond Reverse KL").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum FDivergence {
    #[default]
    ReverseKl,
    ForwardKl,
    JsDivergence,
    AlphaDivergence,
}

/// Everything that shapes the loss, validated by [`LossConfig::validate`]. Also the loss flags of
/// `dpo-train eval`, named as TRL's `DPOConfig` keys.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, clap::Args)]
pub struct LossConfig {
    /// Temperature of the implicit reward.
    #[arg(long, default_value_t = 0.1)]
    pub beta: f64,
    /// One or more loss types (comma-separated), summed with --loss-weights.
    #[arg(long, value_enum, value_delimiter = ',', num_args = 1.., default_value = "sigmoid")]
    pub loss_type: Vec<LossType>,
    /// One weight per loss type [default: 1 each].
    #[arg(long, value_delimiter = ',', num_args = 1..)]
    pub loss_weights: Vec<f64>,
    /// ε of robust, exo_pair and aot.
    #[arg(long, default_value_t = 0.0)]
    pub label_smoothing: f64,
    /// Divergence the log-ratios are scored with.
    #[arg(long, value_enum, default_value = "reverse_kl")]
    pub f_divergence_type: FDivergence,
    /// α of alpha_divergence.
    #[arg(long, default_value_t = 0.5)]
    pub f_alpha_divergence_coef: f64,
    /// LD-DPO: weight of the tokens beyond the shorter completion's length.
    #[arg(long)]
    pub ld_alpha: Option<f64>,
    /// τ of discopop.
    #[arg(long, default_value_t = 0.05)]
    pub discopop_tau: f64,
    /// Score without a reference model (reference log-probs taken as 0).
    #[arg(long)]
    pub reference_free: bool,
    /// WPO (Zhou et al. 2024): weight each pair by the policy's length-normalised probability of
    /// both completions.
    #[arg(long)]
    pub use_weighting: bool,
}

impl Default for LossConfig {
    fn default() -> Self {
        Self {
            beta: 0.1,
            loss_type: vec![LossType::Sigmoid],
            loss_weights: Vec::new(),
            label_smoothing: 0.0,
            f_divergence_type: FDivergence::ReverseKl,
            f_alpha_divergence_coef: 0.5,
            ld_alpha: None,
            discopop_tau: 0.05,
            reference_free: false,
            use_weighting: false,
        }
    }
}

/// A loss setting out of range, named by its config key.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("`{key}`: {message}")]
pub struct LossConfigError {
    pub key: &'static str,
    pub message: String,
}

impl LossConfig {
    /// Rejects settings TRL rejects, and values that make a formula meaningless.
    pub fn validate(&self) -> Result<(), LossConfigError> {
        let err = |key, message: String| Err(LossConfigError { key, message });
        if !(self.beta > 0.0 && self.beta.is_finite()) {
            return err("beta", format!("must be > 0, got {}", self.beta));
        }
        if self.loss_type.is_empty() {
            return err("loss_type", "needs at least one loss type".to_owned());
        }
        if !self.loss_weights.is_empty() && self.loss_weights.len() != self.loss_type.len() {
            return err(
                "loss_weights",
                format!("has {} weights for {} loss types", self.loss_weights.len(), self.loss_type.len()),
            );
        }
        if !(0.0..1.0).contains(&self.label_smoothing) {
            return err("label_smoothing", format!("must be in [0, 1), got {}", self.label_smoothing));
        }
        if self.loss_type.contains(&LossType::Robust) && self.label_smoothing >= 0.5 {
            return err("label_smoothing", format!("must be < 0.5 with `robust`, got {}", self.label_smoothing));
        }
        if self.loss_type.contains(&LossType::ExoPair) && self.label_smoothing == 0.0 {
            return err("label_smoothing", "must be > 0 with `exo_pair` (it is EXO's ε)".to_owned());
        }
        if self.f_divergence_type != FDivergence::ReverseKl
            && let Some(t) = self.loss_type.iter().find(|t| !t.allows_f_divergence())
        {
            return err("f_divergence_type", format!("`{}` only supports `reverse_kl`", t.name()));
        }
        if let Some(alpha) = self.ld_alpha
            && !(0.0..=1.0).contains(&alpha)
        {
            return err("ld_alpha", format!("must be in [0, 1], got {alpha}"));
        }
        if self.use_weighting
            && let Some(t) = self.loss_type.iter().find(|t| matches!(t, LossType::Aot | LossType::AotUnpaired))
        {
            return err("use_weighting", format!("is not defined for `{}`", t.name()));
        }
        if self.discopop_tau <= 0.0 {
            return err("discopop_tau", format!("must be > 0, got {}", self.discopop_tau));
        }
        Ok(())
    }

    /// `(loss type, weight)` pairs.
    pub fn weighted_types(&self) -> impl Iterator<Item = (LossType, f64)> + '_ {
        self.loss_type.iter().enumerate().map(|(i, &t)| (t, self.loss_weights.get(i).copied().unwrap_or(1.0)))
    }
}

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
}

impl PairScores {
    /// The loss inputs of one preference batch, keeping the policy's graph: `ref_logps` are the
    /// reference's `[2B]` log-probs on the host.
    ///
    /// # Panics
    /// If `policy` was scored without statistics.
    pub fn from_scores(batch: &DeviceBatch, policy: &SequenceScores, ref_logps: &[f32]) -> Self {
        let b = batch.pairs;
        let device = policy.logps.device();
        let host = |v: &[f32]| Tensor::<1>::from_data(TensorData::new(v.to_vec(), [v.len()]), &device);
        let stats = policy.stats.as_ref().expect("the policy is scored with statistics");
        let half = |t: &Tensor<1>, start: usize| t.clone().narrow(0, start, b); // [B]
        PairScores {
            chosen_logps: half(&policy.logps, 0),
            rejected_logps: half(&policy.logps, b),
            ref_chosen_logps: host(&ref_logps[..b]),
            ref_rejected_logps: host(&ref_logps[b..]),
            chosen_lengths: host(&batch.completion_lengths[..b]),
            rejected_lengths: host(&batch.completion_lengths[b..]),
            chosen_token_logps: half(&policy.token_logps, 0),
            chosen_tokens: half(&stats.tokens, 0),
            chosen_wpo: half(&stats.wpo, 0),
            rejected_wpo: half(&stats.wpo, b),
        }
    }
}

/// The scalar training loss, `Σ_k w_k · mean_i ℓ_k(i)`.
///
/// # Shapes
/// - every field of `s`: `[B]`; returns `[1]`
pub fn dpo_loss(s: &PairScores, cfg: &LossConfig) -> Tensor<1> {
    let beta = cfg.beta;
    let eps = cfg.label_smoothing;
    let chosen_logratios = s.chosen_logps.clone() - s.ref_chosen_logps.clone(); // [B]
    let rejected_logratios = s.rejected_logps.clone() - s.ref_rejected_logps.clone(); // [B]
    let chosen_scores = f_score(chosen_logratios.clone(), cfg);
    let rejected_scores = f_score(rejected_logratios.clone(), cfg);
    let delta = chosen_scores.clone() - rejected_scores.clone(); // [B]
    // Per-token averaged scores, as IPO and sigmoid_norm use them.
    let normalised = || {
        chosen_scores.clone() / s.chosen_lengths.clone().clamp_min(1.0)
            - rejected_scores.clone() / s.rejected_lengths.clone().clamp_min(1.0)
    };
    // `-(1-ε)·log σ(βd) - ε·log σ(-βd)`, shared by aot and aot_unpaired.
    let smoothed_sigmoid = |d: Tensor<1>| log_sigmoid(d.clone() * beta) * -(1.0 - eps) - log_sigmoid(d * -beta) * eps;

    let mut total: Option<Tensor<1>> = None;
    for (loss_type, weight) in cfg.weighted_types() {
        let per_pair = match loss_type {
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
        };
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
        assert_eq!(bad_beta.validate().unwrap_err().to_string(), "`beta`: must be > 0, got 0");
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
