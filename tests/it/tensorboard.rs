//! `report_to = ["tensorboard"]`: the event files a run writes, read back by TensorBoard's own
//! `EventAccumulator` (`tests/gen/read_tensorboard.py`, in the venv), hold every `metrics.csv`
//! value under transformers' tag names at its step, the held-out samples as text and the
//! dashboard PNG at each evaluation.

use std::collections::HashMap;
use std::process::Command;

use crate::common::{fixtures, python};

#[test]
fn tensorboard_reads_every_logged_value_the_samples_and_the_dashboard() {
    let dir = tempfile::tempdir().unwrap();
    let (data, model) = (fixtures().join("data/prefs.jsonl"), fixtures().join("models/llama"));
    let args = [
        "train",
        "--model",
        model.to_str().unwrap(),
        "--data",
        data.to_str().unwrap(),
        "--eval-file",
        data.to_str().unwrap(),
        "--output-dir",
        dir.path().to_str().unwrap(),
        "--run-name",
        "tb",
        "--max-steps",
        "4",
        "--logging-steps",
        "1",
        "--eval-steps",
        "2",
        "--num-samples",
        "1",
        "--max-new-tokens",
        "4",
        "--bf16",
        "false",
        "--gradient-checkpointing",
        "false",
        "--report-to",
        "tensorboard",
    ];
    let out = Command::new(env!("CARGO_BIN_EXE_dpo-train")).args(args).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let run = dir.path().join("tb");

    let read = Command::new(python())
        .arg(fixtures().join("../gen/read_tensorboard.py"))
        .arg(run.join("runs/dpo"))
        .output()
        .expect("the venv's python runs (make ref-venv installs tensorboard)");
    assert!(read.status.success(), "{}", String::from_utf8_lossy(&read.stderr));
    let events: serde_json::Value = serde_json::from_slice(&read.stdout).unwrap();
    let scalar = |tag: &str, step: u64| -> Option<f64> {
        events["scalars"][tag].as_array()?.iter().find(|e| e[0].as_u64() == Some(step))?[1].as_f64()
    };

    let rows = dpo_train::train::log::read_metrics(&run.join("metrics.csv")).unwrap();
    let mut compared = HashMap::new();
    for row in &rows {
        let split = row.split.as_str();
        let mut values: Vec<(String, Option<f64>)> = dpo_train::train::log::METRIC_NAMES
            .iter()
            .map(|name| (format!("{split}/{name}"), row.metric(name)))
            .collect();
        values.extend([
            (format!("{split}/pairs_per_second"), row.pairs_per_second),
            (format!("{split}/tokens_per_second"), row.tokens_per_second),
            (format!("{split}/elapsed_seconds"), Some(row.elapsed_seconds)),
        ]);
        // transformers logs the epoch with every row, eval's too.
        values.push(("train/epoch".to_owned(), Some(row.epoch)));
        if split == "train" {
            values.extend([
                ("train/learning_rate".to_owned(), row.learning_rate),
                ("train/grad_norm".to_owned(), row.grad_norm),
            ]);
        } else {
            // Each evaluation's speed under transformers' names (not in metrics.csv): the held-out
            // pairs in batches of 8 (`per_device_eval_batch_size`) a second.
            let runtime = scalar("eval/runtime", row.step).expect("eval/runtime");
            let pairs = scalar("eval/samples_per_second", row.step).expect("eval/samples_per_second") * runtime;
            let batches = scalar("eval/steps_per_second", row.step).expect("eval/steps_per_second") * runtime;
            // transformers rounds the runtime to 4 decimals and the rates to 3.
            let off = |n: f64| n * 5e-5 / runtime + 5e-4 * runtime + 1e-3;
            let n = pairs.round();
            assert!(runtime > 0.0 && (pairs - n).abs() <= off(n) && n >= 8.0, "{pairs} pairs in {runtime} s");
            let want = (n / 8.0).ceil();
            assert!((batches - want).abs() <= off(want), "{batches} batches of {pairs} in {runtime} s");
        }
        for (tag, value) in values {
            let Some(expected) = value else { continue };
            let found = scalar(&tag, row.step).unwrap_or_else(|| panic!("{tag} at step {} missing", row.step));
            // Event files hold f32.
            assert_eq!(found as f32, expected as f32, "{tag} at step {}", row.step);
            *compared.entry(split).or_insert(0) += 1;
        }
    }
    assert!(compared["train"] >= 4 * 12 && compared["eval"] >= 2 * 10, "{compared:?}");
    // transformers' summary at the last step: the mean of the steps' losses (each step logged
    // here), and its 4 steps in its runtime.
    let train: Vec<f64> =
        rows.iter().filter(|r| r.split.as_str() == "train").filter_map(|r| r.metric("loss")).collect();
    let mean = train.iter().sum::<f64>() / train.len() as f64;
    assert_eq!(train.len(), 4);
    assert_eq!(scalar("train/train_loss", 4).expect("train_loss") as f32, mean as f32);
    let runtime = scalar("train/train_runtime", 4).expect("train_runtime");
    let steps = scalar("train/train_steps_per_second", 4).expect("train_steps_per_second") * runtime;
    // Rounded to 3 decimals a second, as transformers rounds it; event files hold f32.
    assert!((steps - 4.0).abs() <= 5e-4 * runtime + 1e-3, "{steps} steps in {runtime} s");

    let samples = events["texts"]["eval/samples"].as_array().expect("samples as text");
    let steps: Vec<u64> = samples.iter().map(|s| s[0].as_u64().unwrap()).collect();
    assert_eq!(steps, [2, 4]);
    let last = samples[1][1].as_str().unwrap();
    let file = std::fs::read_to_string(run.join("samples_val.txt")).unwrap();
    let unindented: String = last.lines().map(|l| format!("{}\n", l.strip_prefix("    ").unwrap_or(l))).collect();
    assert_eq!(unindented, file, "the text shown is samples_val.txt");

    let images = events["images"]["eval/dashboard"].as_array().expect("the dashboard as an image");
    let shown: Vec<(u64, u64, u64)> =
        images.iter().map(|i| (i[0].as_u64().unwrap(), i[1].as_u64().unwrap(), i[2].as_u64().unwrap())).collect();
    assert_eq!(shown, [(2, 2000, 1200), (4, 2000, 1200)]);
    let png = std::fs::metadata(run.join("dashboard.png")).unwrap().len();
    assert_eq!(images[1][3].as_u64(), Some(png), "the last image is the final dashboard.png");
}

