//! Every metric of `dpo-train eval` against TRL 1.16's `DPOTrainer.evaluate` on the same policy,
//! a different reference and the same data, for every loss type and option TRL supports. The
//! expected numbers come from `tests/gen/make_fixtures.py` (TRL run in `.venv`).

use std::collections::BTreeMap;
use std::path::PathBuf;

use burn::tensor::Device;
use dpo_train::config::{FDivergence, LossConfig, LossType};
use dpo_train::data::{Batch, Columns};
use dpo_train::dpo::logps::DeviceBatch;
use dpo_train::dpo::loss::{PairScores, dpo_loss};
use dpo_train::eval::{EvalOptions, evaluate};
use dpo_train::model::host;
use dpo_train::train::backprop::forward_backward;
use dpo_train::train::optim::GradAccumulator;
use dpo_train::train::partition::Whole;
use serde::Deserialize;

#[derive(Deserialize)]
struct Fixture {
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    name: String,
    dataset: String,
    config: CaseConfig,
    #[serde(default)]
    metrics: BTreeMap<String, f64>,
    unsupported: Option<String>,
}

/// The DPOConfig overrides of a case (TRL's key names).
#[derive(Deserialize)]
struct CaseConfig {
    loss_type: Vec<LossType>,
    #[serde(default)]
    loss_weights: Vec<f64>,
    beta: Option<f64>,
    label_smoothing: Option<f64>,
    f_divergence_type: Option<FDivergence>,
    f_alpha_divergence_coef: Option<f64>,
    ld_alpha: Option<f64>,
    discopop_tau: Option<f64>,
    #[serde(default)]
    use_weighting: bool,
    /// Absent: TRL's default 1024; `null`: no limit.
    #[serde(default = "default_max_length")]
    max_length: Option<usize>,
}

fn default_max_length() -> Option<usize> {
    Some(1024)
}

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

#[allow(deprecated)] // burn's libtorch device is deprecated upstream; it is this project's backend.
fn cpu() -> Device {
    Device::libtorch()
}

fn options(case: &Case, batch_size: usize) -> EvalOptions {
    let c = &case.config;
    let defaults = LossConfig::default();
    EvalOptions {
        model: fixtures().join("models/llama"),
        ref_model: Some(fixtures().join("models/llama-ref")),
        tokenizer: None,
        data: fixtures().join(&case.dataset),
        columns: Columns::default(),
        skip_bad_rows: false,
        split: None,
        loss: LossConfig {
            beta: c.beta.unwrap_or(defaults.beta),
            loss_type: c.loss_type.clone(),
            loss_weights: c.loss_weights.clone(),
            label_smoothing: c.label_smoothing.unwrap_or(defaults.label_smoothing),
            f_divergence_type: c.f_divergence_type.unwrap_or_default(),
            f_alpha_divergence_coef: c.f_alpha_divergence_coef.unwrap_or(defaults.f_alpha_divergence_coef),
            ld_alpha: c.ld_alpha,
            discopop_tau: c.discopop_tau.unwrap_or(defaults.discopop_tau),
            reference_free: false,
            use_weighting: c.use_weighting,
        },
        max_length: c.max_length,
        batch_size,
        device: cpu(),
    }
}

fn supported_cases() -> Vec<Case> {
    let text = std::fs::read_to_string(fixtures().join("expected/trl_eval.json")).unwrap();
    let fixture: Fixture = serde_json::from_str(&text).unwrap();
    fixture.cases.into_iter().filter(|c| c.unsupported.is_none()).collect()
}

/// Relative error, with an absolute floor of 1 so values near zero compare absolutely.
fn close(got: f64, want: f64) -> bool {
    (got - want).abs() / want.abs().max(1.0) <= 1e-4
}

