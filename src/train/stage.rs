//! One stage of a run, supervised fine-tuning on the chosen completions (`sft`) or DPO against a
//! frozen reference, read top to bottom as nanoGPT's `train.py`: setup ([`setup`]), then one loop
//! that for each optimizer step takes the learning rate from a pure schedule, runs the step
//! ([`super::step`]), and logs, evaluates and checkpoints at fixed cadences; then the end
//! ([`finish`]): the last checkpoint, `final/`, the test set.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Instant;

use anyhow::Context;
use burn::module::Module;

use super::checkpoint::{self, ModelFiles, TrainerState};
use super::context::{DrawPlots, Objective, Progress, Run, Stage, StageOutcome};
use super::log::MetricsWriter;
use super::marks::{Marks, report_copies, report_peak, report_positions};
use super::optim::{AdamW, AdamWConfig, LossScaler, Masters};
use super::partition::{Layout, Partitioned};
use super::policy::{PolicySpec, inference_copy};
use super::references::References;
use super::sampler::Sampler;
use super::schedule::Schedule;
use super::step::{StepPlan, Trained, optimizer_step, overlaps_reference};
use super::window::{Positions, Session, Window};
use super::workers::Workers;
use crate::config::{ConfigError, SaveStrategy, Sharding, TrainConfig};
use crate::data::Packing;
use crate::dpo::logps::Collation;
use crate::dpo::metrics::Metrics;
use crate::model::params;
use crate::wandb::{self, WandbRun};

/// Runs one stage to its end, a Ctrl-C, or an error.
pub fn run_stage(run: &Run, stage: &Stage, progress: &mut dyn Progress) -> anyhow::Result<StageOutcome> {
    if let Some(done) = finished_before(run, stage, progress)? {
        return Ok(done);
    }
    let (cfg, workers) = (run.cfg, run.rt.workers);
    let Setup { plan, schedule, total_steps, mut trained, references, mut log, spec, config_json } =
        setup(run, stage, progress)?;
    let (name, files) = (stage.objective.name(), spec.files(&config_json));
    let evaluate = |t: &Trained, mut log: Option<&mut MetricsWriter>, progress: &mut dyn Progress| {
        let Some(refs) = references.as_ref().filter(|_| !run.data.eval.is_empty()) else { return Ok(None) };
        let policy = inference_copy(t.whole_policy(workers)?.as_ref());
        let metrics = refs.evaluate(&policy, run, stage.dir, &t.state, log.as_deref_mut(), progress)?;
        if let (Some(_), Some(log), Some(draw)) = (&metrics, log, stage.draw_plots) {
            // The plots are a view: one that cannot be drawn does not stop the training.
            if let Err(e) = log_dashboard(log, draw, stage.dir, t.state.step) {
                progress.line(&format!("warning: the dashboard for TensorBoard was not drawn: {e:#}"));
            }
        }
        anyhow::Ok(metrics)
    };

    progress.start(name, trained.state.step, total_steps);
    let mut marks = Marks::start(run)?;
    let (started, elapsed_before, first_step) = (Instant::now(), trained.state.elapsed_seconds, trained.state.step);
    let (mut window, mut session) = (Window::new(), Session::start(first_step));
    let mut positions = Positions::default();
    let (mut last_eval, mut last_status, mut interrupted) = (None, String::new(), false);
    if cfg.eval_on_start && trained.state.step == 0 {
        last_eval = evaluate(&trained, log.as_mut(), progress)?;
    }
    while trained.state.step < total_steps {
        workers.at_step(trained.state.step + 1);
        // Ctrl-C reaches the ranks at different moments: they agree before each step.
        if workers.any(run.rt.interrupt.load(Ordering::SeqCst))? {
            interrupted = true;
            break;
        }
        let lr = schedule.lr(trained.state.step);
        marks.before_step(trained.state.step + 1, progress);
        let report;
        (trained, report) = optimizer_step(&plan, run, trained, references.as_ref(), &mut window, lr)?;
        let state = &mut trained.state;
        state.elapsed_seconds = elapsed_before + started.elapsed().as_secs_f64();
        if !report.applied {
            progress
                .line(&format!("fp16 gradients overflowed at step {}: step skipped, loss scale halved", state.step));
        }

        // --- log, evaluate, checkpoint ---
        if cfg.logs_at(state.step, total_steps) {
            // Reading the values back is a host sync: it happens on logging steps only.
            let norm = report.grad_norm.map(|n| crate::model::host(&n)[0] as f64);
            let done = std::mem::take(&mut window);
            positions.add(done.positions);
            let (row, status) = done.finish(state, lr, norm, plan.objective, &cfg.loss, workers)?;
            window = Window::new();
            session.logged(&row);
            if let Some(out) = log.as_mut() {
                out.append(&row)?;
            }
            progress.line(&format!("{name} step {}/{total_steps} | {status}", state.step));
            last_status = status;
        }
        marks.after_step(trained.state.step, trained.state.step == total_steps, progress);
        if cfg.evaluates_at(trained.state.step, total_steps) {
            last_eval = evaluate(&trained, log.as_mut(), progress)?.or(last_eval);
        }
        if cfg.saves_at(trained.state.step, total_steps) {
            save(run, stage, &trained, files, &trained.master_policy(workers, &run.rt.device)?.valid(), progress)?;
        }
        progress.step(trained.state.step, &last_status);
    }
    marks.after_step(trained.state.step, true, progress); // a window Ctrl-C cut short
    positions.add(window.positions);
    report_stage(run, (name, plan.packing), &marks, positions, (&trained, first_step), progress)?;
    if let Some(out) = log.as_mut().filter(|_| !interrupted && first_step < total_steps) {
        let samples = schedule_samples(cfg, &trained.state, run.data.train.len());
        let (summary, state) = (session.summary(&trained.state, total_steps, samples), &trained.state);
        out.log_summary(&summary, state.epoch, state.step)?;
    }
    let ending = Ending { files, config_json: &config_json, interrupted, last_eval, references };
    let outcome = finish(run, stage, trained, ending, progress)?;
    // The W&B run ended as it should have; an error's return leaves it to be marked failed.
    if let Some(log) = log {
        log.finish();
    }
    Ok(outcome)
}

