//! Command-line interface: every flag is declared once here, with its help text; the library does
//! the work.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context;

use burn::tensor::Device;
use clap::{Args, Parser, Subcommand};

use crate::config::{KEYS, TrainConfig};
use crate::data::Columns;
use crate::data::synth::{self, SynthConfig};
use crate::demo::DEMO_CONFIG;
use crate::dpo::loss::LossConfig;
use crate::eval::{EvalOptions, EvalReport, evaluate};
use crate::generate::{SamplingConfig, generate, rng};
use crate::run::{RunRequest, RunSummary};
use crate::tokenizer::Tokenizer;
use crate::train::trainer::Progress;

/// Direct Preference Optimization for Hugging Face Llama-family models.
///
/// Bare `dpo-train [FLAGS]` is `dpo-train train [FLAGS]`: without `--config` it runs the embedded
/// demo (synthetic task, random model, SFT warm-up, DPO) in a few minutes on a CPU.
#[derive(Debug, Parser)]
#[command(name = "dpo-train", version, about, long_about, max_term_width = 100, args_conflicts_with_subcommands = true)]
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
}

/// `dpo-train slurm` flags.
#[derive(Debug, Args)]
pub struct SlurmArgs {
    /// Nodes to allocate.
    #[arg(long, default_value_t = 1)]
    pub nodes: usize,
    /// GPUs (and so tasks) per node.
    #[arg(long, default_value_t = 8)]
    pub gpus_per_node: usize,
    /// The training config the job runs.
    #[arg(long, value_name = "FILE")]
    pub config: PathBuf,
    /// Wall-clock limit (SLURM syntax).
    #[arg(long, default_value = "24:00:00")]
    pub time: String,
    /// Partition [default: the cluster's].
    #[arg(long)]
    pub partition: Option<String>,
    /// Job name.
    #[arg(long, default_value = "dpo-train")]
    pub job_name: String,
    /// CPU cores per task.
    #[arg(long, default_value_t = 8)]
    pub cpus_per_task: usize,
    /// Host memory per GPU (SLURM syntax).
    #[arg(long, default_value = "64G")]
    pub mem_per_gpu: String,
}

/// `dpo-train train` / `sft` flags: a config file, then one flag per config key.
#[derive(Debug, Args)]
pub struct TrainArgs {
    /// TOML config (keys as TRL's DPOConfig) [default: the embedded demo].
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Continue the newest run under output_dir, or RUN_DIR, from its latest checkpoint.
    #[arg(long, value_name = "RUN_DIR", num_args = 0..=1, default_missing_value = "")]
    pub resume: Option<PathBuf>,
    #[command(flatten)]
    pub parallel: ParallelArgs,
    #[command(flatten)]
    pub overrides: ConfigOverrides,
}

/// Where a command runs: one device, or one worker process per device.
#[derive(Debug, Args)]
pub struct ParallelArgs {
    /// Where to run: `cpu`, `cuda` or `cuda:N` (a torchrun/SLURM worker takes `cuda:LOCAL_RANK`).
    #[arg(long, default_value = "cpu", value_parser = parse_device)]
    pub device: DeviceArg,
    /// Data-parallel over CUDA devices: a count (`2`: devices 0 and 1), a list (`0,2`), or `auto`
    /// (the devices check-gpu selects).
    #[arg(long, value_name = "N|LIST|auto", conflicts_with = "devices")]
    pub gpus: Option<String>,
    /// Data-parallel over CPU processes: `cpu:N` (the cores are divided between them).
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

/// `--<key> VALUE` for every config key, applied on top of the file.
#[derive(Debug, Clone, Default)]
pub struct ConfigOverrides(pub Vec<(String, String)>);

impl clap::FromArgMatches for ConfigOverrides {
    fn from_arg_matches(matches: &clap::ArgMatches) -> Result<Self, clap::Error> {
        let mut out = Self::default();
        out.update_from_arg_matches(matches)?;
        Ok(out)
    }

