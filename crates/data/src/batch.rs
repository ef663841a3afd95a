//! Batches as the model computes them: the rows of token ids, each column's position, which keys
//! each query sees, and the predictions whose log-probs count.
//!
//! [`Packing::Padded`] is TRL 1.16's `DataCollatorForPreference.torch_call`
//! (`trl/trainer/dpo_trainer.py` lines 146-208): rows `[chosen_0 .. chosen_{B-1}; rejected_0 ..
//! rejected_{B-1}]`, each `prompt_ids ++ completion_ids`, cut to `max_length` keeping the start
//! (or, with `truncation_mode = "keep_end"`, the end: `ids[-max_length:]`, lines 152-166),
//! right-padded with the pad id to the longest row (lines 183-200). A real token
//! only ever attends to earlier tokens of its own row, so the padding needs no mask.
//!
//! [`Packing::Packed`] (TRL's `padding_free`) puts the same sequences end to end in one row
//! without padding: positions restart at each sequence and each sequence is one attention
//! [`Span`], so nothing crosses a boundary. [`Packing::SharedPrompt`] also writes each pair's
//! prompt once, as `[prompt | chosen | rejected]`, the rejected completion attending to the prompt
//! and to itself (prefix sharing, Wang et al. 2024, "Accelerating Direct Preference Optimization
//! with Prefix Sharing"): every token sees exactly the keys it sees in its own padded row, at the
//! same positions, so the log-probs are the padded layout's.
//!
//! Position `t` of a sequence predicts its token `t + 1`: the first completion token is scored
//! from the last prompt position, and a sequence's first token is never scored.

use super::tokenize::{Rows, TokenizedPair, Truncation};

/// How the sequences of a batch are laid out for the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Packing {
    /// TRL's layout: one right-padded row per sequence.
    Padded,
    /// One row without padding, the sequences end to end.
    Packed,
    /// [`Packing::Packed`] with each pair's prompt written once (chosen-only batches pack plainly).
    SharedPrompt,
}

impl Packing {
    /// The layout `padding_free` and `prefix_sharing` (which only applies to packed rows) ask for.
    pub fn of(padding_free: bool, prefix_sharing: bool) -> Self {
        match (padding_free, prefix_sharing) {
            (false, _) => Self::Padded,
            (true, false) => Self::Packed,
            (true, true) => Self::SharedPrompt,
        }
    }

    /// The layout as `truncation` allows it: keep_end cuts a pair's two prompts at different
    /// tokens, so there is no one prompt to share and [`Packing::SharedPrompt`] packs plainly.
    pub fn under(self, truncation: Truncation) -> Self {
        if self == Self::SharedPrompt && truncation.keep_end { Self::Packed } else { self }
    }

    /// How the layout reads in a log line.
    pub fn describe(self) -> &'static str {
        match self {
            Self::Padded => "padded rows: padding_free = false",
            Self::Packed => "packed without padding",
            Self::SharedPrompt => "packed without padding, each prompt once",
        }
    }
}

/// Queries `start..start + len` of a packed row attend causally among themselves and to every key
/// of `prefix` (`(start, len)`, earlier in the row: the prompt a rejected completion shares).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    pub start: usize,
    pub len: usize,
    pub prefix: Option<(usize, usize)>,
}

/// A batch as host data.
///
/// # Shapes
/// - `input_ids`: `[rows, len]`, row-major; `positions`: `[len]` (every row alike)
/// - `at`, `labels`, `seq`: `[N]`, one entry per scored prediction
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    /// Token ids (padding holds the pad id).
    pub input_ids: Vec<i64>,
    /// Rows computed: one per sequence when padded, one when packed.
    pub rows: usize,
    /// Columns of each row.
    pub len: usize,
    /// Each column's position within its sequence (RoPE's position id).
    pub positions: Vec<i64>,
    /// The attention spans of a packed row; empty when every row attends causally on its own.
    pub spans: Vec<Span>,
    /// Number of pairs B.
    pub pairs: usize,
    /// Sequences scored: 2B for a preference batch (chosen ones first), B for a chosen-only one.
    pub sequences: usize,
    /// Flat index (`row * len + column`) of the position whose output predicts each scored token.
    pub at: Vec<i64>,
    /// The scored tokens.
    pub labels: Vec<i64>,
    /// The sequence of each scored token, in `0..sequences`; entries come sequence by sequence.
    pub seq: Vec<i64>,
    /// Tokens of each sequence, prompt included (TRL's attention-mask sum).
    pub lengths: Vec<usize>,
    /// Completion tokens of each sequence before the shift (TRL's `completion_mask.sum(1)`).
    pub completion_lengths: Vec<usize>,
    /// With ORPO's rows, whether each scored prediction is a chosen prompt's token (scored for
    /// ORPO's NLL, which covers the prompt, and kept out of the sequence log-prob); empty otherwise.
    pub prompt_token: Vec<bool>,
    /// With KTO's rows (`[own; KL]` sequences), whether each row is desirable; empty for pairs.
    pub desirable: Vec<bool>,
}

