//! A split's rows streamed into tokenised pairs: each chunk the reader hands over is tokenised on
//! all cores (or `dataset_num_proc` threads) and its text dropped, so memory holds the ids and one
//! chunk of text, whatever the size of the file.

use std::path::Path;
use std::sync::atomic::AtomicBool;

use serde::{Deserialize, Serialize};

use super::load::{LoadOptions, PreferenceRow, ReadSummary, SkippedRow, Text, read_rows};
use super::tokenize::{TokenizeReport, TokenizedPair, Tokenizing, Truncation};
use super::{DataError, Tokenizer};

/// A split ready to train on, and what became of its rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prepared {
    pub pairs: Vec<TokenizedPair>,
    pub summary: DataSummary,
}

/// Everything the data report needs besides the pairs (kept with them in the cache).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataSummary {
    pub read: ReadSummary,
    pub tokenized: TokenizeReport,
    /// Conversational rows whose chosen or rejected content ends with the eos token's text.
    pub eos_in_content: usize,
}

/// How [`prepare`] tokenises: on `threads` threads (TRL's `dataset_num_proc`; `None`: rayon's
/// global pool, every core of the process), stopping at the next row once `stop` (Ctrl-C's flag)
/// is raised. The pairs do not depend on the number of threads.
#[derive(Debug, Clone, Copy)]
pub struct TokenizeControl<'a> {
    pub threads: Option<usize>,
    pub stop: &'a AtomicBool,
}

/// Never raised: for callers that do not stop on Ctrl-C.
static NEVER: AtomicBool = AtomicBool::new(false);

impl Default for TokenizeControl<'static> {
    fn default() -> Self {
        Self { threads: None, stop: &NEVER }
    }
}

/// Reads `path` (a file, or `opts.split` of a dataset directory) and tokenises it as TRL does
/// (see [`super::tokenize()`]); `progress` gets the bytes read so far and in all. Stopped by
/// `ctl.stop`, it fails with [`DataError::Interrupted`] and has kept nothing.
pub fn prepare(
    path: &Path,
    opts: &LoadOptions,
    tok: &Tokenizer,
    truncation: impl Into<Truncation>,
    ctl: TokenizeControl,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Prepared, DataError> {
    let pool = match ctl.threads {
        Some(threads) => Some(
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .map_err(|source| DataError::Threads { threads, source })?,
        ),
        None => None,
    };
    let mut tokenizing = Tokenizing::new(tok, truncation).stop_on(ctl.stop).skip_refused(opts.skip_bad_rows);
    let (mut refused, mut first_refusal) = (Vec::new(), None);
    let mut eos_in_content = 0;
    let eos = tok.eos_token();
    let mut each = |file: &Path, rows: Vec<PreferenceRow>| {
        eos_in_content +=
            rows.iter().filter(|r| ends_with_eos(&r.chosen, eos) || ends_with_eos(&r.rejected, eos)).count();
        let pushed = match &pool {
            Some(pool) => pool.install(|| tokenizing.push(&rows)),
            None => tokenizing.push(&rows),
        };
        pushed.map_err(|e| e.in_file(file))?;
        for (line, e) in tokenizing.take_refused() {
            let e = e.in_file(file);
            refused.push(SkippedRow { file: file.to_path_buf(), line, reason: dpo_base::error::one_line(&e) });
            first_refusal.get_or_insert(e);
        }
        Ok(())
    };
    let mut read = read_rows(path, opts, &mut each, progress)?;
    // Rows the chat template refused were read as good ones: they count as skipped instead.
    read.rows -= refused.len();
    // Every row refused: the template (or its tokenizer) is at fault, as its first refusal says.
    if let (0, Some(first)) = (read.rows, first_refusal) {
        return Err(first);
    }
    read.skipped.extend(refused);
    // The chat template's refusals among the reader's, in data order (shards in name order).
    read.skipped.sort_by(|a, b| (&a.file, a.line).cmp(&(&b.file, b.line)));
    // Nothing left to train on: the error names the data, as every other one does.
    let (pairs, tokenized) = tokenizing.finish().map_err(|e| e.in_file(path))?;
    Ok(Prepared { pairs, summary: DataSummary { read, tokenized, eos_in_content } })
}

/// A conversational completion whose last message ends with the eos text: the chat template
/// closes the turn itself, so the eos is there twice (TRL appends eos to plain text only when
/// missing, so plain text never doubles it).
fn ends_with_eos(text: &Text, eos: &str) -> bool {
    match text {
        Text::Messages(m) => m.last().is_some_and(|m| !eos.is_empty() && m.text().trim_end().ends_with(eos)),
        Text::Plain(_) => false,
    }
}
