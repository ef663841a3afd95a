//! TRL's logged metrics (`DPOTrainer._compute_loss`, "metrics" block), kept as sums and counts so
//! that a mean is always over every pair (or token) seen, whatever the batch size, and so that
//! ranks can add their sums before dividing. Evaluation divides once over the whole set; a logged
//! training row is the mean of its steps' metrics ([`Metrics::mean`]), as TRL's `log` averages
//! its calls'.

use burn::tensor::{Device, Tensor, TensorData};

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
    /// Scored tokens that are the logits' argmax (`mean_token_accuracy`'s).
    pub top1: Vec<f32>,
}

/// Scored pairs on the host, appendable across batches (the evaluation keeps the whole set).
#[derive(Debug, Clone, Default)]
pub struct ScoredPairs {
    pub chosen: SideRows,
    pub rejected: SideRows,
    /// KTO's rows (`chosen`: their own sequences, `rejected`: their KL sequences): 1 where
    /// desirable, 0 where not; empty for pairs.
    pub desirable: Vec<f32>,
}

impl ScoredPairs {
    /// Copies one batch's scores to the host (one read); `ref_logps` holds the reference's `[2B]`
    /// sequence log-probs (zeros when reference-free).
    ///
    /// # Panics
    /// If `policy` was scored without statistics.
    pub fn from_batch(batch: &DeviceBatch, policy: &SequenceScores, ref_logps: &[f32]) -> Self {
        let b = batch.pairs;
        let stats = policy.stats.as_ref().expect("the policy is scored with statistics");
        // One read of the seven `[2B]` columns: on a GPU each read waits for the queued kernels.
        let columns = [
            &policy.logps,
            &policy.token_logps,
            &stats.tokens,
            &stats.entropy,
            &stats.mean_logits,
            &stats.wpo,
            &stats.top1,
        ];
        let values = host(&Tensor::cat(columns.iter().map(|t| (*t).clone().inner()).collect(), 0));
        let s = batch.sequences;
        let [logps, token_logps, tokens, entropy, mean_logits, wpo, top1] =
            std::array::from_fn(|i| &values[i * s..(i + 1) * s]);
        let side = |range: std::ops::Range<usize>| SideRows {
            logps: logps[range.clone()].to_vec(),
            ref_logps: ref_logps[range.clone()].to_vec(),
            token_logps: token_logps[range.clone()].to_vec(),
            lengths: batch.completion_lengths[range.clone()].to_vec(),
            tokens: tokens[range.clone()].to_vec(),
            entropy: entropy[range.clone()].to_vec(),
            mean_logits: mean_logits[range.clone()].to_vec(),
            wpo: wpo[range.clone()].to_vec(),
            top1: top1[range].to_vec(),
        };
        Self { chosen: side(0..b), rejected: side(b..2 * b), desirable: batch.desirable.clone() }
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
            mine.top1.extend(theirs.top1);
        }
        self.desirable.extend(other.desirable);
    }

    /// Every per-pair vector, chosen side then rejected, then KTO's labels (for collectives; the
    /// labels come back as zeros for pairs, which read none).
    pub fn columns(&self) -> Vec<Vec<f32>> {
        [&self.chosen, &self.rejected]
            .into_iter()
            .flat_map(|s| {
                [
                    &s.logps,
                    &s.ref_logps,
                    &s.token_logps,
                    &s.lengths,
                    &s.tokens,
                    &s.entropy,
                    &s.mean_logits,
                    &s.wpo,
                    &s.top1,
                ]
                .map(Clone::clone)
            })
            // Every rank sends every column at its length: zeros where pairs have no label.
            .chain([if self.desirable.is_empty() { vec![0.0; self.len()] } else { self.desirable.clone() }])
            .collect()
    }

    /// The inverse of [`ScoredPairs::columns`].
    /// The pairs in runs of `n` (the last one short), in order; one empty run where there are none.
    pub fn chunks(&self, n: usize) -> Vec<ScoredPairs> {
        let len = self.len();
        if len <= n {
            return vec![self.clone()];
        }
        let columns = self.columns();
        (0..len)
            .step_by(n)
            .map(|start| {
                let end = (start + n).min(len);
                Self::from_columns(columns.iter().map(|c| c[start..end].to_vec()).collect())
            })
            .collect()
    }

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
            top1: it.next().unwrap_or_default(),
        };
        let chosen = side();
        let rejected = side();
        Self { chosen, rejected, desirable: it.next().unwrap_or_default() }
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
            desirable: self.desirable.clone(),
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
    /// KTO's: the batches' KL estimates and their number, and the desirable rows (the `*_chosen`
    /// sums are theirs, the `*_rejected` ones the undesirable rows').
    pub kl: f64,
    pub kl_batches: f64,
    pub desirable: f64,
    /// The chosen completions' tokens that are the logits' argmax (DPO's `mean_token_accuracy`
    /// over `chosen_tokens`).
    pub top1_chosen: f64,
}

