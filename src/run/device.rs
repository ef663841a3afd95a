//! What a run says about where it runs: one line naming the device, its name and the precision
//! (printed at the start of train, sft, eval and generate, and kept in `summary.txt`), and why
//! `--device auto` fell back to the CPU on a machine whose NVIDIA driver shows GPUs.

use std::path::Path;

use burn::tensor::Device;
use dpo_torch::allocator::{cuda_device_name, cuda_index};

use crate::config::Precision;

/// `device: cuda:0 (NVIDIA H100 80GB HBM3), bf16 mixed precision, fp32 master weights`; on the
/// CPU its model and torch's threads; `ranks` > 1 adds that each rank has one such device.
pub fn describe(device: &Device, precision: Option<Precision>, ranks: usize) -> String {
    let place = match cuda_index(device) {
        Some(i) => match cuda_device_name(i) {
            Ok(name) => format!("cuda:{i} ({name})"),
            Err(_) => format!("cuda:{i}"),
        },
        None => format!("cpu ({})", super::machine()),
    };
    let ranks = if ranks > 1 { format!(", one per rank on each of {ranks} ranks") } else { String::new() };
    let precision = match precision {
        Some(Precision::Bf16) => ", bf16 mixed precision, fp32 master weights",
        Some(Precision::Fp16) => ", fp16 mixed precision with a dynamic loss scale, fp32 master weights",
        Some(Precision::Fp32) => ", fp32",
        None => "",
    };
    format!("device: {place}{ranks}{precision}")
}

/// Sets TF32 for this process's f32 matrix products and convolutions, as `tf32` asks; `true`
/// needs a CUDA device, as transformers' `tf32` does (TF32 is a mode of NVIDIA's Ampere and newer
/// GPUs). The error is the reason, for the key's one line.
pub fn set_tf32(enable: bool, device: &Device) -> Result<(), String> {
    if enable && cuda_index(device).is_none() {
        return Err(
            "`true` needs a CUDA device (TF32 is a mode of NVIDIA Ampere and newer GPUs); this run is on the CPU"
                .to_owned(),
        );
    }
    dpo_torch::kernels::set_tf32(enable).map_err(|e| e.to_string())
}

/// Why `--device auto` runs on the CPU where the NVIDIA driver lists GPUs (`/proc/driver/nvidia/gpus`
/// has an entry per GPU) but torch sees none; `None` where the driver lists none, so a machine
/// without GPUs gets no note.
pub fn cpu_fallback_note() -> Option<String> {
    let listed = std::fs::read_dir("/proc/driver/nvidia/gpus").map_or(0, |d| d.count());
    fallback_reason(listed, std::env::var("CUDA_VISIBLE_DEVICES").ok().as_deref(), Path::new(dpo_torch::TORCH_LIB))
}

fn fallback_reason(listed: usize, visible: Option<&str>, torch_lib: &Path) -> Option<String> {
    if listed == 0 {
        return None;
    }
    let why = match visible.map(str::trim) {
        Some(v @ ("" | "-1" | "none")) => format!("CUDA_VISIBLE_DEVICES={v:?} hides them"),
        _ if !torch_lib.join("libtorch_cuda.so").exists() => {
            format!("the torch at `{}` is a CPU build", torch_lib.display())
        }
        _ => "torch could not initialise CUDA (a driver older than torch's CUDA?)".to_owned(),
    };
    Some(format!(
        "note: --device auto runs on the CPU: the NVIDIA driver lists {listed} GPU(s) but torch sees none: {why}; \
         `dpo-train env` shows what this build and machine have, `--device cpu` silences this"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[allow(deprecated)] // burn's libtorch device is deprecated upstream; it is this project's backend.
    fn the_cpu_is_named_with_its_precision() {
        let line = describe(&Device::libtorch(), Some(Precision::Bf16), 1);
        assert!(line.starts_with("device: cpu ("), "{line}");
        let threads = tch::get_num_threads();
        let said = if threads == 1 { " 1 torch thread)".to_owned() } else { format!(" {threads} torch threads)") };
        assert!(line.ends_with(&format!("{said}, bf16 mixed precision, fp32 master weights")), "{line}");
        let two = describe(&Device::libtorch(), Some(Precision::Fp32), 2);
        assert!(two.ends_with(", one per rank on each of 2 ranks, fp32"), "{two}");
    }

    /// `tf32 = true` is refused on the CPU with the reason; `false` sets torch's flags off.
    #[test]
    #[allow(deprecated)] // burn's libtorch device is deprecated upstream; it is this project's backend.
    fn tf32_needs_a_cuda_device() {
        let err = set_tf32(true, &Device::libtorch()).unwrap_err();
        assert!(err.starts_with("`true` needs a CUDA device"), "{err}");
        set_tf32(false, &Device::libtorch()).unwrap();
        assert_eq!(dpo_torch::kernels::tf32().unwrap(), (false, false));
    }

    #[test]
    fn a_fallback_says_why_only_where_the_driver_lists_gpus() {
        let cuda_torch = Path::new(dpo_torch::TORCH_LIB);
        assert_eq!(fallback_reason(0, None, cuda_torch), None);
        let hidden = fallback_reason(2, Some(""), cuda_torch).unwrap();
        assert!(
            hidden.contains("lists 2 GPU(s) but torch sees none: CUDA_VISIBLE_DEVICES=\"\" hides them"),
            "{hidden}"
        );
        let cpu_build = fallback_reason(1, None, Path::new("/nonexistent/torch/lib")).unwrap();
        assert!(cpu_build.contains("the torch at `/nonexistent/torch/lib` is a CPU build"), "{cpu_build}");
    }
}
