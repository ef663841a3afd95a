//! The streamed data path (`data::prepare`: read a chunk, tokenise it, drop its text) against the
//! whole-file path it replaces, and the tokenised-data cache that other ranks and resumed runs
//! read instead of tokenising again.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use dpo_train::data::cache::{self, Loaded};
use dpo_train::data::load::CHUNK_ROWS;
use dpo_train::data::tokenizer::Tokenizer;
use dpo_train::data::{LoadOptions, Prepared, TokenizeControl, load_preferences, prepare, tokenize};

use crate::common::Scratch;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn tokenizer() -> Tokenizer {
    Tokenizer::from_dir(&fixtures().join("tokenizer")).expect("fixture tokenizer loads")
}

fn temp_dir(name: &str) -> Scratch {
    Scratch::new(&format!("dpo-stream-{name}-"))
}

/// The fixture rows repeated past several chunks, then one pair whose chosen is its rejected.
fn big_file(dir: &Path) -> PathBuf {
    let rows = std::fs::read_to_string(fixtures().join("data/prefs.jsonl")).unwrap();
    let mut text = String::new();
    while text.lines().count() < 2 * CHUNK_ROWS + 100 {
        text += &rows;
    }
    text += &serde_json::json!({"prompt": "Same?", "chosen": " yes", "rejected": " yes"}).to_string();
    text += "\n";
    let path = dir.join("big.jsonl");
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn streamed_pairs_equal_the_whole_file_tokenised_at_once() {
    let (dir, tok) = (temp_dir("whole"), tokenizer());
    let path = big_file(&dir);
    let opts = LoadOptions::default();
    let Prepared { pairs, summary } =
        prepare(&path, &opts, &tok, Some(24), Default::default(), &mut |_, _| {}).unwrap();
    let loaded = load_preferences(&path, &opts).unwrap();
    let (whole, report) = tokenize(&loaded.rows, &tok, Some(24)).unwrap();
    assert_eq!(pairs, whole);
    assert_eq!(summary.tokenized, report);
    assert_eq!(summary.read.rows, loaded.rows.len());
    let last_line = loaded.rows.last().unwrap().line;
    assert_eq!(report.identical, vec![last_line], "the pair with chosen = rejected is dropped and listed");
    // Pairs that differ only past max_length are kept, as TRL keeps them, and listed.
    let cut_alike: Vec<usize> = pairs.iter().filter(|p| p.chosen_ids == p.rejected_ids).map(|p| p.line).collect();
    assert!(!cut_alike.is_empty());
    assert_eq!(report.identical_after_truncation, cut_alike);
    assert!(pairs.len() > CHUNK_ROWS && summary.read.rows > 2 * CHUNK_ROWS);
}

/// `dataset_num_proc` sizes the pool that tokenises; the pairs and the summary (what the cache
/// stores) are the same on one thread, three, and every core.
#[test]
fn the_pairs_do_not_depend_on_the_threads() {
    let (dir, tok) = (temp_dir("threads"), tokenizer());
    let path = big_file(&dir);
    let opts = LoadOptions::default();
    let on = |threads| {
        let ctl = TokenizeControl { threads, ..TokenizeControl::default() };
        prepare(&path, &opts, &tok, Some(24), ctl, &mut |_, _| {}).unwrap()
    };
    let every_core = on(None);
    assert_eq!(on(Some(1)), every_core);
    assert_eq!(on(Some(3)), every_core);
}

/// A raised stop flag (Ctrl-C) ends the preparation with `Interrupted`, naming the file.
#[test]
fn a_raised_stop_flag_stops_the_preparation() {
    let (dir, tok) = (temp_dir("stop"), tokenizer());
    let path = big_file(&dir);
    let stop = AtomicBool::new(true);
    let ctl = TokenizeControl { threads: Some(2), stop: &stop };
    let err = prepare(&path, &LoadOptions::default(), &tok, None, ctl, &mut |_, _| {}).unwrap_err();
    assert!(err.interrupted(), "{err:?}");
    let text = format!("{:#}", anyhow::Error::from(err));
    assert_eq!(text, format!("`{}`: interrupted while tokenising: nothing was written", path.display()));
}

#[test]
fn the_cache_returns_what_was_stored_and_its_key_follows_every_input() {
    let (dir, tok) = (temp_dir("cache"), tokenizer());
    let path = big_file(&dir);
    let opts = LoadOptions::default();
    let prepared = prepare(&path, &opts, &tok, Some(24), Default::default(), &mut |_, _| {}).unwrap();
    let cache_dir = dir.join("cache");
    let tok_dir = fixtures().join("tokenizer");
    let entry = |path: &Path, opts: &LoadOptions, max: Option<usize>| {
        cache::entry(&cache_dir, path, opts, &tok_dir, max).unwrap()
    };
    let key = entry(&path, &opts, Some(24));
    let vocab = tok.vocab_size();
    assert!(matches!(cache::load(&key, vocab), Loaded::Missing));
    cache::store(&key, &prepared).unwrap();
    assert!(matches!(cache::load(&key, vocab), Loaded::Hit(p) if p == prepared));

    // Another max_length, other options, one changed byte of data: other entries.
    assert_ne!(entry(&path, &opts, Some(25)), key);
    let skip = LoadOptions { skip_bad_rows: true, ..LoadOptions::default() };
    assert_ne!(entry(&path, &skip, Some(24)), key);
    // A copy elsewhere is the same entry, unless skipped rows would name the path they came from.
    let copy = dir.join("copy");
    std::fs::create_dir_all(&copy).unwrap();
    std::fs::copy(&path, copy.join(path.file_name().unwrap())).unwrap();
    let copied = copy.join(path.file_name().unwrap());
    assert_eq!(entry(&copied, &opts, Some(24)), key);
    assert_ne!(entry(&copied, &skip, Some(24)), entry(&path, &skip, Some(24)));
    let mut bytes = std::fs::read(&path).unwrap();
    let at = bytes.iter().position(|&b| b == b'?').unwrap();
    bytes[at] = b'!';
    std::fs::write(&path, &bytes).unwrap();
    assert_ne!(entry(&path, &opts, Some(24)), key);

    // A damaged entry is never used, whatever the damage: a truncated file, four flipped bytes of
    // the same size (they once indexed past the embedding), an id the tokenizer does not have.
    let stored = std::fs::read(&key).unwrap();
    let damaged = |bytes: &[u8]| {
        std::fs::write(&key, bytes).unwrap();
        match cache::load(&key, vocab) {
            Loaded::Damaged(why) => why,
            other => panic!("a damaged entry loaded as {other:?}"),
        }
    };
    assert_eq!(damaged(&stored[..stored.len() - 3]), "its checksum does not match its contents");
    let mut flipped = stored.clone();
    let at = flipped.len() - 40;
    flipped[at..at + 4].iter_mut().for_each(|b| *b ^= 0xff);
    assert_eq!(damaged(&flipped), "its checksum does not match its contents");
    assert_eq!(damaged(b"garbage"), "not a cache entry");
    // An id at the tokenizer's size, in an entry whose checksum holds.
    let mut wrong = prepared.clone();
    wrong.pairs[0].chosen_ids[0] = vocab as u32;
    cache::store(&key, &wrong).unwrap();
    assert!(
        matches!(cache::load(&key, vocab), Loaded::Damaged(why) if why.contains(&format!("id {vocab} is not below")))
    );
}

/// The fixture tokenizer, copied to `dir/tokenizer` with `template` as its chat template (none:
/// without one).
fn tokenizer_with_template(dir: &Path, template: Option<&str>) -> Tokenizer {
    let tok_dir = dir.join("tokenizer");
    std::fs::create_dir_all(&tok_dir).unwrap();
    for name in ["tokenizer.json", "special_tokens_map.json"] {
        std::fs::copy(fixtures().join("tokenizer").join(name), tok_dir.join(name)).unwrap();
    }
    let config = std::fs::read_to_string(fixtures().join("tokenizer/tokenizer_config.json")).unwrap();
    let mut config: serde_json::Map<String, serde_json::Value> = serde_json::from_str(&config).unwrap();
    match template {
        Some(t) => config.insert("chat_template".into(), t.into()),
        None => config.remove("chat_template"),
    };
    std::fs::write(tok_dir.join("tokenizer_config.json"), serde_json::to_string(&config).unwrap()).unwrap();
    Tokenizer::from_dir(&tok_dir).unwrap()
}

#[test]
fn a_tokenisation_error_in_a_shard_names_the_shard() {
    let dir = temp_dir("shards");
    let data = dir.join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::copy(fixtures().join("data/prefs_conv.jsonl"), data.join("train-00000-of-00002.jsonl")).unwrap();
    std::fs::copy(fixtures().join("data/prefs_conv.jsonl"), data.join("train-00001-of-00002.jsonl")).unwrap();
    let tok = tokenizer_with_template(&dir, None);
    let err = prepare(&dir, &LoadOptions::default(), &tok, None, Default::default(), &mut |_, _| {}).unwrap_err();
    let text = format!("{:#}", anyhow::Error::from(err));
    assert!(
        text.starts_with(&format!(
            "`{}`, line 1: cannot tokenise field `prompt`: ",
            data.join("train-00000-of-00002.jsonl").display()
        )),
        "{text}"
    );
}

/// A row the chat template refuses (`raise_exception`) stops the read naming file and line, or,
/// with `skip_bad_rows`, is skipped and reported as a reader's bad row is; where every row is
/// refused, the first refusal is the error.
#[test]
fn rows_the_chat_template_refuses_are_skipped_with_skip_bad_rows() {
    let dir = temp_dir("refused");
    let template = "{% for m in messages %}{% if m.role == 'robot' %}{{ raise_exception('no robots') }}{% endif %}{{ m.role }}: {{ m.content }}\n{% endfor %}";
    let tok = tokenizer_with_template(&dir, Some(template));
    let row = |role: &str, n: usize| {
        let m = |role: &str, text: String| serde_json::json!([{"role": role, "content": text}]);
        let r = serde_json::json!({"prompt": m(role, format!("q{n}")), "chosen": m("assistant", format!("a{n}")), "rejected": m("assistant", format!("b{n}"))});
        format!("{r}\n")
    };
    let path = dir.join("prefs.jsonl");
    std::fs::write(&path, [row("user", 1), row("robot", 2), row("user", 3)].concat()).unwrap();
    let run = |skip_bad_rows: bool| {
        let opts = LoadOptions { skip_bad_rows, ..LoadOptions::default() };
        prepare(&path, &opts, &tok, None, Default::default(), &mut |_, _| {})
    };
    let err = format!("{:#}", anyhow::Error::from(run(false).unwrap_err()));
    let refusal = format!("`{}`, line 2: cannot tokenise field `prompt`: ", path.display());
    assert!(err.starts_with(&refusal) && err.contains("no robots"), "{err}");
    // The refusal comes before a malformed line further on, and is the error: data order.
    std::fs::write(&path, [row("user", 1), row("robot", 2), row("user", 3), "{oops\n".to_owned()].concat()).unwrap();
    let err = format!("{:#}", anyhow::Error::from(run(false).unwrap_err()));
    assert!(err.starts_with(&refusal), "{err}");
    let prepared = run(true).unwrap();
    assert_eq!(prepared.pairs.iter().map(|p| p.line).collect::<Vec<_>>(), [1, 3]);
    let read = &prepared.summary.read;
    let lines: Vec<usize> = read.skipped.iter().map(|s| s.line).collect();
    assert_eq!((read.rows, lines), (2, vec![2, 4]));
    assert!(read.skipped[0].reason.starts_with(&refusal) && read.skipped[0].reason.contains("no robots"));
    std::fs::write(&path, row("robot", 1)).unwrap();
    let err = format!("{:#}", anyhow::Error::from(run(true).unwrap_err()));
    assert!(err.contains("line 1: cannot tokenise field `prompt`") && err.contains("no robots"), "{err}");
}

#[test]
fn data_with_nothing_left_to_train_on_is_named() {
    let dir = temp_dir("nothing");
    let path = dir.join("same.jsonl");
    std::fs::write(&path, "{\"prompt\": \"Q\", \"chosen\": \" a\", \"rejected\": \" a\"}\n").unwrap();
    let err =
        prepare(&path, &LoadOptions::default(), &tokenizer(), None, Default::default(), &mut |_, _| {}).unwrap_err();
    let text = format!("{:#}", anyhow::Error::from(err));
    assert_eq!(text, format!("`{}`: all 1 examples were dropped: 1 have chosen identical to rejected", path.display()));
}
