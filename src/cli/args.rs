//! Every flag of `dpo-train`, declared once with its help text (as ripgrep's `flags/defs.rs`):
//! the subcommands, the config-key flags generated from [`crate::config::KEYS`], and the device
//! and data-parallel flags. Parsing only; nothing here does I/O.

use std::path::PathBuf;

use clap::builder::TypedValueParser as _;
use clap::{Args, Parser, Subcommand};

use crate::config::trl::{TRL_KEYS, Treatment};
use crate::config::{KEYS, KeyDoc, Section};

/// Direct Preference Optimization for Hugging Face Llama-family models.
///
/// Bare `dpo-train` runs the embedded demo (synthetic task, random model, SFT warm-up, DPO) in a
/// few minutes on a CPU. `dpo-train train --model DIR --data FILE` trains your model with TRL's
/// DPOConfig defaults for every key you do not set (in `--config FILE` or as flags). Model and
/// data may be Hub names the local Hugging Face cache holds, and TRL's own command line runs as
/// written after `dpo-train train` (`--model_name_or_path ... --dataset_name ... --use_peft`).
#[derive(Debug, Parser)]
#[command(
    name = "dpo-train",
    version = super::env::version_line(),
    about,
    long_about,
    max_term_width = 100,
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub train: TrainArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Train with DPO (after an optional supervised warm-up): the main job.
    Train(TrainArgs),
    /// Supervised fine-tuning on the chosen completions (NLL), to warm up a base model.
    Sft(TrainArgs),
    /// Evaluate a policy against a reference on a preference dataset: TRL's loss and metrics.
    Eval(EvalArgs),
    /// Sample completions of prompts with a KV cache.
    Generate(GenerateArgs),
    /// Re-render a run's plots from metrics.csv, or overlay several runs.
    Plot(PlotArgs),
    /// Data utilities.
    #[command(subcommand)]
    Data(DataCommand),
    /// Print an sbatch script that runs `dpo-train train` on a SLURM cluster, one task per GPU.
    Slurm(SlurmArgs),
    /// Measure all-reduce, all-gather and reduce-scatter bandwidth over the workers (c10d, as
    /// training uses it), device copy bandwidth and bf16 matmul rate; one JSON object on stdout.
    /// `check-gpu --bench` runs this and reports it.
    BenchComm(BenchCommArgs),
    /// What this build and this machine have, for a bug report: version and commit, the torch it
    /// links (CUDA, cuDNN), the backends compiled in and the NCCL library, the CUDA devices and
    /// driver, the host, and the environment variables that change a run.
    Env(EnvArgs),
}

/// `dpo-train env` flags.
#[derive(Debug, Args)]
pub struct EnvArgs {
    /// One JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// `dpo-train bench-comm` flags.
#[derive(Debug, Args)]
pub struct BenchCommArgs {
    /// The smallest message, in bytes (nccl-tests' `-b`); sizes grow 4x up to --max-bytes.
    #[arg(long, default_value_t = 1 << 20, value_parser = clap::value_parser!(u64).range(4..))]
    pub min_bytes: u64,
    /// The largest message, in bytes (nccl-tests' `-e`).
    #[arg(long, default_value_t = 1 << 30, value_parser = clap::value_parser!(u64).range(4..=(64_u64 << 30)))]
    pub max_bytes: u64,
    /// Seconds a rendezvous or collective may wait.
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..))]
    pub timeout: u64,
    #[command(flatten)]
    pub parallel: ParallelArgs,
}

