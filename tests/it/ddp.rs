//! Data parallelism end to end, with CPU processes over Gloo: 2 and 3 workers train what one
//! process trains on the same micro-batches (bit for bit where they add the same partial
//! gradients in the same order, within the bounds of `crate::common::bounds` where a collective adds
//! them in another), a run resumes with another world size, and a lost worker ends the job with
//! a message naming it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use crate::common::bounds::{self, Adam, U_BF16, U_F32};
use crate::common::{fixtures, max_diff, tensors};

/// The runs' AdamW settings. ε is 1e-3, not TRL's 1e-8, so that a rounding difference cannot
/// flip a step (see `crate::common::bounds`).
const LR: f64 = 1e-3;
const ADAM_EPSILON: f64 = 1e-3;
const WEIGHT_DECAY: f64 = 0.01;
const MAX_GRAD_NORM: f64 = 0.5;

/// A config on the fixture pair: global batch 6 whatever the world size.
fn write_config(dir: &Path, max_steps: u64) -> PathBuf {
    let path = dir.join("ddp.toml");
    let text = format!(
        "model_name_or_path = \"{m}\"\nref_model_name_or_path = \"{r}\"\ntrain_file = \"{d}\"\neval_file = \"{d}\"\n\
         output_dir = \"{o}\"\nbf16 = false\ngradient_checkpointing = false\nlearning_rate = {LR}\n\
         weight_decay = {WEIGHT_DECAY}\nmax_grad_norm = {MAX_GRAD_NORM}\nadam_epsilon = {ADAM_EPSILON}\n\
         per_device_train_batch_size = 1\nglobal_batch_size = 6\nmax_steps = {max_steps}\nlogging_steps = 1\n\
         eval_steps = 2\nsave_steps = 0\nnum_samples = 1\nmax_new_tokens = 4\nseed = 11\nddp_timeout = 60\n",
        m = fixtures().join("models/llama").display(),
        r = fixtures().join("models/llama-ref").display(),
        d = fixtures().join("data/prefs.jsonl").display(),
        o = dir.display(),
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// Runs dpo-train with one torch thread in every process, a plain one and each worker alike: a
/// product's blocking, and with it the order of its sums, follows the thread count on some of
/// torch's CPU kernels (avx2's), and bit-for-bit comparisons need the same partial gradients.
fn dpo_train(args: &[&str]) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_dpo-train"))
        .args(args)
        .env("OMP_NUM_THREADS", "1")
        .output()
        .expect("the binary runs");
    assert!(out.status.success(), "dpo-train {args:?} failed:\n{}", String::from_utf8_lossy(&out.stderr));
    out
}

/// Trains `run` with `world` CPU workers (1: a plain process) and `micro` pairs per device.
fn train(config: &Path, run: &str, world: usize, micro: usize) {
    train_with(config, run, world, micro, &[]);
}

/// [`train`] with more flags.
fn train_with(config: &Path, run: &str, world: usize, micro: usize, extra: &[&str]) {
    let micro = micro.to_string();
    let devices = format!("cpu:{world}");
    let mut args =
        vec!["train", "--config", config.to_str().unwrap(), "--run-name", run, "--per-device-train-batch-size", &micro];
    if world > 1 {
        args.extend(["--devices", &devices]);
    }
    args.extend(extra);
    dpo_train(&args);
}

fn resume(dir: &Path, world: usize, max_steps: u64) {
    resume_with(dir, world, max_steps, &[]);
}

fn resume_with(dir: &Path, world: usize, max_steps: u64, extra: &[&str]) {
    let steps = max_steps.to_string();
    let devices = format!("cpu:{world}");
    let mut args = vec!["train", "--resume", dir.to_str().unwrap(), "--max-steps", &steps];
    if world > 1 {
        args.extend(["--devices", &devices]);
    }
    args.extend(extra);
    dpo_train(&args);
}

/// `one-{micro}`: one process of `config` on micro-batches of `micro` pairs (trained once), the
/// run that ranks of micro-batch `micro` are compared with: the sampler gives rank r the
/// one-process micro-batches r, r + W, ..., so both compute the same micro-batch gradients.
fn one_process(config: &Path, micro: usize) -> String {
    let run = format!("one-{micro}");
    if !config.with_file_name(&run).exists() {
        train(config, &run, 1, micro);
    }
    run
}

fn weights(run_dir: &Path) -> Vec<(String, Vec<f32>)> {
    tensors(&run_dir.join("final/model.safetensors"))
}

/// The fixture model's layers.
fn layers() -> usize {
    let text = std::fs::read_to_string(fixtures().join("models/llama/config.json")).unwrap();
    serde_json::from_str::<serde_json::Value>(&text).unwrap()["num_hidden_layers"].as_u64().unwrap() as usize
}

/// How far a clipped gradient entry of `world` ranks can be from one process's on the same
/// micro-batches: the ranks' partial gradients and each layer's two parts (the tied embedding's
/// input and head contributions, a recomputed layer's residual and branch) added in another
/// order, 2·world + 2·layers terms of at most the clipped norm each.
fn reordered_gradient(world: usize) -> f64 {
    bounds::reordered(2 * world + 2 * layers(), U_F32) * MAX_GRAD_NORM
}

/// The runs' AdamW for `steps` steps, on parameters like `params`.
fn adam(steps: u32, params: &[(String, Vec<f32>)]) -> Adam {
    Adam::on(LR, ADAM_EPSILON, MAX_GRAD_NORM, steps, params)
}

/// What a comparison with one process expects.
#[derive(Clone, Copy, Debug)]
enum Expect {
    /// Bit for bit: the same partial gradients added in the same order (two ranks add the two
    /// micro-batch gradients one process adds, and a + b = b + a), or a resumed run repeating the
    /// arithmetic of a straight one.
    Bits,
    /// Added over `world` ranks in another order (gloo's ring starts each chunk's sum at another
    /// rank; ZeRO sums slices, and the clipping norm's squares, apart).
    Reordered { world: usize },
}

/// Asserts `got` holds `want`'s parameters as `expect` says after `steps` optimizer steps.
fn assert_params(what: &str, want: &[(String, Vec<f32>)], got: &[(String, Vec<f32>)], steps: u32, expect: Expect) {
    let diff = f64::from(max_diff(want, got));
    let bound = match expect {
        Expect::Bits => 0.0,
        Expect::Reordered { world } => adam(steps, want).entry(reordered_gradient(world)),
    };
    eprintln!("{what}: parameters differ by {diff:e} ({expect:?}: bound {bound:e})");
    assert!(diff <= bound, "{what}: parameters differ by {diff:e} ({expect:?}: bound {bound:e})");
}

/// The step-`step` training rows' metrics (TRL's names), in name order.
fn train_row(run_dir: &Path, step: u64) -> Vec<f64> {
    let rows = dpo_train::train::log::read_metrics(&run_dir.join("metrics.csv")).unwrap();
    let row = rows.iter().find(|r| r.step == step && r.split == dpo_train::train::log::Split::Train);
    let row = row.unwrap_or_else(|| panic!("{}: no training row of step {step}", run_dir.display()));
    dpo_train::train::log::METRIC_NAMES.iter().map(|n| row.metric(n).unwrap_or(0.0)).collect()
}

/// Asserts the training rows of `steps` logged by `run` and `want` agree. Their per-pair values
/// are the same bits (same parameters, same micro-batches); only the f64 means over the step's
/// at most 6 pairs are added in another order (`bounds::reordered_means`; a pair's value is at
/// most 1e3 in size: log-probs of at most 20 tokens over 384 classes, and β = 0.1 times them).
fn assert_train_rows(dir: &Path, want: &str, run: &str, steps: &[u64]) {
    for &step in steps {
        let (a, b) = (train_row(&dir.join(want), step), train_row(&dir.join(run), step));
        for ((x, y), name) in a.iter().zip(&b).zip(dpo_train::train::log::METRIC_NAMES) {
            let bound = bounds::reordered_means(6, 1e3);
            assert!((x - y).abs() <= bound, "{run} step {step} {name}: {y} vs {want}'s {x} (bound {bound:e})");
        }
    }
}

/// Two ranks add the two micro-batch gradients one process adds: the same parameters bit for bit,
/// and the same logged metrics. Three ranks add three in another order.
#[test]
fn two_and_three_workers_equal_one_process() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), 4);
    let start = tensors(&fixtures().join("models/llama/model.safetensors"));
    for (run, world, expect) in [("two", 2, Expect::Bits), ("three", 3, Expect::Reordered { world: 3 })] {
        let micro = 6 / world;
        let one = one_process(&config, micro);
        train(&config, run, world, micro);
        let reference = weights(&dir.path().join(&one));
        assert!(max_diff(&reference, &start) > 1e-3, "training changed nothing");
        assert_params(run, &reference, &weights(&dir.path().join(run)), 4, expect);
        // After step 1 three ranks train other bits: their later rows are checked through the
        // parameters.
        let steps: &[u64] = if matches!(expect, Expect::Bits) { &[1, 2, 3, 4] } else { &[1] };
        assert_train_rows(dir.path(), &one, run, steps);
    }
}

