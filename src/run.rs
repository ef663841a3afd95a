//! A whole training run, as `dpo-train train` (and bare `dpo-train`) performs it: resolve the
//! config and run directory, build the demo's assets when asked, read and tokenise the data once,
//! then run the supervised warm-up (if any) and DPO as stages of one run directory.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use anyhow::Context;
use burn::tensor::Device;

use crate::config::TrainConfig;
use crate::data::{self, Columns, LoadOptions, TokenizedPair};
use crate::demo::{self, DEMO, DemoAssets};
use crate::dist::Workers;
use crate::model;
use crate::tokenizer::Tokenizer;
use crate::train::trainer::{Objective, Progress, RunData, Stage, StageOutcome, run_stage};

/// What `dpo-train train` or `dpo-train sft` was asked to do.
pub struct RunRequest<'a> {
    pub cfg: TrainConfig,
    /// Names the run directory by default (`<date>-<time>-<config_name>`).
    pub config_name: String,
    /// `Some(None)`: resume the newest run under `output_dir`; `Some(Some(dir))`: that run.
    pub resume: Option<Option<PathBuf>>,
    /// Only the supervised stage (`dpo-train sft`).
    pub sft_only: bool,
    pub device: Device,
    pub interrupt: &'a AtomicBool,
    /// The data-parallel workers this process is one of (rank 0 writes every file).
    pub workers: Workers<'a>,
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
}

impl RunSummary {
    /// Whether a stage stopped on Ctrl-C.
    pub fn interrupted(&self) -> bool {
        [&self.sft, &self.dpo].into_iter().flatten().any(|s| s.interrupted)
    }
}

/// Runs the request to its end.
pub fn run(req: RunRequest, progress: &mut dyn Progress) -> anyhow::Result<RunSummary> {
    let workers = req.workers;
    let (run_dir, resume) = run_dir(&req)?;
    // Every rank checked for an earlier run before rank 0 creates anything.
    workers.barrier()?;
    let cfg = &req.cfg;
    if workers.is_main() {
        std::fs::create_dir_all(&run_dir).with_context(|| format!("cannot create `{}`", run_dir.display()))?;
    }
    progress.line(&format!("run directory `{}`", run_dir.display()));

    let uses_demo = cfg.model_name_or_path == DEMO
        || [Some(&cfg.train_file), cfg.eval_file.as_ref(), cfg.test_file.as_ref()].contains(&Some(&DEMO.to_owned()));
    let demo_assets = if uses_demo {
        progress.line("building the demo's data, tokenizer and random model");
        // Rank 0 builds the assets; the others read them once it is done.
        let assets =
            if workers.is_main() { Some(demo::prepare(&run_dir.join("demo"), cfg.seed, &req.device)?) } else { None };
        workers.barrier()?;
        match assets {
            Some(a) => Some(a),
            None => Some(demo::prepare(&run_dir.join("demo"), cfg.seed, &req.device)?),
        }
    } else {
        None
    };
    let model_dir = match (cfg.model_name_or_path.as_str(), &demo_assets) {
        (DEMO, Some(a)) => a.model_dir.clone(),
        (path, _) => PathBuf::from(path),
    };
    let tokenizer_dir = match &cfg.tokenizer_name_or_path {
        Some(dir) => dir.clone(),
        None => model::tokenizer_dir(&model_dir)?,
    };
    let tokenizer = Tokenizer::from_dir(&tokenizer_dir)?;
    let vocab = model::load_config(&model_dir)?.vocab_size;
    if tokenizer.vocab_size() > vocab {
        anyhow::bail!(crate::eval::EvalError::Vocab {
            tokens: tokenizer.vocab_size(),
            dir: model_dir,
            vocab_size: vocab
        });
    }
    let mut split = |file: Option<&String>, pick: fn(&DemoAssets) -> &PathBuf| -> anyhow::Result<Vec<TokenizedPair>> {
        let path = match (file.map(String::as_str), &demo_assets) {
            (None, _) => return Ok(Vec::new()),
            (Some(DEMO), Some(a)) => pick(a).clone(),
            (Some(path), _) => PathBuf::from(path),
        };
        load_pairs(&path, cfg, &tokenizer, progress)
    };
    let data = RunData {
        train: split(Some(&cfg.train_file), |a| &a.train)?,
        eval: split(cfg.eval_file.as_ref(), |a| &a.val)?,
        test: split(cfg.test_file.as_ref(), |a| &a.test)?,
        tokenizer,
        tokenizer_dir,
    };

    let max_steps = (cfg.max_steps > 0).then_some(cfg.max_steps as u64);
    let base = Stage {
        objective: Objective::Dpo,
        dir: &run_dir,
        cfg,
        learning_rate: cfg.learning_rate,
        steps: max_steps,
        model_dir: &model_dir,
        ref_dir: cfg.ref_model_name_or_path.as_deref(),
        data: &data,
        device: &req.device,
        resume,
        interrupt: req.interrupt,
        workers,
    };
    if req.sft_only {
        let outcome = run_stage(&Stage { objective: Objective::Sft, ..base }, progress)?;
        return Ok(RunSummary { run_dir, sft: Some(outcome), dpo: None, demo_arithmetic: None });
    }

    // The supervised warm-up, unless a finished one is already there.
    let sft_dir = run_dir.join("sft");
    let (sft, start_dir) = if cfg.sft_steps == 0 {
        (None, model_dir.clone())
    } else if ["model.safetensors", "adapter_model.safetensors"].iter().any(|f| sft_dir.join("final").join(f).is_file())
    {
        progress.line(&format!("supervised warm-up already done: `{}`", sft_dir.join("final").display()));
        (None, sft_dir.join("final"))
    } else {
        let sft_stage = Stage {
            objective: Objective::Sft,
            dir: &sft_dir,
            learning_rate: cfg.sft_learning_rate,
            steps: Some(cfg.sft_steps),
            ..base
        };
        let outcome = run_stage(&sft_stage, progress)?;
        if outcome.interrupted {
            return Ok(RunSummary { run_dir, sft: Some(outcome), dpo: None, demo_arithmetic: None });
        }
        let dir = outcome.model_dir.clone();
        (Some(outcome), dir)
    };
    let dpo = run_stage(&Stage { model_dir: &start_dir, ..base }, progress)?;

    let demo_arithmetic = match (&demo_assets, dpo.interrupted || !workers.is_main()) {
        (Some(assets), false) => {
            let (_, before) = model::load(&start_dir, &req.device)?;
            let (_, after) = model::load(&dpo.model_dir, &req.device)?;
            let before = demo::arithmetic_accuracy(&before, &data.tokenizer, &assets.test, &req.device)?;
            let after = demo::arithmetic_accuracy(&after, &data.tokenizer, &assets.test, &req.device)?;
            Some((before, after))
        }
        _ => None,
    };
    Ok(RunSummary { run_dir, sft, dpo: Some(dpo), demo_arithmetic })
}