impl Batch {
    /// Token positions computed (rows × columns, padding included).
    pub fn computed_tokens(&self) -> usize {
        self.rows * self.len
    }

    /// Token positions TRL's padded batch of the same sequences computes: one batch of the 2B
    /// sequences for pairs; for KTO's rows, the rows' batch and, where they have KL sequences,
    /// the KL batch, each padded to its own longest.
    pub fn padded_tokens(&self) -> usize {
        let longest = |l: &[usize]| l.iter().copied().max().unwrap_or(0);
        if self.desirable.is_empty() || self.sequences != 2 * self.pairs {
            return self.sequences * longest(&self.lengths);
        }
        let (own, kl) = self.lengths.split_at(self.pairs);
        let with_kl = self.completion_lengths[self.pairs..].iter().any(|&c| c > 0);
        self.pairs * (longest(own) + if with_kl { longest(kl) } else { 0 })
    }

    /// Real tokens of every sequence (TRL's `num_tokens`).
    pub fn tokens(&self) -> usize {
        self.lengths.iter().sum()
    }
}

/// The `[chosen; rejected]` batch of `pairs`, each sequence cut as `truncation` says.
pub fn collate(pairs: &[TokenizedPair], pad_id: u32, truncation: impl Into<Truncation>, packing: Packing) -> Batch {
    let t = truncation.into();
    let chosen = pairs.iter().map(|p| cut(&p.prompt_ids, &p.chosen_ids, t));
    let rejected = pairs.iter().map(|p| cut(&p.prompt_ids, &p.rejected_ids, t));
    let seqs: Vec<Seq> = chosen.chain(rejected).collect();
    let mut b = Builder::new(&seqs, pairs.len());
    b.score_prompts = t.rows == Rows::Orpo;
    b.batch.desirable = pairs.iter().filter_map(|p| p.label).collect();
    match packing.under(t) {
        Packing::Padded => padded(b, &seqs, pad_id),
        Packing::Packed => packed(b, &seqs),
        Packing::SharedPrompt => shared_prompt(b, &seqs, pairs.len()),
    }
}

/// Only the chosen sequences of `pairs` (B of them): supervised fine-tuning's batch.
pub fn collate_chosen(
    pairs: &[TokenizedPair],
    pad_id: u32,
    truncation: impl Into<Truncation>,
    packing: Packing,
) -> Batch {
    let t = truncation.into();
    let seqs: Vec<Seq> = pairs.iter().map(|p| cut(&p.prompt_ids, &p.chosen_ids, t)).collect();
    let b = Builder::new(&seqs, pairs.len());
    match packing {
        Packing::Padded => padded(b, &seqs, pad_id),
        Packing::Packed | Packing::SharedPrompt => packed(b, &seqs),
    }
}

/// A sequence as its prompt and completion, truncated.
type Seq<'a> = (&'a [u32], &'a [u32]);

/// `prompt ++ completion` cut to `max_length`, keeping its start or (`keep_end`) its end.
fn cut<'a>(prompt: &'a [u32], completion: &'a [u32], t: Truncation) -> Seq<'a> {
    let Some(max) = t.max_length else { return (prompt, completion) };
    if t.keep_end {
        // `ids[-max_length:]`: the prompt loses its start first, then the completion.
        let completion = &completion[completion.len().saturating_sub(max)..];
        return (&prompt[prompt.len().saturating_sub(max - completion.len())..], completion);
    }
    let prompt = &prompt[..prompt.len().min(max)];
    (prompt, &completion[..completion.len().min(max - prompt.len())])
}

/// What every layout shares: the lengths, and the scored predictions added sequence by sequence.
struct Builder {
    batch: Batch,
    /// Score the chosen sequences' prompt tokens too ([`Batch::prompt_token`]).
    score_prompts: bool,
}

