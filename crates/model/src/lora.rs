//! LoRA adapters on a Llama-family model, read and written in PEFT's format so that
//! `peft.PeftModel.from_pretrained(base, dir)` loads what we train and we continue what PEFT saved:
//!
//! - `adapter_config.json`: `peft_type = "LORA"`, `r`, `lora_alpha`, `lora_dropout`,
//!   `target_modules`, `base_model_name_or_path`, ...
//! - `adapter_model.safetensors`: `base_model.model.{module}.lora_A.weight` `[r, in]` and
//!   `lora_B.weight` `[out, r]` for every adapted module (e.g. `model.layers.0.self_attn.q_proj`),
//!   and with `use_dora` its `lora_magnitude_vector` `[out]`.
//!
//! Initialisation follows PEFT's default: `A` Kaiming-uniform (bound `1/√in`), `B` zero, DoRA's
//! magnitude the base weight's column norms.

use std::path::{Path, PathBuf};

use burn::module::Param;
use burn::tensor::{Device, Tensor, TensorData};
use serde::{Deserialize, Serialize};

use super::linear::{Lora, column_norms};
use super::llama::Llama;
use super::weights::{NamedTensor, Values, Weights, WeightsError, save_safetensors, seeded_rng};
use dpo_config::LoraSettings;

const CONFIG_FILE: &str = "adapter_config.json";
const WEIGHTS_FILE: &str = "adapter_model.safetensors";
/// PEFT's prefix of every adapter tensor name.
const PEFT_PREFIX: &str = "base_model.model.";

/// Errors reading or writing an adapter, naming the file and field.
#[derive(Debug, thiserror::Error)]
pub enum AdapterError {
    #[error("cannot read `{path}`")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("`{path}`: {message}")]
    Invalid { path: PathBuf, message: String },
    #[error("`{path}`: `{field}` = {found} is not supported ({supported})")]
    Unsupported { path: PathBuf, field: &'static str, found: String, supported: &'static str },
    #[error(transparent)]
    Weights(#[from] WeightsError),
}

/// `adapter_config.json`. Fields PEFT requires are written; on reading, any feature this
/// implementation does not have is refused rather than ignored.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AdapterConfig {
    pub peft_type: String,
    #[serde(default)]
    pub task_type: Option<String>,
    #[serde(default)]
    pub base_model_name_or_path: Option<String>,
    pub r: usize,
    pub lora_alpha: f64,
    #[serde(default)]
    pub lora_dropout: f64,
    pub target_modules: TargetModules,
    #[serde(default = "default_bias")]
    pub bias: String,
    #[serde(default)]
    pub fan_in_fan_out: bool,
    #[serde(default)]
    pub use_rslora: bool,
    #[serde(default)]
    pub use_dora: bool,
    #[serde(default)]
    pub modules_to_save: Option<Vec<String>>,
    #[serde(default)]
    pub layers_to_transform: Option<serde_json::Value>,
    #[serde(default)]
    pub rank_pattern: serde_json::Map<String, serde_json::Value>,
    #[serde(default)]
    pub alpha_pattern: serde_json::Map<String, serde_json::Value>,
    #[serde(default)]
    pub inference_mode: bool,
    /// Every other field PEFT writes; those in [`INERT_UNLESS_SET`] must hold their defaults.
    #[serde(flatten, skip_serializing_if = "serde_json::Map::is_empty")]
    pub other: serde_json::Map<String, serde_json::Value>,
}

/// PEFT features that change the adapted model when set, which this implementation does not have.
const INERT_UNLESS_SET: [&str; 13] = [
    "exclude_modules",
    "kasa_config",
    "monteclora_config",
    "arrow_config",
    "corda_config",
    "loftq_config",
    "lora_bias",
    "layer_replication",
    "trainable_token_indices",
    "target_parameters",
    "use_qalora",
    "use_bdlora",
    "alora_invocation_tokens",
];

fn default_bias() -> String {
    "none".to_owned()
}

/// PEFT writes a list of names, or one string (`all-linear`, or a regular expression).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TargetModules {
    List(Vec<String>),
    One(String),
}

impl AdapterConfig {
    /// The config PEFT needs to rebuild `settings` on `base`.
    pub fn new(settings: &LoraSettings, base: &str) -> Self {
        Self {
            peft_type: "LORA".to_owned(),
            task_type: Some("CAUSAL_LM".to_owned()),
            base_model_name_or_path: Some(base.to_owned()),
            r: settings.r,
            lora_alpha: settings.alpha,
            lora_dropout: settings.config_dropout,
            target_modules: TargetModules::List(settings.peft_targets()),
            bias: default_bias(),
            fan_in_fan_out: false,
            use_rslora: settings.use_rslora,
            use_dora: settings.use_dora,
            modules_to_save: None,
            layers_to_transform: None,
            rank_pattern: Default::default(),
            alpha_pattern: Default::default(),
            inference_mode: true,
            other: Default::default(),
        }
    }

