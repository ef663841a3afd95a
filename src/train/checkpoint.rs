//! Checkpoints: `checkpoints/step-N/` holds the model (HF layout), the AdamW moments, the trainer
//! state (step, epoch, elapsed time), the effective config and the tokenizer's files. Each is
//! written into a staging directory that is renamed into place, so a kill mid-write leaves the
//! previous checkpoints intact; `save_total_limit` prunes the oldest after a successful save.
//!
//! The data position needs no saving: the sampler derives every batch from (seed, step).
//!
//! Under ZeRO no rank holds the whole optimizer state: each writes its slices of the moments
//! (`optimizer.shard-R-of-W.safetensors`, see [`save_slices`]) and the checkpoint records each
//! parameter's length (`optimizer.shards.json`); loading reassembles one parameter at a time into
//! whatever layout the resumed run uses, any world size and sharding stage.
//!
//! `checksums.json` holds the CRC-32C of the tensor files and the trainer state, written last;
//! reading them back checks them ([`dpo_base::checksums`]), so a file damaged on disk stops a
//! resume by name rather than training on from it.

use std::path::{Path, PathBuf};

use anyhow::Context;

use burn::tensor::{Device, Tensor, TensorData};
use serde::{Deserialize, Serialize};

use super::optim::{AdamW, LossScaler, Moments};
use crate::config::LoraSettings;
use crate::fsutil::{replace_dir, write_atomic};
use crate::model::weights::{NamedTensor, Values, Weights, WeightsError, save_safetensors};
use crate::model::{self, Llama};

impl CheckpointError {
    /// A fault of the checkpoint read (damaged or incomplete files: bad input), not of writing one.
    pub fn is_input(&self) -> bool {
        match self {
            Self::Write { .. } | Self::Weights(WeightsError::Write { .. }) => false,
            Self::Corrupt { .. } | Self::Weights(_) | Self::Model(_) | Self::Adapter(_) => true,
        }
    }
}

/// Errors reading or writing a checkpoint, naming the path.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("cannot write `{path}`")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("checkpoint `{path}` is incomplete: {message}")]
    Corrupt { path: PathBuf, message: String },
    #[error(transparent)]
    Weights(#[from] WeightsError),
    #[error(transparent)]
    Model(#[from] model::ModelError),
    #[error(transparent)]
    Adapter(#[from] model::AdapterError),
}

/// What a checkpoint or `final/` holds of the model.
#[derive(Debug, Clone, Copy)]
pub enum ModelFiles<'a> {
    /// `config.json` and `model.safetensors`: every weight; `generation_config.json` kept from the
    /// starting model's directory `base` where it has one (as transformers' `save_pretrained`
    /// writes the one it loaded: its end-of-sequence ids and sampling settings).
    Full { config_json: &'a str, base: Option<&'a Path> },
    /// A PEFT adapter directory: only what trained, over the base in `base`.
    Adapter { settings: &'a LoraSettings, base: &'a Path },
}

/// Where the loop stood.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainerState {
    /// Optimizer steps completed.
    pub step: u64,
    pub epoch: f64,
    /// Training time so far, carried across resumes.
    pub elapsed_seconds: f64,
    /// Training tokens seen so far (TRL's `num_tokens`).
    pub num_tokens: f64,
    /// fp16's dynamic loss scale.
    #[serde(default)]
    pub loss_scaler: Option<LossScaler>,
    /// Pairs per optimizer step (all devices and accumulation): the data position and the
    /// schedule count steps of this batch. `None` in checkpoints written before it was kept.
    #[serde(default)]
    pub global_batch: Option<usize>,
    /// What the stage trains: a resume under the other command is refused. `None` in
    /// checkpoints written before it was kept.
    #[serde(default)]
    pub objective: Option<super::Objective>,
}

const STATE_FILE: &str = "trainer_state.json";
const GENERATION_CONFIG: &str = "generation_config.json";
const OPTIMIZER_FILE: &str = "optimizer.safetensors";
const SHARDS_FILE: &str = "optimizer.shards.json";

