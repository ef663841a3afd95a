//! The host-side proxy of a GPU step's launch overhead (issue 33, item 4): torch operator calls,
//! dtype casts, matrix products and elementwise operators over strided operands of one bf16 DPO
//! step, counted by torch's profiler on the CPU. `make bench`
//! prints them for the 0.5B shape and the medium model; here the fixture llama's cast count is
//! held at its value, so a change that adds casts to the step fails (and one that removes some
//! updates this number). The runs take torch's own bf16 products on every CPU
//! (`DPO_TRAIN_CPU_F32_PRODUCTS=0`): a CPU without bf16 units would multiply on f32 copies,
//! casts no GPU makes (`dpo_torch::product`).

use std::process::Command;

use dpo_torch::profiler::TraceCounts;

use crate::common::fixtures;

/// Tensor casts (`aten::_to_copy` of a tensor with a shape) in step 2 of a bf16 run of 2 pairs a
/// step on the fixture llama (2 layers, policy and reference, AdamW over f32 masters).
/// Deterministic: the same on every run and under `ATEN_CPU_CAPABILITY=avx2`. 102 among 3136
/// operator calls at commit time: the LM head's logit gradients are stored unscaled and each row's
/// factor multiplies the products' narrow side, two mixed-dtype products a group that the CPU
/// stages through an f32 copy each (CUDA's kernel converts in place; 100 among 3120 before, when
/// the scaled `[c, V]` store took CUDA's general elementwise kernel). Each layer's q, k and v
/// weights are cast side by side, and its
/// gate and up weights, in one cast each (112 among 3380 before, one of them a head block's argmax
/// flags made numbers, TRL's `mean_token_accuracy`); 111 among 3403 before that and before the WPO statistic left steps
/// without `use_weighting`, and before parameters of one dimension stopped being reshaped; 112 before the LM head's input gradient started from zeros in
/// the compute dtype (an f32 one was cast); 112 among 3601 before the batch and the reference's
/// rows went up in two uploads; 113 among 3596 before the LM head's backward wrote its logit
/// gradients into their buffer in the compute dtype (the product's store rounds them, where a
/// cast did); 112 among 3656 before it recomputed each block's logits (one projection and its
/// f32 cast more per block); 107 among 3828 before the RMSNorm node, whose CPU backward upcasts the
/// bf16 input it keeps (none on CUDA, where torch's fused kernel reads bf16); 4180 operators
/// before the rotary node.
const CASTS_PER_STEP: u64 = 102;

/// The same without checkpointing: the trained weights stay in bf16 between steps beside their
/// f32 masters, so none is cast as it is used (one multi-tensor copy a step writes them; on the
/// CPU a `copy_` each, not counted as a cast): 68 among 2596 operator calls (66 among 2580 before
/// the LM head's row factors, above; 66 among 2658 operator calls, 2714 before each
/// layer's projections of one input were joined; 2694 at the time), one of them the head block's
/// argmax flags (65 among 2737 before them, the WPO statistic's leaving and the vectors'
/// reshapes' leaving; 66 among 2815 before
/// the head's input gradient started from zeros in the compute dtype, 67 among 2810
/// before the head's buffer took its gradients in the compute dtype, 66 among 2791 before the head
/// recomputed its logits), where casting each weight at its use made 85 among 2847 (the 19 trained
/// matrices and norms).
const CASTS_PER_STEP_RESIDENT: u64 = 68;

/// Matrix products (cuBLAS calls on a GPU) of the same two steps, with and without
/// checkpointing: each layer's q, k and v projections, and its gate and up projections, are one
/// product each way (their weights side by side), where they made 75 and 61 one by one.
const PRODUCTS_PER_STEP: (u64, u64) = (51, 43);

/// Elementwise operators over operands not of one dense layout (a broadcast, a strided view),
/// which CUDA runs by its general kernel, not the vectorised one, in the same two steps: mostly
/// the CPU's RMSNorm backward (CUDA runs torch's fused kernel) and the norms' weight products.
/// 85 and 69 before queries and keys were rotated in one pass over the joined projection and
/// gate and up were laid out by columns (each a strided slice of the joined rows); 45 and 37
/// before the LM head's row factors moved from its `[c, V]` logit gradients (one broadcast product
/// a block) to the products' `[g, h]` sides (two a group).
const STRIDED_PER_STEP: (u64, u64) = (46, 38);

