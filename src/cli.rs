//! Command-line interface: every flag is declared once here, with its help text; the library does
//! the work.

use std::io::Write;
use std::path::PathBuf;

use burn::tensor::Device;
use clap::{Args, Parser, Subcommand};

use crate::data::Columns;
use crate::dpo::loss::{FDivergence, LossConfig, LossType};
use crate::eval::{EvalOptions, EvalReport, evaluate};

/// Direct Preference Optimization for Hugging Face Llama-family models.
#[derive(Debug, Parser)]
#[command(name = "dpo-train", version, about, max_term_width = 100)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Evaluate a policy against a reference on a preference dataset: TRL's loss and metrics.
    Eval(EvalArgs),
}

/// `dpo-train eval` flags.
#[derive(Debug, Args)]
pub struct EvalArgs {
    /// Policy model: a Hugging Face directory (config.json + safetensors + tokenizer files).
    #[arg(long, value_name = "DIR")]
    pub model: PathBuf,
    /// Reference model directory [default: the policy itself].
    #[arg(long, value_name = "DIR")]
    pub ref_model: Option<PathBuf>,
    /// Directory holding tokenizer.json and tokenizer_config.json [default: the policy's].
    #[arg(long, value_name = "DIR")]
    pub tokenizer: Option<PathBuf>,
    /// Preference data: .jsonl, .json (an array) or .csv.
    #[arg(long, value_name = "FILE")]
    pub data: PathBuf,
    #[command(flatten)]
    pub columns: ColumnArgs,
    /// Skip malformed rows (reporting their lines) instead of stopping at the first.
    #[arg(long)]
    pub skip_bad_rows: bool,
    #[command(flatten)]
    pub loss: LossArgs,
    /// Tokens kept per sequence, prompt included (truncation keeps the start).
    #[arg(long, default_value_t = 1024)]
    pub max_length: usize,
    /// Pairs per forward pass; results do not depend on it.
    #[arg(long, default_value_t = 8)]
    pub batch_size: usize,
    /// Where to run: `cpu`, `cuda` or `cuda:N`.
    #[arg(long, default_value = "cpu", value_parser = parse_device)]
    pub device: DeviceArg,
    /// Print one JSON object whose keys are TRL's metric names.
    #[arg(long)]
    pub json: bool,
}

/// Dataset column names.
#[derive(Debug, Args)]
pub struct ColumnArgs {
    /// Column holding the prompt (absent: the shared prefix of chosen and rejected).
    #[arg(long, default_value = "prompt")]
    pub prompt_column: String,
    /// Column holding the preferred completion.
    #[arg(long, default_value = "chosen")]
    pub chosen_column: String,
    /// Column holding the dispreferred completion.
    #[arg(long, default_value = "rejected")]
    pub rejected_column: String,
}

/// The loss settings, named as TRL's `DPOConfig` keys.
#[derive(Debug, Args)]
pub struct LossArgs {
    /// Temperature of the implicit reward.
    #[arg(long, default_value_t = 0.1)]
    pub beta: f64,
    /// One or more loss types (comma-separated), summed with --loss-weights.
    #[arg(long, value_enum, value_delimiter = ',', num_args = 1.., default_value = "sigmoid")]
    pub loss_type: Vec<LossType>,
    /// One weight per loss type [default: 1 each].
    #[arg(long, value_delimiter = ',', num_args = 1..)]
    pub loss_weights: Vec<f64>,
    /// ε of robust, exo_pair and aot.
    #[arg(long, default_value_t = 0.0)]
    pub label_smoothing: f64,
    /// Divergence the log-ratios are scored with.
    #[arg(long, value_enum, default_value = "reverse_kl")]
    pub f_divergence_type: FDivergence,
    /// α of alpha_divergence.
    #[arg(long, default_value_t = 0.5)]
    pub f_alpha_divergence_coef: f64,
    /// LD-DPO: weight of the tokens beyond the shorter completion's length.
    #[arg(long)]
    pub ld_alpha: Option<f64>,
    /// τ of discopop.
    #[arg(long, default_value_t = 0.05)]
    pub discopop_tau: f64,
    /// Score without a reference model (reference log-probs taken as 0).
    #[arg(long)]
    pub reference_free: bool,
    /// WPO: weight each pair by the policy's length-normalised probability of both completions.
    #[arg(long)]
    pub use_weighting: bool,
}

