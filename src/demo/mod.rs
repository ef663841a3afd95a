//! The embedded demo: a synthetic preference task with a known ground truth (arithmetic answers
//! right or off by a few, polite or rude replies), a byte-level BPE tokenizer trained on it, and a
//! small randomly initialised Llama, all built locally so the demo needs no download.

use std::path::{Path, PathBuf};

use burn::tensor::Device;

pub mod bpe;
pub mod synth;

use bpe::train_tokenizer;
use synth::{SynthConfig, arithmetic_kind, is_correct_answer};

use crate::data::tokenizer::Tokenizer;
use crate::data::{self, LoadOptions, Text};
use crate::model::generate::{SamplingConfig, generate, rng};
use crate::model::{self, Llama, RandomInit};
use crate::train::checkpoint::{ModelFiles, write_model_dir};

/// The demo's configuration, embedded in the binary (also shipped as `configs/demo.toml`).
pub const DEMO_CONFIG: &str = include_str!("../../configs/demo.toml");

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

/// The tiny model: 4 layers of width 128 with grouped-query attention, about 0.84M parameters (tied embeddings).
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
        let texts: Vec<String> = plain_rows(&train)?
            .into_iter()
            .flat_map(|(prompt, chosen, rejected)| [format!("{prompt}{chosen}"), format!("{prompt}{rejected}")])
            .collect();
        train_tokenizer(texts.iter().map(String::as_str), bpe::DEFAULT_VOCAB_SIZE, &model_dir)?;
        let tokenizer = Tokenizer::from_dir(&model_dir)?;
        // Round the embedding up to a multiple of 64, as model vocabularies usually are.
        let config = model_config(tokenizer.vocab_size().div_ceil(64) * 64);
        let config_json = serde_json::to_string_pretty(&config)?;
        let resolved = model::LlamaConfig::parse(&config_json, &model_dir.join("config.json"))?;
        let init = RandomInit { seed, std: 0.02 };
        let model = Llama::load(&init, &resolved, device)?;
        write_model_dir(&model_dir, &model, ModelFiles::Full { config_json: &config_json, base: None })?;
    }
    Ok(DemoAssets { model_dir, train, val, test })
}

/// Greedy arithmetic on the demo's test split before DPO (the model in `before`) and after it
/// (`after`): each (correct, asked).
pub fn before_and_after(
    before: &Path,
    after: &Path,
    tokenizer: &Tokenizer,
    assets: &DemoAssets,
    device: &Device,
) -> anyhow::Result<((usize, usize), (usize, usize))> {
    let score = |dir: &Path| -> anyhow::Result<(usize, usize)> {
        let (_, model) = model::load(dir, device)?;
        arithmetic_accuracy(&model, tokenizer, &assets.test, device)
    };
    Ok((score(before)?, score(after)?))
}

/// Greedy answers to the arithmetic prompts of a demo split: (correct, asked).
pub fn arithmetic_accuracy(
    model: &Llama,
    tokenizer: &Tokenizer,
    split: &Path,
    device: &Device,
) -> anyhow::Result<(usize, usize)> {
    let sampling = SamplingConfig::greedy(6);
    let mut sampler = rng(0);
    let mut correct = 0;
    let mut asked = 0;
    // The problem is read back from the prompt (`Q: What is 9 + 0?`).
    for (prompt, _, _) in plain_rows(split)? {
        let Some(kind) = arithmetic_kind(&prompt) else { continue };
        let ids = tokenizer.encode(&prompt)?;
        let ids = generate(model, &ids, 1, tokenizer.eos_id(), &sampling, &mut sampler, device);
        let text = tokenizer.decode(&ids[0], true)?;
        asked += 1;
        correct += usize::from(is_correct_answer(&kind, &text));
    }
    Ok((correct, asked))
}

/// The (prompt, chosen, rejected) texts of a demo split, read by the data pipeline's reader.
fn plain_rows(path: &Path) -> anyhow::Result<Vec<(String, String, String)>> {
    let loaded = data::load_preferences(path, &LoadOptions::default())?;
    Ok(loaded
        .rows
        .into_iter()
        .filter_map(|row| match (row.prompt, row.chosen, row.rejected) {
            (Text::Plain(p), Text::Plain(c), Text::Plain(r)) => Some((p, c, r)),
            _ => None,
        })
        .collect())
}
