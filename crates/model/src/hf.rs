//! The storage boundary between Hugging Face checkpoints and the burn modules: names follow the
//! safetensors keys, and one rule says which tensors are stored transposed (linear weights are
//! `[out, in]` in HF's files and `[in, out]` in burn's `Linear`), read by the loader and written
//! back by the exporter (as burn-store's `PyTorchToBurnAdapter`).

use burn::module::{Module, Param};
use burn::tensor::Device;

use super::ModelError;
use super::linear::Linear;
use super::params;
use super::weights::{NamedTensor, TensorSource, Values};

/// The embedding's parameter, the only matrix HF stores as burn does (`[V, h]`).
pub const EMBEDDING: &str = "model.embed_tokens.weight";

/// Whether the parameter `name` of `rank` dimensions is stored transposed in HF's files.
pub fn stored_transposed(name: &str, rank: usize) -> bool {
    rank == 2 && name != EMBEDDING
}

/// A linear layer from an HF `[out, in]` weight (and optional bias) under `prefix`.
pub(super) fn load_linear(
    w: &dyn TensorSource,
    prefix: &str,
    d_in: usize,
    d_out: usize,
    bias: bool,
    device: &Device,
) -> Result<Linear, ModelError> {
    let name = format!("{prefix}.weight");
    debug_assert!(stored_transposed(&name, 2));
    // [in, out], stored so: the reshape through [in·out] copies the transposed view. Every other
    // copy of the weight (after an optimizer step, gathered under ZeRO-3) is laid out so too, and
    // a product's rounding may depend on its operand's layout.
    let weight = w.tensor(&name, [d_out, d_in], device)?.transpose().reshape([d_in * d_out]).reshape([d_in, d_out]);
    let bias =
        if bias { Some(Param::from_tensor(w.tensor(&format!("{prefix}.bias"), [d_out], device)?)) } else { None };
    Ok(Linear { weight: Param::from_tensor(weight), bias, lora: None })
}

/// The `config.json` written beside [`export_tensors`]' f32 weights: the model's own (`text`) with
/// its `dtype` (and transformers 4's `torch_dtype`) saying `float32`, as `save_pretrained` of the
/// f32 model TRL trains writes it. Copied unchanged, a base's `bfloat16` made a loader that takes
/// the config's dtype (transformers 5's default) round the trained weights to bf16 as it read
/// them. Text that is not a JSON object comes back unchanged.
pub fn export_config(text: &str) -> String {
    let Ok(serde_json::Value::Object(mut config)) = serde_json::from_str(text) else { return text.to_owned() };
    let mut named = false;
    for key in ["dtype", "torch_dtype"] {
        if let Some(value) = config.get_mut(key) {
            *value = "float32".into();
            named = true;
        }
    }
    if !named {
        config.insert("dtype".into(), "float32".into());
    }
    serde_json::to_string_pretty(&config).map_or_else(|_| text.to_owned(), |json| json + "\n")
}

/// Every base parameter under its Hugging Face name and layout (linear weights back to
/// `[out, in]`, converted to f32 as each is written): what `model.safetensors` holds. Adapters are
/// not included (see `Llama::adapter_tensors` and `Llama::merge_lora`).
pub fn export_tensors<M: Module>(model: &M) -> Vec<NamedTensor> {
    let mut out = Vec::new();
    params::visit(model, None, |p| {
        if p.name.split('.').any(|part| part == "lora") {
            return;
        }
        let transpose = stored_transposed(&p.name, p.dims.len());
        let matrix = match p.dims.as_slice() {
            [rows, cols] => p.flat().reshape([*rows, *cols]), // burn's layout; transposed as written
            _ => p.flat().reshape([1, p.numel()]),
        };
        let mut shape = p.dims.clone();
        if transpose {
            shape.reverse();
        }
        out.push(NamedTensor { name: p.name, shape, values: Values::Device { tensor: matrix, transpose } });
    });
    out
}

#[cfg(test)]
mod tests {
    use super::export_config;

    /// transformers 5's `dtype`, transformers 4's `torch_dtype` or neither: the written config
    /// says float32, its other keys in their order; text that is not an object is kept.
    #[test]
    fn the_exported_config_names_the_weights_dtype() {
        let v5 = export_config(r#"{"model_type": "qwen2", "dtype": "bfloat16", "vocab_size": 8}"#);
        assert_eq!(v5, "{\n  \"model_type\": \"qwen2\",\n  \"dtype\": \"float32\",\n  \"vocab_size\": 8\n}\n");
        let v4 = export_config(r#"{"torch_dtype": "float16", "model_type": "llama"}"#);
        assert_eq!(v4, "{\n  \"torch_dtype\": \"float32\",\n  \"model_type\": \"llama\"\n}\n");
        let bare = export_config(r#"{"model_type": "llama"}"#);
        assert_eq!(bare, "{\n  \"model_type\": \"llama\",\n  \"dtype\": \"float32\"\n}\n");
        assert_eq!(export_config("[1]"), "[1]");
    }
}
