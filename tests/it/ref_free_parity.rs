//! The reference-free family (`loss_type` cpo, simpo, alphapo, orpo) against TRL 1.16's
//! `CPOTrainer` / `ORPOTrainer`: the tokenised rows of their `tokenize_row`, and every metric of
//! `dpo-train eval` against the trainers' `evaluate()` on the llama, qwen2 and qwen3 fixtures, in
//! each batch layout. The numbers come from `tests/gen/make_ref_free_fixtures.py`.
//!
//! `logits/*` are left out: TRL's CPO and ORPO average the logits over every position of the
//! padded batch (prompt and padding included), which depends on how the batch was padded;
//! dpo-train reports them over the scored positions, as its DPO does.

use std::collections::BTreeMap;
use std::path::PathBuf;

use burn::tensor::Device;
use dpo_train::config::{LossConfig, TrainConfig};
use dpo_train::data::{Columns, LoadOptions, Packing, Tokenizer, prepare};
use dpo_train::eval::{EvalOptions, evaluate};
use serde::Deserialize;

use crate::common::bounds;

#[derive(Deserialize)]
struct Fixture {
    cases: Vec<Case>,
    tokenized: BTreeMap<String, Vec<Row>>,
}

#[derive(Deserialize)]
struct Case {
    name: String,
    dataset: String,
    model: String,
    /// dpo-train's keys for the case.
    config: BTreeMap<String, serde_json::Value>,
    num_rows: usize,
    metrics: BTreeMap<String, f64>,
}

