//! A whole training run, as `dpo-train train` (and bare `dpo-train`) performs it: resolve the
//! config and run directory, build the demo's assets when asked, read and tokenise the data once,
//! then run the supervised warm-up (if any) and DPO as stages of one run directory.

use std::path::{Path, PathBuf};

use anyhow::Context;

pub use self::inputs::{read_options, skipped_note, warm_data_cache};

use crate::config::{ConfigError, RunPlan, TrainConfig};
use crate::demo::{self, DEMO, DemoAssets};
use crate::report;

pub mod claim;
pub mod device;
mod inputs;
use crate::train::{
    DrawPlots, Objective, Progress, Run, RunData, Runtime, Stage, StageOutcome, WandbTarget, Workers, run_stage,
};

/// What `dpo-train train` or `dpo-train sft` was asked to do.
pub struct RunRequest<'a> {
    pub cfg: TrainConfig,
    /// `cfg` resolved (`TrainConfig::resolve`, or the `Layered::validate` that checked it).
    pub plan: RunPlan,
    /// Names the run directory by default (`<date>-<time>-<config_name>`).
    pub config_name: String,
    /// `Some(None)`: resume the newest run under `output_dir`; `Some(Some(dir))`: that run.
    pub resume: Option<Option<PathBuf>>,
    /// Only the supervised stage (`dpo-train sft`).
    pub sft_only: bool,
    /// The device, the Ctrl-C flag and the workers.
    pub rt: Runtime<'a>,
    /// The effective config as shown at the start (where each value came from), printed once
    /// the inputs are checked; empty to print nothing.
    pub config_description: String,
}

/// How the run went.
#[derive(Debug, Clone)]
pub struct RunSummary {
    pub run_dir: PathBuf,
    pub sft: Option<StageOutcome>,
    pub dpo: Option<StageOutcome>,
    /// The demo's greedy arithmetic accuracy on its test split: (after SFT, after DPO), each
    /// (correct, asked).
    pub demo_arithmetic: Option<((usize, usize), (usize, usize))>,
    /// `summary.txt` as the run wrote it when it finished, printed again by a resume that found
    /// nothing to train.
    pub recorded: Option<String>,
}

impl RunSummary {
    /// Whether a stage stopped on Ctrl-C.
    pub fn interrupted(&self) -> bool {
        [&self.sft, &self.dpo].into_iter().flatten().any(|s| s.interrupted)
    }

    /// What the run did, as printed at its end (and kept in `summary.txt`): the stages, the last
    /// held-out and test metrics when there were such data, the demo's arithmetic.
    pub fn text(&self) -> String {
        if let Some(recorded) = &self.recorded {
            return recorded.clone();
        }
        let mut out = format!("run: {}\n", self.run_dir.display());
        if let Some(sft) = &self.sft {
            out += &format!("sft: {} steps -> {}\n", sft.steps, sft.model_dir.display());
        }
        if let Some(dpo) = &self.dpo {
            out += &format!("dpo: {} steps -> {}\n", dpo.steps, dpo.model_dir.display());
            for (label, metrics) in [("eval", &dpo.eval), ("test", &dpo.test)] {
                if let Some(m) = metrics {
                    out += &format!(
                        "{label}: {}  rewards/chosen {:.4}  rewards/rejected {:.4}\n",
                        m.headline("  "),
                        m.rewards_chosen,
                        m.rewards_rejected
                    );
                }
            }
        }
        if let Some(((c0, n0), (c1, n1))) = self.demo_arithmetic {
            let pct = |c: usize, n: usize| 100.0 * c as f64 / n.max(1) as f64;
            out += &format!(
                "held-out arithmetic answered correctly (greedy): after SFT {c0}/{n0} ({:.1}%), after DPO {c1}/{n1} ({:.1}%)\n",
                pct(c0, n0),
                pct(c1, n1)
            );
        }
        out
    }
}

/// The CPU and thread count a run's numbers came from: float results differ between instruction
/// sets (AVX2, AVX-512, AMX take other kernels), so a result is reproducible on the same kind.
pub fn machine() -> String {
    let threads = tch::get_num_threads();
    format!("{}, {threads} torch thread{}", machine_cpu(), if threads == 1 { "" } else { "s" })
}

/// The CPU model and the instruction sets among those that pick torch's kernels.
pub fn machine_cpu() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |name: &str| {
        info.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_owned())
            .unwrap_or_default()
    };
    let flags = field("flags");
    let isa: Vec<&str> = ["avx2", "avx512f", "avx512_bf16", "amx_bf16"]
        .into_iter()
        .filter(|f| flags.split(' ').any(|x| x == *f))
        .collect();
    format!("{} ({})", field("model name"), isa.join(" "))
}

