//! What the benchmarks share: a medium Llama model (hidden 768, 12 layers, 12 heads, 32k
//! vocabulary) saved in Hugging Face format with random weights, and preference pairs long
//! enough to fill 512-token sequences; `runs` times training runs (dpo-train's and TRL's),
//! `precision` the f32 and bf16 trajectories of the drift bench and the GPU check's parity.
#![allow(dead_code)] // each bench binary uses a different subset

pub mod precision;
mod runs;

use std::path::{Path, PathBuf};

use burn::tensor::Device;
use dpo_train::model::weights::NamedTensor;
use dpo_train::model::{Llama, LlamaConfig, RandomInit};
use dpo_train::train::checkpoint::{ModelFiles, write_model_dir};
#[allow(unused_imports)] // each bench binary uses a different subset, as above
pub use runs::{
    TrainRate, TrlRate, dpo_train_rate, dpo_train_rate_at, dpo_train_rate_env, dpo_train_rate_of, drop_weights, python,
    run_name, trl_rate, try_trl_rate,
};

/// The checkout's root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// This CPU's model name, as `/proc/cpuinfo` has it ("AMD EPYC").
pub fn cpu_model() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpu.lines().find_map(|l| l.strip_prefix("model name")).unwrap_or("unknown cpu");
    model.trim_start_matches([' ', '\t', ':']).trim().to_owned()
}

/// A device's name as a results file names it: lower case, `-` for anything not a letter or a
/// digit ("AMD EPYC" -> `amd-epyc`).
pub fn slug(name: &str) -> String {
    name.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' }).collect()
}

/// `results/cpu/<stem>-<this CPU>.json`, the CPU named by [`cpu_model`] (`amd-epyc`); the folder
/// is made if missing.
pub fn cpu_results(stem: &str) -> PathBuf {
    let dir = root().join("results/cpu");
    std::fs::create_dir_all(&dir).expect("results/cpu");
    dir.join(format!("{stem}-{}.json", slug(&cpu_model())))
}

/// A model shape in `config.json` form.
pub struct Shape {
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub intermediate: usize,
    pub vocab: usize,
}

/// The medium model: about 110M parameters (GPT-2 small's trunk, Llama layers).
pub const MEDIUM: Shape = Shape { hidden: 768, layers: 12, heads: 12, kv_heads: 12, intermediate: 2048, vocab: 32000 };
/// The small one: hidden 256, 4 layers.
pub const SMALL: Shape = Shape { hidden: 256, layers: 4, heads: 4, kv_heads: 4, intermediate: 688, vocab: 32000 };
/// The small trunk under Qwen2.5's 151,936-token vocabulary (tied): 44M parameters, most of
/// them the embedding, so the LM head's buffers dominate a step's memory.
pub const WIDE_VOCAB: Shape =
    Shape { hidden: 256, layers: 4, heads: 4, kv_heads: 4, intermediate: 688, vocab: 151_936 };
/// A 32M-parameter chat-sized Llama with grouped-query attention (8 heads, 4 key/value heads):
/// the shape `make bench-trl` compares on.
pub const GQA32M: Shape = Shape { hidden: 512, layers: 8, heads: 8, kv_heads: 4, intermediate: 1408, vocab: 8192 };

/// Qwen2.5-0.5B's shape (24 layers, hidden 896, 14 heads, 2 key/value heads, 151,936 tokens,
/// tied embeddings; q/k/v biases as `qwen2`): 494M parameters, the GPU issue's model.
pub const QWEN05B: Shape =
    Shape { hidden: 896, layers: 24, heads: 14, kv_heads: 2, intermediate: 4864, vocab: 151_936 };

/// TinyLlama-1.1B's trunk (22 layers, hidden 2048, 32 heads, 4 key/value heads) with tied
/// embeddings: 1.03B parameters, the GPU check's model of the size researchers tune.
pub const LLAMA1B: Shape = Shape { hidden: 2048, layers: 22, heads: 32, kv_heads: 4, intermediate: 5632, vocab: 32000 };

/// Llama-3.1-8B's trunk (32 layers, hidden 4096, 32 heads, 8 key/value heads, 128,256 tokens) with
/// tied embeddings: 7.5B parameters, the GPU issue's LoRA model.
pub const LLAMA8B: Shape =
    Shape { hidden: 4096, layers: 32, heads: 32, kv_heads: 8, intermediate: 14336, vocab: 128_256 };