/// A ZeRO checkpoint's layout: the world size that wrote the slices and each parameter's length.
#[derive(Serialize, Deserialize)]
struct ShardsFile {
    world_size: usize,
    lens: std::collections::BTreeMap<String, usize>,
}

fn slice_file(rank: usize, world: usize) -> String {
    format!("optimizer.shard-{rank}-of-{world}.safetensors")
}

/// Where every rank writes its slices of step `step`'s moments, before rank 0 assembles the
/// checkpoint ([`save`] moves them in).
fn slices_dir(run_dir: &Path, step: u64) -> PathBuf {
    run_dir.join("checkpoints").join(format!(".step-{step}.shards"))
}

/// Writes this rank's slices of the moments (ZeRO) for the checkpoint of `step`; every rank
/// calls it before rank 0's [`save`].
pub fn save_slices(run_dir: &Path, optimizer: &AdamW, step: u64) -> Result<(), CheckpointError> {
    let Some((rank, world)) = optimizer.shard else { return Ok(()) };
    let dir = slices_dir(run_dir, step);
    std::fs::create_dir_all(&dir).map_err(|source| CheckpointError::Write { path: dir.clone(), source })?;
    save_safetensors(&dir.join(slice_file(rank, world)), &moment_tensors(optimizer))?;
    Ok(())
}

fn moment_tensors(optimizer: &AdamW) -> Vec<NamedTensor> {
    optimizer
        .moments
        .iter()
        .flat_map(|(name, m)| {
            [("exp_avg", &m.exp_avg), ("exp_avg_sq", &m.exp_avg_sq)].map(|(kind, t)| NamedTensor {
                name: format!("{name}.{kind}"),
                shape: vec![t.dims()[0]],
                values: Values::Device { tensor: t.clone().unsqueeze(), transpose: false },
            })
        })
        .collect()
}

/// Everything a checkpoint holds besides the model.
pub struct Saved {
    pub state: TrainerState,
    pub optimizer: AdamW,
}

/// Writes `checkpoints/step-N` under `run_dir` and prunes beyond `keep` checkpoints.
pub fn save(
    run_dir: &Path,
    model: &Llama,
    files: ModelFiles,
    optimizer: &AdamW,
    state: &TrainerState,
    beside: Beside,
    keep: Option<usize>,
) -> Result<PathBuf, CheckpointError> {
    let root = run_dir.join("checkpoints");
    let dest = root.join(format!("step-{}", state.step));
    let staged = root.join(format!(".step-{}.partial", state.step));
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| CheckpointError::Write { path, source }
    };
    if staged.exists() {
        std::fs::remove_dir_all(&staged).map_err(io(&staged))?;
    }
    let written = write_checkpoint(&staged, model, files, optimizer, state, beside)
        .and_then(|()| move_slices(&slices_dir(run_dir, state.step), &staged, optimizer))
        .and_then(|()| dpo_base::checksums::write(&staged, checksummed).map_err(io(&staged)))
        .and_then(|()| replace_dir(&staged, &dest).map_err(io(&dest)));
    if let Err(err) = written {
        // A failed save (a full disk) leaves nothing half-written behind, the ranks' slices
        // included; the previous checkpoints are untouched.
        let _ = std::fs::remove_dir_all(&staged);
        let _ = std::fs::remove_dir_all(slices_dir(run_dir, state.step));
        return Err(err);
    }
    if let Some(keep) = keep {
        let all = list(run_dir);
        for (_, old) in all.iter().take(all.len().saturating_sub(keep)) {
            std::fs::remove_dir_all(old).map_err(io(old))?;
        }
    }
    Ok(dest)
}

/// The files of a checkpoint its checksums cover: the tensors and the trainer state, which a
/// resume reads as they are (the config and tokenizer files stay the user's to edit).
fn checksummed(name: &str) -> bool {
    name.ends_with(".safetensors") || name == STATE_FILE
}

