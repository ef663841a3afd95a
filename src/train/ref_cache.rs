//! Precomputed reference log-probs (`precompute_ref_log_probs`): one pass of the reference over
//! the training pairs before training, cached on disk under `<output_dir>/.ref_cache/` and keyed
//! by everything the numbers depend on: the reference's weights (adapters included) and precision,
//! the tokenised data, `max_length` and `truncation_mode`, `ld_alpha` and the tokenizer. A changed input changes the key; nothing stale is ever reused.

use std::path::PathBuf;

use anyhow::Context;
use sha2::{Digest, Sha256};

use super::context::{Progress, Run};
use crate::dpo::logps::{Collation, RefLogps};
use crate::model::Llama;
use crate::model::weights::{NamedTensor, Values, Weights, save_safetensors};

/// The cached log-probs for this reference and data, or `compute`d (by every rank) and stored
/// (by rank 0) when absent.
pub fn load_or_compute(
    reference: &Llama,
    run: &Run,
    collation: &Collation,
    progress: &mut dyn Progress,
    compute: impl FnOnce() -> anyhow::Result<RefLogps>,
) -> anyhow::Result<RefLogps> {
    let path = cache_path(reference, run, collation)?;
    if path.is_file() {
        let weights = Weights::open_file(&path)?;
        let n = run.data.train.len();
        let cached = RefLogps { chosen: weights.values("chosen", &[n])?, rejected: weights.values("rejected", &[n])? };
        progress.line(&format!("reference log-probs from cache `{}`", path.display()));
        return Ok(cached);
    }
    progress.line(&format!("precomputing reference log-probs for {} training pairs", run.data.train.len()));
    let logps = compute()?;
    if !run.rt.workers.is_main() {
        return Ok(logps);
    }
    let dir = path.parent().unwrap_or(&run.cfg.output_dir);
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create `{}`", dir.display()))?;
    let n = logps.chosen.len();
    save_safetensors(
        &path,
        &[
            NamedTensor { name: "chosen".into(), shape: vec![n], values: Values::Host(logps.chosen.clone()) },
            NamedTensor { name: "rejected".into(), shape: vec![n], values: Values::Host(logps.rejected.clone()) },
        ],
    )?;
    Ok(logps)
}

/// `<output_dir>/.ref_cache/<sha256 of the inputs>.safetensors`.
fn cache_path(reference: &Llama, run: &Run, collation: &Collation) -> anyhow::Result<PathBuf> {
    let mut hash = Sha256::new();
    for tensor in crate::model::hf::export_tensors(reference).into_iter().chain(reference.adapter_tensors()) {
        hash.update(tensor.name.as_bytes());
        for v in tensor.values.to_vec() {
            hash.update(v.to_le_bytes());
        }
    }
    for pair in &run.data.train {
        for ids in [&pair.prompt_ids, &pair.chosen_ids, &pair.rejected_ids] {
            hash.update((ids.len() as u64).to_le_bytes());
            ids.iter().for_each(|id| hash.update(id.to_le_bytes()));
        }
    }
    hash.update(
        format!("{:?}|{:?}|{:?}", collation.truncation, collation.ld_alpha, reference.compute_dtype()).as_bytes(),
    );
    let tokenizer = run.data.tokenizer_dir.join("tokenizer.json");
    hash.update(std::fs::read(&tokenizer).with_context(|| format!("cannot read `{}`", tokenizer.display()))?);
    let key: String = hash.finalize().iter().map(|b| format!("{b:02x}")).collect();
    Ok(run.cfg.output_dir.join(".ref_cache").join(format!("{key}.safetensors")))
}
