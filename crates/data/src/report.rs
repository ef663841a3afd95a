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
    /// KTO's rows: how many of those kept are desirable (`None` for pairs).
    pub desirable: Option<usize>,
    /// Whether the padding counts KTO's KL sequences.
    pub kl_rows: bool,
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
    /// CRC-32C of every pair's token ids in order: the data as it trains, which a resume compares
    /// with what its run started on.
    pub ids_crc32c: String,
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
    /// KTO's `desirable_weight` and `undesirable_weight` on a training split (the balance check).
    pub kto_weights: Option<[f64; 2]>,
    /// Whether unpaired rows are scored with a KL sequence (kto; not apo_zero_unpaired).
    pub kl_rows: bool,
}

/// [`DataReport::ids_crc32c`]: each sequence's length, then its ids, little-endian, and a row's
/// label, pair after pair.
fn ids_checksum(pairs: &[TokenizedPair]) -> String {
    let (mut crc, mut bytes) = (0u32, Vec::new());
    for p in pairs {
        for ids in [&p.prompt_ids, &p.chosen_ids, &p.rejected_ids] {
            bytes.clear();
            bytes.extend_from_slice(&(ids.len() as u64).to_le_bytes());
            bytes.extend(ids.iter().flat_map(|id| id.to_le_bytes()));
            crc = dpo_base::checksums::crc32c_append(crc, &bytes);
        }
        crc = dpo_base::checksums::crc32c_append(crc, &[p.label.map_or(2, u8::from)]);
    }
    format!("{crc:08x}")
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
            desirable: unpaired(pairs).then(|| pairs.iter().filter(|p| p.label == Some(true)).count()),
            kl_rows: input.kl_rows,
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
            padding_fraction: padding_fraction(pairs, input.micro_batch.max(1), input.max_length, input.kl_rows),
            micro_batch: input.micro_batch,
            ids_crc32c: ids_checksum(pairs),
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
        if let Some(desirable) = self.desirable {
            let mut lines = vec![
                format!(
                    "{name}: {} rows kept of {} ({desirable} desirable, {} undesirable); dropped {} bad, {} prompt too long, {} empty completion; {} sequences truncated",
                    self.pairs_kept,
                    self.rows_read,
                    self.pairs_kept - desirable,
                    d.bad,
                    d.prompt_too_long,
                    d.empty_completion,
                    self.sequences_truncated
                ),
                format!(
                    "  tokens p50/p90/p99/max: prompt {}, completion {}; padding {:.1}% at micro-batch {}{}",
                    t.prompt.text(),
                    t.chosen.text(),
                    100.0 * self.padding_fraction,
                    self.micro_batch,
                    if self.kl_rows { " (with the KL sequences)" } else { "" }
                ),
            ];
            lines.extend(self.warnings.iter().map(|w| format!("  warning: {w}")));
            return lines;
        }
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

/// Whether the rows are KTO's.
fn unpaired(pairs: &[TokenizedPair]) -> bool {
    pairs.first().is_some_and(|p| p.label.is_some())
}

/// Padding over everything computed, batching `micro_batch` consecutive pairs as collation does
/// (2 rows per pair, each as long as the batch's longest sequence; KTO's rows with their KL
/// sequences).
fn padding_fraction(pairs: &[TokenizedPair], micro_batch: usize, max_length: Option<usize>, kl_rows: bool) -> f64 {
    let with_kl;
    let pairs = if unpaired(pairs) && kl_rows {
        with_kl = crate::kto::with_kl(pairs, micro_batch, max_length);
        &with_kl
    } else {
        pairs
    };
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
    out.extend(input.kto_weights.and_then(|w| kto_balance(input.pairs, w)));
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

/// `KTOTrainer`'s check of the weights against the labels' balance (Eq. 8 of the KTO paper:
/// `desirable_weight · n_D / (undesirable_weight · n_U)` in [1, 4/3]), with its advice.
fn kto_balance(pairs: &[TokenizedPair], [desirable_weight, undesirable_weight]: [f64; 2]) -> Option<String> {
    let desirable = pairs.iter().filter(|p| p.label == Some(true)).count().max(1) as f64;
    let undesirable = (pairs.len() as f64 - desirable).max(1.0);
    if desirable == undesirable {
        return None;
    }
    let round = |x: f64| (x * 100.0).round() / 100.0;
    let des = [
        round(undesirable * undesirable_weight / desirable),
        round(undesirable * undesirable_weight / desirable * 1.33),
    ];
    let und =
        [round(desirable * desirable_weight / undesirable / 1.33), round(desirable * desirable_weight / undesirable)];
    let within = |[lo, hi]: [f64; 2], w: f64| lo <= w && w <= hi;
    if within(des, desirable_weight) || within(und, undesirable_weight) {
        return None;
    }
    Some(format!(
        "{desirable} desirable and {undesirable} undesirable rows: with these counts KTO's paper advises EITHER `desirable_weight` in [{}, {}] OR `undesirable_weight` in [{}, {}] (not both)",
        des[0], des[1], und[0], und[1]
    ))
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

    /// TRL's advice, with its numbers: 3 desirable rows to 1 at weights 1, 1 advise desirable in
    /// [0.33, 0.44] or undesirable in [2.26, 3]; a weight in either range is quiet.
    #[test]
    fn kto_weights_are_checked_against_the_labels_balance() {
        let row = |d| TokenizedPair::unpaired(1, vec![1], vec![2], d);
        let rows = [row(true), row(true), row(true), row(false)];
        let advice = kto_balance(&rows, [1.0, 1.0]).unwrap();
        assert!(advice.contains("`desirable_weight` in [0.33, 0.44] OR `undesirable_weight` in [2.26, 3]"), "{advice}");
        assert_eq!(kto_balance(&rows, [1.0, 2.5]), None);
        assert_eq!(kto_balance(&rows, [0.4, 1.0]), None);
        assert_eq!(kto_balance(&rows[2..], [1.0, 1.0]), None, "balanced");
        // Padding counts each row's KL sequence (its block's other completion).
        assert!((padding_fraction(&rows[2..], 2, None, true) - 0.0).abs() < 1e-12);
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
        assert!((padding_fraction(&pairs, 2, None, false) - (1.0 - 14.0 / 24.0)).abs() < 1e-12);
        // One pair per micro-batch: only the shorter completion pads.
        assert!((padding_fraction(&pairs, 1, None, false) - (1.0 - 14.0 / 16.0)).abs() < 1e-12);
    }

    #[test]
    fn a_doubled_bos_and_an_eos_in_the_data_are_warned_with_their_fix() {
        let dir = crate::tokenizer::test_support::scratch_dir("dpo-report-");
        let config = serde_json::json!({"eos_token": "<|im_end|>", "bos_token": "hello", "chat_template": CHATML});
        write_test_tokenizer(&dir, &config.to_string());
        let tok = Tokenizer::from_dir(&dir).unwrap();
        let read = ReadSummary { rows: 1, skipped: Vec::new(), implicit_prompt: false, conversational: true };
        let summary = DataSummary { read, tokenized: TokenizeReport::default(), eos_in_content: 1 };
        let input = |pairs, summary| ReportInput {
            kto_weights: None,
            kl_rows: false,
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
