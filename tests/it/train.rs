//! The training loop on the tiny fixture models: resume equivalence, accumulation equivalence, and
//! the embedded demo's learning claims on a shortened run.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use dpo_train::config::{Steps, TrainConfig};
use dpo_train::run::RunSummary;
use dpo_train::train::Progress;
use dpo_train::train::log::{METRIC_NAMES, read_metrics};

use crate::common::{bounds, fixtures, max_diff, run_alone, tensors, try_run_alone};

/// Shows nothing; raises the interrupt flag once `stop_at` steps are done.
struct StopAt<'a> {
    stop_at: Option<u64>,
    interrupt: &'a AtomicBool,
}

impl Progress for StopAt<'_> {
    fn start(&mut self, _stage: &str, _start: u64, _total: u64) {}
    fn step(&mut self, step: u64, _status: &str) {
        if Some(step) == self.stop_at {
            self.interrupt.store(true, Ordering::SeqCst);
        }
    }
    fn line(&mut self, _text: &str) {}
}

/// A DPO config on the fixture llama pair and preference set.
fn fixture_config(output: &Path, name: &str) -> TrainConfig {
    let text = format!(
        r#"
        model_name_or_path = "{model}"
        ref_model_name_or_path = "{reference}"
        train_file = "{data}"
        eval_file = "{data}"
        output_dir = "{output}"
        run_name = "{name}"
        bf16 = false
        gradient_checkpointing = false
        learning_rate = 1e-3
        lr_scheduler_type = "linear"
        warmup_steps = 2
        weight_decay = 0.01
        max_grad_norm = 0.5
        per_device_train_batch_size = 4
        max_steps = 10
        logging_steps = 1
        eval_steps = 5
        save_steps = 3
        num_samples = 2
        max_new_tokens = 4
        seed = 7
        "#,
        model = fixtures().join("models/llama").display(),
        reference = fixtures().join("models/llama-ref").display(),
        data = fixtures().join("data/prefs.jsonl").display(),
        output = output.display(),
    );
    TrainConfig::from_toml_str(&text, "test").unwrap()
}

fn train(cfg: TrainConfig, resume: Option<PathBuf>, stop_at: Option<u64>) -> RunSummary {
    let interrupt = AtomicBool::new(false);
    run_alone(cfg, resume, false, &interrupt, &mut StopAt { stop_at, interrupt: &interrupt })
}

#[test]
fn five_steps_plus_resume_equals_ten_straight() {
    resume_equals_straight(|_| {}, "final/model.safetensors");
}

/// A LoRA run (the reference: the policy's own base) with adapter dropout resumes exactly too:
/// the checkpoint holds the adapter and its moments, and the dropout masks follow the step.
#[test]
fn a_lora_run_resumes_exactly() {
    let lora = |cfg: &mut TrainConfig| {
        cfg.lora_r = Some(4);
        cfg.lora_dropout = 0.1;
        cfg.disable_dropout = false;
        cfg.ref_model_name_or_path = None;
        cfg.learning_rate = 1e-2;
    };
    resume_equals_straight(lora, "final/adapter_model.safetensors");
}

