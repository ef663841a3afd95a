//! `metrics.csv`: one row per logged training step and per evaluation.
//!
//! Columns, in order: `step, epoch, split`, then the metric names TRL's `DPOTrainer` logs
//! (`trl/trainer/dpo_trainer.py`, `get_batch_loss_metrics`) without the `eval_` prefix, then
//! `learning_rate, grad_norm, pairs_per_second, tokens_per_second, elapsed_seconds`. An empty
//! cell means "not measured" (an SFT run fills only `loss`; eval rows have no `grad_norm`), which
//! is distinct from a measured `NaN`.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use crate::dpo::metrics::Metrics;
use crate::fsutil::FileError;
use crate::tboard::EventWriter;
use crate::wandb::WandbRun;

/// Errors writing or reading a run's log files (`metrics.csv`, the sample files), each naming the
/// file.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// A filesystem operation failed.
    #[error(transparent)]
    Io(#[from] FileError),
    /// The CSV layer failed to read or write a record.
    #[error("`{path}`, line {line}: malformed CSV")]
    Csv {
        path: PathBuf,
        line: u64,
        #[source]
        source: csv::Error,
    },
    /// The first line of an existing `metrics.csv` is not the header this version writes.
    #[error("`{path}`, line 1: not the header of a dpo-train metrics.csv: expected `{expected}`, found `{found}`")]
    Header { path: PathBuf, expected: String, found: String },
    /// A row has the wrong number of fields.
    #[error("`{path}`, line {line}: {found} fields, expected {expected}")]
    FieldCount { path: PathBuf, line: u64, found: usize, expected: usize },
    /// A cell does not parse as its column's type.
    #[error("`{path}`, line {line}: column `{column}`: invalid value `{value}`")]
    Value { path: PathBuf, line: u64, column: &'static str, value: String },
    /// A row handed to [`MetricsWriter::append`] does not carry exactly the TRL metrics.
    #[error("`{path}`: the metrics row of step {step} has {found} metric values, expected {expected}")]
    MetricCount { path: PathBuf, step: u64, found: usize, expected: usize },
}

impl LogError {
    /// A fault of the file read (a missing, foreign or damaged `metrics.csv`: bad input), rather
    /// than of writing one.
    pub fn is_input(&self) -> bool {
        match self {
            Self::Io(e) => e.action == "read",
            Self::Csv { .. } | Self::Header { .. } | Self::FieldCount { .. } | Self::Value { .. } => true,
            Self::MetricCount { .. } => false,
        }
    }

    fn io(action: &'static str, path: &Path, source: std::io::Error) -> Self {
        Self::Io(FileError::new(action, path, source))
    }
}

/// `<path>.tmp`: the name a file is written under before it is renamed into place.
fn tmp_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_os_string();
    name.push(".tmp");
    PathBuf::from(name)
}

/// Writes `bytes` to `path` atomically (see [`crate::fsutil::write_atomic`]).
pub(super) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), LogError> {
    crate::fsutil::write_atomic(path, bytes).map_err(|e| LogError::io("write", path, e))
}

/// TRL's metric names, in column order (columns 4..=19 of `metrics.csv`): DPOTrainer's, then
/// those of KTOTrainer (`kl`) and of CPOTrainer and ORPOTrainer (`nll_loss`, ORPO's log-odds),
/// empty in the rows of other losses.
pub const METRIC_NAMES: [&str; 16] = [
    "loss",
    "rewards/chosen",
    "rewards/rejected",
    "rewards/accuracies",
    "rewards/margins",
    "logps/chosen",
    "logps/rejected",
    "logits/chosen",
    "logits/rejected",
    "entropy",
    "num_tokens",
    "mean_token_accuracy",
    "kl",
    "nll_loss",
    "log_odds_ratio",
    "log_odds_chosen",
];

/// Metric columns files written by earlier versions lack, by the version that added them (their
/// rows read them as empty; a resumed run rewrites the file with them): `mean_token_accuracy`
/// came with TRL 1.16's metrics, the loss families' own later (they were TensorBoard's only).
const ADDED_LATER: [&[&str]; 2] = [&["mean_token_accuracy"], &["kl", "nll_loss", "log_odds_ratio", "log_odds_chosen"]];

/// Columns after the metrics, in order.
const TAIL_COLUMNS: [&str; 5] =
    ["learning_rate", "grad_norm", "pairs_per_second", "tokens_per_second", "elapsed_seconds"];

