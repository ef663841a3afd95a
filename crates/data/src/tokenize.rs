//! Tokenisation of preference rows exactly as TRL 1.16's `DPOTrainer._prepare_dataset` does it
//! (`trl/trainer/dpo_trainer.py` lines 1036-1142, with `_tokenize` and `common_prefix_length` from
//! `trl/data_utils.py` lines 367-425).
//!
//! Per row:
//! 1. Non-conversational data: the eos token text is appended to `chosen` and `rejected` unless
//!    they already end with it (`add_eos`, lines 1058-1069). Conversational data gets no eos: the
//!    chat template closes the assistant turn itself.
//! 2. The prompt is tokenised alone, and prompt+chosen and prompt+rejected are tokenised whole
//!    (`tokenize_fn`, lines 1075-1101): plain text as `tokenizer(text)` (special tokens of the
//!    post-processor included), conversations as `apply_chat_template(tokenize=True)` with
//!    `add_generation_prompt=True` for the prompt alone and without special tokens.
//! 3. `prompt_len` is the shorter common prefix of the prompt ids with either full sequence
//!    (lines 1106-1109); when it is shorter than the prompt ids TRL warns (lines 1110-1121) and we
//!    count the row in [`TokenizeReport::prefix_mismatch`]. The pair is then
//!    `prompt_ids[:prompt_len]`, `chosen_full[prompt_len:]`, `rejected_full[prompt_len:]`
//!    (lines 1123-1125).
//! 4. With `max_length` and keep_start (TRL's default), rows whose prompt ids alone have
//!    `max_length` tokens or more are dropped (lines 1137-1140) and counted; keep_end drops none.
//!
//! Truncation itself happens in TRL's collator (`DataCollatorForPreference.torch_call`, lines
//! 152-166, see [`super::batch::collate`]); with `max_length` the ids returned here are already
//! cut to what that collator keeps (keep_start: the completions' starts; keep_end: their ends and
//! the prompt's tail), so a huge row costs `max_length` ids and not its full length.
//! [`TokenizeReport::truncated`] counts the sequences cut.

use std::sync::atomic::{AtomicBool, Ordering};

use rayon::prelude::*;

use super::error::DataError;
use super::load::PreferenceRow;
use crate::tokenizer::Tokenizer;

use super::encode::encode_full;
pub use super::encode::encode_prompt;
pub use super::pair::{TokenizedPair, common_prefix_length};
pub use dpo_config::{Rows, Truncation};

/// What tokenisation changed or dropped; nothing is dropped without being listed here.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TokenizeReport {
    /// Rows kept.
    pub kept: usize,
    /// Lines of rows dropped because the prompt alone has at least `max_length` tokens.
    pub dropped_prompt_too_long: Vec<usize>,
    /// Lines of rows whose tokenised prompt is not a prefix of the tokenised prompt+completion
    /// (TRL's "The tokenized prompt is not a prefix ..." warning); their completion starts where
    /// the two diverge.
    pub prefix_mismatch: Vec<usize>,
    /// Number of sequences (a chosen or a rejected one, prompt included) longer than `max_length`,
    /// which collation truncates.
    pub truncated: usize,
    /// Lines of rows dropped because their chosen and rejected completions are the same text:
    /// there is nothing to prefer, and each would add ln 2 to the loss and no gradient.
    pub identical: Vec<usize>,
    /// Lines of pairs whose completions differ only past `max_length`, so their truncated ids are
    /// identical; kept, as TRL keeps them (raising `max_length` gives them a difference).
    pub identical_after_truncation: Vec<usize>,
    /// Lines of rows dropped because a completion has no token (nothing to score or train on).
    pub empty_completion: Vec<usize>,
}

/// Tokenises `rows` as TRL's `DPOTrainer` does (see the module doc), the rows on all of rayon's
/// threads (each row alone, so the result does not depend on their number; the first failing
/// row in data order is the one reported).
///
/// Errors: [`DataError::NoRows`] for no rows, [`DataError::Tokenize`] when the tokenizer fails
/// (a conversational row without a chat template, for example), [`DataError::AllDropped`] when
/// `max_length` drops every row, [`DataError::NoCompletions`] when every completion tokenises to
/// nothing, and [`DataError::NothingLeft`] when rows are dropped for other or several reasons.
pub fn tokenize(
    rows: &[PreferenceRow],
    tok: &Tokenizer,
    truncation: impl Into<Truncation>,
) -> Result<(Vec<TokenizedPair>, TokenizeReport), DataError> {
    let mut tokenizing = Tokenizing::new(tok, truncation);
    tokenizing.push(rows)?;
    tokenizing.finish()
}

