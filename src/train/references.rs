//! The frozen reference of a DPO stage: its log-probs on every dataset and its sample completions,
//! computed once (the reference model itself is dropped when nothing needs it per step), and the
//! held-out evaluations and sample files that compare the policy against it.
//!
//! Evaluation and the reference pass are sharded: each rank scores every `world_size`-th pair and
//! the columns are gathered, so every number is the one a single process computes.

use std::path::Path;
use std::sync::atomic::AtomicBool;

use anyhow::Context;
use burn::tensor::{Device, Tensor};
use dpo_torch::transfers;

use super::checkpoint::TrainerState;
use super::context::{Progress, Run};
use super::log::{MetricsRow, MetricsWriter, Split};
use super::partition::Partitioned;
use super::ref_cache;
use super::samples::{Sample, write_samples};
use super::workers::Workers;
use crate::data::{TokenizedPair, TokenizerError};
use crate::dist::DistError;
use crate::dpo::logps::{Collation, DeviceBatch, RefLogps, Stats, reference_logps, score};
use crate::dpo::metrics::{Metrics, ScoredPairs};
use crate::dpo::score::{metrics_of, score_pairs};
use crate::model::Llama;
use crate::model::generate::{SamplingConfig, generate, rng};

/// A DPO stage's reference and what it computed.
pub struct References {
    /// Per-step reference, when the training log-probs are not precomputed.
    model: Option<PerStep>,
    train: Option<RefLogps>,
    eval: RefLogps,
    test: RefLogps,
    eval_samples: Vec<String>,
    test_samples: Vec<String>,
    reference_free: bool,
    /// How held-out pairs are batched (`per_device_eval_batch_size`).
    collation: Collation,
}

impl References {
    /// Scores the held-out sets (and, with `precompute_ref_log_probs`, the training set) under
    /// `reference` (`None` for reference-free training); `None` when a Ctrl-C stopped the
    /// scoring (the run then stops before its first step).
    pub fn prepare(
        run: &Run,
        reference: Option<Llama>,
        collation: Collation,
        progress: &mut dyn Progress,
    ) -> anyhow::Result<Option<Self>> {
        let data = run.data;
        let Some(reference) = reference else {
            return Ok(Some(Self {
                model: None,
                train: Some(RefLogps::zeros(data.train.len())),
                eval: RefLogps::zeros(data.eval.len()),
                test: RefLogps::zeros(data.test.len()),
                eval_samples: Vec::new(),
                test_samples: Vec::new(),
                reference_free: true,
                collation,
            }));
        };
        let held_out = data.eval.len() + data.test.len();
        if held_out > 0 {
            let kl = if run.cfg.loss.kl_rows() { " (with their KL sequences)" } else { "" };
            let examples = run.cfg.loss.examples();
            progress.line(&format!("scoring {held_out} held-out {examples}{kl} under the reference"));
        }
        let Some(eval) = sharded_reference_logps(&reference, &data.eval, &collation, run)? else { return Ok(None) };
        let Some(test) = sharded_reference_logps(&reference, &data.test, &collation, run)? else { return Ok(None) };
        let main = run.rt.workers.is_main();
        let eval_samples = if main { sample_texts(&reference, &data.eval, run) } else { Vec::new() };
        let test_samples = if main { sample_texts(&reference, &data.test, run) } else { Vec::new() };
        let (model, train) = if run.cfg.precompute_ref_log_probs {
            let compute = || sharded_reference_logps(&reference, &data.train, &collation, run);
            let Some(train) = ref_cache::load_or_compute(&reference, run, &collation, progress, compute)? else {
                return Ok(None);
            };
            (None, Some(train))
        } else {
            (Some(PerStep::Whole(reference)), None)
        };
        Ok(Some(Self { model, train, eval, test, eval_samples, test_samples, reference_free: false, collation }))
    }

    /// ZeRO-3: the per-step reference keeps this rank's slices only; frozen parameters that
    /// `shared` (the policy, whose base the reference is) holds are shared with it.
    pub fn partition(&mut self, shard: (usize, usize), shared: Option<&Partitioned>) {
        if let Some(PerStep::Whole(model)) = self.model.take() {
            self.model = Some(PerStep::Parted(Partitioned::new(model, shard, shared)));
        }
    }

    /// The collectives of [`References::train_rows`] without its compute (a rank short of
    /// micro-batches keeps in step with the others).
    pub fn idle_rows(&self, run: &Run) -> Result<(), DistError> {
        match (&self.train, &self.model) {
            (None, Some(PerStep::Parted(parts))) => parts.idle(run.rt.workers),
            _ => Ok(()),
        }
    }