#[test]
fn an_integration_we_do_not_have_is_refused_by_name() {
    let out = Command::new(env!("CARGO_BIN_EXE_dpo-train"))
        .args(["train", "--model", "m", "--data", "d.jsonl", "--report-to", "tensorboard,comet_ml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim(), "error: `--report-to`: `comet_ml` is not supported: use `tensorboard`, `wandb` (or `none`)");
}

/// A `--logging-dir` under a file is refused before the run writes anything: no run directory
/// is left (it held `config.toml`, `data_report.json` and a `metrics.csv` header).
#[test]
fn a_logging_dir_that_cannot_be_made_is_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("afile");
    std::fs::write(&file, b"x").unwrap();
    let (model, data) = (fixtures().join("models/llama"), fixtures().join("data/prefs.jsonl"));
    let mut args = crate::common::cli::short_run(&dir.path().join("out"), "z", &model, &data, &[]);
    args.extend(["--report-to", "tensorboard", "--logging-dir"].map(String::from));
    args.push(file.join("tb").display().to_string());
    let out = Command::new(env!("CARGO_BIN_EXE_dpo-train")).arg("train").args(&args).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    let want = format!("error: `--logging-dir`: `{}` is a file, not a directory", file.display());
    assert_eq!(err.lines().filter(|l| l.starts_with("error:")).collect::<Vec<_>>(), [want.as_str()], "{err}");
    assert!(!dir.path().join("out/z").exists(), "{err}");
}

/// A resumed stage logs the steps after its checkpoint again, in a new file that starts with a
/// restart: TensorBoard shows each step once, with the values logged last.
#[test]
fn a_restart_replaces_the_steps_logged_after_the_checkpoint() {
    use dpo_train::tboard::EventWriter;
    let dir = tempfile::tempdir().unwrap();
    let mut first = EventWriter::create(dir.path()).unwrap();
    for step in 1..=4 {
        first.scalar("train/loss", step, step as f32).unwrap();
    }
    let mut again = EventWriter::create(dir.path()).unwrap();
    again.restart(3).unwrap();
    for step in 3..=5 {
        again.scalar("train/loss", step, 10.0 * step as f32).unwrap();
    }
    let read =
        Command::new(python()).arg(fixtures().join("../gen/read_tensorboard.py")).arg(dir.path()).output().unwrap();
    assert!(read.status.success(), "{}", String::from_utf8_lossy(&read.stderr));
    let events: serde_json::Value = serde_json::from_slice(&read.stdout).unwrap();
    let steps: Vec<(u64, f64)> = events["scalars"]["train/loss"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e[0].as_u64().unwrap(), e[1].as_f64().unwrap()))
        .collect();
    assert_eq!(steps, [(1, 1.0), (2, 2.0), (3, 30.0), (4, 40.0), (5, 50.0)]);
}

/// ORPO's own metrics, which `metrics.csv` has no column for, reach TensorBoard under TRL's names
/// on training and evaluation steps: `nll_loss`, `log_odds_ratio`, `log_odds_chosen`.
#[test]
fn the_reference_free_family_logs_its_own_metrics_to_tensorboard() {
    let dir = tempfile::tempdir().unwrap();
    let (data, model) = (fixtures().join("data/prefs.jsonl"), fixtures().join("models/llama"));
    let out = Command::new(env!("CARGO_BIN_EXE_dpo-train"))
        .args(["train", "--model", model.to_str().unwrap(), "--data", data.to_str().unwrap()])
        .args(["--eval-file", data.to_str().unwrap(), "--output-dir", dir.path().to_str().unwrap()])
        .args(["--run-name", "orpo", "--loss-type", "orpo", "--max-steps", "2", "--logging-steps", "1"])
        .args(["--eval-steps", "2", "--num-samples", "0", "--bf16", "false", "--report-to", "tensorboard"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("| nll_loss "), "the step line shows ORPO's NLL: {stderr}");
    let read = Command::new(python())
        .arg(fixtures().join("../gen/read_tensorboard.py"))
        .arg(dir.path().join("orpo/runs/dpo"))
        .output()
        .unwrap();
    assert!(read.status.success(), "{}", String::from_utf8_lossy(&read.stderr));
    let events: serde_json::Value = serde_json::from_slice(&read.stdout).unwrap();
    for tag in
        ["train/nll_loss", "train/log_odds_ratio", "train/log_odds_chosen", "eval/nll_loss", "eval/log_odds_chosen"]
    {
        let values = events["scalars"][tag].as_array().unwrap_or_else(|| panic!("no {tag}: {}", events["scalars"]));
        assert!(values.iter().all(|e| e[1].as_f64().is_some_and(f64::is_finite)), "{tag}: {values:?}");
    }
    assert!(events["scalars"]["train/nll_loss"].as_array().unwrap().len() == 2, "one per logged step");
}