/// What a checkpoint keeps beside the model and the optimizer state.
#[derive(Debug, Clone, Copy)]
pub struct Beside<'a> {
    /// The run's effective config, which a resume continues with.
    pub config_toml: &'a str,
    /// Where the tokenizer's files are copied from: with them, a checkpoint evaluates, samples and
    /// loads as a model directory, as `final/` and the checkpoints of transformers' Trainer do.
    pub tokenizer_dir: &'a Path,
}

/// Every file of a checkpoint, into the staging directory `dir`.
fn write_checkpoint(
    dir: &Path,
    model: &Llama,
    files: ModelFiles,
    optimizer: &AdamW,
    state: &TrainerState,
    beside: Beside,
) -> Result<(), CheckpointError> {
    let io = |source| CheckpointError::Write { path: dir.to_owned(), source };
    std::fs::create_dir_all(dir).map_err(io)?;
    write_model_dir(dir, model, files)?;
    copy_tokenizer(beside.tokenizer_dir, dir)?;
    match optimizer.shard {
        None => save_safetensors(&dir.join(OPTIMIZER_FILE), &moment_tensors(optimizer))?,
        Some((_, world_size)) => {
            // The slices come from every rank (`save_slices`); the lengths say how to join them.
            let mut lens = std::collections::BTreeMap::new();
            crate::model::params::visit(model, None, |p| {
                if optimizer.moments.contains_key(&p.name) {
                    lens.insert(p.name, p.dims.iter().product());
                }
            });
            let json = serde_json::to_vec_pretty(&ShardsFile { world_size, lens }).map_err(|e| io(e.into()))?;
            write_atomic(&dir.join(SHARDS_FILE), &json).map_err(io)?;
        }
    }
    let full_state = StateFile { trainer: state.clone(), optimizer_step: optimizer.step };
    let json = serde_json::to_vec_pretty(&full_state).map_err(|e| io(e.into()))?;
    write_atomic(&dir.join(STATE_FILE), &json).map_err(io)?;
    write_atomic(&dir.join("config.toml"), beside.config_toml.as_bytes()).map_err(io)
}

/// Copies the tokenizer's files that `from` has into the model directory `dir`.
fn copy_tokenizer(from: &Path, dir: &Path) -> Result<(), CheckpointError> {
    for file in ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"] {
        let (src, dest) = (from.join(file), dir.join(file));
        if src.is_file() {
            std::fs::copy(&src, &dest).map_err(|source| CheckpointError::Write { path: dest, source })?;
        }
    }
    Ok(())
}

/// Moves every rank's slice file into the staged checkpoint (ZeRO), checking none is missing.
fn move_slices(from: &Path, staged: &Path, optimizer: &AdamW) -> Result<(), CheckpointError> {
    let Some((_, world)) = optimizer.shard else { return Ok(()) };
    for rank in 0..world {
        let (src, dest) = (from.join(slice_file(rank, world)), staged.join(slice_file(rank, world)));
        std::fs::rename(&src, &dest).map_err(|source| CheckpointError::Write { path: src.clone(), source })?;
    }
    std::fs::remove_dir(from).map_err(|source| CheckpointError::Write { path: from.to_owned(), source })
}

/// Writes an HF model directory (`config.json` and `model.safetensors`, f32) or a PEFT adapter
/// directory.
pub fn write_model_dir(dir: &Path, model: &Llama, files: ModelFiles) -> Result<(), CheckpointError> {
    let io = |source| CheckpointError::Write { path: dir.to_owned(), source };
    std::fs::create_dir_all(dir).map_err(io)?;
    match files {
        ModelFiles::Full { config_json, base } => {
            write_atomic(&dir.join("config.json"), model::hf::export_config(config_json).as_bytes()).map_err(io)?;
            let kept = base.map(|b| b.join(GENERATION_CONFIG)).filter(|p| p.is_file());
            if let Some(src) = kept.filter(|src| *src != dir.join(GENERATION_CONFIG)) {
                let dest = dir.join(GENERATION_CONFIG);
                std::fs::copy(&src, &dest).map_err(|source| CheckpointError::Write { path: dest, source })?;
            }
            save_safetensors(&dir.join("model.safetensors"), &model::hf::export_tensors(model))?;
        }
        ModelFiles::Adapter { settings, base } => {
            model::lora::save_adapter(dir, model, settings, &base.display().to_string())?;
        }
    }
    Ok(())
}

