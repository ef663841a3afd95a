//! `dpo-train eval`: the DPO loss and metrics of a policy against a reference over a whole
//! preference dataset, as TRL's `DPOTrainer.evaluate` reports them.
//!
//! Per-pair scores are collected on the host and the loss is computed once over the full set
//! (padding never reaches a score); each metric is the mean of its values over the batches of
//! `metrics_batch` pairs, in order, as TRL averages what each evaluation batch logged. KTO's KL
//! rows pair each prompt with another completion of its block of `batch_size` rows, as TRL forms
//! them within each per-device batch.

use std::path::{Path, PathBuf};

use anyhow::Context;
use burn::tensor::Device;

use crate::config::LossConfig;
use crate::data::{
    self, Columns, LoadOptions, Packing, Prepared, RowKind, SkippedRow, TokenizeReport, TokenizedPair, Tokenizer,
    Truncation,
};
use crate::dpo::logps::{Collation, RefLogps};
use crate::dpo::metrics::Metrics;
use crate::dpo::score::metrics_of;
use crate::model::{self, Llama, compat};
use crate::train::Workers;
use crate::train::references::{reference_logps_over, scores_over};

/// Inputs that cannot be evaluated together.
#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    #[error("`batch_size` must be at least 1")]
    BatchSize,
}

/// What to evaluate and how.
#[derive(Debug, Clone)]
pub struct EvalOptions {
    /// The policy's Hugging Face directory.
    pub model: PathBuf,
    /// The reference's directory; the policy itself when `None`.
    pub ref_model: Option<PathBuf>,
    /// Where `tokenizer.json` lives; the policy's directory when `None`.
    pub tokenizer: Option<PathBuf>,
    /// The preference dataset: a file, or a dataset directory.
    pub data: PathBuf,
    pub columns: Columns,
    pub skip_bad_rows: bool,
    /// The split of a dataset directory (`None`: `train`).
    pub split: Option<String>,
    /// The configuration of a dataset directory's card (`None`: its default).
    pub config: Option<String>,
    pub loss: LossConfig,
    /// Tokens kept per sequence (prompt + completion), TRL's `max_length`, and which of them
    /// (`truncation_mode`): use the model's training settings.
    pub truncation: Truncation,
    /// Pairs per forward pass (on each worker).
    pub batch_size: usize,
    /// The batches TRL's metrics are means over (`per_device_eval_batch_size` on every worker):
    /// each metric is the mean of its value over every such batch of the dataset, in order, as
    /// TRL's `log` averages each batch's; `None`: `batch_size` times the workers. The loss is over
    /// every pair either way.
    pub metrics_batch: Option<usize>,
    /// How a pass lays out its sequences (the numbers do not depend on it).
    pub packing: Packing,
    pub device: Device,
}

/// The metrics and how the dataset was read.
#[derive(Debug, Clone)]
pub struct EvalReport {
    pub metrics: Metrics,
    pub pairs: usize,
    /// Bad rows skipped (with `skip_bad_rows`).
    pub skipped: Vec<SkippedRow>,
    pub tokenize: TokenizeReport,
}

/// Loads the models, tokenizer and data, then scores every pair, in this process alone.
pub fn evaluate(opts: &EvalOptions) -> anyhow::Result<EvalReport> {
    evaluate_showing(opts, check_models(opts)?, Workers::single(), &mut |_, _| {})
}

