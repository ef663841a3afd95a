//! Every metric of `dpo-train eval` against TRL 1.16's `DPOTrainer.evaluate` on the same policy,
//! a different reference and the same data, for every loss type and option TRL supports, in each
//! batch layout (TRL's padded rows, packed rows, packed with shared prompts). The expected numbers
//! come from `tests/gen/make_fixtures.py` (TRL run in `.venv`).

use std::collections::BTreeMap;
use std::path::PathBuf;

use burn::tensor::Device;
use dpo_train::config::{FDivergence, LossConfig, LossType};
use dpo_train::data::{Columns, Packing, TokenizedPair, Tokenizer, collate};
use dpo_train::dpo::logps::{DeviceBatch, Stats};
use dpo_train::dpo::loss::{PairScores, dpo_loss};
use dpo_train::eval::{EvalOptions, evaluate};
use dpo_train::model::host;
use dpo_train::train::backprop::forward_backward;
use dpo_train::train::optim::GradAccumulator;
use dpo_train::train::partition::Whole;
use serde::Deserialize;

use crate::common::{bounds, on_device};

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

const LAYOUTS: [Packing; 3] = [Packing::Padded, Packing::Packed, Packing::SharedPrompt];

fn options(case: &Case, batch_size: usize) -> EvalOptions {
    options_in(case, batch_size, Packing::Padded)
}

fn options_in(case: &Case, batch_size: usize, packing: Packing) -> EvalOptions {
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
        config: None,
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
            ..defaults
        },
        truncation: c.max_length.into(),
        batch_size,
        // TRL's fixture evaluated every row in one batch.
        metrics_batch: Some(usize::MAX),
        packing,
        device: cpu(),
    }
}

fn supported_cases() -> Vec<Case> {
    let text = std::fs::read_to_string(fixtures().join("expected/trl_eval.json")).unwrap();
    let fixture: Fixture = serde_json::from_str(&text).unwrap();
    fixture.cases.into_iter().filter(|c| c.unsupported.is_none()).collect()
}

/// Our f32 forward and TRL's over the fixture's sequences: twice the chain's relative error of a
/// logit, and the sum of a sequence's token log-probs in another order.
fn forward_bound() -> f64 {
    let seq = bounds::FIXTURE_SEQ;
    bounds::llama_logits(&fixtures().join("models/llama"), seq) + bounds::reordered(seq, bounds::U_F32)
}

/// Ours and TRL's `want` of metric `name` in `case`, within `bounds::trl_metric`.
fn close(case: &Case, name: &str, got: f64, want: f64) -> bool {
    let metrics = |n: &str| case.metrics.get(n).copied();
    let beta = case.config.beta.unwrap_or(LossConfig::default().beta);
    (got - want).abs() <= bounds::trl_metric(name, want, &metrics, beta, forward_bound())
}