/// Columns before the metrics, in order.
const HEAD_COLUMNS: [&str; 3] = ["step", "epoch", "split"];

/// Number of columns in `metrics.csv`.
const N_COLUMNS: usize = HEAD_COLUMNS.len() + METRIC_NAMES.len() + TAIL_COLUMNS.len();

/// The file name inside a run directory.
pub const METRICS_FILE: &str = "metrics.csv";

/// All column names, in order.
fn header() -> Vec<&'static str> {
    HEAD_COLUMNS.iter().chain(METRIC_NAMES.iter()).chain(TAIL_COLUMNS.iter()).copied().collect()
}

/// Which data a row was measured on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Split {
    /// A logged training step (metrics averaged over the steps since the last log).
    Train,
    /// An evaluation pass over the held-out set.
    Eval,
}

impl Split {
    /// The CSV spelling: `train` or `eval`.
    pub fn as_str(self) -> &'static str {
        match self {
            Split::Train => "train",
            Split::Eval => "eval",
        }
    }
}

/// One row of `metrics.csv`.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricsRow {
    /// Optimizer step the row was logged at.
    pub step: u64,
    /// Fractional epoch at that step.
    pub epoch: f64,
    pub split: Split,
    /// The TRL metrics, in [`METRIC_NAMES`] order; `None` is an empty cell.
    pub metrics: Vec<Option<f64>>,
    pub learning_rate: Option<f64>,
    pub grad_norm: Option<f64>,
    pub pairs_per_second: Option<f64>,
    pub tokens_per_second: Option<f64>,
    /// Wall-clock seconds since the run (or its first resume) started.
    pub elapsed_seconds: f64,
}

impl MetricsRow {
    /// A row with every optional value absent.
    pub fn empty(step: u64, epoch: f64, split: Split, elapsed_seconds: f64) -> Self {
        Self {
            step,
            epoch,
            split,
            metrics: vec![None; METRIC_NAMES.len()],
            learning_rate: None,
            grad_norm: None,
            pairs_per_second: None,
            tokens_per_second: None,
            elapsed_seconds,
        }
    }

    /// The value of the TRL metric `name` (one of [`METRIC_NAMES`]), if present.
    pub fn metric(&self, name: &str) -> Option<f64> {
        let index = METRIC_NAMES.iter().position(|n| *n == name)?;
        self.metrics.get(index).copied().flatten()
    }

    /// Records evaluated or logged metrics: DPOTrainer's, and the loss family's own.
    pub fn record(&mut self, metrics: &Metrics) {
        for (name, value) in metrics.named().into_iter().chain(metrics.extra()) {
            self.set_metric(name, value);
        }
    }

    /// Sets the TRL metric `name`; returns `false` (and changes nothing) for an unknown name.
    pub fn set_metric(&mut self, name: &str, value: f64) -> bool {
        match METRIC_NAMES.iter().position(|n| *n == name) {
            Some(index) => {
                if self.metrics.len() < METRIC_NAMES.len() {
                    self.metrics.resize(METRIC_NAMES.len(), None);
                }
                self.metrics[index] = Some(value);
                true
            }
            None => false,
        }
    }

    /// The row's values under the names transformers' `TensorBoardCallback` and `WandbCallback`
    /// give them (`train/loss`, `eval/rewards/margins`, `train/learning_rate`, `train/grad_norm`,
    /// `train/epoch`, on eval rows too), and the speed columns under the split's (`train/pairs_per_second`,
    /// `eval/elapsed_seconds`, ...), the values it lacks left out.
    pub fn tagged(&self) -> Vec<(String, f64)> {
        let split = self.split.as_str();
        let named = METRIC_NAMES.iter().zip(&self.metrics).map(|(name, v)| (format!("{split}/{name}"), *v));
        let train_only = [("learning_rate", self.learning_rate), ("grad_norm", self.grad_norm)];
        let train_only = train_only.into_iter().filter(|_| self.split == Split::Train);
        // transformers' `Trainer.log` adds the epoch to every log, eval's too, under `train/`.
        let extra = train_only.chain([("epoch", Some(self.epoch))]).map(|(n, v)| (format!("train/{n}"), v));
        let speed = [
            ("pairs_per_second", self.pairs_per_second),
            ("tokens_per_second", self.tokens_per_second),
            ("elapsed_seconds", Some(self.elapsed_seconds)),
        ];
        let speed = speed.into_iter().map(|(n, v)| (format!("{split}/{n}"), v));
        named.chain(extra).chain(speed).filter_map(|(tag, v)| Some((tag, v?))).collect()
    }

