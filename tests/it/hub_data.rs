//! Datasets as the hub ships them (sharded Parquet with conversations, gzipped JSON Lines, one
//! directory per split), written by `datasets` in `tests/gen/make_hub_fixtures.py`: read here,
//! they give TRL's tokenised pairs and `DPOTrainer.evaluate`'s metrics; bad Parquet and gzip input
//! gets one-line errors naming the file, row and column.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use burn::tensor::Device;
use dpo_train::config::LossConfig;
use dpo_train::data::{LoadOptions, Text, Tokenizer, load_preferences, tokenize};
use dpo_train::eval::{EvalOptions, evaluate};
use parquet::arrow::ArrowWriter;
use serde::Deserialize;

#[derive(Deserialize)]
struct Fixture {
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    dataset: String,
    split: String,
    num_rows: usize,
    rows: Vec<Ids>,
    metrics: BTreeMap<String, f64>,
}

#[derive(Deserialize)]
struct Ids {
    prompt_ids: Vec<u32>,
    chosen_ids: Vec<u32>,
    rejected_ids: Vec<u32>,
}

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn cases() -> Vec<Case> {
    let text = std::fs::read_to_string(fixtures().join("expected/trl_hub.json")).unwrap();
    let fixture: Fixture = serde_json::from_str(&text).unwrap();
    assert_eq!(fixture.cases.len(), 6, "three datasets, two splits each");
    fixture.cases
}

fn split_opts(split: &str) -> LoadOptions {
    LoadOptions { split: Some(split.to_owned()), ..LoadOptions::default() }
}

#[test]
fn hub_datasets_tokenise_as_trl_reads_them() {
    let tokenizer = Tokenizer::from_dir(&fixtures().join("tokenizer")).unwrap();
    for case in cases() {
        let what = format!("{} [{}]", case.dataset, case.split);
        let loaded = load_preferences(&fixtures().join(&case.dataset), &split_opts(&case.split)).unwrap();
        assert_eq!(loaded.rows.len(), case.num_rows, "{what}");
        let (pairs, _) = tokenize(&loaded.rows, &tokenizer, Some(1024)).unwrap();
        assert_eq!(pairs.len(), case.rows.len(), "{what}");
        for (i, (ours, trl)) in pairs.iter().zip(&case.rows).enumerate() {
            assert_eq!(ours.prompt_ids, trl.prompt_ids, "{what} row {i} prompt");
            assert_eq!(ours.chosen_ids, trl.chosen_ids, "{what} row {i} chosen");
            assert_eq!(ours.rejected_ids, trl.rejected_ids, "{what} row {i} rejected");
        }
    }
}

#[test]
fn tokenisation_on_many_threads_equals_one_thread() {
    let tokenizer = Tokenizer::from_dir(&fixtures().join("tokenizer")).unwrap();
    let sources = [
        ("data/prefs.jsonl", None),
        ("data/prefs_conv.jsonl", None),
        ("data/prefs_implicit.jsonl", None),
        ("hub/ultrafeedback", Some("train")),
        ("hub/hh", Some("train")),
    ];
    let (mut truncated, mut dropped) = (0, 0);
    for (source, split) in sources {
        let opts = LoadOptions { split: split.map(str::to_owned), ..LoadOptions::default() };
        let rows = load_preferences(&fixtures().join(source), &opts).unwrap().rows;
        // Enough rows for every thread to get some, in a mixed order.
        let rows: Vec<_> = (0..8).flat_map(|_| rows.iter().rev().cloned()).collect();
        let on = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            pool.install(|| tokenize(&rows, &tokenizer, Some(50)).unwrap())
        };
        let ((one, one_report), (many, many_report)) = (on(1), on(4));
        assert_eq!(one, many, "{source}");
        assert_eq!(one_report, many_report, "{source}");
        truncated += one_report.truncated;
        dropped += one_report.dropped_prompt_too_long.len();
    }
    // The comparison covered truncation and dropping too.
    assert!(truncated > 0 && dropped > 0, "{truncated} truncated, {dropped} dropped");
}

#[allow(deprecated)] // burn's libtorch device is deprecated upstream; it is this project's backend.
fn cpu() -> Device {
    Device::libtorch()
}