/// Writes a randomly initialised model of `shape` with the fixture tokenizer into `dir`
/// (skipped when already there) and returns `dir`.
pub fn model_dir(dir: &Path, shape: &Shape) -> PathBuf {
    model_dir_of(dir, shape, "llama")
}

/// A model of `shape` in a directory of `work` named by the shape and family, its weights stored
/// in bf16 (transformers' `save_pretrained` of a bf16 model): every section that runs a shape
/// reads one generation of it (the GPU check generated the 0.5B shape twice), and the 8B shape
/// is 15 GB to write and read where f32 made 30.
pub fn generated(work: &Path, shape: &Shape, model_type: &str) -> PathBuf {
    let Shape { hidden, layers, heads, kv_heads, intermediate, vocab } = shape;
    let name = format!("{model_type}-h{hidden}-l{layers}-a{heads}-kv{kv_heads}-i{intermediate}-v{vocab}-bf16");
    write_model(&work.join(name), shape, model_type, true)
}

/// [`model_dir`] of another family of `model_type` (`qwen2`: the q/k/v projections carry biases).
pub fn model_dir_of(dir: &Path, shape: &Shape, model_type: &str) -> PathBuf {
    write_model(dir, shape, model_type, false)
}

/// Writes a randomly initialised model into `dir`, in bf16 or f32 (skipped when already there).
#[allow(deprecated)] // burn's libtorch device is deprecated upstream; it is this project's backend.
fn write_model(dir: &Path, shape: &Shape, model_type: &str, bf16: bool) -> PathBuf {
    if dir.join("model.safetensors").is_file() {
        return dir.to_owned();
    }
    let config = serde_json::json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": model_type,
        "hidden_size": shape.hidden,
        "intermediate_size": shape.intermediate,
        "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "vocab_size": shape.vocab,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": true,
        "hidden_act": "silu",
        "eos_token_id": 2,
        "torch_dtype": if bf16 { "bfloat16" } else { "float32" },
    })
    .to_string();
    let cfg = LlamaConfig::parse(&config, Path::new("config.json"));
    let cfg = cfg.expect("the benchmark's model config is valid");
    let model = Llama::load(&RandomInit { seed: 0, std: 0.02 }, &cfg, &Device::libtorch()).expect("random init");
    // The tokenizer first: the weights, written last and atomically, say the directory is whole.
    std::fs::create_dir_all(dir).expect("the model's directory");
    let tokenizer = root().join("tests/fixtures/models/llama");
    for file in ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"] {
        std::fs::copy(tokenizer.join(file), dir.join(file)).expect("tokenizer files copy");
    }
    match bf16 {
        true => write_bf16(dir, &model, &config),
        false => write_model_dir(dir, &model, ModelFiles::Full { config_json: &config, base: None })
            .expect("the model is written"),
    }
    dir.to_owned()
}

/// `config.json` and `model` as bf16 safetensors (each value rounded to the nearest), the
/// weights written atomically as the project writes every file.
fn write_bf16(dir: &Path, model: &Llama, config_json: &str) {
    std::fs::write(dir.join("config.json"), config_json).expect("config.json is written");
    let tensors = dpo_train::model::hf::export_tensors(model);
    let metadata = std::collections::HashMap::from([("format".to_owned(), "pt".to_owned())]);
    dpo_train::fsutil::write_atomic_with(&dir.join("model.safetensors"), |tmp| {
        let views = tensors.iter().map(|t| (t.name.clone(), Bf16(t)));
        safetensors::serialize_to_file(views, Some(metadata), tmp).map_err(std::io::Error::other)
    })
    .expect("the model is written");
}

/// A tensor's values as bf16 on their way to a file.
struct Bf16<'a>(&'a NamedTensor);

impl safetensors::View for Bf16<'_> {
    fn dtype(&self) -> safetensors::Dtype {
        safetensors::Dtype::BF16
    }

    fn shape(&self) -> &[usize] {
        &self.0.shape
    }

    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        let values = self.0.values.to_vec();
        let mut bytes = Vec::with_capacity(2 * values.len());
        values.iter().for_each(|&x| bytes.extend_from_slice(&half::bf16::from_f32(x).to_le_bytes()));
        std::borrow::Cow::Owned(bytes)
    }

    fn data_len(&self) -> usize {
        2 * self.0.shape.iter().product::<usize>()
    }
}

/// The vocabulary of the generated pairs.
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