/// Tokenisation of a dataset that arrives in chunks (see [`tokenize`]).
pub struct Tokenizing<'a> {
    tok: &'a Tokenizer,
    truncation: Truncation,
    pairs: Vec<TokenizedPair>,
    report: TokenizeReport,
    /// Raised (by Ctrl-C) to stop: the rows not yet started are skipped and `push` fails.
    stop: Option<&'a AtomicBool>,
    /// `skip_bad_rows`: a row the tokenizer refuses (a chat template's error) is set aside in
    /// `refused` instead of failing `push`.
    skip: bool,
    refused: Vec<(usize, DataError)>,
}

impl<'a> Tokenizing<'a> {
    pub fn new(tok: &'a Tokenizer, truncation: impl Into<Truncation>) -> Self {
        let truncation = truncation.into();
        let report = TokenizeReport::default();
        Self { tok, truncation, pairs: Vec::new(), report, stop: None, skip: false, refused: Vec::new() }
    }

    /// Sets aside the rows the tokenizer refuses (see [`Self::take_refused`]) instead of failing.
    pub fn skip_refused(self, skip: bool) -> Self {
        Self { skip, ..self }
    }

    /// The rows set aside since the last call, with their errors, in data order.
    pub fn take_refused(&mut self) -> Vec<(usize, DataError)> {
        std::mem::take(&mut self.refused)
    }

    /// Stops at the next row once `stop` is raised: [`Self::push`] then fails with
    /// [`DataError::Interrupted`] (a chunk takes seconds on a large file; a row, microseconds).
    pub fn stop_on(self, stop: &'a AtomicBool) -> Self {
        Self { stop: Some(stop), ..self }
    }

    /// Tokenises the next rows, keeping or dropping each.
    pub fn push(&mut self, rows: &[PreferenceRow]) -> Result<(), DataError> {
        let (tok, stop) = (self.tok, self.stop);
        // keep_end needs every id: the ends are kept.
        let max_length = self.truncation.max_length.filter(|_| !self.truncation.keep_end);
        let stopped = || stop.is_some_and(|s| s.load(Ordering::Relaxed));
        let rows_of = self.truncation.rows;
        let tokenized: Vec<Result<(TokenizedPair, bool), DataError>> = rows
            .par_iter()
            .map(|row| match (stopped(), rows_of) {
                (true, _) => Err(DataError::Interrupted),
                (false, Rows::Dpo | Rows::Sft) => tokenize_row(row, tok, max_length),
                (false, Rows::Cpo | Rows::Orpo) => super::tokenize_cpo::tokenize_row(row, tok, max_length),
                (false, Rows::Kto) => super::kto::tokenize_row(row, tok, max_length),
            })
            .collect();
        if stopped() {
            return Err(DataError::Interrupted);
        }
        for (row, result) in rows.iter().zip(tokenized) {
            let (mut pair, prefix_mismatch) = match result {
                Err(e @ DataError::Tokenize { .. }) if self.skip => {
                    self.refused.push((row.line, e));
                    continue;
                }
                other => other?,
            };
            if pair.label.is_some() {
                self.push_unpaired(pair, prefix_mismatch);
                continue;
            }
            let report = &mut self.report;
            // The supervised stage alone trains on the chosen side: the rejected one drops nothing.
            let paired = self.truncation.rows != Rows::Sft;
            if paired && row.chosen == row.rejected {
                // Nothing to prefer: ln 2 on the loss, no gradient, a zero margin in every mean.
                report.identical.push(pair.line);
                continue;
            }
            if prefix_mismatch {
                report.prefix_mismatch.push(pair.line);
            }
            if let Some(max) = self.truncation.max_length {
                let (p, c, r) = (pair.prompt_ids.len(), pair.chosen_ids.len(), pair.rejected_ids.len());
                // dpo_trainer.py line 1140, under keep_start only: keep `len(prompt_ids) < max_length`.
                if !self.truncation.keep_end && p >= max {
                    report.dropped_prompt_too_long.push(pair.line);
                    continue;
                }
                report.truncated += usize::from(p + c > max) + usize::from(p + r > max);
                if self.truncation.keep_end {
                    keep_ends(&mut pair, max);
                } else {
                    pair.chosen_ids.truncate(max - p);
                    pair.rejected_ids.truncate(max - p);
                }
            }
            if pair.chosen_ids.is_empty() || (paired && pair.rejected_ids.is_empty()) {
                report.empty_completion.push(pair.line);
                continue;
            }
            if paired && pair.chosen_ids == pair.rejected_ids {
                report.identical_after_truncation.push(pair.line);
            }
            // Ids are held for the whole run: no spare capacity.
            for ids in [&mut pair.prompt_ids, &mut pair.chosen_ids, &mut pair.rejected_ids] {
                ids.shrink_to_fit();
            }
            self.pairs.push(pair);
        }
        Ok(())
    }

