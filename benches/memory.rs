//! `make bench` (memory): peak memory of DPO training on the medium model (hidden 768, 12
//! layers, 32k vocabulary, 2 pairs of 512-token sequences per step, f32) for full fine-tuning,
//! LoRA, a precomputed reference and activation checkpointing, and in bf16 mixed precision for
//! full fine-tuning, LoRA and checkpointing, next to `check-gpu`'s estimate for the same
//! settings; the same for a 150k-vocabulary model (its LM head most of the peak); then the ZeRO stages over 2 and 4 CPU worker processes (f32, and zero1/zero2 in bf16,
//! where the weights stay in bf16 beside sharded fp32 masters), each rank's peak while training
//! (dpo-train's own report) next to the estimate for that stage. `DPO_TRAIN_BENCH_MEMORY_ONLY=TEXT`
//! runs only the rows whose name contains TEXT (and the first, for the baseline).
//!
//! Each configuration trains in its own process, which reports its peak resident set (`VmHWM`)
//! and its resident set once libtorch is loaded, before any model (`VmRSS`); the difference is
//! what training added, the quantity the estimate models (its CUDA context and kernel scratch
//! left out: there is no GPU here). The process runs with glibc's mmap threshold fixed at 64 KiB so that freed
//! tensors leave the resident set, making it the CPU's analogue of CUDA's peak allocated bytes
//! (`torch.cuda.max_memory_allocated`), which is what the estimate is for.
//!
//! Each run is also a row of `results/cpu/memory-<cpu>.json` (the GPU table's fields, the peak as
//! `resident_bytes`), which check-gpu's `tests/measured.rs` holds the estimate to.

mod common;

use std::path::Path;
use std::process::Command;
use std::sync::atomic::AtomicBool;

use burn::tensor::{Device, Tensor};
use check_gpu::memory::packed::WORKSPACE_BYTES;
use check_gpu::{Engine, FineTune, MemoryRequest, ModelShape, PairTokens, Precision, Reference, Sharding, estimate};
use dpo_train::config::TrainConfig;
use dpo_train::run::{RunRequest, run};
use dpo_train::train::Progress;

const ROLE: &str = "DPO_TRAIN_BENCH_MEMORY_CONFIG";
const MICRO_BATCH: u64 = 2;
const SEQ_LEN: u64 = 512;
/// Each pair's tokens: a 128-token prompt and two completions of 384.
const TOKENS: PairTokens = PairTokens { prompt: 128, completion: 384 };
const LORA_RANK: u64 = 16;

/// One run's setting and peak as a row of the table `tests/measured.rs` reads.
struct Row {
    shape: (&'static str, &'static common::Shape),
    precision: Precision,
    lora_r: u64,
    reference: Reference,
    checkpointing: bool,
    sharding: Sharding,
    world_size: u64,
}

impl Row {
    fn record(&self, json: &Path, resident_bytes: u64) {
        let (name, m) = self.shape;
        let row = serde_json::json!({
            "shape": name,
            "model_type": "llama",
            "hidden": m.hidden, "layers": m.layers, "heads": m.heads, "kv_heads": m.kv_heads,
            "intermediate": m.intermediate, "vocab": m.vocab, "tied_embeddings": true,
            "precision": if self.precision == Precision::Bf16 { "bf16" } else { "fp32" },
            "micro_batch": MICRO_BATCH,
            "max_length": SEQ_LEN,
            "prompt_tokens": TOKENS.prompt,
            "completion_tokens": TOKENS.completion,
            "gradient_checkpointing": self.checkpointing,
            "lora_r": self.lora_r,
            "reference": if self.reference == Reference::Precompute { "precompute" } else { "keep" },
            "sharding": self.sharding.name(),
            "world_size": self.world_size,
            "offload_optimizer": false,
            "steps": 2,
            "resident_bytes": resident_bytes,
        });
        common::record(json, row).unwrap_or_else(|e| panic!("{e}"));
    }
}

