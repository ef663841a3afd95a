//! The embedded demo's learning claims, on a shortened schedule, in f32 and in bf16: held-out
//! reward accuracy rises from the start to at least 0.85, and greedy arithmetic on unseen problems
//! is no worse after DPO than after SFT. (The full demo's numbers are in the README; this keeps CI fast.)

mod common;

use std::sync::atomic::AtomicBool;

use dpo_train::config::TrainConfig;
use dpo_train::report::{Split, read_metrics};

use common::{Quiet, run_alone};

#[test]
fn shortened_demo_learns_the_task() {
    shortened_demo(&[]);
}

/// The same claims in bf16 mixed precision (half-precision weights and activations over f32
/// master weights).
#[test]
fn shortened_demo_learns_the_task_in_bf16() {
    shortened_demo(&[("bf16", "true")]);
}

fn shortened_demo(extra: &[(&str, &str)]) {
    let out = tempfile::tempdir().unwrap();
    let extra: Vec<(String, String)> = extra.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
    let cfg = TrainConfig::from_toml_str(dpo_train::demo::DEMO_CONFIG, "demo")
        .unwrap()
        .with_overrides(&[
            ("output_dir".into(), out.path().display().to_string()),
            ("run_name".into(), "short".into()),
            ("sft_steps".into(), "1200".into()),
            ("max_steps".into(), "200".into()),
            ("eval_steps".into(), "50".into()),
            ("save_steps".into(), "0".into()),
            ("num_samples".into(), "2".into()),
        ])
        .and_then(|cfg| cfg.with_overrides(&extra))
        .unwrap();
    let summary = run_alone(cfg, None, false, &AtomicBool::new(false), &mut Quiet);

    let rows = read_metrics(&summary.run_dir.join("metrics.csv")).unwrap();
    let eval: Vec<f64> =
        rows.iter().filter(|r| r.split == Split::Eval).filter_map(|r| r.metric("rewards/accuracies")).collect();
    assert!(eval.len() >= 5, "evaluations at 0, 50, 100, 150, 200: {eval:?}");
    let (first, last) = (eval[0], eval[eval.len() - 1]);
    assert!(last >= 0.85, "held-out rewards/accuracies reached only {last} ({eval:?})");
    assert!(last > first + 0.25, "held-out rewards/accuracies did not rise: {eval:?}");
    let test = summary.dpo.as_ref().unwrap().test.unwrap();
    assert!(test.rewards_accuracies >= 0.85, "test rewards/accuracies {}", test.rewards_accuracies);
    let ((sft_right, asked), (dpo_right, asked_again)) = summary.demo_arithmetic.unwrap();
    assert_eq!(asked, asked_again);
    assert!(asked >= 100, "the test split asks {asked} arithmetic questions");
    assert!(dpo_right >= sft_right, "arithmetic got worse with DPO: {sft_right} -> {dpo_right} of {asked}");
    for file in [
        "dashboard.png",
        "samples_val.txt",
        "samples_test.txt",
        "final/model.safetensors",
        "sft/final/model.safetensors",
    ] {
        assert!(summary.run_dir.join(file).exists(), "{file} missing");
    }
}