/// Five steps, an interruption and a resume give the parameters and metrics of ten straight.
fn resume_equals_straight(tweak: impl Fn(&mut TrainConfig), weights: &str) {
    let out = tempfile::tempdir().unwrap();
    let config = |name: &str| {
        let mut cfg = fixture_config(out.path(), name);
        tweak(&mut cfg);
        cfg
    };
    let straight = train(config("straight"), None, None);
    let first = train(config("split"), None, Some(5));
    assert!(first.interrupted());
    assert_eq!(first.dpo.as_ref().unwrap().steps, 5);
    // A resume asked for fewer steps than the checkpoint holds has nothing to train.
    let short = TrainConfig { max_steps: 4, ..config("split") };
    let interrupt = AtomicBool::new(false);
    let progress = &mut StopAt { stop_at: None, interrupt: &interrupt };
    let err = try_run_alone(short, Some(first.run_dir.clone()), false, &interrupt, progress).unwrap_err();
    assert!(format!("{err:#}").contains("is at step 5, past the 4 steps this stage trains"), "{err:#}");
    let resumed = train(config("split"), Some(first.run_dir.clone()), None);
    assert!(!resumed.interrupted());

    // The resumed run repeats the straight run's arithmetic (the checkpoint holds the exact
    // parameters, moments and step): bit for bit.
    let diff = max_diff(&tensors(&straight.run_dir.join(weights)), &tensors(&resumed.run_dir.join(weights)));
    assert_eq!(diff, 0.0, "parameters differ by {diff}");
    let rows_a = read_metrics(&straight.run_dir.join("metrics.csv")).unwrap();
    let rows_b = read_metrics(&resumed.run_dir.join("metrics.csv")).unwrap();
    assert_eq!(rows_a.len(), rows_b.len());
    for (a, b) in rows_a.iter().zip(&rows_b) {
        assert_eq!((a.step, a.split), (b.step, b.split));
        for name in METRIC_NAMES {
            let (x, y) = (a.metric(name), b.metric(name));
            assert_eq!(x.map(f64::to_bits), y.map(f64::to_bits), "step {} {name}: {x:?} vs {y:?}", a.step);
        }
        assert_eq!(a.learning_rate, b.learning_rate);
    }
}

/// The L2 bound on two fixture runs' parameters after `steps` steps of `pairs` pairs, whose
/// gradients are computed in other shapes (`bounds::dpo_gradient`, at the run's logged
/// log-probs), with the fixture config's AdamW.
fn gradient_bound(run_dir: &Path, params: &[(String, Vec<f32>)], pairs: usize, steps: u32) -> f64 {
    let rows = read_metrics(&run_dir.join("metrics.csv")).unwrap();
    let logp = rows.iter().filter(|r| r.metric("logps/chosen").is_some()).map(|r| bounds::largest_logp(r, pairs));
    let logp = logp.fold(0.0, f64::max);
    let tokens = pairs * 2 * bounds::FIXTURE_SEQ;
    let relative = bounds::dpo_gradient(&fixtures().join("models/llama"), bounds::FIXTURE_SEQ, tokens, 0.1, logp);
    bounds::Adam::on(1e-3, 1e-3, 0.5, steps, params).norm(relative * 0.5)
}

#[test]
fn accumulation_equals_one_large_batch() {
    let out = tempfile::tempdir().unwrap();
    let mut one = fixture_config(out.path(), "batch8");
    one.per_device_train_batch_size = 8;
    one.max_steps = 1;
    one.warmup_steps = 0.0;
    one.eval_file = None;
    // AdamW's first step moves a parameter by lr * g / (|g| + eps): with TRL's eps of 1e-8 a
    // gradient of 1e-9 moves it by nearly lr whatever its rounding, so the summation-order
    // differences between one batch of 8 and two of 4 (other matrix-product blocking) would show
    // as lr-sized differences. A larger eps keeps the step proportional to the gradient.
    one.adam_epsilon = 1e-3;
    let mut two = one.clone();
    two.run_name = Some("batch4x2".into());
    two.per_device_train_batch_size = 4;
    two.gradient_accumulation_steps = 2;
    let a = train(one, None, None);
    let b = train(two, None, None);
    let (x, y) =
        (tensors(&a.run_dir.join("final/model.safetensors")), tensors(&b.run_dir.join("final/model.safetensors")));
    // Other batch shapes, the same arithmetic: the step's gradients are at most
    // `bounds::dpo_gradient` times the clipped norm apart in L2, and Adam's step follows.
    let bound = gradient_bound(&a.run_dir, &x, 8, 1);
    let diff = bounds::l2_diff(&x, &y);
    eprintln!("parameters {diff:e} apart in L2 (bound {bound:e})");
    assert!(diff <= bound, "parameters {diff:e} apart in L2 (bound {bound:e})");
    let start = tensors(&fixtures().join("models/llama/model.safetensors"));
    assert!(max_diff(&start, &tensors(&a.run_dir.join("final/model.safetensors"))) > 1e-4, "the step changed nothing");
}