#[test]
fn hub_datasets_evaluate_to_trls_metrics() {
    let mut failures = Vec::new();
    for case in cases() {
        let opts = EvalOptions {
            model: fixtures().join("models/llama"),
            ref_model: Some(fixtures().join("models/llama-ref")),
            tokenizer: None,
            data: fixtures().join(&case.dataset),
            columns: Default::default(),
            skip_bad_rows: false,
            split: Some(case.split.clone()),
            config: None,
            loss: LossConfig::default(),
            truncation: Some(1024).into(),
            batch_size: 4,
            // TRL's fixture evaluated every row in one batch.
            metrics_batch: Some(usize::MAX),
            packing: dpo_train::data::Packing::SharedPrompt,
            device: cpu(),
        };
        let report = evaluate(&opts).unwrap_or_else(|e| panic!("{}: {e:#}", case.dataset));
        // Ours and TRL's f32 forwards over sequences of at most max_length (1024) positions.
        let model = fixtures().join("models/llama");
        let forward = crate::common::bounds::llama_logits(&model, 1024)
            + crate::common::bounds::reordered(1024, crate::common::bounds::U_F32);
        let trl = |n: &str| case.metrics.get(n).copied();
        for (name, got) in report.metrics.named() {
            let want = case.metrics[name];
            let bound = crate::common::bounds::trl_metric(name, want, &trl, LossConfig::default().beta, forward);
            if (got - want).abs() > bound {
                failures.push(format!("{} [{}] {name}: got {got}, TRL {want}", case.dataset, case.split));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn write_parquet(path: &Path, columns: Vec<(&str, ArrayRef)>) {
    let batch = RecordBatch::try_from_iter(columns).unwrap();
    let mut writer = ArrowWriter::try_new(std::fs::File::create(path).unwrap(), batch.schema(), None).unwrap();
    writer.write(&batch).unwrap();
    writer.close().unwrap();
}

fn strings(values: &[Option<&str>]) -> ArrayRef {
    Arc::new(StringArray::from(values.to_vec()))
}

fn error(path: &Path) -> String {
    let err = load_preferences(path, &LoadOptions::default()).unwrap_err().to_string();
    assert!(!err.contains('\n'), "one line: {err}");
    err
}

#[test]
fn bad_parquet_names_the_file_row_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("train.parquet");
    let prompts = strings(&[Some("p"), Some("q")]);
    write_parquet(
        &path,
        vec![
            ("prompt", prompts.clone()),
            ("chosen", strings(&[Some("a"), None])),
            ("rejected", strings(&[Some("b"), Some("c")])),
        ],
    );
    assert_eq!(error(&path), format!("`{}`, row 1: field `chosen` is null", path.display()));
    let skipped = load_preferences(&path, &LoadOptions { skip_bad_rows: true, ..LoadOptions::default() }).unwrap();
    assert_eq!((skipped.rows.len(), skipped.skipped[0].line), (1, 1));

    write_parquet(&path, vec![("prompt", prompts.clone()), ("chosen", strings(&[Some("a"), Some("b")]))]);
    let err = error(&path);
    assert!(err.ends_with("column `rejected` is missing (the header has `prompt`, `chosen`)"), "{err}");

    let numbers: ArrayRef = Arc::new(Int64Array::from(vec![1, 2]));
    write_parquet(
        &path,
        vec![("prompt", prompts), ("chosen", numbers), ("rejected", strings(&[Some("b"), Some("c")]))],
    );
    let err = error(&path);
    assert!(err.contains("column `chosen` has type Int64; expected strings"), "{err}");

    std::fs::write(&path, b"PAR1 not really parquet").unwrap();
    let err = error(&path);
    assert!(err.starts_with(&format!("`{}`: cannot read Parquet", path.display())), "{err}");
}

#[test]
fn gzip_is_found_by_content_and_bad_gzip_is_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let row = b"{\"prompt\": \"p\", \"chosen\": \"a\", \"rejected\": \"b\"}\n";
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(row).unwrap();
    let packed = gz.finish().unwrap();
    // A gzipped file under a plain name, and a plain file under a `.gz` name, both read.
    let hidden = dir.path().join("rows.jsonl");
    std::fs::write(&hidden, &packed).unwrap();
    assert_eq!(load_preferences(&hidden, &LoadOptions::default()).unwrap().rows.len(), 1);
    let plain = dir.path().join("rows.jsonl.gz");
    std::fs::write(&plain, row).unwrap();
    assert_eq!(load_preferences(&plain, &LoadOptions::default()).unwrap().rows.len(), 1);

    let cut = dir.path().join("cut.jsonl.gz");
    std::fs::write(&cut, &packed[..packed.len() / 2]).unwrap();
    assert_eq!(error(&cut), format!("`{}`: cannot decompress gzip data", cut.display()));
}

#[test]
fn a_split_that_is_not_there_lists_the_directory() {
    let err = load_preferences(&fixtures().join("hub/ultrafeedback"), &split_opts("validation")).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("no data files for split `validation`"), "{text}");
    assert!(text.contains("data/test-00000-of-00001.parquet"), "{text}");
}

/// A dataset directory's splits are the files `datasets.load_dataset(dir)` takes for them, in
/// each layout a download or a user's folder has: the hub's shards, split names in directories
/// (at any depth) or in file names (Anthropic/hh-rlhf's `harmless-base/train.jsonl.gz`), other
/// keywords (`training`, `eval`, `dev`), one file alone (`train`). Each file holds its own power
/// of two rows, so a split's row count names its files.
#[test]
fn dataset_directories_split_as_datasets_splits_them() {
    let layouts: [&[&str]; 10] = [
        &["prefs.jsonl"],
        &["training.jsonl", "validation.jsonl"],
        &["train.jsonl", "eval.jsonl"],
        &["train_0.jsonl", "test_0.jsonl"],
        &[
            "harmless-base/train.jsonl.gz",
            "harmless-base/test.jsonl.gz",
            "helpful-base/train.jsonl.gz",
            "red-team-attempts/red_team_attempts.jsonl.gz",
        ],
        &["train/a.jsonl", "test.jsonl"],
        &["foo/train/x.jsonl", "foo/test/y.jsonl"],
        &["my-train/a.jsonl", "my-test/b.jsonl"],
        &["dev.jsonl", "train.jsonl"],
        &["data/train-00000-of-00002.jsonl", "data/train-00001-of-00002.jsonl", "data/test-00000-of-00001.jsonl"],
    ];
    let row = "{\"prompt\": \"p\", \"chosen\": \" a\", \"rejected\": \" b\"}\n";
    let cache = tempfile::tempdir().unwrap();
    for files in layouts {
        let dir = tempfile::tempdir().unwrap();
        for (i, f) in files.iter().enumerate() {
            let path = dir.path().join(f);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            let text = row.repeat(1 << i);
            let bytes = match f.ends_with(".gz") {
                true => {
                    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
                    gz.write_all(text.as_bytes()).unwrap();
                    gz.finish().unwrap()
                }
                false => text.into_bytes(),
            };
            std::fs::write(path, bytes).unwrap();
        }
        let code = "import sys, json, datasets\ndatasets.disable_progress_bars()\nd = datasets.load_dataset(sys.argv[1])\nprint(json.dumps({k: v.num_rows for k, v in d.items()}))";
        let out = std::process::Command::new(crate::common::python())
            .args(["-W", "ignore", "-c", code, dir.path().to_str().unwrap()])
            .env("HF_DATASETS_CACHE", cache.path())
            .output()
            .unwrap();
        assert!(out.status.success(), "{files:?}: {}", String::from_utf8_lossy(&out.stderr));
        let want: BTreeMap<String, usize> = serde_json::from_slice(&out.stdout).unwrap();
        let got: BTreeMap<String, usize> = ["train", "validation", "test"]
            .into_iter()
            .filter_map(|split| {
                Some((split.to_owned(), load_preferences(dir.path(), &split_opts(split)).ok()?.rows.len()))
            })
            .collect();
        assert_eq!(got, want, "{files:?}");
    }
}

/// A preference text as `datasets` hands it to Python: a string, or the list of message dicts.
fn as_json(text: &Text) -> serde_json::Value {
    match text {
        Text::Plain(s) => s.as_str().into(),
        Text::Messages(messages) => serde_json::to_value(messages).unwrap(),
    }
}

/// The files `datasets` writes besides JSON, CSV and Parquet (`save_to_disk` directories of one
/// dataset and of a dataset dict, Arrow's file format, pandas' categorical Parquet columns,
/// dictionary-encoded message fields, compressed Arrow and Parquet) and
/// the names it reads as JSON Lines or tab-separated CSV give the rows `datasets` loads from
/// them, written and read by `tests/gen/write_saved_formats.py`.
#[test]
fn files_datasets_writes_read_as_datasets_reads_them() {
    let dir = tempfile::tempdir().unwrap();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/gen/write_saved_formats.py");
    let out = std::process::Command::new(crate::common::python())
        .args(["-W", "ignore"])
        .arg(script)
        .arg(dir.path())
        .env("HF_DATASETS_CACHE", dir.path().join("cache"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = std::fs::read_to_string(dir.path().join("expected.json")).unwrap();
    let expected: BTreeMap<String, serde_json::Value> = serde_json::from_str(&text).unwrap();
    assert_eq!(expected.len(), 12);
    for (case, want) in expected {
        let (name, split) = case.split_once(':').unwrap_or((&case, "train"));
        let loaded = load_preferences(&dir.path().join(name), &split_opts(split)).unwrap();
        let got: Vec<serde_json::Value> = loaded
            .rows
            .iter()
            .map(|r| {
                serde_json::json!({"prompt": as_json(&r.prompt), "chosen": as_json(&r.chosen), "rejected": as_json(&r.rejected)})
            })
            .collect();
        assert_eq!(serde_json::Value::Array(got), want, "{case}");
    }
    csv_cells_read_as_missing_as_datasets_reads_them(dir.path());
    // A saved dataset dict without the split asked for lists its splits.
    let err = load_preferences(&dir.path().join("saved_dict"), &split_opts("validation")).unwrap_err().to_string();
    assert!(err.ends_with("the saved `DatasetDict` has no split `validation`; it has `train`, `test` (choose the split with `dataset_train_split` / `dataset_test_split`, or `eval --split`)"), "{err}");
    // A damaged `state.json` is named.
    std::fs::write(dir.path().join("saved/state.json"), b"{\"_data_files\": 3}").unwrap();
    let err = load_preferences(&dir.path().join("saved"), &split_opts("train")).unwrap_err().to_string();
    assert!(err.contains("saved/state.json`: `_data_files` lists no"), "{err}");
}

/// The CSV and TSV rows of `expected_missing.json` (every cell pandas reads as missing, quoted or
/// not, and spellings near them it keeps): a row `datasets` gives a `None` is a bad row naming its
/// line and field, skipped under `skip_bad_rows`; every other row reads as `datasets` reads it.
fn csv_cells_read_as_missing_as_datasets_reads_them(dir: &Path) {
    let text = std::fs::read_to_string(dir.join("expected_missing.json")).unwrap();
    let expected: BTreeMap<String, Vec<serde_json::Value>> = serde_json::from_str(&text).unwrap();
    assert_eq!(expected.len(), 2);
    for (name, want) in expected {
        let opts = LoadOptions { skip_bad_rows: true, ..LoadOptions::default() };
        let loaded = load_preferences(&dir.join(&name), &opts).unwrap();
        let is_missing = |row: &serde_json::Value| row.as_object().unwrap().values().any(|v| v.is_null());
        let kept: Vec<serde_json::Value> = want.iter().filter(|r| !is_missing(r)).cloned().collect();
        let got: Vec<serde_json::Value> = loaded
            .rows
            .iter()
            .map(|r| serde_json::json!({"prompt": as_json(&r.prompt), "chosen": as_json(&r.chosen), "rejected": as_json(&r.rejected)}))
            .collect();
        assert_eq!(got, kept, "{name}");
        let lines = |rows: Vec<usize>| rows.into_iter().map(|i| i + 2).collect::<Vec<_>>();
        let missing = lines((0..want.len()).filter(|&i| is_missing(&want[i])).collect());
        assert_eq!(missing.len(), 19, "{name}");
        assert_eq!(loaded.skipped.iter().map(|s| s.line).collect::<Vec<_>>(), missing, "{name}");
        for s in &loaded.skipped {
            assert!(s.reason.contains("which `datasets` reads from CSV as null"), "{}", s.reason);
        }
    }
    let err = load_preferences(&dir.join("missing.csv"), &LoadOptions::default()).unwrap_err().to_string();
    assert!(err.ends_with("missing.csv`, line 2: field `prompt` is empty, which `datasets` reads from CSV as null (one of pandas' NA values)"), "{err}");
}

/// A dataset card's `configs` (README.md's YAML) choose the files as `datasets.load_dataset(dir,
/// name)` takes them: `{split, path}` lists with globs, a pattern for `train`, `data_dir`, the
/// default configuration (the only one, or `default: true`) and one named. Each file holds its own
/// power of two rows, so a split's row count names its files; where `datasets` refuses (several
/// configurations, none the default), so do we.
#[test]
fn dataset_cards_choose_files_as_datasets_does() {
    let card = |yaml: &str| format!("---\n{yaml}---\n# A card\n");
    let cases: [(String, &[&str], Option<&str>); 13] = [
        // White space before the block; a glob matching nothing beside one that matches.
        (
            format!("\n{}", card("configs:\n- config_name: default\n  data_files: [a-*.jsonl, b-*.jsonl]\n")),
            &["a-0.jsonl", "c.jsonl"],
            None,
        ),
        // `default: yes` is YAML 1.1's true, as PyYAML reads it.
        (
            card(
                "configs:\n- config_name: a\n  data_files: a.jsonl\n- config_name: b\n  default: yes\n  data_files: b.jsonl\n",
            ),
            &["a.jsonl", "b.jsonl"],
            None,
        ),
        // `__`-named directories and the files `datasets` ignores are no data unless named.
        (
            card("configs:\n- config_name: default\n  data_files: data/**\n"),
            &["data/a.jsonl", "data/__old__/b.jsonl"],
            None,
        ),
        (card("license: mit\n"), &["train.jsonl", "__old__/train.jsonl", "config.json", "dataset_info.json"], None),
        (
            card("configs:\n- config_name: default\n  data_files: [__old__/*.jsonl, dataset_info.json]\n"),
            &["__old__/a.jsonl", "dataset_info.json"],
            None,
        ),
        (
            card(
                "configs:\n- config_name: default\n  data_files:\n  - split: train_prefs\n    path: prefs/tr_*.jsonl\n  - split: test_prefs\n    path: [prefs/te.jsonl, extra/**/*.jsonl]\n",
            ),
            &["prefs/tr_1.jsonl", "prefs/tr_0.jsonl", "prefs/te.jsonl", "extra/a/b/x.jsonl", "train.jsonl"],
            None,
        ),
        (
            card(
                "configs:\n- config_name: small\n  data_files: s/*.jsonl\n- config_name: big\n  default: true\n  data_files:\n  - split: train\n    path: b/train.jsonl\n  - split: test\n    path: b/test.jsonl\n",
            ),
            &["s/a.jsonl", "b/train.jsonl", "b/test.jsonl"],
            None,
        ),
        (
            card(
                "configs:\n- config_name: small\n  data_files: s/*.jsonl\n- config_name: big\n  default: true\n  data_files: b/*.jsonl\n",
            ),
            &["s/a.jsonl", "s/b.jsonl", "b/train.jsonl"],
            Some("small"),
        ),
        (
            card("configs:\n- config_name: sub\n  data_dir: sub\n"),
            &["sub/train.jsonl", "sub/test.jsonl", "other/train.jsonl"],
            None,
        ),
        (
            card(
                "configs:\n- config_name: default\n  data_dir: d\n  data_files:\n  - split: train\n    path: x-*.jsonl\n",
            ),
            &["d/x-0.jsonl", "d/x-1.jsonl", "x-2.jsonl"],
            None,
        ),
        (card("license: mit\n"), &["train.jsonl", "test.jsonl"], None),
        (
            card("configs:\n- config_name: a\n  data_files: a.jsonl\n- config_name: b\n  data_files: b.jsonl\n"),
            &["a.jsonl", "b.jsonl"],
            None,
        ),
        // A standalone `.huggingface.yaml` overrides the README's configurations.
        (
            card("configs:\n- config_name: default\n  data_files: a.jsonl\n"),
            &["a.jsonl", "b.jsonl", ".huggingface.yaml"],
            None,
        ),
    ];
    let row = "{\"prompt\": \"p\", \"chosen\": \" a\", \"rejected\": \" b\"}\n";
    let cache = tempfile::tempdir().unwrap();
    for (readme, files, config) in cases {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("README.md"), &readme).unwrap();
        for (i, f) in files.iter().enumerate() {
            let path = dir.path().join(f);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            let text = match *f {
                ".huggingface.yaml" => "configs:\n- config_name: default\n  data_files: b.jsonl\n".to_owned(),
                _ => row.repeat(1 << i),
            };
            std::fs::write(path, text).unwrap();
        }
        let code = "import sys, json, datasets\ndatasets.disable_progress_bars()\ntry:\n    d = datasets.load_dataset(sys.argv[1], name=sys.argv[2] or None)\nexcept ValueError as e:\n    print(json.dumps(None)); sys.exit()\nprint(json.dumps({k: v.num_rows for k, v in d.items()}))";
        let out = std::process::Command::new(crate::common::python())
            .args(["-W", "ignore", "-c", code, dir.path().to_str().unwrap(), config.unwrap_or("")])
            .env("HF_DATASETS_CACHE", cache.path())
            .output()
            .unwrap();
        assert!(out.status.success(), "{files:?}: {}", String::from_utf8_lossy(&out.stderr));
        let want: Option<BTreeMap<String, usize>> = serde_json::from_slice(&out.stdout).unwrap();
        let read = |split: &str| {
            let opts = LoadOptions { config: config.map(str::to_owned), ..split_opts(split) };
            load_preferences(dir.path(), &opts).map(|l| l.rows.len())
        };
        let Some(want) = want else {
            let err = read("train").unwrap_err().to_string();
            assert!(err.contains("several configurations and none is the default"), "{err}");
            continue;
        };
        for (split, rows) in &want {
            assert_eq!(read(split).unwrap_or_else(|e| panic!("{files:?} {split}: {e}")), *rows, "{files:?} {split}");
        }
        for split in ["train", "test", "validation"].into_iter().filter(|s| !want.contains_key(*s)) {
            assert!(read(split).is_err(), "{files:?}: `{split}` is no split of {want:?}");
        }
    }
}

/// A split's shards are one dataset: an empty shard, or one whose every row is skipped, leaves
/// the others' rows (as `datasets` loads them); only a split with no good row at all is refused.
#[test]
fn an_empty_or_all_bad_shard_leaves_the_splits_other_rows() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let good = "{\"prompt\": \"p\", \"chosen\": \" a\", \"rejected\": \" b\"}\n".repeat(5);
    let bad = "{\"prompt\": \"p\", \"chosen\": null, \"rejected\": \" b\"}\n".repeat(3);
    std::fs::write(data.join("train-00000-of-00002.jsonl"), &good).unwrap();
    std::fs::write(data.join("train-00001-of-00002.jsonl"), "").unwrap();
    assert_eq!(load_preferences(dir.path(), &split_opts("train")).unwrap().rows.len(), 5);
    std::fs::write(data.join("train-00001-of-00002.jsonl"), &bad).unwrap();
    let skip = LoadOptions { skip_bad_rows: true, ..split_opts("train") };
    let loaded = load_preferences(dir.path(), &skip).unwrap();
    assert_eq!((loaded.rows.len(), loaded.skipped.len()), (5, 3));
    std::fs::write(data.join("train-00000-of-00002.jsonl"), "").unwrap();
    let err = load_preferences(dir.path(), &skip).unwrap_err().to_string();
    assert_eq!(err, format!("`{}`: the dataset is empty after skipping 3 bad rows", dir.path().display()));
}