    fn update_from_arg_matches(&mut self, matches: &clap::ArgMatches) -> Result<(), clap::Error> {
        for key in KEYS {
            if let Some(value) = matches.get_one::<String>(key.name) {
                self.0.push((key.name.to_owned(), value.clone()));
            }
        }
        Ok(())
    }
}

impl clap::Args for ConfigOverrides {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        KEYS.iter().fold(cmd.next_help_heading("Config keys (override the file)"), |cmd, key| {
            let arg = clap::Arg::new(key.name)
                .long(key.name.replace('_', "-"))
                .value_name(key.kind)
                .help(key.doc.trim())
                // `-1e-5` is a value here, not a flag.
                .allow_hyphen_values(matches!(key.kind, "NUM" | "INT" | "LIST"))
                .action(clap::ArgAction::Set);
            cmd.arg(if key.is_bool { arg.num_args(0..=1).default_missing_value("true") } else { arg })
        })
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
}

/// `dpo-train generate` flags.
#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// Model directory (config.json + safetensors + tokenizer files), or a PEFT LoRA adapter directory.
    #[arg(long, value_name = "DIR")]
    pub model: PathBuf,
    /// Prompts: a text file with one prompt per line, or a .jsonl with a `prompt` field.
    #[arg(long, value_name = "FILE")]
    pub prompts: PathBuf,
    /// Tokens to generate per sample.
    #[arg(long, default_value_t = 64)]
    pub max_new_tokens: usize,
    /// Sampling temperature; 0 decodes greedily.
    #[arg(long, default_value_t = 1.0)]
    pub temperature: f64,
    /// Nucleus sampling: keep the smallest token set of this total probability.
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f64,
    /// Completions per prompt.
    #[arg(long, default_value_t = 1)]
    pub num_samples: usize,
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
    /// Training pairs.
    #[arg(long, default_value_t = 2000)]
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
    /// Policy model: a Hugging Face directory (config.json + safetensors + tokenizer files), or a PEFT LoRA adapter directory.
    #[arg(long, value_name = "DIR")]
    pub model: PathBuf,
    /// Reference model directory [default: a LoRA adapter's base with the adapter off, else the policy itself].
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
    pub loss: LossConfig,
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

/// Runs the parsed command; the exit code says whether it finished or was interrupted.
pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        None => run_train(cli.train, false),
        Some(Command::Train(args)) => run_train(args, false),
        Some(Command::Sft(args)) => run_train(args, true),
        Some(Command::Eval(args)) => run_eval(args).map(|()| ExitCode::SUCCESS),
        Some(Command::Generate(args)) => run_generate(args).map(|()| ExitCode::SUCCESS),
        Some(Command::Plot(args)) => run_plot(args).map(|()| ExitCode::SUCCESS),
        Some(Command::Data(DataCommand::Synth(args))) => run_synth(args).map(|()| ExitCode::SUCCESS),
        Some(Command::Slurm(args)) => {
            let script = crate::dist::sbatch_script(&crate::dist::SlurmOptions {
                nodes: args.nodes,
                gpus_per_node: args.gpus_per_node,
                config: args.config,
                time: args.time,
                partition: args.partition,
                job_name: args.job_name,
                cpus_per_task: args.cpus_per_task,
                mem_per_gpu: args.mem_per_gpu,
            });
            print!("{script}");
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Bad data-parallel flags, named.
#[derive(Debug, thiserror::Error)]
pub enum LaunchFlagError {
    #[error("`--devices {0}`: expected `cpu:N` with N >= 1")]
    Devices(String),
    #[error("`--gpus {0}`: expected a count, a comma-separated list of indices, or `auto`")]
    Gpus(String),
    #[error("`--gpus {spec}`: {found} CUDA device(s) found; run on CPU processes with `--devices cpu:{wanted}`")]
    TooFewGpus { spec: String, found: usize, wanted: usize },
    #[error("`--gpus auto`: {0}")]
    Auto(String),
}

/// What a launcher starts: processes per node and the devices they see.
struct LaunchPlan {
    nproc: usize,
    cuda: bool,
    /// `CUDA_VISIBLE_DEVICES` for every worker (each takes the device of its local rank).
    visible: Option<String>,
}

fn launch_plan(args: &ParallelArgs) -> anyhow::Result<Option<LaunchPlan>> {
    if let Some(spec) = &args.devices {
        let n = spec.strip_prefix("cpu:").and_then(|n| n.parse::<usize>().ok()).filter(|&n| n >= 1);
        let nproc = n.ok_or_else(|| LaunchFlagError::Devices(spec.clone()))?;
        return Ok(Some(LaunchPlan { nproc, cuda: false, visible: None }));
    }
    let Some(spec) = &args.gpus else { return Ok(None) };
    let found = usize::try_from(tch::Cuda::device_count()).unwrap_or(0);
    let ids: Vec<usize> = if spec == "auto" {
        let snapshot = check_gpu::probe_live().map_err(|e| LaunchFlagError::Auto(e.to_string()))?;
        let plan = check_gpu::plan(&snapshot, &check_gpu::PlanRequest::default());
        if plan.gpus.is_empty() {
            return Err(LaunchFlagError::Auto("check-gpu selected no usable GPU".into()).into());
        }
        plan.gpus.iter().map(|&g| g as usize).collect()
    } else if let Ok(n) = spec.parse::<usize>() {
        (0..n).collect()
    } else {
        spec.split(',')
            .map(|i| i.trim().parse::<usize>())
            .collect::<Result<_, _>>()
            .map_err(|_| LaunchFlagError::Gpus(spec.clone()))?
    };
    if ids.is_empty() {
        return Err(LaunchFlagError::Gpus(spec.clone()).into());
    }
    if ids.iter().any(|&i| i >= found) {
        return Err(LaunchFlagError::TooFewGpus { spec: spec.clone(), found, wanted: ids.len() }.into());
    }
    let visible = ids.iter().map(usize::to_string).collect::<Vec<_>>().join(",");
    Ok(Some(LaunchPlan { nproc: ids.len(), cuda: true, visible: Some(visible) }))
}

fn run_train(args: TrainArgs, sft_only: bool) -> anyhow::Result<ExitCode> {
    let resume = args.resume.clone().map(|dir| (!dir.as_os_str().is_empty()).then_some(dir));
    // A resumed run continues with the config it saved; flags still override it.
    let (base, name) = match (&resume, &args.config) {
        (Some(Some(dir)), _) => (TrainConfig::from_toml_file(&dir.join("config.toml"))?, String::new()),
        (_, Some(path)) => {
            let name = path.file_stem().map_or_else(|| "config".to_owned(), |s| s.to_string_lossy().into_owned());
            (TrainConfig::from_toml_file(path)?, name)
        }
        (_, None) => (TrainConfig::from_toml_str(DEMO_CONFIG, "configs/demo.toml (embedded)")?, "demo".to_owned()),
    };
    let mut cfg = base.with_overrides(&args.overrides.0)?;
    cfg.validate()?;
    let interrupt: &'static AtomicBool = Box::leak(Box::new(AtomicBool::new(false)));
    ctrlc::set_handler(move || {
        if interrupt.swap(true, Ordering::SeqCst) {
            // A second Ctrl-C does not wait for the checkpoint.
            std::process::exit(130);
        }
        eprintln!("\ninterrupt: finishing the current step, then saving a checkpoint (Ctrl-C again to abort)");
    })
    .context("cannot install the Ctrl-C handler")?;
    // Every worker must write into one run directory: the launcher names it for its workers.
    let new_run = cfg.run_name.is_none() && resume.is_none();
    let launched_name = new_run.then(|| format!("{}-{name}", crate::run::timestamp()));
    let extra: Vec<std::ffi::OsString> = launched_name.iter().flat_map(|n| ["--run-name".into(), n.into()]).collect();
    let Some((device, mut group, worker)) =
        start_workers(&args.parallel, &extra, std::time::Duration::from_secs(cfg.ddp_timeout))?
    else {
        return Ok(ExitCode::SUCCESS);
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
    let workers = crate::dist::Workers { group: group.as_ref() };
    if workers.is_main() {
        eprintln!("effective config:\n{}", indent(&cfg.to_toml()));
    }
    let mut console = ConsoleProgress::new();
    let mut silent = Silent;
    let progress: &mut dyn Progress = if workers.is_main() { &mut console } else { &mut silent };
    let summary =
        crate::run::run(RunRequest { cfg, config_name: name, resume, sft_only, device, interrupt, workers }, progress)?;
    console.finish();
    if workers.is_main() {
        print_summary(&summary)?;
    }
    Ok(if summary.interrupted() { ExitCode::from(130) } else { ExitCode::SUCCESS })
}

/// One process per device. In a launcher (`--gpus`, `--devices cpu:N`) this starts the workers
/// with this command line plus `extra_args`, waits for them and returns `None`; otherwise it
/// returns this process's device, its process group (none when it runs alone) and its place in
/// the job.
fn start_workers(
    par: &ParallelArgs,
    extra_args: &[std::ffi::OsString],
    timeout: std::time::Duration,
) -> anyhow::Result<Option<(Device, Option<crate::dist::ProcessGroup>, crate::dist::WorkerEnv)>> {
    let worker = crate::dist::env::detect()?;
    if !worker.is_distributed() {
        if let Some(plan) = launch_plan(par)? {
            let mut argv: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
            argv.extend(extra_args.iter().cloned());
            let spec = crate::dist::NodeSpec {
                nnodes: par.nnodes,
                node_rank: par.node_rank,
                nproc_per_node: plan.nproc,
                master_addr: par.master_addr.clone().unwrap_or_else(|| "127.0.0.1".into()),
                master_port: match par.master_port {
                    Some(port) => port,
                    None if par.nnodes > 1 => 29_500,
                    None => crate::dist::launcher::free_port()?,
                },
            };
            eprintln!(
                "launching {} {} worker(s) on node {} of {} (world size {})",
                plan.nproc,
                if plan.cuda { "CUDA" } else { "CPU" },
                spec.node_rank,
                spec.nnodes,
                spec.world_size()
            );
            let visible = plan.visible.clone();
            crate::dist::launch_node(
                &spec,
                |_| visible.iter().map(|v| ("CUDA_VISIBLE_DEVICES".to_owned(), v.clone())).collect(),
                &argv,
            )?;
            return Ok(None);
        }
        return Ok(Some((par.device.device(), None, worker)));
    }
    let kind = if par.gpus.is_some() || matches!(par.device, DeviceArg::Cuda(_)) {
        DeviceArg::Cuda(worker.local_rank)
    } else {
        DeviceArg::Cpu
    };
    if let Some(threads) = std::env::var(crate::dist::launcher::THREADS_VAR).ok().and_then(|t| t.parse::<i32>().ok()) {
        tch::set_num_threads(threads);
    }
    let group = crate::dist::ProcessGroup::new(&crate::dist::DistConfig {
        rank: worker.rank,
        world_size: worker.world_size,
        local_rank: worker.local_rank,
        master_addr: worker.master_addr.clone(),
        master_port: worker.master_port,
        backend: if matches!(kind, DeviceArg::Cuda(_)) {
            crate::dist::Backend::Nccl
        } else {
            crate::dist::Backend::Gloo
        },
        timeout,
    })?;
    Ok(Some((kind.device(), Some(group), worker)))
}

/// Progress of the ranks other than 0: nothing.
struct Silent;

impl Progress for Silent {
    fn start(&mut self, _stage: &str, _start_step: u64, _total_steps: u64) {}
    fn step(&mut self, _step: u64, _status: &str) {}
    fn line(&mut self, _text: &str) {}
}

fn indent(text: &str) -> String {
    text.lines().map(|l| format!("  {l}")).collect::<Vec<_>>().join("\n")
}

fn print_summary(summary: &RunSummary) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "run: {}", summary.run_dir.display())?;
    if let Some(sft) = &summary.sft {
        writeln!(out, "sft: {} steps -> {}", sft.steps, sft.model_dir.display())?;
    }
    if let Some(dpo) = &summary.dpo {
        writeln!(out, "dpo: {} steps -> {}", dpo.steps, dpo.model_dir.display())?;
        for (label, metrics) in [("eval", &dpo.eval), ("test", &dpo.test)] {
            if let Some(m) = metrics {
                writeln!(
                    out,
                    "{label}: loss {:.4}  rewards/accuracies {:.3}  rewards/margins {:.4}  rewards/chosen {:.4}  rewards/rejected {:.4}",
                    m.loss, m.rewards_accuracies, m.rewards_margins, m.rewards_chosen, m.rewards_rejected
                )?;
            }
        }
    }
    if let Some(((c0, n0), (c1, n1))) = summary.demo_arithmetic {
        let pct = |c: usize, n: usize| 100.0 * c as f64 / n.max(1) as f64;
        writeln!(
            out,
            "held-out arithmetic answered correctly (greedy): after SFT {c0}/{n0} ({:.1}%), after DPO {c1}/{n1} ({:.1}%)",
            pct(c0, n0),
            pct(c1, n1)
        )?;
    }
    Ok(())
}

fn run_generate(args: GenerateArgs) -> anyhow::Result<()> {
    let prompts = read_prompts(&args.prompts)?;
    let tokenizer = Tokenizer::from_dir(&crate::model::tokenizer_dir(&args.model)?)?;
    let Some((device, group, _)) = start_workers(&args.parallel, &[], std::time::Duration::from_secs(1800))? else {
        return Ok(());
    };
    let workers = crate::dist::Workers { group: group.as_ref() };
    let (_, model) = crate::model::load(&args.model, &device)
        .with_context(|| format!("cannot load the model in `{}`", args.model.display()))?;
    let cfg = SamplingConfig { max_new_tokens: args.max_new_tokens, temperature: args.temperature, top_p: args.top_p };
    // Each rank samples its shard of the prompts; prompt i draws from seed + i, so the output does
    // not depend on the number of workers.
    let mut local = Vec::new();
    for i in workers.shard(prompts.len()) {
        let ids = tokenizer.encode(&prompts[i])?;
        let mut sampler = rng(args.seed.wrapping_add(i as u64));
        local.push(generate(&model, &ids, args.num_samples, tokenizer.eos_id(), &cfg, &mut sampler, &device));
    }
    let completions = gather_completions(&workers, prompts.len(), &local)?;
    if !workers.is_main() {
        return Ok(());
    }
    let mut out = std::io::stdout().lock();
    for (prompt, samples) in prompts.iter().zip(completions) {
        let texts = samples.iter().map(|s| tokenizer.decode(s, true)).collect::<Result<Vec<_>, _>>()?;
        if args.json {
            writeln!(out, "{}", serde_json::json!({ "prompt": prompt, "completions": texts }))?;
        } else {
            for text in texts {
                writeln!(out, "{prompt}{text}")?;
                writeln!(out, "---")?;
            }
        }
    }
    Ok(())
}

/// Every prompt's sampled token ids in prompt order, from each rank's shard. Token ids travel as
/// f32 (exact below 2^24), each sample prefixed by its length.
fn gather_completions(
    workers: &crate::dist::Workers,
    prompts: usize,
    local: &[Vec<Vec<u32>>],
) -> anyhow::Result<Vec<Vec<Vec<u32>>>> {
    let Some(group) = workers.group else { return Ok(local.to_vec()) };
    let mut flat = Vec::new();
    for samples in local {
        flat.push(samples.len() as f32);
        for sample in samples {
            flat.push(sample.len() as f32);
            flat.extend(sample.iter().map(|&t| t as f32));
        }
    }
    let parts = group.all_gather_f32(&flat)?;
    let mut out = vec![Vec::new(); prompts];
    for (rank, part) in parts.iter().enumerate() {
        let mut values = part.iter().map(|&v| v as usize);
        for index in crate::dist::workers::shard(prompts, group.world_size(), rank) {
            let count = values.next().unwrap_or(0);
            out[index] = (0..count)
                .map(|_| {
                    let len = values.next().unwrap_or(0);
                    values.by_ref().take(len).map(|t| t as u32).collect()
                })
                .collect();
        }
    }
    Ok(out)
}

/// One prompt per line of a text file, or the `prompt` field of each JSONL row.
fn read_prompts(path: &Path) -> anyhow::Result<Vec<String>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read `{}`", path.display()))?;
    let jsonl = path.extension().is_some_and(|e| e == "jsonl");
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, line)| {
            if !jsonl {
                return Ok(line.replace("\\n", "\n"));
            }
            let value: serde_json::Value = serde_json::from_str(line)
                .with_context(|| format!("`{}`, line {}: malformed JSON", path.display(), i + 1))?;
            value["prompt"].as_str().map(str::to_owned).with_context(|| {
                format!("`{}`, line {}: field `prompt` is missing or not a string", path.display(), i + 1)
            })
        })
        .collect()
}