struct Case {
    name: &'static str,
    keys: &'static str,
    finetune: FineTune,
    reference: Reference,
    checkpointing: bool,
    precision: Precision,
}

const CASES: [Case; 8] = [
    Case {
        name: "full fine-tuning",
        keys: "",
        finetune: FineTune::Full,
        reference: Reference::Keep,
        checkpointing: false,
        precision: Precision::Fp32,
    },
    Case {
        name: "LoRA r=16 q,k,v,o",
        keys: "lora_r = 16\nlora_target_modules = [\"q_proj\", \"k_proj\", \"v_proj\", \"o_proj\"]\n",
        finetune: FineTune::Lora { rank: LORA_RANK },
        reference: Reference::Keep,
        checkpointing: false,
        precision: Precision::Fp32,
    },
    Case {
        name: "precomputed reference",
        keys: "precompute_ref_log_probs = true\n",
        finetune: FineTune::Full,
        reference: Reference::Precompute,
        checkpointing: false,
        precision: Precision::Fp32,
    },
    Case {
        name: "activation checkpointing",
        keys: "",
        finetune: FineTune::Full,
        reference: Reference::Keep,
        checkpointing: true,
        precision: Precision::Fp32,
    },
    Case {
        name: "LoRA + checkpointing",
        keys: "lora_r = 16\nlora_target_modules = [\"q_proj\", \"k_proj\", \"v_proj\", \"o_proj\"]\n",
        finetune: FineTune::Lora { rank: LORA_RANK },
        reference: Reference::Keep,
        checkpointing: true,
        precision: Precision::Fp32,
    },
    // Mixed precision: the layers keep their activations in bf16 beside the f32 masters.
    Case {
        name: "bf16 full fine-tuning",
        keys: "",
        finetune: FineTune::Full,
        reference: Reference::Keep,
        checkpointing: false,
        precision: Precision::Bf16,
    },
    Case {
        name: "bf16 LoRA r=16 q,k,v,o",
        keys: "lora_r = 16\nlora_target_modules = [\"q_proj\", \"k_proj\", \"v_proj\", \"o_proj\"]\n",
        finetune: FineTune::Lora { rank: LORA_RANK },
        reference: Reference::Keep,
        checkpointing: false,
        precision: Precision::Bf16,
    },
    Case {
        name: "bf16 checkpointing",
        keys: "",
        finetune: FineTune::Full,
        reference: Reference::Keep,
        checkpointing: true,
        precision: Precision::Bf16,
    },
];

/// The second shape: the small trunk under Qwen's 151,936-token vocabulary, where the LM head's
/// buffers are most of a step's memory (its backward in several groups).
const WIDE: (&str, &common::Shape) = ("150k vocabulary", &common::WIDE_VOCAB);
/// The cases the wide-vocabulary model runs.
const WIDE_CASES: [&str; 4] =
    ["full fine-tuning", "bf16 full fine-tuning", "bf16 LoRA r=16 q,k,v,o", "bf16 checkpointing"];

fn main() {
    if let Ok(config) = std::env::var(ROLE) {
        child(Path::new(&config));
        return;
    }
    let work = common::root().join("target/bench-assets");
    std::fs::create_dir_all(&work).expect("target/bench-assets");
    let out = tempfile::tempdir().expect("a temporary directory");
    let medium = common::model_dir(&work.join("medium"), &common::MEDIUM);
    // Pairs of fixed lengths (prompt 128, each sequence 512 tokens): every micro-batch packs the same.
    let data = common::sized_pairs(&work.join("fixed-medium-128-512-8.jsonl"), &medium, 8, 128..=128, 512..=512, 3);
    // The first case always runs: its libtorch baseline is the ZeRO rows' too.
    let cases = CASES.iter().enumerate().filter(|(i, c)| *i == 0 || selected(c.name)).map(|(_, c)| c);
    let libtorch = single(("medium", &common::MEDIUM), &medium, &data, cases.collect(), out.path());
    let wide = common::model_dir(&work.join("wide-vocab"), WIDE.1);
    // A name that matches no case would drop its row without a word.
    for name in WIDE_CASES {
        assert!(CASES.iter().any(|c| c.name == name), "WIDE_CASES names `{name}`, which no case is");
    }
    let cases: Vec<&Case> =
        CASES.iter().filter(|c| WIDE_CASES.contains(&c.name) && selected(&format!("{} {}", WIDE.0, c.name))).collect();
    if !cases.is_empty() {
        single(WIDE, &wide, &data, cases, out.path());
    }
    // A worker's libtorch before any model: as a lone training process's.
    let shape = ModelShape::from_hf_dir(&medium).expect("the model's config.json");
    sharded(&medium, &data, &shape, out.path(), libtorch);
}

