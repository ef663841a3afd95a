//! `dpo-train train` and `dpo-train sft` (bare `dpo-train` is `train`): resolve the config's
//! layers, place this process (alone, one worker, or the launcher of the workers), run, and print
//! the summary.
//!
//! Which file is the config: `--resume`'s saved `config.toml`, else `--config`, else the embedded
//! demo when no model is named (bare `dpo-train`, or `--model demo`), else none: a user's model
//! trains with TRL's `DPOConfig` defaults for every key they do not set.

use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use burn::tensor::Device;

use super::args::TrainArgs;
use super::launch::{Placed, ProcessMemory, place};
use super::progress::{ConsoleProgress, Silent};
use super::{INTERRUPTED, interrupt};
use crate::config::hub::Found;
use crate::config::{ConfigError, ConfigFile, Layered, Origin, RunPlan, TrainConfig};
use crate::data::DataError;
use crate::demo::{DEMO, DEMO_CONFIG};
use crate::dist::LaunchOutcome;
use crate::run::{RunRequest, RunSummary};
use crate::train::Workers;
use crate::train::{Progress, Runtime};

/// Runs `train` (or `sft` with `sft_only`); 130 when interrupted, also while the data is
/// tokenised (then nothing was written: no run directory, no cache entry).
pub fn run_train(args: TrainArgs, sft_only: bool) -> anyhow::Result<ExitCode> {
    match train(args, sft_only) {
        Err(e) if e.chain().any(|e| e.downcast_ref::<DataError>().is_some_and(DataError::interrupted)) => {
            eprintln!("{e:#}");
            Ok(ExitCode::from(INTERRUPTED))
        }
        done => done,
    }
}

