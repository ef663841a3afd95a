//! TRL's logged metrics (`DPOTrainer._compute_loss`, "metrics" block), kept as sums and counts so
//! that a mean is always over every pair (or token) seen, whatever the batch size, and so that
//! ranks can add their sums before dividing.

use burn::tensor::{Device, Tensor, TensorData};
use serde::Serialize;

use super::logps::{DeviceBatch, SequenceScores};
use super::loss::PairScores;
use super::ref_free::{PairValues, log_sigmoid_f64};
use crate::config::{LossConfig, LossType};
use crate::model::host;

/// Per-row values of one side (chosen or rejected), copied to the host.
#[derive(Debug, Clone, Default)]
pub struct SideRows {
    /// Weighted summed log-probs under the policy and the reference.
    pub logps: Vec<f32>,
    pub ref_logps: Vec<f32>,
    /// Unweighted summed log-probs (sft).
    pub token_logps: Vec<f32>,
    /// Completion tokens before the shift (IPO's normaliser).
    pub lengths: Vec<f32>,
    /// Scored tokens, and the per-row sums of entropy and mean logit over them.
    pub tokens: Vec<f32>,
    pub entropy: Vec<f32>,
    pub mean_logits: Vec<f32>,
    /// WPO weight exponents.
    pub wpo: Vec<f32>,
}

/// Scored pairs on the host, appendable across batches (the evaluation keeps the whole set).
#[derive(Debug, Clone, Default)]
pub struct ScoredPairs {
    pub chosen: SideRows,
    pub rejected: SideRows,
}

impl ScoredPairs {
    /// Copies one batch's scores to the host; `ref_logps` holds the reference's `[2B]` sequence
    /// log-probs (zeros when reference-free).
    ///
    /// # Panics
    /// If `policy` was scored without statistics.
    pub fn from_batch(batch: &DeviceBatch, policy: &SequenceScores, ref_logps: &[f32]) -> Self {
        let b = batch.pairs;
        let stats = policy.stats.as_ref().expect("the policy is scored with statistics");
        let logps = host(&policy.logps);
        let token_logps = host(&policy.token_logps);
        let tokens = host(&stats.tokens);
        let entropy = host(&stats.entropy);
        let mean_logits = host(&stats.mean_logits);
        let wpo = host(&stats.wpo);
        let side = |range: std::ops::Range<usize>| SideRows {
            logps: logps[range.clone()].to_vec(),
            ref_logps: ref_logps[range.clone()].to_vec(),
            token_logps: token_logps[range.clone()].to_vec(),
            lengths: batch.completion_lengths[range.clone()].to_vec(),
            tokens: tokens[range.clone()].to_vec(),
            entropy: entropy[range.clone()].to_vec(),
            mean_logits: mean_logits[range.clone()].to_vec(),
            wpo: wpo[range].to_vec(),
        };
        Self { chosen: side(0..b), rejected: side(b..2 * b) }
    }

    /// Appends another batch's pairs.
    pub fn extend(&mut self, other: Self) {
        for (mine, theirs) in [(&mut self.chosen, other.chosen), (&mut self.rejected, other.rejected)] {
            mine.logps.extend(theirs.logps);
            mine.ref_logps.extend(theirs.ref_logps);
            mine.token_logps.extend(theirs.token_logps);
            mine.lengths.extend(theirs.lengths);
            mine.tokens.extend(theirs.tokens);
            mine.entropy.extend(theirs.entropy);
            mine.mean_logits.extend(theirs.mean_logits);
            mine.wpo.extend(theirs.wpo);
        }
    }

    /// Every per-pair vector, chosen side then rejected (for collectives).
    pub fn columns(&self) -> Vec<Vec<f32>> {
        [&self.chosen, &self.rejected]
            .into_iter()
            .flat_map(|s| {
                [&s.logps, &s.ref_logps, &s.token_logps, &s.lengths, &s.tokens, &s.entropy, &s.mean_logits, &s.wpo]
                    .map(Clone::clone)
            })
            .collect()
    }

    /// The inverse of [`ScoredPairs::columns`].
    pub fn from_columns(columns: Vec<Vec<f32>>) -> Self {
        let mut it = columns.into_iter();
        let mut side = || SideRows {
            logps: it.next().unwrap_or_default(),
            ref_logps: it.next().unwrap_or_default(),
            token_logps: it.next().unwrap_or_default(),
            lengths: it.next().unwrap_or_default(),
            tokens: it.next().unwrap_or_default(),
            entropy: it.next().unwrap_or_default(),
            mean_logits: it.next().unwrap_or_default(),
            wpo: it.next().unwrap_or_default(),
        };
        let chosen = side();
        let rejected = side();
        Self { chosen, rejected }
    }

    /// Number of pairs held.
    pub fn len(&self) -> usize {
        self.chosen.logps.len()
    }

