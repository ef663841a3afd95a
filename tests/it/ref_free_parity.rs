//! The reference-free family (`loss_type` cpo, simpo, alphapo, orpo) against TRL 1.16's
//! `CPOTrainer` / `ORPOTrainer`: the tokenised rows of their `tokenize_row`, and every metric of
//! `dpo-train eval` against the trainers' `evaluate()` on the llama, qwen2 and qwen3 fixtures, in
//! each batch layout. The numbers come from `tests/gen/make_ref_free_fixtures.py`.
//!
//! `logits/*` are left out: TRL's CPO and ORPO average the logits over every position of the
//! padded batch (prompt and padding included), which depends on how the batch was padded;
//! dpo-train reports them over the scored positions, as its DPO does.

use dpo_train::config::{LossConfig, TrainConfig};
use dpo_train::data::{Columns, LoadOptions, Packing, Tokenizer, collate, prepare};
use dpo_train::dpo::logps::{DeviceBatch, Stats};
use dpo_train::dpo::loss::{PairScores, dpo_loss};
use dpo_train::eval::{EvalOptions, evaluate};
use dpo_train::model::host;
use dpo_train::train::backprop::forward_backward;
use dpo_train::train::optim::GradAccumulator;
use dpo_train::train::partition::Whole;
use serde::Deserialize;

use crate::common::bounds;
use crate::common::trl::{Case, Fixture, TrainStep, assert_gradients};
use crate::common::{cpu, fixtures, on_device};

#[derive(Deserialize)]
struct Row {
    chosen_prompt: Vec<u32>,
    chosen: Vec<u32>,
    rejected_prompt: Vec<u32>,
    rejected: Vec<u32>,
}

fn fixture() -> Fixture<Row> {
    Fixture::read("trl_ref_free.json")
}

fn config(case: &Case) -> TrainConfig {
    case.config()
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
        config: None,
        truncation: cfg.truncation().unwrap(),
        loss: cfg.loss,
        batch_size: 4,
        // TRL's fixture evaluated every row in one batch.
        metrics_batch: Some(usize::MAX),
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

/// One training step of every row, as TRL's trainers backpropagate it: the loss and every
/// parameter's gradient (norm and sum) in each batch layout, for cpo, simpo, alphapo and orpo
/// (ORPO's NLL over the chosen prompts included).
#[test]
fn a_training_batch_has_the_trainers_gradients() {
    let fixture = fixture();
    let tok = Tokenizer::from_dir(&fixtures().join("tokenizer")).unwrap();
    let device = cpu().autodiff();
    let steps: Vec<(&Case, &TrainStep)> =
        fixture.cases.iter().filter_map(|c| c.train_step.as_ref().map(|t| (c, t))).collect();
    assert_eq!(steps.len(), 5, "the fixture lost its gradient cases");
    for (case, want) in steps {
        let cfg = config(case);
        let truncation = cfg.truncation().unwrap();
        let (_, policy) = dpo_train::model::load(&fixtures().join(&case.model), &device).unwrap();
        let path = fixtures().join(&case.dataset);
        let pairs = prepare(&path, &LoadOptions::default(), &tok, truncation, Default::default(), &mut |_, _| {})
            .unwrap()
            .pairs;
        let zeros = vec![0.0; 2 * pairs.len()];
        for packing in [Packing::Padded, Packing::Packed, Packing::SharedPrompt] {
            let host_batch = collate(&pairs, tok.pad_id(), truncation, packing);
            let (seq, tokens) = (host_batch.lengths.iter().copied().max().unwrap(), host_batch.tokens());
            let batch = DeviceBatch::new(&host_batch, None, &device);
            let mut grads = GradAccumulator::default();
            let (scores, loss) =
                forward_backward(&Whole(&policy), &batch, Stats::ALL, None, 1.0, &mut grads, |scores| {
                    dpo_loss(&PairScores::from_scores(&batch, scores, &on_device(&zeros, &batch)), &cfg.loss)
                })
                .unwrap();
            let what = format!("{} ({packing:?})", case.name);
            let loss = f64::from(host(&loss)[0]);
            let logp = f64::from(host(&scores.logps).into_iter().fold(0f32, |m, x| m.max(x.abs())));
            // The loss: as the metrics' bound (`bound`). The gradients: `bounds::dpo_gradient` at
            // the batch's largest log-prob, with the family's slope on the margin.
            let slope = cfg.loss.beta.max(1.0) * (cfg.loss.alpha.abs() * logp).exp();
            assert!(
                (loss - want.loss).abs() <= bound(case, "loss", want.loss),
                "{what}: loss {loss}, TRL {}",
                want.loss
            );
            let model_dir = fixtures().join(&case.model);
            let relative = bounds::dpo_gradient(&model_dir, seq, tokens, slope, logp);
            assert_gradients(&what, &grads, want, relative);
        }
    }
}