/// Number of [`MetricSums`] fields (the values ranks add up).
pub const FIELDS: usize = 21;

impl MetricSums {
    /// Adds the pairs of `scored`, whose mean loss was `loss`.
    pub fn add(&mut self, scored: &ScoredPairs, loss: f64, cfg: &LossConfig) {
        let n = scored.len() as f64;
        self.loss += loss * n;
        self.pairs += n;
        if cfg.is_kto() {
            return self.add_kto(scored, cfg);
        }
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
            self.top1_chosen += c.top1[i] as f64;
            self.nll -= c.token_logps[i] as f64;
            self.nll_tokens += c.tokens[i] as f64;
        }
    }

    /// KTO's sums: one KL estimate for the batch, the rest per row under its label.
    fn add_kto(&mut self, scored: &ScoredPairs, cfg: &LossConfig) {
        let (own, kl) = (&scored.chosen, &scored.rejected);
        // TRL logs 0 where it estimates no KL (apo_zero_unpaired).
        self.kl += if cfg.kl_rows() { super::kto::kl_estimate(&kl.logps, &kl.ref_logps) } else { 0.0 };
        self.kl_batches += 1.0;
        for (i, &desirable) in scored.desirable.iter().enumerate() {
            let reward = cfg.beta * (own.logps[i] as f64 - own.ref_logps[i] as f64);
            let (rewards, logps, logits, tokens) = match desirable > 0.5 {
                true => {
                    (&mut self.rewards_chosen, &mut self.logps_chosen, &mut self.logits_chosen, &mut self.chosen_tokens)
                }
                false => (
                    &mut self.rewards_rejected,
                    &mut self.logps_rejected,
                    &mut self.logits_rejected,
                    &mut self.rejected_tokens,
                ),
            };
            *rewards += reward;
            *logps += own.logps[i] as f64;
            *logits += own.mean_logits[i] as f64;
            *tokens += own.tokens[i] as f64;
            self.entropy += own.entropy[i] as f64;
            self.desirable += desirable as f64;
        }
    }

    /// Adds another set of sums (another rank's, or another logging window's).
    pub fn merge(&mut self, o: &Self) {
        for (a, b) in self.fields_mut().into_iter().zip(o.fields()) {
            *a += b;
        }
    }

    /// [`MetricSums::from_fields`] of a slice (zeros past its end).
    pub fn from_slice(f: &[f64]) -> Self {
        Self::from_fields(std::array::from_fn(|i| f.get(i).copied().unwrap_or(0.0)))
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
            self.kl,
            self.kl_batches,
            self.desirable,
            self.top1_chosen,
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
            &mut self.kl,
            &mut self.kl_batches,
            &mut self.desirable,
            &mut self.top1_chosen,
        ]
    }

    /// The means TRL reports.
    pub fn finish(&self, cfg: &LossConfig) -> Metrics {
        if cfg.is_kto() {
            return self.finish_kto();
        }
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
            rewards_accuracies: Some(per(self.accuracies, self.pairs)),
            rewards_margins: per(self.rewards_chosen - self.rewards_rejected, self.pairs),
            logps_chosen: per(self.logps_chosen, self.pairs),
            logps_rejected: per(self.logps_rejected, self.pairs),
            logits_chosen: per(self.logits_chosen, self.chosen_tokens),
            logits_rejected: per(self.logits_rejected, self.rejected_tokens),
            entropy: per(self.entropy, self.chosen_tokens + self.rejected_tokens),
            num_tokens: self.num_tokens,
            // DPOTrainer's; CPOTrainer and ORPOTrainer log none.
            mean_token_accuracy: family.is_none().then(|| per(self.top1_chosen, self.chosen_tokens)),
            kl: None,
            absent: &[],
        }
    }

    /// KTOTrainer's means: rewards and log-probs over each label's rows, no accuracy (its rows
    /// are not paired), the KL estimate over the batches.
    fn finish_kto(&self) -> Metrics {
        let undesirable = self.pairs - self.desirable;
        let (chosen, rejected) = (per(self.rewards_chosen, self.desirable), per(self.rewards_rejected, undesirable));
        Metrics {
            loss: per(self.loss, self.pairs),
            rewards_chosen: chosen,
            rewards_rejected: rejected,
            rewards_accuracies: None,
            rewards_margins: chosen - rejected,
            logps_chosen: per(self.logps_chosen, self.desirable),
            logps_rejected: per(self.logps_rejected, undesirable),
            logits_chosen: per(self.logits_chosen, self.chosen_tokens),
            logits_rejected: per(self.logits_rejected, self.rejected_tokens),
            entropy: per(self.entropy, self.chosen_tokens + self.rejected_tokens),
            num_tokens: self.num_tokens,
            mean_token_accuracy: None,
            nll_loss: None,
            log_odds_ratio: None,
            log_odds_chosen: None,
            kl: Some(per(self.kl, self.kl_batches)),
            absent: match (self.desirable > 0.0, undesirable > 0.0) {
                (false, _) => NO_DESIRABLE,
                (true, false) => NO_UNDESIRABLE,
                (true, true) => &[],
            },
        }
    }
}