fn train(args: TrainArgs, sft_only: bool) -> anyhow::Result<ExitCode> {
    let Resolved { layered, name, resume, found, changes } = resolve(&args)?;
    let plan = layered.validate()?;
    let plan = if sft_only { plan.sft_only() } else { plan };
    let overlap_reference = crate::train::step::overlap_setting()?;
    crate::dpo::shapes::padding_setting()?;
    crate::dist::switch(dpo_torch::product::WIDEN_VAR)?;
    let mut layered = layered;
    check_before_start(&mut layered, &args, sft_only)?;
    let mut cfg = layered.cfg.clone();
    let memory_note = check_memory(&cfg, &plan, &args.parallel)?;
    let interrupt = interrupt::install_for_training()?;
    // Every worker must write into one run directory: the launcher names it for its workers, in a
    // directory it creates (another run's of the same second makes it take a suffix).
    let new_run = cfg.run_name.is_none() && resume.is_none();
    let reserved = std::cell::RefCell::new(None);
    let output_existed = cfg.output_dir.is_dir();
    let name_workers = || -> anyhow::Result<Vec<OsString>> {
        if !new_run {
            return Ok(Vec::new());
        }
        let base = cfg.output_dir.join(format!("{}-{name}", crate::clock::timestamp()));
        let dir = crate::run::claim::reserve(&base)?;
        let flags = vec!["--run-name".into(), dir.file_name().unwrap_or_default().to_owned()];
        *reserved.borrow_mut() = Some(dir);
        Ok(flags)
    };
    let timeout = Duration::from_secs(cfg.ddp_timeout);
    let mut console = ConsoleProgress::default();
    let resumed = resume.clone().map(Some);
    let mut tokenize_first = |shown: bool| {
        let progress: &mut dyn Progress = if shown { &mut console } else { &mut Silent };
        crate::run::warm_data_cache(&cfg, &plan, (resumed.as_ref(), &name), interrupt, progress)
    };
    let placed = place(&args.parallel, &name_workers, timeout, &mut tokenize_first);
    if let (Err(_) | Ok(Placed::Launched(LaunchOutcome::Interrupted | LaunchOutcome::Aborted)), Some(dir)) =
        (&placed, reserved.borrow().as_ref())
    {
        // The workers wrote nothing there: a refused run leaves nothing behind.
        crate::run::claim::remove_if_unused(dir);
        if !output_existed {
            let _ = std::fs::remove_dir(&cfg.output_dir); // only when empty
        }
    }
    let (device, mut group, worker) = match placed? {
        Placed::Launched(LaunchOutcome::Finished) => return Ok(ExitCode::SUCCESS),
        Placed::Launched(LaunchOutcome::Interrupted) => return Ok(ExitCode::from(INTERRUPTED)),
        Placed::Launched(LaunchOutcome::Aborted) => return Ok(aborted(&cfg, reserved.take().or(resume))),
        Placed::Here { device, group, worker } => (device, group, worker),
    };
    if new_run && worker.is_distributed() {
        // torchrun or SLURM workers, unnamed: the job's id is the one name every rank agrees on.
        let job = ["SLURM_JOB_ID", "TORCHELASTIC_RUN_ID"]
            .iter()
            .find_map(|v| std::env::var(v).ok().filter(|id| id != "none"));
        cfg.run_name = Some(format!("{name}-job-{}", job.unwrap_or_else(|| worker.master_port.to_string())));
    }
    if let Some(g) = group.as_mut() {
        g.set_bucket_bytes(cfg.ddp_bucket_cap_mb << 20)?;
    }
    let workers = Workers { group: group.as_ref() };
    let mut silent = Silent;
    let progress: &mut dyn Progress = if workers.is_main() { &mut console } else { &mut silent };
    let ranks = group.as_ref().map_or(1, |g| g.world_size());
    let mut config_description = describe_run(&layered, &found, &plan, &args.parallel, &device, ranks);
    for note in memory_note.into_iter().chain(changes) {
        config_description = format!("{config_description}\n{note}");
    }
    let rt = Runtime { device, interrupt, workers, overlap_reference };
    let request =
        RunRequest { cfg, plan, config_name: name, resume: resume.map(Some), sft_only, rt, config_description };
    let summary = crate::run::run(request, progress).map_err(|e| match e.downcast::<ConfigError>() {
        Ok(config) => layered.locate(config).into(),
        Err(other) => other,
    })?;
    console.finish();
    if workers.is_main() {
        print_summary(&summary)?;
    }
    // No rank exits before rank 0 has written the run's plots and summary: srun's
    // `--kill-on-bad-exit` ends the job at the first task's exit 130 (a timed stop), which
    // killed rank 0 mid-plot while the others left straight after the checkpoint.
    workers.barrier("run's files")?;
    Ok(if summary.interrupted() { ExitCode::from(INTERRUPTED) } else { ExitCode::SUCCESS })
}

/// What a run prints first: the effective config and its sources, the device line (TF32 where
/// it is on), the values read from the Hugging Face cache, and why `--device auto` took the CPU.
fn describe_run(
    layered: &Layered,
    found: &[Found],
    plan: &RunPlan,
    par: &super::args::ParallelArgs,
    device: &Device,
    ranks: usize,
) -> String {
    let mut text = format!(
        "effective config ({}):\n{}\n{}",
        layered.sources(),
        indent(&layered.describe()),
        crate::run::device::describe(device, Some(plan.precision), ranks)
    );
    if layered.cfg.tf32 == Some(true) {
        text.push_str(", TF32 for the f32 matrix products");
    }
    for found in found {
        text = format!("{text}\n{}", found.describe());
    }
    if let Some(note) = super::device::auto_fell_back(par.device, par.devices.is_some() || par.gpus.is_some(), device) {
        text = format!("{text}\n{note}");
    }
    // `lora_r` alone turns LoRA on here; TRL's scripts train it only under `use_peft`, which a
    // TRL recipe (YAML) or command line (TRL's spelling, `--lora_r`) would then be missing.
    let recipe = layered.file_name().is_some_and(|f| f.ends_with(".yaml") || f.ends_with(".yml"));
    let trl_flag = std::env::args().any(|a| a == "--lora_r" || a.starts_with("--lora_r="));
    if (recipe || trl_flag)
        && layered.origin("lora_r") != Origin::Default
        && layered.origin("use_peft") == Origin::Default
    {
        text.push_str(
            "\nnote: `lora_r` trains a LoRA adapter here; TRL's `trl dpo` trains one only with `use_peft` (without it, every weight)",
        );
    }
    text
}