/// Appends config lines to a copy of `config` named `name`.
fn variant(config: &Path, name: &str, extra: &str) -> PathBuf {
    let path = config.with_file_name(format!("{name}.toml"));
    std::fs::write(&path, std::fs::read_to_string(config).unwrap() + extra).unwrap();
    path
}

/// Asserts a sharded run's checkpoint holds slices of the moments only.
fn assert_sharded_checkpoint(dir: &Path, run: &str, world: usize) {
    let ckpt = dir.join(run).join("checkpoints/step-4");
    assert!(ckpt.join(format!("optimizer.shard-{}-of-{world}.safetensors", world - 1)).is_file(), "{run}");
    assert!(!ckpt.join("optimizer.safetensors").exists(), "{run}: no rank writes the whole state");
}

/// ZeRO-1 and ZeRO-2 on 2 and 3 workers train the parameters of one process: the slices' AdamW
/// updates and the reduce-scattered gradients are the same sums. ZeRO-1 on two ranks all-reduces
/// as plain data parallelism does (bit for bit); ZeRO-2 sums the clipping norm's squares by slice.
#[test]
fn zero1_and_zero2_train_the_parameters_of_one_process() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), 4);
    for stage in ["zero1", "zero2"] {
        let staged = variant(&config, stage, &format!("sharding = \"{stage}\"\n"));
        for world in [2, 3] {
            let run = format!("{stage}-{world}");
            let one = one_process(&config, 6 / world);
            train(&staged, &run, world, 6 / world);
            let expect = if stage == "zero1" && world == 2 { Expect::Bits } else { Expect::Reordered { world } };
            assert_params(&run, &weights(&dir.path().join(one)), &weights(&dir.path().join(&run)), 4, expect);
            assert_sharded_checkpoint(dir.path(), &run, world);
        }
    }
}

