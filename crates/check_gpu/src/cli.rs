//! The `check-gpu` command line: flags (each declared once, with its help), input selection
//! (live probe, `nvidia-smi` files or a snapshot), and the report. `main.rs` only maps the
//! result to an exit code: 0 ready, 1 ready with warnings, 2 not ready or no usable GPU,
//! 3 bad input.

use std::path::{Path, PathBuf};

use clap::Parser;
use dpo_vocab::keys::UNPAIRED_LOSSES;

use crate::bench::run::{BIN_ENV, BenchError, BenchRequest, Devices};
use crate::bench::{self, BenchRecord};
use crate::memory::{FineTune, Precision, Reference, Sharding};
use crate::model::{ModelError, ModelShape, parse_param_count};
use crate::parse::{self, Input, ParseError};
use crate::plan::{DeviceIds, LengthsError, PlanRequest, plan};
use crate::probe::{self, ProbeError};
use crate::render::{self, Style};
use crate::snapshot::{Snapshot, SnapshotError, Source};

/// Exit code for malformed input files or flags.
pub const EXIT_BAD_INPUT: u8 = 3;
/// The largest batch or sequence length accepted (2^20): far beyond any real run, small enough
/// that every memory product stays exact in 64 bits.
const MAX_COUNT: u64 = 1 << 20;

/// A trainer `--compare` sets beside dpo-train's estimate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Compare {
    /// TRL's DPOTrainer under transformers (eager, sdpa).
    Trl,
}