/// Runs the request to its end.
pub fn run(req: RunRequest, progress: &mut dyn Progress) -> anyhow::Result<RunSummary> {
    // `sft` reads the rows as the supervised stage alone trains on them.
    let req = if req.sft_only { RunRequest { plan: req.plan.sft_only(), ..req } } else { req };
    let workers = req.rt.workers;
    let (run_dir, resume) = run_dir(&req.cfg, req.resume.as_ref(), &req.config_name)?;
    // Every rank checked for an earlier run before rank 0 claims anything; rank 0 holds the
    // directory for the run (it alone writes there).
    workers.barrier("run directory")?;
    let generated = !resume && req.cfg.run_name.is_none();
    let claimed = if workers.is_main() { Some(claim::claim(&run_dir, generated)?) } else { None };
    let run_dir = claimed.as_ref().map_or(run_dir, |c| c.dir.clone());
    let result = run_in(&req, run_dir, resume, progress);
    if let (Err(_), Some(claimed)) = (&result, &claimed) {
        claimed.remove_if_unused();
    }
    result
}

/// [`run`] in the claimed `run_dir`.
fn run_in(req: &RunRequest, run_dir: PathBuf, resume: bool, progress: &mut dyn Progress) -> anyhow::Result<RunSummary> {
    let (workers, cfg) = (req.rt.workers, &req.cfg);
    let Prepared { model_dir, data, demo_assets, wandb_python, rewrites } = prepare(req, &run_dir, resume, progress)?;
    let run = Run { cfg, plan: &req.plan, data: &data, rt: &req.rt, rewrites: &rewrites };
    let tensorboard = cfg.tensorboard_dir(&run_dir);
    let run_name = run_dir.file_name().unwrap_or_default().to_string_lossy().into_owned();
    // With TensorBoard the plots are redrawn at each evaluation and the dashboard logged there.
    let redraw = |dir: &Path| draw_plots(dir, cfg);
    let base = Stage {
        objective: Objective::Dpo,
        dir: &run_dir,
        run_dir: &run_dir,
        model_dir: &model_dir,
        ref_dir: cfg.ref_model_name_or_path.as_deref(),
        learning_rate: cfg.learning_rate,
        steps: (cfg.max_steps > 0).then_some(cfg.max_steps as u64),
        resume,
        tensorboard: tensorboard.as_deref(),
        wandb: wandb_python.as_deref().map(|python| WandbTarget { python, run: &run_name }),
        draw_plots: tensorboard.is_some().then_some(&redraw as &DrawPlots),
    };
    if req.sft_only {
        let outcome = run_stage(&run, &Stage { objective: Objective::Sft, ..base }, progress)?;
        let done = outcome.already_done;
        if !done {
            render_plots(&run_dir, cfg, workers, progress);
        }
        let summary = RunSummary { run_dir, sft: Some(outcome), dpo: None, demo_arithmetic: None, recorded: None };
        if !done {
            write_summary(&summary, req)?;
        }
        return Ok(summary);
    }
    let (sft, start_dir) = match warm_up(&run, &base, progress)? {
        WarmUp::Interrupted(outcome) => {
            return Ok(RunSummary { run_dir, sft: Some(outcome), dpo: None, demo_arithmetic: None, recorded: None });
        }
        WarmUp::Ready(sft, start_dir) => (sft, start_dir),
    };
    let dpo = run_stage(&run, &Stage { model_dir: &start_dir, ..base }, progress)?;
    if dpo.already_done {
        let recorded = std::fs::read_to_string(run_dir.join("summary.txt")).ok();
        return Ok(RunSummary { run_dir, sft, dpo: Some(dpo), demo_arithmetic: None, recorded });
    }
    render_plots(&run_dir, cfg, workers, progress);

    let demo_arithmetic = match (&demo_assets, dpo.interrupted || !workers.is_main()) {
        (Some(assets), false) => {
            Some(demo::before_and_after(&start_dir, &dpo.model_dir, &data.tokenizer, assets, &req.rt.device)?)
        }
        _ => None,
    };
    let summary = RunSummary { run_dir, sft, dpo: Some(dpo), demo_arithmetic, recorded: None };
    write_summary(&summary, req)?;
    Ok(summary)
}