/// Writes `final/`: an HF model (or PEFT adapter) directory with the tokenizer files, atomically.
pub fn export_final(final_dir: &Path, model: &Llama, files: ModelFiles, tokenizer_dir: &Path) -> anyhow::Result<()> {
    let staged = final_dir.with_extension("partial");
    if staged.exists() {
        std::fs::remove_dir_all(&staged).with_context(|| format!("cannot remove `{}`", staged.display()))?;
    }
    let written = (|| -> anyhow::Result<()> {
        write_model_dir(&staged, model, files)?;
        copy_tokenizer(tokenizer_dir, &staged)?;
        crate::fsutil::replace_dir(&staged, final_dir)
            .with_context(|| format!("cannot write `{}`", final_dir.display()))
    })();
    if written.is_err() {
        // Nothing half-written stays behind.
        let _ = std::fs::remove_dir_all(&staged);
    }
    written
}

/// The files of which one makes a directory a model: a full model's, or a PEFT adapter's.
const MODEL_FILES: [&str; 2] = ["model.safetensors", "adapter_model.safetensors"];

/// The model file `dir` holds, if any.
pub fn model_file(dir: &Path) -> Option<PathBuf> {
    MODEL_FILES.iter().map(|f| dir.join(f)).find(|p| p.is_file())
}

/// Whether the stage's `final/` (and `final/merged/` with `merged`) was written from the
/// checkpoint `ckpt`, that is after it: a checkpoint written later (a resume that trained on and
/// died before its export) makes `final/` stale. Without a checkpoint (`save_strategy = "no"`
/// writes none), whether `final/` was written at all.
pub fn final_is_current(stage_dir: &Path, ckpt: Option<&Path>, merged: bool) -> bool {
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let saved = match ckpt.map(|c| modified(&c.join(STATE_FILE))) {
        Some(None) => return false,
        Some(Some(saved)) => Some(saved),
        None => None,
    };
    let final_dir = stage_dir.join("final");
    let written =
        |dir: &Path| model_file(dir).and_then(|f| modified(&f)).is_some_and(|t| saved.is_none_or(|saved| t >= saved));
    written(&final_dir) && (!merged || written(&final_dir.join("merged")))
}

/// Removes what writers that died left in a stage's directory `dir` (the run's, or its `sft/`):
/// staged checkpoints (`checkpoints/.step-N.partial`), ranks' slices (`.step-N.shards`),
/// directories moved aside (`*.old-PID`), a staged `final.partial` and temporary files. Called by
/// the run that holds the directory, before it writes: nothing of a live writer is there.
pub fn remove_staging(dir: &Path) -> Vec<PathBuf> {
    let stale = |name: &str| {
        (name.starts_with(".step-") && (name.ends_with(".partial") || name.ends_with(".shards")))
            || name == "final.partial"
            || name.rsplit_once(".old-").is_some_and(|(_, pid)| pid.parse::<u32>().is_ok())
    };
    let mut removed = Vec::new();
    for folder in [dir.to_path_buf(), dir.join("checkpoints")] {
        removed.extend(crate::fsutil::remove_stale_temps(&folder));
        let Ok(entries) = std::fs::read_dir(&folder) else { continue };
        for entry in entries.flatten() {
            let path = entry.path();
            if stale(&entry.file_name().to_string_lossy()) && std::fs::remove_dir_all(&path).is_ok() {
                removed.push(path);
            }
        }
    }
    removed
}