/// ZeRO-3 on 2 and 3 workers (each part's parameters gathered for its forward and again for its
/// recomputed backward, its gradients reduce-scattered right after) trains the parameters of one
/// process, with activation checkpointing or without; so does ZeRO-2 under checkpointing, whose
/// gradients also leave each layer reduce-scattered. Checkpoints hold slices of the moments only.
#[test]
fn zero3_and_layerwise_zero2_train_the_parameters_of_one_process() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), 4);
    let zero3 = variant(&config, "zero3", "sharding = \"zero3\"\n");
    let zero2 = variant(&config, "zero2", "sharding = \"zero2\"\n");
    let checkpointing: &[&str] = &["--gradient-checkpointing", "true"];
    // Micro-batch 1 on 2 workers: accumulation 3, and the epoch's short last step (5 of 17
    // pairs) gives rank 1 two micro-batches to rank 0's three, so rank 1 runs an idle pass.
    let runs: [(&str, &Path, usize, usize, &[&str]); 5] = [
        ("zero3-2", &zero3, 2, 3, &[]),
        ("zero3-3", &zero3, 3, 2, &[]),
        ("zero3-micro1-2", &zero3, 2, 1, &[]),
        ("zero3-ckpt-2", &zero3, 2, 3, checkpointing),
        ("zero2-ckpt-3", &zero2, 3, 2, checkpointing),
    ];
    for (run, staged, world, micro, extra) in runs {
        let one = one_process(&config, micro);
        train_with(staged, run, world, micro, extra);
        let (want, got) = (weights(&dir.path().join(&one)), weights(&dir.path().join(run)));
        assert_params(run, &want, &got, 4, Expect::Reordered { world });
        assert_sharded_checkpoint(dir.path(), run, world);
        let rows = |r: &str| dpo_train::train::log::read_metrics(&dir.path().join(r).join("metrics.csv")).unwrap();
        assert_eq!(rows(&one).len(), rows(run).len(), "{run}");
    }
}

/// ZeRO-3 through a whole run: a supervised warm-up stage (SFT's token-mean loss), then DPO
/// against precomputed reference log-probs, equals one process.
#[test]
fn zero3_with_an_sft_stage_and_a_precomputed_reference_equals_one_process() {
    let dir = tempfile::tempdir().unwrap();
    let config = variant(&write_config(dir.path(), 2), "sft", "sft_steps = 2\nprecompute_ref_log_probs = true\n");
    train(&config, "one", 1, 3);
    train_with(&config, "zero3", 2, 3, &["--sharding", "zero3"]);
    let (want, got) = (weights(&dir.path().join("one")), weights(&dir.path().join("zero3")));
    // 2 SFT steps, then 2 DPO steps (the bound of 4 steps covers both stages' Adam).
    assert_params("zero3", &want, &got, 4, Expect::Reordered { world: 2 });
}

/// `offload_optimizer`: AdamW's update runs on the host (here the same CPU) and trains the same
/// parameters, alone (bit for bit: the same update, elsewhere) and under ZeRO-3, and an
/// offloaded checkpoint resumes.
#[test]
fn an_offloaded_optimizer_trains_the_parameters_of_one_process() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), 2);
    for micro in [6, 3] {
        let one = one_process(&config, micro);
        resume(&dir.path().join(one), 1, 4);
    }
    let offload: &[&str] = &["--offload-optimizer"];
    train_with(&config, "offload", 1, 6, offload);
    resume_with(&dir.path().join("offload"), 1, 4, offload);
    train_with(&config, "zero3-offload", 2, 3, &["--offload-optimizer", "--sharding", "zero3"]);
    resume_with(&dir.path().join("zero3-offload"), 2, 4, &[]);
    for (run, one, expect) in
        [("offload", "one-6", Expect::Bits), ("zero3-offload", "one-3", Expect::Reordered { world: 2 })]
    {
        assert_params(run, &weights(&dir.path().join(one)), &weights(&dir.path().join(run)), 4, expect);
    }
}

/// The step-1 gradient norms two runs logged, as the relative difference of their clipping
/// factors max_grad_norm / ‖g‖.
fn clip_difference(dir: &Path, a: &str, b: &str) -> f64 {
    let norm = |run: &str| {
        let rows = dpo_train::train::log::read_metrics(&dir.join(run).join("metrics.csv")).unwrap();
        rows.iter().find(|r| r.step == 1 && r.grad_norm.is_some()).and_then(|r| r.grad_norm).unwrap()
    };
    let (x, y) = (norm(a), norm(b));
    (x - y).abs() / x.min(y)
}

/// After one step, the parameters of `run` against `want`'s when the two differ in one bf16 sum
/// of the tied embedding's gradient: its entries can take any other step (Adam's largest
/// difference, `Adam::any_gradients`); every other entry has the same gradient but for the
/// clipping factor (the logged norms' difference) and, over `world` ranks, the order of its sums.
fn assert_bf16_embedding_apart(dir: &Path, want: &str, run: &str, world: usize) {
    let (a, b) = (weights(&dir.join(want)), weights(&dir.join(run)));
    let adam = adam(1, &a);
    let dg = if world > 1 { reordered_gradient(world) } else { 0.0 };
    let others = adam.entry_with_clip(dg, clip_difference(dir, want, run));
    for ((param, x), (_, y)) in a.iter().zip(&b) {
        let bound = if param == "model.embed_tokens.weight" { adam.any_gradients(WEIGHT_DECAY) } else { others };
        let diff = x.iter().zip(y).map(|(p, q)| f64::from((p - q).abs())).fold(0.0, f64::max);
        eprintln!("{run}: {param} differs from {want} by {diff:e} (bound {bound:e})");
        assert!(diff <= bound, "{run}: {param} differs from {want} by {diff:e} (bound {bound:e})");
    }
}

