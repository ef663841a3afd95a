//! What a model accepts, checked from `config.json` before any work: how long a sequence may
//! be, whether every id the tokenizer produces has an embedding row, and whether a reference can
//! score the policy's tokens. Each failure is one line naming the directories (torch would
//! otherwise stop the process with an index error deep in a forward pass).

use std::path::{Path, PathBuf};

use super::llama::{Family, LlamaConfig};

/// A model that cannot run on the given input or next to the given model.
#[derive(Debug, thiserror::Error)]
pub enum CompatError {
    #[error(
        "`{}` has a sequence of {longest} tokens but the model in `{}` {}: pass `--max-length {limit}` or less",
        data.display(), dir.display(), limit_phrase(*.limit, .key)
    )]
    TooLong { data: PathBuf, longest: usize, dir: PathBuf, limit: usize, key: &'static str },
    #[error("the tokenizer has {tokens} tokens but the model in `{}` embeds only {vocab_size} (`vocab_size`)", dir.display())]
    Vocab { tokens: usize, dir: PathBuf, vocab_size: usize },
    #[error("the reference in `{}` ({ref_value}) does not match the policy in `{}` ({policy_value}): its {what} differs", reference.display(), policy.display())]
    Mismatch { policy: PathBuf, reference: PathBuf, what: &'static str, policy_value: String, ref_value: String },
}

impl LlamaConfig {
    /// The longest sequence a forward pass accepts, and the `config.json` key that sets it.
    pub fn position_limit(&self) -> (usize, &'static str) {
        match self.sliding_window {
            Some(window) if window < self.max_position_embeddings => (window, "sliding_window"),
            _ => (self.max_position_embeddings, "max_position_embeddings"),
        }
    }
}

/// What bounds a model's sequences, in words: its positions, or the sliding window of its
/// attention, which dpo-train does not implement (it computes full attention, which equals the
/// windowed one up to the window's length).
pub fn limit_phrase(limit: usize, key: &str) -> String {
    match key {
        "sliding_window" => format!(
            "attends within a sliding window of {limit} tokens (`sliding_window`), which dpo-train does not implement: it takes sequences of at most {limit}"
        ),
        _ => format!("handles at most {limit} (`{key}`)"),
    }
}

/// Refuses sequences (of `longest` tokens, from `data`) the model in `dir` cannot hold.
pub fn check_length(cfg: &LlamaConfig, dir: &Path, longest: usize, data: &Path) -> Result<(), CompatError> {
    let (limit, key) = cfg.position_limit();
    if longest > limit {
        return Err(CompatError::TooLong { data: data.to_owned(), longest, dir: dir.to_owned(), limit, key });
    }
    Ok(())
}

/// Refuses a model without an embedding row for every id of a tokenizer of `tokens` ids.
pub fn check_vocab(cfg: &LlamaConfig, dir: &Path, tokens: usize) -> Result<(), CompatError> {
    if tokens > cfg.vocab_size {
        return Err(CompatError::Vocab { tokens, dir: dir.to_owned(), vocab_size: cfg.vocab_size });
    }
    Ok(())
}

/// Refuses a reference of another family or vocabulary than the policy: its log-probs would be
/// over other tokens.
pub fn check_reference(
    (policy_dir, policy): (&Path, &LlamaConfig),
    (ref_dir, reference): (&Path, &LlamaConfig),
) -> Result<(), CompatError> {
    let mismatch = |what, policy_value: String, ref_value: String| CompatError::Mismatch {
        policy: policy_dir.to_owned(),
        reference: ref_dir.to_owned(),
        what,
        policy_value,
        ref_value,
    };
    if policy.family != reference.family {
        let name = |f: Family| format!("model_type {}", f.model_type());
        return Err(mismatch("architecture", name(policy.family), name(reference.family)));
    }
    if policy.vocab_size != reference.vocab_size {
        let size = |v: usize| format!("vocab_size {v}");
        return Err(mismatch("vocabulary", size(policy.vocab_size), size(reference.vocab_size)));
    }
    Ok(())
}

/// A note when the model embeds more rows than the tokenizer has ids (padded vocabularies, as
/// Qwen's): harmless, the extra rows are never a label.
pub fn spare_rows_note(cfg: &LlamaConfig, dir: &Path, tokens: usize) -> Option<String> {
    (cfg.vocab_size > tokens).then(|| {
        format!(
            "the model in `{}` embeds {} rows and the tokenizer has {tokens} ids: rows {tokens}.. are never a label",
            dir.display(),
            cfg.vocab_size
        )
    })
}

#[cfg(test)]
mod tests {
    /// A sliding window is named as what it is, not as the model's context length.
    #[test]
    fn the_limit_is_named_as_what_it_is() {
        assert_eq!(
            super::limit_phrase(256, "max_position_embeddings"),
            "handles at most 256 (`max_position_embeddings`)"
        );
        let window = super::limit_phrase(4096, "sliding_window");
        assert!(
            window.starts_with(
                "attends within a sliding window of 4096 tokens (`sliding_window`), which dpo-train does not implement"
            ),
            "{window}"
        );
    }
}
