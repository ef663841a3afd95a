//! Preference-data readers: JSON Lines, a JSON array, CSV.
//!
//! The row formats are those TRL's `DPOTrainer` accepts (TRL 1.16 `trl/trainer/dpo_trainer.py`,
//! `_prepare_dataset`): standard (`prompt`/`chosen`/`rejected` strings), conversational (lists of
//! `{role, content}` messages, detected like `trl/data_utils.py` `is_conversational`), and implicit
//! prompt (only `chosen`/`rejected`; the shared prefix becomes the prompt, `trl/data_utils.py`
//! `extract_prompt`). Every bad row either stops the load with an error naming file, line and field,
//! or, with `skip_bad_rows`, is skipped and reported in [`Loaded::skipped`].

use std::io::Read;
use std::path::{Path, PathBuf};

use serde_json::Value;

use self::json::{RawRow, read_json_array, read_json_lines};
use crate::data::error::{DataError, RowProblem};
use crate::data::tokenizer::Message;

mod csv;
pub mod hub;
mod json;
mod parquet;

/// The column (field) names of the three parts of a preference row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Columns {
    /// Prompt column; when no row has it, the prompt is implicit in `chosen`/`rejected`.
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
}

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
    /// The dispreferred completion.
    pub rejected: Text,
}

/// A row that `skip_bad_rows` skipped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedRow {
    /// 1-based physical line.
    pub line: usize,
    /// Why it was skipped (the error it would have raised).
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

/// Reads a preference file, or one split of a dataset directory as the hub lays them out (see
/// [`hub`]), its shards concatenated in name order.
pub fn load_preferences(path: &Path, opts: &LoadOptions) -> Result<Loaded, DataError> {
    if !path.is_dir() {
        return load_file(path, opts);
    }
    let split = opts.split.as_deref().unwrap_or("train");
    let mut shards = hub::split_files(path, split)?.into_iter();
    let Some(first) = shards.next() else {
        let message = format!("no data files for split `{split}`");
        return Err(DataError::Layout { path: path.to_path_buf(), message });
    };
    let mut all = load_file(&first, opts)?;
    for shard in shards {
        let loaded = load_file(&shard, opts)?;
        if loaded.conversational != all.conversational || loaded.implicit_prompt != all.implicit_prompt {
            let message = format!("`{}` and the shards before it differ in format", shard.display());
            return Err(DataError::Layout { path: path.to_path_buf(), message });
        }
        all.rows.extend(loaded.rows);
        all.skipped.extend(loaded.skipped);
    }
    all.path = path.to_path_buf();
    Ok(all)
}

/// Reads one file: the format by its name (`.gz` stripped) and by its first bytes (Parquet's
/// and gzip's magic numbers), so a compressed file under a plain name is still read.
fn load_file(path: &Path, opts: &LoadOptions) -> Result<Loaded, DataError> {
    let name = path.file_name().map(|n| n.to_string_lossy().to_ascii_lowercase()).unwrap_or_default();
    let name = name.strip_suffix(".gz").unwrap_or(&name);
    let ext = name.rsplit_once('.').map(|(_, e)| e);
    let read_err = |source| DataError::Read { path: path.to_path_buf(), source };
    let mut head = [0u8; 4];
    let n = std::fs::File::open(path).and_then(|mut f| f.read(&mut head)).map_err(read_err)?;
    let head = &head[..n];
    let sink = |records| Sink::new(path, opts.skip_bad_rows, records);
    if head == b"PAR1" || ext == Some("parquet") {
        return parquet::read_parquet(path, opts, sink(true));
    }
    let format = match ext {
        Some("jsonl") => Format::JsonLines,
        Some("json") => Format::JsonArray,
        Some("csv") => Format::Csv,
        _ => return Err(DataError::UnsupportedFormat { path: path.to_path_buf() }),
    };
    let mut bytes = std::fs::read(path).map_err(read_err)?;
    if bytes.starts_with(&[0x1f, 0x8b]) {
        let mut plain = Vec::new();
        flate2::read::MultiGzDecoder::new(&bytes[..])
            .read_to_end(&mut plain)
            .map_err(|source| DataError::Gzip { path: path.to_path_buf(), source })?;
        bytes = plain;
    }
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(&bytes);
    let mut sink = sink(false);
    let raw = match format {
        Format::JsonLines => read_json_lines(bytes, &mut sink)?,
        Format::JsonArray => read_json_array(bytes, path)?,
        Format::Csv => return csv::read_csv(bytes, path, opts, sink),
    };
    rows_from_json(raw, opts, sink)
}

