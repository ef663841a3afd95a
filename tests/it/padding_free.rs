//! `padding_free` end to end: training on packed rows (with and without shared prompts) trains the
//! parameters TRL's padded rows train, alone and over workers under every sharding stage, for full
//! fine-tuning and LoRA, with and without activation checkpointing, and padded to CUDA's few
//! shapes; the run says how many positions it did not compute.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::{bounds, fixtures, max_diff, tensors};

/// A config on the fixture pairs (prompts of 2 to 9 tokens, completions of 1 to 20): global
/// batch 6 whatever the world size, a learning rate large enough that layouts that differed
/// would show it, and Adam's ε at 1e-3 so that a rounding difference cannot flip a step (see
/// `crate::common::bounds`).
fn write_config(dir: &Path, extra: &str) -> PathBuf {
    let path = dir.join("packed.toml");
    let text = format!(
        "model_name_or_path = \"{m}\"\nref_model_name_or_path = \"{r}\"\ntrain_file = \"{d}\"\n\
         output_dir = \"{o}\"\nbf16 = false\ngradient_checkpointing = false\nlearning_rate = 1e-3\n\
         max_grad_norm = 0.5\nadam_epsilon = 1e-3\nper_device_train_batch_size = 1\nglobal_batch_size = 6\nmax_steps = 3\n\
         logging_steps = 1\nsave_steps = 0\nnum_samples = 0\nseed = 5\nddp_timeout = 60\n{extra}",
        m = fixtures().join("models/llama").display(),
        r = fixtures().join("models/llama-ref").display(),
        d = fixtures().join("data/prefs.jsonl").display(),
        o = dir.display(),
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// Trains `run` with `world` CPU workers and `extra` flags; returns what it printed.
fn train(config: &Path, run: &str, world: usize, extra: &[&str]) -> String {
    train_with(config, run, world, extra, false)
}

/// [`train`], with CUDA's padding to few shapes (`dpo_train::dpo::shapes`) where `few_shapes`.
fn train_with(config: &Path, run: &str, world: usize, extra: &[&str], few_shapes: bool) -> String {
    let micro = (6 / world).to_string();
    let devices = format!("cpu:{world}");
    let mut args =
        vec!["train", "--config", config.to_str().unwrap(), "--run-name", run, "--per-device-train-batch-size", &micro];
    if world > 1 {
        args.extend(["--devices", &devices]);
    }
    args.extend(extra);
    let padding = if few_shapes { "1" } else { "0" };
    let out = Command::new(env!("CARGO_BIN_EXE_dpo-train"))
        .args(&args)
        .env(dpo_train::dpo::shapes::PADDING_VAR, padding)
        .output()
        .expect("the binary runs");
    let said = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "dpo-train {args:?} failed:\n{said}");
    said
}

/// Asserts `run` trained `want`'s parameters (the file `file` of `final/`) and logged its step-1
/// log-probs. Packed and padded rows run the same arithmetic in other shapes: after the 3 steps
/// of 6 pairs the parameters are within `bounds::dpo_gradient`'s reach of each other in L2, and
/// the first step's log-probs (same parameters; negative terms, no cancellation) within twice
/// the forward chain's relative error. Later rows differ through the parameters.
fn assert_same_run(dir: &Path, want: &str, run: &str, file: &str) {
    let read = |r: &str| tensors(&dir.join(r).join("final").join(file));
    let (a, b) = (read(want), read(run));
    let rows = |r: &str| dpo_train::train::log::read_metrics(&dir.join(r).join("metrics.csv")).unwrap();
    let (rows_a, rows_b) = (rows(want), rows(run));
    assert_eq!(rows_a.len(), rows_b.len(), "{run}: metric rows");
    let logp = rows_a.iter().filter(|r| r.metric("logps/chosen").is_some()).map(|r| bounds::largest_logp(r, 6));
    let model = fixtures().join("models/llama");
    let seq = bounds::FIXTURE_SEQ;
    let relative = bounds::dpo_gradient(&model, seq, 6 * 2 * seq, 0.1, logp.fold(0.0, f64::max));
    let adam = bounds::Adam::on(1e-3, 1e-3, 0.5, 3, &a);
    let (diff, bound) = (bounds::l2_diff(&a, &b), adam.norm(relative * 0.5));
    eprintln!("{run}: parameters {diff:e} from {want} in L2 (bound {bound:e})");
    assert!(diff <= bound, "{run}: parameters {diff:e} from {want} in L2 (bound {bound:e})");
    let forward = bounds::llama_logits(&model, seq) + bounds::reordered(seq, bounds::U_F32);
    for name in ["logps/chosen", "logps/rejected"] {
        let (x, y) = (rows_a[0].metric(name).unwrap(), rows_b[0].metric(name).unwrap());
        assert!((x - y).abs() <= forward * x.abs(), "{run}: step-1 {name} {y}, {want} {x}");
    }
}

const PADDED: &[&str] = &["--padding-free", "false"];
const UNSHARED: &[&str] = &["--prefix-sharing", "false"];
const CHECKPOINTING: &[&str] = &["--gradient-checkpointing", "true"];

/// Full fine-tuning: packed rows, with shared prompts (the default) and without, alone, under
/// activation checkpointing and over 2 and 3 workers under each sharding stage, train the
/// parameters of TRL's padded rows; the run reports the positions it avoided.
#[test]
fn packed_rows_train_the_parameters_of_padded_rows() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "");
    let padded = train(&config, "padded", 1, PADDED);
    assert!(padded.contains("0.0% avoided (padded rows"), "{padded}");
    let start = tensors(&fixtures().join("models/llama/model.safetensors"));
    let trained = tensors(&dir.path().join("padded/final/model.safetensors"));
    assert!(max_diff(&start, &trained) > 1e-3, "training changed nothing");

    let said = train(&config, "shared", 1, &[]);
    let line = said.lines().find(|l| l.contains("% avoided")).expect("the avoided positions are reported");
    let avoided: f64 = line.split("% avoided").next().unwrap().rsplit(' ').next().unwrap().parse().unwrap();
    assert!(avoided > 20.0 && line.contains("each prompt once"), "{line}");
    let runs: [(&str, usize, &[&str]); 7] = [
        ("unshared", 1, UNSHARED),
        ("checkpointing", 1, CHECKPOINTING),
        ("zero1-3", 3, &["--sharding", "zero1"]),
        ("zero2-2", 2, &["--sharding", "zero2"]),
        ("zero3-2", 2, &["--sharding", "zero3"]),
        ("zero3-checkpointing-3", 3, &["--sharding", "zero3", "--gradient-checkpointing", "true"]),
        ("ddp-unshared-2", 2, UNSHARED),
    ];
    for (run, world, extra) in runs {
        train(&config, run, world, extra);
    }
    // CUDA's padding to few shapes: a span of its own, predictions that are dropped.
    train_with(&config, "shapes", 1, &[], true);
    train_with(
        &config,
        "shapes-zero2-checkpointing-2",
        2,
        &["--sharding", "zero2", "--gradient-checkpointing", "true"],
        true,
    );
    train_with(&config, "shapes-padded", 1, PADDED, true);
    let shapes = ["shapes", "shapes-zero2-checkpointing-2", "shapes-padded"];
    for run in ["shared"].into_iter().chain(runs.map(|r| r.0)).chain(shapes) {
        assert_same_run(dir.path(), "padded", run, "model.safetensors");
    }
}

