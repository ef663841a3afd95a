//! The exact one-line errors of the preference-data pipeline (`dpo_train::data`), as a user sees
//! them: file, line and field named, in the style of uv's `error.rs`.

use std::path::{Path, PathBuf};

use dpo_train::data::tokenizer::Tokenizer;
use dpo_train::data::{LoadOptions, load_preferences, tokenize};

use crate::common::Scratch;

/// A file in a temporary directory of its own, removed with it (it derefs to the file's path).
struct Written {
    _dir: Scratch,
    path: PathBuf,
}

impl std::ops::Deref for Written {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.path
    }
}

/// Writes `contents` to a fresh file `name` in a temporary directory for `test`.
fn write(test: &str, name: &str, contents: &[u8]) -> Written {
    let dir = Scratch::new(&format!("dpo-data-errors-{test}-"));
    let path = dir.join(name);
    std::fs::write(&path, contents).unwrap();
    Written { _dir: dir, path }
}

fn load_err(path: &Path) -> String {
    load_preferences(path, &LoadOptions::default()).expect_err("the file is bad").to_string()
}

fn tokenizer() -> Tokenizer {
    Tokenizer::from_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizer"))
        .expect("fixture tokenizer loads")
}

#[test]
fn missing_field_in_jsonl() {
    let path = write(
        "missing",
        "prefs.jsonl",
        b"{\"prompt\": \"a\", \"chosen\": \" b\", \"rejected\": \" c\"}\n{\"prompt\": \"a\", \"rejected\": \" c\"}\n",
    );
    assert_eq!(load_err(&path), format!("`{}`, line 2: field `chosen` is missing", path.display()));
}

#[test]
fn missing_column_in_csv() {
    let path = write("missing_col", "prefs.csv", b"prompt,chosen,reject\na,b,c\n");
    assert_eq!(
        load_err(&path),
        format!("`{}`: column `rejected` is missing (the header has `prompt`, `chosen`, `reject`)", path.display())
    );
}

#[test]
fn malformed_json_line() {
    let path = write(
        "malformed",
        "prefs.jsonl",
        b"{\"prompt\": \"a\", \"chosen\": \" b\", \"rejected\": \" c\"}\n\n{\"prompt\": \"a\", \"chosen\": \" b\" \"rejected\": \" c\"}\n",
    );
    let err = load_preferences(&path, &LoadOptions::default()).unwrap_err();
    assert_eq!(err.to_string(), format!("`{}`, line 3: malformed JSON", path.display()));
    // The cause is kept as the error's source, not repeated in the message.
    let cause = std::error::Error::source(&err).expect("serde cause").to_string();
    assert_eq!(cause, "expected `,` or `}` at line 1 column 32");
}

#[test]
fn empty_file() {
    for name in ["prefs.jsonl", "prefs.json", "prefs.csv"] {
        let path = write("empty", name, b"");
        assert_eq!(load_err(&path), format!("`{}`: the dataset is empty", path.display()));
    }
}

#[test]
fn invalid_utf8() {
    let path = write(
        "utf8",
        "prefs.jsonl",
        b"{\"prompt\": \"a\", \"chosen\": \" b\", \"rejected\": \" c\"}\n{\"prompt\": \"caf\xe9\", \"chosen\": \" b\", \"rejected\": \" c\"}\n",
    );
    assert_eq!(load_err(&path), format!("`{}`, line 2: invalid UTF-8", path.display()));
    let path = write("utf8", "prefs.csv", b"prompt,chosen,rejected\na,b,c\na,b,\xff\xfe\n");
    assert_eq!(load_err(&path), format!("`{}`, line 3: field `rejected` is not valid UTF-8", path.display()));
}

#[test]
fn skipped_rows_are_reported() {
    let path = write(
        "skip",
        "prefs.jsonl",
        b"{\"prompt\": \"a\", \"chosen\": \" b\", \"rejected\": \" c\"}\n{oops\n{\"prompt\": \"a\", \"chosen\": null, \"rejected\": \" c\"}\n",
    );
    let opts = LoadOptions { skip_bad_rows: true, ..LoadOptions::default() };
    let loaded = load_preferences(&path, &opts).unwrap();
    assert_eq!(loaded.rows.len(), 1);
    let skipped: Vec<(usize, String)> = loaded.skipped.iter().map(|s| (s.line, s.reason.clone())).collect();
    assert_eq!(
        skipped,
        vec![
            (2, format!("`{}`, line 2: malformed JSON", path.display())),
            (3, format!("`{}`, line 3: field `chosen` is null", path.display())),
        ]
    );
}

#[test]
fn prompt_longer_than_max_length_is_dropped_and_counted() {
    let tok = tokenizer();
    let long = "What is the capital of France? ".repeat(4);
    let rows = format!(
        "{}\n{}\n",
        serde_json::json!({"prompt": long, "chosen": " Paris.", "rejected": " London."}),
        serde_json::json!({"prompt": "Say hi.", "chosen": " Hi.", "rejected": " Go away."}),
    );
    let path = write("maxlen", "prefs.jsonl", rows.as_bytes());
    let loaded = load_preferences(&path, &LoadOptions::default()).unwrap();
    let prompt_len = tok.encode(&long).unwrap().len();
    assert!(prompt_len > 8);
    let (pairs, report) = tokenize(&loaded.rows, &tok, Some(prompt_len)).unwrap();
    assert_eq!(pairs.len(), 1);
    assert_eq!(pairs[0].line, 2);
    assert_eq!(report.dropped_prompt_too_long, vec![1]);
    assert_eq!(report.kept, 1);

    // When every prompt reaches max_length nothing is left: an error says so.
    let err = tokenize(&loaded.rows, &tok, Some(1)).unwrap_err();
    assert_eq!(err.to_string(), "all 2 examples were dropped: each prompt alone has at least `max_length` = 1 tokens");
}

#[test]
fn unsupported_extension() {
    let path = write("ext", "prefs.xlsx", b"PK");
    assert_eq!(
        load_err(&path),
        format!(
            "`{}`: unsupported data format; use `.jsonl`, `.json`, `.csv`, `.tsv` (each optionally `.gz`), `.parquet`, `.arrow`, or a dataset directory",
            path.display()
        )
    );
}