enum Format {
    JsonLines,
    JsonArray,
    Csv,
}

/// Collects skipped rows, or turns the first bad row into an error.
struct Sink {
    path: PathBuf,
    skip: bool,
    /// Rows are numbered as Parquet records (from 0), not as lines.
    records: bool,
    skipped: Vec<SkippedRow>,
}

impl Sink {
    fn new(path: &Path, skip: bool, records: bool) -> Self {
        Self { path: path.to_path_buf(), skip, records, skipped: Vec::new() }
    }

    /// Records `err` (about `line`) as skipped, or returns it when rows are not skipped.
    fn bad(&mut self, line: usize, err: DataError) -> Result<(), DataError> {
        if self.skip {
            self.skipped.push(SkippedRow { line, reason: err.to_string() });
            Ok(())
        } else {
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

    /// The final result: an error when no row is left.
    fn finish(
        mut self,
        rows: Vec<PreferenceRow>,
        implicit_prompt: bool,
        conversational: bool,
    ) -> Result<Loaded, DataError> {
        // Syntax errors are found before field errors; report in file order.
        self.skipped.sort_by_key(|s| s.line);
        if rows.is_empty() {
            return Err(if self.skipped.is_empty() {
                DataError::Empty { path: self.path }
            } else {
                DataError::AllSkipped { path: self.path, skipped: self.skipped.len() }
            });
        }
        Ok(Loaded { path: self.path, rows, skipped: self.skipped, implicit_prompt, conversational })
    }
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

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// A field as [`Text`]: a string, or a list of `{role, content}` messages (TRL's
/// `is_conversational`: a list whose first element is a dict with `role`).
fn text_field(value: &Value, field: &str) -> Result<Text, RowProblem> {
    match value {
        Value::String(s) => Ok(Text::Plain(s.clone())),
        Value::Array(items) => {
            let mut messages = Vec::with_capacity(items.len());
            for (index, item) in items.iter().enumerate() {
                let bad = |what| RowProblem::BadMessage { field: field.to_string(), index, what };
                let Value::Object(obj) = item else {
                    if index == 0 {
                        return Err(RowProblem::WrongType {
                            field: field.to_string(),
                            found: "a list of non-messages",
                        });
                    }
                    return Err(bad("must be a `{role, content}` object"));
                };
                let role = match obj.get("role") {
                    Some(Value::String(s)) => s.clone(),
                    None => return Err(bad("`role` is missing")),
                    Some(_) => return Err(bad("`role` must be a string")),
                };
                let content = match obj.get("content") {
                    Some(Value::String(s)) => s.clone(),
                    None => return Err(bad("`content` is missing")),
                    Some(_) => return Err(bad("`content` must be a string")),
                };
                messages.push(Message { role, content });
            }
            Ok(Text::Messages(messages))
        }
        Value::Null => Err(RowProblem::Null { field: field.to_string() }),
        other => Err(RowProblem::WrongType { field: field.to_string(), found: json_kind(other) }),
    }
}

/// Checks JSON rows and builds [`PreferenceRow`]s.
fn rows_from_json(raw: Vec<RawRow>, opts: &LoadOptions, mut sink: Sink) -> Result<Loaded, DataError> {
    let cols = &opts.columns;
    // TRL extracts the prompt when the dataset has no prompt column (`_prepare_dataset`,
    // `if "prompt" not in first_example`); a JSON dataset's columns are the union of its rows' keys.
    let implicit = !raw.iter().any(|r| r.value.as_object().is_some_and(|o| o.contains_key(&cols.prompt)));
    let mut checker = RowChecker::new(cols, implicit);
    for RawRow { line, value } in raw {
        checker.push(line, &value, &mut sink)?;
    }
    checker.finish(sink)
}

/// Turns rows shaped as JSON objects (from any format) into [`PreferenceRow`]s one at a time,
/// holding the dataset's kind to its first row's.
struct RowChecker<'a> {
    cols: &'a Columns,
    implicit: bool,
    /// The first good row's number and whether it is conversational.
    first: Option<(usize, bool)>,
    rows: Vec<PreferenceRow>,
}

impl<'a> RowChecker<'a> {
    fn new(cols: &'a Columns, implicit: bool) -> Self {
        Self { cols, implicit, first: None, rows: Vec::new() }
    }

    fn push(&mut self, line: usize, value: &Value, sink: &mut Sink) -> Result<(), DataError> {
        let Value::Object(obj) = value else {
            return sink.bad_row(line, RowProblem::NotAnObject { found: json_kind(value) });
        };
        let cols = self.cols;
        let get = |field: &str| -> Result<Text, RowProblem> {
            let v = obj.get(field).ok_or_else(|| RowProblem::MissingField { field: field.to_string() })?;
            text_field(v, field)
        };
        let parsed = (|| -> Result<PreferenceRow, RowProblem> {
            let prompt = if self.implicit { None } else { Some(get(&cols.prompt)?) };
            let chosen = get(&cols.chosen)?;
            let rejected = get(&cols.rejected)?;
            build_row(line, prompt, chosen, rejected, cols)
        })();
        let row = match parsed {
            Ok(row) => row,
            Err(problem) => return sink.bad_row(line, problem),
        };
        let conv = row.chosen.is_messages();
        match self.first {
            None => self.first = Some((line, conv)),
            Some((first_line, first_conv)) if first_conv != conv => {
                let kind = |c: bool| if c { "conversational" } else { "plain text" };
                let problem = RowProblem::KindChanged { kind: kind(conv), dataset_kind: kind(first_conv), first_line };
                return sink.bad_row(line, problem);
            }
            Some(_) => {}
        }
        self.rows.push(row);
        Ok(())
    }

    fn finish(self, sink: Sink) -> Result<Loaded, DataError> {
        let conversational = self.first.is_some_and(|(_, c)| c);
        sink.finish(self.rows, self.implicit, conversational)
    }
}

/// Validates the three parts of a row; `prompt` is `None` for implicit-prompt data.
fn build_row(
    line: usize,
    prompt: Option<Text>,
    chosen: Text,
    rejected: Text,
    cols: &Columns,
) -> Result<PreferenceRow, RowProblem> {
    let mixed = |field: &str, a: &Text, other: &str, b: &Text| RowProblem::MixedKinds {
        field: field.to_string(),
        kind: a.kind(),
        other: other.to_string(),
        other_kind: b.kind(),
    };
    if let Some(p) = &prompt {
        if p.is_messages() != chosen.is_messages() {
            return Err(mixed(&cols.prompt, p, &cols.chosen, &chosen));
        }
        if p.is_messages() && p.is_empty() {
            // transformers refuses to render an empty conversation.
            return Err(RowProblem::Empty { field: cols.prompt.clone() });
        }
    }
    if chosen.is_messages() != rejected.is_messages() {
        return Err(mixed(&cols.chosen, &chosen, &cols.rejected, &rejected));
    }
    for (field, text) in [(&cols.chosen, &chosen), (&cols.rejected, &rejected)] {
        if text.is_empty() {
            return Err(RowProblem::Empty { field: field.clone() });
        }
    }
    let (prompt, chosen, rejected) = match prompt {
        Some(p) => (p, chosen, rejected),
        None => extract_prompt(chosen, rejected, cols)?,
    };
    Ok(PreferenceRow { line, prompt, chosen, rejected })
}

/// TRL 1.16 `trl/data_utils.py` `extract_prompt` (lines 623-632), kept exactly:
///
/// ```python
/// for idx in range(min(len(example["chosen"]), len(example["rejected"]))):
///     if example["chosen"][idx] != example["rejected"][idx]:
///         if example["chosen"][idx - 1] == " ":  # remove space before the prompt
///             idx -= 1
///         break
/// return {"prompt": chosen[:idx], "chosen": chosen[idx:], "rejected": rejected[idx:]}
/// ```
///
/// Strings are split by characters (Python indexes code points), message lists by message. When
/// the loop ends without a difference, `idx` is the last index (`min_len - 1`), not `min_len`.
/// When the first characters already differ, `idx - 1` is Python's `-1` (the last character): a
/// trailing space then gives `idx = -1` and Python's negative slicing; that is mirrored too.
/// Message lists never compare equal to `" "`, and a conversation whose first messages differ has
/// no prompt to render, which is reported as a bad row.
fn extract_prompt(chosen: Text, rejected: Text, cols: &Columns) -> Result<(Text, Text, Text), RowProblem> {
    match (chosen, rejected) {
        (Text::Plain(c), Text::Plain(r)) => {
            let cc: Vec<char> = c.chars().collect();
            let rc: Vec<char> = r.chars().collect();
            let idx = split_index(&cc, &rc, |i| cc[i] == ' ');
            let (p, c, r) = (py_slice_to(&cc, idx), py_slice_from(&cc, idx), py_slice_from(&rc, idx));
            let s = |v: &[char]| v.iter().collect::<String>();
            Ok((Text::Plain(s(p)), Text::Plain(s(c)), Text::Plain(s(r))))
        }
        (Text::Messages(c), Text::Messages(r)) => {
            let idx = split_index(&c, &r, |_| false);
            if idx <= 0 {
                return Err(RowProblem::NoSharedPrompt {
                    chosen: cols.chosen.clone(),
                    rejected: cols.rejected.clone(),
                });
            }
            let n = idx as usize;
            Ok((Text::Messages(c[..n].to_vec()), Text::Messages(c[n..].to_vec()), Text::Messages(r[n..].to_vec())))
        }
        // `build_row` has checked that both have the same kind; keep the pair as it is otherwise.
        (c, r) => Ok((Text::Plain(String::new()), c, r)),
    }
}

/// The `idx` of `extract_prompt`'s loop; `is_space(i)` tests `chosen[i] == " "` for `i >= 0`
/// (with `i = len - 1` standing for Python's index `-1`).
fn split_index<T: PartialEq>(c: &[T], r: &[T], is_space: impl Fn(usize) -> bool) -> isize {
    let n = c.len().min(r.len());
    // Callers reject empty completions, so `n >= 1`.
    let mut idx = n as isize - 1;
    for i in 0..n {
        if c[i] != r[i] {
            let prev = if i == 0 { c.len() - 1 } else { i - 1 };
            idx = if is_space(prev) { i as isize - 1 } else { i as isize };
            break;
        }
    }
    idx
}

/// Python's `v[:idx]` for `idx >= -1`.
fn py_slice_to<T>(v: &[T], idx: isize) -> &[T] {
    let end = if idx < 0 { v.len().saturating_sub(1) } else { (idx as usize).min(v.len()) };
    &v[..end]
}

/// Python's `v[idx:]` for `idx >= -1`.
fn py_slice_from<T>(v: &[T], idx: isize) -> &[T] {
    let start = if idx < 0 { v.len().saturating_sub(1) } else { (idx as usize).min(v.len()) };
    &v[start..]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_file(name: &str, contents: &[u8]) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("dpo-load-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, contents).unwrap();
        path
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
        Message { role: role.into(), content: content.into() }
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

    #[test]
    fn empty_completion() {
        let data = b"{\"prompt\": \"p\", \"chosen\": \"\", \"rejected\": \"b\"}\n";
        let err = load("emptyc.jsonl", data).unwrap_err();
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
                "`{}`: unsupported data format; use `.jsonl`, `.json`, `.csv` (each optionally `.gz`), `.parquet`, or a dataset directory",
                path.display()
            )
        );
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

    #[test]
    fn json_array_syntax_errors() {
        let data = b"[\n {\"prompt\": \"p\", \"chosen\": \"a\", \"rejected\": \"b\"},\n {\"prompt\": }\n]";
        let err = load("syn.json", data).unwrap_err();
        assert_eq!(err_tail(&err), "line 3: malformed JSON");
        let data = b"[\n {\"prompt\": \"p\", \"chosen\": \"a\", \"rejected\": \"b\"}\n\n {\"x\": 1}]";
        let err = load("comma.json", data).unwrap_err();
        assert_eq!(err_tail(&err), "line 4: malformed JSON");
        let err = load("obj.json", b"{\"prompt\": \"p\"}").unwrap_err();
        assert!(err.to_string().ends_with(": a `.json` data file must hold an array of row objects"));
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
        let data = b"{\"prompt\": \"p\", \"chosen\": \"a\", \"rejected\": \"b\"}\nnot json\n{\"prompt\": \"p\", \"chosen\": \"\", \"rejected\": \"b\"}\n{\"prompt\": \"p\", \"chosen\": \"a\", \"rejected\": \"b\"}\n\xfe\n";
        let loaded = load_skip("skip.jsonl", data).unwrap();
        assert_eq!(loaded.rows.iter().map(|r| r.line).collect::<Vec<_>>(), vec![1, 4]);
        assert_eq!(loaded.skipped.iter().map(|s| s.line).collect::<Vec<_>>(), vec![2, 3, 5]);
        assert!(loaded.skipped[1].reason.ends_with("line 3: field `chosen` is empty"));
        let err = load_skip("allbad.jsonl", b"x\ny\n").unwrap_err();
        assert!(err.to_string().ends_with(": the dataset is empty after skipping 2 bad rows"));
    }
}
