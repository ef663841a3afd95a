//! The embedded demo: a synthetic preference task with a known ground truth (arithmetic answers
//! right or off by a few, polite or rude replies), a byte-level BPE tokenizer trained on it, and a
//! small randomly initialised Llama, all built locally so the demo needs no download.

use std::path::{Path, PathBuf};

use burn::tensor::Device;

use crate::data::bpe::{self, train_tokenizer};
use crate::data::synth::{self, SynthConfig, TaskKind, is_correct_answer};
use crate::data::tokenizer::Tokenizer;
use crate::model::generate::{SamplingConfig, generate, rng};
use crate::model::{self, Llama, RandomInit};
use crate::train::checkpoint::{ModelFiles, write_model_dir};

/// The demo's configuration, embedded in the binary (also shipped as `configs/demo.toml`).
pub const DEMO_CONFIG: &str = include_str!("../configs/demo.toml");

/// The marker that selects the demo's model or data in a config.
pub const DEMO: &str = "demo";

/// The generated inputs of a demo run.
#[derive(Debug, Clone)]
pub struct DemoAssets {
    /// The random model, with the tokenizer files beside it.
    pub model_dir: PathBuf,
    pub train: PathBuf,
    pub val: PathBuf,
    pub test: PathBuf,
}

/// The tiny model: 4 layers of width 128 with grouped-query attention, about 0.9M parameters.
fn model_config(vocab_size: usize) -> serde_json::Value {
    serde_json::json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab_size,
        "hidden_size": 128,
        "intermediate_size": 384,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "max_position_embeddings": 128,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": true,
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "bos_token_id": null,
        "eos_token_id": 0,
        "pad_token_id": 1,
        "dtype": "float32"
    })
}

/// Writes (or reuses, when present) the demo's data, tokenizer and random model under `dir`.
pub fn prepare(dir: &Path, seed: u64, device: &Device) -> anyhow::Result<DemoAssets> {
    let data_dir = dir.join("data");
    let model_dir = dir.join("base-model");
    let [train, val, test] = ["train", "val", "test"].map(|split| data_dir.join(format!("{split}.jsonl")));
    if ![&train, &val, &test].iter().all(|p| p.is_file()) {
        let data = synth::generate(&SynthConfig { seed, ..SynthConfig::default() });
        synth::write_splits(&data_dir, &data)?;
    }
    if !model_dir.join("model.safetensors").is_file() {
        let pairs = synth::read_jsonl(&train)?;
        let texts =
            pairs.iter().flat_map(|p| [format!("{}{}", p.prompt, p.chosen), format!("{}{}", p.prompt, p.rejected)]);
        let texts: Vec<String> = texts.collect();
        train_tokenizer(texts.iter().map(String::as_str), bpe::DEFAULT_VOCAB_SIZE, &model_dir)?;
        let tokenizer = Tokenizer::from_dir(&model_dir)?;
        // Round the embedding up to a multiple of 64, as model vocabularies usually are.
        let config = model_config(tokenizer.vocab_size().div_ceil(64) * 64);
        let config_json = serde_json::to_string_pretty(&config)?;
        let resolved = model::LlamaConfig::parse(&config_json, &model_dir.join("config.json"))?;
        let init = RandomInit { seed, std: 0.02 };
        let model = Llama::load(&init, &resolved, device)?;
        write_model_dir(&model_dir, &model, ModelFiles::Full { config_json: &config_json })?;
    }
    Ok(DemoAssets { model_dir, train, val, test })
}

/// Greedy answers to the arithmetic prompts of a demo split: (correct, asked).
pub fn arithmetic_accuracy(
    model: &Llama,
    tokenizer: &Tokenizer,
    split: &Path,
    device: &Device,
) -> anyhow::Result<(usize, usize)> {
    let pairs = synth::read_jsonl(split)?;
    let sampling = SamplingConfig::greedy(6);
    let mut sampler = rng(0);
    let mut correct = 0;
    let mut asked = 0;
    for pair in pairs.iter().filter(|p| matches!(p.kind, TaskKind::Arithmetic { .. })) {
        let prompt = tokenizer.encode(&pair.prompt)?;
        let ids = generate(model, &prompt, 1, tokenizer.eos_id(), &sampling, &mut sampler, device);
        let text = tokenizer.decode(&ids[0], true)?;
        asked += 1;
        correct += usize::from(is_correct_answer(&pair.kind, &text));
    }
    Ok((correct, asked))
}