/// `summary.txt` of a run that finished (rank 0): what it did, the machine and the devices.
fn write_summary(summary: &RunSummary, req: &RunRequest) -> anyhow::Result<()> {
    let workers = req.rt.workers;
    if !workers.is_main() || summary.interrupted() {
        return Ok(());
    }
    let path = summary.run_dir.join("summary.txt");
    let device = device::describe(&req.rt.device, Some(req.plan.precision), workers.world_size());
    let text = format!("{}machine: {}\n{device}\n", summary.text(), machine());
    crate::fsutil::write_atomic(&path, text.as_bytes()).with_context(|| format!("cannot write `{}`", path.display()))
}

/// What a run has checked and read before its first stage, its run directory made.
struct Prepared {
    model_dir: PathBuf,
    data: RunData,
    demo_assets: Option<DemoAssets>,
    /// The python that logs to W&B, where the run reports there.
    wandb_python: Option<PathBuf>,
    /// A resume's `config.toml` and `data_report.json`, written when a stage starts.
    rewrites: Vec<(PathBuf, String)>,
}

/// Clears what a dead writer left in `run_dir`, checks the settings that need the machine (W&B's
/// python, TF32, a resume's batch), builds the demo's assets, reads the inputs, writes
/// `data_report.json` and `config.toml` (a resume's later) and prints the config and the inputs'
/// notes.
fn prepare(req: &RunRequest, run_dir: &Path, resume: bool, progress: &mut dyn Progress) -> anyhow::Result<Prepared> {
    let (workers, cfg) = (req.rt.workers, &req.cfg);
    if workers.is_main() {
        // This process holds the directory: anything half-written there is a dead writer's.
        for dir in [run_dir.join(SFT_DIR), run_dir.to_path_buf()] {
            for stale in crate::train::checkpoint::remove_staging(&dir) {
                progress.line(&format!("removed `{}`, left by a writer that died", stale.display()));
            }
        }
    }
    // A TensorBoard directory that cannot be made is refused before anything is written.
    if let Some(dir) = cfg.logging_dir.as_ref().filter(|_| cfg.tensorboard_dir(run_dir).is_some()) {
        crate::fsutil::check_dir_creatable(dir)
            .map_err(|message| ConfigError::Invalid { key: "logging_dir", message })?;
    }
    // W&B's python is found before anything is written: a run that cannot log where it was asked
    // to is refused as bad input (`all` takes W&B only where it is installed).
    let wandb_python = match cfg.reports_to_wandb().filter(|_| workers.is_main()) {
        Some(true) => {
            Some(crate::wandb::python().map_err(|message| ConfigError::Invalid { key: "report_to", message })?)
        }
        Some(false) => crate::wandb::python().ok(),
        None => None,
    };
    if let Some(enable) = cfg.tf32 {
        device::set_tf32(enable, &req.rt.device).map_err(|message| ConfigError::Invalid { key: "tf32", message })?;
    }
    if resume {
        crate::train::resume::check_resume_batch(&[&run_dir.join(SFT_DIR), run_dir], cfg, workers.world_size())?;
        crate::train::resume::check_resumable(run_dir, &run_dir.join(SFT_DIR), cfg)?;
        let objective = if req.sft_only { Objective::Sft } else { Objective::Dpo };
        crate::train::resume::check_resume_objective(run_dir, objective)?;
    }
    let demo_assets = if uses_demo(cfg) { Some(prepare_demo(run_dir, req, progress)?) } else { None };
    // Models, tokenizer and data are checked before the run directory exists: a refused run
    // leaves nothing behind. Their notes follow the config.
    let inputs::Inputs { model_dir, data, reports, mut notes } =
        inputs::load_inputs(cfg, req.plan.truncation, demo_assets.as_ref(), req.rt.interrupt, progress)?;
    if resume {
        crate::train::resume::check_resume_model(&[&run_dir.join(SFT_DIR), run_dir], &model_dir)?;
    }
    // The run's config from its start, before a warm-up: `--resume RUN` reads it there, and a
    // warm-up stopped by Ctrl-C resumes with the run, not as a run of its own. A resume rewrites
    // them once a stage has loaded its checkpoint ([`Run::rewrites`]).
    let files = vec![
        (run_dir.join("data_report.json"), serde_json::to_string_pretty(&reports)? + "\n"),
        (run_dir.join("config.toml"), cfg.to_toml()),
    ];
    let mut rewrites = Vec::new();
    if workers.is_main() && resume {
        let saved = std::fs::read_to_string(&files[0].0).unwrap_or_default();
        notes.extend(inputs::data_changed_note(&saved, &files[0].1));
        rewrites = files;
    } else if workers.is_main() {
        std::fs::create_dir_all(run_dir).with_context(|| format!("cannot create `{}`", run_dir.display()))?;
        for (path, text) in files {
            crate::fsutil::write_atomic(&path, text.as_bytes())
                .with_context(|| format!("cannot write `{}`", path.display()))?;
        }
    }
    if !req.config_description.is_empty() {
        progress.line(&req.config_description);
    }
    progress.line(&format!("run directory `{}`", run_dir.display()));
    notes.iter().for_each(|line| progress.line(line));
    Ok(Prepared { model_dir, data, demo_assets, wandb_python, rewrites })
}