/// `dpo-train slurm` flags.
#[derive(Debug, Args)]
pub struct SlurmArgs {
    /// Nodes to allocate.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..).map(usize::from))]
    pub nodes: usize,
    /// GPUs (and so tasks) per node.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..).map(usize::from))]
    pub gpus_per_node: usize,
    /// The training config the job runs (TOML or YAML, as `train --config`); the config keys'
    /// flags below set or override its keys, as for `train`.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Wall-clock limit (SLURM syntax).
    #[arg(long, default_value = "24:00:00", value_parser = crate::dist::parse_time)]
    pub time: String,
    /// Partition [default: the cluster's].
    #[arg(long, value_parser = crate::dist::parse_word)]
    pub partition: Option<String>,
    /// Job name.
    #[arg(long, default_value = "dpo-train", value_parser = crate::dist::parse_word)]
    pub job_name: String,
    /// CPU cores per task.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..).map(usize::from))]
    pub cpus_per_task: usize,
    /// Host memory per GPU (SLURM syntax).
    #[arg(long, default_value = "64G", value_parser = crate::dist::parse_memory)]
    pub mem_per_gpu: String,
    /// Seconds before the time limit at which every task gets SIGTERM, to finish its step and save
    /// a checkpoint (SLURM's own SIGTERM at the limit leaves 30 s, KillWait's default, before
    /// SIGKILL); 0: none.
    #[arg(long, default_value_t = 300, value_name = "SECONDS")]
    pub save_before_limit: u32,
    #[command(flatten)]
    pub overrides: ConfigOverrides,
}

/// `dpo-train train` / `sft` flags: a config file, then one flag per config key.
#[derive(Debug, Args)]
pub struct TrainArgs {
    /// TOML or YAML config (keys as TRL's DPOConfig; a TRL recipe runs as it is); keys it leaves
    /// out take TRL's defaults [default:
    /// the embedded demo's config when no model is given, else none].
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Continue a run from its latest checkpoint, with the config it saved: RUN_DIR (or that
    /// checkpoint's own path, RUN_DIR/checkpoints/step-N), or without a value the run run_name
    /// names under output_dir, else the newest run there.
    #[arg(long, value_name = "RUN_DIR", num_args = 0..=1)]
    pub resume: Option<Option<PathBuf>>,
    /// Let --resume change what is trained (the model, reference, tokenizer, data, LoRA or loss
    /// keys its flags set otherwise than the run's saved config); each change is printed.
    #[arg(long, requires = "resume")]
    pub resume_with_changes: bool,
    #[command(flatten)]
    pub parallel: ParallelArgs,
    #[command(flatten)]
    pub overrides: ConfigOverrides,
}

/// Where a command runs: one device, or one worker process per device.
#[derive(Debug, Args)]
pub struct ParallelArgs {
    /// Where to run: `auto` (the first CUDA device torch sees, else the CPU), `cpu`, `cuda` or
    /// `cuda:N` (a torchrun/SLURM worker takes `cuda:LOCAL_RANK`).
    #[arg(long, default_value = "auto", value_parser = parse_device)]
    pub device: DeviceArg,
    /// Data-parallel over CUDA devices: a count (`2`: devices 0 and 1), a list (`0,2`; `3,` is
    /// device 3 alone), or `auto` (the devices check-gpu selects). One device runs as one process.
    /// A device listed twice (`0,0`) runs two ranks on it over Gloo instead of NCCL: slower, for
    /// checking a multi-GPU setting on one GPU.
    #[arg(long, value_name = "N|LIST|auto", conflicts_with = "devices")]
    pub gpus: Option<String>,
    /// Data-parallel over CPU processes: `cpu:N` (the cores divided between them, or each one
    /// `OMP_NUM_THREADS` threads where that is set).
    #[arg(long, value_name = "cpu:N")]
    pub devices: Option<String>,
    /// Nodes of a multi-node job started by hand on every node (with --node-rank, --master-addr).
    #[arg(long, default_value_t = 1)]
    pub nnodes: usize,
    /// This node's index in a multi-node job.
    #[arg(long, default_value_t = 0)]
    pub node_rank: usize,
    /// Address of node 0 in a multi-node job.
    #[arg(long)]
    pub master_addr: Option<String>,
    /// Rendezvous port on node 0 [default: a free one on a single node, 29500 across nodes].
    #[arg(long)]
    pub master_port: Option<u16>,
}

/// `--<key> VALUE` for every config key of `S` ([`AllKeys`] for `train`, [`LossKeys`] for
/// `eval`), generated from [`KEYS`] with its help text, and applied on top of the file. The model
/// and data keys also answer to `eval`'s and `generate`'s short names (`--model`, `--ref-model`,
/// `--data`, `--tokenizer`).
#[derive(Debug, Clone)]
pub struct KeyFlags<S> {
    /// `(key, text)` in snake_case, in the order of [`KEYS`].
    pub values: Vec<(String, String)>,
    selection: std::marker::PhantomData<S>,
}

/// Every key: `train`'s and `sft`'s flags.
pub type ConfigOverrides = KeyFlags<AllKeys>;
/// The loss keys: `eval`'s flags.
pub type LossFlags = KeyFlags<LossKeys>;
/// The keys that decide how training reads and tokenises its data: `data lengths`' flags.
pub type ReadFlags = KeyFlags<ReadKeys>;

/// Which keys a [`KeyFlags`] declares.
pub trait KeySelection {
    const HEADING: &'static str;
    /// Whether TRL's keys without a key here are flags too (hidden), as in a config file.
    const TRL_KEYS: bool;
    fn includes(key: &KeyDoc) -> bool;
}

#[derive(Debug, Clone)]
pub struct AllKeys;
#[derive(Debug, Clone)]
pub struct LossKeys;
#[derive(Debug, Clone)]
pub struct ReadKeys;

impl KeySelection for AllKeys {
    const HEADING: &'static str = "Config keys (override the file)";
    const TRL_KEYS: bool = true;
    fn includes(_: &KeyDoc) -> bool {
        true
    }
}

impl KeySelection for LossKeys {
    const HEADING: &'static str = "Loss (TRL's DPOConfig keys)";
    const TRL_KEYS: bool = false;
    fn includes(key: &KeyDoc) -> bool {
        key.section == Section::Loss
    }
}

