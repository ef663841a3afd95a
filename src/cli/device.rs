//! `--device auto`'s fallback note, where the flags left the choice to it (see
//! [`crate::run::device`] for the device line itself).

use burn::tensor::Device;
use dpo_torch::allocator::cuda_index;

use super::args::DeviceArg;
use crate::run::device::cpu_fallback_note;

/// [`cpu_fallback_note`] where `--device auto` placed this process on the CPU (not where the
/// devices were chosen otherwise: `--devices cpu:N`, `--gpus`).
pub fn auto_fell_back(arg: DeviceArg, chosen_otherwise: bool, device: &Device) -> Option<String> {
    let auto = arg == DeviceArg::Auto && !chosen_otherwise;
    if auto && cuda_index(device).is_none() { cpu_fallback_note() } else { None }
}
