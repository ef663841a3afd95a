//! How TRL's trainers encode a row's text: the prompt alone, and prompt + completion
//! (`DPOTrainer` and `KTOTrainer` share it).

use super::error::DataError;
use super::load::{PreferenceRow, Text};
use crate::tokenizer::{TemplateArgs, Tokenizer, TokenizerError};

/// `prompt + completion` as `tokenize_fn` encodes it, its first `keep` ids: messages through the
/// chat template without the generation prompt; plain text with the tokenizer's special tokens,
/// the eos text appended to a completion that does not end with it (`add_eos`).
/// `field` names the completion in errors.
pub(crate) fn encode_full(
    tok: &Tokenizer,
    row: &PreferenceRow,
    completion: &Text,
    field: &'static str,
    keep: usize,
) -> Result<Vec<u32>, DataError> {
    let err = |source| DataError::Tokenize { line: row.line, field, source };
    match (&row.prompt, completion) {
        (Text::Messages(p), Text::Messages(c)) => {
            tok.encode_chat_head(&[p.as_slice(), c].concat(), false, row.template.as_deref(), keep).map_err(err)
        }
        (Text::Plain(p), Text::Plain(c)) => {
            let eos = tok.eos_token();
            let c = if c.ends_with(eos) { c.clone() } else { format!("{c}{eos}") };
            tok.encode_head(&format!("{p}{c}"), true, keep).map_err(err)
        }
        // The loader never mixes kinds within a row; a hand-built row might.
        _ => Err(DataError::MixedRow { line: row.line }),
    }
}

/// A prompt's ids as training encodes it (`keep`: as in [`Tokenizer::encode_head`]): plain text
/// with the tokenizer's special tokens (a Llama BOS), messages through the chat template with the
/// assistant's header (the template writes its own special tokens) and the row's `args`.
/// `generate` encodes its prompts here too, so it continues what training's samples continue.
pub fn encode_prompt(
    tok: &Tokenizer,
    prompt: &Text,
    args: Option<&TemplateArgs>,
    keep: usize,
) -> Result<Vec<u32>, TokenizerError> {
    match prompt {
        Text::Plain(text) => tok.encode_head(text, true, keep),
        Text::Messages(messages) => tok.encode_chat_head(messages, true, args, keep),
    }
}
