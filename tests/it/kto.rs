//! KTO's data as a user brings it: unpaired rows from every reader, pairs unpaired in TRL's
//! order, and the one-line errors of what KTO cannot train on (nothing written).

use std::path::{Path, PathBuf};
use std::process::Output;

use dpo_train::data::{LoadOptions, PreferenceRow, RowKind, Text, load_preferences};

use crate::common::cli::{dpo_train, finish, model, train};
use crate::common::fixtures;

fn kto(unpair: bool) -> LoadOptions {
    LoadOptions { rows: RowKind::Unpaired { unpair }, ..LoadOptions::default() }
}

fn plain(t: &Text) -> &str {
    match t {
        Text::Plain(s) => s,
        Text::Messages(_) => panic!("plain text expected"),
    }
}

fn summary(rows: &[PreferenceRow]) -> Vec<(usize, String, String, Option<bool>)> {
    rows.iter().map(|r| (r.line, plain(&r.prompt).to_owned(), plain(&r.chosen).to_owned(), r.label)).collect()
}

#[test]
fn unpaired_rows_read_alike_from_jsonl_csv_and_parquet() {
    let jsonl = load_preferences(&fixtures().join("data/kto.jsonl"), &kto(false)).unwrap();
    assert_eq!(jsonl.rows.len(), 17);
    assert_eq!(jsonl.rows.iter().filter(|r| r.label == Some(false)).count(), 6);
    for other in ["data/kto.csv", "data/kto.parquet"] {
        let rows = load_preferences(&fixtures().join(other), &kto(false)).unwrap().rows;
        // Lines differ by format (a CSV header, Parquet's rows from 0); the rows do not.
        let strip = |v: Vec<(usize, String, String, Option<bool>)>| -> Vec<_> {
            v.into_iter().map(|(_, p, c, l)| (p, c, l)).collect()
        };
        assert_eq!(strip(summary(&rows)), strip(summary(&jsonl.rows)), "{other}");
    }
}

/// TRL's `unpair_preference_dataset` maps batches of 1000 pairs: each batch's chosen rows, then
/// its rejected rows.
#[test]
fn pairs_unpair_in_blocks_of_a_thousand() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pairs.jsonl");
    let text: String = (0..1002)
        .map(|i| format!("{{\"prompt\": \"p{i}\", \"chosen\": \" c{i}\", \"rejected\": \" r{i}\"}}\n"))
        .collect();
    std::fs::write(&path, text).unwrap();
    let rows = load_preferences(&path, &kto(true)).unwrap().rows;
    assert_eq!(rows.len(), 2004);
    let at = |i: usize| (rows[i].line, plain(&rows[i].chosen).to_owned(), rows[i].label);
    assert_eq!(at(0), (1, " c0".into(), Some(true)));
    assert_eq!(at(999), (1000, " c999".into(), Some(true)));
    assert_eq!(at(1000), (1, " r0".into(), Some(false)));
    assert_eq!(at(2000), (1001, " c1000".into(), Some(true)));
    assert_eq!(at(2002), (1001, " r1000".into(), Some(false)));
    assert_eq!(at(2003), (1002, " r1001".into(), Some(false)));
}

