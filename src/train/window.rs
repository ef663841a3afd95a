//! The logging window: what the optimizer steps since the last log did, kept on the device until
//! a logging step reads it back (one host sync per log, as nanoGPT), then reduced over the ranks
//! into one `metrics.csv` row with TRL's metric names and a one-line status.

use std::time::Instant;

use burn::tensor::Tensor;

use super::Workers;
use super::checkpoint::TrainerState;
use super::context::Objective;
use super::log::{MetricsRow, Split};
use crate::config::LossConfig;
use crate::data::Batch;
use crate::dpo::logps::{DeviceBatch, SequenceScores};
use crate::dpo::metrics::{FIELDS, MetricSums, Metrics, ScoredPairs};
use crate::model::host;

/// Token positions computed by forward passes, and those padded rows of the same sequences hold.
#[derive(Debug, Clone, Copy, Default)]
pub struct Positions {
    pub computed: f64,
    pub padded: f64,
    /// The most token positions one micro-batch's rows held (before CUDA's padding to few
    /// shapes) and the most predictions one scored: the largest micro-batch a memory estimate
    /// of this run takes (check-gpu's `BatchTokens`).
    pub largest: [usize; 2],
}

impl Positions {
    /// Adds another count.
    pub fn add(&mut self, other: Positions) {
        self.computed += other.computed;
        self.padded += other.padded;
        self.largest = [0, 1].map(|i| self.largest[i].max(other.largest[i]));
    }

    /// The share of the padded positions not computed.
    pub fn avoided(&self) -> f64 {
        if self.padded > 0.0 { 1.0 - self.computed / self.padded } else { 0.0 }
    }
}

/// What the steps since the last log did, kept on the device until the log reads it.
pub struct Window {
    started: Instant,
    /// Optimizer steps taken.
    pub steps: usize,
    pairs: usize,
    tokens: f64,
    /// Token positions the forward passes computed, and those TRL's padded rows would hold.
    pub positions: Positions,
    /// DPO: each micro-batch's step (in the window), batch, policy scores, reference rows and
    /// loss, on the device.
    pub pending: Vec<(usize, DeviceBatch, SequenceScores, Tensor<1>, Tensor<1>)>,
    /// SFT: each micro-batch's (scaled) loss.
    pub losses: Vec<Tensor<1>>,
    /// SFT: each micro-batch's step (in the window) and its chosen tokens' entropy, argmax hits
    /// and count (`[3]`, summed on the device).
    pub token_stats: Vec<(usize, Tensor<1>)>,
}

impl Window {
    /// A window opening now.
    pub fn new() -> Self {
        Self {
            started: Instant::now(),
            steps: 0,
            pairs: 0,
            tokens: 0.0,
            positions: Positions::default(),
            pending: Vec::new(),
            losses: Vec::new(),
            token_stats: Vec::new(),
        }
    }

    /// Counts a micro-batch's pairs and tokens (throughput) and the `computed` positions its
    /// upload holds (CUDA's padding to few shapes included).
    pub fn count(&mut self, batch: &Batch, computed: usize) {
        self.pairs += batch.pairs;
        self.tokens += batch.tokens() as f64;
        self.positions.computed += computed as f64;
        self.positions.padded += batch.padded_tokens() as f64;
        self.positions
            .add(Positions { largest: [batch.computed_tokens(), batch.labels.len()], ..Positions::default() });
    }

