//! Hugging Face causal language models: `config.json` + safetensors → a burn module.

pub mod llama;
pub mod rope;
pub mod weights;

use std::path::Path;

use burn::tensor::Device;

pub use llama::{HfConfig, Llama, LlamaConfig, ModelError};
pub use weights::Weights;

/// Loads the model in `dir` onto `device`, weights as f32.
pub fn load(dir: &Path, device: &Device) -> Result<(LlamaConfig, Llama), ModelError> {
    let cfg = HfConfig::from_dir(dir)?.resolve(&dir.join("config.json"))?;
    let weights = Weights::open(dir)?;
    let model = Llama::load(&weights, &cfg, device)?;
    Ok((cfg, model))
}
