//! The training loop, one stage at a time: supervised fine-tuning on the chosen completions
//! (`sft`), or DPO against a frozen reference. It reads top to bottom, as nanoGPT's `train.py`:
//! setup, then one loop that for each optimizer step takes the learning rate from a pure
//! schedule, accumulates micro-batches, clips by the global norm, steps AdamW, logs, evaluates and
//! checkpoints at fixed cadences.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use anyhow::Context;
use burn::module::Module;
use burn::tensor::{Device, FloatDType};

use super::Workers;
use super::backprop::{Checkpointing, forward_backward};
use super::checkpoint::{self, ModelFiles, TrainerState};
use super::log::{MetricsRow, MetricsWriter, Split};
use super::optim::{AdamW, AdamWConfig, GradAccumulator, LossScaler};
use super::policy::{PolicySpec, inference_copy};
use super::ref_cache;
use super::sampler::Sampler;
use super::sampler::rank_step;
use super::samples::{Sample, write_samples};
use super::schedule::Schedule;
use crate::config::TrainConfig;
use crate::data::tokenizer::Tokenizer;
use crate::data::{self, TokenizedPair};
use crate::dpo::logps::{Collation, DeviceBatch, RefLogps, reference_logps, score};
use crate::dpo::loss::{PairScores, dpo_loss};
use crate::dpo::metrics::{MetricSums, Metrics, ScoredPairs};
use crate::dpo::score::{metrics_of, score_pairs};
use crate::model::Llama;
use crate::model::generate::{SamplingConfig, generate, rng};
use crate::model::host;

/// What a stage optimises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Objective {
    /// Negative log-likelihood of the chosen completions (a token mean).
    Sft,
    /// The configured DPO loss against the reference.
    Dpo,
}

/// Where progress goes; the binary shows a bar on a terminal and plain lines otherwise.
pub trait Progress {
    /// A stage begins (or resumes at `start_step`).
    fn start(&mut self, stage: &str, start_step: u64, total_steps: u64);
    /// One optimizer step finished; `status` is a short summary of the last logged values.
    fn step(&mut self, step: u64, status: &str);
    /// A line worth keeping (logged metrics, evaluations, checkpoints).
    fn line(&mut self, text: &str);
}

/// The data of a run, tokenised once and shared by its stages.
pub struct RunData {
    pub tokenizer: Tokenizer,
    /// Where the tokenizer files live (copied into `final/`).
    pub tokenizer_dir: PathBuf,
    pub train: Vec<TokenizedPair>,
    pub eval: Vec<TokenizedPair>,
    pub test: Vec<TokenizedPair>,
}

/// One stage of a run.
#[derive(Clone, Copy)]
pub struct Stage<'a> {
    pub objective: Objective,
    /// The stage's run directory (metrics, checkpoints, plots, `final/`).
    pub dir: &'a Path,
    pub cfg: &'a TrainConfig,
    /// Peak learning rate of the stage.
    pub learning_rate: f64,
    /// Optimizer steps; `None` runs `num_train_epochs` over the training pairs.
    pub steps: Option<u64>,
    /// The starting weights (an HF directory).
    pub model_dir: &'a Path,
    /// The reference; `None` takes the starting weights.
    pub ref_dir: Option<&'a Path>,
    pub data: &'a RunData,
    /// The plain device; training runs on its autodiff twin.
    pub device: &'a Device,
    /// Continue from the newest checkpoint in `dir`.
    pub resume: bool,
    /// Set by Ctrl-C: checkpoint and stop after the current step.
    pub interrupt: &'a AtomicBool,
    /// The data-parallel workers this process is one of.
    pub workers: Workers<'a>,
}

/// How a stage ended.
#[derive(Debug, Clone)]
pub struct StageOutcome {
    /// The HF model directory written at the end (or the checkpoint when interrupted).
    pub model_dir: PathBuf,
    pub steps: u64,
    pub interrupted: bool,
    /// The last evaluation on the held-out set, and the test set's (DPO only).
    pub eval: Option<Metrics>,
    pub test: Option<Metrics>,
}