/// Offloaded under bf16 mixed precision, the fp32 masters live on the host and the device keeps
/// bf16 parameters, which compute what plain bf16 training computes from its casts of the
/// masters. One difference is inherent (as in DeepSpeed's offload): the embedding lookup's
/// backward sums the rows of repeated tokens in bf16 where plain training sums them in f32.
/// Checked after one step, alone and over 2 workers (ZeRO-2 and ZeRO-3 against plain DDP on the
/// same micro-batches); and a resumed run continues from the masters (not their bf16 copies),
/// which are what `final/` holds.
#[test]
fn a_bf16_run_with_host_masters_trains_the_parameters_of_plain_bf16() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), 1);
    let bf16: &[&str] = &["--bf16", "true"];
    let offload: &[&str] = &["--bf16", "true", "--offload-optimizer"];
    let runs: [(&str, usize, &[&str]); 5] = [
        ("plain", 1, bf16),
        ("offload", 1, offload),
        ("ddp", 2, bf16),
        ("zero2-offload", 2, &["--bf16", "true", "--offload-optimizer", "--sharding", "zero2"]),
        ("zero3-offload", 2, &["--bf16", "true", "--offload-optimizer", "--sharding", "zero3"]),
    ];
    for (run, world, flags) in runs {
        train_with(&config, run, world, 6 / world, flags);
    }
    for (run, against, world) in [("offload", "plain", 1), ("zero2-offload", "ddp", 2), ("zero3-offload", "ddp", 2)] {
        assert_bf16_embedding_apart(dir.path(), against, run, world);
    }
    // Two steps straight, and one step resumed for a second: the same arithmetic, bit for bit,
    // when the checkpoint held the masters.
    train_with(&config, "straight", 1, 6, &[offload, &["--max-steps", "2"]].concat());
    resume_with(&dir.path().join("offload"), 1, 2, offload);
    let (straight, resumed) = (weights(&dir.path().join("straight")), weights(&dir.path().join("offload")));
    assert_params("resumed", &straight, &resumed, 2, Expect::Bits);
    let values = || straight.iter().flat_map(|(_, v)| v.iter());
    let off_grid = values().filter(|v| v.to_bits() & 0xffff != 0).count();
    assert!(off_grid * 2 > values().count(), "final/ holds bf16 values, not the fp32 masters");
}

/// bf16 training: ZeRO-3 trains what plain data parallelism trains on the same workers and
/// micro-batches (checkpointing on both sides: zero3 always recomputes, and a bf16 recomputation
/// need not round as the one-graph backward does). With bf16 gradient buckets, layer-wise zero2
/// and zero3 compress each part's gradients apart, so the tied embedding's two contributions (as
/// input and as LM head) are rounded before their sum: after one step every other parameter
/// equals plain DDP's with the hook but for the clipping factor. The hook is checked under every
/// stage on 3 workers as well as on 2: zero1 all-reduces as plain DDP does (bit for bit), zero2
/// and zero3 reduce-scatter, whose bf16 sums of three terms round in another order.
#[test]
fn sharded_bf16_training_equals_plain_data_parallelism() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), 1);
    let bf16: &[&str] = &["--bf16", "true", "--gradient-checkpointing", "true"];
    let hook: &[&str] = &["--bf16", "true", "--ddp-comm-hook", "bf16", "--gradient-checkpointing", "true"];
    let runs: [(&str, &[&str], &str, usize); 6] = [
        ("bf16", bf16, "zero3", 2),
        ("hook", hook, "zero2", 2),
        ("hook", hook, "zero3", 2),
        ("hook", hook, "zero1", 3),
        ("hook", hook, "zero2", 3),
        ("hook", hook, "zero3", 3),
    ];
    for (name, flags, stage, world) in runs {
        let plain = format!("{name}-plain-{world}");
        let sharded = format!("{name}-{stage}-{world}");
        if !dir.path().join(&plain).exists() {
            train_with(&config, &plain, world, 6 / world, flags);
        }
        train_with(&config, &sharded, world, 6 / world, &[flags, &["--sharding", stage]].concat());
        let (a, b) = (weights(&dir.path().join(&plain)), weights(&dir.path().join(&sharded)));
        let unhooked = weights(&dir.path().join("bf16-plain-2"));
        assert!(name == "bf16" || world != 2 || max_diff(&a, &unhooked) > 0.0, "the hook did nothing");
        match (name, stage, world) {
            // f32 buckets: the ranks' f32 partial gradients summed by part.
            ("bf16", ..) => assert_params(&sharded, &a, &b, 1, Expect::Reordered { world }),
            (_, "zero1", _) => assert_params(&sharded, &a, &b, 1, Expect::Bits),
            (_, _, 2) => assert_bf16_embedding_apart(dir.path(), &plain, &sharded, 2),
            // Three bf16 partial gradients, each at most the clipped norm, summed in another
            // order: at most reordered(3) · 3 · max_grad_norm apart in L2.
            _ => {
                let adam = adam(1, &a);
                let bound = adam.norm(bounds::reordered(world, U_BF16) * world as f64 * MAX_GRAD_NORM);
                let diff = bounds::l2_diff(&a, &b);
                eprintln!("{sharded}: {diff:e} from {plain} in L2 (bound {bound:e})");
                assert!(diff <= bound, "{sharded}: {diff:e} from {plain} in L2 (bound {bound:e})");
                let any = adam.any_gradients(WEIGHT_DECAY);
                assert!(f64::from(max_diff(&a, &b)) <= any, "{sharded}: an entry moved further than Adam can");
            }
        }
    }
}

/// A ZeRO-3 checkpoint of 3 workers resumes on 2 workers (ZeRO-3 again) to the parameters of one
/// process on the same micro-batches (2 pairs for 2 steps, then 3).
#[test]
fn zero3_checkpoint_resumes_on_two_workers() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), 2);
    train(&config, "single", 1, 2);
    resume_with(&dir.path().join("single"), 1, 4, &["--per-device-train-batch-size", "3"]);
    let zero3 = variant(&config, "zero3", "sharding = \"zero3\"\n");
    train(&zero3, "three-then-two", 3, 2);
    resume_with(&dir.path().join("three-then-two"), 2, 4, &["--per-device-train-batch-size", "3"]);
    let (want, got) = (weights(&dir.path().join("single")), weights(&dir.path().join("three-then-two")));
    assert_params("three-then-two", &want, &got, 4, Expect::Reordered { world: 3 });
}