/// Each of `cases` on the model of `shape` in one process, next to the estimate; returns the
/// last run's resident set before its model (libtorch's own).
fn single(
    shape: (&'static str, &'static common::Shape),
    model: &Path,
    data: &Path,
    cases: Vec<&Case>,
    out: &Path,
) -> u64 {
    let m = ModelShape::from_hf_dir(model).expect("the model's config.json");
    println!(
        "\npeak memory, {} model ({:.0}M parameters), {MICRO_BATCH} pairs x {SEQ_LEN} tokens per step, f32 unless named",
        shape.0,
        m.params as f64 / 1e6
    );
    println!("{:<26} {:>12} {:>12} {:>8}", "", "measured", "estimate", "ratio");
    let (mut worst, mut libtorch): (f64, u64) = (0.0, 0);
    for case in cases {
        let run = format!("{}-{}", shape.0, case.name).replace([' ', ',', '=', '+'], "_");
        let config = out.join(format!("{run}.toml"));
        let text = format!(
            "model_name_or_path = \"{}\"\ntrain_file = \"{}\"\noutput_dir = \"{}\"\nrun_name = \"run\"\nmax_length = {SEQ_LEN}\nper_device_train_batch_size = {MICRO_BATCH}\nper_device_eval_batch_size = {MICRO_BATCH}\nmax_steps = 2\nlogging_steps = 1\nsave_steps = 0\nnum_samples = 0\nlearning_rate = 1e-5\nbf16 = {}\ngradient_checkpointing = {}\n{}",
            model.display(),
            data.display(),
            out.join(&run).display(),
            case.precision == Precision::Bf16,
            case.checkpointing,
            case.keys
        );
        std::fs::write(&config, text).expect("the config is written");
        let (baseline, peak) = measure(&config);
        // Each run's model and checkpoint (about 1 GiB) would fill the disk over the bench.
        let _ = std::fs::remove_dir_all(out.join(&run));
        libtorch = baseline;
        let measured = peak.saturating_sub(baseline);
        let e = estimate(&MemoryRequest {
            model: &m,
            micro_batch: MICRO_BATCH,
            seq_len: SEQ_LEN,
            dtype: case.precision,
            finetune: case.finetune,
            reference: case.reference,
            gradient_checkpointing: case.checkpointing,
            world_size: 1,
            sharding: Sharding::None,
            offload_optimizer: false,
            engine: Engine::DpoTrain(TOKENS.batch(MICRO_BATCH)),
            cuda: false,
            accumulation: 1,
        });
        let estimated = e.allocated() - WORKSPACE_BYTES;
        let ratio = estimated as f64 / measured as f64;
        worst = worst.max((ratio - 1.0).abs());
        println!("{:<26} {:>12} {:>12} {:>8.2}", case.name, gib(measured), gib(estimated), ratio);
        let lora_r = if let FineTune::Lora { rank } = case.finetune { rank } else { 0 };
        let row = Row {
            shape,
            precision: case.precision,
            lora_r,
            reference: case.reference,
            checkpointing: case.checkpointing,
            sharding: Sharding::None,
            world_size: 1,
        };
        row.record(&common::cpu_results("memory"), measured);
    }
    println!(
        "largest estimate error: {:.0}% (libtorch's own resident set before loading a model is left out)",
        worst * 100.0
    );
    libtorch
}