/// The per-step batch arithmetic: global batch = micro-batch × world size × accumulation.
fn batch_plan(cfg: &TrainConfig, len: usize, world_size: usize) -> anyhow::Result<Sampler> {
    let micro = cfg.per_device_train_batch_size;
    let per_pass = micro * world_size;
    let accumulation = match cfg.global_batch_size {
        Some(global) if global % per_pass != 0 => anyhow::bail!(crate::config::ConfigError::Invalid {
            key: "global_batch_size",
            message: format!(
                "{global} does not split into per_device_train_batch_size {micro} x {world_size} devices x accumulation"
            ),
        }),
        Some(global) => global / per_pass,
        None => cfg.gradient_accumulation_steps,
    };
    Ok(Sampler { len, global_batch: per_pass * accumulation, micro_batch: micro, seed: cfg.seed })
}

/// Input tokens of a pair's sequences after truncation (TRL's `num_tokens` counts every one).
fn pair_tokens(pair: &TokenizedPair, max_length: usize, objective: Objective) -> f64 {
    let p = pair.prompt_ids.len();
    let chosen = (p + pair.chosen_ids.len()).min(max_length);
    let rejected = (p + pair.rejected_ids.len()).min(max_length);
    match objective {
        Objective::Sft => chosen as f64,
        Objective::Dpo => (chosen + rejected) as f64,
    }
}