/// Inspect NVIDIA GPUs (NVML, NCCL, PCIe/NVLink topology) and plan a data-parallel dpo-train run.
///
/// Without --topo/--query/--snapshot it probes this machine through NVML.
#[derive(Debug, Clone, Parser)]
#[command(name = "check-gpu", version)]
pub struct Args {
    /// Analyse this `nvidia-smi topo -m` output instead of probing this machine.
    #[arg(long, value_name = "TOPO.txt")]
    pub topo: Option<PathBuf>,
    /// Analyse this `nvidia-smi --query-gpu=index,name,uuid,pci.bus_id,memory.total,memory.used,memory.free,compute_cap,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max,driver_version --format=csv` output.
    #[arg(long, value_name = "QUERY.csv")]
    pub query: Option<PathBuf>,
    /// Re-analyse a snapshot written by --save (e.g. on a cluster node).
    #[arg(long, value_name = "SNAP.json", conflicts_with_all = ["topo", "query"])]
    pub snapshot: Option<PathBuf>,
    /// Write the probed (or parsed) machine state to this JSON file, atomically (into a directory
    /// as check-gpu-snapshot.json).
    #[arg(long, value_name = "SNAP.json")]
    pub save: Option<PathBuf>,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Model size, e.g. `1.5B`, `500M`, `7e9`, up to 1e15 (shape taken from the nearest well-known model).
    #[arg(long, value_name = "N", conflicts_with = "model")]
    pub model_params: Option<String>,
    /// Hugging Face model directory (its config.json gives the exact shape), or a Hub name in the
    /// local Hugging Face cache.
    #[arg(long, value_name = "DIR")]
    pub model: Option<PathBuf>,
    /// The preference data to train on: the printed command trains on it, and with --model the
    /// plan counts its pairs' tokens as dpo-train packs them (`dpo-train data lengths`, truncated
    /// at --seq-len) instead of sequences of --seq-len tokens.
    #[arg(long, value_name = "FILE")]
    pub data: Option<PathBuf>,
    /// How dpo-train reads --data (its columns, a dataset directory's split, KTO's --unpair):
    /// the plan tokenises the data so, and the command trains so.
    #[command(flatten)]
    pub reading: dpo_vocab::DataReading,
    /// Preference pairs per optimizer step over all GPUs (1 to 1048576).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=MAX_COUNT))]
    pub global_batch: u64,
    /// Tokens per sequence (prompt + completion), dpo-train's --max-length (2 to 1048576: a
    /// prompt token and a completion token at least).
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(2..=MAX_COUNT))]
    pub seq_len: u64,
    /// Train LoRA adapters of this rank on q,k,v,o instead of full fine-tuning (1 to 65536).
    #[arg(long, value_name = "RANK", value_parser = clap::value_parser!(u64).range(1..=65_536))]
    pub lora: Option<u64>,
    /// Training precision [default: bf16, or fp16 on GPUs older than compute capability 8.0 or
    /// whose compute capability neither the query nor the name gives].
    #[arg(long, value_enum)]
    pub dtype: Option<Precision>,
    /// Keep a reference model on each GPU, or precompute its log-probs before training.
    #[arg(long, value_enum, default_value = "keep")]
    pub reference: Reference,
    /// Plan for a loss without a reference model (cpo, simpo, alphapo or orpo): no reference
    /// memory, and the command trains that loss; or for KTOTrainer's kto (its reference kept, at
    /// least 2 rows a micro-batch) or apo_zero_unpaired. DPO's losses keep a reference: omit the
    /// flag.
    #[arg(long, value_name = "cpo|simpo|alphapo|orpo|kto|apo_zero_unpaired", value_parser = parse_loss_type, conflicts_with = "reference")]
    pub loss_type: Option<&'static str>,
    /// Plan with activation checkpointing (recompute activations in the backward pass).
    #[arg(long)]
    pub gradient_checkpointing: bool,
    /// ZeRO stage, dpo-train's --sharding: zero1 partitions AdamW's state over the GPUs, zero2
    /// also the gradients, zero3 also the weights. `auto`: the first of none, zero1, zero2 (with
    /// activation checkpointing if that makes it fit), zero3 and zero3 with --offload-optimizer
    /// that fits (for LoRA too).
    #[arg(long, value_enum, value_name = "STAGE", default_value = "auto")]
    pub sharding: ShardingChoice,
    /// Plan with AdamW's state (and the fp32 master weights in mixed precision) in host memory.
    #[arg(long)]
    pub offload_optimizer: bool,
    /// Also print what another trainer would need per GPU for the same run: `trl`, TRL's
    /// DPOTrainer under transformers (padded rows, the fp32 log-softmax of every position).
    #[arg(long, value_enum, value_name = "TRAINER")]
    pub compare: Option<Compare>,
    /// Use at most this many GPUs (the best-connected ones; 1 to 65536).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=65_536))]
    pub world_size: Option<u64>,
    /// Global batch the learning rate was tuned at, for the scaling factors (1 to 1048576).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=MAX_COUNT))]
    pub lr_base_batch: u64,
    /// How CUDA_VISIBLE_DEVICES names the GPUs.
    #[arg(long, value_enum, default_value = "index")]
    pub device_ids: DeviceIds,
    /// Measure what the plan assumes, on the selected GPUs: all-reduce, all-gather and
    /// reduce-scatter bus bandwidth through dpo-train's c10d process group (NCCL), reported as
    /// nccl-tests does, next to the weakest link's nominal peak; each GPU's copy bandwidth and
    /// bf16 matmul TFLOP/s. Runs `dpo-train bench-comm` ($DPO_TRAIN_BIN, else the dpo-train next
    /// to check-gpu). The result goes into --json and --save, and the plan estimates the time
    /// per optimizer step spent all-reducing gradients from it.
    #[arg(long, conflicts_with_all = ["snapshot", "topo", "query"])]
    pub bench: bool,
    /// With --bench: measure N CPU processes over Gloo instead of the GPUs, e.g. `cpu:2`.
    #[arg(long, value_name = "cpu:N", requires = "bench", conflicts_with_all = ["snapshot", "topo", "query"], value_parser = Devices::parse)]
    pub devices: Option<Devices>,
    /// With --bench: the largest message, e.g. `256M`, `1G` (binary units; sizes go 1M, 4M, 16M,
    /// ... up to it) [default: 1G on GPUs, 64M on CPU processes].
    #[arg(long, value_name = "BYTES", requires = "bench", conflicts_with_all = ["snapshot", "topo", "query"], value_parser = bench::parse_bytes)]
    pub bench_max_bytes: Option<u64>,
}

