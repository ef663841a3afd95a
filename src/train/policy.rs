//! The models of a stage: what trains (every weight, or LoRA adapters on a frozen base), in
//! which precision, and the frozen reference.
//!
//! With LoRA the reference is the policy's own base with the adapters as the stage started (none
//! for a fresh adapter, the loaded one when continuing a saved adapter): the same tensors, so
//! the base is in memory once, as TRL and torchtune do it. A frozen base in mixed precision is
//! stored in half precision; trained weights keep f32 masters.

use std::path::{Path, PathBuf};

use anyhow::Context;
use burn::module::Module;
use burn::tensor::{Device, FloatDType};

use super::checkpoint::ModelFiles;
use crate::config::LoraSettings;
use crate::config::{RunPlan, TrainConfig};
use crate::model::{self, AdapterInit, Llama, lora};

/// What trains in a stage.
#[derive(Debug, Clone)]
pub struct PolicySpec {
    /// `None`: full fine-tuning.
    pub lora: Option<LoraSettings>,
    /// The stage starts from a saved adapter (then it is also the reference's).
    pub start_adapter: Option<PathBuf>,
    /// The full model under the policy (`model_dir` itself, or its adapter's base).
    pub base_dir: PathBuf,
    pub compute_dtype: FloatDType,
}

impl PolicySpec {
    /// Reads the stage's starting point: a saved adapter brings its own settings (the config's
    /// LoRA keys then only apply when starting from a full model).
    pub fn new(cfg: &TrainConfig, plan: &RunPlan, model_dir: &Path) -> anyhow::Result<Self> {
        let start = model::adapter_settings(model_dir)?;
        let lora = match start {
            Some(mut saved) => {
                saved.set_dropout(cfg.lora_dropout, cfg.disable_dropout);
                Some(saved)
            }
            None => plan.lora.clone(),
        };
        let base_dir = model::base_dir(model_dir)?;
        let base_dir = std::fs::canonicalize(&base_dir).unwrap_or(base_dir);
        Ok(Self {
            lora,
            start_adapter: model::lora::is_adapter_dir(model_dir).then(|| model_dir.to_owned()),
            base_dir,
            compute_dtype: crate::model::compute_dtype(plan.precision),
        })
    }

    /// The trainable policy on the autodiff `device`: from `checkpoint` when resuming, else from
    /// the stage's starting point.
    pub fn load_policy(&self, checkpoint: Option<&Path>, seed: u64, device: &Device) -> anyhow::Result<Llama> {
        let Some(settings) = &self.lora else {
            let dir = checkpoint.unwrap_or(&self.base_dir);
            let (_, policy) =
                model::load(dir, device).with_context(|| format!("cannot load the model in `{}`", dir.display()))?;
            return Ok(policy.with_compute_dtype(self.compute_dtype));
        };
        let (_, base) = model::load(&self.base_dir, device)
            .with_context(|| format!("cannot load the model in `{}`", self.base_dir.display()))?;
        let mut policy = self.frozen(base.no_grad());
        let adapter_dir = checkpoint.or(self.start_adapter.as_deref());
        match adapter_dir {
            Some(dir) => {
                let weights = lora::open_adapter_weights(dir)?;
                policy.add_lora(settings, &AdapterInit::Saved(&weights), device)?;
            }
            None => policy.add_lora(settings, &AdapterInit::Fresh { seed }, device)?,
        }
        Ok(policy)
    }

    /// The frozen reference on the plain `device`. With LoRA and no separate reference model it
    /// shares the policy's base tensors.
    pub fn reference(&self, policy: &Llama, ref_dir: Option<&Path>, device: &Device) -> anyhow::Result<Llama> {
        if let (Some(settings), None) = (&self.lora, ref_dir) {
            let mut reference = policy.valid().without_lora();
            if let Some(dir) = &self.start_adapter {
                reference.add_lora(settings, &AdapterInit::Saved(&lora::open_adapter_weights(dir)?), device)?;
                reference.set_lora_dropout(0.0);
            }
            return Ok(reference);
        }
        let dir = ref_dir.unwrap_or(&self.base_dir);
        let (_, reference) = model::load(dir, device)
            .with_context(|| format!("cannot load the reference model in `{}`", dir.display()))?;
        Ok(self.frozen(reference))
    }

    /// A frozen model in the compute precision (stored in it too: nothing updates it), each
    /// layer's projections of one input side by side in one buffer.
    fn frozen(&self, model: Llama) -> Llama {
        let model = if self.compute_dtype == FloatDType::F32 { model } else { model.cast_params(self.compute_dtype) };
        model.share_frozen_storage().with_compute_dtype(self.compute_dtype)
    }

    /// What checkpoints and `final/` hold: every weight with `config.json`, or the adapter.
    pub fn files<'a>(&'a self, model_config_json: &'a str) -> ModelFiles<'a> {
        match &self.lora {
            None => ModelFiles::Full { config_json: model_config_json, base: Some(&self.base_dir) },
            Some(settings) => ModelFiles::Adapter { settings, base: &self.base_dir },
        }
    }
}

/// A copy of the trained policy for evaluation and sampling: no graph, no dropout.
pub fn inference_copy(policy: &Llama) -> Llama {
    let mut copy = policy.valid();
    copy.set_lora_dropout(0.0);
    copy
}