/// Where the supervised warm-up left the run.
enum WarmUp {
    /// Stopped by Ctrl-C.
    Interrupted(StageOutcome),
    /// DPO starts from this directory (the warm-up's `final/`, or the model itself without one).
    Ready(Option<StageOutcome>, PathBuf),
}

/// The warm-up's stage directory inside the run's.
pub const SFT_DIR: &str = "sft";

/// The supervised warm-up (`sft_steps > 0`) in `<run>/sft/`, unless a finished one is there.
fn warm_up(run: &Run, base: &Stage, progress: &mut dyn Progress) -> anyhow::Result<WarmUp> {
    let cfg = run.cfg;
    let sft_dir = base.dir.join(SFT_DIR);
    if cfg.sft_steps == 0 {
        return Ok(WarmUp::Ready(None, base.model_dir.to_owned()));
    }
    let finished = sft_dir.join("final");
    if crate::train::checkpoint::model_file(&finished).is_some() {
        progress.line(&format!("supervised warm-up already done: `{}`", finished.display()));
        return Ok(WarmUp::Ready(None, finished));
    }
    let stage = Stage {
        objective: Objective::Sft,
        dir: &sft_dir,
        learning_rate: cfg.sft_learning_rate,
        steps: Some(cfg.sft_steps),
        ..*base
    };
    let outcome = run_stage(run, &stage, progress)?;
    render_plots(&sft_dir, cfg, run.rt.workers, progress);
    if outcome.interrupted {
        return Ok(WarmUp::Interrupted(outcome));
    }
    let dir = outcome.model_dir.clone();
    Ok(WarmUp::Ready(Some(outcome), dir))
}

/// Draws a stage's plots from its `metrics.csv` (rank 0 writes every file). The plots are a view
/// of the metrics: one that cannot be drawn (a full disk) is a warning naming the command that
/// draws them later, not a failure of the run whose model is saved.
fn render_plots(dir: &Path, cfg: &TrainConfig, workers: Workers, progress: &mut dyn Progress) {
    if workers.is_main()
        && let Err(e) = draw_plots(dir, cfg)
    {
        let again = format!("`dpo-train plot {}` draws them", dir.display());
        progress.line(&format!("warning: the plots were not drawn ({e:#}): {again}"));
    }
}

/// Draws the plots of the stage in `dir`; returns the dashboard's path.
fn draw_plots(dir: &Path, cfg: &TrainConfig) -> anyhow::Result<PathBuf> {
    let run_name = dir.file_name().map_or_else(|| dir.display().to_string(), |n| n.to_string_lossy().into_owned());
    let meta = report::PlotMeta { run_name, model: cfg.model_name_or_path.clone(), beta: cfg.loss.beta };
    let mut written = report::render_run(dir, &meta)?;
    // `render_run` returns the files in `PLOT_FILES` order, the dashboard last.
    written.pop().context("no dashboard drawn")
}

/// Whether any part of the run is the demo's.
fn uses_demo(cfg: &TrainConfig) -> bool {
    cfg.model_name_or_path == DEMO
        || [Some(&cfg.train_file), cfg.eval_file.as_ref(), cfg.test_file.as_ref()].contains(&Some(&DEMO.to_owned()))
}

/// The demo's data, tokenizer and random model under `<run>/demo/`: rank 0 builds them, the
/// others read them once it is done.
fn prepare_demo(run_dir: &Path, req: &RunRequest, progress: &mut dyn Progress) -> anyhow::Result<DemoAssets> {
    progress.line("building the demo's data, tokenizer and random model");
    let dir = run_dir.join("demo");
    if req.rt.workers.is_main() {
        demo::prepare(&dir, req.cfg.seed, &req.rt.device)?;
    }
    req.rt.workers.barrier("demo files")?;
    demo::prepare(&dir, req.cfg.seed, &req.rt.device)
}