/// What the stage's steps held and cost: their peak memory, positions computed and copies.
fn report_stage(
    run: &Run,
    (name, packing): (&str, Packing),
    marks: &Marks,
    positions: Positions,
    (trained, first_step): (&Trained, u64),
    progress: &mut dyn Progress,
) -> anyhow::Result<()> {
    // Every rank must take part in the report's sum: it runs only where all of them track.
    if !run.rt.workers.any(!marks.tracks_peak)? {
        report_peak(run, name, marks.cuda, positions.largest, progress)?;
    }
    report_positions(run, name, positions, packing, progress)?;
    report_copies(trained, name, trained.state.step - first_step, progress);
    Ok(())
}

/// The pairs transformers counts its whole schedule to train (`num_train_samples`): `max_steps`
/// global batches, else the training pairs `num_train_epochs` times.
fn schedule_samples(cfg: &TrainConfig, state: &TrainerState, pairs: usize) -> f64 {
    match u64::try_from(cfg.max_steps) {
        Ok(steps) if steps > 0 => (steps * state.global_batch.unwrap_or(0) as u64) as f64,
        _ => pairs as f64 * cfg.num_train_epochs,
    }
}

/// Redraws the stage's plots and logs the dashboard to TensorBoard at `step`.
fn log_dashboard(log: &mut MetricsWriter, draw: &DrawPlots, dir: &Path, step: u64) -> anyhow::Result<()> {
    let Some(events) = log.tensorboard() else { return Ok(()) };
    let path = draw(dir)?;
    let png = std::fs::read(&path).with_context(|| format!("cannot read `{}`", path.display()))?;
    // PNG's IHDR: width and height, big-endian, at bytes 16 and 20.
    let size = |at: usize| png.get(at..at + 4).map_or(0, |b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
    events
        .image("eval/dashboard", step, &png, (size(16), size(20)))
        .with_context(|| format!("cannot write `{}`", events.path().display()))
}

/// Everything a stage's loop starts from.
struct Setup {
    plan: StepPlan,
    schedule: Schedule,
    total_steps: u64,
    trained: Trained,
    references: Option<References>,
    /// `metrics.csv` (rank 0).
    log: Option<MetricsWriter>,
    spec: PolicySpec,
    /// The starting model's `config.json`, written into checkpoints and `final/`.
    config_json: String,
}

/// The stage's directory and config, its plan (batches, schedule, optimizer), its models (the
/// policy on the autodiff device, from the newest checkpoint when resuming; the frozen reference)
/// and its log.
fn setup(run: &Run, stage: &Stage, progress: &mut dyn Progress) -> anyhow::Result<Setup> {
    let (cfg, data, workers) = (run.cfg, run.data, run.rt.workers);
    let world = workers.world_size();
    let sampler = batch_plan(cfg, stage, data.train.len(), world)?;
    let resume_from = if stage.resume { checkpoint::latest(stage.dir) } else { None };
    let spec = PolicySpec::new(cfg, run.plan, stage.model_dir)?;
    let config_path = spec.base_dir.join("config.json");
    let config_json =
        std::fs::read_to_string(&config_path).with_context(|| format!("cannot read `{}`", config_path.display()))?;

    // --- the plan: steps, batches, schedule ---
    let total_steps = total_steps(cfg, stage, &sampler);
    super::resume::steps_left(resume_from.as_deref(), total_steps)?;
    let schedule = schedule(run, stage, &sampler, total_steps, progress);
    let adamw = AdamWConfig {
        beta1: cfg.adam_beta1,
        beta2: cfg.adam_beta2,
        epsilon: cfg.adam_epsilon,
        weight_decay: cfg.weight_decay,
    };

    // --- the models: policy (autodiff), reference (plain, frozen) ---
    let train_device = run.rt.device.clone().autodiff();
    let mut trained = start(run, stage, &spec, resume_from.as_deref(), &train_device, progress)?;
    if workers.is_main() {
        // A warm-up's folder gets its copy of the config; a resume's files are rewritten now
        // that it has what it trains on.
        let copy = (stage.dir != stage.run_dir).then(|| (stage.dir.join("config.toml"), cfg.to_toml()));
        for (path, text) in run.rewrites.iter().chain(copy.as_ref()) {
            crate::fsutil::write_atomic(path, text.as_bytes())
                .with_context(|| format!("cannot write `{}`", path.display()))?;
        }
    }
    trained.state.global_batch = Some(sampler.global_batch);
    trained.state.objective = Some(stage.objective);
    let log = open_log(run, stage, resume_from.is_some(), trained.state.step, &config_json)?;
    let mut references = references(run, stage, &spec, &trained, progress)?;
    let dropout = spec.lora.as_ref().is_some_and(|l| l.dropout > 0.0);
    let sharding = if workers.world_size() > 1 { run.plan.sharding } else { Sharding::None };
    let layout = Layout::of(&trained.policy);
    if sharding == Sharding::Zero3 {
        // With LoRA and no reference model of its own, the reference is the policy's base.
        let shares_base = spec.lora.is_some() && stage.ref_dir.is_none();
        partition(&mut trained, references.as_mut(), shares_base, workers);
    }
    trained.split_masters(sharding, (workers.rank(), workers.world_size()))?;
    let plan = StepPlan {
        objective: stage.objective,
        sampler,
        adamw,
        train_device,
        checkpointing: cfg.gradient_checkpointing,
        dropout,
        sharding,
        layout,
        device: run.rt.device.clone(),
        // Under LoRA dropout a shared prompt would see one dropout mask where padded rows see two.
        packing: Packing::of(cfg.padding_free, cfg.prefix_sharing && !dropout).under(run.plan.truncation),
        overlap_reference: overlaps_reference(run.rt.overlap_reference, &run.rt.device),
    };
    Ok(Setup { plan, schedule, total_steps, trained, references, log, spec, config_json })
}

/// The steps a stage trains to: its own count, else the epochs' worth of batches.
fn total_steps(cfg: &TrainConfig, stage: &Stage, sampler: &Sampler) -> u64 {
    stage.steps.unwrap_or_else(|| (cfg.num_train_epochs * sampler.steps_per_epoch() as f64).ceil() as u64)
}

/// A resumed stage whose newest checkpoint is at or past its last step, with `final/` written
/// from that checkpoint, or that ended without one (`save_strategy = "no"`: `final/` newer than
/// any checkpoint, a Ctrl-C's it trained past): nothing to train, and nothing is written again (a
/// second export dropped the held-out metrics from the run's summary and took an export's time for
/// the same weights).
fn finished_before(run: &Run, stage: &Stage, progress: &mut dyn Progress) -> anyhow::Result<Option<StageOutcome>> {
    if !stage.resume {
        return Ok(None);
    }
    let sampler = batch_plan(run.cfg, stage, run.data.train.len(), run.rt.workers.world_size())?;
    let total = total_steps(run.cfg, stage, &sampler);
    let newest = checkpoint::list(stage.dir).pop();
    let final_dir = stage.dir.join("final");
    let current = |ckpt: Option<&Path>| checkpoint::final_is_current(stage.dir, ckpt, run.cfg.merge);
    let (step, said) = match newest {
        Some((step, ckpt)) if step >= total && current(Some(&ckpt)) => {
            let at = match step == total {
                true => format!("at step {step} of {total}"),
                false => format!("at step {step}, past the {total} steps asked for"),
            };
            let more = "a larger `--max-steps` or `--num-train-epochs` trains on";
            (step, format!("the run is {at} and `{}` holds that step's model ({more})", final_dir.display()))
        }
        newest if run.cfg.save_strategy == SaveStrategy::No && current(newest.as_ref().map(|(_, c)| c.as_path())) => {
            let why = "it saved no checkpoint to train on from (`save_strategy = \"no\"`)";
            (total, format!("the run finished and `{}` holds its model; {why}", final_dir.display()))
        }
        _ => return Ok(None),
    };
    progress.line(&format!("{}: nothing to train: {said}", stage.objective.name()));
    Ok(Some(StageOutcome {
        model_dir: final_dir,
        steps: step,
        interrupted: false,
        already_done: true,
        eval: None,
        test: None,
    }))
}

/// The learning-rate schedule of a stage, announced with the batch it steps on.
fn schedule(run: &Run, stage: &Stage, sampler: &Sampler, total_steps: u64, progress: &mut dyn Progress) -> Schedule {
    let (cfg, world) = (run.cfg, run.rt.workers.world_size());
    let lr_factor = cfg.lr_scaling.factor(world);
    progress.line(&format!(
        "{}: global batch {} = {} per device x {world} devices x {} accumulation; learning rate {:e} x {lr_factor:.3} (lr_scaling = {})",
        stage.objective.name(),
        sampler.global_batch,
        sampler.micro_batch,
        sampler.global_batch / (sampler.micro_batch * world),
        stage.learning_rate,
        cfg.lr_scaling
    ));
    let spec = run.plan.schedule;
    Schedule {
        kind: spec.kind,
        peak: stage.learning_rate * lr_factor,
        warmup_steps: spec.warmup_steps(total_steps),
        total_steps,
        min_lr_rate: spec.min_lr_rate,
    }
}

/// `metrics.csv` on rank 0 (with its TensorBoard twin and its W&B run when asked): a resumed
/// stage keeps the rows up to its checkpoint; a stage started afresh (again, after dying before
/// its first checkpoint) starts an empty file, so no step is ever logged twice. W&B gets the
/// model's `config.json` (`model_config`) and the training config over it, as transformers does.
fn open_log(
    run: &Run,
    stage: &Stage,
    resumed: bool,
    step: u64,
    model_config: &str,
) -> anyhow::Result<Option<MetricsWriter>> {
    if !run.rt.workers.is_main() {
        return Ok(None);
    }
    let mut log = match resumed {
        true => MetricsWriter::resume(stage.dir, step)?,
        false => MetricsWriter::create(stage.dir)?,
    };
    if let Some(dir) = stage.tensorboard {
        log = log.with_tensorboard(&dir.join(stage.objective.name()), resumed.then_some(step))?;
    }
    if let Some(target) = stage.wandb {
        let name = match stage.objective {
            Objective::Dpo => target.run.to_owned(),
            Objective::Sft => format!("{}-sft", target.run),
        };
        let config = wandb::config(model_config, run.cfg);
        let wandb =
            WandbRun::start(target.python, &name, config).map_err(|e| anyhow::anyhow!("report_to wandb: {e}"))?;
        log = log.with_wandb(wandb);
    }
    Ok(Some(log))
}

/// DPO's frozen side: the reference model (none when reference-free) and the held-out sets it
/// scores, prepared once; SFT has none.
fn references(
    run: &Run,
    stage: &Stage,
    spec: &PolicySpec,
    trained: &Trained,
    progress: &mut dyn Progress,
) -> anyhow::Result<Option<References>> {
    let cfg = run.cfg;
    if stage.objective == Objective::Sft {
        return Ok(None);
    }
    let reference = match cfg.loss.needs_reference() {
        false => {
            let why = cfg.loss.family().map_or("reference_free = true".to_owned(), |t| format!("`{}`", t.name()));
            progress.line(&format!("reference: none ({why} scores no reference model)"));
            None
        }
        true => Some(spec.reference(&trained.policy, stage.ref_dir, &run.rt.device)?),
    };
    let collation = Collation {
        batch_size: cfg.per_device_eval_batch_size,
        pad_id: run.data.tokenizer.pad_id(),
        truncation: run.plan.truncation,
        ld_alpha: cfg.loss.ld_alpha,
        packing: Packing::of(cfg.padding_free, cfg.prefix_sharing).under(run.plan.truncation),
    };
    // A Ctrl-C while the reference scored leaves none: the loop's first check stops the run.
    References::prepare(run, reference, collation, progress)
}

/// `final/merged`'s model: the adapter just saved in `final_dir` folded into its base as read from
/// disk, in f32 on the CPU, as PEFT's `merge_and_unload` of the saved pair. The training copy of a
/// mixed-precision base is half precision: folding into it rounded every weight of the merged
/// model, those no adapter touches too; and on the CPU a second copy costs no GPU memory.
#[allow(deprecated)] // burn marks its libtorch devices deprecated; libtorch is this project's backend.
fn merged_model(final_dir: &Path) -> anyhow::Result<crate::model::Llama> {
    let (_, model) = crate::model::load(final_dir, &burn::tensor::Device::libtorch())
        .with_context(|| format!("cannot load the adapter in `{}` to merge it", final_dir.display()))?;
    Ok(model.merge_lora())
}

/// ZeRO-3: the policy (and the per-step reference), loaded whole and the held-out sets scored,
/// kept as this rank's slices from here on; a reference that is the policy's base shares its
/// slices.
fn partition(trained: &mut Trained, references: Option<&mut References>, shares_base: bool, workers: Workers) {
    let shard = (workers.rank(), workers.world_size());
    // The clone shares the tensors; the whole ones go with the assignment below.
    let parts = Partitioned::new(trained.policy.clone(), shard, None);
    trained.policy = parts.hollow().clone();
    if let Some(refs) = references {
        refs.partition(shard, shares_base.then_some(&parts));
    }
    trained.parts = Some(parts);
}

/// The policy, optimizer and loop state the stage starts from: a checkpoint's, or fresh ones;
/// every rank starts from rank 0's parameters.
fn start(
    run: &Run,
    stage: &Stage,
    spec: &PolicySpec,
    resume_from: Option<&Path>,
    train_device: &burn::tensor::Device,
    progress: &mut dyn Progress,
) -> anyhow::Result<Trained> {
    let cfg = run.cfg;
    let failed = |e: anyhow::Error| match resume_from {
        Some(ckpt) => checkpoint::resume_failed(e, ckpt),
        None => e,
    };
    let policy = spec.load_policy(resume_from, cfg.seed, train_device).map_err(failed)?;
    // The host is libtorch's CPU device (on a CPU-only machine, the training device itself).
    #[allow(deprecated)] // burn's libtorch device is deprecated upstream; it is this project's backend.
    let host = cfg.offload_optimizer.then(burn::tensor::Device::libtorch);
    let (mut optimizer, state) = match resume_from {
        Some(ckpt) => {
            let workers = run.rt.workers;
            let sharded = workers.world_size() > 1 && run.plan.sharding != Sharding::None;
            let shard = sharded.then(|| (workers.rank(), workers.world_size()));
            // Offloaded moments load straight into host memory.
            let saved = checkpoint::load_state(ckpt, host.as_ref().unwrap_or(train_device), shard)
                .map_err(|e| checkpoint::resume_failed(e.into(), ckpt))?;
            let name = stage.objective.name();
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
                loss_scaler: (run.plan.precision == crate::config::Precision::Fp16).then(LossScaler::default),
                global_batch: None,
                objective: None,
            },
        ),
    };
    // Pinned host memory for a GPU's copies; where torch cannot pin, pageable memory, said once.
    let pin = host.as_ref().is_some_and(|h| *h != run.rt.device)
        && Masters::try_pin(&run.rt.device)
            .inspect_err(|e| progress.line(&format!("warning: {e}: the offloaded optimizer uses pageable memory")))
            .is_ok();
    // Where layers are recomputed each layer's compute-dtype copies live only while it runs.
    let sharding = if run.rt.workers.world_size() > 1 { run.plan.sharding } else { Sharding::None };
    let resident =
        dpo_vocab::masters_resident(run.plan.precision, cfg.offload_optimizer, cfg.gradient_checkpointing, sharding);
    let place = match host {
        Some(host) => Some((host, false)),
        None => resident.then(|| (run.rt.device.clone(), true)),
    };
    optimizer.masters = place.map(|(host, resident)| Masters {
        pin,
        host,
        resident,
        device_dtype: spec.compute_dtype,
        masters: Default::default(),
        shard: None,
        copies: Default::default(),
    });
    if let Some(lora) = &spec.lora {
        let mut trainable = 0;
        params::visit(&policy, None, |p| trainable += if p.trains { p.numel() } else { 0 });
        progress.line(&format!(
            "{} r={} alpha={} on {}: {trainable} trainable parameters of {}",
            lora.kind(),
            lora.r,
            lora.alpha,
            lora.describe_targets(),
            policy.num_params()
        ));
    }
    let policy = run.rt.workers.broadcast_params(policy)?;
    Ok(Trained { policy, parts: None, optimizer, state })
}

