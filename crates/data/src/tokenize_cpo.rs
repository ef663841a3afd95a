//! Rows as TRL 1.16's `CPOTrainer.tokenize_row` makes them (`trl/experimental/cpo/cpo_trainer.py`
//! lines 427-600; `ORPOTrainer` has the same function), for the reference-free losses:
//!
//! 1. Conversations are rendered to text first (`maybe_apply_chat_template`): the prompt with the
//!    assistant's header, the completion as what the whole conversation adds to the prompt's text.
//! 2. Each side is `build_tokenized_answer`: prompt+completion tokenised whole without special
//!    tokens and split after the prompt's own ids, one id earlier where the tokenizer merged the
//!    prompt's last token into the completion.
//! 3. The bos id is prepended to a prompt that does not start with it, and the eos id appended to a
//!    completion that does not end with it (so a ChatML turn, which ends in `<|im_end|>\n`, gets a
//!    second `<|im_end|>`, as TRL gives it).
//!
//! Truncation is [`super::tokenize`]'s keep_start: TRL cuts the completion to what `max_length`
//! leaves after the prompt and keeps a prompt that fills it with an empty completion (whose
//! averaged log-prob is 0/0); such a row is dropped and reported here instead.

use super::error::DataError;
use super::load::{PreferenceRow, Text};
use super::pair::{TokenizedPair, common_prefix_length};
use crate::tokenizer::{Message, TemplateArgs, Tokenizer};

/// One row as `tokenize_row` makes it, and whether its two sides split the prompt differently
/// (TRL then gives each side its own prompt; here the pair keeps their common prefix, and the
/// longer side's remaining prompt ids start its completion).
pub(super) fn tokenize_row(
    row: &PreferenceRow,
    tok: &Tokenizer,
    max_length: Option<usize>,
) -> Result<(TokenizedPair, bool), DataError> {
    let err = |field: &'static str| move |source| DataError::Tokenize { line: row.line, field, source };
    let (prompt, chosen, rejected) = match (&row.prompt, &row.chosen, &row.rejected) {
        (Text::Plain(p), Text::Plain(c), Text::Plain(r)) => (p.clone(), c.clone(), r.clone()),
        (Text::Messages(p), Text::Messages(c), Text::Messages(r)) => {
            let joined = |tail: &[Message]| [p.as_slice(), tail].concat();
            // `maybe_apply_chat_template` passes the row's keyword arguments, not its tools.
            let args = row.template.as_ref().map(|a| TemplateArgs { tools: None, kwargs: a.kwargs.clone() });
            let render = |m: &[Message], header: bool| tok.apply_chat_template_with(m, header, args.as_ref());
            let prompt = render(p, true).map_err(err("prompt"))?;
            let with_chosen = render(&joined(c), false).map_err(err("chosen"))?;
            let with_rejected = render(&joined(r), false).map_err(err("rejected"))?;
            // The prompt's text is what all three renderings share (`maybe_apply_chat_template`).
            let shared = common_text_prefix(common_text_prefix(&prompt, &with_chosen), &with_rejected).len();
            (prompt[..shared].to_owned(), with_chosen[shared..].to_owned(), with_rejected[shared..].to_owned())
        }
        _ => return Err(DataError::MixedRow { line: row.line }),
    };
    let keep = max_length.unwrap_or(usize::MAX);
    let prompt_ids = tok.encode_head(&prompt, false, keep).map_err(err("prompt"))?;
    let side = |answer: &str, field| -> Result<(Vec<u32>, Vec<u32>), DataError> {
        let full = tok.encode_head(&format!("{prompt}{answer}"), false, keep).map_err(err(field))?;
        let mut start = prompt_ids.len().min(full.len());
        if full[..start] != prompt_ids[..] {
            start = start.saturating_sub(1);
        }
        Ok((full[..start].to_vec(), full[start..].to_vec()))
    };
    let (chosen_prompt, chosen_ids) = side(&chosen, "chosen")?;
    let (rejected_prompt, rejected_ids) = side(&rejected, "rejected")?;
    let shared = common_prefix_length(&chosen_prompt, &rejected_prompt);
    let mismatch = shared < chosen_prompt.len().max(rejected_prompt.len());
    // A side whose prompt goes past the shared part keeps those ids in its completion: its
    // sequence stays whole (TRL gives each side its own prompt instead).
    let [mut chosen_ids, mut rejected_ids] = [(&chosen_prompt, chosen_ids), (&rejected_prompt, rejected_ids)]
        .map(|(p, ids)| [&p[shared..], &ids[..]].concat());
    let mut prompt_ids = chosen_prompt[..shared].to_vec();
    if let Some(bos) = tok.bos_id()
        && prompt_ids.first() != Some(&bos)
    {
        prompt_ids.insert(0, bos);
    }
    let eos = tok.eos_id();
    for ids in [&mut chosen_ids, &mut rejected_ids] {
        if ids.last() != Some(&eos) {
            ids.push(eos);
        }
    }
    Ok((TokenizedPair { line: row.line, prompt_ids, chosen_ids, rejected_ids, label: None }, mismatch))
}

