//! Step 8, the `dpo-train` command: the config file the user writes, the model when `--model` named
//! one, and every setting the plan assumed spelled out (dpo-train's own defaults are TRL's: bf16
//! and gradient checkpointing on, no sharding): `--sharding zeroN` and `--offload-optimizer` only
//! when step 4 chose them.

use super::batch::Split;
use super::fit::Setting;
use super::{CONFIG_PLACEHOLDER, LORA_TARGETS, PlanRequest};
use crate::memory::{Dtype, FineTune, Reference, Sharding};

/// What the ranks run on.
#[derive(Debug, Clone, Copy)]
pub(super) enum Ranks {
    /// `--gpus N`.
    Gpus(usize),
    /// `--devices cpu:N`, no GPU usable.
    Cpu(usize),
}

/// The command for `ranks` with the batch `split` in `dtype` and setting `s`.
pub(super) fn dpo_train(req: &PlanRequest, s: &Setting, ranks: Ranks, split: &Split, dtype: Dtype) -> String {
    let devices = match ranks {
        Ranks::Gpus(n) => format!("--gpus {n}"),
        Ranks::Cpu(n) => format!("--devices cpu:{n}"),
    };
    let mut cmd = format!(
        "{} {devices} --per-device-train-batch-size {} --gradient-accumulation-steps {} --global-batch-size {} --max-length {}",
        head(req),
        split.micro,
        split.accum,
        split.effective,
        req.seq_len
    );
    cmd.push_str(match dtype {
        Dtype::Bf16 => " --bf16",
        Dtype::Fp16 => " --fp16",
        Dtype::Fp32 => " --bf16 false",
    });
    if let FineTune::Lora { rank } = s.finetune {
        // The adapters the estimate counts (dpo-train's own default is q_proj,v_proj, as PEFT's).
        cmd.push_str(&format!(" --lora-r {rank} --lora-target-modules {LORA_TARGETS}"));
    }
    if s.reference == Reference::Precompute {
        cmd.push_str(" --precompute-ref-log-probs");
    }
    cmd.push_str(if s.checkpointing { " --gradient-checkpointing" } else { " --gradient-checkpointing false" });
    if s.sharding != Sharding::None {
        cmd.push_str(&format!(" --sharding {}", s.sharding.name()));
    }
    if s.offload {
        cmd.push_str(" --offload-optimizer");
    }
    cmd
}

/// `dpo-train train --config YOUR_CONFIG.toml`, and the model when `--model` named one.
fn head(req: &PlanRequest) -> String {
    let mut head = format!("dpo-train train --config {CONFIG_PLACEHOLDER}");
    if let Some(dir) = &req.model_dir {
        head.push_str(&format!(" --model-name-or-path {}", shell_word(&dir.display().to_string())));
    }
    head
}

/// `text` as one shell word: quoted when it holds anything but plain path characters.
fn shell_word(text: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "/._-+:@%,=".contains(c);
    if !text.is_empty() && text.chars().all(plain) {
        text.to_owned()
    } else {
        format!("'{}'", text.replace('\'', "'\\''"))
    }
}
