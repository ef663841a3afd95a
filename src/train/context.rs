//! The vocabulary of a training run, shared by the loop and its parts: what a stage optimises,
//! the data, where the run executes, one stage's settings, how it ended, and where progress goes.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use burn::tensor::Device;

use super::Workers;
use crate::config::{RunPlan, TrainConfig};
use crate::data::{TokenizedPair, Tokenizer};
use crate::dpo::metrics::Metrics;

/// What a stage optimises.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Objective {
    /// Negative log-likelihood of the chosen completions (a token mean).
    Sft,
    /// The configured DPO loss against the reference.
    Dpo,
}

impl Objective {
    /// The stage's name in logs and progress.
    pub fn name(self) -> &'static str {
        match self {
            Self::Sft => "sft",
            Self::Dpo => "dpo",
        }
    }
}

/// Where progress goes; the binary shows a bar on a terminal and plain lines otherwise.
pub trait Progress {
    /// A stage begins (or resumes at `start_step`).
    fn start(&mut self, stage: &str, start_step: u64, total_steps: u64);
    /// One optimizer step finished; `status` is a short summary of the last logged values.
    fn step(&mut self, step: u64, status: &str);
    /// A line worth keeping (logged metrics, evaluations, checkpoints).
    fn line(&mut self, text: &str);
    /// Reading the data: `done` of `total` bytes (a call with `done == total` ends it).
    fn reading(&mut self, _what: &str, _done: u64, _total: u64) {}
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

/// Where a run executes: the plain device (training runs on its autodiff twin), the flag Ctrl-C
/// sets, the data-parallel workers this process is one of (rank 0 writes every file), and whether
/// a per-step reference runs on a thread of its own (`None`: the device's default; see
/// [`super::step::overlaps_reference`]).
#[derive(Clone)]
pub struct Runtime<'a> {
    pub device: Device,
    pub interrupt: &'a AtomicBool,
    pub workers: Workers<'a>,
    pub overlap_reference: Option<bool>,
}

/// What every stage of a run shares.
#[derive(Clone, Copy)]
pub struct Run<'a> {
    pub cfg: &'a TrainConfig,
    /// The config's options, resolved once into their types (truncation, stage, precision,
    /// schedule).
    pub plan: &'a RunPlan,
    pub data: &'a RunData,
    pub rt: &'a Runtime<'a>,
    /// The run's files a resume rewrites (its `config.toml` and `data_report.json`, as path and
    /// text), written once a stage has loaded what it trains on: a resume that cannot load its
    /// checkpoint, or finds nothing to train, leaves the run as it was. Empty for a new run, which
    /// wrote them before its first stage.
    pub rewrites: &'a [(PathBuf, String)],
}

/// What one stage of a run does: the supervised warm-up, or DPO.
#[derive(Clone, Copy)]
pub struct Stage<'a> {
    pub objective: Objective,
    /// The stage's directory (metrics, checkpoints, samples, `final/`).
    pub dir: &'a Path,
    /// The run's directory, which `--resume` names (the warm-up's stage is a folder inside it).
    pub run_dir: &'a Path,
    /// The starting weights (an HF directory, or a PEFT adapter directory).
    pub model_dir: &'a Path,
    /// The reference; `None` takes the starting weights.
    pub ref_dir: Option<&'a Path>,
    /// Peak learning rate (`learning_rate`, or `sft_learning_rate` for the warm-up).
    pub learning_rate: f64,
    /// Optimizer steps; `None` runs `num_train_epochs` over the training pairs.
    pub steps: Option<u64>,
    /// Continue from the newest checkpoint in `dir`.
    pub resume: bool,
    /// TensorBoard's directory for the run (`report_to`); each stage writes a subdirectory named
    /// after its objective (`dpo`, `sft`).
    pub tensorboard: Option<&'a Path>,
    /// Where the stage logs to W&B (`report_to`).
    pub wandb: Option<WandbTarget<'a>>,
    /// Draws the stage's plots from its directory's `metrics.csv` and returns the dashboard's
    /// path; given, the plots are redrawn after each evaluation and the dashboard logged to
    /// TensorBoard (the drawing lives in `report`, above this layer).
    pub draw_plots: Option<&'a DrawPlots<'a>>,
}

/// Where a stage logs to W&B: the python whose `wandb` package runs it, and the run's name (each
/// stage is a W&B run of that name, the warm-up's with `-sft`).
#[derive(Clone, Copy)]
pub struct WandbTarget<'a> {
    pub python: &'a Path,
    pub run: &'a str,
}

/// Draws a stage's plots from the `metrics.csv` in the directory given; returns the dashboard's path.
pub type DrawPlots<'a> = dyn Fn(&Path) -> anyhow::Result<PathBuf> + 'a;

/// How a stage ended.
#[derive(Debug, Clone)]
pub struct StageOutcome {
    /// The HF model directory written at the end (or the checkpoint when interrupted).
    pub model_dir: PathBuf,
    pub steps: u64,
    pub interrupted: bool,
    /// A resume found the stage finished: nothing was trained or written.
    pub already_done: bool,
    /// The last evaluation on the held-out set, and the test set's (DPO only).
    pub eval: Option<Metrics>,
    pub test: Option<Metrics>,
}