/// Runs one stage to its end, a Ctrl-C, or an error.
pub fn run_stage(stage: &Stage, progress: &mut dyn Progress) -> anyhow::Result<StageOutcome> {
    let cfg = stage.cfg;
    let data = stage.data;
    let dir = stage.dir;
    let workers = stage.workers;
    let main = workers.is_main();
    let config_toml = cfg.to_toml();
    if main {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create `{}`", dir.display()))?;
        crate::fsutil::write_atomic(&dir.join("config.toml"), config_toml.as_bytes())
            .with_context(|| format!("cannot write `{}`", dir.join("config.toml").display()))?;
    }
    let spec = PolicySpec::new(cfg, stage.model_dir)?;
    let config_path = spec.base_dir.join("config.json");
    let model_config_json =
        std::fs::read_to_string(&config_path).with_context(|| format!("cannot read `{}`", config_path.display()))?;

    // --- the plan: steps, batches, schedule ---
    let name = match stage.objective {
        Objective::Sft => "sft",
        Objective::Dpo => "dpo",
    };
    let world = workers.world_size();
    let sampler = batch_plan(cfg, data.train.len(), world)?;
    let total_steps =
        stage.steps.unwrap_or_else(|| (cfg.num_train_epochs * sampler.steps_per_epoch() as f64).ceil() as u64);
    let lr_factor = cfg.lr_scaling.factor(world);
    progress.line(&format!(
        "{name}: global batch {} = {} per device x {world} devices x {} accumulation; learning rate {:e} x {lr_factor:.3} (lr_scaling = {})",
        sampler.global_batch,
        sampler.micro_batch,
        sampler.global_batch / (sampler.micro_batch * world),
        stage.learning_rate,
        cfg.lr_scaling
    ));
    let schedule = Schedule {
        kind: cfg.lr_scheduler_type,
        peak: stage.learning_rate * lr_factor,
        warmup_steps: Schedule::warmup(cfg.warmup_steps, cfg.warmup_ratio, total_steps),
        total_steps,
        min_lr_rate: cfg.min_lr_rate,
    };
    let adamw = AdamWConfig {
        beta1: cfg.adam_beta1,
        beta2: cfg.adam_beta2,
        epsilon: cfg.adam_epsilon,
        weight_decay: cfg.weight_decay,
    };
    let loss_cfg = cfg.loss.clone();
    let pad_id = data.tokenizer.pad_id();
    let max_length = Some(cfg.max_length);
    let eval_collation =
        Collation { batch_size: cfg.per_device_eval_batch_size, pad_id, max_length, ld_alpha: loss_cfg.ld_alpha };

    // --- the models: policy (autodiff), reference (plain, frozen) ---
    let train_device = stage.device.clone().autodiff();
    let resume_from = if stage.resume { checkpoint::latest(dir) } else { None };
    let policy = spec.load_policy(resume_from.as_deref(), cfg.seed, &train_device)?;
    let (mut optimizer, mut state) = match &resume_from {
        Some(ckpt) => {
            let saved = checkpoint::load_state(ckpt, &train_device)?;
            progress.line(&format!("resuming {name} from `{}` (step {})", ckpt.display(), saved.state.step));
            (saved.optimizer, saved.state)
        }
        None => (
            AdamW::default(),
            TrainerState {
                step: 0,
                epoch: 0.0,
                elapsed_seconds: 0.0,
                num_tokens: 0.0,
                loss_scaler: (cfg.compute_dtype() == FloatDType::F16).then(LossScaler::default),
            },
        ),
    };
    if let Some(lora) = &spec.lora {
        progress.line(&format!(
            "LoRA r={} alpha={} on {}: {} trainable parameters of {}",
            lora.r,
            lora.alpha,
            lora.target_modules.join(","),
            count_trainable(&policy),
            policy.num_params()
        ));
    }
    let mut policy = workers.broadcast_params(policy)?;
    let files = spec.files(&model_config_json);
    let checkpointing = cfg.gradient_checkpointing;
    let dropout = spec.lora.as_ref().is_some_and(|l| l.dropout > 0.0);
    let mut metrics_out = match (&resume_from, main) {
        (_, false) => None,
        // A resumed stage keeps the rows up to its checkpoint; a stage started afresh (again, after
        // dying before its first checkpoint) starts an empty file: no step is ever logged twice.
        (Some(_), true) => Some(MetricsWriter::resume(dir, state.step)?),
        (None, true) => Some(MetricsWriter::create(dir)?),
    };

    let references = match stage.objective {
        Objective::Sft => None,
        Objective::Dpo => {
            let reference = if cfg.loss.reference_free {
                None
            } else {
                Some(spec.reference(&policy, stage.ref_dir, stage.device)?)
            };
            Some(References::prepare(stage, reference, &eval_collation, progress)?)
        }
    };

    // --- the loop ---
    progress.start(name, state.step, total_steps);
    let started = Instant::now();
    let elapsed_before = state.elapsed_seconds;
    let mut window = Window::new(Instant::now());
    let mut last_eval = None;
    let mut last_status = String::new();
    let mut interrupted = false;
    if let (Some(refs), true, 0) = (&references, cfg.eval_on_start, state.step) {
        last_eval =
            refs.evaluate(&inference_copy(&policy), stage, &state, &eval_collation, metrics_out.as_mut(), progress)?;
    }
    while state.step < total_steps {
        // Ctrl-C reaches the ranks at different moments: they agree before each step.
        if workers.any(stage.interrupt.load(Ordering::SeqCst))? {
            interrupted = true;
            break;
        }
        let lr = schedule.lr(state.step);
        // Dropout masks follow (seed, step): the same on every rank, and after a resume. (The
        // generator is process-wide: a run without dropout leaves it alone.)
        if dropout {
            stage.device.seed(cfg.seed.wrapping_add(state.step));
        }
        let mine = rank_step(&sampler, state.step, world, workers.rank())?;
        let micro_batches = mine.micro_batches;
        let step_pairs = mine.step_pairs;

        // Accumulate: each micro-batch's loss is scaled by its share of the whole step (all
        // ranks), so the gradients summed over micro-batches and ranks equal those of one batch
        // holding every pair of the step.
        let mut grads = GradAccumulator::default();
        let chunks: Vec<Vec<TokenizedPair>> =
            micro_batches.iter().map(|ids| ids.iter().map(|&i| data.train[i].clone()).collect()).collect();
        let all_pairs: Vec<&TokenizedPair> =
            sampler.micro_batches(state.step).concat().into_iter().map(|i| &data.train[i]).collect();
        let step_tokens: f64 = match stage.objective {
            Objective::Sft => {
                let all: Vec<TokenizedPair> = all_pairs.iter().map(|p| (*p).clone()).collect();
                scored_tokens(&data::collate_chosen(&all, pad_id, max_length))
            }
            Objective::Dpo => 0.0,
        };
        state.num_tokens += all_pairs.iter().map(|p| pair_tokens(p, cfg.max_length, stage.objective)).sum::<f64>();
        let loss_scale = state.loss_scaler.map_or(1.0, |s| s.scale);
        for (micro, (ids, chunk)) in micro_batches.iter().zip(&chunks).enumerate() {
            let recompute = checkpointing.then(|| Checkpointing {
                dropout_seed: dropout
                    .then(|| cfg.seed ^ (state.step << 20) ^ ((micro as u64) << 8) ^ workers.rank() as u64),
            });
            match (stage.objective, &references) {
                (Objective::Sft, _) => {
                    let batch = data::collate_chosen(chunk, pad_id, max_length);
                    window.count(&batch);
                    let device_batch = DeviceBatch::new(&batch, None, &train_device);
                    // Each micro-batch's loss is its share of the step's token mean.
                    let (_, nll) =
                        forward_backward(&policy, &device_batch, false, recompute, loss_scale, &mut grads, |scores| {
                            -scores.token_logps.clone().sum() / step_tokens.max(1.0)
                        });
                    window.losses.push(nll);
                }
                (Objective::Dpo, Some(refs)) => {
                    let batch = data::collate(chunk, pad_id, max_length);
                    window.count(&batch);
                    let device_batch = DeviceBatch::new(&batch, loss_cfg.ld_alpha, &train_device);
                    let ref_rows = refs.train_rows(ids, &batch, loss_cfg.ld_alpha, stage.device);
                    let share = chunk.len() as f64 / step_pairs as f64;
                    let (scores, loss) = forward_backward(
                        &policy,
                        &device_batch,
                        true,
                        recompute,
                        share * loss_scale,
                        &mut grads,
                        |scores| dpo_loss(&PairScores::from_scores(&device_batch, scores, &ref_rows), &loss_cfg),
                    );
                    window.pending.push((device_batch, scores, ref_rows, loss));
                }
                (Objective::Dpo, None) => unreachable!("DPO stages prepare their references"),
            }
        }
        workers.sum_grads(&mut grads, &policy)?;
        let apply = match state.loss_scaler.as_mut() {
            Some(scaler) => {
                grads.scale(1.0 / scaler.scale);
                // A host sync, as torch's GradScaler: an overflowing step must not be applied.
                let finite = grads.global_norm().is_none_or(|n| n.into_scalar::<f32>().is_finite());
                scaler.update(finite)
            }
            None => true,
        };
        let grad_norm = grads.clip_global_norm(cfg.max_grad_norm);
        if apply {
            policy = optimizer.step(policy, &grads, lr, &adamw);
        } else {
            progress.line(&format!(
                "fp16 gradients overflowed at step {}: step skipped, loss scale halved",
                state.step + 1
            ));
        }
        window.steps += 1;
        state.step += 1;
        state.epoch = sampler.epoch_at(state.step);
        state.elapsed_seconds = elapsed_before + started.elapsed().as_secs_f64();

        // --- log, evaluate, checkpoint ---
        if state.step % cfg.logging_steps == 0 || state.step == total_steps {
            // Reading the values back is a host sync: it happens on logging steps only.
            let norm = grad_norm.map(|n| n.into_scalar::<f32>() as f64);
            let (row, status) = window.finish(&state, lr, norm, stage.objective, cfg.loss.beta, workers)?;
            if let Some(out) = metrics_out.as_mut() {
                out.append(&row)?;
            }
            progress.line(&format!("{name} step {}/{total_steps} | {status}", state.step));
            last_status = status;
            window = Window::new(Instant::now());
        }
        if let Some(refs) = &references {
            let every = cfg.eval_every();
            if every > 0 && (state.step % every == 0 || state.step == total_steps) {
                last_eval = refs.evaluate(
                    &inference_copy(&policy),
                    stage,
                    &state,
                    &eval_collation,
                    metrics_out.as_mut(),
                    progress,
                )?;
            }
        }
        if cfg.save_steps > 0 && state.step % cfg.save_steps == 0 && state.step < total_steps {
            if main {
                let path = checkpoint::save(
                    dir,
                    &policy.valid(),
                    files,
                    &optimizer,
                    &state,
                    &config_toml,
                    cfg.save_total_limit,
                )?;
                progress.line(&format!("saved `{}`", path.display()));
            }
            workers.barrier()?;
        }
        progress.step(state.step, &last_status);
    }

    // --- the end: checkpoint, final model, test, plots ---
    let policy = inference_copy(&policy);
    let saved_now =
        checkpoint::latest(dir).as_deref() == Some(&dir.join("checkpoints").join(format!("step-{}", state.step)));
    if main && !saved_now {
        let path = checkpoint::save(dir, &policy, files, &optimizer, &state, &config_toml, cfg.save_total_limit)?;
        progress.line(&format!("saved `{}`", path.display()));
    }
    if interrupted {
        workers.barrier()?;
        let ckpt = checkpoint::latest(dir).unwrap_or_else(|| dir.to_owned());
        progress.line(&format!("interrupted at step {}: resume with `--resume {}`", state.step, dir.display()));
        return Ok(StageOutcome { model_dir: ckpt, steps: state.step, interrupted, eval: last_eval, test: None });
    }
    let final_dir = dir.join("final");
    if main {
        export_final(&final_dir, &policy, files, &data.tokenizer_dir)?;
        if cfg.merge {
            let merged = final_dir.join("merged");
            let full = ModelFiles::Full { config_json: &model_config_json };
            export_final(&merged, &inference_copy(&policy).merge_lora(), full, &data.tokenizer_dir)?;
            progress.line(&format!("merged model written to `{}`", merged.display()));
        }
    }
    let test = match &references {
        Some(refs) if !data.test.is_empty() => Some(refs.test(&policy, stage, &eval_collation, progress)?),
        _ => None,
    };
    // Every rank returns once the files rank 0 writes are complete.
    workers.barrier()?;
    Ok(StageOutcome { model_dir: final_dir, steps: state.step, interrupted, eval: last_eval, test })
}

