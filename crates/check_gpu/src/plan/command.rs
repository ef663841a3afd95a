//! Step 8, the `dpo-train` command: the plan's settings as a typed [`RunSettings`] (dpo-vocab's,
//! whose flags are dpo-train's own), and the command line it renders to: the config file the
//! user writes, then every setting the plan assumed spelled out, so that nothing in that file (a
//! `sharding`, a `bf16`) overrides the plan.

use dpo_vocab::{Lora, Ranks, RunSettings};

use super::batch::Split;
use super::fit::Setting;
use super::{DATA_PLACEHOLDER, LORA_TARGETS, MODEL_PLACEHOLDER, PlanRequest};
use crate::memory::{FineTune, Precision, Reference};

/// The settings for `ranks` with the batch `split` in `precision` and setting `s`.
pub(super) fn settings(
    req: &PlanRequest,
    s: &Setting,
    ranks: Ranks,
    split: &Split,
    precision: Precision,
) -> RunSettings {
    RunSettings {
        model: req.model_dir.clone(),
        data: req.data.clone(),
        reading: req.reading.clone(),
        ranks,
        micro_batch: split.micro,
        accumulation: split.accum,
        global_batch: split.effective,
        max_length: req.seq_len,
        precision,
        // The adapters the estimate counts (dpo-train's own default is q_proj,v_proj, as PEFT's).
        lora: match s.finetune {
            FineTune::Lora { rank } => {
                Some(Lora { r: rank, targets: LORA_TARGETS.split(',').map(str::to_owned).collect() })
            }
            FineTune::Full => None,
        },
        precompute_ref_log_probs: s.reference == Reference::Precompute,
        gradient_checkpointing: s.checkpointing,
        sharding: s.sharding,
        offload_optimizer: s.offload,
        loss_type: req.loss_type.map(str::to_owned),
    }
}

/// `dpo-train train` and the flags of `settings`, each a shell word, with a placeholder for the
/// model or the data the plan was not given.
pub(super) fn render(settings: &RunSettings) -> String {
    let mut filled = settings.clone();
    filled.model.get_or_insert_with(|| MODEL_PLACEHOLDER.into());
    filled.data.get_or_insert_with(|| DATA_PLACEHOLDER.into());
    let mut words = vec!["dpo-train".to_owned(), "train".to_owned()];
    words.extend(filled.flags().iter().map(|w| shell_word(w)));
    words.join(" ")
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
