//! `make bench` (precision): bf16's own round-off over a training trajectory, measured on the
//! CPU: the medium model's 20 steps of the GPU check's parity section (2 pairs a step at
//! max_length 512, learning rate 1e-5), in f32 and in bf16, each step's loss and chosen log-prob
//! side by side, and the largest differences. Written to `results/cpu/bf16-drift-<cpu>.json`,
//! which bounds the GPU check's bf16 run against the CPU's f32 one (twice the drift: CUDA's
//! kernels round in their own order, an error of the same size on top).
//!
//! `cargo bench --bench precision -- bound` trains nothing: it prints the bound the GPU check
//! reads from the committed files.
//!
//! A CPU without bf16 units multiplies bf16 operands on f32 copies and rounds the result, as
//! cuBLAS accumulates a bf16 product in f32 (`dpo_torch::product`). About 4 minutes in f32 and 7
//! in bf16 on a 2-core AVX2 VM.

mod common;

use common::precision::{DRIFT_STEM, Drift, STEPS, cpu_bf16_drift, inputs, step_line, trajectory};
use common::{cpu_results, root};

fn main() {
    if std::env::args().any(|a| a == "bound") {
        return print_bound();
    }
    let work = root().join("target/bench-assets");
    std::fs::create_dir_all(&work).expect("target/bench-assets");
    let out = root().join("target/bench-precision");
    std::fs::create_dir_all(&out).expect("the bench folder");
    // The GPU check's parity inputs, made the same way in the same place.
    let (model, data) = inputs(&work);
    let f32 = trajectory(&model, &data, &out, "cpu", &[]);
    let bf16 = trajectory(&model, &data, &out, "cpu", &["--bf16"]);
    println!("medium model, {STEPS} steps on the CPU: step, loss f32 / bf16, logps/chosen f32 / bf16");
    for (step, (a, b)) in f32.iter().zip(&bf16).enumerate() {
        println!("{}", step_line(step + 1, *a, *b));
    }
    let drift = Drift::between(&bf16, &f32);
    assert!(drift.loss.is_finite() && drift.logp.is_finite(), "{} and {} steps", f32.len(), bf16.len());
    println!(
        "bf16 against f32: largest loss difference {:.2e}, largest relative log-prob difference {:.2e}",
        drift.loss, drift.logp
    );
    let row = serde_json::json!({
        "cpu": common::cpu_model(),
        "torch_threads": common::torch_threads(),
        "steps": STEPS,
        "loss_drift": drift.loss,
        "logp_drift": drift.logp,
        "f32": f32,
        "bf16": bf16,
        "source": "cargo bench --bench precision",
    });
    let json = cpu_results(DRIFT_STEM);
    let tmp = json.with_extension("json.tmp");
    let text = serde_json::to_string_pretty(&row).expect("a JSON row") + "\n";
    std::fs::write(&tmp, text).and_then(|()| std::fs::rename(&tmp, &json)).expect("the drift is written");
    println!("written to {}", json.display());
    print_bound();
}

/// The GPU check's bf16 bound, as its parity section reads it.
fn print_bound() {
    let (drift, files) = cpu_bf16_drift().unwrap_or_else(|e| panic!("{e}"));
    let files: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
    let bound = drift.doubled();
    println!(
        "the GPU check's bf16 bound (twice the largest committed drift, {}): loss {:.1e}, log-prob {:.1e} relative",
        files.join(", "),
        bound.loss,
        bound.logp
    );
}