/// Parameters that receive gradients.
fn count_trainable(model: &Llama) -> usize {
    let mut count = 0;
    crate::model::params::visit(model, None, |p| count += if p.trains { p.flat.dims()[0] } else { 0 });
    count
}

/// Completion tokens scored in a batch.
fn scored_tokens(batch: &data::Batch) -> f64 {
    let s = batch.seq_len;
    (0..batch.rows).map(|r| batch.completion_mask[r * s + 1..(r + 1) * s].iter().sum::<i64>() as f64).sum()
}

/// Writes `final/`: an HF model (or PEFT adapter) directory with the tokenizer files, atomically.
fn export_final(final_dir: &Path, model: &Llama, files: ModelFiles, tokenizer_dir: &Path) -> anyhow::Result<()> {
    let staged = final_dir.with_extension("partial");
    if staged.exists() {
        std::fs::remove_dir_all(&staged).with_context(|| format!("cannot remove `{}`", staged.display()))?;
    }
    let written = (|| -> anyhow::Result<()> {
        checkpoint::write_model_dir(&staged, model, files)?;
        for file in ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"] {
            let src = tokenizer_dir.join(file);
            if src.is_file() {
                let dest = staged.join(file);
                std::fs::copy(&src, &dest).with_context(|| format!("cannot write `{}`", dest.display()))?;
            }
        }
        crate::fsutil::replace_dir(&staged, final_dir)
            .with_context(|| format!("cannot write `{}`", final_dir.display()))
    })();
    if written.is_err() {
        // Nothing half-written stays behind.
        let _ = std::fs::remove_dir_all(&staged);
    }
    written
}

