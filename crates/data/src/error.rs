//! Errors of the preference-data pipeline: reading files, checking rows, tokenising.
//!
//! Row errors name the file, the physical line and the field, on one line, as the project's error
//! style asks (uv's `error.rs` is the model: capitalised, no trailing period, values in backticks,
//! causes in `#[source]`).

use std::path::{Path, PathBuf};

use crate::tokenizer::TokenizerError;

/// Everything that can stop loading or tokenising a preference dataset.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// The file could not be read.
    #[error("cannot read `{path}`")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The extension is not one of the supported formats.
    #[error(
        "`{path}`: unsupported data format; use `.jsonl`, `.json`, `.csv`, `.tsv` (each optionally `.gz`), `.parquet`, `.arrow`, or a dataset directory"
    )]
    UnsupportedFormat { path: PathBuf },
    /// A Parquet or Arrow file could not be decoded (`format` names which).
    #[error("`{path}`: cannot read {format}: {message}")]
    Records { path: PathBuf, format: &'static str, message: String },
    /// A gzip stream could not be decompressed.
    #[error("`{path}`: cannot decompress gzip data")]
    Gzip {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A Parquet or Arrow column holds neither strings nor message lists.
    #[error("`{path}`: column `{column}` has type {found}; expected strings or lists of `{{role, content}}` structs")]
    ColumnType { path: PathBuf, column: String, found: String },
    /// A dataset directory without exactly one layout holding the requested split.
    #[error("`{path}`: {message}")]
    Layout { path: PathBuf, message: String },
    /// A row (or, for a `.json` array, the file) is not valid JSON.
    #[error("`{path}`, line {line}: malformed JSON")]
    MalformedJson {
        path: PathBuf,
        line: usize,
        #[source]
        source: serde_json::Error,
    },
    /// A CSV record could not be parsed.
    #[error("`{path}`, line {line}: malformed CSV")]
    MalformedCsv {
        path: PathBuf,
        line: usize,
        #[source]
        source: csv::Error,
    },
    /// A `.json` file whose top level is not an array of rows.
    #[error("`{path}`: a `.json` data file must hold an array of row objects, or one row object per line")]
    NotAnArray { path: PathBuf },
    /// The prompt column the config names (`prompt_column`, not TRL's `prompt`) is not in the
    /// data: read as implicit-prompt data, its prompt would be the completions' shared start.
    #[error(
        "`{path}`: no column `{column}` (`prompt_column`); data without a prompt column takes its prompt from the start `chosen` and `rejected` share (TRL's implicit prompt), which the default `prompt_column` reads"
    )]
    NoPromptColumn { path: PathBuf, column: String },
    /// The CSV header lacks a required column.
    #[error("`{path}`: column `{column}` is missing (the header has {found})")]
    MissingColumn { path: PathBuf, column: String, found: String },
    /// A bad row; `problem` says what is wrong with which field.
    #[error("`{path}`, line {line}: {problem}")]
    BadRow { path: PathBuf, line: usize, problem: RowProblem },
    /// A bad row of a Parquet or Arrow file, numbered from 0 as `datasets` does.
    #[error("`{path}`, row {row}: {problem}")]
    BadRecord { path: PathBuf, row: usize, problem: RowProblem },
    /// The file holds no rows at all.
    #[error("`{path}`: the dataset is empty")]
    Empty { path: PathBuf },
    /// Every row was bad and `skip_bad_rows` skipped them all.
    #[error("`{path}`: the dataset is empty after skipping {skipped} bad rows")]
    AllSkipped { path: PathBuf, skipped: usize },
    /// Tokenising a row failed (a chat template error, for example).
    #[error("line {line}: cannot tokenise field `{field}`")]
    Tokenize {
        line: usize,
        field: &'static str,
        #[source]
        source: TokenizerError,
    },
    /// [`DataError::Tokenize`] of a row of the file `path`.
    #[error("`{path}`, line {line}: cannot tokenise field `{field}`")]
    TokenizeIn {
        path: PathBuf,
        line: usize,
        field: &'static str,
        #[source]
        source: TokenizerError,
    },
    /// Another error of a file's rows (a dataset directory's shard, for one).
    #[error("`{path}`")]
    InFile {
        path: PathBuf,
        #[source]
        source: Box<DataError>,
    },
    /// A row built by hand mixes plain text and message lists (the loader never produces one).
    #[error("line {line}: `prompt`, `chosen` and `rejected` mix plain text and message lists")]
    MixedRow { line: usize },
    /// `tokenize` was given no rows.
    #[error("no rows to tokenise")]
    NoRows,
    /// Every example's prompt alone reached `max_length`, so nothing is left to train on.
    #[error("all {dropped} examples were dropped: each prompt alone has at least `max_length` = {max_length} tokens")]
    AllDropped { dropped: usize, max_length: usize },
    /// Every example's completion tokenised to nothing after its prompt.
    #[error(
        "all {dropped} examples were dropped: no completion token follows the prompt (does the chat template render assistant turns?)"
    )]
    NoCompletions { dropped: usize },
    /// Every example was dropped, for several reasons or because chosen equals rejected;
    /// `reasons` counts each ("3 have chosen identical to rejected, ...").
    #[error("all {total} examples were dropped: {reasons}")]
    NothingLeft { total: usize, reasons: String },
    /// KTO data whose rows all carry one label: its KL estimate and loss need both kinds.
    #[error(
        "field `label`: all {rows} rows are {label}; KTO trains on desirable (true) and undesirable (false) rows, pushing the first up and the second down"
    )]
    OneLabel { rows: usize, label: bool },
    /// Ctrl-C (or SIGTERM) while the data was read and tokenised: nothing was kept or written.
    #[error("interrupted while tokenising: nothing was written")]
    Interrupted,
    /// The pool of `dataset_num_proc` tokenising threads could not be started.
    #[error("cannot start {threads} tokenising threads (`dataset_num_proc`)")]
    Threads {
        threads: usize,
        #[source]
        source: rayon::ThreadPoolBuildError,
    },
}