impl LossArgs {
    fn to_config(&self) -> LossConfig {
        LossConfig {
            beta: self.beta,
            loss_type: self.loss_type.clone(),
            loss_weights: self.loss_weights.clone(),
            label_smoothing: self.label_smoothing,
            f_divergence_type: self.f_divergence_type,
            f_alpha_divergence_coef: self.f_alpha_divergence_coef,
            ld_alpha: self.ld_alpha,
            discopop_tau: self.discopop_tau,
            reference_free: self.reference_free,
            use_weighting: self.use_weighting,
        }
    }
}

/// A parsed `--device`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceArg {
    Cpu,
    Cuda(usize),
}

fn parse_device(s: &str) -> Result<DeviceArg, String> {
    match s {
        "cpu" => Ok(DeviceArg::Cpu),
        "cuda" => Ok(DeviceArg::Cuda(0)),
        _ => s
            .strip_prefix("cuda:")
            .and_then(|i| i.parse().ok())
            .map(DeviceArg::Cuda)
            .ok_or_else(|| format!("expected `cpu`, `cuda` or `cuda:N`, got `{s}`")),
    }
}

impl DeviceArg {
    #[allow(deprecated)] // burn marks its libtorch devices deprecated; libtorch is this project's backend.
    pub fn device(self) -> Device {
        match self {
            Self::Cpu => Device::libtorch(),
            Self::Cuda(i) => Device::libtorch_cuda(i),
        }
    }
}

/// Runs the parsed command.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Eval(args) => run_eval(args),
    }
}

fn run_eval(args: EvalArgs) -> anyhow::Result<()> {
    let opts = EvalOptions {
        model: args.model,
        ref_model: args.ref_model,
        tokenizer: args.tokenizer,
        data: args.data,
        columns: Columns {
            prompt: args.columns.prompt_column,
            chosen: args.columns.chosen_column,
            rejected: args.columns.rejected_column,
        },
        skip_bad_rows: args.skip_bad_rows,
        loss: args.loss.to_config(),
        max_length: Some(args.max_length),
        batch_size: args.batch_size,
        device: args.device.device(),
    };
    let report = evaluate(&opts)?;
    let mut out = std::io::stdout().lock();
    if args.json {
        writeln!(out, "{}", serde_json::to_string(&report.metrics)?)?;
    } else {
        print_table(&mut out, &opts, &report)?;
    }
    Ok(())
}

fn print_table(out: &mut impl Write, opts: &EvalOptions, report: &EvalReport) -> anyhow::Result<()> {
    let types: Vec<&str> = opts.loss.loss_type.iter().map(|t| t.name()).collect();
    writeln!(out, "model      {}", opts.model.display())?;
    if let Some(r) = &opts.ref_model {
        writeln!(out, "reference  {}", r.display())?;
    }
    writeln!(out, "data       {} ({} pairs)", opts.data.display(), report.pairs)?;
    writeln!(out, "loss       {} (beta {})", types.join(" + "), opts.loss.beta)?;
    writeln!(out)?;
    for (name, value) in report.metrics.named() {
        writeln!(out, "{name:<20} {value:>14.6}")?;
    }
    let lines = |ls: &mut dyn Iterator<Item = usize>| ls.map(|l| l.to_string()).collect::<Vec<_>>().join(", ");
    let t = &report.tokenize;
    if !report.skipped.is_empty() {
        writeln!(out, "skipped {} bad rows (lines {})", report.skipped.len(), lines(&mut report.skipped.iter().map(|s| s.line)))?;
    }
    if !t.dropped_prompt_too_long.is_empty() {
        let n = t.dropped_prompt_too_long.len();
        writeln!(out, "dropped {n} pairs whose prompt alone reaches max_length (lines {})", lines(&mut t.dropped_prompt_too_long.iter().copied()))?;
    }
    if !t.prefix_mismatch.is_empty() {
        let n = t.prefix_mismatch.len();
        writeln!(out, "{n} prompts tokenise differently inside prompt+completion (lines {})", lines(&mut t.prefix_mismatch.iter().copied()))?;
    }
    if t.truncated > 0 {
        writeln!(out, "{} sequences truncated to max_length (keep_start)", t.truncated)?;
    }
    Ok(())
}