impl Builder {
    fn new(seqs: &[Seq], pairs: usize) -> Self {
        Self {
            batch: Batch {
                input_ids: Vec::new(),
                rows: 0,
                len: 0,
                positions: Vec::new(),
                spans: Vec::new(),
                pairs,
                sequences: seqs.len(),
                at: Vec::new(),
                labels: Vec::new(),
                seq: Vec::new(),
                lengths: seqs.iter().map(|(p, c)| p.len() + c.len()).collect(),
                completion_lengths: seqs.iter().map(|(_, c)| c.len()).collect(),
                prompt_token: Vec::new(),
                desirable: Vec::new(),
            },
            score_prompts: false,
        }
    }

    /// Scores the completion of sequence `seq`: its token `t` (t >= 1) is predicted at the flat
    /// index `at(t - 1)`.
    /// With `score_prompts`, a chosen sequence's prompt tokens from its second on are scored first.
    fn score(&mut self, seq: usize, (prompt, completion): Seq, at: impl Fn(usize) -> usize) {
        let prompts = self.score_prompts && seq < self.batch.pairs;
        let from = if prompts { 0 } else { prompt.len() };
        for (t, &label) in prompt.iter().chain(completion).enumerate().skip(from.max(1)) {
            self.batch.at.push(at(t - 1) as i64);
            self.batch.labels.push(i64::from(label));
            self.batch.seq.push(seq as i64);
            if self.score_prompts {
                self.batch.prompt_token.push(t < prompt.len());
            }
        }
    }
}

/// One right-padded row per sequence (TRL's collation).
fn padded(mut b: Builder, seqs: &[Seq], pad_id: u32) -> Batch {
    let s = b.batch.lengths.iter().copied().max().unwrap_or(0);
    let mut input_ids = vec![i64::from(pad_id); seqs.len() * s]; // [rows, S]
    for (row, &(prompt, completion)) in seqs.iter().enumerate() {
        for (j, &id) in prompt.iter().chain(completion).enumerate() {
            input_ids[row * s + j] = i64::from(id);
        }
        b.score(row, (prompt, completion), |t| row * s + t);
    }
    Batch { input_ids, rows: seqs.len(), len: s, positions: (0..s as i64).collect(), ..b.batch }
}

/// The sequences end to end in one row, each its own span.
fn packed(mut b: Builder, seqs: &[Seq]) -> Batch {
    let mut offset = 0;
    for (i, &(prompt, completion)) in seqs.iter().enumerate() {
        let n = prompt.len() + completion.len();
        b.batch.input_ids.extend(prompt.iter().chain(completion).map(|&id| i64::from(id)));
        b.batch.positions.extend(0..n as i64);
        if n > 0 {
            b.batch.spans.push(Span { start: offset, len: n, prefix: None });
        }
        b.score(i, (prompt, completion), |t| offset + t);
        offset += n;
    }
    Batch { rows: 1, len: offset, ..b.batch }
}