impl DataError {
    /// `self`, an error of the rows of the file `path`, naming it.
    pub fn in_file(self, path: &Path) -> Self {
        match self {
            Self::Tokenize { line, field, source } => {
                Self::TokenizeIn { path: path.to_path_buf(), line, field, source }
            }
            e => Self::InFile { path: path.to_path_buf(), source: Box::new(e) },
        }
    }

    /// Whether Ctrl-C stopped the reading ([`DataError::Interrupted`], in a file or not).
    pub fn interrupted(&self) -> bool {
        match self {
            Self::Interrupted => true,
            Self::InFile { source, .. } => source.interrupted(),
            _ => false,
        }
    }
}

/// What is wrong with one row; `Display` is the part after "`file`, line N: ".
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RowProblem {
    /// The row is not a JSON object.
    #[error("the row must be a JSON object, found {found}")]
    NotAnObject { found: &'static str },
    /// A required field is absent.
    #[error("field `{field}` is missing")]
    MissingField { field: String },
    /// A conversational row's `tools` or `chat_template_kwargs` that the chat template cannot
    /// take.
    #[error("field `{field}` {what}")]
    TemplateField { field: String, what: &'static str },
    /// A CSV record whose quoted field is never closed: the rest of the file became its text.
    #[error("a quoted field opened here is never closed (the rest of the file became its text)")]
    UnterminatedQuote,
    /// A CSV record with more fields than the header names (pandas, under `datasets`, refuses it).
    #[error("{found} fields where the header names {columns}")]
    ExtraFields { found: usize, columns: usize },
    /// A field is null (a Parquet null, or JSON's `null`).
    #[error("field `{field}` is null")]
    Null { field: String },
    /// A CSV cell that pandas reads as missing (`datasets`' CSV loader hands TRL `None`): empty,
    /// or one of its NA spellings (`found`, quoted).
    #[error("field `{field}` is {found}, which `datasets` reads from CSV as null (one of pandas' NA values)")]
    CsvMissing { field: String, found: String },
    /// A field is neither a string nor a list of messages (or, in CSV, not text).
    #[error("field `{field}` must be a string or a list of `{{role, content}}` messages, found {found}")]
    WrongType { field: String, found: &'static str },
    /// A message of a conversational field is malformed.
    #[error("field `{field}`, message {index}: {what}")]
    BadMessage {
        field: String,
        /// 0-based index of the message in the list.
        index: usize,
        what: &'static str,
    },
    /// A completion (or a conversational prompt) is empty.
    #[error("field `{field}` is empty")]
    Empty { field: String },
    /// A field is not valid UTF-8.
    #[error("field `{field}` is not valid UTF-8")]
    InvalidUtf8Field { field: String },
    /// A JSON Lines row is not valid UTF-8.
    #[error("invalid UTF-8")]
    InvalidUtf8,
    /// The fields of one row mix plain text and message lists.
    #[error("field `{field}` is {kind} but field `{other}` is {other_kind}")]
    MixedKinds { field: String, kind: &'static str, other: String, other_kind: &'static str },
    /// The row's format differs from the dataset's (fixed by its first row, as TRL's
    /// `is_conversational(first_example)` does).
    #[error("the row is {kind} but the dataset is {dataset_kind} (from line {first_line})")]
    KindChanged { kind: &'static str, dataset_kind: &'static str, first_line: usize },
    /// A prompt field in a row of data whose first row has none (TRL decides from the first row).
    #[error(
        "field `{field}` is present but the first row (line {first_line}) has none, so the prompt is implicit in this dataset"
    )]
    PromptAppears { field: String, first_line: usize },
    /// A field that must be a boolean (KTO's `label`) is not one.
    #[error("field `{field}` must be a boolean (true: desirable, false: undesirable), found {found}")]
    NotBoolean { field: String, found: String },
    /// A preference pair in data read for KTO without `unpair`.
    #[error(
        "fields `{chosen}`/`{rejected}` make a preference pair, but `kto` reads `prompt`/`completion`/`label` rows: set `unpair = true` (`--unpair true`) to train on each pair as a desirable and an undesirable row"
    )]
    PairedForKto { chosen: String, rejected: String },
    /// An unpaired (KTO) row in data read as preference pairs.
    #[error(
        "fields `completion`/`label` make an unpaired row, which only `loss_type = kto` reads; pairs need `{chosen}` and `{rejected}`"
    )]
    UnpairedForPairs { chosen: String, rejected: String },
    /// Implicit-prompt conversations whose first messages already differ.
    #[error("fields `{chosen}` and `{rejected}` share no leading message, so no prompt can be extracted")]
    NoSharedPrompt { chosen: String, rejected: String },
}