    /// The row as CSV cells, in column order.
    fn to_record(&self) -> Vec<String> {
        let mut cells = Vec::with_capacity(N_COLUMNS);
        cells.push(self.step.to_string());
        cells.push(format_f64(self.epoch));
        cells.push(self.split.as_str().to_string());
        cells.extend(self.metrics.iter().map(|v| format_opt(*v)));
        for v in [self.learning_rate, self.grad_norm, self.pairs_per_second, self.tokens_per_second] {
            cells.push(format_opt(v));
        }
        cells.push(format_f64(self.elapsed_seconds));
        cells
    }

    /// Parses one record of a file whose header is `names` ([`check_header`]); `line` is only
    /// used in errors.
    fn from_record(
        record: &csv::StringRecord,
        names: &[&'static str],
        path: &Path,
        line: u64,
    ) -> Result<Self, LogError> {
        if record.len() != names.len() {
            return Err(LogError::FieldCount {
                path: path.to_path_buf(),
                line,
                found: record.len(),
                expected: names.len(),
            });
        }
        let bad = |i: usize| LogError::Value {
            path: path.to_path_buf(),
            line,
            column: names[i],
            value: record[i].to_string(),
        };
        let opt = |i: usize| -> Result<Option<f64>, LogError> {
            let cell = record[i].trim();
            if cell.is_empty() { Ok(None) } else { cell.parse::<f64>().map(Some).map_err(|_| bad(i)) }
        };
        let req = |i: usize| -> Result<f64, LogError> { opt(i)?.ok_or_else(|| bad(i)) };

        let step = record[0].trim().parse::<u64>().map_err(|_| bad(0))?;
        let epoch = req(1)?;
        let split = match record[2].trim() {
            "train" => Split::Train,
            "eval" => Split::Eval,
            _ => return Err(bad(2)),
        };
        let first_tail = names.len() - TAIL_COLUMNS.len();
        let column = |name: &str| names.iter().position(|n| *n == name);
        let metrics = METRIC_NAMES.iter().map(|n| column(n).map_or(Ok(None), opt)).collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            step,
            epoch,
            split,
            metrics,
            learning_rate: opt(first_tail)?,
            grad_norm: opt(first_tail + 1)?,
            pairs_per_second: opt(first_tail + 2)?,
            tokens_per_second: opt(first_tail + 3)?,
            elapsed_seconds: req(first_tail + 4)?,
        })
    }
}

/// Shortest text that parses back to the same `f64`; scientific notation for very small or very
/// large magnitudes (learning rates like `5e-7`), `NaN`/`inf`/`-inf` as Rust and pandas spell them.
fn format_f64(v: f64) -> String {
    let a = v.abs();
    if v.is_finite() && a != 0.0 && !(1e-4..1e15).contains(&a) { format!("{v:e}") } else { format!("{v}") }
}

fn format_opt(v: Option<f64>) -> String {
    v.map(format_f64).unwrap_or_default()
}

/// Appends rows to `<run_dir>/metrics.csv`, flushing after each so a crash loses at most the row
/// being written; with TensorBoard on, each value also goes to an event file.
pub struct MetricsWriter {
    path: PathBuf,
    writer: csv::Writer<File>,
    /// Lines the file holds, for error messages.
    lines: u64,
    tensorboard: Option<EventWriter>,
    wandb: Option<WandbRun>,
}

impl MetricsWriter {
    /// Starts `<dir>/metrics.csv` afresh with its header: a stage that starts at step 0 (even
    /// again, after a run that died before its first checkpoint) never logs a step twice.
    pub fn create(dir: &Path) -> Result<Self, LogError> {
        let path = dir.join(METRICS_FILE);
        let file = File::create(&path).map_err(|e| LogError::io("create", &path, e))?;
        let writer = csv::WriterBuilder::new().has_headers(false).from_writer(file);
        let mut this = Self { path, writer, lines: 0, tensorboard: None, wandb: None };
        this.write_record(&header())?;
        Ok(this)
    }

