//! KTO's rows, as TRL 1.16's `KTOTrainer._prepare_dataset` makes them (`trl/trainer/kto_trainer.py`
//! lines 1044-1184), and the KL sequences of its estimate.
//!
//! A row is tokenised as `tokenize_fn` does it: the prompt alone and prompt + completion (the eos
//! text appended to a plain completion, `add_eos`), the completion starting where the two ids
//! diverge. Rows whose prompt alone fills `max_length` are dropped.
//!
//! The KL term is estimated from mismatched (prompt, completion) pairs: within a block of rows,
//! row i's prompt is paired with row i-1's completion and the first row's with the last's
//! (`add_kl_completion_ids`, rotating each `per_device_train_batch_size` block by one). [`with_kl`]
//! puts that completion in each row's `rejected_ids`, so a KTO row collates, is scored and is
//! referenced as a pair: `[own sequence; KL sequence]`.

use super::encode::{encode_full, encode_prompt};
use super::error::DataError;
use super::load::PreferenceRow;
use super::pair::{TokenizedPair, common_prefix_length};
use crate::tokenizer::Tokenizer;

/// One unpaired row, and whether its tokenised prompt is not a prefix of prompt + completion.
/// With `max_length` the completion is computed to `max_length` ids: another row's prompt may
/// be shorter than this one's when it borrows the completion.
pub(super) fn tokenize_row(
    row: &PreferenceRow,
    tok: &Tokenizer,
    max_length: Option<usize>,
) -> Result<(TokenizedPair, bool), DataError> {
    let err = |source| DataError::Tokenize { line: row.line, field: "prompt", source };
    if row.prompt.is_messages() != row.chosen.is_messages() {
        return Err(DataError::MixedRow { line: row.line });
    }
    // A prompt of up to `max - 1` ids (longer ones are dropped) and `max` completion ids.
    let keep = max_length.map_or(usize::MAX, |m| m.saturating_mul(2));
    let prompt_ids = encode_prompt(tok, &row.prompt, row.template.as_deref(), keep).map_err(err)?;
    let full = encode_full(tok, row, &row.chosen, "completion", keep)?;
    let prompt_len = common_prefix_length(&prompt_ids, &full);
    let desirable = row.label.unwrap_or(true);
    let pair = TokenizedPair::unpaired(row.line, full[..prompt_len].to_vec(), full[prompt_len..].to_vec(), desirable);
    Ok((pair, prompt_len < prompt_ids.len()))
}

/// Refuses training rows of one label: KTO learns by pushing desirable completions up and
/// undesirable ones down, and a set of one kind trains one side only (TRL runs it; the weights'
/// balance it advises on has no meaning then). Held-out sets of one label are evaluated.
pub fn check_labels(rows: &[TokenizedPair]) -> Result<(), DataError> {
    let desirable = rows.iter().filter(|p| p.label == Some(true)).count();
    match rows.is_empty() || (desirable > 0 && desirable < rows.len()) {
        true => Ok(()),
        false => Err(DataError::OneLabel { rows: rows.len(), label: desirable > 0 }),
    }
}

/// `rows` with each one's KL completion in `rejected_ids`: rotated by one within consecutive
/// blocks of `block` rows, and each sequence cut to `max_length` as `DataCollatorForUnpairedPreference`
/// cuts it (the row's own completion too).
pub fn with_kl(rows: &[TokenizedPair], block: usize, max_length: Option<usize>) -> Vec<TokenizedPair> {
    let mut out = Vec::with_capacity(rows.len());
    for chunk in rows.chunks(block.max(1)) {
        for (i, row) in chunk.iter().enumerate() {
            let lender = &chunk[(i + chunk.len() - 1) % chunk.len()];
            let room = max_length.map_or(usize::MAX, |m| m.saturating_sub(row.prompt_ids.len()));
            let cut = |ids: &[u32]| ids[..ids.len().min(room)].to_vec();
            out.push(TokenizedPair {
                line: row.line,
                prompt_ids: row.prompt_ids.clone(),
                chosen_ids: cut(&row.chosen_ids),
                rejected_ids: cut(&lender.chosen_ids),
                label: row.label,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(prompt: &[u32], completion: &[u32], desirable: bool) -> TokenizedPair {
        TokenizedPair::unpaired(1, prompt.to_vec(), completion.to_vec(), desirable)
    }

    /// TRL's rotation: `[completion_ids[-1]] + completion_ids[:-1]` within each block.
    #[test]
    fn kl_completions_rotate_within_blocks() {
        let rows = [
            row(&[1], &[10], true),
            row(&[2], &[20], false),
            row(&[3], &[30], true),
            row(&[4], &[40], false),
            row(&[5], &[50], true),
        ];
        let kl: Vec<Vec<u32>> = with_kl(&rows, 2, None).into_iter().map(|r| r.rejected_ids).collect();
        assert_eq!(kl, vec![vec![20], vec![10], vec![40], vec![30], vec![50]]);
        let kl: Vec<Vec<u32>> = with_kl(&rows, 8, None).into_iter().map(|r| r.rejected_ids).collect();
        assert_eq!(kl, vec![vec![50], vec![10], vec![20], vec![30], vec![40]]);
    }

    /// Each sequence keeps `max_length` ids: its own prompt, then as much of a completion as fits.
    #[test]
    fn sequences_are_cut_to_max_length_after_their_own_prompt() {
        let rows = [row(&[1, 1, 1], &[10, 11, 12, 13], true), row(&[2], &[20, 21, 22, 23, 24], false)];
        let kl = with_kl(&rows, 2, Some(5));
        assert_eq!((kl[0].chosen_ids.clone(), kl[0].rejected_ids.clone()), (vec![10, 11], vec![20, 21]));
        assert_eq!(
            (kl[1].chosen_ids.clone(), kl[1].rejected_ids.clone()),
            (vec![20, 21, 22, 23], vec![10, 11, 12, 13])
        );
        assert_eq!(kl[1].label, Some(false));
    }
}
