//! The loss settings' types: TRL's `loss_type` and `f_divergence_type` values, and the checks TRL
//! makes on them. [`LossConfig`] itself is declared with every other key in [`super`].

use serde::{Deserialize, Serialize};

use super::LossConfig;

/// TRL's `loss_type` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
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
    /// CPO (Xu et al. 2024), TRL's `CPOTrainer` with `loss_type = "sigmoid"`: `-log σ(β(c - r))`
    /// on summed log-probs, no reference, plus `cpo_alpha` times the chosen completions' NLL.
    Cpo,
    /// SimPO (Meng et al. 2024), `CPOTrainer` with `loss_type = "simpo"`: CPO on per-token averaged
    /// log-probs with the margin `simpo_gamma`.
    Simpo,
    /// AlphaPO (Gupta et al. 2025), `CPOConfig(loss_type = "alphapo")`: SimPO with `cpo_alpha = 0`
    /// and the reward shaped by `alpha`.
    Alphapo,
    /// ORPO (Hong et al. 2024), TRL's `ORPOTrainer`: the chosen sequences' NLL (prompt included)
    /// minus `β · log σ(log-odds ratio)` of the averaged log-probs; no reference.
    Orpo,
    /// KTO (Ethayarajh et al. 2024), TRL's `KTOTrainer`: unpaired `prompt`/`completion`/`label`
    /// rows, `1 - σ(β(r - z))` for a desirable row and `1 - σ(β(z - r))` for an undesirable one,
    /// weighted by `desirable_weight` / `undesirable_weight`, with `z` the clamped KL estimate
    /// from mismatched prompt/completion rows.
    Kto,
    /// APO-zero's unpaired form (D'Oosterlinck et al. 2024), `KTOConfig(loss_type =
    /// "apo_zero_unpaired")`: `1 - σ(βr)` for a desirable row and `σ(βr)` for an undesirable
    /// one; KTO's rows without its KL estimate.
    ApoZeroUnpaired,
}

