//! `dpo-train eval` as a user runs it: output shape, exit codes and one-line errors.

use std::fs;
use std::path::PathBuf;
use std::process::{Command, Output};

use crate::common::bounds;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn eval(extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dpo-train")).arg("eval").args(extra).output().expect("the binary runs")
}

fn with_defaults<'a>(model: &'a str, data: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["--model", model, "--data", data];
    args.extend_from_slice(extra);
    args
}

/// Asserts a failure with exit code `code` and exactly one stderr line, returned.
fn one_line_error(out: &Output, code: i32) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(code), "stderr: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "not one line: {stderr}");
    assert!(!stderr.contains("panicked") && !stderr.contains("backtrace"), "{stderr}");
    stderr.trim_end().to_owned()
}

#[test]
fn json_has_exactly_trls_metric_names() {
    let model = fixtures().join("models/llama");
    let reference = fixtures().join("models/llama-ref");
    let data = fixtures().join("data/prefs.jsonl");
    let out = eval(&with_defaults(
        model.to_str().unwrap(),
        data.to_str().unwrap(),
        &["--ref-model", reference.to_str().unwrap(), "--json"],
    ));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let value: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut keys: Vec<&str> = value.as_object().unwrap().keys().map(String::as_str).collect();
    keys.sort_unstable();
    // TRL's own names for the same run (`tests/gen/make_fixtures.py`'s sigmoid case).
    let fixture: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixtures().join("expected/trl_eval.json")).unwrap()).unwrap();
    let case = fixture["cases"].as_array().unwrap().iter().find(|c| c["name"] == "loss_sigmoid").unwrap();
    let mut expected: Vec<&str> = case["metrics"].as_object().unwrap().keys().map(String::as_str).collect();
    expected.sort_unstable();
    assert_eq!(keys, expected);
    // What the means leave out is reported beside the object, on stderr, as the table reports it.
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("prompt tokenised differently inside prompt+completion") && stderr.contains(": 1 (lines 17)\n"),
        "{stderr}"
    );
}

#[test]
fn reference_defaults_to_the_policy() {
    let model = fixtures().join("models/llama");
    let data = fixtures().join("data/prefs.jsonl");
    let out = eval(&with_defaults(model.to_str().unwrap(), data.to_str().unwrap(), &["--json"]));
    let value: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // Policy = reference: every log-ratio is 0, so the sigmoid loss is ln 2.
    assert!((value["loss"].as_f64().unwrap() - std::f64::consts::LN_2).abs() < 1e-6);
    assert_eq!(value["rewards/margins"].as_f64().unwrap(), 0.0);
    // Said up front; an adapter's reference is its base, and gets no note.
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("note: no --ref-model: ") && stderr.contains("is its own reference"), "{stderr}");
    let adapter = fixtures().join("adapters/llama-lora");
    let out = eval(&with_defaults(adapter.to_str().unwrap(), data.to_str().unwrap(), &["--json"]));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!String::from_utf8_lossy(&out.stderr).contains("note: no --ref-model"));
}

#[test]
fn malformed_json_line_is_one_line_and_exit_1() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("bad.jsonl");
    fs::write(&data, "{\"prompt\": \"a\", \"chosen\": \"b\", \"rejected\": \"c\"}\n{\"prompt\": \"a\", \n").unwrap();
    let model = fixtures().join("models/llama");
    let err = one_line_error(&eval(&with_defaults(model.to_str().unwrap(), data.to_str().unwrap(), &[])), 1);
    assert!(err.starts_with("error: "), "{err}");
    assert!(err.contains(&format!("`{}`, line 2", data.display())), "{err}");
}

#[test]
fn model_directory_without_config_exits_1() {
    let dir = tempfile::tempdir().unwrap();
    let data = fixtures().join("data/prefs.jsonl");
    let tokenizer = fixtures().join("tokenizer");
    let err = one_line_error(
        &eval(&with_defaults(
            dir.path().to_str().unwrap(),
            data.to_str().unwrap(),
            &["--tokenizer", tokenizer.to_str().unwrap()],
        )),
        1,
    );
    assert_eq!(
        err,
        format!(
            "error: cannot load the model in `{0}`: `{0}/config.json` not found: a model directory needs `config.json` and safetensors weights",
            dir.path().display()
        )
    );
}

