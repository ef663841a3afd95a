//! A run's inputs, checked before anything is written: the models against the tokenizer and each
//! other, and each split of the data read and tokenised once, or read back from the cache a
//! launcher, another rank or an earlier attempt of the run left in `<output_dir>/.data_cache/`.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use anyhow::Context;

use crate::config::{RunPlan, TrainConfig};
use crate::data::tokenizer::Tokenizer;
use crate::data::{
    self, Columns, DataReport, LoadOptions, Prepared, ReportInput, RowKind, TokenizeControl, TokenizedPair, Truncation,
    cache, cache::Loaded,
};
use crate::demo::{DEMO, DemoAssets};
use crate::model::{self, compat};
use crate::train::{Progress, RunData};

/// What [`load_inputs`] found.
pub(super) struct Inputs {
    pub model_dir: PathBuf,
    pub data: RunData,
    pub reports: DataReports,
    /// Lines to print once the config is shown (notes, the data reports).
    pub notes: Vec<String>,
}

/// `data_report.json`: what each split of the run's data became before the first step.
#[derive(serde::Serialize)]
pub(super) struct DataReports {
    train: Option<DataReport>,
    eval: Option<DataReport>,
    test: Option<DataReport>,
}

/// A resume's note where the training data read now is not what the run's `data_report.json`
/// says it started on (a file edited or replaced under the same name): its counts, lengths or
/// token ids differ. The steps draw their pairs from the data as it is, so some are seen twice or never.
pub(super) fn data_changed_note(saved: &str, now: &str) -> Option<String> {
    let (saved, now): (serde_json::Value, serde_json::Value) =
        (serde_json::from_str(saved).ok()?, serde_json::from_str(now).ok()?);
    let (saved, now) = (&saved["train"], &now["train"]);
    let changed: Vec<String> = ["rows_read", "pairs_kept", "tokens", "ids_crc32c"]
        .into_iter()
        .filter(|key| saved.get(key).is_some() && saved[key] != now[key])
        .map(|key| match key {
            "tokens" => "its token lengths".to_owned(),
            "ids_crc32c" => "its token ids".to_owned(),
            _ => format!("{key} {} -> {}", saved[key], now[key]),
        })
        .collect();
    (!changed.is_empty()).then(|| {
        format!(
            "warning: the training data is not what this run started on ({}): the resumed steps draw their pairs from it as it is now, so some pairs are seen twice or never",
            changed.join(", ")
        )
    })
}

/// One split of a run's data: its file (`None` when the run has none), the split of a dataset
/// directory, the micro-batch its padding is measured at, and the demo's file for it.
struct Split<'a> {
    file: Option<&'a String>,
    name: &'a str,
    micro_batch: usize,
    demo: fn(&DemoAssets) -> &PathBuf,
}

fn splits(cfg: &TrainConfig) -> [Split<'_>; 3] {
    let (train_split, test_split) = (cfg.dataset_train_split.as_str(), cfg.dataset_test_split.as_str());
    let (train_mb, eval_mb) = (cfg.per_device_train_batch_size, cfg.per_device_eval_batch_size);
    [
        Split { file: Some(&cfg.train_file), name: train_split, micro_batch: train_mb, demo: |a| &a.train },
        Split { file: cfg.eval_file.as_ref(), name: test_split, micro_batch: eval_mb, demo: |a| &a.val },
        Split { file: cfg.test_file.as_ref(), name: test_split, micro_batch: eval_mb, demo: |a| &a.test },
    ]
}

/// Tokenises every split of the run's data into the cache unless it is there already: a launcher
/// does this before it starts the workers, and a worker started by another launcher (torchrun,
/// SLURM) before the rendezvous, so no rank waits at a collective while another tokenises. The
/// demo's data is built in the run directory and is skipped.
/// A run the workers would refuse for its run directory (one that already holds a run, none to
/// resume) is refused here first, before any tokenising.
/// Ctrl-C (`interrupt`) stops the tokenising with [`data::DataError::Interrupted`].
pub fn warm_data_cache(
    cfg: &TrainConfig,
    plan: &RunPlan,
    (resume, config_name): (Option<&Option<PathBuf>>, &str),
    interrupt: &AtomicBool,
    progress: &mut dyn Progress,
) -> anyhow::Result<()> {
    super::run_dir(cfg, resume, config_name)?;
    let demo = cfg.model_name_or_path == DEMO || splits(cfg).iter().any(|s| s.file.is_some_and(|f| f == DEMO));
    if !demo {
        load_inputs(cfg, plan.truncation, None, interrupt, progress)?;
    }
    Ok(())
}

