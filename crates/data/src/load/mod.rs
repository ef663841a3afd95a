//! Preference-data readers: JSON Lines, a JSON array, CSV or TSV (each optionally gzipped),
//! Parquet and Arrow, and dataset directories as the hub lays them out or `save_to_disk` writes them.
//!
//! The row formats are those TRL's `DPOTrainer` accepts (TRL 1.16 `trl/trainer/dpo_trainer.py`,
//! `_prepare_dataset`): standard (`prompt`/`chosen`/`rejected` strings), conversational (lists of
//! `{role, content}` messages, detected like `trl/data_utils.py` `is_conversational`), and implicit
//! prompt (only `chosen`/`rejected`; the shared prefix becomes the prompt, `trl/data_utils.py`
//! `extract_prompt`). Every bad row either stops the load with an error naming file, line and field,
//! or, with `skip_bad_rows`, is skipped and reported in [`ReadSummary::skipped`].
//!
//! [`read_rows`] streams: JSON Lines (plain or gzipped) is read line by line and Parquet and Arrow
//! one record batch at a time, and good rows leave in chunks of [`CHUNK_ROWS`], so a caller that tokenises
//! each chunk never holds the whole text. A `.json` array and CSV are read whole.

use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use serde_json::Value;

use self::file::read_file;
use self::row::{build_row, build_unpaired_row, json_kind, text_field};
use crate::error::{DataError, RowProblem};
use crate::tokenizer::{Message, TemplateArgs};

mod arrow;
mod card;
mod csv;
mod file;
pub mod hub;
mod json;
mod parquet;
mod records;
pub mod row;

/// Good rows handed over at a time by [`read_rows`].
pub const CHUNK_ROWS: usize = 4096;

/// Takes a chunk of good rows and the file they came from (see [`read_rows`]).
pub type EachChunk<'a> = dyn FnMut(&Path, Vec<PreferenceRow>) -> Result<(), DataError> + 'a;

/// The column (field) names of the three parts of a preference row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Columns {
    /// Prompt column; when the data has none (no such column, or a first JSON row without it), the prompt is implicit in `chosen`/`rejected`.
    pub prompt: String,
    /// Preferred completion column.
    pub chosen: String,
    /// Dispreferred completion column.
    pub rejected: String,
}

impl Default for Columns {
    fn default() -> Self {
        Self { prompt: "prompt".into(), chosen: "chosen".into(), rejected: "rejected".into() }
    }
}

/// How to read a preference file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoadOptions {
    /// Column names (TRL's defaults: `prompt`, `chosen`, `rejected`).
    pub columns: Columns,
    /// Skip bad rows (reporting them in [`Loaded::skipped`]) instead of stopping at the first one.
    /// A `.json` array with a syntax error, or a `.json` file that is not UTF-8, cannot be skipped
    /// past and always stops the load.
    pub skip_bad_rows: bool,
    /// The split a dataset directory is read for (`dataset_train_split`, `dataset_test_split`);
    /// `None` reads `train`. A file is read whole.
    pub split: Option<String>,
    /// The configuration of a dataset directory's card (`README.md` `configs`) it is read by
    /// (TRL's `dataset_config`); `None`: the card's default.
    pub config: Option<String>,
    /// Which rows the loss reads: preference pairs, or KTO's unpaired rows.
    pub rows: RowKind,
}

/// Which rows a file is read for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum RowKind {
    /// `prompt`/`chosen`/`rejected` preference pairs (the prompt possibly implicit).
    #[default]
    Pairs,
    /// KTO's `prompt`/`completion`/`label` rows; with `unpair`, a pair is taken as its chosen row
    /// (label true) and its rejected row (false), ordered as TRL's `unpair_preference_dataset`
    /// orders them (see [`UNPAIR_BLOCK`]).
    Unpaired { unpair: bool },
}

impl RowKind {
    /// The rows `loss` trains on.
    pub fn of(loss: &dpo_config::LossConfig) -> Self {
        if loss.is_kto() { Self::Unpaired { unpair: loss.unpair } } else { Self::Pairs }
    }

    /// How a row (or a file, by its columns) is read, from the fields `has` finds: one rule for
    /// every format.
    fn reading(self, cols: &Columns, has: impl Fn(&str) -> bool) -> Reading {
        let paired = has(&cols.chosen) || has(&cols.rejected);
        let unpaired = has(COMPLETION) && has(LABEL);
        let (chosen, rejected) = (cols.chosen.clone(), cols.rejected.clone());
        match self {
            Self::Unpaired { .. } if unpaired || !paired => Reading::Unpaired,
            Self::Unpaired { unpair: false } => Reading::Refused(RowProblem::PairedForKto { chosen, rejected }),
            Self::Pairs if unpaired && !paired => Reading::Refused(RowProblem::UnpairedForPairs { chosen, rejected }),
            _ => Reading::Pairs,
        }
    }
}

/// What [`RowKind::reading`] decides.
enum Reading {
    Pairs,
    Unpaired,
    /// Rows of the other kind than the loss reads: each is this problem.
    Refused(RowProblem),
}

/// TRL's `unpair_preference_dataset` is a batched `datasets.map` (batches of 1000 rows) that
/// puts a batch's chosen rows before its rejected ones; unpaired rows keep that order.
pub const UNPAIR_BLOCK: usize = 1000;

/// KTO's column names (`KTOTrainer` takes no others).
pub const COMPLETION: &str = "completion";
pub const LABEL: &str = "label";

/// A prompt or completion: plain text or a list of chat messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Text {
    /// Standard format: a string.
    Plain(String),
    /// Conversational format: `{role, content}` messages.
    Messages(Vec<Message>),
}

impl Text {
    /// Whether this is the conversational format.
    pub fn is_messages(&self) -> bool {
        matches!(self, Text::Messages(_))
    }

    fn kind(&self) -> &'static str {
        match self {
            Text::Plain(_) => "plain text",
            Text::Messages(_) => "a list of messages",
        }
    }

    fn is_empty(&self) -> bool {
        match self {
            Text::Plain(s) => s.is_empty(),
            Text::Messages(m) => m.is_empty(),
        }
    }

    /// The empty text of the same kind (an unpaired row's `rejected`).
    fn empty_like(&self) -> Text {
        match self {
            Text::Plain(_) => Text::Plain(String::new()),
            Text::Messages(_) => Text::Messages(Vec::new()),
        }
    }
}

