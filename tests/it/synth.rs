//! The offline demo's data path end to end: synthetic pairs written as JSONL, read back through
//! the TRL-style loader, a byte-level BPE trained on them, and TRL's DPO tokenisation
//! (`trl/trainer/dpo_trainer.py` `_prepare_dataset`) applied with that tokenizer.

use dpo_train::data::tokenizer::Tokenizer;
use dpo_train::data::{LoadOptions, Text, load_preferences, tokenize};
use dpo_train::demo::bpe::{DEFAULT_VOCAB_SIZE, train_tokenizer};
use dpo_train::demo::synth::{SynthConfig, SynthPair, TaskKind, generate, write_splits};

fn texts(pairs: &[SynthPair]) -> Vec<String> {
    pairs.iter().flat_map(|p| [format!("{}{}", p.prompt, p.chosen), format!("{}{}", p.prompt, p.rejected)]).collect()
}

#[test]
fn synthetic_data_loads_tokenizes_and_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let data = generate(&SynthConfig::default());
    let paths = write_splits(&dir.path().join("data"), &data).unwrap();

    let tok_dir = dir.path().join("tokenizer");
    let corpus = texts(&data.train);
    train_tokenizer(corpus.iter().map(String::as_str), DEFAULT_VOCAB_SIZE, &tok_dir).unwrap();
    let tok = Tokenizer::from_dir(&tok_dir).unwrap();
    assert!(tok.vocab_size() <= DEFAULT_VOCAB_SIZE);

    let mut longest = 0;
    for (path, pairs) in paths.iter().zip([&data.train, &data.val, &data.test]) {
        let loaded = load_preferences(path, &LoadOptions::default()).unwrap();
        assert!(loaded.skipped.is_empty());
        assert!(!loaded.implicit_prompt && !loaded.conversational);
        assert_eq!(loaded.rows.len(), pairs.len());
        for (row, pair) in loaded.rows.iter().zip(pairs) {
            assert_eq!(row.prompt, Text::Plain(pair.prompt.clone()));
            assert_eq!(row.chosen, Text::Plain(pair.chosen.clone()));
            assert_eq!(row.rejected, Text::Plain(pair.rejected.clone()));
        }

        let (tokenized, report) = tokenize(&loaded.rows, &tok, Some(64)).unwrap();
        assert_eq!(report.kept, pairs.len(), "every pair survives max_length 64");
        assert!(report.dropped_prompt_too_long.is_empty());
        assert!(report.prefix_mismatch.is_empty(), "{:?}", report.prefix_mismatch);
        assert_eq!(report.truncated, 0);
        for (t, pair) in tokenized.iter().zip(pairs) {
            let p = t.prompt_ids.len();
            longest = longest.max(p + t.chosen_ids.len().max(t.rejected_ids.len()));
            // Completions end with eos, and decode back to their text.
            assert_eq!(t.chosen_ids.last(), Some(&tok.eos_id()));
            assert_eq!(t.rejected_ids.last(), Some(&tok.eos_id()));
            assert_eq!(tok.decode(&t.prompt_ids, false).unwrap(), pair.prompt);
            assert_eq!(tok.decode(&t.chosen_ids, true).unwrap(), pair.chosen);
            assert_eq!(tok.decode(&t.rejected_ids, true).unwrap(), pair.rejected);
        }
    }
    assert!(longest <= 40, "longest sequence has {longest} tokens");

    // Digits are one token each, in prompts and in answers.
    for pair in data.test.iter().filter(|p| matches!(p.kind, TaskKind::Arithmetic { .. })) {
        for text in [&pair.prompt, &pair.chosen] {
            for piece in text.split(|c: char| !c.is_ascii_digit()).filter(|s| !s.is_empty()) {
                let ids = tok.encode(piece).unwrap();
                assert_eq!(ids.len(), piece.len(), "{piece:?}");
            }
            let ids = tok.encode(text).unwrap();
            let digit_tokens = ids
                .iter()
                .filter(|&&id| {
                    let s = tok.decode(&[id], false).unwrap();
                    s.chars().any(|c| c.is_ascii_digit())
                })
                .count();
            assert_eq!(digit_tokens, text.chars().filter(char::is_ascii_digit).count(), "{text:?}");
        }
    }

    // encode -> decode is exact on every text, held-out ones included.
    for text in texts(&data.val).iter().chain(&texts(&data.test)) {
        let ids = tok.encode(text).unwrap();
        assert_eq!(&tok.decode(&ids, false).unwrap(), text);
    }
}