/// A ZeRO-2 checkpoint of 3 workers resumes on 2 workers without sharding, and a plain one
/// resumes under ZeRO-2: the parameters of one process on the same micro-batches all along.
#[test]
fn zero_checkpoints_resume_with_another_world_size_and_stage() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), 2);
    let micro3: &[&str] = &["--per-device-train-batch-size", "3"];
    for (single, micro) in [("single-2-3", 2), ("single-6-3", 6)] {
        train(&config, single, 1, micro);
        resume_with(&dir.path().join(single), 1, 4, micro3);
    }
    let zero2 = variant(&config, "zero2", "sharding = \"zero2\"\n");
    train(&zero2, "zero-then-plain", 3, 2);
    resume_with(&dir.path().join("zero-then-plain"), 2, 4, &[&["--sharding", "none"], micro3].concat());
    train(&config, "plain-then-zero", 1, 6);
    resume_with(&dir.path().join("plain-then-zero"), 2, 4, &[&["--sharding", "zero2"], micro3].concat());
    for (run, single, world) in [("zero-then-plain", "single-2-3", 3), ("plain-then-zero", "single-6-3", 2)] {
        let (want, got) = (weights(&dir.path().join(single)), weights(&dir.path().join(run)));
        assert_params(run, &want, &got, 4, Expect::Reordered { world });
    }
}

/// `ddp_comm_hook = "bf16"`: two workers exchange gradients in bf16 and still train the
/// parameters of one process, to bf16's round-off of the gradients.
#[test]
fn bf16_gradient_compression_trains_the_same_parameters_to_bf16_round_off() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), 4);
    train(&config, "one", 1, 3);
    let text = std::fs::read_to_string(&config).unwrap() + "ddp_comm_hook = \"bf16\"\n";
    std::fs::write(&config, text).unwrap();
    train(&config, "bf16", 2, 3);
    // Step 1 starts from the same parameters: each rank's partial gradient is rounded to bf16
    // (u relative) and the two are summed in bf16 (γ_1 of their magnitudes); with each partial
    // at most the whole gradient's norm, the norms are at most (u + γ_1) · 2 · ‖g‖ apart.
    let norm = |run: &str| {
        let rows = dpo_train::train::log::read_metrics(&dir.path().join(run).join("metrics.csv")).unwrap();
        rows.iter().find(|r| r.step == 1 && r.grad_norm.is_some()).and_then(|r| r.grad_norm).unwrap()
    };
    let (exact, rounded) = (norm("one"), norm("bf16"));
    assert!(exact != rounded, "bf16 buckets changed nothing: is the hook applied?");
    let rounding = U_BF16 + bounds::gamma(1, U_BF16);
    assert!((exact - rounded).abs() <= rounding * 2.0 * exact, "step-1 gradient norm {rounded} vs {exact}");
    // After 4 AdamW steps: each step's clipped gradients are at most that far apart in L2.
    let (one, bf16) = (weights(&dir.path().join("one")), weights(&dir.path().join("bf16")));
    let adam = adam(4, &one);
    let (diff, bound) = (bounds::l2_diff(&one, &bf16), adam.norm(rounding * 2.0 * MAX_GRAD_NORM));
    eprintln!("step-1 norm {rounded} vs {exact}; parameters {diff:e} apart in L2 (bound {bound:e})");
    assert!(diff <= bound, "the parameters are {diff:e} apart in L2 (bound {bound:e})");
    assert!(
        f64::from(max_diff(&one, &bf16)) <= adam.any_gradients(WEIGHT_DECAY),
        "an entry moved further than Adam can"
    );
}

