//! `report_to = "wandb"`: a run logs to Weights & Biases through the wandb package of the venv's
//! python, each metrics row under transformers' `WandbCallback` names on the `train/global_step`
//! axis. W&B runs offline here (`WANDB_MODE=offline`), and what it recorded is read back from its
//! own run file with wandb's record type, not from anything of ours.

use std::path::Path;
use std::process::Command;

use crate::common::{fixtures, python};

/// Reads an offline run's `.wandb` file (W&B's log of 32 KiB blocks, each record a CRC, a length,
/// a piece type and a piece of a `Record` protobuf): the history rows, the run's name and project,
/// its config and its exit code.
const READ_RUN: &str = r#"
import glob, json, struct, sys
from wandb.proto import wandb_internal_pb2 as pb
path = glob.glob(sys.argv[1] + "/wandb/offline-run-*/run-*.wandb")[0]
data = open(path, "rb").read()
pos, block, buf, out = 7, 32768, b"", {"history": [], "config": {}, "summary": {}}
while pos + 7 <= len(data):
    if block - pos % block < 7:
        pos += block - pos % block
        continue
    _, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
    if kind == 0:
        break
    buf, pos = buf + data[pos + 7:pos + 7 + n], pos + 7 + n
    if kind in (1, 4):
        record = pb.Record()
        record.ParseFromString(buf)
        buf, what = b"", record.WhichOneof("record_type")
        if what == "history":
            out["history"].append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item})
        elif what == "run":
            out["name"], out["project"] = record.run.display_name, record.run.project
            out["config"].update({u.key: json.loads(u.value_json) for u in record.run.config.update})
        elif what == "config":
            out["config"].update({u.key: json.loads(u.value_json) for u in record.config.update})
        elif what == "summary":
            out["summary"].update({u.key or "/".join(u.nested_key): json.loads(u.value_json) for u in record.summary.update})
        elif what == "exit":
            out["exit_code"] = record.exit.exit_code
print(json.dumps(out))
"#;

#[test]
fn a_run_logs_its_rows_to_wandb_under_transformers_names() {
    let dir = tempfile::tempdir().unwrap();
    let out = dpo_train(dir.path(), "wandb", &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let recorded = read_run(dir.path());
    assert_eq!((recorded["name"].as_str(), recorded["project"].as_str()), (Some("r"), Some("huggingface")));
    assert_eq!(recorded["exit_code"].as_i64(), Some(0), "the run ended as finished");
    // The model's config.json and the training config over it, as transformers sends them.
    let config = &recorded["config"];
    assert_eq!((config["hidden_size"].as_u64(), config["beta"].as_f64()), (Some(64), Some(0.1)));
    assert_eq!(config["max_steps"].as_i64(), Some(4));

    let history = recorded["history"].as_array().unwrap();
    let metrics = dpo_train::train::log::read_metrics(&dir.path().join("out/r/metrics.csv")).unwrap();
    // One W&B row a metrics.csv row, then the end of training's: its epoch in the history, its
    // runtime and loss in the run's summary, as transformers' `WandbCallback` puts them.
    assert_eq!(history.len(), metrics.len() + 1, "one W&B row a metrics.csv row, and the end's");
    let end = &history[metrics.len()];
    let keys: Vec<&String> = end.as_object().unwrap().keys().filter(|k| !k.starts_with('_')).collect();
    assert_eq!(keys, ["train/epoch", "train/global_step"], "{end}");
    let summary = &recorded["summary"];
    assert!(summary["train_runtime"].as_f64() > Some(0.0) && summary["train_loss"].is_f64(), "{summary}");
    for (logged, row) in history.iter().zip(&metrics) {
        assert_eq!(logged["train/global_step"].as_u64(), Some(row.step));
        for (tag, value) in row.tagged() {
            let got =
                logged[tag.as_str()].as_f64().unwrap_or_else(|| panic!("step {}: no `{tag}` in {logged}", row.step));
            assert!((got - value).abs() <= 1e-12 * value.abs().max(1.0), "step {} `{tag}`: {got} vs {value}", row.step);
        }
    }
    // An evaluation's speed is in its row, as transformers logs it.
    assert!(history.iter().filter(|h| h.get("eval/loss").is_some()).all(|h| h["eval/runtime"].as_f64() > Some(0.0)));
    let splits: Vec<bool> = history.iter().map(|h| h.get("eval/loss").is_some()).collect();
    assert_eq!(
        splits,
        [false, false, true, false, false, true, false],
        "train rows at steps 1-4, evaluations at 2 and 4"
    );
}

#[test]
fn wandb_without_its_package_is_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let out = dpo_train(dir.path(), "wandb", NO_WANDB);
    let err = String::from_utf8_lossy(&out.stderr);
    let last = err.trim().lines().last().unwrap_or_default();
    assert!(last.starts_with("error: `--report-to`: `wandb` needs the wandb package"), "{err}");
    assert_eq!(out.status.code(), Some(1));
    assert!(!dir.path().join("out").exists(), "nothing written");
}

/// `report_to = "all"` takes W&B where a python imports wandb, beside TensorBoard, and runs
/// without it where none does, as transformers takes the integrations installed.
#[test]
fn all_takes_wandb_where_it_is_installed() {
    let with = tempfile::tempdir().unwrap();
    let out = dpo_train(with.path(), "all", &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // 4 train rows, 2 evaluations and the summary.
    assert_eq!(read_run(with.path())["history"].as_array().map(Vec::len), Some(7));
    assert!(with.path().join("out/r/runs/dpo").is_dir(), "TensorBoard too");
    let without = tempfile::tempdir().unwrap();
    let out = dpo_train(without.path(), "all", NO_WANDB);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!without.path().join("wandb").exists(), "no W&B run");
    assert!(without.path().join("out/r/runs/dpo").is_dir(), "TensorBoard alone");
}

/// No `python3` on PATH, and the venv's python (the fallback) without its standard library.
const NO_WANDB: &[(&str, &str)] = &[("PATH", "/nonexistent"), ("PYTHONHOME", "/nonexistent")];

/// `dpo-train train` for 4 steps with an evaluation every 2, reporting to `report_to` (W&B
/// offline, in `dir`), with the venv's python first on `PATH`, and `envs` over that.
fn dpo_train(dir: &Path, report_to: &str, envs: &[(&str, &str)]) -> std::process::Output {
    let venv_bin = python().parent().unwrap().to_path_buf();
    let path = format!("{}:{}", venv_bin.display(), std::env::var("PATH").unwrap_or_default());
    let data = fixtures().join("data/prefs.jsonl");
    Command::new(env!("CARGO_BIN_EXE_dpo-train"))
        .args(["train", "--model"])
        .arg(fixtures().join("models/llama"))
        .arg("--data")
        .arg(&data)
        .arg("--eval-file")
        .arg(&data)
        .arg("--output-dir")
        .arg(dir.join("out"))
        .args(["--run-name", "r", "--max-steps", "4", "--logging-steps", "1", "--eval-steps", "2"])
        .args(["--report-to", report_to, "--num-samples", "0", "--device", "cpu"])
        .current_dir(dir)
        .env("PATH", path)
        .env("WANDB_MODE", "offline")
        .env("WANDB_DIR", dir)
        .env_remove("WANDB_PROJECT")
        .envs(envs.iter().copied())
        .output()
        .unwrap()
}

/// What the offline W&B run in `dir` recorded ([`READ_RUN`]).
fn read_run(dir: &Path) -> serde_json::Value {
    let out = Command::new(python()).args(["-c", READ_RUN]).arg(dir).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}