/// The metrics, under TRL's names through [`Metrics::named`] and [`Metrics::extra`] (every
/// output, the eval JSON included, goes through them, so an absent metric is never printed).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Metrics {
    pub loss: f64,
    pub rewards_chosen: f64,
    pub rewards_rejected: f64,
    /// Paired losses only (KTO's rows have no partner to beat).
    pub rewards_accuracies: Option<f64>,
    pub rewards_margins: f64,
    pub logps_chosen: f64,
    pub logps_rejected: f64,
    pub logits_chosen: f64,
    pub logits_rejected: f64,
    pub entropy: f64,
    pub num_tokens: f64,
    /// DPOTrainer's share of the chosen completions' tokens that are the logits' argmax.
    pub mean_token_accuracy: Option<f64>,
    /// The reference-free family's (CPOTrainer, ORPOTrainer): the chosen sequences' NLL.
    pub nll_loss: Option<f64>,
    /// ORPO's mean `log σ(log-odds ratio)` and mean log-odds ratio.
    pub log_odds_ratio: Option<f64>,
    pub log_odds_chosen: Option<f64>,
    /// KTO's KL estimate (mean over batches), under KTOTrainer's name.
    pub kl: Option<f64>,
    /// Metrics with nothing to average (KTO's `*/chosen` over batches without a desirable row,
    /// `*/rejected` without an undesirable one, and then the margin): left out, as TRL leaves
    /// them out of its log, rather than shown as 0.
    pub absent: &'static [&'static str],
}

/// A mean, 0 over nothing.
fn per(sum: f64, count: f64) -> f64 {
    if count > 0.0 { sum / count } else { 0.0 }
}

const NO_DESIRABLE: &[&str] = &["rewards/chosen", "logps/chosen", "logits/chosen", "rewards/margins"];
const NO_UNDESIRABLE: &[&str] = &["rewards/rejected", "logps/rejected", "logits/rejected", "rewards/margins"];
const NO_MARGIN: &[&str] = &["rewards/margins"];

