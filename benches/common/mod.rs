//! What the benchmarks share: a medium Llama model (hidden 768, 12 layers, 12 heads, 32k
//! vocabulary) saved in Hugging Face format with random weights, and preference pairs long
//! enough to fill 512-token sequences.
#![allow(dead_code)] // each bench binary uses a different subset

use std::path::{Path, PathBuf};

use burn::tensor::Device;
use dpo_train::model::{Llama, LlamaConfig, RandomInit};
use dpo_train::train::checkpoint::{ModelFiles, write_model_dir};

/// The checkout's root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A model shape in `config.json` form.
pub struct Shape {
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub intermediate: usize,
    pub vocab: usize,
}

/// The medium model: about 110M parameters (GPT-2 small's trunk, Llama layers).
pub const MEDIUM: Shape = Shape { hidden: 768, layers: 12, heads: 12, intermediate: 2048, vocab: 32000 };
/// The small one: hidden 256, 4 layers.
pub const SMALL: Shape = Shape { hidden: 256, layers: 4, heads: 4, intermediate: 688, vocab: 32000 };

/// Writes a randomly initialised model of `shape` with the fixture tokenizer into `dir`
/// (skipped when already there) and returns `dir`.
#[allow(deprecated)] // burn's libtorch device is deprecated upstream; it is this project's backend.
pub fn model_dir(dir: &Path, shape: &Shape) -> PathBuf {
    if dir.join("model.safetensors").is_file() {
        return dir.to_owned();
    }
    let config = serde_json::json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": shape.hidden,
        "intermediate_size": shape.intermediate,
        "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.heads,
        "vocab_size": shape.vocab,
        "max_position_embeddings": 1024,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": true,
        "hidden_act": "silu",
        "eos_token_id": 2,
        "torch_dtype": "float32",
    })
    .to_string();
    let cfg = LlamaConfig::parse(&config, Path::new("config.json"));
    let cfg = cfg.expect("the benchmark's model config is valid");
    let model = Llama::load(&RandomInit { seed: 0, std: 0.02 }, &cfg, &Device::libtorch()).expect("random init");
    write_model_dir(dir, &model, ModelFiles::Full { config_json: &config }).expect("the model is written");
    let tokenizer = root().join("tests/fixtures/models/llama");
    for file in ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"] {
        std::fs::copy(tokenizer.join(file), dir.join(file)).expect("tokenizer files copy");
    }
    dir.to_owned()
}

/// Writes `n` preference pairs of about 170 prompt and 420 completion tokens (the fixture
/// tokenizer makes about 2.8 tokens of a word)
/// (so `max_length = 512` truncates every sequence to 512) as JSONL, and returns the path.
pub fn long_pairs(path: &Path, n: usize) -> PathBuf {
    const WORDS: [&str; 16] = [
        "the",
        "model",
        "answers",
        "a",
        "question",
        "about",
        "data",
        "and",
        "training",
        "with",
        "preference",
        "pairs",
        "is",
        "better",
        "than",
        "worse",
    ];
    // A small linear congruential generator: the text only needs to vary, not to be random.
    let mut state = 12345u64;
    let mut words = |count: usize| -> String {
        (0..count)
            .map(|_| {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                WORDS[(state >> 33) as usize % WORDS.len()]
            })
            .collect::<Vec<_>>()
            .join(" ")
    };
    let lines: Vec<String> = (0..n)
        .map(|_| serde_json::json!({ "prompt": words(60), "chosen": words(150), "rejected": words(150) }).to_string())
        .collect();
    std::fs::write(path, lines.join("\n") + "\n").expect("the data is written");
    path.to_owned()
}

/// Training throughput measured from `metrics.csv`, from the end of step 1 (which pays for
/// warm-up) to the end of the last step.
#[derive(Debug, Clone, Copy)]
pub struct TrainRate {
    pub pairs_per_second: f64,
    pub tokens_per_second: f64,
}

