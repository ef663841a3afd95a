//! From a burn `Tensor<D>` (LibTorch backend, with or without autodiff) to the `tch::Tensor` it
//! wraps, and back, without copying: burn-tch's float primitive is `TchTensor { tensor: tch::Tensor }`,
//! reached through burn's extension API (`Tensor::try_into_primitive::<LibTorch>`).

// burn marks burn-tch deprecated in favour of CubeCL backends; this project runs on LibTorch on
// purpose (the trainer's device is `Device::libtorch()`), so the deprecation is expected here.
#![allow(deprecated)]

use burn::tensor::{Int, Tensor};
use burn_tch::{LibTorch, TchTensor};

use crate::{TorchError, tch_err};

/// What a tensor was before it was unwrapped, so it can be rewrapped the same way.
#[derive(Debug, Clone, Copy)]
pub struct Origin {
    autodiff: bool,
    require_grad: bool,
}

/// The `tch::Tensor` under `tensor` (a shallow handle on the same storage) and how to rewrap it.
///
/// Autodiff tensors are unwrapped through [`Tensor::inner`], which drops any graph reference (the
/// caller holds its own handle on the original tensor).
pub fn to_tch<const D: usize>(tensor: Tensor<D>) -> Result<(tch::Tensor, Origin), String> {
    let origin = Origin { autodiff: tensor.is_autodiff(), require_grad: tensor.is_require_grad() };
    let primitive = tensor.inner().try_into_primitive::<LibTorch>().map_err(|e| format!("{e:?}"))?;
    Ok((primitive.tensor, origin))
}

/// [`to_tch`] where the tensor can only be on LibTorch (this project's one backend): one that is
/// not is a programming error, which the panic names by `what`.
pub fn on_libtorch<const D: usize>(tensor: Tensor<D>, what: &str) -> (tch::Tensor, Origin) {
    match to_tch(tensor) {
        Ok(pair) => pair,
        Err(e) => panic!("{what} off LibTorch: {e}"),
    }
}

/// [`on_libtorch`] for an integer tensor (indices, labels): a shallow handle, any graph reference
/// dropped as [`to_tch`] does.
pub fn int_on_libtorch<const D: usize>(tensor: Tensor<D, Int>, what: &str) -> tch::Tensor {
    match tensor.inner().try_into_primitive::<LibTorch>() {
        Ok(primitive) => primitive.tensor,
        Err(e) => panic!("{what} off LibTorch: {e:?}"),
    }
}

/// [`to_tch`] for an in-place kernel: the tensor is contiguous and nothing else sees its values.
/// Where burn tracks another handle on the storage (a clone, the tensor a view was taken from),
/// the kernel gets a copy, as burn's own operations only write in place into storage they alone hold.
pub fn to_tch_exclusive<const D: usize>(tensor: Tensor<D>) -> Result<(tch::Tensor, Origin), TorchError> {
    let origin = Origin { autodiff: tensor.is_autodiff(), require_grad: tensor.is_require_grad() };
    let primitive = tensor
        .inner()
        .try_into_primitive::<LibTorch>()
        .map_err(|e| TorchError::NotLibTorch { index: 0, reason: format!("{e:?}") })?;
    let tensor = match primitive.can_mut() {
        true => primitive.tensor,
        // Not tch's `copy`, which zero-fills the copy first: a pass and a kernel launch for nothing.
        false => {
            let mut copy = primitive.tensor.f_empty_like().map_err(tch_err("empty_like"))?;
            copy.f_copy_(&primitive.tensor).map_err(tch_err("copy_"))?;
            copy
        }
    };
    Ok((tensor.f_contiguous().map_err(tch_err("contiguous"))?, origin))
}

/// Wraps `tensor` as a burn tensor with the autodiff state of `origin`.
///
/// `tensor` must have `D` dimensions (the callers reshape to the original shape first).
pub fn from_tch<const D: usize>(tensor: tch::Tensor, origin: Origin) -> Tensor<D> {
    let tensor = Tensor::<D>::from_primitive::<LibTorch>(TchTensor::new(tensor));
    match (origin.autodiff, origin.require_grad) {
        (false, _) => tensor,
        (true, false) => tensor.autodiff(),
        (true, true) => tensor.autodiff().require_grad(),
    }
}

impl Origin {
    /// A plain tensor's origin (no autodiff), for tch tensors made directly.
    pub fn plain() -> Self {
        Self { autodiff: false, require_grad: false }
    }

    /// The same device side of autodiff, without a gradient (a detached result).
    pub fn detached(self) -> Self {
        Self { require_grad: false, ..self }
    }
}