    /// Also writes every row to a new TensorBoard event file in `dir`, as transformers'
    /// `TensorBoardCallback` names the values: `train/loss`, `eval/rewards/margins`,
    /// `train/learning_rate`, `train/grad_norm`, `train/epoch`.
    /// A stage resumed from the checkpoint at `resumed_at` logs the steps after it again: the new
    /// file starts by telling TensorBoard to drop what earlier files hold from there on.
    pub fn with_tensorboard(mut self, dir: &Path, resumed_at: Option<u64>) -> Result<Self, LogError> {
        let mut events = EventWriter::create(dir).map_err(|e| LogError::io("create an event file in", dir, e))?;
        if let Some(step) = resumed_at {
            events.restart(step + 1).map_err(|e| LogError::io("write", events.path(), e))?;
        }
        self.tensorboard = Some(events);
        Ok(self)
    }

    /// Also logs every row to the W&B run `run`, under the names TensorBoard gets.
    pub fn with_wandb(mut self, run: WandbRun) -> Self {
        self.wandb = Some(run);
        self
    }

    /// Ends the W&B run as finished (one dropped without this is marked failed).
    pub fn finish(self) {
        if let Some(run) = self.wandb {
            run.finish();
        }
    }

    /// Logs the end of training's summary (`train_runtime`, `train_loss`, ...) as transformers
    /// does: each value under its tag to TensorBoard, into the run's summary on W&B (its
    /// `single_value_scalars`), where the history gets the epoch alone; not to `metrics.csv`.
    pub fn log_summary(&mut self, values: &[(String, f64)], epoch: f64, step: u64) -> Result<(), LogError> {
        let epoch = [("train/epoch".to_owned(), epoch)];
        if let Some(run) = self.wandb.as_mut() {
            run.summary(values);
            run.log(&epoch, step);
        }
        let tagged: Vec<(String, f64)> = values.iter().map(|(key, v)| (tag(key), *v)).chain(epoch).collect();
        self.scalars(&tagged, step)
    }

    /// Logs values to TensorBoard and W&B (one W&B row).
    fn log_beside(&mut self, values: &[(String, f64)], step: u64) -> Result<(), LogError> {
        if let Some(run) = self.wandb.as_mut() {
            run.log(values, step);
        }
        self.scalars(values, step)
    }

    /// Writes values to the TensorBoard event file, where there is one.
    fn scalars(&mut self, values: &[(String, f64)], step: u64) -> Result<(), LogError> {
        let Some(events) = self.tensorboard.as_mut() else { return Ok(()) };
        for (tag, v) in values {
            events.scalar(tag, step, *v as f32).map_err(|e| LogError::io("write", events.path(), e))?;
        }
        Ok(())
    }

    /// The TensorBoard event file, when there is one.
    pub fn tensorboard(&mut self) -> Option<&mut EventWriter> {
        self.tensorboard.as_mut()
    }

    /// Opens `<dir>/metrics.csv` for a run resumed from the checkpoint at `keep_through_step`:
    /// rows logged after it (which the resumed run will log again) are dropped first.
    ///
    /// The kept rows are written to `metrics.csv.tmp` and renamed over the original, so the file
    /// is never half-rewritten. A missing file is created as by [`MetricsWriter::create`]; an
    /// existing one must start with this version's header (so columns never shift).
    pub fn resume(dir: &Path, keep_through_step: u64) -> Result<Self, LogError> {
        let path = dir.join(METRICS_FILE);
        if !path.exists() {
            return Self::create(dir);
        }
        drop_torn_row(&path)?;
        let rows = read_metrics(&path)?;
        let tmp = tmp_path(&path);
        {
            let file = File::create(&tmp).map_err(|e| LogError::io("create", &tmp, e))?;
            let writer = csv::WriterBuilder::new().has_headers(false).from_writer(file);
            let mut out = Self { path: tmp.clone(), writer, lines: 0, tensorboard: None, wandb: None };
            out.write_record(&header())?;
            for row in rows.iter().filter(|r| r.step <= keep_through_step) {
                out.append(row)?;
            }
            let file = out
                .writer
                .into_inner()
                .map_err(|e| LogError::io("write", &tmp, std::io::Error::other(e.to_string())))?;
            file.sync_all().map_err(|e| LogError::io("write", &tmp, e))?;
        }
        std::fs::rename(&tmp, &path).map_err(|e| LogError::io("rename into place", &path, e))?;
        let file =
            OpenOptions::new().append(true).open(&path).map_err(|e| LogError::io("open for appending", &path, e))?;
        let lines = 1 + rows.iter().filter(|r| r.step <= keep_through_step).count() as u64;
        let writer = csv::WriterBuilder::new().has_headers(false).from_writer(file);
        Ok(Self { path, writer, lines, tensorboard: None, wandb: None })
    }