    /// The work that scores the training pairs of `batch` under a per-step reference that is whole
    /// on this rank: no collectives, so it may run on another thread. `None` where the rows come
    /// from the precomputed table or a partitioned reference.
    pub fn whole_rows<'a>(&'a self, batch: &DeviceBatch) -> Option<impl FnOnce() -> Tensor<1> + Send + 'a> {
        let (None, Some(PerStep::Whole(model))) = (&self.train, &self.model) else { return None };
        // The policy's upload (the same LD-DPO weights, as TRL scores both), outside autodiff.
        let rows = batch.plain();
        Some(move || score(model, &rows, Stats::Off).logps)
    }

    /// The `[2B]` reference log-probs of the training pairs `ids` (uploaded as `batch`), on the
    /// device: the policy's loss reads them there.
    pub fn train_rows(&self, ids: &[usize], batch: &DeviceBatch, run: &Run) -> Result<Tensor<1>, DistError> {
        if let Some(work) = self.whole_rows(batch) {
            return Ok(work());
        }
        Ok(match (&self.train, &self.model) {
            (Some(table), _) => transfers::upload_floats(&table.rows(ids), &run.rt.device),
            (None, Some(PerStep::Parted(parts))) => parts.score(&batch.plain(), run.rt.workers)?.logps,
            (None, Some(PerStep::Whole(_))) => unreachable!("a whole reference scores in `whole_rows`"),
            (None, None) => unreachable!("a reference without a model has precomputed log-probs"),
        })
    }

    /// The held-out metrics (rank 0 also logs them into `out` and rewrites the samples in `dir`);
    /// `None` without held-out data.
    pub fn evaluate(
        &self,
        policy: &Llama,
        run: &Run,
        dir: &Path,
        state: &TrainerState,
        out: Option<&mut MetricsWriter>,
        progress: &mut dyn Progress,
    ) -> anyhow::Result<Option<Metrics>> {
        if run.data.eval.is_empty() {
            return Ok(None);
        }
        let started = std::time::Instant::now();
        let Some(metrics) = sharded_metrics(policy, &run.data.eval, &self.eval, &self.collation, run)? else {
            progress.line(&format!("eval step {}: stopped by the interrupt", state.step));
            return Ok(None);
        };
        let runtime = started.elapsed().as_secs_f64();
        let Some(out) = out else { return Ok(Some(metrics)) };
        let mut row = MetricsRow::empty(state.step, state.epoch, Split::Eval, state.elapsed_seconds);
        row.record(&metrics);
        row.set_metric("num_tokens", state.num_tokens);
        out.append_with(&row, &eval_speed(runtime, run.data.eval.len(), run))?;
        progress.line(&format!("eval step {} | {}", state.step, metrics.headline(" | ")));
        let title = format!("step {}", state.step);
        let path = dir.join("samples_val.txt");
        let text = self.write_samples(policy, run, &path, &run.data.eval, &self.eval_samples, &title)?;
        if let (Some(events), Some(text)) = (out.tensorboard(), text) {
            // Indented four spaces, the text plugin's markdown shows it as written.
            let block: String = text.lines().map(|l| format!("    {l}\n")).collect();
            events
                .text("eval/samples", state.step, &block)
                .with_context(|| format!("cannot write `{}`", events.path().display()))?;
        }
        Ok(Some(metrics))
    }

    /// The test set's metrics, once at the end (rank 0 also logs them and writes the samples);
    /// `None` when a Ctrl-C stopped the scoring.
    pub fn test(
        &self,
        policy: &Llama,
        run: &Run,
        dir: &Path,
        progress: &mut dyn Progress,
    ) -> anyhow::Result<Option<Metrics>> {
        let Some(metrics) = sharded_metrics(policy, &run.data.test, &self.test, &self.collation, run)? else {
            return Ok(None);
        };
        if !run.rt.workers.is_main() {
            return Ok(Some(metrics));
        }
        progress.line(&format!("test | {}", metrics.headline(" | ")));
        self.write_samples(policy, run, &dir.join("samples_test.txt"), &run.data.test, &self.test_samples, "final")?;
        Ok(Some(metrics))
    }

    /// The policy's, the reference's and the dataset's answers to the first held-out prompts, in
    /// `path`; the text written, if any.
    fn write_samples(
        &self,
        policy: &Llama,
        run: &Run,
        path: &Path,
        pairs: &[TokenizedPair],
        reference: &[String],
        title: &str,
    ) -> anyhow::Result<Option<String>> {
        if pairs.is_empty() || run.cfg.num_samples == 0 {
            return Ok(None);
        }
        let policy_texts = sample_texts(policy, pairs, run);
        let tok = &run.data.tokenizer;
        let samples = pairs
            .iter()
            .zip(policy_texts)
            .enumerate()
            .map(|(i, (pair, policy))| {
                Ok(Sample {
                    prompt: tok.decode(&pair.prompt_ids, false)?,
                    policy,
                    reference: if self.reference_free { "(reference-free)".to_owned() } else { reference[i].clone() },
                    chosen: tok.decode(&pair.chosen_ids, true)?,
                    desirable: pair.label,
                })
            })
            .collect::<Result<Vec<_>, TokenizerError>>()?;
        Ok(Some(write_samples(path, title, &samples)?))
    }
}

