//! `make bench` (ops): torch operator calls, tensor casts, matrix products and elementwise
//! operators over strided operands (CUDA's unvectorised kernel) per DPO training step in bf16, counted by torch's profiler on the CPU (`DPO_TRAIN_PROFILE`, one step after the
//! first), for the Qwen2.5-0.5B shape and the medium model: the host-side proxy of a GPU step's
//! launch overhead, cuBLAS calls and cast traffic that any change can be measured by without a
//! GPU. The counts are deterministic for a given build and batch; `tests/it/op_counts.rs` holds
//! the tiny fixture's.
//!
//! Each model trains 2 steps of 2 pairs at max_length 512, policy and reference both, AdamW's
//! update included. The counts depend on the layers and the batch layout, and on whether a batch
//! has more token positions than the model's width: a layer's projections of one input are joined
//! into one product from there on (`model::linear`), as they are on a GPU's batches of thousands of
//! positions (at max_length 256, 2 pairs made fewer than the 0.5B shape's 896 inputs). A CPU
//! without bf16 units would multiply on f32 copies (`dpo_torch::product`), casts no GPU makes:
//! the runs here take torch's own products (`DPO_TRAIN_CPU_F32_PRODUCTS=0`), a GPU's operators.

mod common;

use std::path::Path;

use common::{MEDIUM, QWEN05B, Shape, dpo_train_rate_env, long_pairs, model_dir, model_dir_of, root};
use dpo_torch::profiler::TraceCounts;

const PAIRS: usize = 2;
const MAX_LENGTH: usize = 512;

fn main() {
    let out = root().join("target/bench-ops");
    std::fs::create_dir_all(&out).expect("the bench folder");
    let data = long_pairs(&out.join("pairs.jsonl"), 8);
    println!(
        "torch operator calls, tensor casts, matrix products and elementwise operators over strided operands per bf16 DPO step ({PAIRS} pairs, max_length {MAX_LENGTH}, CPU profiler)"
    );
    println!("{:<34} {:>10} {:>8} {:>9} {:>8}", "model", "operators", "casts", "products", "strided");
    let models: [(&str, &Shape, &str); 2] =
        [("Qwen2.5-0.5B shape (494M)", &QWEN05B, "qwen2"), ("medium (hidden 768, 12 layers)", &MEDIUM, "llama")];
    for (name, shape, family) in models {
        let dir = out.join(format!("model-{family}-{}", shape.layers));
        let model = if family == "llama" { model_dir(&dir, shape) } else { model_dir_of(&dir, shape, family) };
        let counts = profiled_step(&model, &data, &out);
        println!(
            "{name:<34} {:>10} {:>8} {:>9} {:>8}",
            counts.operators, counts.casts, counts.products, counts.strided
        );
    }
}

/// The counts of step 2 of a 2-step bf16 run.
fn profiled_step(model: &Path, data: &Path, out: &Path) -> TraceCounts {
    let trace = out.join("trace.json");
    let _ = std::fs::remove_file(&trace);
    let (steps, products) = (Path::new("2-2"), Path::new("0"));
    let envs = [
        ("DPO_TRAIN_PROFILE", trace.as_path()),
        ("DPO_TRAIN_PROFILE_STEPS", steps),
        (dpo_torch::product::WIDEN_VAR, products),
    ];
    dpo_train_rate_env(model, data, out, (PAIRS, 2, MAX_LENGTH), &["--bf16", "true"], &envs);
    // The run's checkpoint and final model are gone already (`common::drop_weights`).
    TraceCounts::read(&trace).expect("the profiled step's trace")
}