    /// The file being written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one row and flushes it to the file.
    pub fn append(&mut self, row: &MetricsRow) -> Result<(), LogError> {
        self.append_with(row, &[])
    }

    /// [`Self::append`], with values `beside` the row logged with it to TensorBoard and W&B but
    /// not to `metrics.csv` (an evaluation's runtime under transformers' names).
    pub fn append_with(&mut self, row: &MetricsRow, beside: &[(String, f64)]) -> Result<(), LogError> {
        if row.metrics.len() != METRIC_NAMES.len() {
            return Err(LogError::MetricCount {
                path: self.path.clone(),
                step: row.step,
                found: row.metrics.len(),
                expected: METRIC_NAMES.len(),
            });
        }
        self.write_record(&row.to_record())?;
        if self.tensorboard.is_none() && self.wandb.is_none() {
            return Ok(());
        }
        let mut tagged = row.tagged();
        tagged.extend_from_slice(beside);
        self.log_beside(&tagged, row.step)
    }

    /// Writes and flushes one record.
    fn write_record<S: AsRef<[u8]>>(&mut self, cells: &[S]) -> Result<(), LogError> {
        self.lines += 1;
        self.writer.write_record(cells).map_err(|source| LogError::Csv {
            path: self.path.clone(),
            line: self.lines,
            source,
        })?;
        self.writer.flush().map_err(|e| LogError::io("write", &self.path, e))
    }
}

/// transformers' `speed_metrics` of a `split` (`train`, `eval`) that ran `runtime` seconds over
/// `samples` and `steps`, named and rounded as there: `eval_runtime`, `train_samples_per_second`, ...
pub fn speed_metrics(split: &str, runtime: f64, samples: f64, steps: f64) -> Vec<(String, f64)> {
    let round = |v: f64, digits: i32| (v * 10f64.powi(digits)).round() / 10f64.powi(digits);
    let mut out = vec![("runtime", round(runtime, 4))];
    if runtime > 0.0 {
        out.extend([
            ("samples_per_second", round(samples / runtime, 3)),
            ("steps_per_second", round(steps / runtime, 3)),
        ]);
    }
    out.into_iter().map(|(name, v)| (format!("{split}_{name}"), v)).collect()
}

/// The tag transformers' `TensorBoardCallback` and `WandbCallback` give a logged key
/// (`rewrite_logs`): `eval_runtime` is `eval/runtime`, anything else goes under `train/`.
pub fn tag(key: &str) -> String {
    match key.strip_prefix("eval_") {
        Some(name) => format!("eval/{name}"),
        None => format!("train/{key}"),
    }
}

/// Checks that the first line of `path` is the header this version writes, or an earlier
/// version's (without [`ADDED_LATER`]); returns its columns.
fn check_header(path: &Path) -> Result<Vec<&'static str>, LogError> {
    let file = File::open(path).map_err(|e| LogError::io("read", path, e))?;
    let mut first = String::new();
    BufReader::new(file).read_line(&mut first).map_err(|e| LogError::io("read", path, e))?;
    let found = first.trim_end_matches(['\r', '\n']);
    // This version's header, then each earlier version's: without the columns added since.
    let without_since = |version: usize| -> Vec<&'static str> {
        header().into_iter().filter(|c| !ADDED_LATER[version..].iter().any(|added| added.contains(c))).collect()
    };
    match (0..=ADDED_LATER.len()).rev().map(without_since).find(|names| names.join(",") == found) {
        Some(names) => Ok(names),
        None => {
            Err(LogError::Header { path: path.to_path_buf(), expected: header().join(","), found: found.to_string() })
        }
    }
}

