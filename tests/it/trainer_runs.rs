//! TRL's KTO and SFT trainers over several batches (`tests/gen/make_trainer_runs_fixture.py`):
//! what one-batch fixtures cannot see. KTO's evaluation loss is each batch's under its own KL
//! estimate; KTO trains in the data's order (KTOConfig's sequential default), each step's rows
//! lending each other their KL completions; `dpo-train sft` keeps a pair whose rejected side is
//! its chosen one and logs SFTTrainer's entropy and token accuracy.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::AtomicBool;

use serde::Deserialize;

use dpo_train::config::TrainConfig;
use dpo_train::data::Packing;
use dpo_train::eval::{EvalOptions, evaluate};
use dpo_train::train::log::{MetricsRow, Split, read_metrics};

use crate::common::{Quiet, fixture_eval, fixtures, run_alone};

#[derive(Deserialize)]
struct Fixture {
    common: BTreeMap<String, serde_json::Value>,
    kto_eval: Case,
    kto_train: Case,
    sft_train: Case,
}

#[derive(Deserialize)]
struct Case {
    settings: BTreeMap<String, serde_json::Value>,
    #[serde(default)]
    metrics: BTreeMap<String, f64>,
    #[serde(default)]
    logged: Vec<BTreeMap<String, f64>>,
    /// SFT's data: every this many rows of data/prefs.jsonl, the rejected side is the chosen one.
    #[serde(default)]
    identical_every: Option<usize>,
}

fn fixture() -> Fixture {
    let path = fixtures().join("expected/trl_trainer_runs.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// f32 round-off, carried through a few steps' updates.
fn close(what: &str, got: f64, trl: f64) {
    assert!((got - trl).abs() <= 1e-4 * trl.abs().max(1e-2), "{what}: {got} against TRL's {trl}");
}

/// A run of `case`'s settings and the fixture's common ones, in f32 without checkpointing.
fn config(fx: &Fixture, case: &Case, data: &Path, out: &Path, extra: &str) -> TrainConfig {
    let keys: String = fx.common.iter().chain(&case.settings).map(|(k, v)| format!("{k} = {v}\n")).collect();
    let text = format!(
        "model_name_or_path = \"{}\"\ntrain_file = \"{}\"\noutput_dir = \"{}\"\nrun_name = \"trl\"\n\
         bf16 = false\ngradient_checkpointing = false\nsave_strategy = \"no\"\nnum_samples = 0\n{keys}{extra}",
        fixtures().join("models/llama").display(),
        data.display(),
        out.display(),
    );
    TrainConfig::from_toml_str(&text, "trl.toml").unwrap()
}

fn train_rows(dir: &Path) -> Vec<MetricsRow> {
    read_metrics(&dir.join("metrics.csv")).unwrap().into_iter().filter(|r| r.split == Split::Train).collect()
}

#[test]
fn a_kto_evaluation_in_batches_has_trls_loss() {
    let fx = fixture();
    let setting = |k: &str| fx.kto_eval.settings[k].as_u64().unwrap() as usize;
    let cfg =
        config(&fx, &fx.kto_eval, &fixtures().join("data/kto.jsonl"), Path::new("unused"), "loss_type = \"kto\"\n");
    let models = ("models/llama", Some("models/llama-ref"));
    // The KL completions rotate in blocks of the training batch; the metrics are means over the
    // evaluation batches.
    let blocks = (setting("per_device_train_batch_size"), Packing::Packed);
    let options = EvalOptions {
        metrics_batch: Some(setting("per_device_eval_batch_size")),
        ..fixture_eval(models, &fixtures().join("data/kto.jsonl"), &cfg, blocks)
    };
    let report = evaluate(&options).unwrap();
    let ours: BTreeMap<&str, f64> = report.metrics.named().into_iter().chain(report.metrics.extra()).collect();
    // Before the loss was taken batch by batch it was 0.3% off: one KL over all 17 rows.
    for name in ["loss", "kl", "rewards/chosen", "rewards/rejected", "logps/chosen", "logps/rejected", "entropy"] {
        close(name, ours[name], fx.kto_eval.metrics[name]);
    }
}

#[test]
fn kto_trains_in_the_data_s_order_as_trl() {
    let fx = fixture();
    let dir = tempfile::tempdir().unwrap();
    let extra = format!(
        "loss_type = \"kto\"\nref_model_name_or_path = \"{}\"\n",
        fixtures().join("models/llama-ref").display()
    );
    let cfg = config(&fx, &fx.kto_train, &fixtures().join("data/kto.jsonl"), dir.path(), &extra);
    let summary = run_alone(cfg, None, false, &AtomicBool::new(false), &mut Quiet);
    let rows = train_rows(&summary.run_dir);
    assert_eq!(rows.len(), fx.kto_train.logged.len());
    for (row, want) in rows.iter().zip(&fx.kto_train.logged) {
        let step = want["step"];
        assert_eq!(row.step as f64, step);
        close(&format!("step {step}: grad_norm"), row.grad_norm.unwrap(), want["grad_norm"]);
        // Shuffled, the first step's loss was 0.3982 against TRL's 0.4436.
        for name in ["loss", "rewards/chosen", "rewards/rejected", "logps/chosen", "logps/rejected", "entropy"] {
            close(&format!("step {step}: {name}"), row.metric(name).unwrap(), want[name]);
        }
    }
}

#[test]
fn sft_keeps_every_pair_and_logs_sfttrainers_metrics() {
    let fx = fixture();
    let dir = tempfile::tempdir().unwrap();
    let every = fx.sft_train.identical_every.unwrap();
    let text = std::fs::read_to_string(fixtures().join("data/prefs.jsonl")).unwrap();
    let rows: String = text
        .lines()
        .enumerate()
        .map(|(i, line)| {
            let mut row: serde_json::Value = serde_json::from_str(line).unwrap();
            if i % every == 0 {
                row["rejected"] = row["chosen"].clone();
            }
            format!("{row}\n")
        })
        .collect();
    let data = dir.path().join("same.jsonl");
    std::fs::write(&data, rows).unwrap();
    let cfg = config(&fx, &fx.sft_train, &data, dir.path(), "");
    let summary = run_alone(cfg, None, true, &AtomicBool::new(false), &mut Quiet);
    let rows = train_rows(&summary.run_dir);
    assert_eq!(rows.len(), fx.sft_train.logged.len());
    for (row, want) in rows.iter().zip(&fx.sft_train.logged) {
        let step = want["step"];
        close(&format!("step {step}: grad_norm"), row.grad_norm.unwrap(), want["grad_norm"]);
        // num_tokens was 514 of TRL's 597 with the identical pairs dropped; entropy and
        // mean_token_accuracy were not logged.
        for name in ["loss", "num_tokens", "entropy", "mean_token_accuracy"] {
            close(&format!("step {step}: {name}"), row.metric(name).unwrap(), want[name]);
        }
    }
}