/// The starting model's directory and the tokenised data, every model checked against the
/// tokenizer, each other and the data's lengths. Ctrl-C (`interrupt`) stops the tokenising before
/// any cache entry is written ([`data::DataError::Interrupted`]).
pub(super) fn load_inputs(
    cfg: &TrainConfig,
    truncation: Truncation,
    demo_assets: Option<&DemoAssets>,
    interrupt: &AtomicBool,
    progress: &mut dyn Progress,
) -> anyhow::Result<Inputs> {
    let model_dir = match (cfg.model_name_or_path.as_str(), demo_assets) {
        (DEMO, Some(a)) => a.model_dir.clone(),
        (path, _) => PathBuf::from(path),
    };
    if !model_dir.is_dir() {
        let message = format!("`{}` is not a model directory (it does not exist or is a file)", model_dir.display());
        anyhow::bail!(crate::config::ConfigError::Invalid { key: "model_name_or_path", message });
    }
    let tokenizer_dir = match &cfg.tokenizer_name_or_path {
        Some(dir) => dir.clone(),
        None => model::tokenizer_dir(&model_dir)?,
    };
    let tokenizer = Tokenizer::from_dir(&tokenizer_dir)?;
    let models = check_models(&model_dir, cfg.ref_model_name_or_path.as_deref(), &tokenizer)?;
    let mut notes = Vec::new();
    if let (Some(note), None) = (compat::spare_rows_note(&models[0].1, &model_dir, tokenizer.vocab_size()), demo_assets)
    {
        notes.push(format!("note: {note}"));
    }
    // Every split is read and checked before any cache entry is written: a refused run leaves
    // nothing behind.
    let mut prepared: [Option<(PathBuf, Prepared, Option<PathBuf>)>; 3] = Default::default();
    for (i, (slot, split)) in prepared.iter_mut().zip(splits(cfg)).enumerate() {
        let path = match (split.file.map(String::as_str), demo_assets) {
            (None, _) => continue,
            (Some(DEMO), Some(a)) => (split.demo)(a).clone(),
            (Some(path), _) => PathBuf::from(path),
        };
        let (data, store, split_notes) =
            prepare_split(&path, split.name, (cfg, truncation), (&tokenizer, &tokenizer_dir), interrupt, progress)?;
        if cfg.loss.is_kto() && i == 0 {
            data::kto::check_labels(&data.pairs).map_err(|e| e.in_file(&path))?;
        }
        notes.extend(split_notes);
        // Collation cuts every sequence to `max_length` (KTO's rows keep longer completions to lend).
        let longest = data.pairs.iter().map(TokenizedPair::longest).max().unwrap_or(0).min(cfg.max_length);
        for (dir, model_cfg) in &models {
            compat::check_length(model_cfg, dir, longest, &path)?;
        }
        *slot = Some((path, data, store));
    }
    let mut pairs: [Vec<TokenizedPair>; 3] = Default::default();
    let mut reports: [Option<DataReport>; 3] = Default::default();
    for (i, (split, slot)) in splits(cfg).into_iter().zip(prepared).enumerate() {
        let Some((path, data, store)) = slot else { continue };
        if let Some(Err(e)) = store.as_deref().map(|entry| cache::store(entry, &data)) {
            // The run does not need the cache; only the next start is slower.
            notes.push(format!("warning: cannot write the data cache under `{}`: {e}", cfg.output_dir.display()));
        }
        let report = DataReport::new(&ReportInput {
            source: path.display().to_string(),
            split: path.is_dir().then(|| split.name.to_owned()),
            summary: &data.summary,
            pairs: &data.pairs,
            tokenizer: &tokenizer,
            max_length: Some(cfg.max_length),
            micro_batch: split.micro_batch,
            kto_weights: (cfg.loss.is_kto() && i == 0)
                .then_some([cfg.loss.desirable_weight, cfg.loss.undesirable_weight]),
            kl_rows: cfg.loss.kl_rows(),
        });
        notes.extend(report.lines());
        (pairs[i], reports[i]) = (data.pairs, Some(report));
    }
    let [train, mut eval, mut test] = pairs;
    if cfg.loss.kl_rows() {
        // Evaluated rows borrow their KL completions as TRL's `_prepare_dataset` lends them; the
        // training rows borrow from their micro-batch, as it is drawn.
        for split in [&mut eval, &mut test] {
            *split = data::kto::with_kl(split, cfg.per_device_train_batch_size, Some(cfg.max_length));
        }
    }
    let [train_report, eval_report, test_report] = reports;
    let reports = DataReports { train: train_report, eval: eval_report, test: test_report };
    let data = RunData { train, eval, test, tokenizer, tokenizer_dir };
    Ok(Inputs { model_dir, data, reports, notes })
}