/// The per-step batch arithmetic (global batch = micro-batch × world size × accumulation) and
/// the stage's data order.
fn batch_plan(cfg: &TrainConfig, stage: &Stage, len: usize, world_size: usize) -> anyhow::Result<Sampler> {
    let (global_batch, _) = global_batch(cfg, world_size)?;
    let shuffle = !cfg.sequential_order(stage.objective == Objective::Sft);
    Ok(Sampler {
        len,
        global_batch,
        micro_batch: cfg.per_device_train_batch_size,
        seed: cfg.data_order_seed(),
        shuffle,
    })
}

/// Pairs per optimizer step over `world_size` devices, and the accumulation steps that make it
/// (or why the batch does not split over them).
pub fn global_batch(cfg: &TrainConfig, world_size: usize) -> anyhow::Result<(usize, usize)> {
    let micro = cfg.per_device_train_batch_size;
    // A batch no counter holds (a per-device batch of 2^62 on 4 ranks) is bad input, not a wrap.
    let too_large = || ConfigError::Invalid {
        key: "per_device_train_batch_size",
        message: format!("{micro} x {world_size} devices x accumulation is more pairs than a step can count"),
    };
    let per_pass = micro.checked_mul(world_size).ok_or_else(too_large)?;
    let accumulation = match cfg.global_batch_size {
        Some(global) if global % per_pass != 0 => anyhow::bail!(ConfigError::Invalid {
            key: "global_batch_size",
            message: format!(
                "{global} does not split into per_device_train_batch_size {micro} x {world_size} devices x a whole number of accumulation steps: give a multiple of {per_pass}, or another per_device_train_batch_size"
            ),
        }),
        Some(global) => global / per_pass,
        None => cfg.gradient_accumulation_steps,
    };
    Ok((per_pass.checked_mul(accumulation).ok_or_else(too_large)?, accumulation))
}