/// Each pair as `[prompt | chosen | rejected]` in one row: the rejected completion continues the
/// prompt's positions and attends to the prompt and itself.
fn shared_prompt(mut b: Builder, seqs: &[Seq], pairs: usize) -> Batch {
    let (mut offset, mut rejected_at) = (0, Vec::with_capacity(pairs));
    for (i, &(prompt, chosen)) in seqs[..pairs].iter().enumerate() {
        let rejected = seqs[pairs + i].1; // the same prompt, truncated alike
        let (p, c, r) = (prompt.len(), chosen.len(), rejected.len());
        let ids = prompt.iter().chain(chosen).chain(rejected);
        b.batch.input_ids.extend(ids.map(|&id| i64::from(id)));
        b.batch.positions.extend((0..(p + c) as i64).chain(p as i64..(p + r) as i64));
        if p + c > 0 {
            b.batch.spans.push(Span { start: offset, len: p + c, prefix: None });
        }
        if r > 0 {
            b.batch.spans.push(Span { start: offset + p + c, len: r, prefix: (p > 0).then_some((offset, p)) });
        }
        b.score(i, (prompt, chosen), |t| offset + t);
        rejected_at.push(offset);
        offset += p + c + r;
    }
    for (i, start) in rejected_at.into_iter().enumerate() {
        let (prompt, rejected) = seqs[pairs + i];
        let (p, c) = (prompt.len(), seqs[i].1.len());
        // The prompt's last position predicts the first rejected token; the rest follow the chosen.
        b.score(pairs + i, (prompt, rejected), |t| if t < p { start + t } else { start + c + t });
    }
    Batch { rows: 1, len: offset, ..b.batch }
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
            label: None,
        }
    }

    /// `(at, label, seq)` of every scored prediction.
    fn scored(b: &Batch) -> Vec<(i64, i64, i64)> {
        b.at.iter().zip(&b.labels).zip(&b.seq).map(|((&a, &l), &s)| (a, l, s)).collect()
    }

    /// The example of `DataCollatorForPreference`'s docstring: its `input_ids`, and its shifted
    /// completion mask as the scored predictions.
    #[test]
    fn trl_docstring_example() {
        let pairs = [pair(&[1, 2, 3], &[4, 5], &[6]), pair(&[7, 8], &[9], &[10, 11])];
        let b = collate(&pairs, 0, None, Packing::Padded);
        assert_eq!((b.pairs, b.rows, b.len), (2, 4, 5));
        assert_eq!(b.input_ids, vec![1, 2, 3, 4, 5, 7, 8, 9, 0, 0, 1, 2, 3, 6, 0, 7, 8, 10, 11, 0]);
        // completion_mask [[0,0,0,1,1],[0,0,1,0,0],[0,0,0,1,0],[0,0,1,1,0]], predicted one position earlier.
        assert_eq!(scored(&b), vec![(2, 4, 0), (3, 5, 0), (6, 9, 1), (12, 6, 2), (16, 10, 3), (17, 11, 3)]);
        assert_eq!((&b.lengths, &b.completion_lengths), (&vec![5, 3, 4, 4], &vec![2, 1, 1, 2]));
        assert_eq!((b.computed_tokens(), b.padded_tokens(), b.tokens()), (20, 20, 16));
    }

    #[test]
    fn keep_start_truncation() {
        let pairs = [pair(&[1, 2, 3], &[4, 5, 6], &[7]), pair(&[8], &[9], &[10, 11, 12, 13, 14])];
        let b = collate(&pairs, 99, Some(4), Packing::Padded);
        assert_eq!(b.len, 4);
        assert_eq!(b.input_ids, vec![1, 2, 3, 4, 8, 9, 99, 99, 1, 2, 3, 7, 8, 10, 11, 12]);
        assert_eq!(b.completion_lengths, vec![1, 1, 1, 3]);
    }

    /// TRL's `ids[-max_length:]`: each sequence keeps its end, so a pair's two prompts are cut
    /// at different tokens (and a long completion loses its start); nothing is shared then.
    /// ORPO's rows also score the chosen prompt's tokens (from its second), marked as prompt
    /// tokens, in every layout; the completions' predictions are where the plain rows have them.
    #[test]
    fn orpo_rows_score_the_chosen_prompts_too() {
        let pairs = [pair(&[1, 2, 3], &[4, 5], &[6]), pair(&[7], &[8], &[9, 10])];
        let orpo = Truncation { rows: Rows::Orpo, ..Default::default() };
        for packing in [Packing::Padded, Packing::Packed, Packing::SharedPrompt] {
            let b = collate(&pairs, 0, orpo, packing);
            let marked: Vec<(i64, i64, bool)> =
                b.labels.iter().zip(&b.seq).zip(&b.prompt_token).map(|((&l, &s), &p)| (l, s, p)).collect();
            let want = [(2, 0, true), (3, 0, true), (4, 0, false), (5, 0, false), (8, 1, false)];
            assert_eq!(marked[..5], want, "{packing:?}");
            assert_eq!(marked[5..], [(6, 2, false), (9, 3, false), (10, 3, false)], "{packing:?}");
            let plain = collate(&pairs, 0, None, packing);
            let completions: Vec<(i64, i64)> =
                (0..b.at.len()).filter(|&i| !b.prompt_token[i]).map(|i| (b.at[i], b.labels[i])).collect();
            let plain_predictions: Vec<(i64, i64)> =
                plain.at.iter().copied().zip(plain.labels.iter().copied()).collect();
            assert_eq!(completions, plain_predictions, "{packing:?}");
            assert!(plain.prompt_token.is_empty());
        }
    }

    #[test]
    fn keep_end_truncation() {
        let pairs = [pair(&[1, 2, 3], &[4, 5, 6], &[7]), pair(&[8], &[9], &[10, 11, 12, 13, 14])];
        let keep_end = Truncation { max_length: Some(4), keep_end: true, ..Default::default() };
        let b = collate(&pairs, 99, keep_end, Packing::Padded);
        assert_eq!(b.len, 4);
        assert_eq!(b.input_ids, vec![3, 4, 5, 6, 8, 9, 99, 99, 1, 2, 3, 7, 11, 12, 13, 14]);
        assert_eq!(b.completion_lengths, vec![3, 1, 1, 4]);
        assert_eq!(collate(&pairs, 0, keep_end, Packing::SharedPrompt), collate(&pairs, 0, keep_end, Packing::Packed));
        // The training log names the layout collate uses.
        assert_eq!(Packing::SharedPrompt.under(keep_end), Packing::Packed);
        assert_eq!(Packing::SharedPrompt.under(Truncation::from(Some(4))), Packing::SharedPrompt);
    }

    /// Packed, each sequence is a span of its own with positions from 0; the predictions are the
    /// padded layout's, at their packed places.
    #[test]
    fn packed_rows_restart_positions_and_score_the_same_tokens() {
        let pairs = [pair(&[1, 2, 3], &[4, 5], &[6]), pair(&[7, 8], &[9], &[10, 11])];
        let b = collate(&pairs, 0, None, Packing::Packed);
        assert_eq!((b.rows, b.len), (1, 16));
        assert_eq!(b.input_ids, vec![1, 2, 3, 4, 5, 7, 8, 9, 1, 2, 3, 6, 7, 8, 10, 11]);
        assert_eq!(b.positions, vec![0, 1, 2, 3, 4, 0, 1, 2, 0, 1, 2, 3, 0, 1, 2, 3]);
        let starts: Vec<(usize, usize)> = b.spans.iter().map(|s| (s.start, s.len)).collect();
        assert_eq!(starts, vec![(0, 5), (5, 3), (8, 4), (12, 4)]);
        assert!(b.spans.iter().all(|s| s.prefix.is_none()));
        assert_eq!(scored(&b), vec![(2, 4, 0), (3, 5, 0), (6, 9, 1), (10, 6, 2), (13, 10, 3), (14, 11, 3)]);
        assert_eq!((b.computed_tokens(), b.padded_tokens(), b.tokens()), (16, 20, 16));
    }

    /// Shared, each pair is `[prompt | chosen | rejected]`: the rejected completion's positions
    /// continue the prompt's, its first token is predicted from the prompt's last position, and
    /// its span sees the prompt.
    #[test]
    fn shared_prompts_are_written_once() {
        let pairs = [pair(&[1, 2, 3], &[4, 5], &[6]), pair(&[7, 8], &[9], &[10, 11])];
        let b = collate(&pairs, 0, None, Packing::SharedPrompt);
        assert_eq!(b.input_ids, vec![1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]);
        assert_eq!(b.positions, vec![0, 1, 2, 3, 4, 3, 0, 1, 2, 2, 3]);
        assert_eq!(
            b.spans,
            vec![
                Span { start: 0, len: 5, prefix: None },
                Span { start: 5, len: 1, prefix: Some((0, 3)) },
                Span { start: 6, len: 3, prefix: None },
                Span { start: 9, len: 2, prefix: Some((6, 2)) },
            ]
        );
        assert_eq!(scored(&b), vec![(2, 4, 0), (3, 5, 0), (7, 9, 1), (2, 6, 2), (7, 10, 3), (9, 11, 3)]);
        assert_eq!((b.computed_tokens(), b.padded_tokens(), b.tokens()), (11, 20, 16));
    }

    /// A sequence's first token has no position before it: with an empty prompt it is not scored,
    /// and a shared empty prompt leaves the rejected span without a prefix.
    #[test]
    fn an_empty_prompt_scores_from_the_second_token() {
        let pairs = [pair(&[], &[4, 5], &[6, 7])];
        for packing in [Packing::Padded, Packing::Packed, Packing::SharedPrompt] {
            let b = collate(&pairs, 0, None, packing);
            assert_eq!(b.labels, vec![5, 7], "{packing:?}");
        }
        let b = collate(&pairs, 0, None, Packing::SharedPrompt);
        assert_eq!(b.spans[1], Span { start: 2, len: 2, prefix: None });
        assert_eq!(b.at, vec![0, 2]);
    }

    #[test]
    fn chosen_only_batches_pack_plainly() {
        let pairs = [pair(&[1, 2], &[3], &[4]), pair(&[5], &[6, 7], &[8])];
        let b = collate_chosen(&pairs, 0, None, Packing::SharedPrompt);
        assert_eq!((b.sequences, b.input_ids.clone()), (2, vec![1, 2, 3, 5, 6, 7]));
        assert_eq!(scored(&b), vec![(1, 3, 0), (3, 6, 1), (4, 7, 1)]);
    }

    #[test]
    fn empty_slice() {
        for packing in [Packing::Padded, Packing::Packed, Packing::SharedPrompt] {
            let b = collate(&[], 0, None, packing);
            assert_eq!((b.pairs, b.computed_tokens()), (0, 0));
            assert!(b.input_ids.is_empty() && b.at.is_empty());
        }
    }
}