/// What the steps since the last log did, kept on the device until the log reads it.
struct Window {
    started: Instant,
    /// Optimizer steps taken.
    steps: usize,
    pairs: usize,
    tokens: f64,
    /// DPO: each micro-batch's batch, policy scores, reference rows and loss.
    pending: Vec<(DeviceBatch, crate::dpo::logps::SequenceScores, Vec<f32>, burn::tensor::Tensor<1>)>,
    /// SFT: each micro-batch's (scaled) loss.
    losses: Vec<burn::tensor::Tensor<1>>,
}

impl Window {
    fn new(started: Instant) -> Self {
        Self { started, steps: 0, pairs: 0, tokens: 0.0, pending: Vec::new(), losses: Vec::new() }
    }

    fn count(&mut self, batch: &data::Batch) {
        self.pairs += batch.batch_size;
        self.tokens += batch.attention_mask.iter().sum::<i64>() as f64;
    }

    /// The logged row and a one-line status, TRL's names in TRL's order, over every rank.
    fn finish(
        self,
        state: &TrainerState,
        lr: f64,
        grad_norm: Option<f64>,
        objective: Objective,
        beta: f64,
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
                format!("loss {loss:.4}")
            }
            Objective::Dpo => {
                let mut sums = MetricSums::default();
                for (batch, scores, ref_rows, loss) in &self.pending {
                    let scored = ScoredPairs::from_batch(batch, scores, ref_rows);
                    sums.add(&scored, host(loss)[0] as f64, beta);
                }
                let mut fields = sums.fields();
                workers.sum_f64(&mut fields)?;
                let m = MetricSums::from_fields(fields).finish();
                for (name, value) in m.named() {
                    row.set_metric(name, value);
                }
                format!(
                    "loss {:.4} | rewards/accuracies {:.3} | rewards/margins {:.4}",
                    m.loss, m.rewards_accuracies, m.rewards_margins
                )
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

/// The frozen reference of a DPO stage: its log-probs on every dataset and its sample completions,
/// computed once (the reference model itself is dropped when nothing needs it per step).
struct References {
    /// Per-step reference, when the training log-probs are not precomputed.
    model: Option<Llama>,
    train: Option<RefLogps>,
    eval: RefLogps,
    test: RefLogps,
    eval_samples: Vec<String>,
    test_samples: Vec<String>,
    reference_free: bool,
}

impl References {
    /// `reference` is `None` for reference-free training.
    fn prepare(
        stage: &Stage,
        reference: Option<Llama>,
        collation: &Collation,
        progress: &mut dyn Progress,
    ) -> anyhow::Result<Self> {
        let cfg = stage.cfg;
        let data = stage.data;
        let Some(reference) = reference else {
            return Ok(Self {
                model: None,
                train: Some(RefLogps::zeros(data.train.len())),
                eval: RefLogps::zeros(data.eval.len()),
                test: RefLogps::zeros(data.test.len()),
                eval_samples: Vec::new(),
                test_samples: Vec::new(),
                reference_free: true,
            });
        };
        let held_out = data.eval.len() + data.test.len();
        if held_out > 0 {
            progress.line(&format!("scoring {held_out} held-out pairs under the reference"));
        }
        let eval = sharded_reference_logps(&reference, &data.eval, collation, stage)?;
        let test = sharded_reference_logps(&reference, &data.test, collation, stage)?;
        let main = stage.workers.is_main();
        let eval_samples = if main { sample_texts(&reference, &data.eval, stage) } else { Vec::new() };
        let test_samples = if main { sample_texts(&reference, &data.test, stage) } else { Vec::new() };
        let (model, train) = if cfg.precompute_ref_log_probs {
            let compute = || sharded_reference_logps(&reference, &data.train, collation, stage);
            let train = ref_cache::load_or_compute(&reference, stage, collation, progress, compute)?;
            (None, Some(train))
        } else {
            (Some(reference), None)
        };
        Ok(Self { model, train, eval, test, eval_samples, test_samples, reference_free: false })
    }

    /// The `[2B]` reference log-probs of the training pairs `ids` (collated as `batch`).
    fn train_rows(&self, ids: &[usize], batch: &data::Batch, ld_alpha: Option<f64>, device: &Device) -> Vec<f32> {
        match (&self.train, &self.model) {
            (Some(table), _) => table.rows(ids),
            (None, Some(model)) => {
                // The same LD-DPO weights as the policy's sequence log-probs, as TRL does.
                let device_batch = DeviceBatch::new(batch, ld_alpha, device);
                host(&score(model, &device_batch, false).logps)
            }
            (None, None) => unreachable!("a reference without a model has precomputed log-probs"),
        }
    }

    /// The held-out metrics (rank 0 also logs them and rewrites the samples); `None` without
    /// held-out data.
    fn evaluate(
        &self,
        policy: &Llama,
        stage: &Stage,
        state: &TrainerState,
        collation: &Collation,
        out: Option<&mut MetricsWriter>,
        progress: &mut dyn Progress,
    ) -> anyhow::Result<Option<Metrics>> {
        if stage.data.eval.is_empty() {
            return Ok(None);
        }
        let metrics = sharded_metrics(policy, &stage.data.eval, &self.eval, collation, stage)?;
        let Some(out) = out else { return Ok(Some(metrics)) };
        let mut row = MetricsRow::empty(state.step, state.epoch, Split::Eval, state.elapsed_seconds);
        for (name, value) in metrics.named() {
            row.set_metric(name, value);
        }
        row.set_metric("num_tokens", state.num_tokens);
        out.append(&row)?;
        progress.line(&format!(
            "eval step {} | loss {:.4} | rewards/accuracies {:.3} | rewards/margins {:.4}",
            state.step, metrics.loss, metrics.rewards_accuracies, metrics.rewards_margins
        ));
        self.write_samples(
            policy,
            stage,
            "samples_val.txt",
            &stage.data.eval,
            &self.eval_samples,
            &format!("step {}", state.step),
        )?;
        Ok(Some(metrics))
    }

    fn test(
        &self,
        policy: &Llama,
        stage: &Stage,
        collation: &Collation,
        progress: &mut dyn Progress,
    ) -> anyhow::Result<Metrics> {
        let metrics = sharded_metrics(policy, &stage.data.test, &self.test, collation, stage)?;
        if !stage.workers.is_main() {
            return Ok(metrics);
        }
        progress.line(&format!(
            "test | loss {:.4} | rewards/accuracies {:.3} | rewards/margins {:.4}",
            metrics.loss, metrics.rewards_accuracies, metrics.rewards_margins
        ));
        self.write_samples(policy, stage, "samples_test.txt", &stage.data.test, &self.test_samples, "final")?;
        Ok(metrics)
    }

    fn write_samples(
        &self,
        policy: &Llama,
        stage: &Stage,
        file: &str,
        pairs: &[TokenizedPair],
        reference: &[String],
        title: &str,
    ) -> anyhow::Result<()> {
        if pairs.is_empty() || stage.cfg.num_samples == 0 {
            return Ok(());
        }
        let policy_texts = sample_texts(policy, pairs, stage);
        let tok = &stage.data.tokenizer;
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
                })
            })
            .collect::<Result<Vec<_>, crate::data::tokenizer::TokenizerError>>()?;
        write_samples(&stage.dir.join(file), title, &samples)?;
        Ok(())
    }
}