/// How `cfg` reads `split` of its data (a dataset directory's; a file is read whole): its
/// columns, whether bad rows are skipped, and the rows its loss trains on.
pub fn read_options(cfg: &TrainConfig, split: &str) -> LoadOptions {
    let columns = Columns {
        prompt: cfg.prompt_column.clone(),
        chosen: cfg.chosen_column.clone(),
        rejected: cfg.rejected_column.clone(),
    };
    let rows = RowKind::of(&cfg.loss);
    let (split, config) = (Some(split.to_owned()), cfg.dataset_config.clone());
    LoadOptions { columns, skip_bad_rows: cfg.skip_bad_rows, split, config, rows }
}

/// One split read and tokenised, or read back from the cache; the cache entry to write once the
/// run is accepted (none for a hit); lines to show: where the pairs came from, the rows
/// `skip_bad_rows` skipped.
fn prepare_split(
    path: &Path,
    split: &str,
    (cfg, truncation): (&TrainConfig, Truncation),
    (tokenizer, tokenizer_dir): (&Tokenizer, &Path),
    interrupt: &AtomicBool,
    progress: &mut dyn Progress,
) -> anyhow::Result<(Prepared, Option<PathBuf>, Vec<String>)> {
    let opts = read_options(cfg, split);
    // No entry when the data cannot be listed or read: `prepare` then says why.
    let cache_dir = cfg.output_dir.join(".data_cache");
    let mut notes: Vec<String> = dpo_base::fsutil::remove_stale_temps(&cache_dir)
        .iter()
        .map(|p| format!("removed `{}`, left by a writer that died", p.display()))
        .collect();
    let entry = cache::entry(&cache_dir, path, &opts, tokenizer_dir, truncation).ok();
    let loaded = entry.as_deref().map_or(Loaded::Missing, |e| cache::load(e, tokenizer.vocab_size()));
    if let (Loaded::Damaged(why), Some(entry)) = (&loaded, &entry) {
        // Never used: removed, tokenised again and stored anew.
        let _ = std::fs::remove_file(entry);
        notes.push(format!("warning: the cache entry `{}` is damaged ({why}): tokenising again", entry.display()));
    }
    let (prepared, store) = match (loaded, entry.as_deref()) {
        (Loaded::Hit(hit), Some(entry)) => {
            notes.push(format!("`{}`: tokenised pairs read from the cache `{}`", path.display(), entry.display()));
            (hit, None)
        }
        _ => {
            let threads = cfg.dataset_num_proc.unwrap_or_else(rayon::current_num_threads);
            let plural = if threads == 1 { "" } else { "s" };
            let label = format!("reading `{}` (tokenising on {threads} thread{plural})", path.display());
            let mut report = |done, total| progress.reading(&label, done, total);
            let ctl = TokenizeControl { threads: cfg.dataset_num_proc, stop: interrupt };
            (data::prepare(path, &opts, tokenizer, truncation, ctl, &mut report)?, entry)
        }
    };
    notes.extend(skipped_note(path, &prepared.summary.read.skipped));
    Ok((prepared, store, notes))
}

