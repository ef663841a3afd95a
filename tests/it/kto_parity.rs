//! KTO (`loss_type = "kto"`, and `apo_zero_unpaired`) against TRL 1.16's `KTOTrainer`: the rows of its `_prepare_dataset`
//! (unpaired files, and preference pairs unpaired with `unpair`), every metric of `dpo-train eval`
//! against `evaluate()` on the llama (against llama-ref), qwen2 and qwen3 fixtures in each batch
//! layout, and the loss and gradients of one training batch. The numbers come from
//! `tests/gen/make_kto_fixtures.py` (its KL completions rotate over the whole set, the block
//! `eval --batch-size` takes here).

use dpo_train::config::TrainConfig;
use dpo_train::data::{LoadOptions, Packing, RowKind, Tokenizer, collate, kto, prepare};
use dpo_train::dpo::logps::{Collation, DeviceBatch, Stats, reference_logps};
use dpo_train::dpo::loss::{PairScores, dpo_loss};
use dpo_train::eval::evaluate;
use dpo_train::model::host;
use dpo_train::train::backprop::forward_backward;
use dpo_train::train::optim::GradAccumulator;
use dpo_train::train::partition::Whole;
use serde::Deserialize;

use crate::common::bounds;
use crate::common::trl::{Case, Fixture, TrainStep, assert_gradients};
use crate::common::{cpu, fixture_eval, fixtures, on_device};

#[derive(Deserialize)]
struct Row {
    prompt: Vec<u32>,
    completion: Vec<u32>,
    kl_completion: Vec<u32>,
    label: bool,
}

fn fixture() -> Fixture<Row> {
    Fixture::read("trl_kto.json")
}

fn config(case: &Case) -> TrainConfig {
    case.config()
}

fn read_options(cfg: &TrainConfig) -> LoadOptions {
    LoadOptions { rows: RowKind::of(&cfg.loss), ..LoadOptions::default() }
}

/// A metric's distance from TRL's, each log-prob off by at most `forward` relative (the forward
/// chain's bound, as [`bounds::trl_metric`] takes it): a reward β·(log π - log π_ref) by β times
/// both sizes; `kl`, a mean of such differences over the KL sequences, whose completions are the
/// rows' own under other prompts (taken at twice the largest row's size); the loss, whose slope
/// in a log-ratio or in `kl` is at most β/4 times the larger weight. The rest (logits, entropy)
/// as [`bounds::trl_metric`].
fn bound(case: &Case, name: &str, want: f64) -> f64 {
    let cfg = config(case);
    let forward = bounds::llama_logits(&fixtures().join(&case.model), bounds::FIXTURE_SEQ)
        + bounds::reordered(bounds::FIXTURE_SEQ, bounds::U_F32);
    let metric = |n: &str| case.metrics.get(n).copied().unwrap_or(0.0);
    let beta = cfg.loss.beta;
    // |log π| + |log π_ref| of a side's mean row.
    let sizes = |side: &str| {
        metric(&format!("logps/{side}")).abs()
            + (metric(&format!("logps/{side}")) - metric(&format!("rewards/{side}")) / beta).abs()
    };
    let ratio = forward * sizes("chosen").max(sizes("rejected"));
    let kl = 2.0 * ratio;
    let weight = cfg.loss.desirable_weight.max(cfg.loss.undesirable_weight);
    match name {
        n if n.starts_with("logps/") => forward * want.abs(),
        "rewards/chosen" => beta * forward * sizes("chosen"),
        "rewards/rejected" => beta * forward * sizes("rejected"),
        "rewards/margins" => beta * forward * (sizes("chosen") + sizes("rejected")),
        "kl" => kl,
        "loss" => beta / 4.0 * weight * (ratio + kl),
        _ => bounds::trl_metric(name, want, &|n| case.metrics.get(n).copied(), beta, forward),
    }
}