/// What the command line asks for that cannot work, refused before any process starts: `sft`'s
/// unused keys, LoRA keys against a continued adapter's shape, a batch the devices cannot split.
fn check_before_start(layered: &mut Layered, args: &TrainArgs, sft_only: bool) -> anyhow::Result<()> {
    // The demo's embedded config and a resumed run's saved one hold every key: only the user's
    // own file and flags say what they asked for.
    if sft_only {
        check_sft_keys(layered, args.config.is_some())?;
    }
    adapter_keys(layered, args.config.is_some())?;
    if let Some(world) = planned_world(&args.parallel) {
        crate::train::stage::global_batch(&layered.cfg, world).map_err(|e| match e.downcast::<ConfigError>() {
            Ok(config) => layered.locate(config).into(),
            Err(other) => other,
        })?;
    }
    Ok(())
}

/// The processes `--devices cpu:N` or `--gpus N` / `--gpus 0,3` ask for, where the flags say
/// (`--gpus auto` counts the devices torch sees, later).
fn planned_world(par: &super::args::ParallelArgs) -> Option<usize> {
    if let Some(devices) = &par.devices {
        return devices.strip_prefix("cpu:")?.parse().ok();
    }
    let gpus = par.gpus.as_deref()?;
    gpus.parse::<usize>().ok().or_else(|| super::launch::listed_ids(gpus).map(|ids| ids.len()))
}

/// Refuses, before anything starts, CPU processes that cannot fit in this host's memory by
/// check-gpu's estimate for this model and batch: `--devices cpu:N` whose N processes would not
/// (the data at `max_length`), and one process whose weights, optimizer state and reference alone
/// would not. A model directory check-gpu cannot read is checked at a libtorch process's own.
/// Where they fit, but not at the high-water mark dpo-train keeps freed memory at
/// ([`crate::malloc::KEPT_FACTOR`] times), freed memory is returned to the system instead: the
/// note says so.
fn check_memory(cfg: &TrainConfig, plan: &RunPlan, par: &super::args::ParallelArgs) -> anyhow::Result<Option<String>> {
    let lone = "lower `--per-device-train-batch-size` or `--max-length`";
    let floor = ProcessMemory { each: check_gpu::memory::CUDA_CONTEXT_BYTES, basis: "a libtorch process's own", lone };
    let Ok(shape) = check_gpu::ModelShape::from_hf_dir(Path::new(&cfg.model_name_or_path)) else {
        super::launch::check_host_memory(par, floor)?;
        return Ok(None);
    };
    let world = par.devices.as_ref().and(planned_world(par)).unwrap_or(1) as u64;
    let finetune = match &plan.lora {
        Some(lora) => check_gpu::FineTune::Lora { rank: lora.r as u64 },
        None => check_gpu::FineTune::Full,
    };
    let reference =
        if cfg.precompute_ref_log_probs { check_gpu::Reference::Precompute } else { check_gpu::Reference::Keep };
    let e = check_gpu::estimate(&check_gpu::MemoryRequest {
        model: &shape,
        micro_batch: cfg.per_device_train_batch_size as u64,
        seq_len: cfg.max_length as u64,
        dtype: plan.precision,
        finetune,
        reference,
        gradient_checkpointing: cfg.gradient_checkpointing,
        world_size: world,
        sharding: plan.sharding,
        offload_optimizer: cfg.offload_optimizer,
        engine: check_gpu::memory::Engine::DpoTrain(
            check_gpu::PairTokens::bound(cfg.max_length as u64).batch(cfg.per_device_train_batch_size as u64),
        ),
        cuda: false,
        accumulation: cfg.gradient_accumulation_steps as u64,
    });
    let optimizer = e.optimizer.saturating_add(e.host);
    let state = e.weights.saturating_add(optimizer).saturating_add(e.reference);
    let bytes = check_gpu::units::bytes;
    let terms = [("weights", e.weights), ("optimizer state", optimizer), ("reference", e.reference)]
        .iter()
        .filter(|(_, b)| *b > 0)
        .map(|(name, b)| format!("{name} {}", bytes(*b)))
        .collect::<Vec<_>>()
        .join(", ");
    // The adapter's moments outweigh the base model only when the rank is what is too large.
    let advice = match finetune {
        check_gpu::FineTune::Lora { .. } if optimizer > e.weights => "lower `--lora-r`",
        check_gpu::FineTune::Lora { .. } => "the model needs a machine with more memory, or GPUs (`--gpus N`)",
        check_gpu::FineTune::Full => "train a LoRA adapter (`--lora-r 16`), or on GPUs (`--gpus N`)",
    };
    // One process first: when its state alone does not fit, fewer processes is no advice.
    super::launch::check_one_process(par, state, terms, advice)?;
    let basis = "check-gpu's estimate for this model and batch";
    let each = e.total.saturating_add(e.host);
    super::launch::check_host_memory(par, ProcessMemory { each, basis, lone })?;
    let available = check_gpu::probe::host_memory_available().filter(|_| super::launch::runs_on_cpu(par));
    Ok(match available.and_then(|a| kept_too_much(each, world, a)) {
        // The user's own allocator settings, if any, stay: then no note.
        Some(note) if crate::malloc::follow_live_tensors() => Some(note),
        _ => None,
    })
}