#[test]
fn tokenizer_larger_than_the_embedding_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    for entry in fs::read_dir(fixtures().join("models/llama")).unwrap() {
        let entry = entry.unwrap();
        fs::copy(entry.path(), dir.path().join(entry.file_name())).unwrap();
    }
    let config = dir.path().join("config.json");
    let text = fs::read_to_string(&config).unwrap().replace("\"vocab_size\": 384", "\"vocab_size\": 300");
    fs::write(&config, text).unwrap();
    let data = fixtures().join("data/prefs.jsonl");
    let err = one_line_error(&eval(&with_defaults(dir.path().to_str().unwrap(), data.to_str().unwrap(), &[])), 1);
    assert_eq!(
        err,
        format!(
            "error: the tokenizer has 380 tokens but the model in `{}` embeds only 300 (`vocab_size`)",
            dir.path().display()
        )
    );
}

/// A bad loss setting is named by the flag that set it, as `train` names it.
#[test]
fn bad_loss_settings_name_the_flag() {
    let model = fixtures().join("models/llama");
    let data = fixtures().join("data/prefs.jsonl");
    let err =
        one_line_error(&eval(&with_defaults(model.to_str().unwrap(), data.to_str().unwrap(), &["--beta", "0"])), 1);
    assert_eq!(err, "error: `--beta`: must be finite and > 0, got 0");
    let err = one_line_error(
        &eval(&with_defaults(model.to_str().unwrap(), data.to_str().unwrap(), &["--unpair", "true"])),
        1,
    );
    assert!(err.starts_with("error: `--unpair`: only applies to KTOTrainer's losses"), "{err}");
}