    /// Whether no pair is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The loss inputs as tensors on `device` (no gradient: for evaluation).
    pub fn to_pair_scores(&self, device: &Device) -> PairScores {
        let t = |v: &[f32]| Tensor::<1>::from_data(TensorData::new(v.to_vec(), [v.len()]), device);
        PairScores {
            chosen_logps: t(&self.chosen.logps),
            rejected_logps: t(&self.rejected.logps),
            ref_chosen_logps: t(&self.chosen.ref_logps),
            ref_rejected_logps: t(&self.rejected.ref_logps),
            chosen_lengths: t(&self.chosen.lengths),
            rejected_lengths: t(&self.rejected.lengths),
            chosen_token_logps: t(&self.chosen.token_logps),
            chosen_tokens: t(&self.chosen.tokens),
            chosen_wpo: t(&self.chosen.wpo),
            rejected_wpo: t(&self.rejected.wpo),
        }
    }
}

/// Running sums behind every metric. Sums are f64 so long runs do not lose precision.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MetricSums {
    /// Σ over optimisation steps (or evaluations) of `loss · pairs`, and the pairs.
    pub loss: f64,
    pub pairs: f64,
    pub rewards_chosen: f64,
    pub rewards_rejected: f64,
    pub accuracies: f64,
    pub logps_chosen: f64,
    pub logps_rejected: f64,
    pub logits_chosen: f64,
    pub logits_rejected: f64,
    pub chosen_tokens: f64,
    pub rejected_tokens: f64,
    pub entropy: f64,
    /// Input tokens of the training batches seen so far (TRL's `num_tokens`; 0 in a pure evaluation).
    pub num_tokens: f64,
    /// The reference-free family's: `Σ -log p` and the tokens of the chosen sequences' NLL, and
    /// ORPO's `Σ log σ(log-odds)` and `Σ log-odds` over pairs.
    pub nll: f64,
    pub nll_tokens: f64,
    pub log_odds_ratio: f64,
    pub log_odds_chosen: f64,
}

/// Number of [`MetricSums`] fields (the values ranks add up).
const FIELDS: usize = 17;

impl MetricSums {
    /// Adds the pairs of `scored`, whose mean loss was `loss`.
    pub fn add(&mut self, scored: &ScoredPairs, loss: f64, cfg: &LossConfig) {
        let n = scored.len() as f64;
        self.loss += loss * n;
        self.pairs += n;
        let (c, r) = (&scored.chosen, &scored.rejected);
        let family = cfg.family();
        for i in 0..scored.len() {
            let (reward_chosen, reward_rejected, logps_chosen, logps_rejected) = match family {
                // Rewards are β·log-ratio, always with reverse KL (TRL logs them before any f-divergence).
                None => (
                    cfg.beta * (c.logps[i] as f64 - c.ref_logps[i] as f64),
                    cfg.beta * (r.logps[i] as f64 - r.ref_logps[i] as f64),
                    c.logps[i] as f64,
                    r.logps[i] as f64,
                ),
                Some(family) => {
                    let logps = [c.logps[i] as f64, r.logps[i] as f64];
                    let v = PairValues::of(family, cfg, logps, [c.lengths[i] as f64, r.lengths[i] as f64]);
                    self.log_odds_ratio += log_sigmoid_f64(v.log_odds);
                    self.log_odds_chosen += v.log_odds;
                    (v.reward_chosen, v.reward_rejected, v.chosen, v.rejected)
                }
            };
            self.rewards_chosen += reward_chosen;
            self.rewards_rejected += reward_rejected;
            self.accuracies += f64::from(u8::from(reward_chosen > reward_rejected));
            self.logps_chosen += logps_chosen;
            self.logps_rejected += logps_rejected;
            self.logits_chosen += c.mean_logits[i] as f64;
            self.logits_rejected += r.mean_logits[i] as f64;
            self.chosen_tokens += c.tokens[i] as f64;
            self.rejected_tokens += r.tokens[i] as f64;
            self.entropy += c.entropy[i] as f64 + r.entropy[i] as f64;
            self.nll -= c.token_logps[i] as f64;
            self.nll_tokens += c.tokens[i] as f64;
        }
    }

    /// Adds another set of sums (another rank's, or another logging window's).
    pub fn merge(&mut self, o: &Self) {
        for (a, b) in self.fields_mut().into_iter().zip(o.fields()) {
            *a += b;
        }
    }

    /// The inverse of [`MetricSums::fields`].
    pub fn from_fields(f: [f64; FIELDS]) -> Self {
        let mut sums = Self::default();
        for (slot, value) in sums.fields_mut().into_iter().zip(f) {
            *slot = value;
        }
        sums
    }

    /// Every sum in a fixed order, for collectives.
    pub fn fields(&self) -> [f64; FIELDS] {
        [
            self.loss,
            self.pairs,
            self.rewards_chosen,
            self.rewards_rejected,
            self.accuracies,
            self.logps_chosen,
            self.logps_rejected,
            self.logits_chosen,
            self.logits_rejected,
            self.chosen_tokens,
            self.rejected_tokens,
            self.entropy,
            self.num_tokens,
            self.nll,
            self.nll_tokens,
            self.log_odds_ratio,
            self.log_odds_chosen,
        ]
    }

