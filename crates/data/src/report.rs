//! What a dataset turned into before the first step: pairs read and kept, what was dropped and
//! why, truncation, token lengths, padding at the configured micro-batch, and the traps TRL users
//! run into (a doubled BOS, an eos written into conversational data), each with its fix.

use serde::Serialize;

use super::{DataSummary, TokenizedPair, Tokenizer};

/// One split's report (`data_report.json` holds one per split of a run).
#[derive(Debug, Clone, Serialize)]
pub struct DataReport {
    /// The file or dataset directory, and the split read from a directory.
    pub source: String,
    pub split: Option<String>,
    /// Rows read (good and bad) and pairs kept for training or evaluation.
    pub rows_read: usize,
    pub pairs_kept: usize,
    pub dropped: Dropped,
    /// Sequences (prompt + a completion) cut to `max_length`.
    pub sequences_truncated: usize,
    /// Pairs kept whose completions differ only past `max_length` (identical ids after truncation).
    pub identical_after_truncation: usize,
    pub max_length: Option<usize>,
    /// Token lengths after truncation.
    pub tokens: Lengths,
    /// Fraction of the tokens a forward pass computes that are padding, with micro-batches of
    /// `micro_batch` consecutive pairs (chosen and rejected rows padded to the longest).
    pub padding_fraction: f64,
    pub micro_batch: usize,
    /// One sentence per trap found, saying how to fix it.
    pub warnings: Vec<String>,
}

/// Rows dropped, by reason.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Dropped {
    /// Malformed rows skipped under `skip_bad_rows`.
    pub bad: usize,
    /// The prompt alone reaches `max_length` (TRL drops these too).
    pub prompt_too_long: usize,
    /// A completion with no token left (it would train on nothing).
    pub empty_completion: usize,
    /// Chosen and rejected are the same text (nothing to prefer: each would add ln 2 to the
    /// sigmoid loss and no gradient).
    pub identical: usize,
}

/// Percentiles of the prompt, chosen and rejected lengths.
#[derive(Debug, Clone, Serialize)]
pub struct Lengths {
    pub prompt: Percentiles,
    pub chosen: Percentiles,
    pub rejected: Percentiles,
}

#[derive(Debug, Clone, Copy, Serialize)]
pub struct Percentiles {
    pub p50: usize,
    pub p90: usize,
    pub p99: usize,
    pub max: usize,
}

impl Percentiles {
    /// Nearest-rank percentiles (the value at or above the fraction of the sorted lengths).
    fn of(mut values: Vec<usize>) -> Self {
        values.sort_unstable();
        let at = |q: f64| {
            let rank = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len().max(1));
            values.get(rank - 1).copied().unwrap_or(0)
        };
        Self { p50: at(0.5), p90: at(0.9), p99: at(0.99), max: values.last().copied().unwrap_or(0) }
    }

    fn text(&self) -> String {
        format!("{}/{}/{}/{}", self.p50, self.p90, self.p99, self.max)
    }
}

/// Where a report's numbers come from.
pub struct ReportInput<'a> {
    pub source: String,
    pub split: Option<String>,
    pub summary: &'a DataSummary,
    pub pairs: &'a [TokenizedPair],
    pub tokenizer: &'a Tokenizer,
    pub max_length: Option<usize>,
    pub micro_batch: usize,
}

impl DataReport {
    pub fn new(input: &ReportInput) -> Self {
        let (pairs, read, t) = (input.pairs, &input.summary.read, &input.summary.tokenized);
        let lengths = |f: fn(&TokenizedPair) -> usize| Percentiles::of(pairs.iter().map(f).collect());
        Self {
            source: input.source.clone(),
            split: input.split.clone(),
            rows_read: read.rows + read.skipped.len(),
            pairs_kept: pairs.len(),
            dropped: Dropped {
                bad: read.skipped.len(),
                prompt_too_long: t.dropped_prompt_too_long.len(),
                empty_completion: t.empty_completion.len(),
                identical: t.identical.len(),
            },
            sequences_truncated: t.truncated,
            identical_after_truncation: t.identical_after_truncation.len(),
            max_length: input.max_length,
            tokens: Lengths {
                prompt: lengths(|p| p.prompt_ids.len()),
                chosen: lengths(|p| p.chosen_ids.len()),
                rejected: lengths(|p| p.rejected_ids.len()),
            },
            padding_fraction: padding_fraction(pairs, input.micro_batch.max(1)),
            micro_batch: input.micro_batch,
            warnings: warnings(input),
        }
    }

    /// A few lines for the console.
    pub fn lines(&self) -> Vec<String> {
        let name = match &self.split {
            Some(split) => format!("`{}` (split `{split}`)", self.source),
            None => format!("`{}`", self.source),
        };
        let d = &self.dropped;
        let t = &self.tokens;
        let mut lines = vec![
            format!(
                "{name}: {} pairs kept of {} rows; dropped {} bad, {} prompt too long, {} empty completion, {} chosen identical to rejected; {} sequences truncated",
                self.pairs_kept,
                self.rows_read,
                d.bad,
                d.prompt_too_long,
                d.empty_completion,
                d.identical,
                self.sequences_truncated
            ),
            format!(
                "  tokens p50/p90/p99/max: prompt {}, chosen {}, rejected {}; padding {:.1}% at micro-batch {}",
                t.prompt.text(),
                t.chosen.text(),
                t.rejected.text(),
                100.0 * self.padding_fraction,
                self.micro_batch
            ),
        ];
        lines.extend(self.warnings.iter().map(|w| format!("  warning: {w}")));
        lines
    }
}