/// Where `world` processes of `each` bytes by check-gpu's estimate would not fit in `available`
/// at the high-water mark kept freed memory reaches: the note of the run that returns it instead.
fn kept_too_much(each: u64, world: u64, available: u64) -> Option<String> {
    let factor = crate::malloc::KEPT_FACTOR;
    let bytes = check_gpu::units::bytes;
    let n = if world == 1 { "1 process".to_owned() } else { format!("{world} processes") };
    (each.saturating_mul(world).saturating_mul(factor) > available).then(|| {
        format!(
            "host memory: {n} of {} by check-gpu's estimate could reach {factor}x that with freed memory kept, beyond the {} available: freed memory goes back to the system (slower on the CPU)",
            bytes(each),
            bytes(available)
        )
    })
}

/// `sft` trains at `learning_rate` for `max_steps` (or `num_train_epochs`) and evaluates nothing:
/// the warm-up's keys, set anywhere, and `--eval-file` on its command line would be ignored, so
/// they are refused (a config file shared with `train` may keep its `eval_file`). `own_file`: the
/// config file is the user's `--config`.
fn check_sft_keys(layered: &Layered, own_file: bool) -> Result<(), ConfigError> {
    let unused = [
        ("sft_steps", "`dpo-train sft` runs `max_steps` (or `num_train_epochs`); `sft_steps` sizes `train`'s warm-up"),
        ("sft_learning_rate", "`dpo-train sft` trains at `learning_rate`; `sft_learning_rate` is `train`'s warm-up's"),
        ("eval_file", "`dpo-train sft` does not evaluate"),
    ];
    for (key, why) in unused {
        let set = match layered.origin(key) {
            Origin::Flag => true,
            Origin::File => own_file && key != "eval_file",
            Origin::Default => false,
        };
        if set {
            return Err(layered.locate(ConfigError::Invalid { key, message: format!("not used: {why}") }));
        }
    }
    Ok(())
}

