//! The host-side proxy of a GPU step's launch overhead (issue 33, item 4): torch operator calls
//! and dtype casts of one bf16 DPO step, counted by torch's profiler on the CPU. `make bench`
//! prints them for the 0.5B shape and the medium model; here the fixture llama's cast count is
//! held at its value, so a change that adds casts to the step fails (and one that removes some
//! updates this number).

use std::process::Command;

use dpo_torch::profiler::TraceCounts;

use crate::common::fixtures;

/// Tensor casts (`aten::_to_copy` of a tensor with a shape) in step 2 of a bf16 run of 2 pairs a
/// step on the fixture llama (2 layers, policy and reference, AdamW over f32 masters).
/// Deterministic: the same on every run and under `ATEN_CPU_CAPABILITY=avx2`. 112 among 3601
/// operator calls at commit time; 113 among 3596 before the LM head's backward wrote its logit
/// gradients into their buffer in the compute dtype (the product's store rounds them, where a
/// cast did); 112 among 3656 before it recomputed each block's logits (one projection and its
/// f32 cast more per block); 107 among 3828 before the RMSNorm node, whose CPU backward upcasts the
/// bf16 input it keeps (none on CUDA, where torch's fused kernel reads bf16); 4180 operators
/// before the rotary node.
const CASTS_PER_STEP: u64 = 112;

/// The same without checkpointing: the trained weights stay in bf16 between steps beside their
/// f32 masters, so none is cast as it is used (one multi-tensor copy a step writes them; on the
/// CPU a `copy_` each, not counted as a cast): 66 among 2815 operator calls (67 among 2810
/// before the head's buffer took its gradients in the compute dtype, 66 among 2791 before the head
/// recomputed its logits), where casting each weight at its use made 85 among 2847 (the 19 trained
/// matrices and norms).
const CASTS_PER_STEP_RESIDENT: u64 = 66;

#[test]
fn a_bf16_step_makes_the_casts_it_made() {
    let counts = profiled_step(&[]);
    assert!(counts.operators > 10 * counts.casts, "a step is mostly other operators: {counts:?}");
    assert_eq!(counts.casts, CASTS_PER_STEP, "casts per bf16 step changed ({counts:?}): update CASTS_PER_STEP");
    let resident = profiled_step(&["--gradient-checkpointing", "false"]);
    assert_eq!(
        resident.casts, CASTS_PER_STEP_RESIDENT,
        "casts per bf16 step without checkpointing changed ({resident:?})"
    );
}

/// Step 2 of a 2-step bf16 run of 2 pairs a step on the fixture llama, with `flags`.
fn profiled_step(flags: &[&str]) -> TraceCounts {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace.json");
    let out = Command::new(env!("CARGO_BIN_EXE_dpo-train"))
        .args(["train", "--model"])
        .arg(fixtures().join("models/llama"))
        .arg("--data")
        .arg(fixtures().join("data/prefs.jsonl"))
        .arg("--output-dir")
        .arg(dir.path())
        .args(["--max-steps", "2", "--per-device-train-batch-size", "2", "--bf16", "true", "--save-steps", "0"])
        .args(["--num-samples", "0", "--device", "cpu"])
        .args(flags)
        .env("DPO_TRAIN_PROFILE", &trace)
        .env("DPO_TRAIN_PROFILE_STEPS", "2-2")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    TraceCounts::read(&trace).unwrap()
}