/// The launcher tokenises the data into the cache before it starts the workers, so no worker
/// tokenises (or waits at a collective while another does): each reads the cached pairs.
#[test]
fn workers_read_the_data_the_launcher_tokenised() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), 1);
    let out = dpo_train(&["train", "--config", config.to_str().unwrap(), "--run-name", "r", "--devices", "cpu:2"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let data = fixtures().join("data/prefs.jsonl");
    let cached = format!(
        "`{}`: tokenised pairs read from the cache `{}",
        data.display(),
        dir.path().join(".data_cache").display()
    );
    // Rank 0 prints for both splits (train and eval are the same file here).
    assert_eq!(stderr.matches(&cached).count(), 2, "{stderr}");
    let entries = std::fs::read_dir(dir.path().join(".data_cache")).unwrap().count();
    assert_eq!(entries, 1, "one entry: same file, split and settings");
}

/// The adapters of a LoRA run.
fn adapter(dir: &Path, run: &str) -> Vec<(String, Vec<f32>)> {
    tensors(&dir.join(run).join("final/adapter_model.safetensors"))
}

/// LoRA over two and three workers trains the adapters of one process on the same
/// micro-batches: only they are all-reduced, and the reference is each worker's own base with
/// the adapters off.
#[test]
fn lora_on_two_workers_equals_one_process() {
    let dir = tempfile::tempdir().unwrap();
    let config = lora_config(dir.path(), 3);
    let zero1 = variant(&config, "lora-zero1", "sharding = \"zero1\"\n");
    let zero2 = variant(&config, "lora-zero2", "sharding = \"zero2\"\n");
    // ZeRO-3 partitions the frozen base too (the reference shares the policy's slices of it).
    let zero3 = variant(&config, "lora-zero3", "sharding = \"zero3\"\n");
    let runs: [(&str, &Path, usize, Expect); 4] = [
        ("two", &config, 2, Expect::Bits),
        ("three-zero1", &zero1, 3, Expect::Reordered { world: 3 }),
        ("two-zero2", &zero2, 2, Expect::Reordered { world: 2 }),
        ("three-zero3", &zero3, 3, Expect::Reordered { world: 3 }),
    ];
    for (run, staged, world, expect) in runs {
        let one = one_process(&config, 6 / world);
        train(staged, run, world, 6 / world);
        assert_params(run, &adapter(dir.path(), &one), &adapter(dir.path(), run), 3, expect);
    }
    let trained = adapter(dir.path(), "one-3");
    assert!(trained.iter().any(|(n, v)| n.contains("lora_B") && v.iter().any(|x| *x != 0.0)), "B trained");
}

/// The fixture config with LoRA r=4 on every linear layer, no dropout, and the policy's base as
/// the reference.
fn lora_config(dir: &Path, max_steps: u64) -> PathBuf {
    let full = std::fs::read_to_string(write_config(dir, max_steps)).unwrap();
    let text: String =
        full.lines().filter(|l| !l.starts_with("ref_model_name_or_path")).map(|l| format!("{l}\n")).collect();
    let config = dir.join("lora.toml");
    std::fs::write(&config, text + "lora_r = 4\nlora_dropout = 0.0\nlora_target_modules = [\"all-linear\"]\n").unwrap();
    config
}

/// LoRA in bf16 with activation checkpointing on 3 workers: under ZeRO-3 (the frozen bf16 base
/// partitioned, gathered part by part for the forward, the recompute and the reference) and
/// ZeRO-1 the adapters equal plain data parallelism's with the same flags, to the order of the
/// three ranks' sums (ZeRO-1 clips by the slices' squares).
#[test]
fn sharded_bf16_lora_with_checkpointing_equals_plain_data_parallelism() {
    let dir = tempfile::tempdir().unwrap();
    let config = lora_config(dir.path(), 2);
    let flags: &[&str] = &["--bf16", "true", "--gradient-checkpointing", "true"];
    train_with(&config, "plain", 3, 2, flags);
    let plain = adapter(dir.path(), "plain");
    assert!(plain.iter().any(|(n, v)| n.contains("lora_B") && v.iter().any(|x| *x != 0.0)), "B trained");
    for stage in ["zero1", "zero3"] {
        train_with(&config, stage, 3, 2, &[flags, &["--sharding", stage]].concat());
        assert_params(stage, &plain, &adapter(dir.path(), stage), 2, Expect::Reordered { world: 3 });
    }
}

/// Two workers, then one; one, then two: the micro-batches of one process all along, so the
/// same parameters bit for bit.
#[test]
fn resume_with_another_world_size() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), 2);
    train(&config, "single", 1, 3);
    resume(&dir.path().join("single"), 1, 4);
    train(&config, "two-then-one", 2, 3);
    resume(&dir.path().join("two-then-one"), 1, 4);
    train(&config, "one-then-two", 1, 3);
    resume(&dir.path().join("one-then-two"), 2, 4);
    let reference = weights(&dir.path().join("single"));
    for run in ["two-then-one", "one-then-two"] {
        assert_params(run, &reference, &weights(&dir.path().join(run)), 4, Expect::Bits);
    }
}

#[test]
fn a_killed_worker_ends_the_job_naming_its_rank() {
    killed_worker_ends_the_job(&[]);
}

/// Under ZeRO-3, rank 1 killed while it is inside a parameter gather (stopped, its flight record
/// read, and killed only when the record shows it entered a gather it has not left) ends the job
/// as any other, and the launcher's line for it says where it was.
#[test]
fn a_worker_killed_inside_a_zero3_gather_ends_the_job_naming_its_rank() {
    let stderr = killed_worker_ends_the_job(&["--sharding", "zero3"]);
    let rank1 = stderr.lines().find(|l| l.starts_with("rank 1: ")).unwrap_or_default();
    assert!(rank1.contains("parameter gather"), "{stderr}");
}

/// Stops rank `pid` until its flight record shows it inside a ZeRO-3 parameter gather (then
/// leaves it stopped); false when 2000 tries never caught one.
fn stop_inside_a_gather(pid: &str) -> bool {
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
    let var = format!("{}=", dpo_train::dist::flight::DIR_VAR);
    let Some(dir) = environ.split(|&b| b == 0).find_map(|v| v.strip_prefix(var.as_bytes())) else { return false };
    let dir = PathBuf::from(String::from_utf8_lossy(dir).into_owned());
    for _ in 0..2000 {
        Command::new("kill").args(["-STOP", pid]).status().unwrap();
        let record = dpo_train::dist::flight::Record::read(&dir, 1);
        let inside = record
            .is_some_and(|r| r.phase == "parameter gather" && r.state == dpo_train::dist::flight::State::Entering);
        if inside {
            return true;
        }
        Command::new("kill").args(["-CONT", pid]).status().unwrap();
        std::thread::sleep(Duration::from_millis(3));
    }
    false
}