/// Writes a checkpoint of the stage (rank 0), every rank waiting until it is complete.
fn save(
    run: &Run,
    stage: &Stage,
    t: &Trained,
    files: ModelFiles,
    policy: &crate::model::Llama,
    progress: &mut dyn Progress,
) -> anyhow::Result<()> {
    write_checkpoint(run, stage.dir, t, files, policy, progress)?;
    Ok(run.rt.workers.barrier("checkpoint")?)
}

/// Writes the checkpoint of `t`'s step: every rank its slices of the moments under ZeRO, then
/// rank 0 the rest.
fn write_checkpoint(
    run: &Run,
    dir: &Path,
    t: &Trained,
    files: ModelFiles,
    policy: &crate::model::Llama,
    progress: &mut dyn Progress,
) -> anyhow::Result<()> {
    let workers = run.rt.workers;
    if t.optimizer.shard.is_some() {
        checkpoint::save_slices(dir, &t.optimizer, t.state.step)?;
        workers.barrier("checkpoint")?;
    }
    if workers.is_main() {
        let (config_toml, keep) = (run.cfg.to_toml(), run.cfg.save_total_limit);
        let beside = checkpoint::Beside { config_toml: &config_toml, tokenizer_dir: &run.data.tokenizer_dir };
        let path = checkpoint::save(dir, policy, files, &t.optimizer, &t.state, beside, keep)?;
        progress.line(&format!("saved `{}`", path.display()));
    }
    Ok(())
}

