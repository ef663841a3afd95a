//! `final/` is a Hugging Face model directory: transformers (in the project's venv) loads what a
//! training run exported and computes the same logits as our model.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::AtomicBool;

use burn::tensor::{Int, Tensor, TensorData};
use dpo_train::config::TrainConfig;

use common::{Quiet, cpu, fixtures, run_alone};

/// The venv's python: `DPO_TRAIN_VENV` when set (CI), else the checkout's `.venv`.
fn python() -> PathBuf {
    let venv = std::env::var_os("DPO_TRAIN_VENV")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv"), PathBuf::from);
    venv.join("bin/python")
}

fn transformers_logits(dir: &Path, ids: &[Vec<i64>]) -> Vec<f32> {
    let out = Command::new(python())
        .arg(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/gen/check_export.py"))
        .arg(dir)
        .arg(serde_json::to_string(ids).unwrap())
        .output()
        .expect("the venv's python runs (make ref-venv installs transformers)");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let value: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let logits: Vec<Vec<Vec<f32>>> = serde_json::from_value(value["logits"].clone()).unwrap();
    logits.concat().concat()
}

#[test]
fn final_model_loads_in_transformers_with_equal_logits() {
    let out = tempfile::tempdir().unwrap();
    let fixtures = fixtures();
    let text = format!(
        "model_name_or_path = \"{}\"\ntrain_file = \"{}\"\noutput_dir = \"{}\"\nrun_name = \"export\"\nlearning_rate = 1e-2\nmax_steps = 2\nper_device_train_batch_size = 4\nnum_samples = 0\n",
        fixtures.join("models/qwen2").display(),
        fixtures.join("data/prefs.jsonl").display(),
        out.path().display()
    );
    let cfg = TrainConfig::from_toml_str(&text, "test").unwrap();
    let summary = run_alone(cfg, None, false, &AtomicBool::new(false), &mut Quiet);
    let final_dir = summary.run_dir.join("final");
    for file in ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"] {
        assert!(final_dir.join(file).is_file(), "final/ lacks {file}");
    }

    let ids: Vec<Vec<i64>> = vec![vec![11, 45, 201, 7, 99, 3, 150, 42], vec![300, 2, 17, 17, 88, 120, 5, 64]];
    let device = cpu();
    let (_, model) = dpo_train::model::load(&final_dir, &device).unwrap();
    let input = Tensor::<2, Int>::from_data(TensorData::new(ids.concat(), [2, 8]), &device);
    let ours = model.forward(input).into_data().convert::<f32>().as_slice::<f32>().unwrap().to_vec();
    let theirs = transformers_logits(&final_dir, &ids);
    assert_eq!(ours.len(), theirs.len());
    let worst = ours.iter().zip(&theirs).map(|(a, b)| (a - b).abs() / b.abs().max(1.0)).fold(0f32, f32::max);
    assert!(worst < 1e-4, "worst relative logit difference {worst}");
    // Training moved the weights: the comparison is not of the untouched fixture.
    let (_, start) = dpo_train::model::load(&fixtures.join("models/qwen2"), &device).unwrap();
    let input = Tensor::<2, Int>::from_data(TensorData::new(ids.concat(), [2, 8]), &device);
    let before = start.forward(input).into_data().convert::<f32>().as_slice::<f32>().unwrap().to_vec();
    assert!(before.iter().zip(&ours).any(|(a, b)| (a - b).abs() > 1e-3));
}