/// Runs `dpo-train train` for `steps` DPO steps of `batch` pairs (TRL's defaults otherwise: the
/// sigmoid loss, AdamW; no warm-up stage, evaluation, samples or intermediate checkpoints;
/// constant learning rate; f32 without activation checkpointing unless `extra` says otherwise)
/// with `extra` flags, and times it.
pub fn dpo_train_rate(model: &Path, data: &Path, out: &Path, batch: usize, steps: usize, extra: &[&str]) -> TrainRate {
    let run = format!("run{}", extra.join("").replace('-', "_"));
    let _ = std::fs::remove_dir_all(out.join(&run));
    let config = out.join(format!("{run}.toml"));
    let text = format!(
        "model_name_or_path = \"{}\"\ntrain_file = \"{}\"\noutput_dir = \"{}\"\nrun_name = \"{run}\"\n\
         max_length = 512\nper_device_train_batch_size = {batch}\nmax_steps = {steps}\nlogging_steps = 1\n\
         save_steps = 0\nnum_samples = 0\nlr_scheduler_type = \"constant\"\nlearning_rate = 1e-6\n\
         bf16 = false\ngradient_checkpointing = false\n",
        model.display(),
        data.display(),
        out.display()
    );
    std::fs::write(&config, text).expect("the config is written");
    let mut args = vec!["train", "--config", config.to_str().unwrap_or_default()];
    args.extend(extra);
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_dpo-train"))
        .args(&args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .expect("dpo-train runs");
    assert!(status.success(), "dpo-train {} failed", args.join(" "));
    let rows = dpo_train::train::log::read_metrics(&out.join(&run).join("metrics.csv")).expect("metrics.csv");
    let train: Vec<_> = rows.iter().filter(|r| r.split == dpo_train::train::log::Split::Train).collect();
    let (first, last) = (train[0], train[train.len() - 1]);
    let seconds = last.elapsed_seconds - first.elapsed_seconds;
    let tokens = last.metric("num_tokens").unwrap_or(0.0) - first.metric("num_tokens").unwrap_or(0.0);
    TrainRate { pairs_per_second: ((train.len() - 1) * batch) as f64 / seconds, tokens_per_second: tokens / seconds }
}

/// Model FLOPs of one token's forward pass, counted as in the PaLM paper (Chowdhery et al. 2022,
/// appendix B): `2·N` for the `N` matrix-multiply parameters (the LM head included, embedding
/// lookups excluded) plus `4·L·h·S` for attention scores and values over `S` positions.
pub fn forward_flops_per_token(shape: &Shape, seq_len: usize) -> f64 {
    let (h, l, i, v) = (shape.hidden as f64, shape.layers as f64, shape.intermediate as f64, shape.vocab as f64);
    let n = l * (4.0 * h * h + 3.0 * h * i) + v * h;
    2.0 * n + 4.0 * l * h * seq_len as f64
}

/// A DPO step per token: the policy's forward and backward (a backward costs two forwards) and,
/// when it is computed every step, the reference's forward.
pub fn dpo_flops_per_token(shape: &Shape, seq_len: usize, reference: bool) -> f64 {
    forward_flops_per_token(shape, seq_len) * if reference { 4.0 } else { 3.0 }
}

/// The best of a few large square matrix products on the libtorch CPU backend in `dtype`,
/// FLOP/s: the peak the utilisation is measured against.
#[allow(deprecated)] // burn's libtorch device is deprecated upstream; it is this project's backend.
pub fn matmul_peak(dtype: burn::tensor::FloatDType) -> f64 {
    use burn::tensor::{Distribution, Tensor};
    let device = Device::libtorch();
    let mut best: f64 = 0.0;
    for n in [1024usize, 2048, 3072] {
        let a = Tensor::<2>::random([n, n], Distribution::Default, &device).cast(dtype);
        let b = Tensor::<2>::random([n, n], Distribution::Default, &device).cast(dtype);
        for _ in 0..3 {
            let started = std::time::Instant::now();
            let c = a.clone().matmul(b.clone());
            let _ = c.slice([0..1, 0..1]).into_data();
            best = best.max(2.0 * (n * n * n) as f64 / started.elapsed().as_secs_f64());
        }
    }
    best
}

/// Threads libtorch uses for one operation (the TRL side is given the same).
pub fn torch_threads() -> i32 {
    tch::get_num_threads()
}