/// A run from a saved adapter continues it at its own shape: a LoRA key set to another value
/// than the adapter's would be ignored, so it is refused; `lora_dropout`, unless set, is the
/// adapter's own (which `final/adapter_config.json` then records). `own_file`: the config file is
/// the user's `--config`.
fn adapter_keys(layered: &mut Layered, own_file: bool) -> anyhow::Result<()> {
    let dir = PathBuf::from(&layered.cfg.model_name_or_path);
    let Some(saved) = crate::model::adapter_settings(&dir)? else { return Ok(()) };
    let set = |key| match layered.origin(key) {
        Origin::Flag => true,
        Origin::File => own_file,
        Origin::Default => false,
    };
    let cfg = &layered.cfg;
    let asked = crate::config::LoraSettings::new(1, 1.0, 0.0, &cfg.lora_target_modules).ok();
    let targets =
        asked.is_some_and(|a| a.target_modules == saved.target_modules && a.layer_modules == saved.layer_modules);
    let differs = [
        ("lora_r", cfg.lora_r == Some(saved.r), format!("r = {}", saved.r)),
        ("lora_alpha", cfg.lora_alpha == saved.alpha, format!("lora_alpha = {}", saved.alpha)),
        ("lora_target_modules", targets, format!("target_modules {}", saved.describe_targets())),
        ("use_rslora", cfg.use_rslora == saved.use_rslora, format!("use_rslora = {}", saved.use_rslora)),
        ("use_dora", cfg.use_dora == saved.use_dora, format!("use_dora = {}", saved.use_dora)),
    ];
    if let Some((key, _, has)) = differs.into_iter().find(|(key, same, _)| set(key) && !same) {
        let message = format!(
            "`{}` is an adapter with {has}, which training continues at its own shape: drop this setting, or train a new adapter on its base",
            dir.display()
        );
        return Err(layered.locate(ConfigError::Invalid { key, message }).into());
    }
    if !set("lora_dropout") {
        layered.cfg.lora_dropout = saved.config_dropout;
    }
    Ok(())
}

/// What the command line asks for, read once.
/// A second Ctrl-C killed the workers: what was lost, and where to resume from (`run_dir`: the
/// one named for them or resumed, else the config's).
fn aborted(cfg: &TrainConfig, run_dir: Option<PathBuf>) -> ExitCode {
    eprintln!("interrupt: aborted; the steps since the last checkpoint were not saved");
    let run_dir = run_dir.or_else(|| cfg.run_name.as_ref().map(|n| cfg.output_dir.join(n)));
    // The DPO stage's checkpoints, else the warm-up's.
    let latest = run_dir.as_deref().and_then(|dir| {
        let stages = [dir.to_owned(), dir.join(crate::run::SFT_DIR)];
        Some((dir, stages.iter().find_map(|d| crate::train::checkpoint::latest(d))?))
    });
    match latest {
        Some((dir, ckpt)) => eprintln!("resume from `{}` with `--resume {}`", ckpt.display(), dir.display()),
        None => eprintln!("no checkpoint was saved yet: the run starts again from step 0"),
    }
    ExitCode::from(INTERRUPTED)
}

struct Resolved {
    layered: Layered,
    /// The run's default name.
    name: String,
    /// The run directory to resume.
    resume: Option<PathBuf>,
    /// The values read from the Hugging Face cache.
    found: Vec<Found>,
    /// The changes `--resume-with-changes` accepted, a line each, shown with the config (by rank
    /// 0 alone: every process resolves the config).
    changes: Vec<String>,
}