/// How the loop ended, for [`finish`].
struct Ending<'a> {
    files: ModelFiles<'a>,
    config_json: &'a str,
    interrupted: bool,
    last_eval: Option<Metrics>,
    references: Option<References>,
}

/// The end of a stage: a checkpoint of the last step (unless one was just written), then on a
/// Ctrl-C the way to resume, else `final/` (and `final/merged/` with `merge`) and the test set.
fn finish(
    run: &Run,
    stage: &Stage,
    t: Trained,
    end: Ending,
    progress: &mut dyn Progress,
) -> anyhow::Result<StageOutcome> {
    let (dir, step, workers) = (stage.dir, t.state.step, run.rt.workers);
    let policy = inference_copy(t.master_policy(workers, &run.rt.device)?.as_ref());
    let eval = end.last_eval;
    let mut saved = checkpoint::latest(dir).as_deref() == Some(&dir.join("checkpoints").join(format!("step-{step}")));
    // `save_strategy = "no"` writes none at the end (transformers' rule); a Ctrl-C still does,
    // the only way to resume the run.
    if !saved && (end.interrupted || run.cfg.save_strategy == SaveStrategy::Steps) {
        write_checkpoint(run, dir, &t, end.files, &policy, progress)?;
        saved = true;
    }
    // The test set before the export: a Ctrl-C while it is scored, or since the last step began,
    // stops the run as one in a step does (a resume exports and tests).
    let test = match &end.references {
        Some(refs) if !end.interrupted && !run.data.test.is_empty() => refs.test(&policy, run, dir, progress)?,
        _ => None,
    };
    let interrupted = workers.any(end.interrupted || run.rt.interrupt.load(Ordering::SeqCst))?;
    if interrupted && !saved {
        write_checkpoint(run, dir, &t, end.files, &policy, progress)?;
    }
    if interrupted {
        workers.barrier("checkpoint")?;
        let ckpt = checkpoint::latest(dir).unwrap_or_else(|| dir.to_owned());
        let how = super::resume::resume_hint(run, workers.world_size(), t.state.global_batch);
        progress.line(&format!("interrupted at step {step}: resume with `--resume {}`{how}", stage.run_dir.display()));
        return Ok(StageOutcome { model_dir: ckpt, steps: step, interrupted, already_done: false, eval, test: None });
    }
    let final_dir = dir.join("final");
    if workers.is_main() {
        checkpoint::export_final(&final_dir, &policy, end.files, &run.data.tokenizer_dir)?;
        if run.cfg.merge {
            let merged = final_dir.join("merged");
            let base = match end.files {
                ModelFiles::Adapter { base, .. } => Some(base),
                ModelFiles::Full { base, .. } => base,
            };
            let full = ModelFiles::Full { config_json: end.config_json, base };
            checkpoint::export_final(&merged, &merged_model(&final_dir)?, full, &run.data.tokenizer_dir)?;
            progress.line(&format!("merged model written to `{}`", merged.display()));
        }
    }
    // Every rank returns once the files rank 0 writes are complete.
    workers.barrier("final model")?;
    Ok(StageOutcome { model_dir: final_dir, steps: step, interrupted, already_done: false, eval, test })
}

#[cfg(test)]
mod tests {
    use super::global_batch;

    /// A batch of more pairs than a step can count is bad input naming the key; one that fits
    /// splits as configured.
    #[test]
    fn a_global_batch_past_usize_is_refused() {
        let cfg = |micro: usize, accumulation: usize| crate::config::TrainConfig {
            per_device_train_batch_size: micro,
            gradient_accumulation_steps: accumulation,
            ..Default::default()
        };
        assert_eq!(global_batch(&cfg(8, 2), 4).unwrap(), (64, 2));
        let wide = global_batch(&cfg(1 << 62, 1), 4).unwrap_err().to_string();
        assert!(wide.starts_with("`per_device_train_batch_size`: 4611686018427387904 x 4 devices"), "{wide}");
        assert!(global_batch(&cfg(1 << 62, 4), 1).is_err());
    }
}