/// The longest common prefix of `a` and `b`, at a character boundary.
fn common_text_prefix<'a>(a: &'a str, b: &str) -> &'a str {
    let end = a.char_indices().zip(b.chars()).find(|((_, x), y)| x != y).map_or(a.len().min(b.len()), |((i, _), _)| i);
    &a[..end]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::test_support::{scratch_dir, write_test_tokenizer};

    fn tokenizer(name: &str) -> Tokenizer {
        let dir = scratch_dir(&format!("dpo-cpo-tok-{name}-"));
        let cfg = serde_json::json!({"eos_token": "<|im_end|>", "bos_token": "<|im_start|>"});
        write_test_tokenizer(&dir, &cfg.to_string());
        Tokenizer::from_dir(&dir).unwrap()
    }

    fn row(p: &str, c: &str, r: &str) -> PreferenceRow {
        let t = |s: &str| Text::Plain(s.to_owned());
        PreferenceRow { line: 1, prompt: t(p), chosen: t(c), rejected: t(r), label: None, template: None }
    }

    /// bos prepended once, eos appended unless the completion ends with it; a completion that
    /// merges with the prompt's last token takes that token (TRL's `response_token_ids_start_idx - 1`).
    #[test]
    fn bos_eos_and_the_merged_last_prompt_token() {
        let tok = tokenizer("rules");
        // hello=3 world=4 the=11 sky=10 is=12 blue=8 green=9; bos <|im_start|>=1, eos <|im_end|>=2
        let (pair, mismatch) =
            tokenize_row(&row("hello world", " the sky is blue", " green <|im_end|>"), &tok, None).unwrap();
        assert_eq!(
            (pair.prompt_ids, pair.chosen_ids, pair.rejected_ids),
            (vec![1, 3, 4], vec![11, 10, 12, 8, 2], vec![9, 2])
        );
        assert!(!mismatch);
        // "worldthe" is one unknown word: the prompt's last token merged into both completions.
        let (pair, mismatch) = tokenize_row(&row("hello world", "the sky", "the blue"), &tok, None).unwrap();
        assert_eq!((pair.prompt_ids, pair.chosen_ids, pair.rejected_ids), (vec![1, 3], vec![0, 10, 2], vec![0, 8, 2]));
        assert!(!mismatch, "both sides split the prompt alike");
        // Merged on one side only: the pair keeps the common prefix and says so, and the other
        // side's sequence stays whole ("world" starts its completion).
        let (pair, mismatch) = tokenize_row(&row("hello world", "the sky", " blue"), &tok, None).unwrap();
        assert_eq!((pair.prompt_ids, pair.chosen_ids, pair.rejected_ids), (vec![1, 3], vec![0, 10, 2], vec![4, 8, 2]));
        assert!(mismatch);
    }

    #[test]
    fn the_common_prefix_stops_at_a_character() {
        assert_eq!(common_text_prefix("héllo", "hémm"), "hé");
        assert_eq!(common_text_prefix("abc", "abcdef"), "abc");
        assert_eq!(common_text_prefix("abcdef", "abc"), "abc");
        assert_eq!(common_text_prefix("", "x"), "");
    }
}