impl LossType {
    /// Every loss type, in declaration order.
    pub const ALL: [LossType; 21] = [
        Self::Sigmoid,
        Self::Hinge,
        Self::Ipo,
        Self::ExoPair,
        Self::NcaPair,
        Self::Robust,
        Self::BcoPair,
        Self::SppoHard,
        Self::Aot,
        Self::AotUnpaired,
        Self::ApoZero,
        Self::ApoDown,
        Self::Discopop,
        Self::Sft,
        Self::SigmoidNorm,
        Self::Cpo,
        Self::Simpo,
        Self::Alphapo,
        Self::Orpo,
        Self::Kto,
        Self::ApoZeroUnpaired,
    ];

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
            Self::Cpo => "cpo",
            Self::Simpo => "simpo",
            Self::Alphapo => "alphapo",
            Self::Orpo => "orpo",
            Self::Kto => "kto",
            Self::ApoZeroUnpaired => "apo_zero_unpaired",
        }
    }

    /// The losses of TRL's `CPOTrainer` and `ORPOTrainer`: no reference model, no DPO metric of one.
    pub fn is_reference_free(self) -> bool {
        matches!(self, Self::Cpo | Self::Simpo | Self::Alphapo | Self::Orpo)
    }

    /// Whether the loss compares per-token averaged log-probs (CPO's `average_log_prob`).
    pub fn averages_logps(self) -> bool {
        matches!(self, Self::Simpo | Self::Alphapo | Self::Orpo)
    }

    /// The TRL trainer whose numbers the loss matches.
    pub fn trainer(self) -> &'static str {
        match self {
            Self::Cpo | Self::Simpo | Self::Alphapo => "CPOTrainer",
            Self::Orpo => "ORPOTrainer",
            Self::Kto | Self::ApoZeroUnpaired => "KTOTrainer",
            _ => "DPOTrainer",
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FDivergence {
    #[default]
    ReverseKl,
    ForwardKl,
    JsDivergence,
    AlphaDivergence,
}

/// A loss setting out of range, named by its config key.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("`{key}`: {message}")]
pub struct LossConfigError {
    pub key: &'static str,
    pub message: String,
}

impl LossConfig {
    /// Rejects settings TRL rejects, and values that make a formula meaningless (a NaN or infinite
    /// weight or coefficient trains a NaN model to the end, which TRL lets run).
    pub fn validate(&self) -> Result<(), LossConfigError> {
        let err = |key, message: String| Err(LossConfigError { key, message });
        if !(self.beta > 0.0 && self.beta.is_finite()) {
            return err("beta", format!("must be finite and > 0, got {}", self.beta));
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
        if let Some(w) = self.loss_weights.iter().find(|w| !w.is_finite()) {
            return err("loss_weights", format!("must be finite, got {w}"));
        }
        if !self.f_alpha_divergence_coef.is_finite() {
            return err("f_alpha_divergence_coef", format!("must be finite, got {}", self.f_alpha_divergence_coef));
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
        // Only where it is read: TRL ignores it for the other losses.
        if self.loss_type.contains(&LossType::Discopop) && !(self.discopop_tau > 0.0 && self.discopop_tau.is_finite()) {
            return err("discopop_tau", format!("must be finite and > 0 with `discopop`, got {}", self.discopop_tau));
        }
        self.validate_reference_free()?;
        self.validate_kto()
    }

    /// KTO trains alone, on the settings `KTOConfig` defines; `unpair` only means something to it.
    fn validate_kto(&self) -> Result<(), LossConfigError> {
        let err = |key, message: String| Err(LossConfigError { key, message });
        for (key, value) in
            [("desirable_weight", self.desirable_weight), ("undesirable_weight", self.undesirable_weight)]
        {
            if !(value.is_finite() && value >= 0.0) {
                return err(key, format!("must be finite and >= 0, got {value}"));
            }
        }
        if !self.is_kto() {
            let kto_only = [
                ("unpair", self.unpair),
                ("desirable_weight", self.desirable_weight != 1.0),
                ("undesirable_weight", self.undesirable_weight != 1.0),
            ];
            return match kto_only.iter().find(|(_, set)| *set) {
                Some((key, _)) => {
                    err(key, "only applies to KTOTrainer's losses (`kto`, `apo_zero_unpaired`)".to_owned())
                }
                None => Ok(()),
            };
        }
        self.own_trainer(
            self.unpaired_loss().unwrap_or(LossType::Kto),
            &[
                ("f_divergence_type", self.f_divergence_type != FDivergence::ReverseKl),
                ("ld_alpha", self.ld_alpha.is_some()),
                ("use_weighting", self.use_weighting),
                ("label_smoothing", self.label_smoothing != 0.0),
                ("reference_free", self.reference_free),
                ("loss_weights", !self.loss_weights.is_empty()),
            ],
        )
    }

    /// Whether the loss is one of `KTOTrainer`'s (kto, apo_zero_unpaired): unpaired rows.
    pub fn is_kto(&self) -> bool {
        self.unpaired_loss().is_some()
    }

    /// What the data's examples are called in messages: KTO's `rows`, or `pairs`.
    pub fn examples(&self) -> &'static str {
        if self.is_kto() { "rows" } else { "pairs" }
    }

    /// `KTOTrainer`'s loss configured, if any.
    pub fn unpaired_loss(&self) -> Option<LossType> {
        self.loss_type.iter().copied().find(|t| matches!(t, LossType::Kto | LossType::ApoZeroUnpaired))
    }

    /// Whether each row is scored with a KL sequence (KTO's estimate; TRL's `calculate_KL`).
    pub fn kl_rows(&self) -> bool {
        self.loss_type.contains(&LossType::Kto)
    }

    /// The reference-free family trains alone, on settings its trainers define.
    fn validate_reference_free(&self) -> Result<(), LossConfigError> {
        let err = |key, message: String| Err(LossConfigError { key, message });
        for (key, value) in [("cpo_alpha", self.cpo_alpha), ("simpo_gamma", self.simpo_gamma), ("alpha", self.alpha)] {
            if !value.is_finite() {
                return err(key, format!("must be finite, got {value}"));
            }
        }
        if self.cpo_alpha < 0.0 {
            return err("cpo_alpha", format!("must be >= 0, got {}", self.cpo_alpha));
        }
        // Read by CPOTrainer's losses alone: elsewhere a value set would be ignored (TRL's CPO
        // recipe with `loss_type: sigmoid` is `cpo` here).
        let cpo = matches!(self.family(), Some(LossType::Cpo | LossType::Simpo | LossType::Alphapo));
        let cpo_only = [
            ("cpo_alpha", self.cpo_alpha != 1.0),
            ("simpo_gamma", self.simpo_gamma != 0.5),
            ("alpha", self.alpha != 0.0),
        ];
        if let Some((key, _)) = cpo_only.iter().find(|(_, set)| *set && !cpo) {
            return err(
                key,
                "only applies to CPOTrainer's losses (`cpo`, `simpo`, `alphapo`; TRL's CPOConfig `loss_type: sigmoid` is `cpo` here)".to_owned(),
            );
        }
        let Some(family) = self.family() else { return Ok(()) };
        self.own_trainer(
            family,
            &[
                ("f_divergence_type", self.f_divergence_type != FDivergence::ReverseKl),
                ("ld_alpha", self.ld_alpha.is_some()),
                ("use_weighting", self.use_weighting),
                ("label_smoothing", family == LossType::Orpo && self.label_smoothing != 0.0),
                ("loss_weights", !self.loss_weights.is_empty()),
            ],
        )
    }

    /// A loss of another TRL trainer than `DPOTrainer` trains alone, and none of the `set` keys
    /// (those its trainer does not define) may be set.
    fn own_trainer(&self, family: LossType, set: &[(&'static str, bool)]) -> Result<(), LossConfigError> {
        let (name, trainer) = (family.name(), family.trainer());
        if self.loss_type.len() > 1 {
            let others: Vec<&str> = self.loss_type.iter().filter(|t| **t != family).map(|t| t.name()).collect();
            let message = match others.is_empty() {
                true => format!("`{name}` is given more than once ({trainer} has one loss)"),
                false => format!("`{name}` trains alone ({trainer} has one loss), not with `{}`", others.join("`, `")),
            };
            return Err(LossConfigError { key: "loss_type", message });
        }
        match set.iter().find(|(_, set)| *set) {
            Some((key, _)) => {
                let message = format!("is not defined for `{name}` (TRL's {trainer} has no such setting)");
                Err(LossConfigError { key, message })
            }
            None => Ok(()),
        }
    }

    /// The reference-free loss configured, if any (it is then the only one).
    pub fn family(&self) -> Option<LossType> {
        self.loss_type.iter().copied().find(|t| t.is_reference_free())
    }

    /// Whether the run needs a reference model's log-probs.
    pub fn needs_reference(&self) -> bool {
        !self.reference_free && self.family().is_none()
    }

    /// The NLL weight of the reference-free family: `cpo_alpha` (AlphaPO sets it to 0, as
    /// `CPOConfig.__post_init__`), 1 for ORPO.
    pub fn nll_weight(&self) -> f64 {
        match self.family() {
            Some(LossType::Alphapo) => 0.0,
            Some(LossType::Orpo) => 1.0,
            _ => self.cpo_alpha,
        }
    }

    /// `(loss type, weight)` pairs.
    pub fn weighted_types(&self) -> impl Iterator<Item = (LossType, f64)> + '_ {
        self.loss_type.iter().enumerate().map(|(i, &t)| (t, self.loss_weights.get(i).copied().unwrap_or(1.0)))
    }
}

#[cfg(test)]
mod tests {
    use super::{LossConfig, LossType};

    /// A NaN or infinite loss weight or alpha-divergence coefficient is refused by its key (it
    /// trained a NaN model to the end); `discopop_tau` only where `discopop` reads it.
    #[test]
    fn weights_and_coefficients_must_be_finite() {
        let refused = |cfg: LossConfig| cfg.validate().map_err(|e| (e.key, e.message)).unwrap_err();
        let weights = LossConfig { loss_weights: vec![f64::NAN], ..Default::default() };
        assert_eq!(refused(weights), ("loss_weights", "must be finite, got NaN".to_owned()));
        let coef = LossConfig { f_alpha_divergence_coef: f64::INFINITY, ..Default::default() };
        assert_eq!(refused(coef), ("f_alpha_divergence_coef", "must be finite, got inf".to_owned()));
        let unused_tau = LossConfig { discopop_tau: -1.0, ..Default::default() };
        assert!(unused_tau.validate().is_ok());
        let tau = LossConfig { discopop_tau: f64::NAN, loss_type: vec![LossType::Discopop], ..Default::default() };
        assert_eq!(refused(tau).0, "discopop_tau");
    }

    /// CPOTrainer's keys set under another loss were ignored (a CPO recipe's `loss_type:
    /// sigmoid` trained DPO against a reference, `cpo_alpha` unread): refused on their key.
    #[test]
    fn cpo_keys_apply_to_cpo_losses_only() {
        let with = |loss: LossType, cfg: LossConfig| LossConfig { loss_type: vec![loss], ..cfg };
        let alpha = LossConfig { cpo_alpha: 0.5, ..Default::default() };
        let refused = with(LossType::Sigmoid, alpha.clone()).validate().unwrap_err();
        assert_eq!(refused.key, "cpo_alpha");
        assert!(refused.message.starts_with("only applies to CPOTrainer's losses"), "{}", refused.message);
        assert_eq!(with(LossType::Orpo, alpha.clone()).validate().unwrap_err().key, "cpo_alpha");
        with(LossType::Simpo, alpha).validate().unwrap();
        let gamma = LossConfig { simpo_gamma: 1.0, ..Default::default() };
        assert_eq!(with(LossType::Hinge, gamma.clone()).validate().unwrap_err().key, "simpo_gamma");
        with(LossType::Alphapo, LossConfig { alpha: 0.25, ..gamma }).validate().unwrap();
    }

    /// `ALL` lists each loss type once, and each TRL name reads back as its type.
    #[test]
    fn every_loss_type_and_its_name() {
        for (i, t) in LossType::ALL.into_iter().enumerate() {
            let parsed: LossType = serde_json::from_value(serde_json::json!(t.name())).unwrap();
            assert_eq!(parsed, t);
            assert!(!LossType::ALL[..i].contains(&t), "{} twice", t.name());
        }
    }
}