/// A run's name where the config gives none: the date and time, then what its config is called.
pub fn default_run_name(config_name: &str) -> String {
    format!("{}-{}", crate::clock::timestamp(), config_name)
}

/// Whether `dir` holds a run's model that a new run there would write over: a checkpoint, or a
/// `final/` (a finished stage's, which may have kept no checkpoint), of the run or of its
/// warm-up (a new run would overwrite the warm-up's checkpoints, or start DPO from its `final/`
/// whatever the new run's warm-up settings). A run that failed before either may be run again
/// under its name.
fn holds_a_run(dir: &Path) -> bool {
    [dir.to_owned(), dir.join(SFT_DIR)].iter().any(|stage| crate::train::checkpoint::holds_a_model(stage))
}

/// The run under `output_dir` that trained last (`--resume` without a directory): by when its
/// metrics (or its warm-up's, or its config) were last written, which drawing its plots again
/// (`dpo-train plot`) or reading it does not change, as it changes the directory's own time.
pub fn newest_run(output_dir: &Path) -> Result<PathBuf, ConfigError> {
    let entries = std::fs::read_dir(output_dir).map_err(|e| ConfigError::Invalid {
        key: "resume",
        message: format!("cannot list `{}` to find a run to resume: {e}", output_dir.display()),
    })?;
    let modified = |p: PathBuf| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let last_trained = |dir: &Path| ["metrics.csv", "sft/metrics.csv", "config.toml"].map(|f| modified(dir.join(f)));
    let newest = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|dir| dir.join("config.toml").is_file())
        .max_by_key(|dir| last_trained(dir).into_iter().flatten().max());
    let message = format!("no run to resume under `{}` (no directory there holds a config.toml)", output_dir.display());
    newest.ok_or(ConfigError::Invalid { key: "resume", message })
}

/// The run directory, and whether to resume in it (`resume`: as [`RunRequest::resume`]).
pub fn run_dir(
    cfg: &TrainConfig,
    resume: Option<&Option<PathBuf>>,
    config_name: &str,
) -> anyhow::Result<(PathBuf, bool)> {
    match resume {
        Some(Some(dir)) => Ok((dir.clone(), true)),
        Some(None) => Ok((newest_run(&cfg.output_dir)?, true)),
        None => {
            // Bad input, said before any work (creating the run directory under it would fail late).
            if cfg.output_dir.exists() && !cfg.output_dir.is_dir() {
                let message = format!("`{}` is a file, not a directory", cfg.output_dir.display());
                anyhow::bail!(crate::config::ConfigError::Invalid { key: "output_dir", message });
            }
            let name = cfg.run_name.clone().unwrap_or_else(|| default_run_name(config_name));
            let dir = cfg.output_dir.join(name);
            // A name made up here that a run of the same second took gets a suffix when claimed.
            if cfg.run_name.is_some() && holds_a_run(&dir) {
                let message = format!(
                    "`{}` already holds a run: pass `--resume {}` or another `--run-name`",
                    dir.display(),
                    dir.display()
                );
                anyhow::bail!(crate::config::ConfigError::Invalid { key: "run_name", message });
            }
            Ok((dir, false))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use super::*;

    /// `--resume` alone takes the run that trained last: by its metrics' time (or its warm-up's,
    /// or its config's), not by the directory's, which drawing a run's plots again changes.
    #[test]
    fn the_newest_run_is_the_one_that_trained_last() {
        let out = tempfile::tempdir().unwrap();
        let at = |path: PathBuf, secs: u64| {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            let file = std::fs::File::create(&path).unwrap();
            file.set_modified(SystemTime::UNIX_EPOCH + Duration::from_secs(secs)).unwrap();
        };
        for (run, trained) in [("a", 2_000), ("b", 1_000)] {
            at(out.path().join(run).join("config.toml"), 500);
            at(out.path().join(run).join("metrics.csv"), trained);
        }
        // The older run's plots drawn again now: its directory is the newest.
        std::fs::write(out.path().join("b/loss.png"), b"png").unwrap();
        assert_eq!(newest_run(out.path()).unwrap(), out.path().join("a"));
        // A warm-up that trained after both.
        at(out.path().join("c/config.toml"), 500);
        at(out.path().join("c/sft/metrics.csv"), 3_000);
        assert_eq!(newest_run(out.path()).unwrap(), out.path().join("c"));
        let empty = tempfile::tempdir().unwrap();
        assert!(newest_run(empty.path()).unwrap_err().to_string().contains("no run to resume under"));
    }
}