/// A step's host-device copies (on a GPU each blocking one waited for the queued kernels): the
/// batch's integers and floats, and the CPU attention's two index tensors (a GPU's variable-length
/// call uploads three), the reference scoring the policy's upload; read back on a logging step,
/// the scores (one read), the reference's rows, the loss and the gradient norm. 23 uploads and
/// 8 reads before the batch went up in two parts and the reference's rows stayed on the device.
const TRANSFERS_PER_STEP: &str = "4 uploads and 4 reads back a step";

#[test]
fn a_bf16_step_makes_the_casts_it_made() {
    let (counts, _) = profiled_step(&[], "0", "0");
    assert!(counts.operators > 10 * counts.casts, "a step is mostly other operators: {counts:?}");
    assert_eq!(counts.casts, CASTS_PER_STEP, "casts per bf16 step changed ({counts:?}): update CASTS_PER_STEP");
    let (resident, _) = profiled_step(&["--gradient-checkpointing", "false"], "0", "0");
    assert_eq!(
        resident.casts, CASTS_PER_STEP_RESIDENT,
        "casts per bf16 step without checkpointing changed ({resident:?})"
    );
    assert_eq!((counts.products, resident.products), PRODUCTS_PER_STEP, "matrix products per step changed");
    assert_eq!((counts.strided, resident.strided), STRIDED_PER_STEP, "strided elementwise operators per step changed");
    // On f32 copies (a CPU without bf16 units, forced by `DPO_TRAIN_CPU_F32_PRODUCTS=1`) the step
    // runs the same products, each with the casts of its bf16 operands and of its result.
    let (widened, _) = profiled_step(&[], "0", "1");
    assert_eq!(widened.products, counts.products, "{counts:?} {widened:?}");
    assert!(widened.casts >= counts.casts + 2 * counts.products, "{counts:?} {widened:?}");
}

/// With the reference scoring each micro-batch on a thread of its own (on by default on CUDA), a
/// step runs the same operators, the reference's on a second thread that the profiler follows
/// (it enters the caller's torch state), and trains to the same numbers bit for bit.
#[test]
fn a_reference_on_its_own_thread_runs_the_same_step() {
    let (alone, trained_alone) = profiled_step(&[], "0", "0");
    let (beside, trained_beside) = profiled_step(&[], "1", "0");
    assert!(trained_alone.transfers.contains(TRANSFERS_PER_STEP), "{}", trained_alone.transfers);
    assert!(trained_beside.transfers.contains(TRANSFERS_PER_STEP), "{}", trained_beside.transfers);
    assert_eq!((alone.threads, beside.threads), (1, 2), "{alone:?} {beside:?}");
    assert_eq!((alone.operators, alone.casts), (beside.operators, beside.casts));
    assert_eq!(trained_alone.metrics, trained_beside.metrics);
}

/// What a profiled run logged, but its timings, and the line that reports its copies.
struct Trained {
    metrics: Vec<String>,
    transfers: String,
}

/// Step 2 of a 2-step bf16 run of 2 pairs a step on the fixture llama, with `flags`, the
/// reference's thread `overlap` (`DPO_TRAIN_OVERLAP_REFERENCE`) and `f32_products`
/// (`DPO_TRAIN_CPU_F32_PRODUCTS`): the trace's counts, and what `metrics.csv` logged but its
/// timings, and the profiler's line.
fn profiled_step(flags: &[&str], overlap: &str, f32_products: &str) -> (TraceCounts, Trained) {
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
        .args(["--num-samples", "0", "--device", "cpu", "--logging-steps", "1", "--run-name", "run"])
        .args(flags)
        .env("DPO_TRAIN_PROFILE", &trace)
        .env("DPO_TRAIN_PROFILE_STEPS", "2-2")
        .env("DPO_TRAIN_OVERLAP_REFERENCE", overlap)
        .env(dpo_torch::product::WIDEN_VAR, f32_products)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let metrics = std::fs::read_to_string(dir.path().join("run/metrics.csv")).unwrap();
    // The last three columns are pairs/s, tokens/s and the elapsed time.
    let metrics = metrics.lines().map(|l| l.rsplitn(4, ',').last().unwrap_or_default().to_owned()).collect();
    let printed = [out.stdout, out.stderr].map(|o| String::from_utf8_lossy(&o).into_owned()).join("\n");
    let transfers = printed.lines().find(|l| l.contains("host-device copies")).unwrap_or_default().to_owned();
    (TraceCounts::read(&trace).unwrap(), Trained { metrics, transfers })
}