/// LoRA (no dropout, so prompts are shared): packed rows train the adapters of padded rows, with
/// checkpointing and under ZeRO-3, whose reference is the partitioned base.
#[test]
fn packed_rows_train_the_adapters_of_padded_rows() {
    let dir = tempfile::tempdir().unwrap();
    let lora = "lora_r = 4\nlora_dropout = 0.0\nlora_target_modules = [\"all-linear\"]\n";
    let config = write_config(dir.path(), lora);
    let text: String = std::fs::read_to_string(&config)
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with("ref_model_name_or_path"))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&config, text).unwrap();
    train(&config, "padded", 1, PADDED);
    let runs: [(&str, usize, &[&str]); 3] =
        [("shared", 1, &[]), ("checkpointing", 1, CHECKPOINTING), ("zero3-2", 2, &["--sharding", "zero3"])];
    for (run, world, extra) in runs {
        train(&config, run, world, extra);
        assert_same_run(dir.path(), "padded", run, "adapter_model.safetensors");
    }
    train_with(&config, "shapes", 1, &[], true);
    assert_same_run(dir.path(), "padded", "shapes", "adapter_model.safetensors");
}

/// Under LoRA dropout the prompts are not shared (one mask would serve both rows of a pair): the
/// run packs plainly and says so.
#[test]
fn lora_dropout_packs_without_sharing_prompts() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "lora_r = 4\nlora_dropout = 0.1\ndisable_dropout = false\n");
    let said = train(&config, "dropout", 1, &["--max-steps", "1"]);
    let line = said.lines().find(|l| l.contains("% avoided")).expect("the avoided positions are reported");
    assert!(line.contains("(packed without padding)"), "{line}");
}