/// The config layers, with Hub names read from the local cache.
fn resolve(args: &TrainArgs) -> anyhow::Result<Resolved> {
    let flags = &args.overrides.values;
    let (file, name) = match &args.config {
        Some(path) => (Some(ConfigFile::read(path)?), stem(path)),
        None if is_demo(flags) => {
            let demo = ConfigFile { name: "configs/demo.toml (embedded)".into(), text: DEMO_CONFIG.into() };
            (Some(demo), DEMO.to_owned())
        }
        None => (None, config_name(None, flags)),
    };
    let dir = match &args.resume {
        None => {
            let mut layered = Layered::new(file, flags)?;
            let found = layered.find_in_hub_cache()?;
            return Ok(Resolved { layered, name, resume: None, found, changes: Vec::new() });
        }
        Some(Some(dir)) => run_of(dir)?,
        // The run the config and flags name under their output_dir, else the newest there.
        Some(None) => {
            let cfg = Layered::new(file, flags)?.cfg;
            match &cfg.run_name {
                Some(name) => cfg.output_dir.join(name),
                None => crate::run::newest_run(&cfg.output_dir)?,
            }
        }
    };
    // A resumed run continues with the config it saved; flags still override it.
    let saved = dir.join("config.toml");
    if !saved.is_file() {
        let why = match dir.exists() {
            true => "is not a run directory (no config.toml in it)",
            false => "does not exist",
        };
        anyhow::bail!(ConfigError::Invalid { key: "resume", message: format!("`{}` {why}", dir.display()) });
    }
    let mut layered = Layered::new(Some(ConfigFile::read(&saved)?), flags)?;
    check_resume_place(&layered, &dir)?;
    // Before the comparison: a flag naming the cached model the run saved changes nothing.
    let found = layered.find_in_hub_cache()?;
    let changes =
        check_resume_changes(&TrainConfig::from_toml_file(&saved)?, &layered.cfg, &saved, args.resume_with_changes)?;
    Ok(Resolved { layered, name: String::new(), resume: Some(dir), found, changes })
}

/// The run `--resume PATH` continues: PATH itself, or the run of the checkpoint PATH names (as
/// TRL's `resume_from_checkpoint` takes one) when it is the checkpoint a resume of that run loads.
/// An older one is refused, naming what is newer: resumed from, it would train over them.
fn run_of(path: &Path) -> anyhow::Result<PathBuf> {
    // Absolute, so that `--resume step-3` from inside `checkpoints/` still sees where it is.
    let whole = std::path::absolute(path).unwrap_or_else(|_| path.to_owned());
    let Some(named) = crate::train::checkpoint::Named::of(&whole, crate::run::SFT_DIR) else {
        // The warm-up's folder stands for its run: the run resumes the warm-up, then trains on.
        return Ok(match (whole.file_name(), whole.parent()) {
            (Some(name), Some(run)) if name == crate::run::SFT_DIR && run.join("config.toml").is_file() => {
                run.to_owned()
            }
            _ => path.to_owned(),
        });
    };
    let newer = named.newer();
    let Some(first) = newer.first() else { return Ok(named.run_dir) };
    let (after, them) = match newer.len() {
        1 => (format!("`{}` came", first.display()), "it"),
        n => (format!("`{}` and {} more came", first.display(), n - 1), "them"),
    };
    let message = format!(
        "`{}` is not the newest checkpoint of its run: {after} after it, and a resume from it would train over {them}: move {them} out of the run to resume from it, or `--resume {}` to continue from the newest",
        path.display(),
        named.run_dir.display()
    );
    Err(ConfigError::Invalid { key: "resume", message }.into())
}

/// `--run-name` and `--output-dir` place a new run; a resumed one stays in `dir`. A flag naming
/// another place is refused: it was ignored, yet written into the run's saved config.
fn check_resume_place(layered: &Layered, dir: &Path) -> anyhow::Result<()> {
    let cfg = &layered.cfg;
    let same = |a: &Path, b: &Path| {
        a == b || matches!((std::fs::canonicalize(a), std::fs::canonicalize(b)), (Ok(x), Ok(y)) if x == y)
    };
    let flagged = |key| layered.origin(key) == Origin::Flag;
    let elsewhere = match (&cfg.run_name, dir.file_name(), dir.parent()) {
        (Some(name), Some(own), _) if flagged("run_name") && own != name.as_str() => Some("run_name"),
        (_, _, Some(parent)) if flagged("output_dir") && !same(&cfg.output_dir, parent) => Some("output_dir"),
        _ => None,
    };
    let Some(key) = elsewhere else { return Ok(()) };
    let message = format!(
        "a resumed run stays in `{}`: drop the flag to resume it there, or start a run under another name without `--resume`",
        dir.display()
    );
    Err(layered.locate(ConfigError::Invalid { key, message }).into())
}