/// Complete checkpoints of a run, oldest first.
pub fn list(run_dir: &Path) -> Vec<(u64, PathBuf)> {
    let Ok(entries) = std::fs::read_dir(run_dir.join("checkpoints")) else { return Vec::new() };
    let mut found: Vec<(u64, PathBuf)> = entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let path = e.path();
            let step = step_of(&path)?;
            path.join(STATE_FILE).is_file().then_some((step, path))
        })
        .collect();
    found.sort();
    found
}

/// N of a checkpoint directory `.../step-N`.
pub fn step_of(path: &Path) -> Option<u64> {
    path.file_name()?.to_str()?.strip_prefix("step-")?.parse().ok()
}

/// The newest complete checkpoint of a run.
pub fn latest(run_dir: &Path) -> Option<PathBuf> {
    list(run_dir).pop().map(|(_, path)| path)
}

/// Whether a stage's directory holds a model that training there from step 0 would write over:
/// a checkpoint, or its `final/` (a finished stage's, which may have kept no checkpoint).
pub fn holds_a_model(stage_dir: &Path) -> bool {
    stage_dir.join("final").exists() || latest(stage_dir).is_some()
}

/// A checkpoint's directory named where a run is expected (`--resume`, as TRL's
/// `resume_from_checkpoint` takes one): `RUN/checkpoints/step-N`, or the warm-up stage's
/// `RUN/<warm-up>/checkpoints/step-N`.
#[derive(Debug, Clone, PartialEq)]
pub struct Named {
    pub run_dir: PathBuf,
    /// The directory of the stage that wrote it (the run's, or the warm-up's inside it).
    pub stage_dir: PathBuf,
    pub step: u64,
}

impl Named {
    /// `None` where `path` is not a complete checkpoint in a `checkpoints/` folder; `warm_up`
    /// names the warm-up stage's directory inside a run.
    pub fn of(path: &Path, warm_up: &str) -> Option<Self> {
        let step = step_of(path)?;
        let checkpoints = path.parent()?;
        if checkpoints.file_name()? != "checkpoints" || !path.join(STATE_FILE).is_file() {
            return None;
        }
        let stage_dir = checkpoints.parent()?.to_owned();
        let run_dir = match stage_dir.parent() {
            Some(run) if stage_dir.file_name()? == warm_up && run.join("config.toml").is_file() => run.to_owned(),
            _ => stage_dir.clone(),
        };
        Some(Self { run_dir, stage_dir, step })
    }

    /// What a resume of the run would continue from rather than this checkpoint: the stage's
    /// later checkpoints, and after a warm-up's, its `final/` and the run's own checkpoints.
    pub fn newer(&self) -> Vec<PathBuf> {
        let mut newer: Vec<PathBuf> =
            list(&self.stage_dir).into_iter().filter(|(step, _)| *step > self.step).map(|(_, p)| p).collect();
        if self.stage_dir != self.run_dir {
            newer.extend(Some(self.stage_dir.join("final")).filter(|f| f.is_dir()));
            newer.extend(list(&self.run_dir).into_iter().map(|(_, p)| p));
        }
        newer
    }
}

/// `error`, met resuming from `ckpt`, with the way out where its stage has an older checkpoint:
/// moved out of `checkpoints/`, this one no longer stops a resume from the previous one.
pub fn resume_failed(error: anyhow::Error, ckpt: &Path) -> anyhow::Error {
    let (Some(step), Some(folder), Some(name)) = (step_of(ckpt), ckpt.parent(), ckpt.file_name()) else {
        return error;
    };
    let older = list(folder.parent().unwrap_or(folder)).into_iter().rev().find(|(s, _)| *s < step);
    let Some((previous, _)) = older else { return error };
    error.context(format!(
        "cannot resume from `{}` (move `{}` out of `{}` to resume from step-{previous})",
        ckpt.display(),
        name.to_string_lossy(),
        folder.display()
    ))
}

#[derive(Serialize, Deserialize)]
struct StateFile {
    trainer: TrainerState,
    optimizer_step: u64,
}