#[test]
fn a_checkpoint_killed_mid_write_leaves_the_previous_one_usable() {
    let out = tempfile::tempdir().unwrap();
    let mut cfg = fixture_config(out.path(), "killed");
    cfg.max_steps = 6;
    cfg.eval_file = None;
    let first = train(cfg.clone(), None, None);
    let checkpoints = first.run_dir.join("checkpoints");
    // A kill while step 9 was being written leaves only its staging directory behind.
    std::fs::create_dir_all(checkpoints.join(".step-9.partial")).unwrap();
    std::fs::write(checkpoints.join(".step-9.partial/model.safetensors"), b"half a file").unwrap();
    let latest = dpo_train::train::checkpoint::latest(&first.run_dir).unwrap();
    assert_eq!(latest, checkpoints.join("step-6"));
    cfg.max_steps = 8;
    let resumed = train(cfg, Some(first.run_dir.clone()), None);
    assert_eq!(resumed.dpo.unwrap().steps, 8);
}

#[test]
fn sft_lowers_the_nll_of_the_chosen_answers() {
    let out = tempfile::tempdir().unwrap();
    let mut cfg = fixture_config(out.path(), "sft");
    cfg.eval_file = None;
    cfg.max_steps = 8;
    cfg.learning_rate = 1e-3;
    cfg.warmup_steps = 0.0;
    // Every step sees the whole (17-pair) set, so the logged losses are comparable.
    cfg.per_device_train_batch_size = 32;
    let interrupt = AtomicBool::new(false);
    let summary = run_alone(cfg, None, true, &interrupt, &mut StopAt { stop_at: None, interrupt: &interrupt });
    assert_eq!(summary.sft.as_ref().unwrap().steps, 8);
    let rows = read_metrics(&summary.run_dir.join("metrics.csv")).unwrap();
    let losses: Vec<f64> = rows.iter().filter_map(|r| r.metric("loss")).collect();
    assert_eq!(losses.len(), 8);
    assert!(losses[7] < losses[0] * 0.9, "NLL did not fall: {losses:?}");
    // SFT rows carry the loss only; the DPO metrics stay empty.
    assert!(rows.iter().all(|r| r.metric("rewards/accuracies").is_none()));
    assert!(summary.run_dir.join("final/model.safetensors").is_file());
    // Its plots are SFT's: no reward panels that could only say "no rewards logged".
    for file in dpo_train::report::SFT_PLOT_FILES {
        assert!(summary.run_dir.join(file).is_file(), "{file}");
    }
    assert!(!summary.run_dir.join("rewards.png").exists());
}