#[test]
fn every_trl_case_matches_to_1e_4() {
    let cases = supported_cases();
    assert!(cases.len() >= 30, "the fixture lost cases: {}", cases.len());
    let mut failures = Vec::new();
    for (case, packing) in cases.iter().flat_map(|c| LAYOUTS.map(|p| (c, p))) {
        let report = evaluate(&options_in(case, 4, packing)).unwrap_or_else(|e| panic!("{}: {e:#}", case.name));
        for (name, got) in report.metrics.named() {
            let want = case.metrics[name];
            if !close(case, name, got, want) {
                failures.push(format!("{} ({packing:?}) {name}: got {got}, TRL {want}", case.name));
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
        let named: BTreeMap<&str, f64> = whole.named().into_iter().collect();
        let beta = case.config.beta.unwrap_or(LossConfig::default().beta);
        for batch_size in [1, 3] {
            let split = evaluate(&options(case, batch_size)).unwrap().metrics;
            for ((name, a), (_, b)) in whole.named().into_iter().zip(split.named()) {
                // Two of our f32 forwards over other batch shapes: as ours against TRL's.
                let bound = bounds::trl_metric(name, a, &|n| named.get(n).copied(), beta, forward_bound());
                assert!(
                    (a - b).abs() <= bound,
                    "{} {name}: batch 64 gives {a}, batch {batch_size} gives {b} (bound {bound:e})",
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
    // A pair's reward is β·logp rounded once in f32 (and β = 0.1 held in f32): 2u of it.
    let rounded = |x: f64| 2.0 * bounds::U_F32 * x.abs();
    assert!((free.rewards_chosen - 0.1 * free.logps_chosen).abs() <= rounded(free.rewards_chosen));
    assert!((free.rewards_rejected - 0.1 * free.logps_rejected).abs() <= rounded(free.rewards_rejected));
    let with_ref = evaluate(&options(&case, 4)).unwrap().metrics;
    // The policy's log-probs do not involve the reference: the same arithmetic, bit for bit.
    assert_eq!(free.logps_chosen.to_bits(), with_ref.logps_chosen.to_bits());
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

/// The pairs of TRL's collated `[chosen; rejected]` rows: each row's prompt is what precedes its
/// completion mask, its completion what the mask covers (the padding follows it).
fn pairs_of(input_ids: &[Vec<i64>], completion_mask: &[Vec<i64>]) -> Vec<TokenizedPair> {
    let b = input_ids.len() / 2;
    let split = |r: usize| {
        let first = completion_mask[r].iter().position(|&m| m == 1).unwrap();
        let ids = |range: std::ops::Range<usize>| input_ids[r][range].iter().map(|&t| t as u32).collect::<Vec<_>>();
        let end = first + completion_mask[r][first..].iter().take_while(|&&m| m == 1).count();
        (ids(0..first), ids(first..end))
    };
    (0..b)
        .map(|i| {
            let ((prompt, chosen), (prompt_r, rejected)) = (split(i), split(b + i));
            assert_eq!(prompt, prompt_r, "pair {i}: chosen and rejected share the prompt");
            TokenizedPair { line: i + 1, prompt_ids: prompt, chosen_ids: chosen, rejected_ids: rejected, label: None }
        })
        .collect()
}

/// TRL's training batch (`tests/gen/make_grad_fixture.py`), the fixture policy on the autodiff
/// CPU device, and the batch's pairs.
fn grad_fixture() -> (GradFixture, dpo_train::model::Llama, Vec<TokenizedPair>, Device) {
    let text = std::fs::read_to_string(fixtures().join("expected/trl_grads.json")).unwrap();
    let fx: GradFixture = serde_json::from_str(&text).unwrap();
    let device = cpu().autodiff();
    let (_, policy) = dpo_train::model::load(&fixtures().join("models/llama"), &device).unwrap();
    let pairs = pairs_of(&fx.input_ids, &fx.completion_mask);
    (fx, policy, pairs, device)
}

/// The training step's loss and every parameter's gradient equal those of TRL's `compute_loss`
/// backpropagated by torch, on TRL's own collated batch (and on the same pairs packed, with and
/// without shared prompts): this covers the hand-written LM-head backward, torch's attention
/// backward and burn's autodiff through the rest of the model.
#[test]
fn a_training_batch_has_trls_gradients() {
    let (fx, policy, pairs, device) = grad_fixture();
    // TRL's rows, rebuilt from the pairs: the same ids, padding and all.
    let pad = Tokenizer::from_dir(&fixtures().join("models/llama")).unwrap().pad_id();
    assert_eq!(collate(&pairs, pad, None, Packing::Padded).input_ids, fx.input_ids.concat(), "TRL's rows");
    for packing in LAYOUTS {
        let batch = DeviceBatch::new(&collate(&pairs, pad, None, packing), None, &device);
        check_trl_gradients(&fx, &policy, &batch, packing);
    }
}

/// Asserts the loss and the gradients of one training batch against TRL's.
fn check_trl_gradients(fx: &GradFixture, policy: &dpo_train::model::Llama, batch: &DeviceBatch, packing: Packing) {
    let loss_cfg = LossConfig { beta: fx.beta, ..LossConfig::default() };
    let mut grads = GradAccumulator::default();
    let (scores, loss) = forward_backward(&Whole(policy), batch, Stats::ALL, None, 1.0, &mut grads, |scores| {
        let pairs = PairScores::from_scores(batch, scores, &on_device(&fx.ref_logps, batch));
        dpo_loss(&pairs, &loss_cfg)
    })
    .unwrap();
    let loss = f64::from(host(&loss)[0]);
    // The loss: a function of the policy's log-probs (the reference's are TRL's own) whose
    // derivative is at most 1 + loss (`bounds::trl_metric`); the gradients: `bounds::dpo_gradient`
    // of the gradient's norm, at the largest log-prob of the batch.
    let logp = host(&scores.logps).into_iter().chain(fx.ref_logps.iter().copied()).fold(0f32, |m, x| m.max(x.abs()));
    let logp = f64::from(logp);
    let (seq, rows) = (fx.input_ids[0].len(), fx.input_ids.len());
    let bound = forward_bound() * 4.0 * logp * (1.0 + loss.abs());
    assert!((loss - fx.loss).abs() <= bound, "{packing:?}: loss {loss}, TRL {} (bound {bound:e})", fx.loss);
    let relative = bounds::dpo_gradient(&fixtures().join("models/llama"), seq, rows * seq, fx.beta, logp);
    assert_eq!(grads.grads.keys().collect::<Vec<_>>(), fx.grads.keys().collect::<Vec<_>>());
    for (name, want) in &fx.grads {
        let g: Vec<f64> = host(&grads.grads[name]).into_iter().map(f64::from).collect();
        let norm = g.iter().map(|x| x * x).sum::<f64>().sqrt();
        let sum: f64 = g.iter().sum();
        let what = format!("{packing:?} {name}");
        // Each entry is off by at most `relative` times the whole gradient's norm (the scale of
        // its terms): the norm by that, the sum of n entries by n times that.
        let scale = relative * fx.grads.values().map(|g| g.norm * g.norm).sum::<f64>().sqrt();
        let n = g.len() as f64;
        assert!((norm - want.norm).abs() <= scale * n.sqrt(), "{what}: gradient norm {norm}, TRL {}", want.norm);
        assert!((sum - want.sum).abs() <= scale * n, "{what}: gradient sum {sum}, TRL {}", want.sum);
    }
    // The norm clipping reads: over every parameter's gradient, from TRL's per-parameter norms.
    let global = f64::from(host(&grads.global_norm().unwrap().unwrap())[0]);
    let want = fx.grads.values().map(|g| g.norm * g.norm).sum::<f64>().sqrt();
    assert!((global - want).abs() <= relative * want, "{packing:?}: global gradient norm {global}, TRL {want}");
}

/// A training step takes the policy's statistics from the head's backward (TRL's entropy formula,
/// `logsumexp − Σ p·z`, on the recomputed softmax); evaluation takes them from the forward
/// (`−Σ p·log p`). On the same batch in each layout: the same argmax counts, tokens and mean
/// logits, and entropies within the two formulas' f32 rounding (each term is at most the
/// log-sum-exp, summed over a sequence's tokens).
#[test]
fn a_training_steps_statistics_are_evaluations() {
    let (fx, policy, pairs, device) = grad_fixture();
    let pad = Tokenizer::from_dir(&fixtures().join("models/llama")).unwrap().pad_id();
    let loss_cfg = LossConfig { beta: fx.beta, ..LossConfig::default() };
    for packing in LAYOUTS {
        let batch = DeviceBatch::new(&collate(&pairs, pad, None, packing), None, &device);
        let mut grads = GradAccumulator::default();
        let stats = Stats::Metrics { wpo: false };
        let (trained, _) = forward_backward(&Whole(&policy), &batch, stats, None, 1.0, &mut grads, |scores| {
            dpo_loss(&PairScores::from_scores(&batch, scores, &on_device(&fx.ref_logps, &batch)), &loss_cfg)
        })
        .unwrap();
        let evaluated = dpo_train::dpo::logps::score(&policy, &batch, Stats::ALL);
        let (a, b) = (trained.stats.unwrap(), evaluated.stats.unwrap());
        assert_eq!(host(&a.top1), host(&b.top1), "{packing:?}: argmax counts");
        assert_eq!(host(&a.tokens), host(&b.tokens), "{packing:?}: tokens");
        assert_eq!(host(&a.mean_logits), host(&b.mean_logits), "{packing:?}: mean logits");
        let tokens = host(&a.tokens);
        for (i, (x, y)) in host(&a.entropy).into_iter().zip(host(&b.entropy)).enumerate() {
            // Each token's two entropies are a few f32 roundings (u) of terms the size of its
            // log-sum-exp apart, which these logits keep within 2·ln V; the sequence sums its n
            // tokens' (observed: at most 4.6e-5 on 43 tokens, a tenth of this).
            let bound = 32.0 * bounds::U_F32 * f64::from(tokens[i]) * (384f64).ln();
            assert!(f64::from((x - y).abs()) <= bound, "{packing:?} sequence {i}: entropy {x} against {y} ({bound:e})");
        }
    }
}

/// TRL's logged rows over 10 optimizer steps (`tests/gen/make_trl_train_fixture.py`): the same
/// run here logs the same loss, grad_norm and rewards step by step, the learning rate of
/// transformers' `constant` schedule (no warm-up, whatever `warmup_steps` says), weight decay on
/// the parameters transformers decays (the tied embedding among them) and the epoch counted in
/// micro-batches (9 an epoch, the last step taking one).
#[test]
fn a_training_run_logs_trls_rows() {
    #[derive(Deserialize)]
    struct Fixture {
        rows: usize,
        settings: BTreeMap<String, serde_json::Value>,
        logged: Vec<BTreeMap<String, f64>>,
    }
    let fx: Fixture =
        serde_json::from_str(&std::fs::read_to_string(fixtures().join("expected/trl_train.json")).unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let first =
        std::fs::read_to_string(fixtures().join("data/prefs.jsonl")).unwrap().lines().next().unwrap().to_owned();
    let data = dir.path().join("rows.jsonl");
    std::fs::write(&data, format!("{first}\n").repeat(fx.rows)).unwrap();
    let settings: String = fx.settings.iter().map(|(k, v)| format!("{k} = {v}\n")).collect();
    let text = format!(
        "model_name_or_path = \"{}\"\nref_model_name_or_path = \"{}\"\ntrain_file = \"{}\"\noutput_dir = \"{}\"\n\
         run_name = \"trl\"\nbf16 = false\ngradient_checkpointing = false\nsave_strategy = \"no\"\nnum_samples = 0\n\
         beta = 0.1\nseed = 42\n{settings}",
        fixtures().join("models/llama").display(),
        fixtures().join("models/llama-ref").display(),
        data.display(),
        dir.path().display(),
    );
    let cfg = dpo_train::config::TrainConfig::from_toml_str(&text, "trl.toml").unwrap();
    let summary = crate::common::run_alone(
        cfg,
        None,
        false,
        &std::sync::atomic::AtomicBool::new(false),
        &mut crate::common::Quiet,
    );
    let rows = dpo_train::train::log::read_metrics(&summary.run_dir.join("metrics.csv")).unwrap();
    let ours: Vec<_> = rows.iter().filter(|r| r.split == dpo_train::train::log::Split::Train).collect();
    assert_eq!(ours.len(), fx.logged.len());
    for (row, want) in ours.iter().zip(&fx.logged) {
        let step = want["step"];
        assert_eq!(row.step as f64, step);
        assert!((row.epoch - want["epoch"]).abs() < 1e-9, "step {step}: epoch {} against {}", row.epoch, want["epoch"]);
        let lr = row.learning_rate.unwrap();
        assert!(
            (lr - want["learning_rate"]).abs() < 1e-12,
            "step {step}: learning rate {lr} against {}",
            want["learning_rate"]
        );
        for name in ["loss", "grad_norm", "rewards/chosen", "rewards/rejected", "rewards/margins"] {
            let got = if name == "grad_norm" { row.grad_norm } else { row.metric(name) };
            let (got, trl) = (got.unwrap(), want[name]);
            // f32 round-off, carried through the steps' updates.
            assert!((got - trl).abs() <= 1e-4 * trl.abs().max(1e-2), "step {step}: {name} {got} against TRL's {trl}");
        }
    }
}

/// TRL's evaluation in batches of 8 (`tests/gen/make_trl_train_fixture.py`): each metric is the
/// mean of the batches' values (17 pairs: 8, 8 and 1; rewards/accuracies 0.875 where the pairs'
/// mean is 0.8235), the loss the mean over the pairs; scoring 3 pairs at a time changes nothing.
#[test]
fn evaluation_metrics_are_means_over_trls_batches() {
    #[derive(Deserialize)]
    struct Fixture {
        eval_batch: usize,
        evaluated: BTreeMap<String, f64>,
    }
    let fx: Fixture =
        serde_json::from_str(&std::fs::read_to_string(fixtures().join("expected/trl_train.json")).unwrap()).unwrap();
    let case = supported_cases().into_iter().find(|c| c.name == "loss_sigmoid").unwrap();
    assert_eq!(case.dataset, "data/prefs.jsonl");
    for scored in [fx.eval_batch, 3] {
        let opts = EvalOptions { metrics_batch: Some(fx.eval_batch), ..options(&case, scored) };
        let report = evaluate(&opts).unwrap();
        let metrics = |n: &str| fx.evaluated.get(n).copied();
        for (name, got) in report.metrics.named() {
            let want = fx.evaluated[name];
            let bound = bounds::trl_metric(name, want, &metrics, 0.1, forward_bound());
            assert!((got - want).abs() <= bound, "{name} (scored {scored} at a time): {got}, TRL {want} ({bound:e})");
        }
    }
}