fn read_state_file(dir: &Path) -> Result<StateFile, CheckpointError> {
    let corrupt = |message: String| CheckpointError::Corrupt { path: dir.to_owned(), message };
    let text = std::fs::read_to_string(dir.join(STATE_FILE)).map_err(|e| corrupt(format!("{STATE_FILE}: {e}")))?;
    dpo_base::checksums::check(&dir.join(STATE_FILE), text.as_bytes()).map_err(WeightsError::from)?;
    serde_json::from_str(&text).map_err(|e| corrupt(format!("{STATE_FILE}: {e}")))
}

/// A checkpoint's trainer state alone (no tensors): what a resume checks before anything loads.
pub fn trainer_state(dir: &Path) -> Result<TrainerState, CheckpointError> {
    Ok(read_state_file(dir)?.trainer)
}

/// Reads a checkpoint's trainer and optimizer state onto `device` (the model loads through
/// [`model::load`] from the same directory), the moments in the layout of the resumed run:
/// whole parameters, or this rank's slices (`shard` = `(rank, world_size)`, ZeRO). Either kind
/// of checkpoint loads into either layout, one parameter at a time.
pub fn load_state(dir: &Path, device: &Device, shard: Option<(usize, usize)>) -> Result<Saved, CheckpointError> {
    let corrupt = |message: String| CheckpointError::Corrupt { path: dir.to_owned(), message };
    let file = read_state_file(dir)?;
    let mut optimizer = AdamW { step: file.optimizer_step, shard, ..Default::default() };
    let layout = |whole: Vec<f32>| {
        let n = whole.len();
        let t = Tensor::<1>::from_data(TensorData::new(whole, [n]), device);
        // `* 1.0` copies the slice out, so the whole moment's storage is freed at once.
        shard.map_or(t.clone(), |s| super::optim::slice_of(t, s) * 1.0)
    };
    let read_moments = |read: &dyn Fn(&str) -> Result<Vec<f32>, CheckpointError>, param: &str| {
        Ok::<_, CheckpointError>(Moments {
            exp_avg: layout(read(&format!("{param}.exp_avg"))?),
            exp_avg_sq: layout(read(&format!("{param}.exp_avg_sq"))?),
        })
    };
    if dir.join(OPTIMIZER_FILE).is_file() {
        let weights = Weights::open_file(&dir.join(OPTIMIZER_FILE))?;
        let read = |key: &str| Ok(weights.values(key, &[weights.len_of(key).unwrap_or(0)])?);
        for name in weights.names() {
            let Some(param) = name.strip_suffix(".exp_avg") else { continue };
            optimizer.moments.insert(param.to_owned(), read_moments(&read, param)?);
        }
    } else {
        if !dir.join(SHARDS_FILE).is_file() {
            return Err(corrupt(format!("neither {OPTIMIZER_FILE} nor a ZeRO checkpoint's {SHARDS_FILE} is there")));
        }
        let text =
            std::fs::read_to_string(dir.join(SHARDS_FILE)).map_err(|e| corrupt(format!("{SHARDS_FILE}: {e}")))?;
        let layout_file: ShardsFile =
            serde_json::from_str(&text).map_err(|e| corrupt(format!("{SHARDS_FILE}: {e}")))?;
        let world = layout_file.world_size;
        let parts: Vec<Weights> =
            (0..world).map(|r| Weights::open_file(&dir.join(slice_file(r, world)))).collect::<Result<_, _>>()?;
        for (param, &n) in &layout_file.lens {
            // One parameter's slices joined: never more than one whole parameter in memory.
            let read = |key: &str| -> Result<Vec<f32>, CheckpointError> {
                let c = crate::dist::shards::shard_len(n, world);
                // Grown as the slices are read: a corrupt length fails the first slice's shape
                // check, where reserving `c * world` first would abort on the allocation.
                let mut whole = Vec::new();
                for part in &parts {
                    whole.extend(part.values(key, &[c])?);
                }
                whole.truncate(n);
                Ok(whole)
            };
            optimizer.moments.insert(param.clone(), read_moments(&read, param)?);
        }
    }
    Ok(Saved { state: file.trainer, optimizer })
}