/// The rows `skip_bad_rows` skipped, in one line: their lines (rows of Parquet and Arrow files),
/// each shard's under its name where a directory's shards hold them, and the first one's reason.
pub fn skipped_note(path: &Path, skipped: &[data::SkippedRow]) -> Option<String> {
    let first = skipped.first()?;
    let mut groups: Vec<(&Path, Vec<String>)> = Vec::new();
    for s in skipped.iter().take(20) {
        match groups.last_mut().filter(|(f, _)| *f == s.file) {
            Some((_, lines)) => lines.push(s.line.to_string()),
            None => groups.push((&s.file, vec![s.line.to_string()])),
        }
    }
    let more = if skipped.len() > 20 { ", ..." } else { "" };
    let records = |f: &Path| f.extension().is_some_and(|e| e == "parquet" || e == "arrow");
    let at = groups.iter().map(|(file, lines)| {
        let what = if records(file) { "rows" } else { "lines" };
        match file.strip_prefix(path).ok().filter(|r| !r.as_os_str().is_empty()) {
            Some(shard) => format!("`{}` {what} {}", shard.display(), lines.join(", ")),
            None => format!("{what} {}", lines.join(", ")),
        }
    });
    let at = at.collect::<Vec<_>>().join("; ");
    Some(format!("`{}`: skipped {} bad rows ({at}{more}); the first: {}", path.display(), skipped.len(), first.reason))
}

/// The policy's (and an explicit reference's) resolved configs, checked against the tokenizer and
/// each other.
fn check_models(
    model_dir: &Path,
    ref_dir: Option<&Path>,
    tokenizer: &Tokenizer,
) -> anyhow::Result<Vec<(PathBuf, model::LlamaConfig)>> {
    let load = |dir: &Path| -> anyhow::Result<model::LlamaConfig> {
        let context = || format!("cannot load the model in `{}`", dir.display());
        let loaded = model::load_config(dir).with_context(context)?;
        model::check_weights(dir).with_context(context)?;
        compat::check_vocab(&loaded, dir, tokenizer.vocab_size())?;
        Ok(loaded)
    };
    let mut models = vec![(model_dir.to_owned(), load(model_dir)?)];
    if let Some(dir) = ref_dir {
        let reference = load(dir)?;
        compat::check_reference((model_dir, &models[0].1), (dir, &reference))?;
        models.push((dir.to_owned(), reference));
    }
    Ok(models)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skipped_rows_are_named_by_shard_and_by_kind() {
        let row =
            |file: &str, line| data::SkippedRow { file: PathBuf::from(file), line, reason: format!("{file}: {line}") };
        let one = [row("d.jsonl", 3), row("d.jsonl", 9)];
        let note = skipped_note(Path::new("d.jsonl"), &one).unwrap();
        assert_eq!(note, "`d.jsonl`: skipped 2 bad rows (lines 3, 9); the first: d.jsonl: 3");
        let shards = [row("ds/a.arrow", 263), row("ds/a.arrow", 300), row("ds/b.arrow", 23)];
        let note = skipped_note(Path::new("ds"), &shards).unwrap();
        assert!(note.starts_with("`ds`: skipped 3 bad rows (`a.arrow` rows 263, 300; `b.arrow` rows 23); "), "{note}");
        assert!(skipped_note(Path::new("ds"), &[]).is_none());
    }

    #[test]
    fn a_resume_notes_training_data_that_changed() {
        let report = |rows: u64, p50: u64| {
            let tokens = serde_json::json!({ "prompt": { "p50": p50 } });
            serde_json::json!({ "train": { "rows_read": rows, "pairs_kept": rows, "tokens": tokens, "micro_batch": rows } })
                .to_string()
        };
        assert_eq!(data_changed_note(&report(17, 9), &report(17, 9)), None);
        let note = data_changed_note(&report(17, 9), &report(18, 9)).unwrap();
        assert!(
            note.starts_with(
                "warning: the training data is not what this run started on (rows_read 17 -> 18, pairs_kept 17 -> 18)"
            ),
            "{note}"
        );
        assert!(data_changed_note(&report(17, 9), &report(17, 10)).unwrap().contains("(its token lengths)"));
        // An edit that keeps every count and length (a row's words swapped) changes its ids.
        let ids = |crc: &str| serde_json::json!({ "train": { "rows_read": 17, "ids_crc32c": crc } }).to_string();
        assert!(data_changed_note(&ids("0a"), &ids("0b")).unwrap().contains("(its token ids)"));
        assert_eq!(data_changed_note(&ids("0a"), &ids("0a")), None);
        // Nothing to compare with: no note.
        assert_eq!(data_changed_note("{}", &report(17, 9)), None);
    }
}