/// The reference log-probs of every pair, each rank scoring its shard.
fn sharded_reference_logps(
    model: &Llama,
    pairs: &[TokenizedPair],
    collation: &Collation,
    stage: &Stage,
) -> anyhow::Result<RefLogps> {
    let workers = stage.workers;
    let mine: Vec<TokenizedPair> = workers.shard(pairs.len()).into_iter().map(|i| pairs[i].clone()).collect();
    let local = reference_logps(model, &mine, collation, stage.device);
    let mut columns = workers.gather_columns(pairs.len(), vec![local.chosen, local.rejected])?.into_iter();
    Ok(RefLogps { chosen: columns.next().unwrap_or_default(), rejected: columns.next().unwrap_or_default() })
}

/// The loss and metrics over every pair, each rank scoring its shard.
fn sharded_metrics(
    policy: &Llama,
    pairs: &[TokenizedPair],
    reference: &RefLogps,
    collation: &Collation,
    stage: &Stage,
) -> anyhow::Result<Metrics> {
    let workers = stage.workers;
    let scored = score_pairs(policy, pairs, &workers.shard(pairs.len()), reference, collation, stage.device);
    let scored = ScoredPairs::from_columns(workers.gather_columns(pairs.len(), scored.columns())?);
    Ok(metrics_of(&scored, &stage.cfg.loss, stage.device))
}

/// Greedy completions of the first `num_samples` prompts of `pairs`.
fn sample_texts(model: &Llama, pairs: &[TokenizedPair], stage: &Stage) -> Vec<String> {
    let tok = &stage.data.tokenizer;
    let cfg = SamplingConfig::greedy(stage.cfg.max_new_tokens);
    let mut sampler = rng(stage.cfg.seed);
    pairs
        .iter()
        .take(stage.cfg.num_samples)
        .map(|pair| {
            let ids = generate(model, &pair.prompt_ids, 1, tok.eos_id(), &cfg, &mut sampler, stage.device);
            tok.decode(&ids[0], true).unwrap_or_else(|e| format!("(cannot decode: {e})"))
        })
        .collect()
}
