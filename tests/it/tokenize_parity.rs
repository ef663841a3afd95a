//! Parity with transformers 5.23 and TRL 1.16 on the committed fixtures
//! (`tests/gen/make_fixtures.py`): the tokenizer's `encode`/`decode`/`apply_chat_template` against
//! `tests/fixtures/expected/tokenize.json`, and the TRL `DPOTrainer._prepare_dataset` ids and the
//! `DataCollatorForPreference` batch against `tests/fixtures/expected/tokenized_<dataset>.json`
//! (`tokenized_prefs_keep_end_16.json`: `truncation_mode = "keep_end"`, from
//! `tests/gen/make_keep_end_fixture.py`).

use std::path::{Path, PathBuf};

use dpo_train::data::tokenizer::{Message, Tokenizer};
use dpo_train::data::{LoadOptions, Packing, Truncation, collate, load_preferences, tokenize};
use serde::Deserialize;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn tokenizer() -> Tokenizer {
    Tokenizer::from_dir(&fixtures().join("tokenizer")).expect("fixture tokenizer loads")
}

fn read_json<T: for<'de> Deserialize<'de>>(rel: &str) -> T {
    let path = fixtures().join(rel);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[derive(Deserialize)]
struct TokenizeFixture {
    vocab_size: usize,
    special_token_ids: std::collections::BTreeMap<String, u32>,
    eos_token: String,
    eos_token_id: u32,
    bos_token: Option<String>,
    strings: Vec<StringCase>,
    chat_template: Vec<ChatCase>,
}

#[derive(Deserialize)]
struct StringCase {
    text: String,
    input_ids: Vec<u32>,
    input_ids_add_special_tokens: Vec<u32>,
    decoded: String,
    decoded_skip_special: String,
}

#[derive(Deserialize)]
struct ChatCase {
    messages: Vec<Message>,
    add_generation_prompt: bool,
    rendered: String,
    input_ids: Vec<u32>,
}

#[test]
fn tokenizer_matches_transformers() {
    let tok = tokenizer();
    let fx: TokenizeFixture = read_json("expected/tokenize.json");
    assert_eq!(tok.vocab_size(), fx.vocab_size);
    assert_eq!(tok.eos_token(), fx.eos_token);
    assert_eq!(tok.eos_id(), fx.eos_token_id);
    assert_eq!(tok.bos_id().is_some(), fx.bos_token.is_some());
    // No pad token: pads with eos, as TRL does.
    assert_eq!(tok.pad_id(), fx.eos_token_id);
    for (token, id) in &fx.special_token_ids {
        assert_eq!(tok.inner().token_to_id(token), Some(*id), "{token}");
    }
    for case in &fx.strings {
        assert_eq!(tok.encode(&case.text).unwrap(), case.input_ids, "{:?}", case.text);
        assert_eq!(
            tok.encode_with_special_tokens(&case.text).unwrap(),
            case.input_ids_add_special_tokens,
            "{:?}",
            case.text
        );
        assert_eq!(tok.decode(&case.input_ids, false).unwrap(), case.decoded, "{:?}", case.text);
        assert_eq!(tok.decode(&case.input_ids, true).unwrap(), case.decoded_skip_special, "{:?}", case.text);
    }
    for case in &fx.chat_template {
        let rendered = tok.apply_chat_template(&case.messages, case.add_generation_prompt).unwrap();
        assert_eq!(rendered, case.rendered);
        assert_eq!(tok.encode_chat(&case.messages, case.add_generation_prompt).unwrap(), case.input_ids);
    }
}

#[derive(Deserialize)]
struct ClassCase {
    dir: String,
    class: String,
    strings: Vec<ClassString>,
    messages: Vec<Message>,
    chat_input_ids: Vec<u32>,
}

#[derive(Deserialize)]
struct ClassString {
    text: String,
    input_ids: Vec<u32>,
    input_ids_add_special_tokens: Vec<u32>,
    decoded: String,
}

/// Tokenizers whose class transformers 5 rebuilds from the vocabulary and merges alone
/// (`tests/gen/make_tokenizer_classes_fixture.py`): a Llama-2-style file (its "▁" normaliser
/// replaced by Metaspace, "▁" only before the first section unless `legacy`, none without
/// `add_prefix_space`), a byte-level file labelled LlamaTokenizer (read as it is), and the qwen2
/// fixture (Qwen2's digit-by-digit split whatever its file says): the ids, the decoding and the
/// chat template's ids are transformers'.
#[test]
fn tokenizer_classes_tokenise_as_transformers_builds_them() {
    let cases: Vec<ClassCase> = read_json("expected/tokenizer_classes.json");
    assert_eq!(cases.len(), 5);
    for case in &cases {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(&case.dir);
        let tok = Tokenizer::from_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", case.dir));
        let what = |text: &str| format!("{} ({}): {text:?}", case.dir, case.class);
        for s in &case.strings {
            assert_eq!(tok.encode(&s.text).unwrap(), s.input_ids, "{}", what(&s.text));
            let ids = tok.encode_with_special_tokens(&s.text).unwrap();
            assert_eq!(ids, s.input_ids_add_special_tokens, "{}", what(&s.text));
            assert_eq!(tok.decode(&ids, false).unwrap(), s.decoded, "{}", what(&s.text));
        }
        assert_eq!(tok.encode_chat(&case.messages, false).unwrap(), case.chat_input_ids, "{}", what("chat"));
    }
}

#[derive(Deserialize)]
struct TokenizedFixture {
    max_length: Option<usize>,
    truncation_mode: String,
    num_rows: usize,
    num_rows_after_preprocessing: usize,
    dropped_rows: usize,
    pad_token_id: u32,
    rows: Vec<TokenizedRow>,
    collated: Collated,
}

#[derive(Deserialize)]
struct TokenizedRow {
    prompt_input_ids: Vec<u32>,
    chosen_input_ids: Vec<u32>,
    rejected_input_ids: Vec<u32>,
}

#[derive(Deserialize)]
struct Collated {
    input_ids: Vec<Vec<i64>>,
    attention_mask: Vec<Vec<i64>>,
    completion_mask: Vec<Vec<i64>>,
}

/// Loads `data`, tokenises and collates it, and compares with TRL's output in `expected`.
fn check_dataset(data: &str, expected: &str) {
    let tok = tokenizer();
    let fx: TokenizedFixture = read_json(expected);
    let loaded = load_preferences(&fixtures().join(data), &LoadOptions::default()).unwrap();
    assert!(loaded.skipped.is_empty());
    assert_eq!(loaded.rows.len(), fx.num_rows, "{data}");
    let truncation =
        Truncation { max_length: fx.max_length, keep_end: fx.truncation_mode == "keep_end", ..Default::default() };
    let (pairs, report) = tokenize(&loaded.rows, &tok, truncation).unwrap();
    assert_eq!(report.dropped_prompt_too_long.len(), fx.dropped_rows, "{data}");
    assert_eq!(pairs.len(), fx.num_rows_after_preprocessing, "{data}");
    for (i, (pair, want)) in pairs.iter().zip(&fx.rows).enumerate() {
        if truncation.keep_end {
            // Only the ends the collator keeps are held: tails of TRL's ids (the batch below
            // checks that they are the right ones).
            assert!(want.prompt_input_ids.ends_with(&pair.prompt_ids), "{data} row {i} prompt");
            assert!(want.chosen_input_ids.ends_with(&pair.chosen_ids), "{data} row {i} chosen");
            assert!(want.rejected_input_ids.ends_with(&pair.rejected_ids), "{data} row {i} rejected");
            continue;
        }
        assert_eq!(pair.prompt_ids, want.prompt_input_ids, "{data} row {i} prompt");
        // With max_length, completions are kept as far as TRL's collator keeps them (keep_start).
        let room = fx.max_length.map_or(usize::MAX, |m| m - want.prompt_input_ids.len());
        let kept = |ids: &[u32]| ids[..ids.len().min(room)].to_vec();
        assert_eq!(pair.chosen_ids, kept(&want.chosen_input_ids), "{data} row {i} chosen");
        assert_eq!(pair.rejected_ids, kept(&want.rejected_input_ids), "{data} row {i} rejected");
    }
    assert_eq!(tok.pad_id(), fx.pad_token_id);
    let batch = collate(&pairs, tok.pad_id(), truncation, Packing::Padded);
    let rows = |flat: &[i64]| -> Vec<Vec<i64>> { flat.chunks(batch.len.max(1)).map(<[i64]>::to_vec).collect() };
    assert_eq!(batch.pairs, pairs.len());
    assert_eq!(rows(&batch.input_ids), fx.collated.input_ids, "{data} input_ids");
    // TRL's masks: real tokens, and the completion at the end of each row's real tokens.
    let mask = |r: usize, from: usize| (0..batch.len).map(|j| i64::from(from <= j && j < batch.lengths[r])).collect();
    let attention: Vec<Vec<i64>> = (0..batch.rows).map(|r| mask(r, 0)).collect();
    let completion: Vec<Vec<i64>> =
        (0..batch.rows).map(|r| mask(r, batch.lengths[r] - batch.completion_lengths[r])).collect();
    assert_eq!(attention, fx.collated.attention_mask, "{data} attention_mask");
    assert_eq!(completion, fx.collated.completion_mask, "{data} completion_mask");
    // The scored predictions are the completion mask shifted by one, row by row.
    let mut shifted = Vec::new();
    for (r, row) in completion.iter().enumerate() {
        for t in (1..batch.len).filter(|&t| row[t] == 1) {
            shifted.push(((r * batch.len + t - 1) as i64, fx.collated.input_ids[r][t]));
        }
    }
    let scored: Vec<(i64, i64)> = batch.at.iter().copied().zip(batch.labels.iter().copied()).collect();
    assert!(!scored.is_empty());
    assert_eq!(scored, shifted, "{data} scored predictions");
}

#[test]
fn standard_jsonl_matches_trl() {
    check_dataset("data/prefs.jsonl", "expected/tokenized_prefs.json");
}

#[test]
fn standard_csv_matches_trl() {
    check_dataset("data/prefs.csv", "expected/tokenized_prefs.json");
}

#[test]
fn standard_json_array_matches_trl() {
    check_dataset("data/prefs.json", "expected/tokenized_prefs.json");
}

#[test]
fn conversational_matches_trl() {
    check_dataset("data/prefs_conv.jsonl", "expected/tokenized_prefs_conv.json");
}

#[test]
fn implicit_prompt_matches_trl() {
    check_dataset("data/prefs_implicit.jsonl", "expected/tokenized_prefs_implicit.json");
}

#[test]
fn max_length_24_matches_trl() {
    check_dataset("data/prefs.jsonl", "expected/tokenized_prefs_max_length_24.json");
}

/// keep_end (deprecated in TRL 1.16, still implemented): no row dropped for its prompt, each
/// sequence its last 16 ids, so a pair's prompts are cut at different tokens.
#[test]
fn keep_end_max_length_16_matches_trl() {
    check_dataset("data/prefs.jsonl", "expected/tokenized_prefs_keep_end_16.json");
}

/// A chat template that reads more than `role` and `content`: a row's `tools` (dumped with
/// `tojson`, keys in the file's order), its `chat_template_kwargs` (`enable_thinking`), and its
/// messages' `reasoning_content` and `tool_calls`, an assistant turn of tool calls with
/// `content: null` and content as a list of parts (both refused before) give TRL's ids
/// (`tests/gen/make_template_fields_fixture.py`: `DPOTrainer._prepare_dataset`).
#[test]
fn template_fields_tokenise_as_trl_passes_them() {
    #[derive(Deserialize)]
    struct Ids {
        prompt_ids: Vec<u32>,
        chosen_ids: Vec<u32>,
        rejected_ids: Vec<u32>,
    }
    let dir = fixtures().join("template_fields");
    let tok = Tokenizer::from_dir(&dir.join("tokenizer")).unwrap();
    let loaded = load_preferences(&dir.join("prefs.jsonl"), &LoadOptions::default()).unwrap();
    let (pairs, _) = tokenize(&loaded.rows, &tok, None).unwrap();
    let want: Vec<Ids> = read_json("template_fields/expected.json");
    assert_eq!((pairs.len(), want.len()), (4, 4));
    for (got, want) in pairs.iter().zip(&want) {
        assert_eq!(got.prompt_ids, want.prompt_ids, "line {}", got.line);
        assert_eq!((&got.chosen_ids, &got.rejected_ids), (&want.chosen_ids, &want.rejected_ids), "line {}", got.line);
    }
}

/// An empty plain-text completion trains eos alone: DPOTrainer and KTOTrainer append it to every
/// completion, CPOTrainer's `tokenize_row` adds its id (`tests/gen/make_empty_completion_fixture.py`).
#[test]
fn empty_completions_train_eos_as_trl_does() {
    use dpo_train::config::{Rows, Truncation as Cut};
    use dpo_train::data::{RowKind, TokenizedPair, Tokenizing};
    #[derive(Deserialize)]
    struct Ids {
        prompt_ids: Vec<u32>,
        #[serde(alias = "completion_ids")]
        chosen_ids: Vec<u32>,
        #[serde(default)]
        rejected_ids: Vec<u32>,
    }
    let dir = fixtures().join("empty_completion");
    let want: std::collections::BTreeMap<String, Vec<Ids>> = read_json("empty_completion/expected.json");
    let tok = tokenizer();
    let cases =
        [("dpo", Rows::Dpo, "prefs.jsonl"), ("cpo", Rows::Cpo, "prefs.jsonl"), ("kto", Rows::Kto, "unpaired.jsonl")];
    for (name, rows, file) in cases {
        let kind = if rows == Rows::Kto { RowKind::Unpaired { unpair: false } } else { RowKind::Pairs };
        let loaded = load_preferences(&dir.join(file), &LoadOptions { rows: kind, ..LoadOptions::default() }).unwrap();
        let mut tokenizing = Tokenizing::new(&tok, Cut { max_length: None, keep_end: false, rows });
        tokenizing.push(&loaded.rows).unwrap();
        let (pairs, _): (Vec<TokenizedPair>, _) = tokenizing.finish().unwrap();
        let want = &want[name];
        assert_eq!(pairs.len(), want.len(), "{name}");
        for (got, want) in pairs.iter().zip(want) {
            assert_eq!(got.prompt_ids, want.prompt_ids, "{name} line {}", got.line);
            assert_eq!(got.chosen_ids, want.chosen_ids, "{name} line {}: chosen", got.line);
            if rows != Rows::Kto {
                assert_eq!(got.rejected_ids, want.rejected_ids, "{name} line {}: rejected", got.line);
            }
        }
    }
}