/// The reference a step scores its pairs under: whole, or partitioned (ZeRO-3).
enum PerStep {
    Whole(Llama),
    Parted(Partitioned),
}

/// The reference log-probs of every pair, each rank scoring its shard; `None` when a Ctrl-C
/// stopped any rank's scoring (the ranks agree before they gather).
fn sharded_reference_logps(
    model: &Llama,
    pairs: &[TokenizedPair],
    collation: &Collation,
    run: &Run,
) -> anyhow::Result<Option<RefLogps>> {
    let stop = Some(run.rt.interrupt);
    Ok(reference_logps_over(model, pairs, collation, (run.rt.workers, &run.rt.device), stop)?)
}

/// The reference log-probs of every pair in dataset order, on every worker: each scores its
/// shard ([`Workers::shard`]) and the columns are gathered, so they are one process's whatever
/// the world size. `None` when `stop` (a Ctrl-C) stopped any worker (they agree before they
/// gather).
pub fn reference_logps_over(
    model: &Llama,
    pairs: &[TokenizedPair],
    collation: &Collation,
    (workers, device): (Workers, &Device),
    stop: Option<&AtomicBool>,
) -> Result<Option<RefLogps>, DistError> {
    let mine: Vec<TokenizedPair> = workers.shard(pairs.len()).into_iter().map(|i| pairs[i].clone()).collect();
    let local = reference_logps(model, &mine, collation, device, stop);
    let stopped = workers.any(local.is_none())?;
    let Some(local) = local.filter(|_| !stopped) else { return Ok(None) };
    let mut columns = workers.gather_columns(pairs.len(), vec![local.chosen, local.rejected])?.into_iter();
    Ok(Some(RefLogps { chosen: columns.next().unwrap_or_default(), rejected: columns.next().unwrap_or_default() }))
}

/// The policy's scores of every pair against `reference`, in dataset order on every worker, each
/// scoring its shard, as [`reference_logps_over`].
pub fn scores_over(
    policy: &Llama,
    pairs: &[TokenizedPair],
    reference: &RefLogps,
    collation: &Collation,
    (workers, device): (Workers, &Device),
    stop: Option<&AtomicBool>,
) -> Result<Option<ScoredPairs>, DistError> {
    let mine = workers.shard(pairs.len());
    let scored = score_pairs(policy, pairs, &mine, reference, collation, device, stop);
    let stopped = workers.any(scored.is_none())?;
    let Some(scored) = scored.filter(|_| !stopped) else { return Ok(None) };
    Ok(Some(ScoredPairs::from_columns(workers.gather_columns(pairs.len(), scored.columns())?)))
}

/// transformers' speed metrics of an evaluation of `pairs` in batches of
/// `per_device_eval_batch_size` on each device: `eval/runtime`, `eval/samples_per_second`, ...
fn eval_speed(runtime: f64, pairs: usize, run: &Run) -> Vec<(String, f64)> {
    let batch = run.cfg.per_device_eval_batch_size.max(1) * run.rt.workers.world_size();
    let speed = crate::train::log::speed_metrics("eval", runtime, pairs as f64, pairs.div_ceil(batch) as f64);
    speed.into_iter().map(|(key, v)| (crate::train::log::tag(&key), v)).collect()
}

/// The loss and metrics over every pair, each rank scoring its shard; `None` when a Ctrl-C
/// stopped any rank's scoring (the ranks agree before they gather).
fn sharded_metrics(
    policy: &Llama,
    pairs: &[TokenizedPair],
    reference: &RefLogps,
    collation: &Collation,
    run: &Run,
) -> anyhow::Result<Option<Metrics>> {
    let (workers, device) = (run.rt.workers, &run.rt.device);
    let stop = Some(run.rt.interrupt);
    let Some(scored) = scores_over(policy, pairs, reference, collation, (workers, device), stop)? else {
        return Ok(None);
    };
    // TRL's evaluation step: a per-device batch on every rank, gathered.
    let per_batch = run.cfg.per_device_eval_batch_size * workers.world_size();
    Ok(Some(metrics_of(&scored, &run.cfg.loss, per_batch, device)))
}

/// Greedy completions of the first `num_samples` prompts of `pairs`.
fn sample_texts(model: &Llama, pairs: &[TokenizedPair], run: &Run) -> Vec<String> {
    let tok = &run.data.tokenizer;
    let cfg = SamplingConfig::greedy(run.cfg.max_new_tokens);
    let mut sampler = rng(run.cfg.seed);
    pairs
        .iter()
        .take(run.cfg.num_samples)
        .map(|pair| {
            let ids = generate(model, &pair.prompt_ids, 1, tok.eos_id(), &cfg, &mut sampler, &run.rt.device);
            tok.decode(&ids[0], true).unwrap_or_else(|e| format!("(cannot decode: {e})"))
        })
        .collect()
}