/// One preference example.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreferenceRow {
    /// 1-based physical line of the row in its file (for a CSV record, the line it starts on).
    pub line: usize,
    /// The prompt (extracted from `chosen`/`rejected` for implicit-prompt data).
    pub prompt: Text,
    /// The preferred completion.
    pub chosen: Text,
    /// The dispreferred completion; empty in an unpaired row.
    pub rejected: Text,
    /// An unpaired (KTO) row's label, whose completion is `chosen`: true for a desirable
    /// completion; `None` for a preference pair.
    pub label: Option<bool>,
    /// A conversational row's `tools` and `chat_template_kwargs` for the chat template.
    pub template: Option<Box<TemplateArgs>>,
}
/// A row that `skip_bad_rows` skipped.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SkippedRow {
    /// The file it is in (a dataset directory's shard).
    #[serde(default)]
    pub file: PathBuf,
    /// 1-based physical line (a Parquet or Arrow row index from 0).
    pub line: usize,
    /// Why it was skipped (the error it would have raised, naming its file).
    pub reason: String,
}

/// The rows of a preference file and what was skipped reading it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Loaded {
    /// The file read.
    pub path: PathBuf,
    /// Good rows, in file order.
    pub rows: Vec<PreferenceRow>,
    /// Bad rows skipped under `skip_bad_rows`, in file order.
    pub skipped: Vec<SkippedRow>,
    /// Whether the prompt was implicit (no prompt column) and extracted from `chosen`/`rejected`.
    pub implicit_prompt: bool,
    /// Whether the rows are conversational (message lists).
    pub conversational: bool,
}

/// What [`read_rows`] read besides the rows it handed over.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ReadSummary {
    /// Good rows handed over.
    pub rows: usize,
    /// Bad rows skipped under `skip_bad_rows`, in file order (shard after shard).
    pub skipped: Vec<SkippedRow>,
    /// Whether the prompt was implicit (no prompt column) and extracted from `chosen`/`rejected`.
    pub implicit_prompt: bool,
    /// Whether the rows are conversational (message lists).
    pub conversational: bool,
}

/// The row fields TRL's `DPOTrainer` passes to the chat template beside the messages: `tools`
/// and `chat_template_kwargs` (such as Qwen3's `enable_thinking`).
pub const TEMPLATE_FIELDS: [&str; 2] = ["tools", "chat_template_kwargs"];

/// A conversational row's [`TEMPLATE_FIELDS`] as TRL reads them: `tools` parsed where it is JSON
/// text (`json.loads`), the keyword arguments an object; null or absent, nothing.
fn template_args(obj: &serde_json::Map<String, Value>) -> Result<Option<Box<TemplateArgs>>, RowProblem> {
    let bad = |field: &str, what: &'static str| RowProblem::TemplateField { field: field.to_owned(), what };
    let tools = match obj.get(TEMPLATE_FIELDS[0]) {
        None | Some(Value::Null) => None,
        Some(Value::String(text)) => {
            Some(serde_json::from_str(text).map_err(|_| bad(TEMPLATE_FIELDS[0], "is text that is not JSON"))?)
        }
        Some(other) => Some(other.clone()),
    };
    let kwargs = match obj.get(TEMPLATE_FIELDS[1]) {
        None | Some(Value::Null) => serde_json::Map::new(),
        Some(Value::Object(kwargs)) => kwargs.clone(),
        Some(_) => return Err(bad(TEMPLATE_FIELDS[1], "must be an object of keyword arguments")),
    };
    Ok((tools.is_some() || !kwargs.is_empty()).then(|| Box::new(TemplateArgs { tools, kwargs })))
}

/// Reads a preference file, or one split of a dataset directory, whole (see [`read_rows`]).
pub fn load_preferences(path: &Path, opts: &LoadOptions) -> Result<Loaded, DataError> {
    let mut rows = Vec::new();
    let summary = read_rows(
        path,
        opts,
        &mut |_, chunk| {
            rows.extend(chunk);
            Ok(())
        },
        &mut |_, _| {},
    )?;
    let ReadSummary { skipped, implicit_prompt, conversational, .. } = summary;
    Ok(Loaded { path: path.to_path_buf(), rows, skipped, implicit_prompt, conversational })
}

/// Hands the good rows of a preference file, or of one split of a dataset directory as the hub
/// lays them out (see [`hub`]; its shards in name order), to `each` in chunks of at most
/// [`CHUNK_ROWS`] with the file they came from; `progress` gets the bytes read so far and in all.
pub fn read_rows(
    path: &Path,
    opts: &LoadOptions,
    each: &mut EachChunk,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<ReadSummary, DataError> {
    let files = if path.is_dir() {
        let split = opts.split.as_deref().unwrap_or("train");
        let files = hub::split_files(path, split, opts.config.as_deref())?;
        if files.is_empty() {
            let message = format!("no data files for split `{split}`");
            return Err(DataError::Layout { path: path.to_path_buf(), message });
        }
        files
    } else if let Some(name) = &opts.config {
        let message = format!(
            "no configuration `{name}` (`dataset_config`): a file has none (a dataset directory's card names them)"
        );
        return Err(DataError::Layout { path: path.to_path_buf(), message });
    } else {
        vec![path.to_path_buf()]
    };
    let sizes: Vec<u64> = files.iter().map(|f| std::fs::metadata(f).map_or(0, |m| m.len())).collect();
    let total: u64 = sizes.iter().sum();
    let mut all: Option<ReadSummary> = None;
    let mut before = 0;
    for (file, size) in files.iter().zip(sizes) {
        let mut at = |done: u64| progress(before + done.min(size), total);
        let summary = read_file(file, opts, &mut Rows::new(file, opts, each, &mut at))?;
        before += size;
        // A shard with no good row (empty, or all of it skipped) says nothing of the format.
        let Some(all) = all.as_mut().filter(|a| a.rows > 0) else {
            let skipped = all.map(|a| a.skipped).unwrap_or_default();
            all = Some(ReadSummary { skipped: [skipped, summary.skipped].concat(), ..summary });
            continue;
        };
        if summary.rows == 0 {
            all.skipped.extend(summary.skipped);
            continue;
        }
        if summary.conversational != all.conversational || summary.implicit_prompt != all.implicit_prompt {
            let message = format!("`{}` and the shards before it differ in format", file.display());
            return Err(DataError::Layout { path: path.to_path_buf(), message });
        }
        all.rows += summary.rows;
        all.skipped.extend(summary.skipped);
    }
    progress(total, total);
    // `files` is not empty, so one summary exists; a split of no good row is refused whole.
    let all = all.ok_or_else(|| DataError::Empty { path: path.to_path_buf() })?;
    if all.rows == 0 {
        let path = path.to_path_buf();
        return Err(match all.skipped.len() {
            0 => DataError::Empty { path },
            skipped => DataError::AllSkipped { path, skipped },
        });
    }
    // A prompt column the user named and the data lacks is a typo, not implicit-prompt data.
    if all.implicit_prompt && opts.columns.prompt != Columns::default().prompt {
        return Err(DataError::NoPromptColumn { path: path.to_path_buf(), column: opts.columns.prompt.clone() });
    }
    Ok(all)
}

/// Where a reader puts one file's rows: good rows leave in chunks, their kind held to the first
/// row's; a bad row is skipped or becomes the error.
struct Rows<'a> {
    path: PathBuf,
    cols: &'a Columns,
    skip: bool,
    /// Rows are numbered as Parquet records (from 0), not as lines.
    records: bool,
    /// The bytes are a gzip stream: a read error is a decompression error.
    gzip: bool,
    /// Whether the prompt is implicit: fixed by the schema (Parquet, a CSV header) or by the first
    /// good JSON row (TRL decides from the first example), with that row's line.
    implicit: Option<(bool, usize)>,
    /// The first good row's number and whether it is conversational.
    first: Option<(usize, bool)>,
    chunk: Vec<PreferenceRow>,
    /// Which rows are read, and the pairs waiting to be unpaired (see [`UNPAIR_BLOCK`]).
    kind: RowKind,
    pending: Vec<PreferenceRow>,
    kept: usize,
    skipped: Vec<SkippedRow>,
    /// Bytes of the file read so far (compressed bytes for gzip).
    bytes: Rc<Cell<u64>>,
    each: &'a mut EachChunk<'a>,
    progress: &'a mut dyn FnMut(u64),
}