impl KeySelection for ReadKeys {
    const HEADING: &'static str = "How training reads the data (its config keys)";
    const TRL_KEYS: bool = false;
    fn includes(key: &KeyDoc) -> bool {
        // The loss decides the rows (KTO's unpaired ones, lent KL sequences within micro-batches)
        // and how they are truncated.
        let rows = ["loss_type", "unpair", "per_device_train_batch_size"];
        crate::config::resume::DATA_KEYS.contains(&key.name) || rows.contains(&key.name)
    }
}

impl<S> Default for KeyFlags<S> {
    fn default() -> Self {
        Self { values: Vec::new(), selection: std::marker::PhantomData }
    }
}

impl<S: KeySelection> clap::FromArgMatches for KeyFlags<S> {
    fn from_arg_matches(matches: &clap::ArgMatches) -> Result<Self, clap::Error> {
        let mut out = Self::default();
        out.update_from_arg_matches(matches)?;
        Ok(out)
    }

    fn update_from_arg_matches(&mut self, matches: &clap::ArgMatches) -> Result<(), clap::Error> {
        let ours = KEYS.iter().filter(|k| S::includes(k)).map(|k| (k.name, k.is_bool));
        let trl = trl_flags().filter(|_| S::TRL_KEYS).map(|(name, treatment)| (name, negatable(treatment)));
        // TRL's keys after ours: `--use_peft` sees whether `--lora_r` was given.
        for (key, negated) in ours.chain(trl) {
            // A list given as TRL's parser takes it (`--loss_type sigmoid sft`) is one
            // comma-separated value, as written `--loss-type sigmoid,sft`.
            if let Some(values) = matches.get_many::<String>(key) {
                self.values.push((key.to_owned(), values.cloned().collect::<Vec<_>>().join(",")));
            } else if negated && matches.get_flag(&format!("no_{key}")) {
                self.values.push((key.to_owned(), "false".to_owned()));
            }
        }
        Ok(())
    }
}