/// `--truncation-mode keep_end` at a `--max-length` the data exceeds: TRL's keep_end keeps every
/// pair and cuts each sequence to its end (tests/fixtures/expected/tokenized_prefs_keep_end_16.json,
/// from tests/gen/make_keep_end_fixture.py, with TRL's `evaluate` metrics), where keep_start drops
/// the pairs whose prompt alone reaches 16 tokens; the scores are of other tokens, so they differ.
#[test]
fn truncation_mode_keep_end_is_honoured() {
    let fixture: serde_json::Value = serde_json::from_str(
        &fs::read_to_string(fixtures().join("expected/tokenized_prefs_keep_end_16.json")).unwrap(),
    )
    .unwrap();
    let max = fixture["max_length"].as_u64().unwrap() as usize;
    let rows = fixture["rows"].as_array().unwrap();
    let len = |r: &serde_json::Value, k: &str| r[k].as_array().unwrap().len();
    let over = |r: &serde_json::Value, k: &str| usize::from(len(r, "prompt_input_ids") + len(r, k) > max);
    let truncated: usize = rows.iter().map(|r| over(r, "chosen_input_ids") + over(r, "rejected_input_ids")).sum();
    let long_prompts = rows.iter().filter(|r| len(r, "prompt_input_ids") >= max).count();
    assert!(long_prompts > 0 && truncated > 0, "the fixture exercises neither");

    let (model, reference) = (fixtures().join("models/llama"), fixtures().join("models/llama-ref"));
    let data = fixtures().join(fixture["dataset"].as_str().unwrap());
    let run = |mode: &str, json: bool| {
        let (max, all) = (max.to_string(), rows.len().to_string());
        // TRL's fixture evaluated every pair in one batch: its metrics are that batch's values.
        let mut extra = vec!["--ref-model", reference.to_str().unwrap(), "--max-length", &max, "--batch-size", &all];
        extra.extend(["--truncation-mode", mode]);
        if json {
            extra.push("--json");
        }
        let out = eval(&with_defaults(model.to_str().unwrap(), data.to_str().unwrap(), &extra));
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let end = run("keep_end", false);
    let kept = fixture["num_rows_after_preprocessing"].as_u64().unwrap();
    assert!(end.contains(&format!("({kept} pairs)")), "{end}");
    assert!(end.contains(&format!("sequences truncated to max_length (keep_end): {truncated}\n")), "{end}");
    assert!(!end.contains("prompt alone reaches max_length"), "{end}");
    let start = run("keep_start", false);
    assert!(start.contains(&format!("({} pairs)", rows.len() - long_prompts)), "{start}");
    assert!(start.contains(&format!("pairs dropped, prompt alone reaches max_length: {long_prompts} ")), "{start}");
    assert!(start.contains("sequences truncated to max_length (keep_start): "), "{start}");

    let metrics = |mode| serde_json::from_str::<serde_json::Value>(&run(mode, true)).unwrap();
    let (end, start) = (metrics("keep_end"), metrics("keep_start"));
    // Our f32 forward and TRL's over sequences of at most `max` positions (`bounds::trl_metric`).
    let forward = bounds::llama_logits(&model, max) + bounds::reordered(max, bounds::U_F32);
    let trl = |name: &str| fixture["metrics"][name].as_f64();
    for (name, got) in end.as_object().unwrap() {
        let (got, want) = (got.as_f64().unwrap(), trl(name).unwrap());
        let bound = bounds::trl_metric(name, want, &trl, 0.1, forward);
        assert!((got - want).abs() <= bound, "{name}: {got}, TRL's keep_end {want} (bound {bound:e})");
    }
    for name in ["logps/chosen", "logps/rejected"] {
        let (end, start) = (end[name].as_f64().unwrap(), start[name].as_f64().unwrap());
        assert!((end - start).abs() > 1e-3, "{name}: keep_end {end}, keep_start {start}");
    }
}

#[test]
fn an_unknown_truncation_mode_is_one_line() {
    let model = fixtures().join("models/llama");
    let data = fixtures().join("data/prefs.jsonl");
    let out =
        eval(&with_defaults(model.to_str().unwrap(), data.to_str().unwrap(), &["--truncation-mode", "keep_middle"]));
    let err = one_line_error(&out, 1);
    assert!(err.contains("--truncation-mode") && err.contains("use `keep_start` or `keep_end`"), "{err}");
}

/// A reference-free loss refuses what its trainers do not define, as `train` does (one check
/// serves both): a reference model, keep_end truncation.
#[test]
fn a_reference_free_loss_refuses_a_reference_and_keep_end() {
    let model = fixtures().join("models/llama");
    let data = fixtures().join("data/prefs.jsonl");
    let (m, d) = (model.to_str().unwrap(), data.to_str().unwrap());
    let out = eval(&with_defaults(m, d, &["--loss-type", "cpo", "--ref-model", m]));
    assert!(one_line_error(&out, 1).contains("`--ref-model`: is not used by `cpo`, which has no reference model"));
    let out = eval(&with_defaults(m, d, &["--loss-type", "orpo", "--truncation-mode", "keep_end"]));
    assert!(one_line_error(&out, 1).contains("`--truncation-mode`: `keep_end` is not defined for `orpo`"));
}

/// A run directory given as the model (`eval --model RUN`, `generate --model RUN`) is refused in
/// one line naming the model in it to give, its `final/`, which then evaluates (it failed on a
/// missing `tokenizer.json`).
#[test]
fn a_run_directory_as_the_model_names_its_final_model() {
    let dir = tempfile::tempdir().unwrap();
    let (model, data) = (fixtures().join("models/llama"), fixtures().join("data/prefs.jsonl"));
    let out = dir.path().to_str().unwrap();
    let run = Command::new(env!("CARGO_BIN_EXE_dpo-train"))
        .args(["train", "--model", model.to_str().unwrap(), "--data", data.to_str().unwrap()])
        .args(["--output-dir", out, "--run-name", "r", "--max-steps", "1", "--num-samples", "0"])
        .output()
        .unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let run_dir = dir.path().join("r");
    let (r, d) = (run_dir.to_str().unwrap(), data.to_str().unwrap());
    let want =
        format!("error: `--model`: `{r}` is a dpo-train run, not a model: give `{}`", run_dir.join("final").display());
    assert_eq!(one_line_error(&eval(&with_defaults(r, d, &[])), 1), want);
    let prompts = dir.path().join("prompts.txt");
    fs::write(&prompts, "Hello\n").unwrap();
    let generate = Command::new(env!("CARGO_BIN_EXE_dpo-train"))
        .args(["generate", "--model", r, "--prompts", prompts.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(one_line_error(&generate, 1), want);
    let final_dir = run_dir.join("final");
    assert!(eval(&with_defaults(final_dir.to_str().unwrap(), d, &[])).status.success());
}