/// The ZeRO stages over 2 and 4 CPU workers, each rank's peak while training (the largest of the
/// ranks', as dpo-train reports it) next to the estimate for that stage and world size.
fn sharded(model: &Path, data: &Path, shape: &ModelShape, dir: &Path, baseline: u64) {
    let stages = [
        ("none", Sharding::None, false, Precision::Fp32),
        ("zero1", Sharding::Zero1, false, Precision::Fp32),
        ("zero2", Sharding::Zero2, false, Precision::Fp32),
        ("zero2 + checkpointing", Sharding::Zero2, true, Precision::Fp32),
        ("zero3", Sharding::Zero3, true, Precision::Fp32),
        // bf16 without checkpointing: the device keeps bf16 weights beside sharded fp32 masters.
        ("bf16 zero1", Sharding::Zero1, false, Precision::Bf16),
        ("bf16 zero2", Sharding::Zero2, false, Precision::Bf16),
    ];
    println!("\npeak memory per rank while training, ZeRO stages over CPU workers (Gloo), same model and micro-batch");
    println!("{:<26} {:>8} {:>12} {:>12} {:>8}", "", "workers", "measured", "estimate", "ratio");
    let mut worst: f64 = 0.0;
    for world in [2u64, 4] {
        for (name, sharding, checkpointing, precision) in stages.into_iter().filter(|s| selected(s.0)) {
            let run = format!("{}-{world}", name.replace([' ', '+'], "_"));
            let config = dir.join(format!("{run}.toml"));
            let text = format!(
                "model_name_or_path = \"{}\"\ntrain_file = \"{}\"\noutput_dir = \"{}\"\nrun_name = \"{run}\"\nmax_length = {SEQ_LEN}\nper_device_train_batch_size = {MICRO_BATCH}\nper_device_eval_batch_size = {MICRO_BATCH}\nmax_steps = 2\nlogging_steps = 1\nsave_steps = 0\nnum_samples = 0\nlearning_rate = 1e-5\nbf16 = {}\ngradient_checkpointing = {checkpointing}\nsharding = \"{}\"\n",
                model.display(),
                data.display(),
                dir.display(),
                precision == Precision::Bf16,
                name.split(' ').find(|w| w.starts_with("zero") || *w == "none").unwrap_or(name),
            );
            std::fs::write(&config, text).expect("the config is written");
            let measured = workers_peak(&config, world).saturating_sub(baseline);
            let _ = std::fs::remove_dir_all(dir.join(&run));
            let e = estimate(&MemoryRequest {
                model: shape,
                micro_batch: MICRO_BATCH,
                seq_len: SEQ_LEN,
                dtype: precision,
                finetune: FineTune::Full,
                reference: Reference::Keep,
                gradient_checkpointing: checkpointing,
                world_size: world,
                sharding,
                offload_optimizer: false,
                engine: Engine::DpoTrain(TOKENS.batch(MICRO_BATCH)),
                cuda: false,
                accumulation: 1,
            });
            let estimated = e.allocated() - WORKSPACE_BYTES;
            let ratio = estimated as f64 / measured as f64;
            worst = worst.max((ratio - 1.0).abs());
            println!("{:<26} {:>8} {:>12} {:>12} {:>8.2}", name, world, gib(measured), gib(estimated), ratio);
            let row = Row {
                shape: ("medium", &common::MEDIUM),
                precision,
                lora_r: 0,
                reference: Reference::Keep,
                checkpointing,
                sharding,
                world_size: world,
            };
            row.record(&common::cpu_results("memory"), measured);
        }
    }
    println!("largest estimate error: {:.0}%", worst * 100.0);
}