impl<S: KeySelection> clap::Args for KeyFlags<S> {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        let cmd = KEYS.iter().filter(|k| S::includes(k)).fold(cmd.next_help_heading(S::HEADING), |cmd, key| {
            let arg = clap::Arg::new(key.name)
                .long(dpo_vocab::flag_name(key.name))
                .visible_aliases(short_names(key.name))
                .aliases(trl_spellings(key.name))
                .value_name(key.kind)
                .help(key.doc.trim())
                // `-1e-5` is a value here, not a flag (a list takes negative numbers alone: its
                // values run to the next flag).
                .allow_hyphen_values(matches!(key.kind, "NUM" | "INT"))
                .allow_negative_numbers(key.kind == "LIST")
                // Given twice, the last one counts, as argparse (TRL's parser) takes it.
                .overrides_with(key.name)
                .action(clap::ArgAction::Set);
            let arg = match (key.is_bool, key.kind) {
                (true, _) => arg.num_args(0..=1).default_missing_value("true"),
                // TRL's lists are space-separated values (`nargs="+"`), ours comma-separated.
                (false, "LIST") => arg.num_args(1..),
                _ => arg,
            };
            with_negation(cmd, key.name, key.is_bool, arg)
        });
        if !S::TRL_KEYS {
            return cmd;
        }
        // TRL's keys without a key here, hidden: a TRL command line runs as written.
        trl_flags().fold(cmd, |cmd, (name, treatment)| {
            let arg = clap::Arg::new(name)
                .long(name)
                .aliases(name.contains('_').then(|| dpo_vocab::flag_name(name)))
                .hide(true)
                .num_args(0..=1)
                .default_missing_value("true")
                .overrides_with(name)
                .action(clap::ArgAction::Set);
            with_negation(cmd, name, negatable(treatment), arg)
        })
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
}

/// TRL's keys that are flags of their own (a renamed one is an alias of ours).
fn trl_flags() -> impl Iterator<Item = (&'static str, &'static Treatment)> {
    TRL_KEYS.iter().filter(|(_, t)| !matches!(t, Treatment::Rename(_))).map(|(name, t)| (*name, t))
}

/// Whether a TRL key takes `--no_KEY` (transformers' parser gives one to each boolean that
/// defaults to true): those that accept `false`, or any value.
fn negatable(treatment: &Treatment) -> bool {
    match treatment {
        Treatment::Inert | Treatment::InertWithout(..) => true,
        Treatment::Only(values, _) | Treatment::Means(values, _) => values.contains(&"false"),
        Treatment::Never(_) | Treatment::Rename(_) => false,
    }
}

/// The spellings transformers' `HfArgumentParser` also takes for a key: `--learning_rate`
/// beside `--learning-rate`, and TRL's script's name of the data, `--dataset_name`.
fn trl_spellings(key: &str) -> Vec<String> {
    let mut names: Vec<String> = key.contains('_').then(|| key.to_owned()).into_iter().collect();
    for (name, treatment) in TRL_KEYS {
        if matches!(treatment, Treatment::Rename(ours) if *ours == key) {
            names.extend([name.to_string(), dpo_vocab::flag_name(name)]);
        }
    }
    names
}

/// `arg`, and for a boolean `--no_KEY` / `--no-KEY` (hidden) setting it to false, as
/// transformers' parser offers them.
fn with_negation(cmd: clap::Command, key: &'static str, boolean: bool, arg: clap::Arg) -> clap::Command {
    let cmd = cmd.arg(arg);
    if !boolean {
        return cmd;
    }
    let no = format!("no_{key}");
    cmd.arg(
        clap::Arg::new(no.clone())
            .long(no)
            .aliases([format!("no-{}", dpo_vocab::flag_name(key))])
            .hide(true)
            .conflicts_with(key)
            .action(clap::ArgAction::SetTrue),
    )
}

/// The names `eval` and `generate` use for the same things.
fn short_names(key: &str) -> &'static [&'static str] {
    match key {
        "model_name_or_path" => &["model"],
        "ref_model_name_or_path" => &["ref-model"],
        "tokenizer_name_or_path" => &["tokenizer"],
        "train_file" => &["data"],
        _ => &[],
    }
}

