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
use crate::model::weights::{NamedTensor, Values, Weights, save_safetensors_with};

/// The cached log-probs for this reference and data, or `compute`d (by every rank) and stored
/// (by rank 0) when absent; `None` when `compute` was stopped (by a Ctrl-C: nothing is stored).
pub fn load_or_compute(
    reference: &Llama,
    run: &Run,
    collation: &Collation,
    progress: &mut dyn Progress,
    compute: impl FnOnce() -> anyhow::Result<Option<RefLogps>>,
) -> anyhow::Result<Option<RefLogps>> {
    let path = cache_path(reference, run, collation)?;
    if let Some(dir) = path.parent() {
        for stale in dpo_base::fsutil::remove_stale_temps(dir) {
            progress.line(&format!("removed `{}`, left by a writer that died", stale.display()));
        }
    }
    match read(&path, run.data.train.len()) {
        Ok(Some(cached)) => {
            progress.line(&format!("reference log-probs from cache `{}`", path.display()));
            return Ok(Some(cached));
        }
        Ok(None) => {}
        Err(why) => {
            // Never used: computed again and stored anew.
            let _ = std::fs::remove_file(&path);
            progress
                .line(&format!("warning: the cache entry `{}` is damaged ({why}): computing again", path.display()));
        }
    }
    let (n, examples) = (run.data.train.len(), run.cfg.loss.examples());
    progress.line(&format!("precomputing reference log-probs for {n} training {examples}"));
    let Some(logps) = compute()? else { return Ok(None) };
    if !run.rt.workers.is_main() {
        return Ok(Some(logps));
    }
    let dir = path.parent().unwrap_or(&run.cfg.output_dir);
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create `{}`", dir.display()))?;
    let n = logps.chosen.len();
    save_safetensors_with(
        &path,
        &[
            NamedTensor { name: "chosen".into(), shape: vec![n], values: Values::Host(logps.chosen.clone()) },
            NamedTensor { name: "rejected".into(), shape: vec![n], values: Values::Host(logps.rejected.clone()) },
        ],
        &[(CHECKSUM, &checksum(&logps))],
    )?;
    Ok(Some(logps))
}

/// The header key of the log-probs' checksum.
const CHECKSUM: &str = "dpo_train_sha256";

/// The SHA-256 of the log-probs' little-endian bytes, chosen then rejected, in hex.
fn checksum(logps: &RefLogps) -> String {
    let mut hash = Sha256::new();
    logps.chosen.iter().chain(&logps.rejected).for_each(|v| hash.update(v.to_le_bytes()));
    hash.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// The entry at `path` for `n` pairs, verified against its checksum; `Ok(None)` when there is
/// none, `Err` saying what is wrong with a damaged one.
fn read(path: &std::path::Path, n: usize) -> Result<Option<RefLogps>, String> {
    if !path.is_file() {
        return Ok(None);
    }
    let weights = Weights::open_file(path).map_err(|e| e.to_string())?;
    let values = |name| weights.values(name, &[n]).map_err(|e| e.to_string());
    let logps = RefLogps { chosen: values("chosen")?, rejected: values("rejected")? };
    match weights.metadata(CHECKSUM) {
        Some(sum) if sum == checksum(&logps) => Ok(Some(logps)),
        Some(_) => Err("its checksum does not match its contents".into()),
        None => Err("it has no checksum".into()),
    }
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