impl Metrics {
    /// The mean of `parts` (each a step's), each metric over the parts that have it, as TRL's
    /// `log` averages the values each `compute_loss` call appended; `None` without parts.
    pub fn mean(parts: &[Metrics]) -> Option<Metrics> {
        let first = *parts.first()?;
        let mean = |name: &str, get: &dyn Fn(&Metrics) -> Option<f64>| {
            let values: Vec<f64> = parts.iter().filter(|m| !m.absent.contains(&name)).filter_map(get).collect();
            (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
        };
        let always = |name: &str, get: fn(&Metrics) -> f64| mean(name, &|m| Some(get(m))).unwrap_or(0.0);
        let nowhere = |name: &str| parts.iter().all(|m| m.absent.contains(&name));
        let absent = match (nowhere("rewards/chosen"), nowhere("rewards/rejected"), nowhere("rewards/margins")) {
            (true, _, _) => NO_DESIRABLE,
            (_, true, _) => NO_UNDESIRABLE,
            (_, _, true) => NO_MARGIN,
            _ => &[],
        };
        Some(Metrics {
            loss: always("loss", |m| m.loss),
            rewards_chosen: always("rewards/chosen", |m| m.rewards_chosen),
            rewards_rejected: always("rewards/rejected", |m| m.rewards_rejected),
            rewards_accuracies: mean("rewards/accuracies", &|m| m.rewards_accuracies),
            rewards_margins: always("rewards/margins", |m| m.rewards_margins),
            logps_chosen: always("logps/chosen", |m| m.logps_chosen),
            logps_rejected: always("logps/rejected", |m| m.logps_rejected),
            logits_chosen: always("logits/chosen", |m| m.logits_chosen),
            logits_rejected: always("logits/rejected", |m| m.logits_rejected),
            entropy: always("entropy", |m| m.entropy),
            num_tokens: first.num_tokens,
            mean_token_accuracy: mean("mean_token_accuracy", &|m| m.mean_token_accuracy),
            nll_loss: mean("nll_loss", &|m| m.nll_loss),
            log_odds_ratio: mean("log_odds_ratio", &|m| m.log_odds_ratio),
            log_odds_chosen: mean("log_odds_chosen", &|m| m.log_odds_chosen),
            kl: mean("kl", &|m| m.kl),
            absent,
        })
    }

    /// The reference-free family's metrics beyond [`Metrics::named`], under its trainers' names
    /// (`eval` shows them, training logs them to TensorBoard; they are not `metrics.csv` columns).
    pub fn extra(&self) -> Vec<(&'static str, f64)> {
        [
            ("nll_loss", self.nll_loss),
            ("log_odds_ratio", self.log_odds_ratio),
            ("log_odds_chosen", self.log_odds_chosen),
            ("kl", self.kl),
        ]
        .into_iter()
        .filter_map(|(name, v)| v.map(|v| (name, v)))
        .collect()
    }

    /// The step line's metrics: the loss, the family's own (nll_loss, kl), the accuracy where
    /// pairs have one, the margin; `sep` between them.
    pub fn headline(&self, sep: &str) -> String {
        let mut parts = vec![format!("loss {:.4}", self.loss)];
        parts.extend(self.nll_loss.map(|v| format!("nll_loss {v:.4}")));
        parts.extend(self.kl.map(|v| format!("kl {v:.4}")));
        parts.extend(self.rewards_accuracies.map(|v| format!("rewards/accuracies {v:.3}")));
        if !self.absent.contains(&"rewards/margins") {
            parts.push(format!("rewards/margins {:.4}", self.rewards_margins));
        }
        parts.join(sep)
    }

    /// `(TRL name, value)` in order, for tables and CSV rows (a metric the trainer does not log
    /// is left out).
    pub fn named(&self) -> Vec<(&'static str, f64)> {
        let accuracies = self.rewards_accuracies.map(|v| ("rewards/accuracies", v));
        [("loss", self.loss), ("rewards/chosen", self.rewards_chosen), ("rewards/rejected", self.rewards_rejected)]
            .into_iter()
            .chain(accuracies)
            .chain([
                ("rewards/margins", self.rewards_margins),
                ("logps/chosen", self.logps_chosen),
                ("logps/rejected", self.logps_rejected),
                ("logits/chosen", self.logits_chosen),
                ("logits/rejected", self.logits_rejected),
                ("entropy", self.entropy),
                ("num_tokens", self.num_tokens),
            ])
            .chain(self.mean_token_accuracy.map(|v| ("mean_token_accuracy", v)))
            .filter(|(name, _)| !self.absent.contains(name))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A step's KTO metrics: desirable rows only, undesirable only, or both.
    fn kto_step(loss: f64, desirable: bool, undesirable: bool) -> Metrics {
        let sums = MetricSums {
            loss: loss * 2.0,
            pairs: 2.0,
            rewards_chosen: if desirable { 1.0 } else { 0.0 },
            rewards_rejected: if undesirable { -1.0 } else { 0.0 },
            desirable: f64::from(u8::from(desirable)) + f64::from(u8::from(desirable && !undesirable)),
            ..MetricSums::default()
        };
        sums.finish_kto()
    }

    /// Each metric is averaged over the steps that have it (TRL appends a side's values only for
    /// a call with rows of that label, and the margin only with both), and a metric no step has
    /// stays left out.
    #[test]
    fn the_mean_of_steps_takes_each_metric_where_it_is() {
        let only_chosen = kto_step(0.5, true, false);
        let both = kto_step(0.25, true, true);
        assert_eq!(only_chosen.absent, NO_UNDESIRABLE);
        let m = Metrics::mean(&[only_chosen, both]).unwrap();
        assert_eq!(m.loss, 0.375);
        assert_eq!(m.rewards_chosen, (only_chosen.rewards_chosen + both.rewards_chosen) / 2.0);
        assert_eq!((m.rewards_rejected, m.rewards_margins), (both.rewards_rejected, both.rewards_margins));
        assert!(m.absent.is_empty());
        let m = Metrics::mean(&[only_chosen, only_chosen]).unwrap();
        assert_eq!(m.absent, NO_UNDESIRABLE);
        assert!(!m.named().iter().any(|(n, _)| *n == "rewards/rejected" || *n == "rewards/margins"));
        let m = Metrics::mean(&[only_chosen, kto_step(0.5, false, true)]).unwrap();
        assert_eq!(m.absent, NO_MARGIN);
        assert!(Metrics::mean(&[]).is_none());
    }
}