/// A resume whose flags change what is trained is refused (naming the first such key and both
/// values), or with `--resume-with-changes` returns a line saying each change; a change of the
/// weights' shape (LoRA or not, the rank, the adapted projections, DoRA) is refused either way.
fn check_resume_changes(
    saved: &TrainConfig,
    now: &TrainConfig,
    file: &Path,
    accepted: bool,
) -> anyhow::Result<Vec<String>> {
    let changes = crate::config::resume::changes(saved, now);
    let Some(first) = changes.first() else { return Ok(Vec::new()) };
    if let Some(c) = changes.iter().find(|c| crate::config::resume::SHAPE_KEYS.contains(&c.key)) {
        let message = format!(
            "`{}` is {} in `{}` and {} now: the run's checkpoints hold weights of the saved shape, so a resume cannot change it, even with `--resume-with-changes`; to train another shape, start a new run from the run's `final/` or a checkpoint (`--model DIR`)",
            c.key,
            c.saved,
            file.display(),
            c.now
        );
        anyhow::bail!(ConfigError::Invalid { key: "resume", message });
    }
    if accepted {
        let said = |c: &crate::config::resume::Change| {
            format!("resuming with a change: `{}` = {} (was {} in `{}`)", c.key, c.now, c.saved, file.display())
        };
        return Ok(changes.iter().map(said).collect());
    }
    let more = match changes.len() {
        1 => String::new(),
        n => format!(" (and {} more key(s))", n - 1),
    };
    let message = format!(
        "`{}` is {} in `{}` and {} now{more}: that changes what is trained; pass `--resume-with-changes` to continue with it",
        first.key,
        first.saved,
        file.display(),
        first.now
    );
    Err(ConfigError::Invalid { key: "resume", message }.into())
}

/// The demo runs when no model is named, or the model is `demo`.
fn is_demo(flags: &[(String, String)]) -> bool {
    let last = |key: &str| flags.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v.as_str());
    match last("model_name_or_path") {
        Some(model) => model == DEMO,
        None => last("train_file").is_none(),
    }
}

/// What a run's default name says after its date and time: the config file's stem, else the
/// model directory's name, else `run`.
pub(super) fn config_name(config: Option<&Path>, flags: &[(String, String)]) -> String {
    if let Some(path) = config {
        return stem(path);
    }
    let model = flags.iter().rev().find(|(k, _)| k == "model_name_or_path").map(|(_, v)| v.as_str());
    // A model directory's whole name (`Qwen2.5-0.5B`, not its "stem" `Qwen2.5-0`).
    let base = |m: &str| Path::new(m).file_name().map(|n| n.to_string_lossy().into_owned());
    model.and_then(base).unwrap_or_else(|| "run".to_owned())
}

fn stem(path: &Path) -> String {
    path.file_stem().map_or_else(|| "run".to_owned(), |s| s.to_string_lossy().into_owned())
}

fn indent(text: &str) -> String {
    text.lines().map(|l| format!("  {l}")).collect::<Vec<_>>().join("\n")
}

fn print_summary(summary: &RunSummary) -> anyhow::Result<()> {
    // Only what was measured: a run without eval_file / test_file has no such line.
    std::io::stdout().lock().write_all(summary.text().as_bytes())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    /// Kept freed memory is given up only where its high-water mark would not fit.
    #[test]
    fn freed_memory_goes_back_only_where_keeping_it_would_not_fit() {
        let gib = 1u64 << 30;
        assert_eq!(super::kept_too_much(2 * gib, 3, 18 * gib), None);
        let note = super::kept_too_much(2 * gib, 3, 17 * gib).unwrap();
        assert_eq!(
            note,
            "host memory: 3 processes of 2.0 GiB by check-gpu's estimate could reach 3x that with freed memory kept, beyond the 17.0 GiB available: freed memory goes back to the system (slower on the CPU)"
        );
        assert!(super::kept_too_much(u64::MAX, 1, gib).unwrap().starts_with("host memory: 1 process of "));
    }
}
