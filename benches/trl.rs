//! `make bench-trl`: dpo-train against TRL's `DPOTrainer` (the venv's TRL 1.16, transformers,
//! torch) on the same machine, in one run, side by side: the same medium model (saved in Hugging
//! Face format, loaded by both), the same 512-token preference pairs, batch size, `max_length`,
//! loss, optimizer, precision and number of threads. Each side trains 10 steps; steps 2..10 are
//! timed (`benches/trl_dpo.py` times TRL with a step callback, the same span as our
//! `metrics.csv` gives).
//!
//! Rows: equal settings with the reference computed every step, equal settings with precomputed
//! reference log-probs, and each side's best (the faster of f32 and bf16, reference precomputed).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{MEDIUM, dpo_train_rate};

const BATCH: usize = 2;
const STEPS: usize = 10;

fn python() -> PathBuf {
    let venv = std::env::var_os("DPO_TRAIN_VENV").map_or_else(|| common::root().join(".venv"), PathBuf::from);
    venv.join("bin/python")
}

/// TRL's pairs per second with `flags` for `benches/trl_dpo.py`.
fn trl_rate(model: &Path, data: &Path, flags: &[&str]) -> f64 {
    let out = Command::new(python())
        .arg(common::root().join("benches/trl_dpo.py"))
        .arg(model)
        .arg(data)
        .args(["--batch-size", &BATCH.to_string(), "--max-length", "512", "--steps", &STEPS.to_string()])
        .args(["--threads", &common::torch_threads().to_string()])
        .args(flags)
        .output()
        .expect("the venv's python runs (make ref-venv installs TRL)");
    if !out.status.success() {
        eprintln!("{}", String::from_utf8_lossy(&out.stderr));
        std::process::exit(1);
    }
    let line = String::from_utf8_lossy(&out.stdout);
    let value: serde_json::Value =
        serde_json::from_str(line.lines().last().unwrap_or_default()).expect("one JSON line from trl_dpo.py");
    value["pairs_per_second"].as_f64().expect("pairs_per_second")
}

fn main() {
    let work = common::root().join("target/bench-assets");
    std::fs::create_dir_all(&work).expect("target/bench-assets");
    let model = common::model_dir(&work.join("medium"), &MEDIUM);
    let data = common::long_pairs(&work.join("long-pairs.jsonl"), 64);
    let out = tempfile::tempdir().expect("a temporary directory");
    let ours = |flags: &[&str]| dpo_train_rate(&model, &data, out.path(), BATCH, STEPS, flags).pairs_per_second;
    let theirs = |flags: &[&str]| trl_rate(&model, &data, flags);

    println!(
        "DPO training, medium model (hidden 768, 12 layers, 32k vocabulary), {BATCH} pairs x 512 tokens per step, {} threads",
        common::torch_threads()
    );
    println!("{:<44} {:>10} {:>10} {:>9}", "pairs/s", "dpo-train", "TRL", "ours/TRL");
    let row = |label: &str, a: f64, b: f64| println!("{label:<44} {a:>10.3} {b:>10.3} {:>8.2}x", a / b);
    row("f32, reference every step", ours(&[]), theirs(&[]));
    let (our_f32, trl_f32) = (ours(&["--precompute-ref-log-probs"]), theirs(&["--precompute"]));
    row("f32, precomputed reference", our_f32, trl_f32);
    let (our_bf16, trl_bf16) = (ours(&["--precompute-ref-log-probs", "--bf16"]), theirs(&["--precompute", "--bf16"]));
    row("bf16, precomputed reference", our_bf16, trl_bf16);
    row("best of each (f32 or bf16, precomputed)", our_f32.max(our_bf16), trl_f32.max(trl_bf16));
}