    /// The logged row and a one-line status, TRL's names in TRL's order, over every rank.
    pub fn finish(
        self,
        state: &TrainerState,
        lr: f64,
        grad_norm: Option<f64>,
        objective: Objective,
        loss_cfg: &LossConfig,
        workers: Workers,
    ) -> anyhow::Result<(MetricsRow, String)> {
        let seconds = self.started.elapsed().as_secs_f64().max(1e-9);
        let mut throughput = [self.pairs as f64, self.tokens];
        workers.sum_f64(&mut throughput)?;
        let [pairs, tokens] = throughput;
        let mut row = MetricsRow::empty(state.step, state.epoch, Split::Train, state.elapsed_seconds);
        let status = match objective {
            Objective::Sft => {
                // Each SFT micro-batch loss is already a share of its step's token mean, over
                // every rank: summing gives the steps' losses.
                let mut total = [self.losses.iter().map(|l| host(l)[0] as f64).sum::<f64>()];
                workers.sum_f64(&mut total)?;
                let loss = total[0] / self.steps.max(1) as f64;
                row.set_metric("loss", loss);
                let [entropy, accuracy] = self.sft_token_metrics(workers)?;
                row.set_metric("entropy", entropy);
                row.set_metric("mean_token_accuracy", accuracy);
                format!("loss {loss:.4} | mean_token_accuracy {accuracy:.4}")
            }
            Objective::Dpo => {
                // TRL logs the mean of what each `compute_loss` call appended: a step's, over
                // every rank, at `gradient_accumulation_steps = 1`. A step here pools its
                // micro-batches and ranks; the row is the mean of the steps.
                let last = self.steps.max(1) - 1;
                let mut steps = vec![MetricSums::default(); last + 1];
                for (step, batch, scores, ref_rows, loss) in &self.pending {
                    let scored = ScoredPairs::from_batch(batch, scores, &host(ref_rows));
                    steps[(*step).min(last)].add(&scored, host(loss)[0] as f64, loss_cfg);
                }
                let mut fields: Vec<f64> = steps.iter().flat_map(MetricSums::fields).collect();
                workers.sum_f64(&mut fields)?;
                let steps: Vec<Metrics> = fields
                    .chunks(FIELDS)
                    .map(MetricSums::from_slice)
                    .filter(|s| s.pairs > 0.0)
                    .map(|s| s.finish(loss_cfg))
                    .collect();
                let m = Metrics::mean(&steps).unwrap_or_else(|| MetricSums::default().finish(loss_cfg));
                row.record(&m);
                m.headline(" | ")
            }
        };
        row.set_metric("num_tokens", state.num_tokens);
        row.learning_rate = Some(lr);
        row.grad_norm = grad_norm;
        row.pairs_per_second = Some(pairs / seconds);
        row.tokens_per_second = Some(tokens / seconds);
        let status = format!(
            "{status} | lr {lr:.2e} | grad_norm {:.3} | {:.1} pairs/s",
            grad_norm.unwrap_or(f64::NAN),
            pairs / seconds
        );
        Ok((row, status))
    }
}

impl Window {
    /// SFT's `entropy` and `mean_token_accuracy` as `SFTTrainer` logs them: each step's over its
    /// chosen tokens on every rank (0 without any), the row the mean of its steps.
    fn sft_token_metrics(&self, workers: Workers) -> anyhow::Result<[f64; 2]> {
        let mut sums = vec![0.0; 3 * self.steps.max(1)];
        let last = self.steps.max(1) - 1;
        for (step, stats) in &self.token_stats {
            let at = 3 * (*step).min(last);
            for (sum, value) in sums[at..at + 3].iter_mut().zip(host(stats)) {
                *sum += value as f64;
            }
        }
        workers.sum_f64(&mut sums)?;
        let per_step: Vec<[f64; 2]> = sums
            .chunks(3)
            .map(|s| match s[2] > 0.0 {
                true => [s[0] / s[2], s[1] / s[2]],
                false => [0.0, 0.0],
            })
            .collect();
        let n = per_step.len() as f64;
        Ok([0, 1].map(|i| per_step.iter().map(|m| m[i]).sum::<f64>() / n))
    }
}

impl Default for Window {
    fn default() -> Self {
        Self::new()
    }
}

/// A stage's run in this process (from its start or its resume), for the metrics transformers
/// logs when training ends (`Trainer._finalize_training`): the loss summed over the logged
/// windows, each window's mean times its steps (every step of a finished stage is in one).
pub struct Session {
    started: Instant,
    first_step: u64,
    last_logged: u64,
    loss_sum: f64,
}

impl Session {
    pub fn start(step: u64) -> Self {
        Self { started: Instant::now(), first_step: step, last_logged: step, loss_sum: 0.0 }
    }

    /// Counts a logged training row's window.
    pub fn logged(&mut self, row: &MetricsRow) {
        if let Some(loss) = row.metric("loss") {
            self.loss_sum += loss * row.step.saturating_sub(self.last_logged) as f64;
        }
        self.last_logged = row.step;
    }

    /// `train_runtime`, `train_samples_per_second`, `train_steps_per_second` and `train_loss` at
    /// step `state.step` of `max_steps`, rounded as transformers' `speed_metrics` rounds them;
    /// `samples` are the whole schedule's (`max_steps` x the global batch, else the pairs x
    /// `num_train_epochs`), of which this session ran its share. `total_flos` is not counted.
    pub fn summary(&self, state: &TrainerState, max_steps: u64, samples: f64) -> Vec<(String, f64)> {
        let trained = state.step.saturating_sub(self.first_step) as f64;
        let share = samples * trained / max_steps.max(1) as f64;
        let mut out = super::log::speed_metrics("train", self.started.elapsed().as_secs_f64(), share, trained);
        out.push(("train_loss".to_owned(), self.loss_sum / trained.max(0.001)));
        out
    }
}