    fn fields_mut(&mut self) -> [&mut f64; FIELDS] {
        [
            &mut self.loss,
            &mut self.pairs,
            &mut self.rewards_chosen,
            &mut self.rewards_rejected,
            &mut self.accuracies,
            &mut self.logps_chosen,
            &mut self.logps_rejected,
            &mut self.logits_chosen,
            &mut self.logits_rejected,
            &mut self.chosen_tokens,
            &mut self.rejected_tokens,
            &mut self.entropy,
            &mut self.num_tokens,
            &mut self.nll,
            &mut self.nll_tokens,
            &mut self.log_odds_ratio,
            &mut self.log_odds_chosen,
        ]
    }

    /// The means TRL reports.
    pub fn finish(&self, cfg: &LossConfig) -> Metrics {
        let per = |sum: f64, count: f64| if count > 0.0 { sum / count } else { 0.0 };
        let family = cfg.family();
        // TRL's CPOTrainer logs 0 where the NLL is not trained (cpo_alpha = 0).
        let nll = family.map(|_| if cfg.nll_weight() == 0.0 { 0.0 } else { per(self.nll, self.nll_tokens) });
        let orpo = family == Some(LossType::Orpo);
        Metrics {
            nll_loss: nll,
            log_odds_ratio: orpo.then(|| per(self.log_odds_ratio, self.pairs)),
            log_odds_chosen: orpo.then(|| per(self.log_odds_chosen, self.pairs)),
            loss: per(self.loss, self.pairs),
            rewards_chosen: per(self.rewards_chosen, self.pairs),
            rewards_rejected: per(self.rewards_rejected, self.pairs),
            rewards_accuracies: per(self.accuracies, self.pairs),
            rewards_margins: per(self.rewards_chosen - self.rewards_rejected, self.pairs),
            logps_chosen: per(self.logps_chosen, self.pairs),
            logps_rejected: per(self.logps_rejected, self.pairs),
            logits_chosen: per(self.logits_chosen, self.chosen_tokens),
            logits_rejected: per(self.logits_rejected, self.rejected_tokens),
            entropy: per(self.entropy, self.chosen_tokens + self.rejected_tokens),
            num_tokens: self.num_tokens,
        }
    }
}

/// The metrics under TRL's names, in TRL's order.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Metrics {
    pub loss: f64,
    #[serde(rename = "rewards/chosen")]
    pub rewards_chosen: f64,
    #[serde(rename = "rewards/rejected")]
    pub rewards_rejected: f64,
    #[serde(rename = "rewards/accuracies")]
    pub rewards_accuracies: f64,
    #[serde(rename = "rewards/margins")]
    pub rewards_margins: f64,
    #[serde(rename = "logps/chosen")]
    pub logps_chosen: f64,
    #[serde(rename = "logps/rejected")]
    pub logps_rejected: f64,
    #[serde(rename = "logits/chosen")]
    pub logits_chosen: f64,
    #[serde(rename = "logits/rejected")]
    pub logits_rejected: f64,
    pub entropy: f64,
    pub num_tokens: f64,
    /// The reference-free family's (CPOTrainer, ORPOTrainer): the chosen sequences' NLL.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nll_loss: Option<f64>,
    /// ORPO's mean `log σ(log-odds ratio)` and mean log-odds ratio.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log_odds_ratio: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log_odds_chosen: Option<f64>,
}

impl Metrics {
    /// The reference-free family's metrics beyond [`Metrics::named`], under its trainers' names
    /// (`eval` shows them, training logs them to TensorBoard; they are not `metrics.csv` columns).
    pub fn extra(&self) -> Vec<(&'static str, f64)> {
        [
            ("nll_loss", self.nll_loss),
            ("log_odds_ratio", self.log_odds_ratio),
            ("log_odds_chosen", self.log_odds_chosen),
        ]
        .into_iter()
        .filter_map(|(name, v)| v.map(|v| (name, v)))
        .collect()
    }

    /// `(TRL name, value)` in order, for tables and CSV headers.
    pub fn named(&self) -> [(&'static str, f64); 11] {
        [
            ("loss", self.loss),
            ("rewards/chosen", self.rewards_chosen),
            ("rewards/rejected", self.rewards_rejected),
            ("rewards/accuracies", self.rewards_accuracies),
            ("rewards/margins", self.rewards_margins),
            ("logps/chosen", self.logps_chosen),
            ("logps/rejected", self.logps_rejected),
            ("logits/chosen", self.logits_chosen),
            ("logits/rejected", self.logits_rejected),
            ("entropy", self.entropy),
            ("num_tokens", self.num_tokens),
        ]
    }
}