    /// Keeps or drops an unpaired (KTO) row as `_prepare_dataset` does: dropped when its prompt
    /// alone fills `max_length`; its completion kept to `max_length` ids, which any prompt's KL
    /// sequence can use (the collation cuts each sequence to `max_length`).
    fn push_unpaired(&mut self, mut row: TokenizedPair, prefix_mismatch: bool) {
        let report = &mut self.report;
        if prefix_mismatch {
            report.prefix_mismatch.push(row.line);
        }
        if let Some(max) = self.truncation.max_length {
            if row.prompt_ids.len() >= max {
                report.dropped_prompt_too_long.push(row.line);
                return;
            }
            report.truncated += usize::from(row.prompt_ids.len() + row.chosen_ids.len() > max);
            row.chosen_ids.truncate(max);
        }
        if row.chosen_ids.is_empty() {
            report.empty_completion.push(row.line);
            return;
        }
        row.prompt_ids.shrink_to_fit();
        row.chosen_ids.shrink_to_fit();
        self.pairs.push(row);
    }

    /// The pairs kept and what happened to the rest; an error when none is kept.
    pub fn finish(self) -> Result<(Vec<TokenizedPair>, TokenizeReport), DataError> {
        let (pairs, mut report) = (self.pairs, self.report);
        if pairs.is_empty() {
            let r = &report;
            let (too_long, empty, identical) =
                (r.dropped_prompt_too_long.len(), r.empty_completion.len(), r.identical.len());
            // Prompts are only dropped with `max_length` set.
            let max_length = self.truncation.max_length.unwrap_or(0);
            return Err(match (too_long, empty, identical) {
                (0, 0, 0) => DataError::NoRows,
                (dropped, 0, 0) => DataError::AllDropped { dropped, max_length },
                (0, dropped, 0) => DataError::NoCompletions { dropped },
                _ => {
                    let reasons = [
                        (too_long, format!("prompts reach `max_length` = {max_length} tokens")),
                        (empty, "have no completion token".to_owned()),
                        (identical, "have chosen identical to rejected".to_owned()),
                    ];
                    let reasons: Vec<String> =
                        reasons.iter().filter(|(n, _)| *n > 0).map(|(n, why)| format!("{n} {why}")).collect();
                    DataError::NothingLeft { total: too_long + empty + identical, reasons: reasons.join(", ") }
                }
            });
        }
        report.kept = pairs.len();
        Ok((pairs, report))
    }
}

/// What keep_end's collation keeps of a pair, each sequence its last `max` ids: the completions'
/// last `max` ids, and the prompt's tail as far as the sequence with the shorter completion reaches
/// (the other sequence's shorter tail is cut from it at collation).
fn keep_ends(pair: &mut TokenizedPair, max: usize) {
    for ids in [&mut pair.chosen_ids, &mut pair.rejected_ids] {
        ids.drain(..ids.len().saturating_sub(max));
    }
    let room = max - pair.chosen_ids.len().min(pair.rejected_ids.len());
    pair.prompt_ids.drain(..pair.prompt_ids.len().saturating_sub(room));
}