/// Writes `n` preference pairs of about 170 prompt and 420 completion tokens (the fixture
/// tokenizer makes about 2.8 tokens of a word)
/// (so `max_length = 512` truncates every sequence to 512) as JSONL, and returns the path.
pub fn long_pairs(path: &Path, n: usize) -> PathBuf {
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

/// Writes `n` preference pairs as JSONL whose sequences (prompt + completion + the eos TRL
/// appends) run `total` tokens under the tokenizer in `tokenizer_dir`, each drawn uniformly, with
/// prompts of `prompt` tokens (drawn likewise, the same for both completions), and returns the
/// path. Token counts are exact: the byte-level tokenizer encodes each word with its leading
/// space on its own, so a text's count is the sum of its words'.
pub fn sized_pairs(
    path: &Path,
    tokenizer_dir: &Path,
    n: usize,
    prompt: std::ops::RangeInclusive<usize>,
    total: std::ops::RangeInclusive<usize>,
    seed: u64,
) -> PathBuf {
    let tokenizer = dpo_train::data::tokenizer::Tokenizer::from_dir(tokenizer_dir).expect("the tokenizer loads");
    let tokens = |text: &str| tokenizer.encode(text).expect("encodes").len();
    // Each word with its leading space and its token count; a one-token word fills any remainder.
    let words: Vec<(String, usize)> = WORDS.iter().map(|w| (format!(" {w}"), tokens(&format!(" {w}")))).collect();
    assert!(words.iter().any(|w| w.1 == 1) && tokens("a") == 1, "the fixture tokenizer has one-token words");
    let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
    let mut next = move |bound: usize| -> usize {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (state >> 33) as usize % bound
    };
    let draw = |range: &std::ops::RangeInclusive<usize>, next: &mut dyn FnMut(usize) -> usize| {
        range.start() + next(range.end() - range.start() + 1)
    };
    // Words of exactly `count` tokens, each with its leading space.
    let text = |mut count: usize, next: &mut dyn FnMut(usize) -> usize| -> String {
        let mut out = String::new();
        while count > 0 {
            let (word, n) = &words[next(words.len())];
            if *n <= count {
                out.push_str(word);
                count -= n;
            }
        }
        out
    };
    let lines: Vec<String> = (0..n)
        .map(|_| {
            let p = draw(&prompt, &mut next);
            let (c, r) = (draw(&total, &mut next), draw(&total, &mut next));
            // The prompt starts with the one-token "a"; each completion ends with the eos TRL appends.
            let prompt_text = format!("a{}", text(p - 1, &mut next));
            let (chosen, rejected) = (text(c - p - 1, &mut next), text(r - p - 1, &mut next));
            serde_json::json!({ "prompt": prompt_text, "chosen": chosen, "rejected": rejected }).to_string()
        })
        .collect();
    std::fs::write(path, lines.join("\n") + "\n").expect("the data is written");
    path.to_owned()
}

/// What a bench's child process printed; its stderr and exit 1 when it failed (`what` names
/// the child when it cannot start at all).
pub fn stdout_of(command: &mut std::process::Command, what: &str) -> String {
    let out = command.output().expect(what);
    if !out.status.success() {
        eprintln!("{}", String::from_utf8_lossy(&out.stderr));
        std::process::exit(1);
    }
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Model FLOPs of one token's forward pass, counted as in the PaLM paper (Chowdhery et al. 2022,
/// appendix B): `2·N` for the `N` matrix-multiply parameters (the LM head included, embedding
/// lookups excluded; key and value projections `h × kv·d` under grouped-query attention) plus
/// `4·L·h·S` for attention scores and values over `S` positions.
pub fn forward_flops_per_token(shape: &Shape, seq_len: usize) -> f64 {
    let (h, l, i, v) = (shape.hidden as f64, shape.layers as f64, shape.intermediate as f64, shape.vocab as f64);
    let kv = h * shape.kv_heads as f64 / shape.heads as f64;
    let n = l * (2.0 * h * h + 2.0 * h * kv + 3.0 * h * i) + v * h;
    2.0 * n + 4.0 * l * h * seq_len as f64
}

/// Useful model FLOPs of one forward pass over a pair, on average over `data` (JSON Lines of
/// prompt, chosen and rejected, tokenised by the tokenizer in `model`, each sequence with its eos
/// and cut at `max_length`): the decoder over the prompt once and both completions (each token at
/// its own sequence's length `S` in the attention term), and the LM head (`2·V·h`) only where a
/// completion token is predicted, since nothing else reaches the loss; PaLM's count otherwise
/// ([`forward_flops_per_token`]). Padding, a prompt's second copy and the head at prompt positions
/// are work a trainer may do, never useful work, so no MFU exceeds 100%. A DPO step is
/// [`passes`] forwards.
pub fn pair_forward_flops(data: &Path, model: &Path, shape: &Shape, max_length: usize) -> f64 {
    let tokenizer = dpo_train::data::tokenizer::Tokenizer::from_dir(model).expect("the tokenizer loads");
    let count = |text: &str| tokenizer.encode(text).expect("encodes").len();
    let head = 2.0 * shape.vocab as f64 * shape.hidden as f64;
    // The decoder's share of a token at sequence length `s`: PaLM's count less the head.
    let decoder = |s: usize| forward_flops_per_token(shape, s) - head;
    let text = std::fs::read_to_string(data).expect("the data is read");
    let (mut total, mut pairs) = (0.0, 0usize);
    for line in text.lines().filter(|l| !l.is_empty()) {
        let row: serde_json::Value = serde_json::from_str(line).expect("JSON lines");
        let field = |k: &str| row[k].as_str().unwrap_or_default().to_owned();
        let prompt = field("prompt");
        let p = count(&prompt);
        let mut forward = 0.0;
        for (i, completion) in [field("chosen"), field("rejected")].iter().enumerate() {
            let s = (count(&(prompt.clone() + completion)) + 1).min(max_length);
            let (prompt_here, completion_here) = (p.min(s), s - p.min(s));
            // The prompt's positions are computed once, with the chosen sequence.
            let positions = completion_here + if i == 0 { prompt_here } else { 0 };
            forward += positions as f64 * decoder(s) + completion_here as f64 * head;
        }
        total += forward;
        pairs += 1;
    }
    total / pairs.max(1) as f64
}

/// Forward passes' worth of a DPO step: the policy's forward and backward (a backward costs two
/// forwards) and, when it is computed every step, the reference's forward.
pub fn passes(reference: bool) -> f64 {
    if reference { 4.0 } else { 3.0 }
}

/// The best of a few large square matrix products on the libtorch CPU backend in `dtype`,
/// FLOP/s: the peak the utilisation is measured against. A CPU without half-precision matrix
/// units runs bf16 on torch's reference loop (a 3072-cube product takes minutes there), so the
/// sizes stop growing once one product takes more than a second.
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
        if 2.0 * (n * n * n) as f64 / best > 1.0 {
            break;
        }
    }
    best
}