/// `dpo-train generate` flags.
#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// Model directory (config.json + safetensors + tokenizer files), a PEFT LoRA adapter
    /// directory, or a Hub name in the local Hugging Face cache.
    #[arg(long, value_name = "DIR", value_parser = model_dir)]
    pub model: PathBuf,
    /// Prompts: a text file with one prompt per line, or a .jsonl whose `prompt` is a string or a
    /// list of {role, content} messages (rendered by the chat template).
    #[arg(long, value_name = "FILE")]
    pub prompts: PathBuf,
    /// Tokens to generate per sample (at least 1, as transformers' `generate`).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..).map(|n| n as usize))]
    pub max_new_tokens: usize,
    /// Sampling temperature (finite, >= 0); 0 decodes greedily.
    #[arg(long, default_value_t = 1.0, value_parser = parse_temperature, allow_negative_numbers = true)]
    pub temperature: f64,
    /// Nucleus sampling: keep the smallest token set of this total probability, in (0, 1].
    #[arg(long, default_value_t = 1.0, value_parser = parse_top_p)]
    pub top_p: f64,
    /// Completions per prompt (at least 1).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub num_samples: u64,
    /// Seed of the sampler (prompt i samples from seed + i, whatever the device count).
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    #[command(flatten)]
    pub parallel: ParallelArgs,
    /// Print one JSON object per prompt instead of text.
    #[arg(long)]
    pub json: bool,
}

/// `dpo-train plot` flags.
#[derive(Debug, Args)]
pub struct PlotArgs {
    /// Run directories (each with metrics.csv); several are overlaid.
    #[arg(required = true, value_name = "RUN_DIR")]
    pub runs: Vec<PathBuf>,
    /// Where overlaid plots go [default: the first run's `compare/`].
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
}

/// `dpo-train data` subcommands.
#[derive(Debug, Subcommand)]
pub enum DataCommand {
    /// Write the demo's synthetic preference data (train/val/test JSONL).
    Synth(SynthArgs),
    /// Tokenise preference data as training does and print, as one JSON object, the token counts
    /// of its longest pairs: what `check-gpu --data` plans dpo-train's packed rows with.
    Lengths(LengthsArgs),
}

/// `dpo-train data lengths` flags.
#[derive(Debug, Args)]
pub struct LengthsArgs {
    /// The model directory whose tokenizer training would use (or its Hub name, cached).
    #[arg(long, value_name = "DIR", value_parser = model_dir)]
    pub model: PathBuf,
    /// The preference data: a JSON Lines, JSON, CSV, Parquet or Arrow file, or a dataset directory
    /// (or its Hub name, cached, or a directory `save_to_disk` wrote).
    #[arg(long, value_name = "FILE", value_parser = data_path)]
    pub data: PathBuf,
    /// How many of the longest pairs to list (a micro-batch of up to this many is planned exactly).
    #[arg(long, value_name = "N", default_value_t = 4096)]
    pub top: usize,
    /// The keys training reads the data by, spelled as `train`'s flags (its defaults where unset).
    #[command(flatten)]
    pub read: ReadFlags,
}

/// `dpo-train data synth` flags.
#[derive(Debug, Args)]
pub struct SynthArgs {
    /// Output: a .jsonl file (the train split; val/test beside it) or a directory.
    #[arg(long, value_name = "PATH")]
    pub out: PathBuf,
    /// Seed of the generator.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Training pairs (at least 1).
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(1..).map(|n| n as usize))]
    pub train: usize,
    /// Validation pairs.
    #[arg(long, default_value_t = 200)]
    pub val: usize,
    /// Test pairs.
    #[arg(long, default_value_t = 200)]
    pub test: usize,
}

