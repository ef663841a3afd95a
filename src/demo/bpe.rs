//! Trains a small byte-level BPE tokenizer with the `tokenizers` crate, for the offline demo.
//!
//! The tokenizer is GPT-2's design (`transformers` `GPT2TokenizerFast`: a `ByteLevel`
//! pre-tokenizer and decoder over all 256 bytes, so any text encodes without an unknown token),
//! with two changes for small arithmetic data: digits are split one per token first
//! (`pre_tokenizers.Digits(individual_digits=True)`, as Llama 3 and Qwen 2 split numbers), and the
//! first word gets no prefix space (`add_prefix_space=False`), so a prompt's tokens are a prefix of
//! prompt+completion's. The special tokens are `<|endoftext|>` (the eos token) and `<|pad|>`; there
//! is no bos token and no chat template. The files written are those
//! [`crate::data::tokenizer::Tokenizer::from_dir`] reads: `tokenizer.json` and `tokenizer_config.json`.
//!
//! Training is deterministic: `tokenizers`' BPE trainer sorts the alphabet and breaks ties between
//! equally frequent pairs by pair id, and the JSON it writes lists the vocabulary by id.

use std::path::{Path, PathBuf};

use tokenizers::decoders::DecoderWrapper;
use tokenizers::models::bpe::{BPE, BpeTrainerBuilder};
use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::processors::PostProcessorWrapper;
use tokenizers::{AddedToken, TokenizerBuilder, TokenizerImpl};

use crate::fsutil::write_atomic;

/// The end-of-text token: the eos token, appended to completions by DPO tokenisation.
pub const EOS_TOKEN: &str = "<|endoftext|>";
/// The padding token.
pub const PAD_TOKEN: &str = "<|pad|>";
/// The vocabulary size the demo uses: the 2 special tokens, the 256 bytes and 254 merges.
pub const DEFAULT_VOCAB_SIZE: usize = 512;
/// `model_max_length` written to `tokenizer_config.json`.
pub const MODEL_MAX_LENGTH: usize = 256;
/// The smallest vocabulary: the special tokens and the 256-byte alphabet, without merges.
pub const MIN_VOCAB_SIZE: usize = 2 + 256;

/// Errors from training or writing a tokenizer.
#[derive(Debug, thiserror::Error)]
pub enum BpeError {
    /// The vocabulary cannot hold the special tokens and the byte alphabet.
    #[error("vocabulary size `{vocab_size}` is below the minimum `{MIN_VOCAB_SIZE}` (2 special tokens and 256 bytes)")]
    VocabTooSmall { vocab_size: usize },
    /// The `tokenizers` crate failed to build, train or serialise the tokenizer.
    #[error("training the BPE tokenizer for `{dir}` failed")]
    Train {
        dir: PathBuf,
        #[source]
        source: tokenizers::Error,
    },
    /// An output file could not be written.
    #[error("cannot write `{path}`")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

type BpeTokenizer = TokenizerImpl<BPE, NormalizerWrapper, PreTokenizerWrapper, PostProcessorWrapper, DecoderWrapper>;

/// Trains a byte-level BPE of at most `vocab_size` tokens (special tokens included; fewer when the
/// texts have no more pairs to merge) on `texts` and writes `out_dir/tokenizer.json` and
/// `out_dir/tokenizer_config.json` atomically (`out_dir` is created if missing).
///
/// The texts should not contain the special tokens themselves: they are learned as plain text.
pub fn train_tokenizer<'a>(
    texts: impl Iterator<Item = &'a str>,
    vocab_size: usize,
    out_dir: &Path,
) -> Result<(), BpeError> {
    if vocab_size < MIN_VOCAB_SIZE {
        return Err(BpeError::VocabTooSmall { vocab_size });
    }
    let train_err = |source| BpeError::Train { dir: out_dir.to_path_buf(), source };
    let mut trainer = BpeTrainerBuilder::new()
        .vocab_size(vocab_size)
        .min_frequency(2)
        .show_progress(false)
        .special_tokens(vec![AddedToken::from(EOS_TOKEN, true), AddedToken::from(PAD_TOKEN, true)])
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .build();
    let byte_level = ByteLevel::new(false, true, true);
    let mut tokenizer: BpeTokenizer = TokenizerBuilder::new()
        .with_model(BPE::default())
        .with_normalizer(None)
        .with_pre_tokenizer(Some(PreTokenizerWrapper::Sequence(Sequence::new(vec![
            Digits::new(true).into(),
            byte_level.into(),
        ]))))
        .with_post_processor(None)
        .with_decoder(Some(DecoderWrapper::ByteLevel(byte_level)))
        .build()
        .map_err(train_err)?;
    // `train` wants a `Send` iterator; the caller's may not be.
    let texts: Vec<&str> = texts.collect();
    tokenizer.train(&mut trainer, texts.into_iter()).map_err(train_err)?;
    let json = tokenizer.to_string(true).map_err(train_err)?;

    let write = |name: &str, bytes: &[u8]| {
        let path = out_dir.join(name);
        write_atomic(&path, bytes).map_err(|source| BpeError::Write { path, source })
    };
    write("tokenizer.json", json.as_bytes())?;
    write("tokenizer_config.json", tokenizer_config(&tokenizer).as_bytes())
}