/// Threads libtorch uses for one operation (the TRL side is given the same).
pub fn torch_threads() -> i32 {
    tch::get_num_threads()
}

/// Puts `row` into the table of measured memory at `json` (`results/{gpu,cpu}/memory-*.json`,
/// what check-gpu's `tests/measured.rs` reads) in place of the row of the same setting (any
/// earlier run's, whatever layers it ran), else at the end, and rewrites the file atomically. The
/// row records the layers' activation layout it was measured with (`packed::LAYOUT`).
pub fn record(json: &Path, mut row: serde_json::Value) -> Result<(), String> {
    const MEASURED: [&str; 7] = [
        "steps",
        "cuda_allocated_bytes",
        "cuda_reserved_bytes",
        "host_resident_bytes",
        "resident_bytes",
        "source",
        "layout",
    ];
    if let Some(o) = row.as_object_mut() {
        o.insert("layout".into(), check_gpu::memory::packed::LAYOUT.into());
    }
    let setting = |r: &serde_json::Value| {
        let mut r = r.clone();
        if let Some(o) = r.as_object_mut() {
            o.retain(|k, _| !MEASURED.contains(&k.as_str()));
        }
        r
    };
    let text = std::fs::read_to_string(json).unwrap_or_else(|_| "[]".to_owned());
    let mut rows: Vec<serde_json::Value> = serde_json::from_str(&text).unwrap_or_default();
    match rows.iter_mut().find(|r| setting(r) == setting(&row)) {
        Some(old) => *old = row,
        None => rows.push(row),
    }
    let tmp = json.with_extension("json.tmp");
    let written =
        serde_json::to_string_pretty(&rows).map_err(std::io::Error::other).and_then(|t| std::fs::write(&tmp, t + "\n"));
    written.and_then(|()| std::fs::rename(&tmp, json)).map_err(|e| format!("{} not written: {e}", json.display()))
}