/// `dpo-train eval` flags.
#[derive(Debug, Args)]
pub struct EvalArgs {
    /// Policy model: a Hugging Face directory (config.json + safetensors + tokenizer files), a PEFT LoRA adapter directory, or a Hub name in the local Hugging Face cache.
    #[arg(long, value_name = "DIR", value_parser = model_dir)]
    pub model: PathBuf,
    /// Reference model directory [default: a LoRA adapter's base with the adapter off, else the policy itself].
    #[arg(long, value_name = "DIR", value_parser = model_dir)]
    pub ref_model: Option<PathBuf>,
    /// Directory holding tokenizer.json and tokenizer_config.json [default: the policy's].
    #[arg(long, value_name = "DIR", value_parser = model_dir)]
    pub tokenizer: Option<PathBuf>,
    /// Preference data: .jsonl, .json (an array), .csv, .tsv (each optionally .gz), .parquet, .arrow, a dataset directory as the hub lays it out or as `save_to_disk` wrote it, or its Hub name in the local Hugging Face cache.
    #[arg(long, value_name = "FILE", value_parser = data_path)]
    pub data: PathBuf,
    /// The split read when `--data` is a dataset directory.
    #[arg(long, default_value = "test")]
    pub split: String,
    /// The configuration of `--data`'s card (its README's `configs`) to read [default: the
    /// card's default].
    #[arg(long, value_name = "NAME")]
    pub dataset_config: Option<String>,
    #[command(flatten)]
    pub columns: ColumnArgs,
    /// Skip malformed rows (reporting their lines) instead of stopping at the first.
    #[arg(long)]
    pub skip_bad_rows: bool,
    #[command(flatten)]
    pub loss: LossFlags,
    /// Tokens kept per sequence, prompt included (which part: --truncation-mode) [default: the
    /// `max_length` key's default]
    #[arg(long, value_parser = parse_max_length)]
    pub max_length: Option<usize>,
    /// keep_start (TRL's default): a sequence over --max-length keeps its start, and a pair whose
    /// prompt alone reaches it is dropped; keep_end: its end, none dropped. Pass the
    /// truncation_mode the model was trained with [default: the `truncation_mode` key's default]
    #[arg(
        long = "truncation-mode",
        value_name = "keep_start|keep_end",
        value_parser = parse_truncation_mode,
        action = clap::ArgAction::Set
    )]
    pub keep_end: Option<bool>,
    /// Pairs per batch on each device, TRL's `per_device_eval_batch_size`: the loss is over every
    /// pair, and each metric the mean of the values of batches of this many pairs times the
    /// devices, as TRL's (kto's KL rows borrow completions within a batch: at least 2).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..).map(|n| n as usize))]
    pub batch_size: usize,
    #[command(flatten)]
    pub parallel: ParallelArgs,
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

/// A parsed `--device`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceArg {
    /// The first CUDA device torch sees, else the CPU (resolved in [`super::launch`]).
    Auto,
    Cpu,
    Cuda(usize),
}

/// A temperature transformers' `TemperatureLogitsWarper` accepts, or 0 (greedy).
fn parse_temperature(s: &str) -> Result<f64, String> {
    let t: f64 = s.parse().map_err(|_| format!("`{s}` is not a number"))?;
    if t.is_finite() && t >= 0.0 { Ok(t) } else { Err(format!("must be finite and >= 0, got {s}")) }
}

/// A nucleus probability `TopPLogitsWarper` accepts: in (0, 1].
fn parse_top_p(s: &str) -> Result<f64, String> {
    let p: f64 = s.parse().map_err(|_| format!("`{s}` is not a number"))?;
    if p > 0.0 && p <= 1.0 { Ok(p) } else { Err(format!("must be in (0, 1], got {s}")) }
}

/// A model flag: the path, or the hub cache's snapshot of the Hub name it gives.
fn model_dir(s: &str) -> Result<PathBuf, String> {
    dpo_base::hub::path_of(s, dpo_base::hub::Kind::Model).map_err(|e| e.to_string())
}

/// A data flag: the path, or the hub cache's snapshot of the dataset name it gives.
fn data_path(s: &str) -> Result<PathBuf, String> {
    dpo_base::hub::path_of(s, dpo_base::hub::Kind::Dataset).map_err(|e| e.to_string())
}

