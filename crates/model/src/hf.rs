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
