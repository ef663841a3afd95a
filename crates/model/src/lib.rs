//! Hugging Face causal language models: `config.json` + safetensors → a burn module, and PEFT
//! LoRA adapter directories on top of one.

pub mod compat;
pub mod fused;
pub mod generate;
pub mod head;
pub mod hf;
pub mod kv_cache;
pub mod linear;
pub mod llama;
pub mod lora;
pub mod norm;
pub mod params;
pub mod rope;
pub mod rope_scaling;
pub mod swiglu;
pub mod weights;

use std::path::{Path, PathBuf};

use burn::tensor::{Device, FloatDType, Tensor};

use dpo_config::{LoraSettings, Precision};
use weights::WeightsError;

pub use compat::CompatError;
pub use head::LmHead;
pub use kv_cache::KvCache;
pub use llama::{Llama, LlamaConfig, Placement};
pub use lora::{AdapterConfig, AdapterError, AdapterInit};
pub use weights::{RandomInit, TensorSource, Weights};

#[cfg(test)]
mod testing;

/// Errors raised while reading `config.json` or building the model from its weights.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("`{path}` not found: a model directory needs `config.json` and safetensors weights{hint}")]
    NoConfig { path: std::path::PathBuf, hint: String },
    #[error("cannot read `{path}`")]
    Io {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("`{path}`: {message}")]
    BadConfig { path: std::path::PathBuf, message: String },
    #[error("`{path}`: unsupported `model_type` `{found}`; supported: {}", llama::SUPPORTED_MODEL_TYPES.join(", "))]
    UnsupportedModelType { path: std::path::PathBuf, found: String },
    #[error("`{path}`: unsupported `{key}` = {found}; supported: {supported}")]
    Unsupported { path: std::path::PathBuf, key: &'static str, found: String, supported: &'static str },
    #[error(transparent)]
    Weights(#[from] WeightsError),
    #[error(transparent)]
    Adapter(#[from] lora::AdapterError),
}

/// The dtype weights and activations compute in under `precision` (master weights stay f32).
pub fn compute_dtype(precision: Precision) -> FloatDType {
    match precision {
        Precision::Bf16 => FloatDType::BF16,
        Precision::Fp16 => FloatDType::F16,
        Precision::Fp32 => FloatDType::F32,
    }
}

/// Reads and resolves `dir/config.json` (an adapter directory's base's).
pub fn load_config(dir: &Path) -> Result<LlamaConfig, ModelError> {
    LlamaConfig::read(&base_dir(dir)?)
}

/// Builds the model described by `cfg` from the safetensors in `dir`, weights as f32.
pub fn load_weights(dir: &Path, cfg: &LlamaConfig, device: &Device) -> Result<Llama, ModelError> {
    Llama::load(&Weights::open(dir)?, cfg, device)
}

/// Loads the model in `dir` onto `device`; an adapter directory loads its base with the adapter
/// attached (its parameters require gradients on an autodiff device, nothing else changes).
pub fn load(dir: &Path, device: &Device) -> Result<(LlamaConfig, Llama), ModelError> {
    let base = base_dir(dir)?;
    let cfg = load_config(&base)?;
    let mut model = load_weights(&base, &cfg, device)?;
    if let Some(settings) = adapter_settings(dir)? {
        let weights = lora::open_adapter_weights(dir)?;
        model.add_lora(&settings, &AdapterInit::Saved(&weights), device)?;
        model.set_lora_dropout(0.0);
    }
    Ok((cfg, model))
}

/// Maps the safetensors files of `dir` (and of its adapter's base) and reads their headers,
/// nothing more: a missing, truncated or corrupt file is refused before a run does any work.
pub fn check_weights(dir: &Path) -> Result<(), ModelError> {
    Weights::open(&base_dir(dir)?)?;
    if lora::is_adapter_dir(dir) {
        lora::open_adapter_weights(dir)?;
    }
    Ok(())
}

/// The adapter of an adapter directory; `None` for a full model.
pub fn adapter_settings(dir: &Path) -> Result<Option<LoraSettings>, ModelError> {
    if !lora::is_adapter_dir(dir) {
        return Ok(None);
    }
    Ok(Some(AdapterConfig::read(dir)?.1))
}

/// The directory whose tokenizer goes with the model in `dir`: `dir` itself, or for an adapter
/// saved without tokenizer files, its base's.
pub fn tokenizer_dir(dir: &Path) -> Result<PathBuf, ModelError> {
    if dir.join("tokenizer.json").is_file() { Ok(dir.to_owned()) } else { base_dir(dir) }
}

/// Where the full model lives: `dir` itself, or an adapter directory's `base_model_name_or_path`
/// (as written; a relative path is tried from the working directory, then from `dir`; a Hub name
/// in the local hub cache).
pub fn base_dir(dir: &Path) -> Result<PathBuf, ModelError> {
    if !lora::is_adapter_dir(dir) {
        return Ok(dir.to_owned());
    }
    let (cfg, _) = AdapterConfig::read(dir)?;
    let path = dir.join("adapter_config.json");
    let Some(base) = cfg.base_model_name_or_path.filter(|b| !b.is_empty()) else {
        return Err(ModelError::BadConfig {
            path,
            message: "`base_model_name_or_path` is missing: the adapter does not say which model it adapts".to_owned(),
        });
    };
    let local = [PathBuf::from(&base), dir.join(&base)].into_iter().find(|p| p.join("config.json").is_file());
    if let Some(found) = local {
        return Ok(found);
    }
    // An adapter from the Hub names its base by its Hub name: the hub cache may hold it.
    let bad = |message| ModelError::BadConfig { path: path.clone(), message };
    match dpo_base::hub::locate(&base, dpo_base::hub::Kind::Model) {
        Ok(Some(cached)) if cached.join("config.json").is_file() => Ok(cached),
        Err(e) => Err(bad(format!("`base_model_name_or_path`: {e}"))),
        _ => Err(bad(format!(
            "`base_model_name_or_path` = `{base}` is not a local model directory (it needs `config.json`)"
        ))),
    }
}

/// A copy of `t` in page-locked host memory (the libtorch CPU device): copies between it and a GPU
/// go by DMA without a staging buffer. An error where libtorch cannot pin (no accelerator, or
/// the CUDA runtime refuses the allocation); callers pin only for a GPU run.
pub fn pinned_copy<const D: usize>(t: Tensor<D>) -> Result<Tensor<D>, dpo_torch::TorchError> {
    let (tensor, origin) =
        dpo_torch::bridge::to_tch(t).map_err(|reason| dpo_torch::TorchError::NotLibTorch { index: 0, reason })?;
    let host = dpo_torch::kernels::pinned_copy(&tensor)?;
    Ok(dpo_torch::bridge::from_tch(host, origin))
}

/// A tensor's values on the host, as f32, in row-major order. On a GPU the read waits for every
/// kernel queued before it; it is counted ([`dpo_torch::transfers`]).
pub fn host<const D: usize>(t: &Tensor<D>) -> Vec<f32> {
    dpo_torch::transfers::count_read();
    // `iter` converts each element from whatever dtype the tensor holds.
    t.to_data().iter::<f32>().collect()
}