/// `tokenize_fn` of `_prepare_dataset` for one row (eos already handled here), and whether the
/// tokenised prompt is not a prefix of prompt + completion. With `max_length` only the ids
/// truncation keeps are computed exactly (see [`Tokenizer::encode_head`]).
fn tokenize_row(
    row: &PreferenceRow,
    tok: &Tokenizer,
    max_length: Option<usize>,
) -> Result<(TokenizedPair, bool), DataError> {
    let err = |field: &'static str| move |source| DataError::Tokenize { line: row.line, field, source };
    let keep = max_length.unwrap_or(usize::MAX);
    if row.prompt.is_messages() != row.chosen.is_messages() {
        return Err(DataError::MixedRow { line: row.line });
    }
    let prompt_ids = encode_prompt(tok, &row.prompt, row.template.as_deref(), keep).map_err(err("prompt"))?;
    let chosen_full = encode_full(tok, row, &row.chosen, "chosen", keep)?;
    let rejected_full = encode_full(tok, row, &row.rejected, "rejected", keep)?;
    let prompt_len =
        common_prefix_length(&prompt_ids, &chosen_full).min(common_prefix_length(&prompt_ids, &rejected_full));
    let pair = TokenizedPair {
        line: row.line,
        prompt_ids: prompt_ids[..prompt_len].to_vec(),
        chosen_ids: chosen_full[prompt_len..].to_vec(),
        rejected_ids: rejected_full[prompt_len..].to_vec(),
        label: None,
    };
    Ok((pair, prompt_len < prompt_ids.len()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::Text;
    use crate::tokenizer::Message;
    use crate::tokenizer::test_support::{CHATML, scratch_dir, write_test_tokenizer};

    fn tokenizer(name: &str) -> Tokenizer {
        let dir = scratch_dir(&format!("dpo-tokz-{name}-"));
        let cfg = serde_json::json!({"eos_token": "<|im_end|>", "chat_template": CHATML});
        write_test_tokenizer(&dir, &cfg.to_string());
        Tokenizer::from_dir(&dir).unwrap()
    }

    fn plain_row(line: usize, p: &str, c: &str, r: &str) -> PreferenceRow {
        PreferenceRow {
            line,
            prompt: Text::Plain(p.into()),
            chosen: Text::Plain(c.into()),
            rejected: Text::Plain(r.into()),
            label: None,
            template: None,
        }
    }

    fn m(role: &str, content: &str) -> Message {
        Message { role: role.into(), content: content.into(), ..Message::default() }
    }

    #[test]
    fn plain_rows_get_eos_once() {
        let tok = tokenizer("plain");
        let rows = [plain_row(1, "the sky is", " blue", " green"), plain_row(2, "hello", " world <|im_end|>", " hi")];
        let (pairs, report) = tokenize(&rows, &tok, None).unwrap();
        assert_eq!(pairs[0].prompt_ids, vec![11, 10, 12]);
        assert_eq!(pairs[0].chosen_ids, vec![8, 2]);
        assert_eq!(pairs[0].rejected_ids, vec![9, 2]);
        // Already ends with the eos text: not appended twice.
        assert_eq!(pairs[1].chosen_ids, vec![4, 2]);
        assert_eq!(report.kept, 2);
        assert!(report.prefix_mismatch.is_empty());
        assert_eq!(report.truncated, 0);
    }

    #[test]
    fn conversational_rows_use_the_template_without_eos() {
        let tok = tokenizer("conv");
        let rows = [PreferenceRow {
            line: 4,
            prompt: Text::Messages(vec![m("user", "hi")]),
            chosen: Text::Messages(vec![m("assistant", "blue")]),
            rejected: Text::Messages(vec![m("assistant", "green")]),
            label: None,
            template: None,
        }];
        let (pairs, _) = tokenize(&rows, &tok, None).unwrap();
        // "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n" -> WhitespaceSplit words.
        assert_eq!(pairs[0].prompt_ids, tok.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n").unwrap());
        assert_eq!(pairs[0].chosen_ids, tok.encode("blue<|im_end|>").unwrap());
        assert_eq!(pairs[0].line, 4);
    }

    #[test]
    fn a_template_that_renders_no_completion_drops_the_row() {
        // A template that writes user turns only: the completion adds no token, so the row would
        // reach the loss with nothing to score.
        let dir = scratch_dir("dpo-tokz-useronly-");
        let template = "{% for m in messages %}{% if m['role'] == 'user' %}{{ m['content'] }} {% endif %}{% endfor %}";
        write_test_tokenizer(
            &dir,
            &serde_json::json!({"eos_token": "<|im_end|>", "chat_template": template}).to_string(),
        );
        let tok = Tokenizer::from_dir(&dir).unwrap();
        let row = |line, user: &str| PreferenceRow {
            line,
            prompt: Text::Messages(vec![m("user", user)]),
            chosen: Text::Messages(vec![m("assistant", "blue")]),
            rejected: Text::Messages(vec![m("assistant", "green")]),
            label: None,
            template: None,
        };
        let plain = plain_row(5, "hi", " blue", " green");
        let err = tokenize(&[row(3, "hi")], &tok, None).unwrap_err();
        assert_eq!(
            err.to_string(),
            "all 1 examples were dropped: no completion token follows the prompt (does the chat template render assistant turns?)"
        );
        let rows: Vec<PreferenceRow> = vec![row(3, "hi")];
        let (_, report) = tokenize(&[rows[0].clone(), plain], &tok, None).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((report.empty_completion, report.kept), (vec![3], 1));
    }

    #[test]
    fn prefix_mismatch_uses_common_prefix() {
        let tok = tokenizer("mismatch");
        // WordLevel on whitespace: "hello" + "world" merges into the unknown word "helloworld".
        let rows = [plain_row(7, "the hello", "world", " sky")];
        let (pairs, report) = tokenize(&rows, &tok, None).unwrap();
        assert_eq!(report.prefix_mismatch, vec![7]);
        assert_eq!(pairs[0].prompt_ids, vec![11]);
        assert_eq!(pairs[0].chosen_ids, vec![0, 2]);
        assert_eq!(pairs[0].rejected_ids, vec![3, 10, 2]);
    }

    #[test]
    fn max_length_drops_and_counts() {
        let tok = tokenizer("maxlen");
        let rows =
            [plain_row(1, "the sky is blue", " hi", " hello world"), plain_row(2, "hi", " the sky is blue", " green")];
        let (pairs, report) = tokenize(&rows, &tok, Some(4)).unwrap();
        assert_eq!(pairs.len(), 1);
        assert_eq!(pairs[0].line, 2);
        assert_eq!(report.dropped_prompt_too_long, vec![1]);
        // Row 2: 1 + 5 > 4 (chosen) is cut, 1 + 2 (rejected) is not.
        assert_eq!(report.truncated, 1);
        let err = tokenize(&rows[..1], &tok, Some(4)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "all 1 examples were dropped: each prompt alone has at least `max_length` = 4 tokens"
        );
    }

    #[test]
    fn missing_template_names_the_line() {
        let dir = scratch_dir("dpo-tokz-notpl-");
        write_test_tokenizer(&dir, "{\"eos_token\": \"<|im_end|>\"}");
        let tok = Tokenizer::from_dir(&dir).unwrap();
        let rows = [PreferenceRow {
            line: 3,
            prompt: Text::Messages(vec![m("user", "hi")]),
            chosen: Text::Messages(vec![m("assistant", "blue")]),
            rejected: Text::Messages(vec![m("assistant", "green")]),
            label: None,
            template: None,
        }];
        let err = tokenize(&rows, &tok, None).unwrap_err();
        assert_eq!(err.to_string(), "line 3: cannot tokenise field `prompt`");
        assert!(matches!(tokenize(&[], &tok, None), Err(DataError::NoRows)));
        let mixed = [PreferenceRow {
            line: 5,
            prompt: Text::Plain("hi".into()),
            chosen: Text::Messages(vec![m("assistant", "blue")]),
            rejected: Text::Plain("green".into()),
            label: None,
            template: None,
        }];
        let err = tokenize(&mixed, &tok, None).unwrap_err();
        assert_eq!(err.to_string(), "line 5: `prompt`, `chosen` and `rejected` mix plain text and message lists");
    }

    #[test]
    fn common_prefix() {
        assert_eq!(common_prefix_length(&[1, 2, 3], &[1, 2, 4, 5]), 2);
        assert_eq!(common_prefix_length(&[1, 2], &[1, 2, 3]), 2);
        assert_eq!(common_prefix_length(&[], &[1]), 0);
    }
}
