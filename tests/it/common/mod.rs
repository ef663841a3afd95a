//! Helpers shared by the integration tests.
#![allow(dead_code)] // each test binary uses a different subset

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::AtomicBool;

use burn::tensor::Device;
use dpo_train::config::TrainConfig;
use dpo_train::data::{Columns, Packing};
use dpo_train::eval::EvalOptions;
use dpo_train::run::{RunRequest, RunSummary, run};
use dpo_train::train::Progress;

pub mod bounds;
pub mod cli;
pub mod trl;

/// `src`'s pairs (JSON Lines) written to `dest` under other columns: `question`, `good`, `bad`.
pub fn with_renamed_columns(src: &Path, dest: &Path) {
    let rows: Vec<String> = std::fs::read_to_string(src)
        .unwrap()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            serde_json::json!({"question": v["prompt"], "good": v["chosen"], "bad": v["rejected"]}).to_string()
        })
        .collect();
    std::fs::write(dest, rows.join("\n")).unwrap();
}

/// `tests/fixtures/` of this checkout.
pub fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// A test's scratch directory under the system's temporary directory, removed when the test
/// ends, passed or failed (it derefs to its path).
pub struct Scratch(tempfile::TempDir);

impl Scratch {
    /// A fresh directory whose name starts with `prefix`.
    pub fn new(prefix: &str) -> Self {
        Self(tempfile::Builder::new().prefix(prefix).tempdir().expect("a temporary directory"))
    }
}

impl std::ops::Deref for Scratch {
    type Target = Path;

    fn deref(&self) -> &Path {
        self.0.path()
    }
}

/// The libtorch CPU device.
#[allow(deprecated)] // burn's libtorch device is deprecated upstream; it is this project's backend.
pub fn cpu() -> Device {
    Device::libtorch()
}

/// A progress sink that shows nothing.
pub struct Quiet;

impl Progress for Quiet {
    fn start(&mut self, _stage: &str, _start: u64, _total: u64) {}
    fn step(&mut self, _step: u64, _status: &str) {}
    fn line(&mut self, _text: &str) {}
}

/// Every f32 tensor of a safetensors file, flattened, sorted by name.
pub fn tensors(file: &Path) -> Vec<(String, Vec<f32>)> {
    let read = dpo_train::model::Weights::open_file(file).and_then(|w| w.all_values());
    read.unwrap_or_else(|e| panic!("{}: {e}", file.display()))
}

/// The largest absolute difference between two tensor lists of the same names.
pub fn max_diff(a: &[(String, Vec<f32>)], b: &[(String, Vec<f32>)]) -> f32 {
    assert_eq!(a.iter().map(|t| &t.0).collect::<Vec<_>>(), b.iter().map(|t| &t.0).collect::<Vec<_>>());
    a.iter().zip(b).flat_map(|((_, x), (_, y))| x.iter().zip(y).map(|(p, q)| (p - q).abs())).fold(0.0, f32::max)
}

/// One training run in this process on the CPU (no data parallelism); `resume` continues that
/// run directory, `sft_only` runs `dpo-train sft`.
pub fn run_alone(
    cfg: TrainConfig,
    resume: Option<PathBuf>,
    sft_only: bool,
    interrupt: &AtomicBool,
    progress: &mut dyn Progress,
) -> RunSummary {
    try_run_alone(cfg, resume, sft_only, interrupt, progress).unwrap()
}

/// [`run_alone`], its error returned.
pub fn try_run_alone(
    cfg: TrainConfig,
    resume: Option<PathBuf>,
    sft_only: bool,
    interrupt: &AtomicBool,
    progress: &mut dyn Progress,
) -> anyhow::Result<RunSummary> {
    let req = RunRequest {
        plan: cfg.resolve().expect("a valid config"),
        cfg,
        config_name: "test".into(),
        resume: resume.map(Some),
        sft_only,
        rt: dpo_train::train::Runtime {
            device: cpu(),
            interrupt,
            workers: dpo_train::train::Workers::single(),
            overlap_reference: None,
        },
        config_description: String::new(),
    };
    run(req, progress)
}

/// The venv's python: `DPO_TRAIN_VENV` when set (CI), else the checkout's `.venv`.
pub fn python() -> PathBuf {
    let venv = std::env::var_os("DPO_TRAIN_VENV")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv"), PathBuf::from);
    venv.join("bin/python")
}

/// transformers' f32 logits (PEFT's for an adapter directory) of `ids`, flattened, computed by
/// `tests/gen/check_export.py` in the venv.
pub fn reference_logits(dir: &Path, ids: &[Vec<i64>]) -> Vec<f32> {
    let out = Command::new(python())
        .arg(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/gen/check_export.py"))
        .arg(dir)
        .arg(serde_json::to_string(ids).unwrap())
        .output()
        .expect("the venv's python runs (make ref-venv installs transformers and peft)");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let value: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let logits: Vec<Vec<Vec<f32>>> = serde_json::from_value(value["logits"].clone()).unwrap();
    logits.concat().concat()
}

/// The largest difference relative to max(|b|, 1).
pub fn max_rel_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs() / y.abs().max(1.0)).fold(0.0, f32::max)
}

/// A batch's `[2B]` reference rows on its device, as the loss reads them.
pub fn on_device(rows: &[f32], batch: &dpo_train::dpo::logps::DeviceBatch) -> burn::tensor::Tensor<1> {
    dpo_torch::transfers::upload_floats(rows, &batch.lengths.device())
}

/// `dpo-train eval`'s options over the fixtures' `model` (against `ref_model`, else itself) with
/// the fixture tokenizer, `cfg`'s loss and truncation, `batch_size` pairs a pass laid out as
/// `packing`, on the CPU; the metrics' batches are the passes'.
pub fn fixture_eval(
    (model, ref_model): (&str, Option<&str>),
    data: &Path,
    cfg: &TrainConfig,
    (batch_size, packing): (usize, Packing),
) -> EvalOptions {
    EvalOptions {
        model: fixtures().join(model),
        ref_model: ref_model.map(|r| fixtures().join(r)),
        tokenizer: Some(fixtures().join("tokenizer")),
        data: data.to_owned(),
        columns: Columns::default(),
        skip_bad_rows: false,
        split: None,
        config: None,
        truncation: cfg.truncation().unwrap(),
        loss: cfg.loss.clone(),
        batch_size,
        metrics_batch: None,
        packing,
        device: cpu(),
    }
}