    /// Reads `dir/adapter_config.json` and checks that every field is one this module implements.
    pub fn read(dir: &Path) -> Result<(Self, LoraSettings), AdapterError> {
        let path = dir.join(CONFIG_FILE);
        let text = std::fs::read_to_string(&path).map_err(|source| AdapterError::Io { path: path.clone(), source })?;
        let cfg: Self = serde_json::from_str(&text)
            .map_err(|e| AdapterError::Invalid { path: path.clone(), message: format!("line {}: {e}", e.line()) })?;
        let unsupported = |field, found: String, supported| {
            Err(AdapterError::Unsupported { path: path.clone(), field, found, supported })
        };
        if cfg.peft_type != "LORA" {
            return unsupported("peft_type", format!("`{}`", cfg.peft_type), "LORA");
        }
        if cfg.bias != "none" {
            return unsupported("bias", format!("`{}`", cfg.bias), "none");
        }
        if cfg.fan_in_fan_out {
            return unsupported("fan_in_fan_out", "true".to_owned(), "false");
        }
        if cfg.modules_to_save.as_ref().is_some_and(|m| !m.is_empty()) {
            let found = serde_json::to_string(&cfg.modules_to_save).unwrap_or_default();
            return unsupported("modules_to_save", found, "none");
        }
        if cfg.layers_to_transform.as_ref().is_some_and(|v| !v.is_null()) {
            return unsupported("layers_to_transform", "a layer list".to_owned(), "null");
        }
        if !cfg.rank_pattern.is_empty() {
            return unsupported("rank_pattern", "per-module ranks".to_owned(), "one r");
        }
        if !cfg.alpha_pattern.is_empty() {
            return unsupported("alpha_pattern", "per-module alphas".to_owned(), "one lora_alpha");
        }
        // PiSSA, OLoRA, CorDA and LoftQ take their adapters out of the base weights: PEFT rebuilds
        // that residual base on load, and W + B·A over the unchanged base is another model.
        if let Some(serde_json::Value::String(init)) = cfg.other.get("init_lora_weights")
            && ["pissa", "olora", "corda", "loftq"].iter().any(|k| init.starts_with(k))
        {
            let plain = "true; PEFT's save_pretrained(path_initial_model_for_weight_conversion=...) writes such an adapter as plain LoRA";
            return unsupported("init_lora_weights", format!("`{init}`"), plain);
        }
        for field in INERT_UNLESS_SET {
            match cfg.other.get(field) {
                None | Some(serde_json::Value::Null) | Some(serde_json::Value::Bool(false)) => {}
                Some(serde_json::Value::Array(a)) if a.is_empty() => {}
                Some(serde_json::Value::Object(o)) if o.is_empty() => {}
                Some(value) => return unsupported(field, value.to_string(), "unset"),
            }
        }
        let targets = match &cfg.target_modules {
            TargetModules::List(list) => list.clone(),
            TargetModules::One(one) => vec![one.clone()],
        };
        let mut settings =
            LoraSettings::new(cfg.r, cfg.lora_alpha, cfg.lora_dropout, &targets).map_err(|(key, message)| {
                AdapterError::Invalid { path: path.clone(), message: format!("`{key}` {message}") }
            })?;
        settings.use_rslora = cfg.use_rslora;
        settings.use_dora = cfg.use_dora;
        Ok((cfg, settings))
    }
}

/// Whether `dir` holds a PEFT adapter rather than a full model.
pub fn is_adapter_dir(dir: &Path) -> bool {
    dir.join(CONFIG_FILE).is_file()
}

/// Where an adapter's tensors come from: a fresh initialisation or a saved adapter.
pub enum AdapterInit<'a> {
    /// PEFT's default initialisation, seeded per module.
    Fresh { seed: u64 },
    /// `adapter_model.safetensors` of a saved adapter.
    Saved(&'a Weights),
}

impl Llama {
    /// Attaches an adapter to every targeted projection. The adapter's parameters are created on
    /// `device` and, on an autodiff device, require gradients; nothing else is changed (freeze the
    /// base first).
    pub fn add_lora(
        &mut self,
        settings: &LoraSettings,
        init: &AdapterInit,
        device: &Device,
    ) -> Result<(), WeightsError> {
        let r = settings.r;
        if let AdapterInit::Saved(weights) = init {
            // Every tensor must be one the adapters below read (A, B, DoRA's magnitude).
            let used =
                |n: &str| [".lora_A.weight", ".lora_B.weight", ".lora_magnitude_vector"].iter().any(|s| n.ends_with(s));
            if let Some(name) = weights.names().into_iter().find(|n| !used(n)) {
                return Err(WeightsError::Unused { name, dir: weights.dir().to_owned() });
            }
        }
        for (name, linear) in self.linears_mut() {
            if !settings.adapts(&name) {
                continue;
            }
            let [d_in, d_out] = linear.weight.dims();
            let (a, b) = match init {
                AdapterInit::Fresh { seed } => (kaiming_uniform(&name, *seed, d_in, r), vec![0.0; r * d_out]),
                AdapterInit::Saved(weights) => (
                    transpose(&weights.values(&format!("{PEFT_PREFIX}{name}.lora_A.weight"), &[r, d_in])?, r, d_in),
                    transpose(&weights.values(&format!("{PEFT_PREFIX}{name}.lora_B.weight"), &[d_out, r])?, d_out, r),
                ),
            };
            let magnitude = match init {
                _ if !settings.use_dora => None,
                // ‖W + A·B·α/r‖ with B = 0.
                AdapterInit::Fresh { .. } => Some(column_norms(&linear.weight.val()).to_device(device)),
                AdapterInit::Saved(weights) => {
                    let values = weights.values(&format!("{PEFT_PREFIX}{name}.lora_magnitude_vector"), &[d_out])?;
                    Some(Tensor::<1>::from_data(TensorData::new(values, [d_out]), device))
                }
            };
            let param = |values: Vec<f32>, shape: [usize; 2]| {
                trained(Tensor::<2>::from_data(TensorData::new(values, shape), device))
            };
            linear.lora = Some(Lora {
                a: param(a, [d_in, r]),
                b: param(b, [r, d_out]),
                scale: settings.scale(),
                dropout: settings.dropout,
                magnitude: magnitude.map(trained),
            });
        }
        Ok(())
    }