/// `tokenizer_config.json` as transformers writes it for a `PreTrainedTokenizerFast`, with the
/// special tokens' ids under `added_tokens_decoder`.
fn tokenizer_config(tokenizer: &BpeTokenizer) -> String {
    let mut decoder = serde_json::Map::new();
    for token in [EOS_TOKEN, PAD_TOKEN] {
        if let Some(id) = tokenizer.token_to_id(token) {
            decoder.insert(
                id.to_string(),
                serde_json::json!({
                    "content": token,
                    "lstrip": false,
                    "normalized": false,
                    "rstrip": false,
                    "single_word": false,
                    "special": true,
                }),
            );
        }
    }
    let config = serde_json::json!({
        "added_tokens_decoder": decoder,
        "bos_token": null,
        "clean_up_tokenization_spaces": false,
        "eos_token": EOS_TOKEN,
        "model_max_length": MODEL_MAX_LENGTH,
        "pad_token": PAD_TOKEN,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": null,
    });
    // A `Value` built above always serialises.
    serde_json::to_string_pretty(&config).unwrap_or_default() + "\n"
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::tokenizer::Tokenizer;
    use crate::demo::synth::{SynthConfig, generate};

    fn corpus() -> Vec<String> {
        let data = generate(&SynthConfig::default());
        data.train
            .iter()
            .flat_map(|p| [format!("{}{}", p.prompt, p.chosen), format!("{}{}", p.prompt, p.rejected)])
            .collect()
    }

    #[test]
    fn trains_loads_and_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let texts = corpus();
        train_tokenizer(texts.iter().map(String::as_str), DEFAULT_VOCAB_SIZE, dir.path()).unwrap();
        let tok = Tokenizer::from_dir(dir.path()).unwrap();
        assert_eq!(tok.eos_token(), EOS_TOKEN);
        assert_eq!(tok.eos_id(), 0);
        assert_eq!(tok.pad_id(), 1);
        assert_eq!(tok.bos_id(), None);
        assert!(!tok.has_chat_template());
        assert!(tok.vocab_size() <= DEFAULT_VOCAB_SIZE);
        assert!(tok.vocab_size() > MIN_VOCAB_SIZE);
        for text in ["Q: What is 17 + 5?\nA: 22.", "héllo ✓ 1234", ""] {
            let ids = tok.encode(text).unwrap();
            assert_eq!(tok.decode(&ids, false).unwrap(), text);
        }
        // One token per digit.
        let ids = tok.encode("1234567890").unwrap();
        assert_eq!(ids.len(), 10);
        let eos = tok.encode(&format!("x{EOS_TOKEN}")).unwrap();
        assert_eq!(eos.last(), Some(&0));
    }

    #[test]
    fn deterministic_bytes() {
        let texts = corpus();
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        for dir in [&a, &b] {
            train_tokenizer(texts.iter().map(String::as_str), 400, dir.path()).unwrap();
        }
        for name in ["tokenizer.json", "tokenizer_config.json"] {
            assert_eq!(
                std::fs::read(a.path().join(name)).unwrap(),
                std::fs::read(b.path().join(name)).unwrap(),
                "{name}"
            );
        }
    }

    #[test]
    fn errors() {
        let dir = tempfile::tempdir().unwrap();
        let err = train_tokenizer(["a"].into_iter(), 100, dir.path()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "vocabulary size `100` is below the minimum `258` (2 special tokens and 256 bytes)"
        );
        // A file where the directory should be.
        let file = dir.path().join("file");
        std::fs::write(&file, "x").unwrap();
        let err = train_tokenizer(["a b"].into_iter(), 300, &file).unwrap_err();
        assert_eq!(err.to_string(), format!("cannot write `{}`", file.join("tokenizer.json").display()));
    }
}