#[test]
fn every_trl_case_matches_to_1e_4() {
    let cases = supported_cases();
    assert!(cases.len() >= 30, "the fixture lost cases: {}", cases.len());
    let mut failures = Vec::new();
    for case in &cases {
        let report = evaluate(&options(case, 4)).unwrap_or_else(|e| panic!("{}: {e:#}", case.name));
        for (name, got) in report.metrics.named() {
            let want = case.metrics[name];
            if !close(got, want) {
                failures.push(format!("{} {name}: got {got}, TRL {want}", case.name));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn metrics_do_not_depend_on_batch_size() {
    // aot sorts over the evaluated set and ld_alpha weights per pair: both must see every pair.
    for case in supported_cases()
        .iter()
        .filter(|c| ["loss_aot", "ld_alpha_0.5", "loss_sft", "max_length_24"].contains(&c.name.as_str()))
    {
        let whole = evaluate(&options(case, 64)).unwrap().metrics;
        for batch_size in [1, 3] {
            let split = evaluate(&options(case, batch_size)).unwrap().metrics;
            for ((name, a), (_, b)) in whole.named().into_iter().zip(split.named()) {
                assert!(
                    (a - b).abs() <= 1e-5 * a.abs().max(1.0),
                    "{} {name}: batch 64 gives {a}, batch {batch_size} gives {b}",
                    case.name
                );
            }
        }
    }
}

#[test]
fn reference_free_equals_a_zero_reference() {
    // TRL 1.16 has no reference-free switch; it is the older TRL's: reference log-probs of 0.
    let case = supported_cases().into_iter().find(|c| c.name == "loss_sigmoid").unwrap();
    let mut opts = options(&case, 4);
    opts.loss.reference_free = true;
    let free = evaluate(&opts).unwrap().metrics;
    assert!((free.rewards_chosen - 0.1 * free.logps_chosen).abs() < 1e-6);
    assert!((free.rewards_rejected - 0.1 * free.logps_rejected).abs() < 1e-6);
    let with_ref = evaluate(&options(&case, 4)).unwrap().metrics;
    assert!((free.logps_chosen - with_ref.logps_chosen).abs() < 1e-6);
    assert!((free.loss - with_ref.loss).abs() > 1e-3, "the reference must matter");
}

/// TRL's gradients for one training batch (`tests/gen/make_grad_fixture.py`).
#[derive(Deserialize)]
struct GradFixture {
    beta: f64,
    loss: f64,
    input_ids: Vec<Vec<i64>>,
    completion_mask: Vec<Vec<i64>>,
    ref_logps: Vec<f32>,
    grads: BTreeMap<String, GradStats>,
}

#[derive(Deserialize)]
struct GradStats {
    norm: f64,
    sum: f64,
}

/// The training step's loss and every parameter's gradient equal those of TRL's `compute_loss`
/// backpropagated by torch, on TRL's own collated batch: this covers the hand-written LM-head
/// backward, torch's attention backward and burn's autodiff through the rest of the model.
#[test]
fn a_training_batch_has_trls_gradients() {
    let text = std::fs::read_to_string(fixtures().join("expected/trl_grads.json")).unwrap();
    let fx: GradFixture = serde_json::from_str(&text).unwrap();
    let device = cpu().autodiff();
    let (_, policy) = dpo_train::model::load(&fixtures().join("models/llama"), &device).unwrap();
    let (rows, seq_len) = (fx.input_ids.len(), fx.input_ids[0].len());
    let batch = Batch {
        input_ids: fx.input_ids.concat(),
        attention_mask: Vec::new(),
        completion_mask: fx.completion_mask.concat(),
        batch_size: rows / 2,
        rows,
        seq_len,
    };
    let batch = DeviceBatch::new(&batch, None, &device);
    let loss_cfg = LossConfig { beta: fx.beta, ..LossConfig::default() };
    let mut grads = GradAccumulator::default();
    let (_, loss) = forward_backward(&Whole(&policy), &batch, true, None, 1.0, &mut grads, |scores| {
        let pairs = PairScores::from_scores(&batch, scores, &fx.ref_logps);
        dpo_loss(&pairs, &loss_cfg)
    })
    .unwrap();
    let loss = f64::from(host(&loss)[0]);
    assert!(close(loss, fx.loss), "loss {loss}, TRL {}", fx.loss);
    assert_eq!(grads.grads.keys().collect::<Vec<_>>(), fx.grads.keys().collect::<Vec<_>>());
    for (name, want) in &fx.grads {
        let g: Vec<f64> = host(&grads.grads[name]).into_iter().map(f64::from).collect();
        let norm = g.iter().map(|x| x * x).sum::<f64>().sqrt();
        let sum: f64 = g.iter().sum();
        assert!((norm - want.norm).abs() <= 1e-4 * want.norm, "{name}: gradient norm {norm}, TRL {}", want.norm);
        assert!((sum - want.sum).abs() <= 1e-4 * want.norm, "{name}: gradient sum {sum}, TRL {}", want.sum);
    }
}