/// Reads and tokenises one preference file, reporting what was skipped or dropped.
fn load_pairs(
    path: &Path,
    cfg: &TrainConfig,
    tokenizer: &Tokenizer,
    progress: &mut dyn Progress,
) -> anyhow::Result<Vec<TokenizedPair>> {
    let columns = Columns {
        prompt: cfg.prompt_column.clone(),
        chosen: cfg.chosen_column.clone(),
        rejected: cfg.rejected_column.clone(),
    };
    let loaded = data::load_preferences(path, &LoadOptions { columns, skip_bad_rows: cfg.skip_bad_rows })?;
    if !loaded.skipped.is_empty() {
        let lines: Vec<String> = loaded.skipped.iter().map(|s| s.line.to_string()).collect();
        progress.line(&format!("`{}`: skipped {} bad rows (lines {})", path.display(), lines.len(), lines.join(", ")));
    }
    let (pairs, report) = data::tokenize(&loaded.rows, tokenizer, Some(cfg.max_length))
        .with_context(|| format!("cannot tokenize `{}`", path.display()))?;
    if !report.dropped_prompt_too_long.is_empty() {
        progress.line(&format!(
            "`{}`: dropped {} pairs whose prompt alone reaches max_length {}",
            path.display(),
            report.dropped_prompt_too_long.len(),
            cfg.max_length
        ));
    }
    if report.truncated > 0 {
        progress.line(&format!(
            "`{}`: {} sequences truncated to max_length {}",
            path.display(),
            report.truncated,
            cfg.max_length
        ));
    }
    progress.line(&format!("`{}`: {} pairs", path.display(), pairs.len()));
    Ok(pairs)
}

/// The run directory, and whether to resume in it.
fn run_dir(req: &RunRequest) -> anyhow::Result<(PathBuf, bool)> {
    match &req.resume {
        Some(Some(dir)) => Ok((dir.clone(), true)),
        Some(None) => {
            let newest = std::fs::read_dir(&req.cfg.output_dir)
                .with_context(|| format!("cannot list `{}` to find a run to resume", req.cfg.output_dir.display()))?
                .filter_map(Result::ok)
                .filter(|e| e.path().join("config.toml").is_file())
                .max_by_key(|e| e.metadata().and_then(|m| m.modified()).ok());
            let dir = newest
                .map(|e| e.path())
                .with_context(|| format!("no run to resume under `{}`", req.cfg.output_dir.display()))?;
            Ok((dir, true))
        }
        None => {
            let name = req.cfg.run_name.clone().unwrap_or_else(|| format!("{}-{}", timestamp(), req.config_name));
            let dir = req.cfg.output_dir.join(name);
            if crate::train::checkpoint::latest(&dir).is_some() {
                anyhow::bail!(
                    "`{}` already holds a run: pass `--resume {}` or another `--run-name`",
                    dir.display(),
                    dir.display()
                );
            }
            Ok((dir, false))
        }
    }
}

/// `YYYYMMDD-HHMMSS` in UTC.
pub fn timestamp() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Howard Hinnant's civil_from_days.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}{month:02}{day:02}-{:02}{:02}{:02}", rem / 3600, rem % 3600 / 60, rem % 60)
}
