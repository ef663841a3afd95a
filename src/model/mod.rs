//! Hugging Face causal language models: `config.json` + safetensors → a burn module.

pub mod llama;
pub mod rope;
pub mod weights;

use std::path::Path;

use burn::tensor::Device;

pub use llama::{HfConfig, Llama, LlamaConfig, ModelError};
pub use weights::{RandomInit, TensorSource, Weights};

/// Reads and resolves `dir/config.json`.
pub fn load_config(dir: &Path) -> Result<LlamaConfig, ModelError> {
    HfConfig::from_dir(dir)?.resolve(&dir.join("config.json"))
}

/// Builds the model described by `cfg` from the safetensors in `dir`, weights as f32.
pub fn load_weights(dir: &Path, cfg: &LlamaConfig, device: &Device) -> Result<Llama, ModelError> {
    Llama::load(&Weights::open(dir)?, cfg, device)
}

/// Loads the model in `dir` onto `device`.
pub fn load(dir: &Path, device: &Device) -> Result<(LlamaConfig, Llama), ModelError> {
    let cfg = load_config(dir)?;
    let model = load_weights(dir, &cfg, device)?;
    Ok((cfg, model))
}
