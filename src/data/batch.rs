//! Collation of tokenised pairs into the concatenated DPO batch, as TRL 1.16's
//! `DataCollatorForPreference.torch_call` builds it (`trl/trainer/dpo_trainer.py` lines 146-208):
//! rows `[chosen_0 .. chosen_{B-1}; rejected_0 .. rejected_{B-1}]`, each `prompt_ids ++
//! completion_ids`, cut to `max_length` keeping the start (lines 152-166), right-padded with the pad
//! id to the longest row (lines 183-200); the attention mask is 1 on real tokens and the completion
//! mask 1 on completion tokens.

use std::num::NonZeroUsize;

use super::tokenize::TokenizedPair;

/// A collated batch as plain host data.
///
/// # Shapes
/// - `input_ids`, `attention_mask`, `completion_mask`: `[2B, S]`, row-major
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    /// Token ids, padded with the pad id.
    pub input_ids: Vec<i64>,
    /// 1 on real tokens, 0 on padding.
    pub attention_mask: Vec<i64>,
    /// 1 on completion tokens (whose log-probs count), 0 on prompt and padding.
    pub completion_mask: Vec<i64>,
    /// Number of pairs B.
    pub batch_size: usize,
    /// Rows held: 2B for a preference batch ([`collate`]), B for a chosen-only one ([`collate_chosen`]).
    pub rows: usize,
    /// Padded length S.
    pub seq_len: usize,
}

impl Batch {
    /// Row `i` of `input_ids` (`0 <= i < 2B`).
    pub fn row(&self, i: usize) -> &[i64] {
        &self.input_ids[i * self.seq_len..(i + 1) * self.seq_len]
    }
}

/// Collates `pairs` into one batch; `max_length` truncates each sequence keeping its start.
pub fn collate(pairs: &[TokenizedPair], pad_id: u32, max_length: Option<usize>) -> Batch {
    let chosen = pairs.iter().map(|p| (p.prompt_ids.as_slice(), p.chosen_ids.as_slice()));
    let rejected = pairs.iter().map(|p| (p.prompt_ids.as_slice(), p.rejected_ids.as_slice()));
    collate_rows(chosen.chain(rejected), pairs.len(), pad_id, max_length)
}

/// Collates only the chosen sequences of `pairs` (B rows): supervised fine-tuning's batch.
pub fn collate_chosen(pairs: &[TokenizedPair], pad_id: u32, max_length: Option<usize>) -> Batch {
    let chosen = pairs.iter().map(|p| (p.prompt_ids.as_slice(), p.chosen_ids.as_slice()));
    collate_rows(chosen, pairs.len(), pad_id, max_length)
}

/// Pads `(prompt, completion)` rows, each cut to `max_length` keeping its start.
fn collate_rows<'a>(
    rows: impl Iterator<Item = (&'a [u32], &'a [u32])>,
    pairs: usize,
    pad_id: u32,
    max_length: Option<usize>,
) -> Batch {
    let seqs: Vec<(&[u32], &[u32])> = rows
        .map(|(prompt, completion)| {
            let Some(max) = max_length else {
                return (prompt, completion);
            };
            let prompt = &prompt[..prompt.len().min(max)];
            let room = max - prompt.len();
            (prompt, &completion[..completion.len().min(room)])
        })
        .collect();
    let n = seqs.len();
    let s = seqs.iter().map(|(p, c)| p.len() + c.len()).max().unwrap_or(0);
    let mut input_ids = vec![i64::from(pad_id); n * s]; // [rows, S]
    let mut attention_mask = vec![0i64; n * s]; // [rows, S]
    let mut completion_mask = vec![0i64; n * s]; // [rows, S]
    for (row, (prompt, completion)) in seqs.iter().enumerate() {
        let start = row * s;
        for (j, &id) in prompt.iter().chain(completion.iter()).enumerate() {
            input_ids[start + j] = i64::from(id);
            attention_mask[start + j] = 1;
            if j >= prompt.len() {
                completion_mask[start + j] = 1;
            }
        }
    }
    Batch { input_ids, attention_mask, completion_mask, batch_size: pairs, rows: n, seq_len: s }
}

/// Batches of `batch_size` pairs in dataset order (the last one may be smaller, as with a
/// `DataLoader` without `drop_last`).
pub fn batches(
    pairs: &[TokenizedPair],
    batch_size: NonZeroUsize,
    pad_id: u32,
    max_length: Option<usize>,
) -> impl Iterator<Item = Batch> + '_ {
    pairs.chunks(batch_size.get()).map(move |chunk| collate(chunk, pad_id, max_length))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(prompt: &[u32], chosen: &[u32], rejected: &[u32]) -> TokenizedPair {
        TokenizedPair {
            line: 1,
            prompt_ids: prompt.to_vec(),
            chosen_ids: chosen.to_vec(),
            rejected_ids: rejected.to_vec(),
        }
    }

    /// The example of `DataCollatorForPreference`'s docstring.
    #[test]
    fn trl_docstring_example() {
        let pairs = [pair(&[1, 2, 3], &[4, 5], &[6]), pair(&[7, 8], &[9], &[10, 11])];
        let batch = collate(&pairs, 0, None);
        assert_eq!((batch.batch_size, batch.seq_len), (2, 5));
        assert_eq!(batch.input_ids, vec![1, 2, 3, 4, 5, 7, 8, 9, 0, 0, 1, 2, 3, 6, 0, 7, 8, 10, 11, 0]);
        assert_eq!(batch.attention_mask, vec![1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 0, 1, 1, 1, 1, 0]);
        assert_eq!(batch.completion_mask, vec![0, 0, 0, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 1, 0]);
        assert_eq!(batch.row(3), &[7, 8, 10, 11, 0]);
    }

    #[test]
    fn keep_start_truncation() {
        let pairs = [pair(&[1, 2, 3], &[4, 5, 6], &[7]), pair(&[8], &[9], &[10, 11, 12, 13, 14])];
        let batch = collate(&pairs, 99, Some(4));
        assert_eq!(batch.seq_len, 4);
        assert_eq!(batch.input_ids, vec![1, 2, 3, 4, 8, 9, 99, 99, 1, 2, 3, 7, 8, 10, 11, 12]);
        assert_eq!(batch.completion_mask, vec![0, 0, 0, 1, 0, 1, 0, 0, 0, 0, 0, 1, 0, 1, 1, 1]);
    }

    #[test]
    fn batches_in_order_with_a_short_last_one() {
        let pairs: Vec<TokenizedPair> = (0..5).map(|i| pair(&[i], &[10 + i], &[20 + i, 30])).collect();
        let all: Vec<Batch> = batches(&pairs, NonZeroUsize::new(2).unwrap(), 0, None).collect();
        assert_eq!(all.iter().map(|b| b.batch_size).collect::<Vec<_>>(), vec![2, 2, 1]);
        assert_eq!(all[2].input_ids, vec![4, 14, 0, 4, 24, 30]);
        assert_eq!(all[1].row(0), &[2, 12, 0]);
    }

    #[test]
    fn empty_slice() {
        let batch = collate(&[], 0, None);
        assert_eq!((batch.batch_size, batch.seq_len), (0, 0));
        assert!(batch.input_ids.is_empty());
    }
}