/// Kills rank 1 of a 2-worker run once it trains (under ZeRO-3, inside a parameter gather); the
/// launcher must end the job within 30 s, naming it. Returns the launcher's stderr.
fn killed_worker_ends_the_job(extra: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), 100_000);
    let launcher = Command::new(env!("CARGO_BIN_EXE_dpo-train"))
        .args(["train", "--config", config.to_str().unwrap(), "--run-name", "killed", "--devices", "cpu:2"])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait (up to 60 s) for the workers to train, then kill rank 1.
    let pid = launcher.id().to_string();
    let workers = (0..300)
        .find_map(|_| {
            let out = Command::new("pgrep").args(["-P", &pid]).output().unwrap();
            let pids: Vec<String> =
                String::from_utf8_lossy(&out.stdout).split_whitespace().map(str::to_owned).collect();
            let training = dir.path().join("killed/metrics.csv").exists();
            std::thread::sleep(Duration::from_millis(200));
            (pids.len() == 2 && training).then_some(pids)
        })
        .expect("the workers did not start within 60 s");
    // The second worker spawned is rank 1. The launcher must then end the job within 30 s.
    let rank1 = worker_pid(launcher.id(), 1).unwrap_or_else(|| workers[1].clone());
    if extra.contains(&"zero3") {
        assert!(stop_inside_a_gather(&rank1), "rank 1 was never caught inside a parameter gather");
    }
    Command::new("kill").args(["-9", &rank1]).status().unwrap();
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || done.send(launcher.wait_with_output()));
    let Ok(out) = finished.recv_timeout(Duration::from_secs(30)) else {
        let _ = Command::new("kill").args(["-9", &pid]).status();
        panic!("the launcher did not end the job within 30 s of losing rank 1");
    };
    let out = out.unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last = stderr.lines().last().unwrap_or_default();
    assert!(last.starts_with("error: ") && last.contains("Rank"), "{last}");
    assert!(stderr.lines().any(|l| l.starts_with("rank 1: exited (killed by signal 9)")), "{stderr}");
    stderr.into_owned()
}

/// The pid of the launcher's worker whose `RANK` is `rank`.
fn worker_pid(launcher: u32, rank: usize) -> Option<String> {
    let out = Command::new("pgrep").args(["-P", &launcher.to_string()]).output().ok()?;
    String::from_utf8_lossy(&out.stdout).split_whitespace().map(str::to_owned).find(|pid| {
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        environ.split(|&b| b == 0).any(|var| var == format!("RANK={rank}").as_bytes())
    })
}

#[test]
fn a_frozen_worker_ends_the_job_within_the_timeout_saying_where_each_rank_was() {
    const TIMEOUT: u64 = 8;
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), 100_000);
    let timeout = TIMEOUT.to_string();
    let launcher = Command::new(env!("CARGO_BIN_EXE_dpo-train"))
        .args(["train", "--config", config.to_str().unwrap(), "--run-name", "frozen", "--devices", "cpu:2"])
        .args(["--ddp-timeout", &timeout, "--eval-steps", "0", "--logging-steps", "1000"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = launcher.id();
    // Wait (up to 60 s) until both workers train, then freeze rank 1.
    let frozen = (0..300)
        .find_map(|_| {
            std::thread::sleep(Duration::from_millis(200));
            let training = dir.path().join("frozen/metrics.csv").exists();
            worker_pid(pid, 0).and(worker_pid(pid, 1)).filter(|_| training)
        })
        .expect("the workers did not start training within 60 s");
    std::thread::sleep(Duration::from_secs(1));
    Command::new("kill").args(["-STOP", &frozen]).status().unwrap();
    let stopped_at = std::time::Instant::now();
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || done.send(launcher.wait_with_output()));
    let Ok(out) = finished.recv_timeout(Duration::from_secs(TIMEOUT + 20)) else {
        let _ = Command::new("kill").args(["-9", &pid.to_string(), &frozen]).status();
        panic!("the launcher did not end the job within {} s of rank 1 freezing", TIMEOUT + 20);
    };
    let took = stopped_at.elapsed();
    let out = out.unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    // c10d's timeout or the launcher's watchdog: whichever comes first, at the timeout.
    assert!(took < Duration::from_secs(TIMEOUT + 5), "took {took:?}:\n{stderr}");
    assert!(took >= Duration::from_secs(TIMEOUT - 1), "ended before the timeout ({took:?}):\n{stderr}");
    let line = |rank: usize| {
        let prefix = format!("rank {rank}: ");
        stderr.lines().find(|l| l.starts_with(&prefix)).unwrap_or_else(|| panic!("no line for rank {rank}:\n{stderr}"))
    };
    assert!(line(1).starts_with("rank 1: stopped, last seen "), "{stderr}");
    assert!(line(1).contains(" of step "), "{stderr}");
    // Rank 0 waits for the frozen one in a collective of the step rank 1 is at, or gave up there.
    let rank0 = line(0);
    assert!(rank0.contains(" of step ") && (rank0.contains("waiting in ") || rank0.contains("gave up")), "{stderr}");
    let last = stderr.lines().last().unwrap_or_default();
    assert!(last.starts_with("error: "), "{stderr}");
    // Nothing is left behind: the frozen worker was killed too.
    std::thread::sleep(Duration::from_millis(500));
    assert!(!Path::new(&format!("/proc/{frozen}")).exists(), "rank 1 ({frozen}) is still there");
}

/// More GPUs than the machine has is one line and exit 1, also for a count no list could hold
/// (it was an allocation of 8 TB and an abort).
#[test]
fn too_few_gpus_is_a_clear_error() {
    for n in ["64", "1000000000000"] {
        let out =
            Command::new(env!("CARGO_BIN_EXE_dpo-train")).args(["--gpus", n, "--max-steps", "1"]).output().unwrap();
        assert_eq!(out.status.code(), Some(1));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(&format!("`--gpus {n}`")) && stderr.contains(&format!("--devices cpu:{n}")),
            "{stderr}"
        );
    }
}