/// Cuts a last row that has no line end, which a process killed (or a disk filled) in the middle
/// of an append leaves: each row is written whole with its newline, and the step whose row was cut
/// short never reached its checkpoint, so a resume drops it anyway.
fn drop_torn_row(path: &Path) -> Result<(), LogError> {
    let bytes = std::fs::read(path).map_err(|e| LogError::io("read", path, e))?;
    if bytes.last().is_none_or(|b| *b == b'\n') {
        return Ok(());
    }
    // The header ends in a newline (a file that is the header alone, cut, is left to be refused).
    let Some(end) = bytes.iter().rposition(|b| *b == b'\n') else { return Ok(()) };
    let file = OpenOptions::new().write(true).open(path).map_err(|e| LogError::io("write", path, e))?;
    file.set_len(end as u64 + 1).map_err(|e| LogError::io("write", path, e))
}

/// Reads every row of a `metrics.csv`; errors name the file and the 1-based line. A last row cut
/// short (no line end, and it does not parse: a run killed in the middle of an append, or still
/// writing it) is left out, as a resume drops it, so a killed or live run still plots.
pub fn read_metrics(path: &Path) -> Result<Vec<MetricsRow>, LogError> {
    let names = check_header(path)?;
    let bytes = std::fs::read(path).map_err(|e| LogError::io("read", path, e))?;
    let mut reader = csv::ReaderBuilder::new().has_headers(true).flexible(true).from_reader(bytes.as_slice());
    let torn =
        |reader: &csv::Reader<&[u8]>| bytes.last() != Some(&b'\n') && reader.position().byte() as usize == bytes.len();
    let mut rows = Vec::new();
    let mut record = csv::StringRecord::new();
    loop {
        let line = reader.position().line();
        match reader.read_record(&mut record) {
            Ok(true) => {}
            Ok(false) => break,
            Err(_) if torn(&reader) => break,
            Err(source) => {
                let line = source.position().map_or(line, |p| p.line());
                return Err(match source.kind() {
                    csv::ErrorKind::Io(_) => {
                        let csv::ErrorKind::Io(e) = source.into_kind() else {
                            unreachable!("matched `Io` just above");
                        };
                        LogError::io("read", path, e)
                    }
                    _ => LogError::Csv { path: path.to_path_buf(), line, source },
                });
            }
        }
        let line = record.position().map_or(line, |p| p.line());
        match MetricsRow::from_record(&record, &names, path, line) {
            Ok(row) => rows.push(row),
            Err(_) if torn(&reader) => break,
            Err(e) => return Err(e),
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(step: u64, split: Split) -> MetricsRow {
        let mut r = MetricsRow::empty(step, step as f64 / 10.0, split, step as f64 * 1.5);
        r.set_metric("loss", 0.5 + step as f64 * 0.25);
        r.set_metric("rewards/margins", 0.5 * step as f64);
        if split == Split::Train {
            r.learning_rate = Some(5e-7);
            r.grad_norm = Some(1.25);
        }
        r
    }

    #[test]
    fn header_has_the_documented_column_order() {
        assert_eq!(
            header().join(","),
            "step,epoch,split,loss,rewards/chosen,rewards/rejected,rewards/accuracies,\
             rewards/margins,logps/chosen,logps/rejected,logits/chosen,logits/rejected,entropy,\
             num_tokens,mean_token_accuracy,kl,nll_loss,log_odds_ratio,log_odds_chosen,learning_rate,\
             grad_norm,pairs_per_second,tokens_per_second,elapsed_seconds"
        );
    }

    #[test]
    fn round_trip_keeps_empty_cells_and_values() {
        let dir = tempfile::tempdir().unwrap();
        let mut rows = vec![row(1, Split::Train), row(2, Split::Train), row(2, Split::Eval)];
        rows[1].metrics[9] = Some(f64::NAN);
        rows[1].tokens_per_second = Some(1234.5);
        rows[1].pairs_per_second = Some(f64::INFINITY);
        let mut writer = MetricsWriter::create(dir.path()).unwrap();
        for r in &rows {
            writer.append(r).unwrap();
        }
        drop(writer);

        let text = std::fs::read_to_string(dir.path().join("metrics.csv")).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4);
        assert_eq!(lines[1], "1,0.1,train,0.75,,,,0.5,,,,,,,,,,,,5e-7,1.25,,,1.5");
        assert_eq!(lines[3], "2,0.2,eval,1,,,,1,,,,,,,,,,,,,,,,3");

        let back = read_metrics(&dir.path().join("metrics.csv")).unwrap();
        assert_eq!(back.len(), 3);
        assert!(back[1].metrics[9].unwrap().is_nan());
        assert_eq!(back[1].pairs_per_second, Some(f64::INFINITY));
        // NaN != NaN, so compare the NaN-free rows whole.
        assert_eq!(back[0], rows[0]);
        assert_eq!(back[2], rows[2]);
        assert_eq!(back[1].tokens_per_second, Some(1234.5));
    }

    #[test]
    fn create_starts_afresh() {
        let dir = tempfile::tempdir().unwrap();
        MetricsWriter::create(dir.path()).unwrap().append(&row(1, Split::Train)).unwrap();
        MetricsWriter::create(dir.path()).unwrap().append(&row(1, Split::Train)).unwrap();
        let back = read_metrics(&dir.path().join("metrics.csv")).unwrap();
        assert_eq!(back.iter().map(|r| r.step).collect::<Vec<_>>(), [1]);
    }

    #[test]
    fn resume_drops_rows_after_the_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let mut writer = MetricsWriter::create(dir.path()).unwrap();
        for step in 1..=6 {
            writer.append(&row(step, Split::Train)).unwrap();
            if step % 3 == 0 {
                writer.append(&row(step, Split::Eval)).unwrap();
            }
        }
        drop(writer);

        let mut writer = MetricsWriter::resume(dir.path(), 3).unwrap();
        writer.append(&row(4, Split::Train)).unwrap();
        drop(writer);

        let back = read_metrics(&dir.path().join("metrics.csv")).unwrap();
        let keys: Vec<(u64, Split)> = back.iter().map(|r| (r.step, r.split)).collect();
        assert_eq!(
            keys,
            [(1, Split::Train), (2, Split::Train), (3, Split::Train), (3, Split::Eval), (4, Split::Train)]
        );
        assert!(!dir.path().join("metrics.csv.tmp").exists());
    }

    #[test]
    fn resume_without_a_file_starts_one() {
        let dir = tempfile::tempdir().unwrap();
        MetricsWriter::resume(dir.path(), 10).unwrap().append(&row(11, Split::Train)).unwrap();
        assert_eq!(read_metrics(&dir.path().join("metrics.csv")).unwrap().len(), 1);
    }

    #[test]
    fn wrong_metric_count_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut bad = row(7, Split::Train);
        bad.metrics.pop();
        let err = MetricsWriter::create(dir.path()).unwrap().append(&bad).unwrap_err();
        assert!(err.to_string().contains("`: the metrics row of step 7 has 15 metric values"), "{err}");
    }

    fn write_file(name: &str, body: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(name);
        std::fs::write(&path, format!("{}\n{body}", header().join(","))).unwrap();
        (dir, path)
    }

    #[test]
    fn short_row_error_names_file_and_line() {
        let (_dir, path) = write_file("metrics.csv", "1,0.1,train,0.5,,,,,,,,,,,,,,,,,,,,1\n2,0.2,train,0.4\n");
        let err = read_metrics(&path).unwrap_err();
        assert_eq!(err.to_string(), format!("`{}`, line 3: 4 fields, expected 24", path.display()));
    }

    #[test]
    fn bad_value_error_names_file_line_and_column() {
        let (_dir, path) = write_file(
            "metrics.csv",
            "1,0.1,train,0.5,,,,,,,,,,,,,,,,,,,,1\n2,0.2,train,0.4,,,,,,,,,,,,,,,,,abc,,,2\n",
        );
        let err = read_metrics(&path).unwrap_err();
        assert_eq!(err.to_string(), format!("`{}`, line 3: column `grad_norm`: invalid value `abc`", path.display()));
        let (_dir, path) = write_file("m.csv", "1,0.1,test,,,,,,,,,,,,,,,,,,,,,1\n");
        let err = read_metrics(&path).unwrap_err();
        assert!(err.to_string().ends_with("line 2: column `split`: invalid value `test`"), "{err}");
    }

    /// Runs written before `mean_token_accuracy`, and before the loss families' columns, read
    /// back with them empty, and resuming one rewrites the file under this version's header.
    #[test]
    fn an_earlier_versions_file_reads_and_resumes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.csv");
        let without = |gone: &[&str]| -> String {
            header().into_iter().filter(|c| !gone.contains(c)).collect::<Vec<_>>().join(",")
        };
        let families = ["kl", "nll_loss", "log_odds_ratio", "log_odds_chosen"];
        let previous = format!("{}\n1,0.1,train,0.5,,,,,,,,,,,0.125,5e-7,,,,1.5\n", without(&families));
        std::fs::write(&path, previous).unwrap();
        assert_eq!(read_metrics(&path).unwrap()[0].metric("mean_token_accuracy"), Some(0.125));
        let mut first = families.to_vec();
        first.push("mean_token_accuracy");
        let body = "1,0.1,train,0.5,,,,,,,,,,,5e-7,,,,1.5\n2,0.2,train,0.25,,,,,,,,,,,5e-7,,,,3\n";
        std::fs::write(&path, format!("{}\n{body}", without(&first))).unwrap();
        let rows = read_metrics(&path).unwrap();
        assert_eq!((rows[1].metric("loss"), rows[1].metric("mean_token_accuracy")), (Some(0.25), None));
        assert_eq!((rows[1].learning_rate, rows[1].elapsed_seconds), (Some(5e-7), 3.0));
        let mut writer = MetricsWriter::resume(dir.path(), 1).unwrap();
        let mut next = row(2, Split::Train);
        next.set_metric("mean_token_accuracy", 0.75);
        next.set_metric("kl", 0.5);
        writer.append(&next).unwrap();
        drop(writer);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with(&format!("{}\n", header().join(","))), "{text}");
        let back = read_metrics(&path).unwrap();
        assert_eq!(back.len(), 2);
        assert_eq!((back[0].metric("loss"), back[0].metric("mean_token_accuracy")), (Some(0.5), None));
        assert_eq!((back[1].metric("mean_token_accuracy"), back[1].metric("kl")), (Some(0.75), Some(0.5)));
    }

    /// A row cut short by a process killed mid-append (no line end) does not stop a resume: it
    /// is dropped with the rows after the checkpoint.
    #[test]
    fn a_resume_drops_a_row_cut_short() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.csv");
        let rows = "1,0.1,train,0.5,,,,,,,,,,,,,,,,,,,,1\n2,0.2,train,0.4,,,,,,,,,,,,,,,,,,,,2\n3,0.3,tra";
        std::fs::write(&path, format!("{}\n{rows}", header().join(","))).unwrap();
        let steps = |path: &Path| read_metrics(path).unwrap().iter().map(|r| r.step).collect::<Vec<_>>();
        // Read without it (a killed or live run plots), and cut from the file by a resume.
        assert_eq!(steps(&path), [1, 2]);
        drop(MetricsWriter::resume(dir.path(), 2).unwrap());
        assert_eq!(steps(&path), [1, 2]);
        assert!(std::fs::read_to_string(&path).unwrap().ends_with(",2\n"));
        // A whole last row without its line end is read; a bad row with one is refused.
        let whole = dir.path().join("whole.csv");
        std::fs::write(&whole, format!("{}\n{}", header().join(","), &rows[..rows.len() - 10])).unwrap();
        assert_eq!(steps(&whole), [1, 2]);
        std::fs::write(&whole, format!("{}\n{rows}\n", header().join(","))).unwrap();
        assert!(read_metrics(&whole).unwrap_err().to_string().contains("line 4"));
    }

    #[test]
    fn foreign_header_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.csv");
        std::fs::write(&path, "step,loss\n1,0.5\n").unwrap();
        let err = read_metrics(&path).unwrap_err();
        assert!(err.to_string().contains("`, line 1: not the header of a dpo-train metrics.csv"), "{err}");
        assert!(MetricsWriter::resume(dir.path(), 1).is_err());
    }

    #[test]
    fn small_and_large_numbers_use_exponents() {
        assert_eq!(format_f64(5e-7), "5e-7");
        assert_eq!(format_f64(0.0), "0");
        assert_eq!(format_f64(0.25), "0.25");
        assert_eq!(format_f64(1e20), "1e20");
        assert_eq!(format_f64(f64::NAN), "NaN");
        assert_eq!(format_f64(f64::NEG_INFINITY), "-inf");
    }

    #[test]
    fn atomic_write_leaves_no_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.txt");
        write_atomic(&path, b"one").unwrap();
        write_atomic(&path, b"two").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, ["a.txt"]);
    }

    #[test]
    fn io_error_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let not_a_dir = dir.path().join("file");
        std::fs::write(&not_a_dir, b"").unwrap();
        let path = not_a_dir.join("x.png");
        let err = write_atomic(&path, b"").unwrap_err();
        assert_eq!(err.to_string(), format!("cannot write `{}`", path.display()));
    }
}