fn run_plot(args: PlotArgs) -> anyhow::Result<()> {
    let written = if let [run] = args.runs.as_slice() {
        crate::report::render_run(run, &crate::report::plot_meta_from_run(run))?
    } else {
        let runs = args
            .runs
            .iter()
            .map(|dir| {
                let rows = crate::report::read_metrics(&dir.join(crate::report::METRICS_FILE))?;
                Ok((crate::report::plot_meta_from_run(dir).run_name, rows))
            })
            .collect::<Result<Vec<_>, crate::report::ReportError>>()?;
        let out = args.out.unwrap_or_else(|| args.runs[0].join("compare"));
        std::fs::create_dir_all(&out).with_context(|| format!("cannot create `{}`", out.display()))?;
        crate::report::render_comparison(&runs, &out, "comparison")?
    };
    let mut out = std::io::stdout().lock();
    for path in written {
        writeln!(out, "{}", path.display())?;
    }
    Ok(())
}

fn run_synth(args: SynthArgs) -> anyhow::Result<()> {
    let cfg =
        SynthConfig { seed: args.seed, train: args.train, val: args.val, test: args.test, ..SynthConfig::default() };
    let data = synth::generate(&cfg);
    let written = if args.out.extension().is_some_and(|e| e == "jsonl") {
        let stem = args.out.file_stem().map_or_else(String::new, |s| s.to_string_lossy().into_owned());
        let sibling = |split: &str| args.out.with_file_name(format!("{stem}_{split}.jsonl"));
        synth::write_jsonl(&args.out, &data.train)?;
        synth::write_jsonl(&sibling("val"), &data.val)?;
        synth::write_jsonl(&sibling("test"), &data.test)?;
        [args.out.clone(), sibling("val"), sibling("test")]
    } else {
        synth::write_splits(&args.out, &data)?
    };
    let mut out = std::io::stdout().lock();
    for (path, n) in written.iter().zip([data.train.len(), data.val.len(), data.test.len()]) {
        writeln!(out, "{} ({n} pairs)", path.display())?;
    }
    Ok(())
}