#[test]
fn plot_overlays_two_runs() {
    let out = tempfile::tempdir().unwrap();
    let mut runs = Vec::new();
    for (name, lr) in [("lr-a", 1e-3), ("lr-b", 3e-3)] {
        let mut cfg = fixture_config(out.path(), name);
        cfg.max_steps = 4;
        cfg.learning_rate = lr;
        runs.push(train(cfg, None, None).run_dir);
    }
    let compare = out.path().join("compare");
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_dpo-train"))
        .args(["plot", runs[0].to_str().unwrap(), runs[1].to_str().unwrap(), "--out", compare.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(status.status.success(), "{}", String::from_utf8_lossy(&status.stderr));
    for file in dpo_train::report::PLOT_FILES {
        let bytes = std::fs::read(compare.join(file)).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "{file}");
    }
}

#[test]
fn precomputed_reference_equals_the_live_reference_and_is_cached() {
    let out = tempfile::tempdir().unwrap();
    let mut live = fixture_config(out.path(), "live");
    live.max_steps = 4;
    live.adam_epsilon = 1e-3; // a rounding difference cannot flip a step (see `bounds`)
    let mut pre = live.clone();
    pre.run_name = Some("precomputed".into());
    pre.precompute_ref_log_probs = true;
    let a = train(live, None, None);
    let b = train(pre.clone(), None, None);
    let (x, y) =
        (tensors(&a.run_dir.join("final/model.safetensors")), tensors(&b.run_dir.join("final/model.safetensors")));
    // The reference's log-probs are scored in other batches: `bounds::dpo_gradient` covers them.
    let bound = gradient_bound(&a.run_dir, &x, 4, 4);
    let diff = bounds::l2_diff(&x, &y);
    eprintln!("parameters {diff:e} apart in L2 (bound {bound:e})");
    assert!(diff <= bound, "parameters {diff:e} apart in L2 (bound {bound:e})");
    let cache: Vec<_> = std::fs::read_dir(out.path().join(".ref_cache")).unwrap().collect();
    assert_eq!(cache.len(), 1, "one cache file for one (reference, data, max_length, tokenizer)");
    // A second run with the same inputs reads the cache; another max_length makes a new entry.
    pre.run_name = Some("precomputed-again".into());
    train(pre.clone(), None, None);
    assert_eq!(std::fs::read_dir(out.path().join(".ref_cache")).unwrap().count(), 1);
    pre.run_name = Some("shorter".into());
    pre.max_length = 48;
    train(pre, None, None);
    assert_eq!(std::fs::read_dir(out.path().join(".ref_cache")).unwrap().count(), 2);
}

/// WPO's weights reach the training loss: with `use_weighting` the first step's loss is the
/// weighted one (the head computes `log Σ_v p_v²` for it), not the plain loss that weights of 1
/// (the statistic left out) would give.
#[test]
fn use_weighting_weights_the_training_loss() {
    let first_loss = |weighting: bool| {
        let out = tempfile::tempdir().unwrap();
        let mut cfg = fixture_config(out.path(), if weighting { "wpo" } else { "plain" });
        (cfg.eval_file, cfg.max_steps, cfg.save_steps, cfg.num_samples) = (None, 1, Steps::Every(0), 0);
        cfg.loss.use_weighting = weighting;
        let summary = train(cfg, None, None);
        let rows = read_metrics(&summary.run_dir.join("metrics.csv")).unwrap();
        rows.iter().find_map(|r| r.metric("loss")).unwrap()
    };
    let (plain, weighted) = (first_loss(false), first_loss(true));
    assert!((plain - weighted).abs() > 1e-6 * plain.abs(), "plain {plain}, weighted {weighted}");
}

/// A logged row is the mean of its steps' metrics, as TRL's `log` averages what each step's
/// `compute_loss` appended: logging every second step gives the mean of the two rows that
/// logging every step gives (the steps themselves are the same; `num_tokens` is a running count).
#[test]
fn a_logged_row_is_the_mean_of_its_steps() {
    let rows = |logging_steps: u64| {
        let out = tempfile::tempdir().unwrap();
        let mut cfg = fixture_config(out.path(), &format!("every-{logging_steps}"));
        (cfg.eval_file, cfg.max_steps, cfg.save_steps, cfg.num_samples) = (None, 4, Steps::Every(0), 0);
        cfg.logging_steps = Steps::Every(logging_steps);
        let summary = train(cfg, None, None);
        read_metrics(&summary.run_dir.join("metrics.csv")).unwrap()
    };
    let (every, second) = (rows(1), rows(2));
    assert_eq!((every.len(), second.len()), (4, 2));
    for (pair, row) in every.chunks(2).zip(&second) {
        for name in METRIC_NAMES.iter().filter(|n| **n != "num_tokens") {
            let (Some(a), Some(b)) = (pair[0].metric(name), pair[1].metric(name)) else {
                // The loss families' own columns, empty under DPO's sigmoid.
                assert_eq!((pair[0].metric(name), row.metric(name)), (None, None), "{name}");
                continue;
            };
            let got = row.metric(name).unwrap();
            // Two f64 means of the same f64 values: a rounding or two apart.
            assert!(
                (got - (a + b) / 2.0).abs() <= 1e-12 * got.abs().max(1.0),
                "step {} {name}: {got} vs {a}, {b}",
                row.step
            );
        }
        assert_eq!(row.metric("num_tokens"), pair[1].metric("num_tokens"));
    }
}