/// A training run that must fail: exit 1, one line, the output directory not created.
fn refused(dir: &Path, data: &Path, extra: &[&str]) -> String {
    let out_dir = dir.join("out");
    let mut args: Vec<String> =
        ["--model-name-or-path", model().to_str().unwrap(), "--train-file", data.to_str().unwrap()]
            .iter()
            .map(|s| s.to_string())
            .collect();
    args.extend(["--output-dir".into(), out_dir.display().to_string(), "--max-steps".into(), "1".into()]);
    args.extend(extra.iter().map(|s| s.to_string()));
    let out: Output = train(&args);
    let stderr = String::from_utf8_lossy(&out.stderr).trim_end().to_owned();
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(!out_dir.exists(), "a refused run wrote {}", out_dir.display());
    stderr
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn what_kto_cannot_train_on_is_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let prefs = fixtures().join("data/prefs.jsonl");
    let err = refused(dir, &prefs, &["--loss-type", "kto"]);
    assert!(err.contains(&format!("`{}`, line 1: fields `chosen`/`rejected`", prefs.display())), "{err}");
    assert!(err.contains("`unpair = true`"), "{err}");

    let label = write(
        dir,
        "label.jsonl",
        "{\"prompt\": \"a\", \"completion\": \" b\", \"label\": true}\n{\"prompt\": \"a\", \"completion\": \" c\", \"label\": \"no\"}\n",
    );
    let err = refused(dir, &label, &["--loss-type", "kto"]);
    assert!(
        err.ends_with(&format!(
            "`{}`, line 2: field `label` must be a boolean (true: desirable, false: undesirable), found a string",
            label.display()
        )),
        "{err}"
    );

    let csv = write(dir, "label.csv", "prompt,completion,label\na, b,True\na, c,maybe\n");
    let err = refused(dir, &csv, &["--loss-type", "kto"]);
    assert!(err.contains(&format!("`{}`, line 3: field `label` must be a boolean", csv.display())), "{err}");
    assert!(err.ends_with("found `maybe`"), "{err}");

    let happy = write(
        dir,
        "happy.jsonl",
        "{\"prompt\": \"a\", \"completion\": \" b\", \"label\": true}\n{\"prompt\": \"c\", \"completion\": \" d\", \"label\": true}\n",
    );
    let err = refused(dir, &happy, &["--loss-type", "kto"]);
    assert!(
        err.contains(&format!("`{}`", happy.display())) && err.contains("field `label`: all 2 rows are true"),
        "{err}"
    );

    // 0/1 labels are labels (TRL takes them); 2 is not.
    let ints = write(
        dir,
        "ints.jsonl",
        "{\"prompt\": \"a\", \"completion\": \" b\", \"label\": 1}\n{\"prompt\": \"a\", \"completion\": \" c\", \"label\": 2}\n",
    );
    let err = refused(dir, &ints, &["--loss-type", "kto"]);
    assert!(err.contains("line 2: field `label` must be a boolean") && err.ends_with("found a number"), "{err}");
    let rows = load_preferences(&ints, &kto(false)).map(|l| l.rows.len());
    assert!(rows.is_err(), "line 2 is refused while reading");

    let kto_rows = fixtures().join("data/kto.jsonl");
    let err = refused(dir, &kto_rows, &[]);
    assert!(
        err.contains("line 1: fields `completion`/`label` make an unpaired row, which only `loss_type = kto` reads"),
        "{err}"
    );

    let err = refused(dir, &kto_rows, &["--loss-type", "kto", "--per-device-train-batch-size", "1"]);
    assert!(err.contains("`--per-device-train-batch-size`: must be at least 2 with `kto`, got 1"), "{err}");
    let err = refused(dir, &prefs, &["--unpair", "true"]);
    assert!(err.contains("`--unpair`: only applies to KTOTrainer's losses"), "{err}");
    let err = refused(dir, &kto_rows, &["--loss-type", "kto,sigmoid"]);
    assert!(err.contains("`kto` trains alone"), "{err}");
    let err = refused(dir, &kto_rows, &["--loss-type", "kto,kto"]);
    assert!(err.contains("`kto` is given more than once"), "{err}");
    let err = refused(dir, &kto_rows, &["--loss-type", "kto", "--loss-weights", "2"]);
    assert!(err.contains("`--loss-weights`: is not defined for `kto`"), "{err}");
    let err = refused(dir, &prefs, &["--desirable-weight", "2"]);
    assert!(err.contains("`--desirable-weight`: only applies to KTOTrainer's losses"), "{err}");
    let err = refused(dir, &kto_rows, &["--loss-type", "kto", "--precompute-ref-log-probs", "true"]);
    assert!(err.contains("`--precompute-ref-log-probs`: is not supported with `kto`"), "{err}");
}

/// `dpo-train eval` takes a held-out set of one label (TRL evaluates it; only training is
/// refused), with KL blocks of `--batch-size`, which must then be at least 2.
#[test]
fn eval_scores_one_label_and_needs_two_rows_a_block() {
    let dir = tempfile::tempdir().unwrap();
    let gold = write(
        dir.path(),
        "gold.jsonl",
        "{\"prompt\": \"a\", \"completion\": \" b\", \"label\": true}\n{\"prompt\": \"c\", \"completion\": \" d\", \"label\": true}\n",
    );
    let eval = |extra: &[&str]| {
        let mut cmd = dpo_train();
        cmd.args(["eval", "--model"]).arg(model()).args(["--data"]).arg(&gold);
        cmd.args(["--tokenizer"]).arg(fixtures().join("tokenizer")).args(["--loss-type", "kto", "--json"]).args(extra);
        finish(cmd, std::time::Duration::from_secs(120))
    };
    let out = eval(&[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(json.get("rewards/rejected").is_none() && json.get("rewards/chosen").is_some(), "{json}");
    let out = eval(&["--batch-size", "1"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("`--batch-size`: must be at least 2 with `kto`"));
}