/// Whether the row `name` runs: all of them, or those whose name contains
/// `DPO_TRAIN_BENCH_MEMORY_ONLY` (to re-measure a few; each row replaces its own in the table).
fn selected(name: &str) -> bool {
    std::env::var("DPO_TRAIN_BENCH_MEMORY_ONLY").map_or(true, |only| name.contains(&only))
}

/// The largest peak resident set of the ranks of a run over `world` CPU workers, from the line
/// dpo-train prints after training.
fn workers_peak(config: &Path, world: u64) -> u64 {
    let out = Command::new(env!("CARGO_BIN_EXE_dpo-train"))
        .args(["train", "--config", &config.display().to_string(), "--devices", &format!("cpu:{world}")])
        .env("MALLOC_MMAP_THRESHOLD_", "65536")
        .env("OMP_NUM_THREADS", "1")
        .output()
        .expect("dpo-train runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        eprintln!("{stderr}");
        std::process::exit(1);
    }
    let line = stderr.lines().find(|l| l.contains("peak resident memory while training, per rank:"));
    let line = line.unwrap_or_else(|| panic!("no peak memory line in:\n{stderr}"));
    let ranks = line.rsplit(':').next().unwrap_or_default().split(',');
    let gib = ranks.filter_map(|r| r.trim().trim_end_matches(" GiB").parse::<f64>().ok());
    (gib.fold(0.0, f64::max) * f64::from(1u32 << 30)) as u64
}

fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
}

/// (resident set before the model, peak resident set) of one training process, bytes.
fn measure(config: &Path) -> (u64, u64) {
    let mut command = Command::new(std::env::current_exe().expect("the bench binary"));
    command
        .env(ROLE, config)
        // Every allocation above 64 KiB gets its own mapping, returned to the system when freed:
        // the resident set then follows the live tensors (glibc's adaptive threshold otherwise
        // keeps freed activations resident, up to 3x the live bytes on this workload).
        .env("MALLOC_MMAP_THRESHOLD_", "65536");
    let text = common::stdout_of(&mut command, "the bench's child runs");
    let mut numbers = text.split_whitespace().filter_map(|w| w.parse::<u64>().ok());
    match (numbers.next(), numbers.next()) {
        (Some(baseline), Some(peak)) => (baseline, peak),
        _ => panic!("unexpected child output: {text}"),
    }
}

/// A `/proc/self/status` field in bytes.
fn status_bytes(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let line = status.lines().find(|l| l.starts_with(field)).expect("the field");
    line.split_whitespace().nth(1).and_then(|kb| kb.parse::<u64>().ok()).expect("kB") * 1024
}

struct Quiet;

impl Progress for Quiet {
    fn start(&mut self, _stage: &str, _start: u64, _total: u64) {}
    fn step(&mut self, _step: u64, _status: &str) {}
    fn line(&mut self, _text: &str) {}
}

#[allow(deprecated)] // burn's libtorch device is deprecated upstream; it is this project's backend.
fn child(config: &Path) {
    let device = Device::libtorch();
    // Load and initialise libtorch before taking the baseline.
    let warm = Tensor::<2>::ones([64, 64], &device);
    let _ = (warm.clone().matmul(warm)).sum().into_scalar::<f32>();
    let baseline = status_bytes("VmRSS:");
    let cfg = TrainConfig::from_toml_file(config).expect("the config parses");
    let plan = cfg.resolve().expect("the config is valid");
    let interrupt = AtomicBool::new(false);
    let req = RunRequest {
        cfg,
        plan,
        config_name: "bench".into(),
        resume: None,
        sft_only: false,
        rt: dpo_train::train::Runtime {
            device,
            interrupt: &interrupt,
            workers: dpo_train::train::Workers::single(),
            overlap_reference: None,
        },
        config_description: String::new(),
    };
    run(req, &mut Quiet).expect("training runs");
    println!("{baseline} {}", status_bytes("VmHWM:"));
}
