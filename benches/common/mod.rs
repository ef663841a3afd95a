//! What the benchmarks share: a medium Llama model (hidden 768, 12 layers, 12 heads, 32k
//! vocabulary) saved in Hugging Face format with random weights, and preference pairs long
//! enough to fill 512-token sequences.
#![allow(dead_code)] // each bench binary uses a different subset

use std::path::{Path, PathBuf};

use burn::tensor::Device;
use dpo_train::model::{HfConfig, Llama, RandomInit};
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
    let cfg = HfConfig::from_json(&config, Path::new("config.json")).and_then(|c| c.resolve(Path::new("config.json")));
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