#[test]
fn generate_over_two_workers_keeps_order_and_samples() {
    let dir = tempfile::tempdir().unwrap();
    let prompts = dir.path().join("prompts.txt");
    std::fs::write(&prompts, "one two\nthree four five\nsix\nseven eight\nnine\n").unwrap();
    let model = fixtures().join("models/llama");
    let run = |extra: &[&str]| {
        let mut args = vec!["generate", "--model", model.to_str().unwrap(), "--prompts", prompts.to_str().unwrap()];
        args.extend(["--max-new-tokens", "6", "--num-samples", "2", "--seed", "3", "--json"]);
        args.extend_from_slice(extra);
        String::from_utf8(dpo_train(&args).stdout).unwrap()
    };
    let single = run(&[]);
    assert_eq!(single.lines().count(), 5);
    assert_eq!(run(&["--devices", "cpu:2"]), single);
}

/// `eval` over workers: each scores its shard and rank 0 prints the whole set's metrics, as one
/// process at the same global batch (TRL's per-device batch times the devices) up to the f32
/// rounding of another batch layout: 17 pairs, 6 a batch, on 1, 2 (3 each) and 3 (2 each).
#[test]
fn eval_over_workers_equals_one_process() {
    let model = fixtures().join("models/llama");
    let data = fixtures().join("data/prefs.jsonl");
    let run = |extra: &[&str]| -> serde_json::Map<String, serde_json::Value> {
        let mut args = vec!["eval", "--model", model.to_str().unwrap(), "--data", data.to_str().unwrap(), "--json"];
        args.extend(["--loss-type", "sigmoid,sft", "--beta", "0.3"]);
        args.extend_from_slice(extra);
        let out = dpo_train(&args);
        assert!(out.status.success(), "{extra:?}: {}", String::from_utf8_lossy(&out.stderr));
        let stdout = String::from_utf8(out.stdout).unwrap();
        assert_eq!(stdout.lines().count(), 1, "{extra:?}: one object, from rank 0 alone: {stdout}");
        serde_json::from_str(&stdout).unwrap()
    };
    let one = run(&["--batch-size", "6"]);
    assert!(one["logps/chosen"].as_f64().unwrap() < -1.0, "{one:?}");
    for extra in [["--devices", "cpu:2", "--batch-size", "3"], ["--devices", "cpu:3", "--batch-size", "2"]] {
        let many = run(&extra);
        assert_eq!(many.keys().collect::<Vec<_>>(), one.keys().collect::<Vec<_>>());
        for (name, want) in &one {
            let (want, got) = (want.as_f64().unwrap(), many[name].as_f64().unwrap());
            assert!((want - got).abs() <= 1e-5 * want.abs().max(1.0), "{extra:?} {name}: {got} against {want}");
        }
    }
}

/// The reference-free family over ranks: ORPO (whose rows also score the chosen prompts for its
/// NLL) on 2 workers equals one process bit for bit, as DPO does; SimPO under ZeRO-3 on 2
/// workers trains its parameters within the reordered sums' bound.
#[test]
fn reference_free_losses_on_two_workers_equal_one_process() {
    let dir = tempfile::tempdir().unwrap();
    for (loss, stage, expect) in [("orpo", "none", Expect::Bits), ("simpo", "zero3", Expect::Reordered { world: 2 })] {
        let sub = dir.path().join(loss);
        std::fs::create_dir_all(&sub).unwrap();
        let config = write_config(&sub, 4);
        // These losses take no reference model.
        let text = std::fs::read_to_string(&config).unwrap();
        let kept: String =
            text.lines().filter(|l| !l.starts_with("ref_model_name_or_path")).map(|l| format!("{l}\n")).collect();
        std::fs::write(&config, format!("{kept}loss_type = \"{loss}\"\n")).unwrap();
        let staged = variant(&config, stage, &format!("sharding = \"{stage}\"\n"));
        let one = one_process(&config, 3);
        let run = format!("{loss}-{stage}-2");
        train(&staged, &run, 2, 3);
        let (want, got) = (weights(&sub.join(&one)), weights(&sub.join(&run)));
        let start = tensors(&fixtures().join("models/llama/model.safetensors"));
        assert!(max_diff(&want, &start) > 1e-3, "{loss}: training changed nothing");
        assert_params(&run, &want, &got, 4, expect);
    }
}

/// KTO over ranks: each micro-batch's KL estimate comes from its own rows, so 2 workers, each
/// running the single-device micro-batches it is given, equal one process bit for bit without
/// sharding, and within the reordered sums' bound under ZeRO-3 (its pairs unpaired from the
/// preference fixture, its reference model kept).
#[test]
fn kto_on_two_workers_equals_one_process() {
    let dir = tempfile::tempdir().unwrap();
    for (stage, expect) in [("none", Expect::Bits), ("zero3", Expect::Reordered { world: 2 })] {
        let sub = dir.path().join(stage);
        std::fs::create_dir_all(&sub).unwrap();
        let config = write_config(&sub, 4);
        let config = variant(&config, "kto", "loss_type = \"kto\"\nunpair = true\n");
        let staged = variant(&config, stage, &format!("sharding = \"{stage}\"\n"));
        let one = one_process(&config, 3);
        let run = format!("kto-{stage}-2");
        train(&staged, &run, 2, 3);
        let (want, got) = (weights(&sub.join(&one)), weights(&sub.join(&run)));
        let start = tensors(&fixtures().join("models/llama/model.safetensors"));
        assert!(max_diff(&want, &start) > 1e-3, "kto: training changed nothing");
        assert_params(&run, &want, &got, 4, expect);
        // Both runs logged KTOTrainer's metrics: a `kl` beside the loss, no accuracy.
        let csv = std::fs::read_to_string(sub.join(&run).join("metrics.csv")).unwrap();
        let header: Vec<&str> = csv.lines().next().unwrap().split(',').collect();
        let accuracy = header.iter().position(|c| *c == "rewards/accuracies").unwrap();
        assert!(csv.lines().skip(1).all(|l| l.split(',').nth(accuracy) == Some("")), "{csv}");
    }
}