/// Progress on stderr: a bar on a terminal, plain lines otherwise (CI, files).
struct ConsoleProgress {
    bar: Option<indicatif::ProgressBar>,
}

impl ConsoleProgress {
    fn new() -> Self {
        Self { bar: None }
    }

    fn finish(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}

impl Progress for ConsoleProgress {
    fn start(&mut self, stage: &str, start_step: u64, total_steps: u64) {
        self.finish();
        if std::io::stderr().is_terminal() {
            let style = indicatif::ProgressStyle::with_template(
                "{prefix} {bar:30} {pos}/{len} [{elapsed_precise} < {eta_precise}] {msg}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar());
            let bar = indicatif::ProgressBar::new(total_steps).with_style(style).with_prefix(stage.to_owned());
            bar.set_position(start_step);
            self.bar = Some(bar);
        } else {
            eprintln!("{stage}: steps {start_step}..{total_steps}");
        }
    }

    fn step(&mut self, step: u64, status: &str) {
        if let Some(bar) = &self.bar {
            bar.set_position(step);
            bar.set_message(status.to_owned());
        }
    }

    fn line(&mut self, text: &str) {
        match &self.bar {
            Some(bar) => bar.println(text),
            None => eprintln!("{text}"),
        }
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
        loss: args.loss,
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
    let types: Vec<String> = opts
        .loss
        .weighted_types()
        .map(
            |(t, w)| if opts.loss.loss_weights.is_empty() { t.name().to_owned() } else { format!("{} x{w}", t.name()) },
        )
        .collect();
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
        writeln!(
            out,
            "bad rows skipped: {} (lines {})",
            report.skipped.len(),
            lines(&mut report.skipped.iter().map(|s| s.line))
        )?;
    }
    if !t.dropped_prompt_too_long.is_empty() {
        let n = t.dropped_prompt_too_long.len();
        writeln!(
            out,
            "pairs dropped, prompt alone reaches max_length: {n} (lines {})",
            lines(&mut t.dropped_prompt_too_long.iter().copied())
        )?;
    }
    if !t.prefix_mismatch.is_empty() {
        let n = t.prefix_mismatch.len();
        writeln!(
            out,
            "prompt tokenised differently inside prompt+completion (the common prefix is kept, as TRL does): {n} (lines {})",
            lines(&mut t.prefix_mismatch.iter().copied())
        )?;
    }
    if t.truncated > 0 {
        writeln!(out, "sequences truncated to max_length (keep_start): {}", t.truncated)?;
    }
    Ok(())
}