/// [`evaluate`] of the models `checked` read, over `workers`, each scoring its shard of the pairs
/// (every one reads the data and loads the models), telling `reading` the bytes of the data read
/// so far and in all. Every worker returns the whole set's report.
pub fn evaluate_showing(
    opts: &EvalOptions,
    checked: Checked,
    workers: Workers,
    reading: &mut dyn FnMut(u64, u64),
) -> anyhow::Result<EvalReport> {
    opts.loss.validate().context("invalid loss settings")?;
    if opts.batch_size == 0 {
        return Err(EvalError::BatchSize.into());
    }
    // Every check that reads only config.json and the data runs before a weight is loaded.
    let Checked { tokenizer, policy_cfg, ref_cfg } = checked;
    let read = LoadOptions {
        columns: opts.columns.clone(),
        skip_bad_rows: opts.skip_bad_rows,
        split: opts.split.clone(),
        config: opts.config.clone(),
        rows: RowKind::of(&opts.loss),
    };
    let Prepared { mut pairs, summary } =
        data::prepare(&opts.data, &read, &tokenizer, opts.truncation, Default::default(), reading)?;
    if opts.loss.kl_rows() {
        // KTO's KL rows rotate within blocks of the batch size (TRL's per-device batch).
        pairs = data::kto::with_kl(&pairs, opts.batch_size, opts.truncation.max_length);
    }
    let longest = pairs
        .iter()
        .map(TokenizedPair::longest)
        .max()
        .unwrap_or(0)
        .min(opts.truncation.max_length.unwrap_or(usize::MAX));
    compat::check_length(&policy_cfg, &opts.model, longest, &opts.data)?;
    if let Some((dir, ref_cfg)) = &ref_cfg {
        compat::check_length(ref_cfg, dir, longest, &opts.data)?;
    }

    let policy = load(&opts.model, &opts.device)?;
    let reference = match &ref_cfg {
        Some((dir, _)) => Some(load(dir, &opts.device)?),
        None => None,
    };
    // Without `--ref-model` the reference is an adapter's base with the adapter switched off (as
    // TRL does for a PEFT policy), or else the policy itself (every log-ratio is 0).
    let base = (reference.is_none() && policy.has_lora()).then(|| policy.clone().without_lora());
    let reference: Option<&Llama> = match (reference.as_ref().or(base.as_ref()), opts.loss.needs_reference()) {
        (_, false) => None,
        (Some(r), true) => Some(r),
        (None, true) => Some(&policy),
    };

    let collation = Collation {
        batch_size: opts.batch_size,
        pad_id: tokenizer.pad_id(),
        truncation: opts.truncation,
        ld_alpha: opts.loss.ld_alpha,
        packing: opts.packing,
    };
    // Never stopped, so always scored.
    let on = (workers, &opts.device);
    let ref_logps = match reference {
        Some(r) => reference_logps_over(r, &pairs, &collation, on, None)?.unwrap_or_default(),
        None => RefLogps::zeros(pairs.len()),
    };
    let scored = scores_over(&policy, &pairs, &ref_logps, &collation, on, None)?.unwrap_or_default();
    // TRL's evaluation step: a per-device batch on every worker, gathered.
    let per_batch = opts.metrics_batch.unwrap_or(opts.batch_size * workers.world_size());
    let metrics = metrics_of(&scored, &opts.loss, per_batch, &opts.device);
    Ok(EvalReport { metrics, pairs: pairs.len(), skipped: summary.read.skipped, tokenize: summary.tokenized })
}

/// The tokenizer and the models' configs, checked together.
pub struct Checked {
    tokenizer: Tokenizer,
    policy_cfg: model::LlamaConfig,
    /// The reference's directory and config, where the loss takes one and it is not the policy.
    ref_cfg: Option<(PathBuf, model::LlamaConfig)>,
}

/// Reads the tokenizer and the models' `config.json` and checks them together, no weight and no
/// data read: what a launcher checks before it starts the workers.
pub fn check_models(opts: &EvalOptions) -> anyhow::Result<Checked> {
    let tokenizer_dir = match &opts.tokenizer {
        Some(dir) => dir.clone(),
        None => model::tokenizer_dir(&opts.model)?,
    };
    let tokenizer = Tokenizer::from_dir(&tokenizer_dir)?;
    let policy_cfg = checked_config(&opts.model, &tokenizer)?;
    let ref_cfg = match (&opts.ref_model, !opts.loss.needs_reference()) {
        (Some(dir), false) => {
            let ref_cfg = checked_config(dir, &tokenizer)?;
            compat::check_reference((&opts.model, &policy_cfg), (dir, &ref_cfg))?;
            Some((dir.clone(), ref_cfg))
        }
        _ => None,
    };
    Ok(Checked { tokenizer, policy_cfg, ref_cfg })
}

/// The resolved config of the model in `dir`, checked to embed every id of the tokenizer.
fn checked_config(dir: &Path, tokenizer: &Tokenizer) -> anyhow::Result<model::LlamaConfig> {
    let cfg = model::load_config(dir).with_context(|| format!("cannot load the model in `{}`", dir.display()))?;
    compat::check_vocab(&cfg, dir, tokenizer.vocab_size())?;
    Ok(cfg)
}

fn load(dir: &Path, device: &Device) -> anyhow::Result<Llama> {
    Ok(model::load(dir, device).with_context(|| format!("cannot load the model in `{}`", dir.display()))?.1)
}