impl<'a> Rows<'a> {
    fn new(path: &Path, opts: &'a LoadOptions, each: &'a mut EachChunk<'a>, progress: &'a mut dyn FnMut(u64)) -> Self {
        Self {
            path: path.to_path_buf(),
            cols: &opts.columns,
            skip: opts.skip_bad_rows,
            records: false,
            gzip: false,
            implicit: None,
            first: None,
            chunk: Vec::with_capacity(CHUNK_ROWS),
            kind: opts.rows,
            pending: Vec::new(),
            kept: 0,
            skipped: Vec::new(),
            bytes: Rc::default(),
            each,
            progress,
        }
    }

    fn io_error(&self, source: std::io::Error) -> DataError {
        let path = self.path.clone();
        if self.gzip { DataError::Gzip { path, source } } else { DataError::Read { path, source } }
    }

    /// Records `err` (about `line`) as skipped, or returns it when rows are not skipped.
    fn bad(&mut self, line: usize, err: DataError) -> Result<(), DataError> {
        if self.skip {
            self.skipped.push(SkippedRow { file: self.path.clone(), line, reason: err.to_string() });
            Ok(())
        } else {
            // The rows before it go first: a row among them the tokenizer refuses is the error.
            self.flush()?;
            Err(err)
        }
    }

    fn bad_row(&mut self, line: usize, problem: RowProblem) -> Result<(), DataError> {
        let path = self.path.clone();
        let err = if self.records {
            DataError::BadRecord { path, row: line, problem }
        } else {
            DataError::BadRow { path, line, problem }
        };
        self.bad(line, err)
    }

    /// A row shaped as a JSON object (JSON, JSON Lines, a Parquet record).
    fn push_value(&mut self, line: usize, value: &Value) -> Result<(), DataError> {
        let Value::Object(obj) = value else {
            return self.bad_row(line, RowProblem::NotAnObject { found: json_kind(value) });
        };
        let cols = self.cols;
        match self.kind.reading(cols, |field| obj.contains_key(field)) {
            Reading::Unpaired => {
                self.implicit.get_or_insert((false, line));
                return self.push(line, unpaired_value(line, obj, cols));
            }
            Reading::Refused(problem) => return self.bad_row(line, problem),
            Reading::Pairs => {}
        }
        let has_prompt = obj.contains_key(&cols.prompt);
        // The first good row decides; a bad one decides nothing (it is skipped or is the error).
        let deciding = self.implicit.is_none();
        let (implicit, first_line) = *self.implicit.get_or_insert((!has_prompt, line));
        if implicit && has_prompt {
            let problem = RowProblem::PromptAppears { field: cols.prompt.clone(), first_line };
            return self.bad_row(line, problem);
        }
        let get = |field: &str| -> Result<Text, RowProblem> {
            let v = obj.get(field).ok_or_else(|| RowProblem::MissingField { field: field.to_string() })?;
            text_field(v, field)
        };
        let parsed = (|| -> Result<PreferenceRow, RowProblem> {
            let prompt = if implicit { None } else { Some(get(&cols.prompt)?) };
            let mut row = build_row(line, prompt, get(&cols.chosen)?, get(&cols.rejected)?, cols)?;
            // Plain-text rows never reach a chat template (TRL's neither).
            if row.chosen.is_messages() {
                row.template = template_args(obj)?;
            }
            Ok(row)
        })();
        if deciding && parsed.is_err() {
            self.implicit = None;
        }
        self.push(line, parsed)
    }

    /// A parsed row: kept (and handed over once a chunk is full) or bad.
    fn push(&mut self, line: usize, parsed: Result<PreferenceRow, RowProblem>) -> Result<(), DataError> {
        let row = match parsed {
            Ok(row) => row,
            Err(problem) => return self.bad_row(line, problem),
        };
        let conv = row.chosen.is_messages();
        match self.first {
            None => self.first = Some((line, conv)),
            Some((first_line, first_conv)) if first_conv != conv => {
                let kind = |c: bool| if c { "conversational" } else { "plain text" };
                let problem = RowProblem::KindChanged { kind: kind(conv), dataset_kind: kind(first_conv), first_line };
                return self.bad_row(line, problem);
            }
            Some(_) => {}
        }
        if self.kind == (RowKind::Unpaired { unpair: true }) && row.label.is_none() {
            self.pending.push(row);
            if self.pending.len() == UNPAIR_BLOCK {
                self.unpair_pending()?;
            }
            return Ok(());
        }
        self.keep(row)
    }