#[test]
fn every_kto_case_matches_trl() {
    let fixture = fixture();
    assert!(fixture.cases.len() >= 11, "the fixture lost cases: {}", fixture.cases.len());
    let mut failures = Vec::new();
    for case in &fixture.cases {
        let cfg = config(case);
        for packing in [Packing::Padded, Packing::Packed, Packing::SharedPrompt] {
            let reference = case.ref_model.as_deref().filter(|r| *r != case.model);
            let models = (case.model.as_str(), reference);
            let options = fixture_eval(models, &fixtures().join(&case.dataset), &cfg, (case.num_rows, packing));
            let report = evaluate(&options).unwrap_or_else(|e| panic!("{}: {e:#}", case.name));
            assert_eq!(report.pairs, case.num_rows, "{}: rows", case.name);
            let ours: Vec<(&str, f64)> = report.metrics.named().into_iter().chain(report.metrics.extra()).collect();
            assert!(ours.iter().all(|(n, _)| *n != "rewards/accuracies"), "{}: KTO logs no accuracy", case.name);
            let mut compared = 0;
            for (name, got) in ours {
                let Some(&want) = case.metrics.get(name) else { continue };
                compared += 1;
                if (got - want).abs() > bound(case, name, want) {
                    failures.push(format!("{} ({packing:?}) {name}: got {got}, TRL {want}", case.name));
                }
            }
            // loss, rewards/* (3), logps/* (2), logits/* (2), entropy, num_tokens, kl.
            assert_eq!(compared, 11, "{}: metrics compared", case.name);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn rows_and_kl_completions_are_trls() {
    let fixture = fixture();
    let tok = Tokenizer::from_dir(&fixtures().join("tokenizer")).unwrap();
    for (key, rows) in &fixture.tokenized {
        let (dataset, max_length) = key.rsplit_once("_max_length_").unwrap();
        let max: usize = max_length.parse().unwrap();
        let mut cfg = TrainConfig { max_length: max, ..Default::default() };
        cfg.loss.loss_type = vec![dpo_train::config::LossType::Kto];
        cfg.loss.unpair = dataset.starts_with("prefs");
        let path = fixtures().join(format!("data/{dataset}.jsonl"));
        let prepared =
            prepare(&path, &read_options(&cfg), &tok, cfg.truncation().unwrap(), Default::default(), &mut |_, _| {})
                .unwrap_or_else(|e| panic!("{key}: {e}"));
        assert_eq!(prepared.pairs.len(), rows.len(), "{key}: rows");
        let with_kl = kto::with_kl(&prepared.pairs, rows.len(), Some(max));
        for (i, (ours, trl)) in with_kl.iter().zip(rows).enumerate() {
            // TRL's dataset holds whole completions; its collator cuts each sequence to max_length.
            let cut = |ids: &[u32]| ids[..ids.len().min(max - trl.prompt.len())].to_vec();
            assert_eq!(ours.prompt_ids, trl.prompt, "{key} row {i}: prompt");
            assert_eq!(ours.chosen_ids, cut(&trl.completion), "{key} row {i}: completion");
            assert_eq!(ours.rejected_ids, cut(&trl.kl_completion), "{key} row {i}: KL completion");
            assert_eq!(ours.label, Some(trl.label), "{key} row {i}: label");
        }
    }
}

/// One training batch of every row, as `_compute_loss` backpropagates it: the loss and every
/// parameter's gradient (norm and sum) in each layout.
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
        let ref_dir = fixtures().join(case.ref_model.as_ref().expect("every KTO case names its reference"));
        let (_, reference) = dpo_train::model::load(&ref_dir, &cpu()).unwrap();
        let path = fixtures().join(&case.dataset);
        let rows =
            prepare(&path, &read_options(&cfg), &tok, truncation, Default::default(), &mut |_, _| {}).unwrap().pairs;
        // apo_zero_unpaired scores no KL sequence (TRL's calculate_KL = False).
        let pairs = if cfg.loss.kl_rows() { kto::with_kl(&rows, rows.len(), Some(cfg.max_length)) } else { rows };
        for packing in [Packing::Padded, Packing::Packed, Packing::SharedPrompt] {
            let collation =
                Collation { batch_size: pairs.len(), pad_id: tok.pad_id(), truncation, ld_alpha: None, packing };
            let refs = reference_logps(&reference, &pairs, &collation, &cpu(), None).unwrap();
            let ref_rows: Vec<f32> = refs.chosen.iter().chain(&refs.rejected).copied().collect();
            let host_batch = collate(&pairs, tok.pad_id(), truncation, packing);
            let (seq, tokens) = (host_batch.lengths.iter().copied().max().unwrap(), host_batch.tokens());
            let batch = DeviceBatch::new(&host_batch, None, &device);
            let mut grads = GradAccumulator::default();
            let (scores, loss) =
                forward_backward(&Whole(&policy), &batch, Stats::ALL, None, 1.0, &mut grads, |scores| {
                    dpo_loss(&PairScores::from_scores(&batch, scores, &on_device(&ref_rows, &batch)), &cfg.loss)
                })
                .unwrap();
            let what = format!("{} ({packing:?})", case.name);
            let loss = f64::from(host(&loss)[0]);
            assert!(
                (loss - want.loss).abs() <= bound(case, "loss", want.loss),
                "{what}: loss {loss}, TRL {}",
                want.loss
            );
            let logp = f64::from(host(&scores.logps).into_iter().fold(0f32, |m, x| m.max(x.abs())));
            let model_dir = fixtures().join(&case.model);
            // A row's loss weight β·σ'(β(r - z)) moves relatively by at most β·|δ(r - z)| (as
            // |σ''/σ'| ≤ 1), as DPO's does in its margin.
            let relative = bounds::dpo_gradient(&model_dir, seq, tokens, cfg.loss.beta, logp);
            assert_gradients(&what, &grads, want, relative);
        }
    }
}