    /// Sets the adapters' dropout (the trained policy keeps the configured value; copies used for
    /// evaluation and sampling set 0).
    pub fn set_lora_dropout(&mut self, p: f64) {
        for (_, linear) in self.linears_mut() {
            if let Some(lora) = linear.lora.as_mut() {
                lora.dropout = p;
            }
        }
    }

    /// The same model with its adapters removed: the frozen base (shares its tensors).
    pub fn without_lora(mut self) -> Self {
        for (_, linear) in self.linears_mut() {
            linear.lora = None;
        }
        self
    }

    /// Whether any projection carries an adapter.
    pub fn has_lora(&self) -> bool {
        self.linears().iter().any(|(_, l)| l.lora.is_some())
    }

    /// Folds every adapter into its weight.
    pub fn merge_lora(mut self) -> Self {
        for (_, linear) in self.linears_mut() {
            linear.merge();
        }
        self
    }

    /// The adapter tensors under PEFT's names and layout, f32.
    pub fn adapter_tensors(&self) -> Vec<NamedTensor> {
        let mut out = Vec::new();
        for (name, linear) in self.linears() {
            let Some(lora) = &linear.lora else { continue };
            for (kind, t) in [("lora_A", &lora.a), ("lora_B", &lora.b)] {
                let [rows, cols] = t.dims();
                out.push(NamedTensor {
                    name: format!("{PEFT_PREFIX}{name}.{kind}.weight"),
                    shape: vec![cols, rows], // [r, in] / [out, r]
                    values: Values::Device { tensor: t.val(), transpose: true },
                });
            }
            if let Some(m) = &lora.magnitude {
                let n = m.dims()[0];
                out.push(NamedTensor {
                    name: format!("{PEFT_PREFIX}{name}.lora_magnitude_vector"),
                    shape: vec![n],
                    values: Values::Device { tensor: m.val().reshape([1, n]), transpose: false },
                });
            }
        }
        out
    }
}

/// Writes `dir/adapter_config.json` and `dir/adapter_model.safetensors` (each atomically).
pub fn save_adapter(dir: &Path, model: &Llama, settings: &LoraSettings, base: &str) -> Result<(), AdapterError> {
    let io = |source| AdapterError::Io { path: dir.to_owned(), source };
    std::fs::create_dir_all(dir).map_err(io)?;
    let json = serde_json::to_vec_pretty(&AdapterConfig::new(settings, base)).map_err(|e| io(e.into()))?;
    dpo_base::fsutil::write_atomic(&dir.join(CONFIG_FILE), &json).map_err(io)?;
    save_safetensors(&dir.join(WEIGHTS_FILE), &model.adapter_tensors())?;
    Ok(())
}

/// Maps `dir/adapter_model.safetensors`.
pub fn open_adapter_weights(dir: &Path) -> Result<Weights, WeightsError> {
    Weights::open_file(&dir.join(WEIGHTS_FILE))
}

/// An adapter tensor as a parameter, tracked on an autodiff device.
fn trained<const D: usize>(t: Tensor<D>) -> Param<Tensor<D>> {
    Param::from_tensor(if t.device().is_autodiff() { t.require_grad() } else { t })
}

/// `[rows, cols]` row-major → `[cols, rows]`.
fn transpose(values: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    (0..cols).flat_map(|c| (0..rows).map(move |r| values[r * cols + c])).collect()
}

/// PEFT's `kaiming_uniform_(a=√5)` on `lora_A` `[r, in]`: uniform in ±1/√in, returned `[in, r]`,
/// seeded from (`seed`, the module name) so it does not depend on the order of modules.
fn kaiming_uniform(name: &str, seed: u64, d_in: usize, r: usize) -> Vec<f32> {
    use rand::RngExt;
    let mut rng = seeded_rng(seed, name);
    let bound = 1.0 / (d_in as f64).sqrt();
    (0..d_in * r).map(|_| ((rng.random::<f64>() * 2.0 - 1.0) * bound) as f32).collect()
}