/// `--max-length`: at least [`crate::config::MIN_MAX_LENGTH`], refused as the config key is.
fn parse_max_length(s: &str) -> Result<usize, String> {
    let n: usize = s.parse().map_err(|_| format!("expected an integer, got `{s}`"))?;
    if n < crate::config::MIN_MAX_LENGTH {
        return Err(crate::config::MAX_LENGTH_TOO_SHORT.to_owned());
    }
    Ok(n)
}

/// `--truncation-mode`: whether it keeps the end, refused as the config key is.
fn parse_truncation_mode(s: &str) -> Result<bool, String> {
    crate::config::truncation_keeps_end(s)
}

fn parse_device(s: &str) -> Result<DeviceArg, String> {
    match s {
        "auto" => Ok(DeviceArg::Auto),
        "cpu" => Ok(DeviceArg::Cpu),
        "cuda" => Ok(DeviceArg::Cuda(0)),
        _ => s
            .strip_prefix("cuda:")
            .and_then(|i| i.parse().ok())
            .map(DeviceArg::Cuda)
            .ok_or_else(|| format!("expected `auto`, `cpu`, `cuda` or `cuda:N`, got `{s}`")),
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// check-gpu's commands place the ranks with dpo-vocab's launcher flags: `train` has them.
    #[test]
    fn the_vocabulary_s_launcher_flags_are_train_s() {
        let cmd = super::Cli::command();
        let train = cmd.find_subcommand("train").expect("a train subcommand");
        for name in [dpo_vocab::keys::GPUS, dpo_vocab::keys::DEVICES] {
            let long = dpo_vocab::flag_name(name);
            assert!(train.get_arguments().any(|a| a.get_long() == Some(long.as_str())), "--{long}");
        }
    }

    /// Every flag name and alias of each subcommand is declared once (clap checks this only in
    /// debug builds; the suite runs in release).
    #[test]
    fn no_flag_name_is_declared_twice() {
        let cmd = super::Cli::command();
        for sub in cmd.get_subcommands() {
            let mut names: Vec<&str> = sub
                .get_arguments()
                .flat_map(|a| a.get_long().into_iter().chain(a.get_all_aliases().into_iter().flatten()))
                .collect();
            let all = names.len();
            names.sort_unstable();
            names.dedup();
            assert_eq!(names.len(), all, "`dpo-train {}` declares a flag name twice", sub.get_name());
        }
    }

    /// A TRL command line (`trl dpo ...`, transformers' spellings) parses to the same keys.
    #[test]
    fn trl_spellings_parse_to_our_keys() {
        use clap::Parser;
        let line = "dpo-train train --model_name_or_path Qwen/Qwen2-0.5B-Instruct --dataset_name trl-lib/ufb \
                    --learning_rate 5.0e-7 --per_device_train_batch_size 2 --gradient_checkpointing \
                    --eval_strategy steps --no_remove_unused_columns --use_peft --lora_r 32 --no_padding_free \\
                    --bf16 True --push_to_hub False";
        let cli = super::Cli::try_parse_from(line.split_whitespace().filter(|w| *w != "\\")).unwrap();
        let Some(super::Command::Train(args)) = cli.command else { panic!("train") };
        let got: Vec<(&str, &str)> = args.overrides.values.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let want = [
            ("model_name_or_path", "Qwen/Qwen2-0.5B-Instruct"),
            ("train_file", "trl-lib/ufb"),
            ("per_device_train_batch_size", "2"),
            ("learning_rate", "5.0e-7"),
            ("lora_r", "32"),
            ("gradient_checkpointing", "true"),
            ("padding_free", "false"),
            ("eval_strategy", "steps"),
            ("remove_unused_columns", "false"),
            ("use_peft", "true"),
            ("bf16", "True"),
            ("push_to_hub", "False"),
        ];
        for pair in want {
            assert!(got.contains(&pair), "{pair:?} in {got:?}");
        }
        assert_eq!(got.len(), want.len(), "{got:?}");
    }
}