/// Padding over everything computed, batching `micro_batch` consecutive pairs as collation does
/// (2 rows per pair, each as long as the batch's longest sequence).
fn padding_fraction(pairs: &[TokenizedPair], micro_batch: usize) -> f64 {
    let (mut real, mut computed) = (0usize, 0usize);
    for batch in pairs.chunks(micro_batch) {
        let lens: Vec<usize> = batch
            .iter()
            .flat_map(|p| [p.prompt_ids.len() + p.chosen_ids.len(), p.prompt_ids.len() + p.rejected_ids.len()])
            .collect();
        real += lens.iter().sum::<usize>();
        computed += lens.len() * lens.iter().copied().max().unwrap_or(0);
    }
    if computed == 0 { 0.0 } else { 1.0 - real as f64 / computed as f64 }
}

fn warnings(input: &ReportInput) -> Vec<String> {
    let tok = input.tokenizer;
    let mut out = Vec::new();
    let cut_alike = input.summary.tokenized.identical_after_truncation.len();
    if let (true, Some(max)) = (cut_alike > 0, input.max_length) {
        out.push(format!(
            "{cut_alike} pairs have chosen and rejected identical within `max_length` = {max} tokens (they differ only past it): each adds ln 2 to the loss and no gradient; raise `max_length`"
        ));
    }
    if let Some(bos) = tok.bos_id() {
        let twice = input.pairs.iter().filter(|p| p.prompt_ids.starts_with(&[bos, bos])).count();
        if twice > 0 {
            out.push(format!(
                "{twice} prompts start with the BOS token twice: the chat template writes it and the tokenizer adds it again; remove `{{{{ bos_token }}}}` from the template or set `add_bos_token` to false in tokenizer_config.json"
            ));
        }
    }
    let (doubled, eos) = (input.summary.eos_in_content, tok.eos_token());
    if doubled > 0 {
        out.push(format!(
            "{doubled} conversational rows have a completion ending with `{eos}` in its content, and the chat template adds it again: strip `{eos}` from the data"
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::test_support::{CHATML, write_test_tokenizer};
    use crate::{ReadSummary, TokenizeReport};

    fn pair(prompt: &[u32], chosen: usize, rejected: usize) -> TokenizedPair {
        TokenizedPair {
            line: 1,
            prompt_ids: prompt.to_vec(),
            chosen_ids: vec![7; chosen],
            rejected_ids: vec![7; rejected],
            label: None,
        }
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let p = Percentiles::of((1..=100).rev().collect());
        assert_eq!((p.p50, p.p90, p.p99, p.max), (50, 90, 99, 100));
        let p = Percentiles::of(vec![5]);
        assert_eq!((p.p50, p.p99, p.max), (5, 5, 5));
    }

    #[test]
    fn padding_counts_every_row_up_to_its_batchs_longest() {
        // Rows 4, 6 | 2, 2 in one micro-batch: 24 computed, 14 real.
        let pairs = [pair(&[1, 1, 1], 1, 3), pair(&[1], 1, 1)];
        assert!((padding_fraction(&pairs, 2) - (1.0 - 14.0 / 24.0)).abs() < 1e-12);
        // One pair per micro-batch: only the shorter completion pads.
        assert!((padding_fraction(&pairs, 1) - (1.0 - 14.0 / 16.0)).abs() < 1e-12);
    }

    #[test]
    fn a_doubled_bos_and_an_eos_in_the_data_are_warned_with_their_fix() {
        let dir = std::env::temp_dir().join(format!("dpo-report-{}", std::process::id()));
        let config = serde_json::json!({"eos_token": "<|im_end|>", "bos_token": "hello", "chat_template": CHATML});
        write_test_tokenizer(&dir, &config.to_string());
        let tok = Tokenizer::from_dir(&dir).unwrap();
        let read = ReadSummary { rows: 1, skipped: Vec::new(), implicit_prompt: false, conversational: true };
        let summary = DataSummary { read, tokenized: TokenizeReport::default(), eos_in_content: 1 };
        let input = |pairs, summary| ReportInput {
            source: "d.jsonl".into(),
            split: None,
            summary,
            pairs,
            tokenizer: &tok,
            max_length: Some(8),
            micro_batch: 1,
        };
        let doubled = [pair(&[3, 3, 7], 2, 2)];
        let report = DataReport::new(&input(&doubled, &summary));
        assert_eq!(report.warnings.len(), 2, "{:?}", report.warnings);
        assert!(report.warnings[0].starts_with("1 prompts start with the BOS token twice"), "{}", report.warnings[0]);
        assert!(report.warnings[0].contains("remove `{{ bos_token }}`"), "{}", report.warnings[0]);
        assert!(report.warnings[1].contains("strip `<|im_end|>` from the data"), "{}", report.warnings[1]);
        let clean_summary = DataSummary { eos_in_content: 0, ..summary.clone() };
        let single = [pair(&[3, 7], 2, 2)];
        let clean = DataReport::new(&input(&single, &clean_summary));
        assert!(clean.warnings.is_empty(), "{:?}", clean.warnings);
    }
}