/// `--sharding`: a stage, or the search.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ShardingChoice {
    /// The first stage that fits.
    Auto,
    /// Every GPU holds a full replica.
    None,
    /// AdamW state partitioned.
    Zero1,
    /// AdamW state and gradients partitioned.
    Zero2,
    /// Weights too, gathered a piece at a time.
    Zero3,
}

impl ShardingChoice {
    /// The fixed stage, or `None` for the search.
    pub fn stage(self) -> Option<Sharding> {
        match self {
            ShardingChoice::Auto => None,
            ShardingChoice::None => Some(Sharding::None),
            ShardingChoice::Zero1 => Some(Sharding::Zero1),
            ShardingChoice::Zero2 => Some(Sharding::Zero2),
            ShardingChoice::Zero3 => Some(Sharding::Zero3),
        }
    }
}

/// Flags that parse but contradict each other.
#[derive(Debug, thiserror::Error)]
pub enum FlagError {
    /// A ZeRO stage partitions over ranks; one rank has nothing to partition over.
    #[error("`--sharding {stage}` partitions over two GPUs or more and `--world-size 1` allows one")]
    ShardingOnOneGpu { stage: &'static str },
    /// More bench processes than the host's memory holds.
    #[error(
        "`--devices cpu:{}`: {}: {}",
        short.n,
        short.describe("bench processes", "a libtorch process and two buffers of the largest message"),
        short.advice("lower `--bench-max-bytes`")
    )]
    HostMemory { short: crate::probe::HostShortfall },
    /// The model or the data the command would train on is not there.
    #[error("`--{flag} {}`: no such file or directory", path.display())]
    Missing { flag: &'static str, path: PathBuf },
    /// A Hub name that is no local path and not in the Hugging Face cache.
    #[error("`--{flag}`: {reason}")]
    NotCached { flag: &'static str, reason: String },
    /// `--unpair` with a loss that reads pairs as they are.
    #[error("`--unpair` applies to KTOTrainer's losses (`--loss-type kto` or `apo_zero_unpaired`), not `{loss}`")]
    UnpairWithoutKto { loss: &'static str },
}

/// A `--model` or `--data` value: where it is read (a Hub name's snapshot in the Hugging Face
/// cache, else the path), and the value itself, which the printed command keeps (dpo-train
/// finds a Hub name in the cache of the machine it runs on; a snapshot path is this one's).
struct Located {
    read: PathBuf,
    given: PathBuf,
    cached: bool,
}

impl Located {
    /// What the printed command names: a Hub name as given, a local path made absolute (by
    /// `local`'s choice of it), so the command runs from any directory.
    fn for_command(self, local: impl Fn(&Path) -> PathBuf) -> PathBuf {
        if self.cached {
            return self.given;
        }
        let path = local(&self.given);
        std::path::absolute(&path).unwrap_or(path)
    }
}

fn locate(value: Option<&Path>, kind: dpo_base::hub::Kind, flag: &'static str) -> Result<Option<Located>, FlagError> {
    let Some(given) = value else { return Ok(None) };
    let found = given.to_str().map(|s| dpo_base::hub::locate(s, kind)).transpose();
    let snapshot = found.map_err(|e| FlagError::NotCached { flag, reason: e.to_string() })?.flatten();
    let cached = snapshot.is_some();
    Ok(Some(Located { read: snapshot.unwrap_or_else(|| given.to_path_buf()), given: given.to_path_buf(), cached }))
}

/// Failures that stop the report.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error(transparent)]
    Parse(#[from] ParseError),
    #[error(transparent)]
    Snapshot(#[from] SnapshotError),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Probe(#[from] ProbeError),
    #[error(transparent)]
    Bench(#[from] BenchError),
    #[error(transparent)]
    Flag(#[from] FlagError),
}

impl CliError {
    /// 3 for bad input (a `--save` path that cannot be written included), 2 for everything else.
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Parse(_) | CliError::Model(_) | CliError::Flag(_) | CliError::Snapshot(_) => EXIT_BAD_INPUT,
            CliError::Probe(_) | CliError::Bench(_) => 2,
        }
    }
}

/// What to print and how to exit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub stdout: String,
    pub exit_code: u8,
    /// An error that did not stop the report (a `--save` that failed): stderr's one line.
    pub error: Option<String>,
}

impl Outcome {
    /// The report, and the exit code of `status` unless `saved` failed (then its error and 3).
    fn after_save(stdout: String, status: crate::plan::Status, saved: Result<(), SnapshotError>) -> Outcome {
        match saved {
            Ok(()) => Outcome { stdout, exit_code: status.exit_code(), error: None },
            Err(e) => {
                let e = CliError::from(e);
                Outcome { stdout, exit_code: e.exit_code(), error: Some(one_line(&e)) }
            }
        }
    }
}

/// clap's error (several lines: the message, a tip, the usage) as one line for
/// `check-gpu: error: ..`: the lines before the usage, without clap's own `error: `.
pub fn flag_error_line(rendered: &str) -> String {
    let parts: Vec<&str> = rendered
        .lines()
        .map(str::trim)
        .take_while(|l| !l.starts_with("Usage:") && !l.starts_with("For more information"))
        .filter(|l| !l.is_empty())
        .collect();
    let mut line = String::new();
    for (i, part) in parts.iter().enumerate() {
        let sep = if i == 0 {
            ""
        } else if part.starts_with("tip:") {
            "; "
        } else {
            " "
        };
        line.push_str(sep);
        line.push_str(part);
    }
    format!("{} (see --help)", line.strip_prefix("error: ").unwrap_or(&line))
}

/// The run settings from the flags, and where `--model` and `--data` were found to read them
/// (`dpo-train data lengths` reads them again at another micro-batch: [`settled`]).
pub fn plan_request(args: &Args) -> Result<(PlanRequest, Option<(PathBuf, PathBuf)>), CliError> {
    let model_at = locate(args.model.as_deref(), dpo_base::hub::Kind::Model, "model")?;
    let data_at = locate(args.data.as_deref(), dpo_base::hub::Kind::Dataset, "data")?;
    if let Some(at) = model_at.as_ref().filter(|at| !at.read.exists()) {
        return Err(FlagError::Missing { flag: "model", path: at.given.clone() }.into());
    }
    let model = match (&model_at, &args.model_params) {
        (Some(at), _) => Some(ModelShape::from_hf_dir(&at.read)?),
        (None, Some(n)) => Some(ModelShape::from_param_count(parse_param_count(n)?)),
        (None, None) => None,
    };
    let sharding = args.sharding.stage();
    if let Some(stage) = sharding.filter(|&s| s != Sharding::None)
        && args.world_size == Some(1)
    {
        return Err(FlagError::ShardingOnOneGpu { stage: stage.name() }.into());
    }
    if let Some(loss) = args.loss_type.filter(|loss| args.reading.unpair && !UNPAIRED_LOSSES.contains(loss)) {
        return Err(FlagError::UnpairWithoutKto { loss }.into());
    }
    if let Some(at) = data_at.as_ref().filter(|at| !at.read.exists()) {
        return Err(FlagError::Missing { flag: "data", path: at.given.clone() }.into());
    }
    // dpo-train tokenises the data as its training will; without it the plan bounds by --seq-len.
    let reads = model_at.as_ref().zip(data_at.as_ref()).map(|(m, d)| (m.read.clone(), d.read.clone()));
    let (lengths, lengths_error) = match (&data_at, &model_at) {
        (Some(data), Some(model)) => match data_lengths(&model.read, &data.read, args, None) {
            Ok(l) => (Some(l), None),
            Err(e) => (None, Some(e)),
        },
        _ => (None, None),
    };
    let req = PlanRequest {
        model,
        model_dir: model_at.map(|at| at.for_command(ModelShape::hf_dir)),
        data: data_at.map(|at| at.for_command(Path::to_path_buf)),
        reading: args.reading.clone(),
        global_batch: args.global_batch,
        seq_len: args.seq_len,
        dtype: args.dtype,
        finetune: args.lora.map_or(FineTune::Full, |rank| FineTune::Lora { rank }),
        reference: match args.loss_type {
            Some(loss) if !UNPAIRED_LOSSES.contains(&loss) => Reference::None,
            _ => args.reference,
        },
        loss_type: args.loss_type,
        gradient_checkpointing: args.gradient_checkpointing,
        sharding,
        offload_optimizer: args.offload_optimizer,
        max_world_size: args.world_size.map(|w| usize::try_from(w).unwrap_or(usize::MAX)),
        lr_base_batch: args.lr_base_batch,
        device_ids: args.device_ids,
        compare_trl: args.compare == Some(Compare::Trl),
        lengths,
        lengths_error,
    };
    Ok((req, reads))
}

/// Loads the snapshot the flags ask for; `Ok(None)` with the NVML error when the live probe
/// cannot load NVML.
fn load_snapshot(args: &Args) -> Result<Result<Snapshot, ProbeError>, CliError> {
    if let Some(path) = &args.snapshot {
        return Ok(Ok(Snapshot::load(path)?));
    }
    if args.topo.is_some() || args.query.is_some() {
        let topo_text = args.topo.as_deref().map(parse::read).transpose()?;
        let query_text = args.query.as_deref().map(parse::read).transpose()?;
        let topo = args.topo.as_deref().zip(topo_text.as_deref()).map(|(path, text)| Input { text, path });
        let query = args.query.as_deref().zip(query_text.as_deref()).map(|(path, text)| Input { text, path });
        return Ok(Ok(parse::offline_snapshot(topo, query)?));
    }
    Ok(probe::probe_live())
}

pub use dpo_base::error::one_line;

/// `make_plan` of `req`, where `kto`'s lengths depend on the micro-batch: its KL completions
/// rotate within each micro-batch, so the lengths are read again at the planned micro-batch
/// (dpo-train's default of 8 the first time) until the plan keeps the one they were read at.
fn settled(
    args: &Args,
    reads: Option<&(PathBuf, PathBuf)>,
    req: &mut PlanRequest,
    make_plan: impl Fn(&PlanRequest) -> crate::Plan,
) -> Result<crate::Plan, CliError> {
    let mut p = make_plan(req);
    let mut read_at = crate::plan::DEFAULT_MICRO_BATCH_CAP;
    // A few rounds: the micro-batch moves only where the new lengths change what fits.
    for _ in 0..3 {
        if req.loss_type != Some(dpo_vocab::keys::KTO) || req.lengths.is_none() || p.micro_batch == read_at {
            break;
        }
        read_at = p.micro_batch.max(1);
        let Some((model, data)) = reads else { break };
        match data_lengths(model, data, args, Some(read_at)) {
            Ok(l) => req.lengths = Some(l),
            Err(e) => (req.lengths, req.lengths_error) = (None, Some(e)),
        }
        p = make_plan(req);
    }
    Ok(p)
}

/// Runs the whole command with the given output style.
pub fn run(args: &Args, style: Style) -> Result<Outcome, CliError> {
    let (mut req, reads) = plan_request(args)?;
    let mut snap = match load_snapshot(args)? {
        Ok(s) => s,
        Err(e @ ProbeError::NvmlLoad { .. }) => return cpu_fallback(args, (&mut req, reads.as_ref()), &e, style),
        Err(e) => return Err(e.into()),
    };
    if args.bench {
        // Without --devices the bench measures the GPUs the plan selects, so its numbers are
        // those of the run it plans.
        let devices = args.devices.clone().unwrap_or_else(|| Devices::Gpus(plan(&snap, &req).gpus));
        snap.bench = Some(measure(args, devices)?);
    }
    // A failed save still prints the plan, then reports the path (exit 3).
    let saved = args.save.as_deref().map(|path| snap.save(path)).transpose();
    let p = settled(args, reads.as_ref(), &mut req, |req| plan(&snap, req))?;
    if args.json {
        return Ok(Outcome::after_save(render::json(Some(&snap), &p), p.status, saved.map(drop)));
    }
    let mut stdout = render::text(Some(&snap), &p, style);
    if let Ok(Some(file)) = &saved {
        stdout.push_str(&format!("Saved `{}` (read it back with --snapshot).\n", file.display()));
    }
    Ok(Outcome::after_save(stdout, p.status, saved.map(drop)))
}

/// `dpo-train data lengths` of `data` under `model`'s tokenizer, read as the flags' run reads it
/// (`--seq-len`'s truncation, the data's columns and split, the loss's rows), or why not.
fn data_lengths(
    model: &Path,
    data: &Path,
    args: &Args,
    micro_batch: Option<u64>,
) -> Result<crate::memory::DataLengths, LengthsError> {
    let not_run = LengthsError::NotRun;
    let program = bench::run::locate(std::env::var_os(BIN_ENV), std::env::current_exe().ok())
        .map_err(|e| not_run(e.to_string()))?;
    let mut keys = args.reading.keys();
    keys.push((dpo_vocab::keys::MAX_LENGTH, args.seq_len.to_string()));
    keys.extend(args.loss_type.map(|loss| (dpo_vocab::keys::LOSS_TYPE, loss.to_owned())));
    keys.extend(micro_batch.map(|b| (dpo_vocab::keys::PER_DEVICE_TRAIN_BATCH_SIZE, b.to_string())));
    let out = std::process::Command::new(&program)
        .args(["data", "lengths", "--model"])
        .arg(model)
        .arg("--data")
        .arg(data)
        .args(keys.into_iter().flat_map(|(key, value)| [dpo_vocab::flag(key), value]))
        .output()
        .map_err(|e| not_run(format!("`{}` did not start: {e}", program.display())))?;
    if !out.status.success() {
        let said = String::from_utf8_lossy(&out.stderr);
        let last = said.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("no message").trim();
        return Err(LengthsError::Data(last.to_owned()));
    }
    serde_json::from_slice(&out.stdout)
        .map_err(|e| not_run(format!("`dpo-train data lengths` printed no lengths: {e}")))
}

/// Runs `dpo-train bench-comm` on `devices` with the flags' sizes.
fn measure(args: &Args, devices: Devices) -> Result<BenchRecord, CliError> {
    if devices.world_size() == 0 {
        return Err(BenchError::NothingToMeasure.into());
    }
    let default_max = match devices {
        Devices::Cpu(_) => bench::DEFAULT_CPU_MAX_BYTES,
        Devices::Gpus(_) => bench::DEFAULT_MAX_BYTES,
    };
    let max_bytes = args.bench_max_bytes.unwrap_or(default_max);
    if let Devices::Cpu(n) = devices {
        let each = crate::memory::CUDA_CONTEXT_BYTES.saturating_add(max_bytes.saturating_mul(2));
        if let Some(short) = crate::probe::HostShortfall::of(n as u64, each, crate::probe::host_memory_available()) {
            return Err(FlagError::HostMemory { short }.into());
        }
    }
    let program = bench::run::locate(std::env::var_os(BIN_ENV), std::env::current_exe().ok())?;
    let request = BenchRequest { devices, min_bytes: bench::DEFAULT_MIN_BYTES.min(max_bytes), max_bytes };
    let result = bench::run::run(&program, &request)?;
    let gpus = match request.devices {
        Devices::Gpus(g) => g,
        Devices::Cpu(_) => Vec::new(),
    };
    Ok(BenchRecord { gpus, bench: result })
}

/// No NVML: the plan is to train on CPU cores. `--bench --devices cpu:N` still measures (Gloo),
/// shows the bench and, with `--save`, writes a snapshot of no GPU with that bench.
fn cpu_fallback(
    args: &Args,
    (req, reads): (&mut PlanRequest, Option<&(PathBuf, PathBuf)>),
    err: &ProbeError,
    style: Style,
) -> Result<Outcome, CliError> {
    let reason = one_line(err);
    let mut system = crate::snapshot::System::default();
    probe::host_facts(&mut system);
    let snap = if args.bench {
        let devices = args.devices.clone().ok_or(BenchError::NoGpuHere)?;
        let rec = measure(args, devices)?;
        let mut s = Snapshot::new(Source::Live);
        s.system = system.clone();
        s.probe_notes.push(reason.clone());
        s.bench = Some(rec);
        Some(s)
    } else {
        None
    };
    let bench = snap.as_ref().and_then(|s| s.bench.as_ref());
    let p = settled(args, reads, req, |req| crate::plan::cpu_plan(req, &system, reason.clone(), bench))?;
    let cpus = system.cpu_count.unwrap_or(1);
    let saved = match (&args.save, &snap) {
        (Some(path), Some(s)) => s.save(path).map(Some),
        _ => Ok(None),
    };
    if args.json {
        return Ok(Outcome::after_save(render::json(snap.as_ref(), &p), p.status, saved.map(drop)));
    }
    let mut stdout = format!(
        "check-gpu: {reason}\nNo NVIDIA GPU can be used here. To train on the {cpus} CPU core(s) instead:\n  {}\n",
        p.command
    );
    if let Some(note) = crate::plan::placeholder_note(&p.command) {
        stdout.push_str(&format!("  {note}\n"));
    }
    // The first warning is `reason`, printed above.
    for w in p.warnings.iter().skip(1) {
        stdout.push_str(&format!("  ! {w}\n"));
    }
    for n in &p.notes {
        stdout.push_str(&format!("  - {n}\n"));
    }
    stdout.push_str(&render::memory_text(&p, style));
    if let Some(rec) = snap.as_ref().and_then(|s| s.bench.as_ref()) {
        stdout.push_str(&render::bench_text(&crate::peak::summarize(rec, None), style));
        if let Some(c) = &p.communication {
            stdout.push_str(&format!("  {}\n", render::communication_line(c)));
        }
    }
    match (&args.save, &saved) {
        (_, Ok(Some(file))) => {
            stdout.push_str(&format!("Saved `{}`: no GPU, the CPU bench only.\n", file.display()));
        }
        (Some(path), Ok(None)) => {
            stdout.push_str(&format!("Nothing was saved to `{}`: there is no GPU state to save.\n", path.display()));
        }
        _ => {}
    }
    Ok(Outcome::after_save(stdout, p.status, saved.map(drop)))
}

/// `--loss-type`: one of dpo-vocab's reference-free or unpaired losses (DPO's need no flag).
fn parse_loss_type(s: &str) -> Result<&'static str, String> {
    let keys = dpo_vocab::keys::REFERENCE_FREE_LOSSES.into_iter().chain(dpo_vocab::keys::UNPAIRED_LOSSES);
    keys.clone().find(|l| *l == s).ok_or_else(|| {
        format!(
            "`{s}` is not a reference-free or unpaired loss ({}); a DPO loss needs no --loss-type",
            keys.collect::<Vec<_>>().join(", ")
        )
    })
}