    /// Hands the waiting pairs over as unpaired rows: their chosen rows, then their rejected ones.
    fn unpair_pending(&mut self) -> Result<(), DataError> {
        let pairs = std::mem::take(&mut self.pending);
        let chosen = pairs.iter().map(|p| (p, p.chosen.clone(), true));
        let rejected = pairs.iter().map(|p| (p, p.rejected.clone(), false));
        for (pair, completion, label) in chosen.chain(rejected).collect::<Vec<_>>() {
            let rejected = completion.empty_like();
            let row = PreferenceRow {
                line: pair.line,
                prompt: pair.prompt.clone(),
                chosen: completion,
                rejected,
                label: Some(label),
                template: pair.template.clone(),
            };
            self.keep(row)?;
        }
        Ok(())
    }

    fn keep(&mut self, row: PreferenceRow) -> Result<(), DataError> {
        self.chunk.push(row);
        if self.chunk.len() == CHUNK_ROWS {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), DataError> {
        (self.progress)(self.bytes.get());
        if self.chunk.is_empty() {
            return Ok(());
        }
        self.kept += self.chunk.len();
        let chunk = std::mem::replace(&mut self.chunk, Vec::with_capacity(CHUNK_ROWS));
        (self.each)(&self.path, chunk)
    }

    /// The file's summary (a split with no good row left is refused by [`read_rows`]).
    fn finish(&mut self) -> Result<ReadSummary, DataError> {
        self.unpair_pending()?;
        self.flush()?;
        // A `.json` array's syntax error is found before its rows are checked; report in file order.
        self.skipped.sort_by_key(|s| s.line);
        Ok(ReadSummary {
            rows: self.kept,
            skipped: std::mem::take(&mut self.skipped),
            implicit_prompt: self.implicit.is_some_and(|(implicit, _)| implicit),
            conversational: self.first.is_some_and(|(_, c)| c),
        })
    }
}

/// An unpaired (KTO) row from a JSON object: `prompt`, `completion` and a boolean `label`.
fn unpaired_value(
    line: usize,
    obj: &serde_json::Map<String, Value>,
    cols: &Columns,
) -> Result<PreferenceRow, RowProblem> {
    let get = |field: &str| obj.get(field).ok_or_else(|| RowProblem::MissingField { field: field.to_string() });
    let prompt = text_field(get(&cols.prompt)?, &cols.prompt)?;
    let completion = text_field(get(COMPLETION)?, COMPLETION)?;
    let label = match get(LABEL)? {
        Value::Bool(b) => *b,
        // TRL takes 0/1 labels as booleans (it sums them and makes a bool tensor of them).
        Value::Number(n) if n.as_u64().is_some_and(|n| n <= 1) => n.as_u64() == Some(1),
        Value::Null => return Err(RowProblem::Null { field: LABEL.to_owned() }),
        other => return Err(RowProblem::NotBoolean { field: LABEL.to_owned(), found: json_kind(other).to_owned() }),
    };
    let mut row = build_unpaired_row(line, prompt, completion, label, cols)?;
    if row.chosen.is_messages() {
        row.template = template_args(obj)?;
    }
    Ok(row)
}

/// Byte offsets of the newlines of a file, to turn byte offsets into 1-based line numbers.
struct LineIndex<'a> {
    bytes: &'a [u8],
    newlines: Vec<usize>,
}