#[derive(Deserialize)]
struct Row {
    chosen_prompt: Vec<u32>,
    chosen: Vec<u32>,
    rejected_prompt: Vec<u32>,
    rejected: Vec<u32>,
}

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn fixture() -> Fixture {
    let text = std::fs::read_to_string(fixtures().join("expected/trl_ref_free.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// The case's keys applied as `train` and `eval` apply flags.
fn config(case: &Case) -> TrainConfig {
    let mut values = vec![
        ("model_name_or_path".to_owned(), fixtures().join(&case.model).display().to_string()),
        ("train_file".to_owned(), fixtures().join(&case.dataset).display().to_string()),
    ];
    values
        .extend(case.config.iter().map(|(k, v)| (k.clone(), v.as_str().map_or_else(|| v.to_string(), str::to_owned))));
    let cfg = TrainConfig::default().with_overrides(&values).unwrap_or_else(|e| panic!("{}: {e}", case.name));
    cfg.resolve().unwrap_or_else(|e| panic!("{}: {e}", case.name));
    cfg
}

#[allow(deprecated)] // burn's libtorch device is deprecated upstream; it is this project's backend.
fn cpu() -> Device {
    Device::libtorch()
}

fn options(case: &Case, packing: Packing) -> EvalOptions {
    let cfg = config(case);
    EvalOptions {
        model: fixtures().join(&case.model),
        ref_model: None,
        tokenizer: Some(fixtures().join("tokenizer")),
        data: fixtures().join(&case.dataset),
        columns: Columns::default(),
        skip_bad_rows: false,
        split: None,
        truncation: cfg.truncation().unwrap(),
        loss: cfg.loss,
        batch_size: 4,
        packing,
        device: cpu(),
    }
}

/// How far a metric of ours can be from TRL's: as [`bounds::trl_metric`] (the forward's relative
/// error carried through the pair's log-probs), times the slope the family adds to the margin's:
/// β above 1 (SimPO's β = 2), and AlphaPO's reward `(1 - e^(-αx))/α`, whose slope is e^(-αx).
fn bound(case: &Case, name: &str, want: f64) -> f64 {
    let cfg = config(case);
    let forward = bounds::llama_logits(&fixtures().join(&case.model), bounds::FIXTURE_SEQ)
        + bounds::reordered(bounds::FIXTURE_SEQ, bounds::U_F32);
    if name.starts_with("logps/") || name == "nll_loss" {
        return forward * want.abs();
    }
    let metrics = |n: &str| case.metrics.get(n).copied();
    let largest = metrics("logps/chosen").unwrap_or(0.0).abs().max(metrics("logps/rejected").unwrap_or(0.0).abs());
    let slope = cfg.loss.beta.max(1.0) * (cfg.loss.alpha.abs() * largest).exp();
    let base = bounds::trl_metric(name, want, &metrics, cfg.loss.beta, forward);
    base * slope + forward * metrics("nll_loss").unwrap_or(0.0).abs()
}

#[test]
fn every_reference_free_case_matches_trl() {
    let fixture = fixture();
    assert!(fixture.cases.len() >= 18, "the fixture lost cases: {}", fixture.cases.len());
    let mut failures = Vec::new();
    for case in &fixture.cases {
        for packing in [Packing::Padded, Packing::Packed, Packing::SharedPrompt] {
            let report = evaluate(&options(case, packing)).unwrap_or_else(|e| panic!("{}: {e:#}", case.name));
            assert_eq!(report.pairs, case.num_rows, "{}: pairs", case.name);
            let ours = report.metrics.named().into_iter().chain(report.metrics.extra());
            let mut compared = 0;
            for (name, got) in ours.filter(|(n, _)| !n.starts_with("logits/")) {
                let Some(&want) = case.metrics.get(name) else { continue };
                compared += 1;
                if (got - want).abs() > bound(case, name, want) {
                    failures.push(format!("{} ({packing:?}) {name}: got {got}, TRL {want}", case.name));
                }
            }
            // loss, rewards/* (4), logps/* (2), nll_loss, and ORPO's two log-odds.
            let want = if case.metrics.contains_key("log_odds_ratio") { 10 } else { 8 };
            assert_eq!(compared, want, "{}: metrics compared", case.name);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn rows_are_tokenised_as_cpo_tokenizes_them() {
    let fixture = fixture();
    let tok = Tokenizer::from_dir(&fixtures().join("tokenizer")).unwrap();
    for (key, rows) in &fixture.tokenized {
        let (dataset, max_length) = key.rsplit_once("_max_length_").unwrap();
        let mut cfg = TrainConfig { max_length: max_length.parse().unwrap(), ..Default::default() };
        cfg.loss.loss_type = vec![dpo_train::config::LossType::Cpo];
        let truncation = cfg.truncation().unwrap();
        let path = fixtures().join(format!("data/{dataset}.jsonl"));
        let prepared = prepare(&path, &LoadOptions::default(), &tok, truncation, Default::default(), &mut |_, _| {})
            .unwrap_or_else(|e| panic!("{key}: {e}"));
        assert_eq!(prepared.pairs.len(), rows.len(), "{key}: rows");
        for (i, (ours, trl)) in prepared.pairs.iter().zip(rows).enumerate() {
            // The fixtures' two sides always split the prompt alike: one prompt per pair.
            assert_eq!(trl.chosen_prompt, trl.rejected_prompt, "{key} row {i}: the fixture's sides differ");
            assert_eq!(ours.prompt_ids, trl.chosen_prompt, "{key} row {i}: prompt");
            assert_eq!(ours.chosen_ids, trl.chosen, "{key} row {i}: chosen");
            assert_eq!(ours.rejected_ids, trl.rejected, "{key} row {i}: rejected");
        }
    }
}

#[test]
fn the_family_refuses_what_its_trainers_do_not_define() {
    let refused = |pairs: &[(&str, &str)]| {
        let required = [("model_name_or_path", "m"), ("train_file", "d.jsonl")];
        let values: Vec<(String, String)> =
            required.iter().chain(pairs).map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let cfg = TrainConfig::default().with_overrides(&values).and_then(|c| c.resolve().map(|_| c));
        cfg.err().map(|e| e.to_string()).unwrap_or_default()
    };
    assert!(refused(&[("loss_type", "simpo,sft")]).contains("`simpo` trains alone"));
    assert!(refused(&[("loss_type", "orpo"), ("label_smoothing", "0.1")]).contains("label_smoothing"));
    assert!(refused(&[("loss_type", "cpo"), ("ld_alpha", "0.5")]).contains("ld_alpha"));
    assert!(refused(&[("loss_type", "cpo"), ("truncation_mode", "keep_end")]).contains("keep_end"));
    assert!(refused(&[("loss_type", "cpo"), ("precompute_ref_log_probs", "true")]).contains("no reference"));
    assert!(refused(&[("loss_type", "orpo"), ("ref_model_name_or_path", "/x")]).contains("no reference model"));
    assert!(refused(&[("loss_type", "cpo"), ("cpo_alpha", "-1")]).contains("cpo_alpha"));
    assert!(refused(&[("loss_type", "simpo"), ("simpo_gamma", "nan")]).contains("simpo_gamma"));
    assert_eq!(refused(&[("loss_type", "alphapo"), ("alpha", "0.25")]), "");
    let defaults = LossConfig::default();
    assert_eq!((defaults.cpo_alpha, defaults.simpo_gamma, defaults.alpha), (1.0, 0.5, 0.0), "CPOConfig's defaults");
}