impl<'a> LineIndex<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        let newlines = bytes.iter().enumerate().filter_map(|(i, &b)| (b == b'\n').then_some(i)).collect();
        Self { bytes, newlines }
    }

    /// 1-based line of byte `offset`.
    fn line_of(&self, offset: usize) -> usize {
        1 + self.newlines.partition_point(|&n| n < offset)
    }

    /// Line of the first byte at or after `offset` that is not a line break; the csv crate starts a
    /// record's position before the line breaks that precede it.
    fn record_line(&self, mut offset: usize) -> usize {
        while matches!(self.bytes.get(offset), Some(b'\r' | b'\n')) {
            offset += 1;
        }
        self.line_of(offset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file ending in `name` (its extension picks the format), removed when dropped.
    fn temp_file(name: &str, contents: &[u8]) -> tempfile::TempPath {
        let mut file = tempfile::Builder::new().prefix("dpo-load-").suffix(&format!("-{name}")).tempfile().unwrap();
        std::io::Write::write_all(&mut file, contents).unwrap();
        file.into_temp_path()
    }

    fn load(name: &str, contents: &[u8]) -> Result<Loaded, DataError> {
        load_preferences(&temp_file(name, contents), &LoadOptions::default())
    }

    fn load_skip(name: &str, contents: &[u8]) -> Result<Loaded, DataError> {
        let opts = LoadOptions { skip_bad_rows: true, ..LoadOptions::default() };
        load_preferences(&temp_file(name, contents), &opts)
    }

    fn plain(s: &str) -> Text {
        Text::Plain(s.to_string())
    }

    fn msg(role: &str, content: &str) -> Message {
        Message { role: role.into(), content: content.into(), ..Message::default() }
    }

    /// The message after "`path`, line N: " or the whole message.
    fn err_tail(err: &DataError) -> String {
        let s = err.to_string();
        match s.find("`, ") {
            Some(i) => s[i + 3..].to_string(),
            None => s,
        }
    }

    #[test]
    fn jsonl_standard_with_crlf_and_blank_lines() {
        let data = b"{\"prompt\": \"p1\", \"chosen\": \" a\", \"rejected\": \" b\"}\r\n\r\n{\"prompt\": \"p2\", \"chosen\": \"c\", \"rejected\": \"d\"}\r\n\n\n";
        let loaded = load("crlf.jsonl", data).unwrap();
        assert_eq!(loaded.rows.len(), 2);
        assert_eq!(loaded.rows[0].line, 1);
        assert_eq!(loaded.rows[1].line, 3);
        assert_eq!(loaded.rows[1].chosen, plain("c"));
        assert!(!loaded.implicit_prompt && !loaded.conversational);
        assert!(loaded.skipped.is_empty());
    }

    #[test]
    fn jsonl_bom() {
        let data = b"\xEF\xBB\xBF{\"prompt\": \"p\", \"chosen\": \"a\", \"rejected\": \"b\"}\n";
        let loaded = load("bom.jsonl", data).unwrap();
        assert_eq!(loaded.rows[0].prompt, plain("p"));
    }

    #[test]
    fn jsonl_malformed_line() {
        let data = b"{\"prompt\": \"p\", \"chosen\": \"a\", \"rejected\": \"b\"}\n{\"prompt\": \"p\",\n";
        let err = load("bad.jsonl", data).unwrap_err();
        assert_eq!(err_tail(&err), "line 2: malformed JSON");
    }

    #[test]
    fn jsonl_invalid_utf8_line_number() {
        let data = b"{\"prompt\": \"p\", \"chosen\": \"a\", \"rejected\": \"b\"}\n\n{\"prompt\": \"\xff\", \"chosen\": \"a\", \"rejected\": \"b\"}\n";
        let err = load("utf8.jsonl", data).unwrap_err();
        assert_eq!(err_tail(&err), "line 3: invalid UTF-8");
    }

    #[test]
    fn non_string_and_missing_fields() {
        let data = b"{\"prompt\": \"p\", \"chosen\": 3, \"rejected\": \"b\"}\n";
        let err = load("type.jsonl", data).unwrap_err();
        assert_eq!(
            err_tail(&err),
            "line 1: field `chosen` must be a string or a list of `{role, content}` messages, found a number"
        );
        let data = b"{\"prompt\": \"p\", \"chosen\": \"a\"}\n";
        let err = load("missing.jsonl", data).unwrap_err();
        assert_eq!(err_tail(&err), "line 1: field `rejected` is missing");
        let data = b"{\"prompt\": \"p\", \"chosen\": [\"x\"], \"rejected\": \"b\"}\n";
        let err = load("list.jsonl", data).unwrap_err();
        assert_eq!(
            err_tail(&err),
            "line 1: field `chosen` must be a string or a list of `{role, content}` messages, found a list of non-messages"
        );
    }

    /// An empty string is a completion (eos alone, as TRL trains it) beside a prompt; without
    /// one (implicit prompt) it is refused, as is an empty conversation.
    #[test]
    fn empty_completion() {
        let data = b"{\"prompt\": \"p\", \"chosen\": \"\", \"rejected\": \"b\"}\n";
        assert_eq!(load("emptyc.jsonl", data).unwrap().rows[0].chosen, plain(""));
        let data = b"{\"chosen\": \"\", \"rejected\": \"b\"}\n";
        let err = load("emptyi.jsonl", data).unwrap_err();
        assert_eq!(err_tail(&err), "line 1: field `chosen` is empty");
        let data = b"{\"prompt\": [{\"role\": \"user\", \"content\": \"q\"}], \"chosen\": [{\"role\": \"assistant\", \"content\": \"a\"}], \"rejected\": []}\n";
        let err = load("emptym.jsonl", data).unwrap_err();
        assert_eq!(err_tail(&err), "line 1: field `rejected` is empty");
    }

    #[test]
    fn empty_file() {
        for name in ["e.jsonl", "e.json", "e.csv"] {
            let err = load(name, b"").unwrap_err();
            assert!(matches!(err, DataError::Empty { .. }), "{name}: {err}");
        }
        let err = load("blank.jsonl", b"\n\n  \n").unwrap_err();
        assert!(err.to_string().ends_with(": the dataset is empty"));
        let err = load("arr.json", b" [ ] ").unwrap_err();
        assert!(matches!(err, DataError::Empty { .. }));
        let err = load("hdr.csv", b"prompt,chosen,rejected\n").unwrap_err();
        assert!(matches!(err, DataError::Empty { .. }));
    }

    #[test]
    fn unsupported_extension() {
        let path = temp_file("data.xlsx", b"x");
        let err = load_preferences(&path, &LoadOptions::default()).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "`{}`: unsupported data format; use `.jsonl`, `.json`, `.csv`, `.tsv` (each optionally `.gz`), `.parquet`, `.arrow`, or a dataset directory",
                path.display()
            )
        );
    }

    /// Python's `json.dumps` writes NaN and the infinities bare; `datasets` reads them.
    #[test]
    fn python_constants_read_as_null() {
        let lines = b"{\"prompt\": \"NaN?\", \"chosen\": \" Infinity\", \"rejected\": \" b\", \"score\": NaN}\n\
            {\"prompt\": \"p\", \"chosen\": \" a\\\"NaN\", \"rejected\": \" b\", \"s\": [Infinity, -Infinity]}\n";
        for name in ["nan.jsonl", "nan.json"] {
            let loaded = load(name, lines).unwrap();
            assert_eq!(loaded.rows.len(), 2, "{name}");
            assert_eq!(loaded.rows[0].prompt, plain("NaN?"));
            assert_eq!(loaded.rows[0].chosen, plain(" Infinity"));
            assert_eq!(loaded.rows[1].chosen, plain(" a\"NaN"));
        }
        let array = b"[\n {\"prompt\": \"p\", \"chosen\": \" a\", \"rejected\": \" b\", \"score\": -Infinity},\n {\"prompt\": \"p\", \"chosen\": NaN, \"rejected\": \" b\"}\n]";
        let err = load("nan_array.json", array).unwrap_err();
        assert!(err.to_string().ends_with("line 3: field `chosen` is null"), "{err}");
        // A word that only starts like one stays malformed JSON.
        let err = load("nanx.jsonl", b"{\"prompt\": \"p\", \"chosen\": \" a\", \"rejected\": \" b\", \"s\": NaNa}\n")
            .unwrap_err();
        assert!(err.to_string().ends_with("line 1: malformed JSON"), "{err}");
    }

    #[test]
    fn json_array_lines_and_non_object() {
        let data = b"[\n {\"prompt\": \"p\", \"chosen\": \"a\", \"rejected\": \"b\"},\n {\"prompt\": \"p2\",\n  \"chosen\": \"c\", \"rejected\": \"d\"}\n]\n";
        let loaded = load("arr.json", data).unwrap();
        assert_eq!(loaded.rows.iter().map(|r| r.line).collect::<Vec<_>>(), vec![2, 3]);
        let data = b"[\n {\"prompt\": \"p\", \"chosen\": \"a\", \"rejected\": \"b\"},\n 42\n]";
        let err = load("nonobj.json", data).unwrap_err();
        assert_eq!(err_tail(&err), "line 3: the row must be a JSON object, found a number");
        let skipped = load_skip("nonobj2.json", data).unwrap();
        assert_eq!(skipped.rows.len(), 1);
        assert_eq!(skipped.skipped[0].line, 3);
    }

    /// `datasets`' `Dataset.to_json("x.json")` writes JSON Lines under a `.json` name.
    #[test]
    fn json_lines_under_a_json_name() {
        let data = b"{\"prompt\": \"p\", \"chosen\": \"a\", \"rejected\": \"b\"}\n\n{\"prompt\": \"q\", \"chosen\": \"c\", \"rejected\": \"d\"}\n";
        let loaded = load("lines.json", data).unwrap();
        assert_eq!(loaded.rows.iter().map(|r| r.line).collect::<Vec<_>>(), vec![1, 3]);
        let data = b"{\"prompt\": \"p\", \"chosen\": \"a\", \"rejected\": \"b\"}\n{\"prompt\": }\n";
        let err = load("badlines.json", data).unwrap_err();
        assert_eq!(err_tail(&err), "line 2: malformed JSON");
        // One object over several lines is one JSON value, not JSON Lines.
        let err = load("pretty.json", b"{\n  \"prompt\": \"p\"\n}\n").unwrap_err();
        assert!(
            err.to_string()
                .ends_with(": a `.json` data file must hold an array of row objects, or one row object per line"),
            "{err}"
        );
        let err = load("prettybad.json", b"{\n  \"prompt\": \"p\",\n  \"chosen\": }\n").unwrap_err();
        assert_eq!(err_tail(&err), "line 3: malformed JSON");
    }

    /// A JSON array saved under a `.jsonl` name, compact or pretty, reads as the array it is
    /// (`datasets` reads it), each row from the line it starts on.
    #[test]
    fn a_json_array_under_a_jsonl_name() {
        let row = |p: &str| format!("{{\"prompt\": \"{p}\", \"chosen\": \"a\", \"rejected\": \"b\"}}");
        let compact = format!("\u{feff}[{}, {}]", row("p"), row("q"));
        assert_eq!(load("compact.jsonl", compact.as_bytes()).unwrap().rows.len(), 2);
        let pretty = format!("\n[\n  {},\n  {}\n]\n", row("p"), row("q"));
        let loaded = load("pretty.jsonl", pretty.as_bytes()).unwrap();
        assert_eq!(loaded.rows.iter().map(|r| r.line).collect::<Vec<_>>(), vec![3, 4]);
    }

    #[test]
    fn json_array_syntax_errors() {
        let data = b"[\n {\"prompt\": \"p\", \"chosen\": \"a\", \"rejected\": \"b\"},\n {\"prompt\": }\n]";
        let err = load("syn.json", data).unwrap_err();
        assert_eq!(err_tail(&err), "line 3: malformed JSON");
        let data = b"[\n {\"prompt\": \"p\", \"chosen\": \"a\", \"rejected\": \"b\"}\n\n {\"x\": 1}]";
        let err = load("comma.json", data).unwrap_err();
        assert_eq!(err_tail(&err), "line 4: malformed JSON");
        // One object on one line is JSON Lines of one row, as `datasets` reads it.
        let loaded = load("obj.json", b"{\"prompt\": \"p\", \"chosen\": \"a\", \"rejected\": \"b\"}").unwrap();
        assert_eq!(loaded.rows.len(), 1);
        assert_eq!(
            err_tail(&load("half.json", b"{\"prompt\": \"p\"}\n").unwrap_err()),
            "line 1: field `chosen` is missing"
        );
        let data = b"[\n{\"prompt\": \"p\", \"chosen\": \"a\", \"rejected\": \"b\"},\n{\"prompt\": \"\xc3\x28\"}]";
        let err = load("utf8.json", data).unwrap_err();
        assert_eq!(err_tail(&err), "line 3: invalid UTF-8");
    }

    #[test]
    fn csv_quoting_bom_crlf_and_lines() {
        let data = b"\xEF\xBB\xBFprompt,chosen,rejected\r\n\"Say \"\"hi\"\"\",\" a, b\",c\r\n\"multi\nline\",x,y\r\nlast,\" z\",w\r\n";
        let loaded = load("q.csv", data).unwrap();
        assert_eq!(loaded.rows.len(), 3);
        assert_eq!(loaded.rows[0].prompt, plain("Say \"hi\""));
        assert_eq!(loaded.rows[0].chosen, plain(" a, b"));
        assert_eq!(loaded.rows[1].prompt, plain("multi\nline"));
        assert_eq!(loaded.rows.iter().map(|r| r.line).collect::<Vec<_>>(), vec![2, 3, 5]);
    }

    #[test]
    fn csv_missing_column_and_short_row() {
        let err = load("mc.csv", b"prompt,answer,rejected\np,a,b\n").unwrap_err();
        assert!(
            err.to_string().ends_with(": column `chosen` is missing (the header has `prompt`, `answer`, `rejected`)"),
            "{err}"
        );
        let err = load("short.csv", b"prompt,chosen,rejected\np,a,b\np,a\n").unwrap_err();
        assert_eq!(err_tail(&err), "line 3: field `rejected` is missing");
        // An unquoted comma in a completion makes a field too many: the row is bad, not shifted.
        let err = load("long.csv", b"prompt,chosen,rejected\nName a fruit, An apple, a pear., A rock.\n").unwrap_err();
        assert_eq!(err_tail(&err), "line 2: 4 fields where the header names 3");
        // A quote never closed swallows the rest of the file: the error names the quote.
        let err = load("open.csv", b"prompt,chosen,rejected\np,a,b\np,\"a, b\nq,c,d\n").unwrap_err();
        assert_eq!(
            err_tail(&err),
            "line 3: a quoted field opened here is never closed (the rest of the file became its text)"
        );
    }

    /// pandas' NA cells are bad rows (TRL is handed `None` for them); their neighbours are text.
    #[test]
    fn csv_cells_pandas_reads_as_missing() {
        let err = load("na.csv", b"prompt,chosen,rejected\np,a,b\np,\"NA\",b\n").unwrap_err();
        let tail = "line 3: field `chosen` is `NA`, which `datasets` reads from CSV as null (one of pandas' NA values)";
        assert_eq!(err_tail(&err), tail);
        let err = load("empty.tsv", b"prompt\tchosen\trejected\np\ta\t\n").unwrap_err();
        assert!(err_tail(&err).starts_with("line 2: field `rejected` is empty, which"), "{err}");
        let loaded = load("near.csv", b"prompt,chosen,rejected\nna,None ,NONE\n").unwrap();
        assert_eq!((&loaded.rows[0].prompt, &loaded.rows[0].rejected), (&plain("na"), &plain("NONE")));
        let opts = LoadOptions { rows: RowKind::Unpaired { unpair: false }, ..LoadOptions::default() };
        let path = temp_file("kto_na.csv", b"prompt,completion,label\np,c,None\n");
        let err = load_preferences(&path, &opts).unwrap_err();
        assert!(err_tail(&err).starts_with("line 2: field `label` is `None`, which"), "{err}");
    }

    #[test]
    fn csv_invalid_utf8() {
        let err = load("u.csv", b"prompt,chosen,rejected\np,a,b\n\np,\xff,b\n").unwrap_err();
        assert_eq!(err_tail(&err), "line 4: field `chosen` is not valid UTF-8");
    }

    #[test]
    fn custom_column_names() {
        let opts = LoadOptions {
            columns: Columns { prompt: "question".into(), chosen: "good".into(), rejected: "bad".into() },
            ..LoadOptions::default()
        };
        let path = temp_file("custom.jsonl", b"{\"question\": \"q\", \"good\": \"g\", \"bad\": \"b\"}\n");
        let loaded = load_preferences(&path, &opts).unwrap();
        assert_eq!(loaded.rows[0].prompt, plain("q"));
        assert_eq!(loaded.rows[0].rejected, plain("b"));
        let path = temp_file("custom.csv", b"good,question,bad\ng,q,b\n");
        let loaded = load_preferences(&path, &opts).unwrap();
        assert_eq!(loaded.rows[0].chosen, plain("g"));
        let path = temp_file("custom2.jsonl", b"{\"question\": \"q\", \"good\": \"g\"}\n");
        let err = load_preferences(&path, &opts).unwrap_err();
        assert_eq!(err_tail(&err), "line 1: field `bad` is missing");
    }

    #[test]
    fn implicit_prompt_strings() {
        let data = "{\"chosen\": \"Question: 2+2? Answer: 4\", \"rejected\": \"Question: 2+2? Answer: 5\"}\n\
                    {\"chosen\": \"The sky is blue.\", \"rejected\": \"The sky is black.\"}\n\
                    {\"chosen\": \"abc\", \"rejected\": \"abcd\"}\n\
                    {\"chosen\": \"x \", \"rejected\": \"y\"}\n\
                    {\"chosen\": \"café é\", \"rejected\": \"café è\"}\n";
        let loaded = load("implicit.jsonl", data.as_bytes()).unwrap();
        assert!(loaded.implicit_prompt);
        let parts: Vec<(Text, Text, Text)> =
            loaded.rows.into_iter().map(|r| (r.prompt, r.chosen, r.rejected)).collect();
        // The space before the first difference goes to the completions.
        assert_eq!(parts[0], (plain("Question: 2+2? Answer:"), plain(" 4"), plain(" 5")));
        // A split inside a word stays inside it.
        assert_eq!(parts[1], (plain("The sky is bl"), plain("ue."), plain("ack.")));
        // No difference within the shorter one: idx ends at its last index.
        assert_eq!(parts[2], (plain("ab"), plain("c"), plain("cd")));
        // First characters differ and chosen ends with a space: Python's index -1.
        assert_eq!(parts[3], (plain("x"), plain(" "), plain("y")));
        // Characters, not bytes.
        assert_eq!(parts[4], (plain("café"), plain(" é"), plain(" è")));
    }

    #[test]
    fn implicit_prompt_messages() {
        let data = "{\"chosen\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"content\": \"a\"}], \"rejected\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"content\": \"b\"}]}\n";
        let loaded = load("implicit_conv.jsonl", data.as_bytes()).unwrap();
        assert!(loaded.implicit_prompt && loaded.conversational);
        let row = &loaded.rows[0];
        assert_eq!(row.prompt, Text::Messages(vec![msg("user", "q")]));
        assert_eq!(row.chosen, Text::Messages(vec![msg("assistant", "a")]));
        assert_eq!(row.rejected, Text::Messages(vec![msg("assistant", "b")]));
        let data = "{\"chosen\": [{\"role\": \"user\", \"content\": \"q\"}], \"rejected\": [{\"role\": \"user\", \"content\": \"r\"}]}\n";
        let err = load("noshared.jsonl", data.as_bytes()).unwrap_err();
        assert_eq!(
            err_tail(&err),
            "line 1: fields `chosen` and `rejected` share no leading message, so no prompt can be extracted"
        );
    }

    #[test]
    fn conversational_rows_and_mixing() {
        let data = "{\"prompt\": [{\"role\": \"user\", \"content\": \"q\"}], \"chosen\": [{\"role\": \"assistant\", \"content\": \"a\"}], \"rejected\": [{\"role\": \"assistant\", \"content\": \"b\"}]}\n\
                    {\"prompt\": \"q\", \"chosen\": [{\"role\": \"assistant\", \"content\": \"a\"}], \"rejected\": [{\"role\": \"assistant\", \"content\": \"b\"}]}\n\
                    {\"prompt\": \"q\", \"chosen\": \"a\", \"rejected\": \"b\"}\n\
                    {\"prompt\": [{\"role\": \"user\"}], \"chosen\": [{\"role\": \"assistant\", \"content\": \"a\"}], \"rejected\": [{\"role\": \"assistant\", \"content\": \"b\"}]}\n";
        let loaded = load_skip("conv.jsonl", data.as_bytes()).unwrap();
        assert!(loaded.conversational);
        assert_eq!(loaded.rows.len(), 1);
        let reasons: Vec<(usize, String)> = loaded
            .skipped
            .iter()
            .map(|s| (s.line, s.reason.split_once("`, ").map_or(String::new(), |x| x.1.to_string())))
            .collect();
        assert_eq!(
            reasons,
            vec![
                (2, "line 2: field `prompt` is plain text but field `chosen` is a list of messages".to_string()),
                (3, "line 3: the row is plain text but the dataset is conversational (from line 1)".to_string()),
                (4, "line 4: field `prompt`, message 0: `content` is missing".to_string()),
            ]
        );
    }

    #[test]
    fn skip_bad_rows_reports_lines() {
        let data = b"{\"prompt\": \"p\", \"chosen\": \"a\", \"rejected\": \"b\"}\nnot json\n{\"prompt\": \"p\", \"chosen\": 7, \"rejected\": \"b\"}\n{\"prompt\": \"p\", \"chosen\": \"a\", \"rejected\": \"b\"}\n\xfe\n";
        let loaded = load_skip("skip.jsonl", data).unwrap();
        assert_eq!(loaded.rows.iter().map(|r| r.line).collect::<Vec<_>>(), vec![1, 4]);
        assert_eq!(loaded.skipped.iter().map(|s| s.line).collect::<Vec<_>>(), vec![2, 3, 5]);
        assert!(
            loaded.skipped[1].reason.contains("line 3: field `chosen` must be a string"),
            "{}",
            loaded.skipped[1].reason
        );
        let err = load_skip("allbad.jsonl", b"x\ny\n").unwrap_err();
        assert!(err.to_string().ends_with(": the dataset is empty after skipping 2 bad rows"));
    }

    #[test]
    fn rows_leave_in_chunks_in_file_order_with_progress_to_the_end() {
        let n = 2 * CHUNK_ROWS + 5;
        let data: String =
            (0..n).map(|i| format!("{{\"prompt\": \"p{i}\", \"chosen\": \"a\", \"rejected\": \"b\"}}\n")).collect();
        let path = temp_file("chunks.jsonl", data.as_bytes());
        let (mut sizes, mut lines, mut seen) = (Vec::new(), Vec::new(), Vec::new());
        let mut each = |_: &Path, chunk: Vec<PreferenceRow>| {
            sizes.push(chunk.len());
            lines.extend(chunk.iter().map(|r| r.line));
            Ok(())
        };
        let summary =
            read_rows(&path, &LoadOptions::default(), &mut each, &mut |done, total| seen.push((done, total))).unwrap();
        assert_eq!(sizes, vec![CHUNK_ROWS, CHUNK_ROWS, 5]);
        assert_eq!(lines, (1..=n).collect::<Vec<_>>());
        assert_eq!(summary.rows, n);
        let total = data.len() as u64;
        assert_eq!(seen.last(), Some(&(total, total)));
        assert!(seen.windows(2).all(|w| w[0].0 <= w[1].0), "{seen:?}");
    }

    #[test]
    fn gzip_streams_and_a_cut_stream_is_a_decompression_error() {
        use std::io::Write;
        let row = b"{\"prompt\": \"p\", \"chosen\": \"a\", \"rejected\": \"b\"}\n";
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        (0..3 * CHUNK_ROWS).for_each(|_| gz.write_all(row).unwrap());
        let bytes = gz.finish().unwrap();
        assert_eq!(load("rows.jsonl.gz", &bytes).unwrap().rows.len(), 3 * CHUNK_ROWS);
        let err = load("cut.jsonl.gz", &bytes[..bytes.len() / 2]).unwrap_err();
        assert!(err.to_string().ends_with("cut.jsonl.gz`: cannot decompress gzip data"), "{err}");
    }

    #[test]
    fn the_first_row_decides_whether_the_prompt_is_implicit() {
        let data = b"{\"chosen\": \"Q: a\", \"rejected\": \"Q: b\"}\n{\"prompt\": \"Q:\", \"chosen\": \" a\", \"rejected\": \" b\"}\n";
        let err = load("late_prompt.jsonl", data).unwrap_err();
        assert_eq!(
            err_tail(&err),
            "line 2: field `prompt` is present but the first row (line 1) has none, so the prompt is implicit in this dataset"
        );
        let data = b"{\"prompt\": \"Q:\", \"chosen\": \" a\", \"rejected\": \" b\"}\n{\"chosen\": \"Q: a\", \"rejected\": \"Q: b\"}\n";
        assert_eq!(err_tail(&load("early_prompt.jsonl", data).unwrap_err()), "line 2: field `prompt` is missing");
    }

    /// A prompt column the config renames and the data lacks is refused in every format, where
    /// the rows read as implicit-prompt data and took the completions' shared start as prompt.
    #[test]
    fn a_named_prompt_column_that_is_missing_is_refused() {
        let columns = Columns { prompt: "questions".into(), ..Columns::default() };
        let opts = LoadOptions { columns, ..LoadOptions::default() };
        let row = "{\"question\": \"Q?\", \"chosen\": \" It is 4.\", \"rejected\": \" It is 5.\"}\n";
        let csv = "question,chosen,rejected\nQ?, It is 4., It is 5.\n";
        for (name, contents) in [("typo.jsonl", row), ("typo.csv", csv)] {
            let err = load_preferences(&temp_file(name, contents.as_bytes()), &opts).unwrap_err().to_string();
            assert!(err.contains(": no column `questions` (`prompt_column`); data without"), "{name}: {err}");
        }
        // TRL's default name, absent: implicit-prompt data, as before.
        assert!(load("implicit.jsonl", b"{\"chosen\": \"Q: a\", \"rejected\": \"Q: b\"}\n").unwrap().implicit_prompt);
    }

    /// A message's other keys are kept for the chat template, and a conversational row's `tools`
    /// (parsed where it is JSON text, as TRL's `json.loads`) and `chat_template_kwargs`; text that
    /// is not JSON, or keyword arguments that are no object, make a bad row; null sets nothing,
    /// and plain-text rows never use them.
    #[test]
    fn message_keys_and_template_fields_are_kept() {
        let conv = r#"{"prompt": [{"role": "user", "content": "Hi"}], "chosen": [{"role": "assistant", "content": "A", "reasoning_content": "r"}], "rejected": [{"role": "assistant", "content": "B"}]"#;
        let load_with = |extra: &str| load("fields.jsonl", format!("{conv}{extra}}}\n").as_bytes());
        let loaded = load_with("").unwrap();
        let Text::Messages(chosen) = &loaded.rows[0].chosen else { panic!("messages") };
        assert_eq!(chosen[0].extra.get("reasoning_content"), Some(&serde_json::json!("r")));
        assert_eq!(loaded.rows[0].template, None);
        let row =
            load_with(r#", "tools": "[{\"type\": \"function\"}]", "chat_template_kwargs": {"enable_thinking": false}"#)
                .unwrap()
                .rows
                .remove(0);
        let args = row.template.unwrap();
        assert_eq!(args.tools, Some(serde_json::json!([{"type": "function"}])));
        assert_eq!(args.kwargs.get("enable_thinking"), Some(&serde_json::json!(false)));
        assert_eq!(load_with(r#", "tools": null, "chat_template_kwargs": null"#).unwrap().rows[0].template, None);
        let err = load_with(r#", "tools": "[not json""#).unwrap_err();
        assert_eq!(err_tail(&err), "line 1: field `tools` is text that is not JSON");
        let err = load_with(r#", "chat_template_kwargs": "x""#).unwrap_err();
        assert_eq!(err_tail(&err), "line 1: field `chat_template_kwargs` must be an object of keyword arguments");
        let plain = load("plain.jsonl", br#"{"prompt": "p", "chosen": "a", "rejected": "b", "tools": "[]"}"#).unwrap();
        assert_eq!(plain.rows[0].template, None);
    }

    #[test]
    fn a_bad_first_row_does_not_decide_the_prompt() {
        let data = b"{\"chosen\": \"x\"}\n{\"prompt\": \"Q:\", \"chosen\": \" a\", \"rejected\": \" b\"}\n";
        let loaded = load_skip("bad_first.jsonl", data).unwrap();
        assert!(!loaded.implicit_prompt);
        assert_eq!((loaded.rows.len(), loaded.skipped[0].line), (1, 1));
    }
}
