//! LoRA, PEFT interoperability, mixed precision and activation checkpointing.
//!
//! PEFT's numbers come from the venv: `tests/gen/make_peft_fixture.py` wrote an adapter and its
//! logits, and `tests/gen/check_export.py` loads what we write with `PeftModel.from_pretrained`.

use std::path::Path;
use std::sync::atomic::AtomicBool;

use burn::module::Module;
use burn::tensor::{Device, FloatDType, Int, Tensor, TensorData};
use dpo_train::config::LoraSettings;
use dpo_train::config::LossConfig;
use dpo_train::config::TrainConfig;
use dpo_train::data::{self, Packing, TokenizedPair};
use dpo_train::dpo::logps::{DeviceBatch, Stats};
use dpo_train::dpo::loss::{PairScores, dpo_loss};
use dpo_train::model::{self, AdapterInit, Llama};
use dpo_train::train::backprop::{Checkpointing, forward_backward};
use dpo_train::train::log::{Split, read_metrics};
use dpo_train::train::optim::GradAccumulator;
use dpo_train::train::partition::Whole;

use crate::common::{Quiet, bounds, cpu, fixtures, max_rel_diff, on_device, reference_logits, run_alone, tensors};

/// Our f32 logits of `IDS` against PEFT's (or another of ours) for an adapter of rank `r`.
fn lora_bound(r: usize) -> f32 {
    bounds::lora_logits(&fixtures().join("models/llama"), IDS[0].len(), r) as f32
}

const IDS: [[i64; 8]; 2] = [[11, 45, 201, 7, 99, 3, 150, 42], [300, 2, 17, 17, 88, 120, 5, 64]];

fn ids() -> Vec<Vec<i64>> {
    IDS.iter().map(|r| r.to_vec()).collect()
}

fn logits(model: &Llama, device: &Device) -> Vec<f32> {
    let input = Tensor::<2, Int>::from_data(TensorData::new(IDS.concat(), [2, 8]), device);
    let out = model.forward(input);
    assert_eq!(out.dtype(), burn::tensor::DType::F32, "logits leave the model as f32");
    out.into_data().convert::<f32>().as_slice::<f32>().unwrap().to_vec()
}

fn settings(r: usize, targets: &[&str]) -> LoraSettings {
    let targets: Vec<String> = targets.iter().map(|t| (*t).to_owned()).collect();
    LoraSettings::new(r, 2.0 * r as f64, 0.0, &targets).unwrap()
}

#[test]
fn a_fresh_adapter_gives_exactly_the_base_outputs() {
    let device = cpu();
    let (_, base) = model::load(&fixtures().join("models/llama"), &device).unwrap();
    let before = logits(&base, &device);
    let mut adapted = base.clone();
    adapted.add_lora(&settings(8, &["all-linear"]), &AdapterInit::Fresh { seed: 3 }, &device).unwrap();
    assert!(adapted.has_lora());
    assert_eq!(logits(&adapted, &device), before, "B = 0 at initialisation");
    // A is random (PEFT's Kaiming-uniform), so the adapter is not trivially empty.
    let a = adapted.adapter_tensors();
    assert_eq!(a.len(), 2 * 7 * adapted.num_layers());
    assert!(
        a.iter().filter(|t| t.name.ends_with("lora_A.weight")).all(|t| t.values.to_vec().iter().any(|v| *v != 0.0))
    );
}

#[test]
fn a_peft_adapter_loads_with_peft_logits() {
    let device = cpu();
    let expected: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixtures().join("expected/logits_llama-lora.json")).unwrap())
            .unwrap();
    let flat = |key: &str| -> Vec<f32> {
        let v: Vec<Vec<Vec<f32>>> = serde_json::from_value(expected[key].clone()).unwrap();
        v.concat().concat()
    };
    let (_, adapted) = model::load(&fixtures().join("adapters/llama-lora"), &device).unwrap();
    let ours = logits(&adapted, &device);
    let config = std::fs::read_to_string(fixtures().join("adapters/llama-lora/adapter_config.json")).unwrap();
    let rank = serde_json::from_str::<serde_json::Value>(&config).unwrap()["r"].as_u64().unwrap() as usize;
    let worst = max_rel_diff(&ours, &flat("logits"));
    assert!(worst <= lora_bound(rank), "worst relative logit difference to PEFT {worst}");
    // Switched off, the adapter leaves PEFT's base; the two differ, so the test has teeth.
    let base = logits(&adapted.without_lora(), &device);
    let plain = bounds::llama_logits(&fixtures().join("models/llama"), IDS[0].len()) as f32;
    assert!(max_rel_diff(&base, &flat("base_logits")) <= plain);
    assert!(max_rel_diff(&ours, &base) > 1e-3);
}

/// An adapter whose `target_modules` name single layers' modules (as PEFT saves `all-linear`) and
/// trailing parts of module names loads onto the modules PEFT adapted, with PEFT's logits; saved
/// again, its config names the same modules.
#[test]
fn a_peft_adapter_of_named_layers_adapts_those_layers() {
    let device = cpu();
    let expected: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixtures().join("expected/logits_llama-layers.json")).unwrap())
            .unwrap();
    let (_, adapted) = model::load(&fixtures().join("adapters/llama-layers"), &device).unwrap();
    let mut ours: Vec<String> = adapted
        .adapter_tensors()
        .iter()
        .filter(|t| t.name.ends_with("lora_A.weight"))
        .map(|t| t.name.replace(".lora_A.weight", ".lora_A.default.weight"))
        .collect();
    ours.sort();
    let peft: Vec<String> = serde_json::from_value(expected["adapted"].clone()).unwrap();
    assert_eq!(ours, peft);
    let all = logits(&adapted, &device);
    let v = all.len() / 16;
    let last: Vec<f32> = [&all[7 * v..8 * v], &all[15 * v..16 * v]].concat();
    let want: Vec<Vec<f32>> = serde_json::from_value(expected["last_logits"].clone()).unwrap();
    let worst = max_rel_diff(&last, &want.concat());
    assert!(worst <= lora_bound(4), "worst relative logit difference to PEFT {worst}");
    assert!(max_rel_diff(&last, &logits(&adapted.without_lora(), &device)[7 * v..8 * v].repeat(2)) > 1e-3);
    let settings = model::adapter_settings(&fixtures().join("adapters/llama-layers")).unwrap().unwrap();
    let peft_targets = settings.peft_targets();
    assert_eq!(peft_targets, ["v_proj", "up_proj", "model.layers.0.self_attn.q_proj", "model.layers.1.mlp.down_proj"]);
}

fn lora_config(out: &Path, model: &Path, extra: &str) -> TrainConfig {
    let text = format!(
        "model_name_or_path = \"{}\"\ntokenizer_name_or_path = \"{}\"\ntrain_file = \"{}\"\neval_file = \"{}\"\noutput_dir = \"{}\"\nrun_name = \"lora\"\nbf16 = false\ngradient_checkpointing = false\nlearning_rate = 1e-2\nmax_steps = 3\nper_device_train_batch_size = 4\nnum_samples = 0\nlogging_steps = 1\nsave_steps = 2\n{extra}",
        model.display(),
        fixtures().join("models/llama").display(),
        fixtures().join("data/prefs.jsonl").display(),
        fixtures().join("data/prefs.jsonl").display(),
        out.display()
    );
    TrainConfig::from_toml_str(&text, "test").unwrap()
}

/// Only the adapters train; PEFT loads the result with our logits, and the merged model equals it.
#[test]
fn a_trained_adapter_loads_in_peft_and_merges() {
    let out = tempfile::tempdir().unwrap();
    let base_dir = fixtures().join("models/llama");
    let cfg = lora_config(
        out.path(),
        &base_dir,
        "lora_r = 4\nlora_alpha = 8\nlora_dropout = 0.1\nlora_target_modules = [\"q_proj\", \"v_proj\"]\nmerge = true\n",
    );
    let summary = run_alone(cfg, None, false, &AtomicBool::new(false), &mut Quiet);
    let final_dir = summary.run_dir.join("final");
    for file in ["adapter_config.json", "adapter_model.safetensors", "tokenizer.json", "merged/model.safetensors"] {
        assert!(final_dir.join(file).is_file(), "final/ lacks {file}");
    }
    assert!(!final_dir.join("model.safetensors").exists(), "a LoRA run exports the adapter, not the base");

    // Checkpoints and the optimizer state hold the adapter alone.
    let ckpt = summary.run_dir.join("checkpoints/step-2");
    let moments = tensors(&ckpt.join("optimizer.safetensors"));
    assert_eq!(moments.len(), 2 * 2 * 2 * 2, "A and B of q and v in 2 layers, two moments each");
    assert!(moments.iter().all(|(name, _)| name.contains(".lora.")), "{:?}", moments.iter().map(|t| &t.0));
    assert!(!ckpt.join("model.safetensors").exists());

    let device = cpu();
    let (_, trained) = model::load(&final_dir, &device).unwrap();
    let ours = logits(&trained, &device);
    let peft = reference_logits(&final_dir, &ids());
    let worst = max_rel_diff(&ours, &peft);
    assert!(worst <= lora_bound(4), "worst relative logit difference to PEFT {worst}");
    let (_, base) = model::load(&base_dir, &device).unwrap();
    assert!(max_rel_diff(&ours, &logits(&base, &device)) > 1e-3, "training moved the adapted logits");

    // The merged model: transformers computes the adapted logits from it; only q and v changed.
    // It keeps the base's generation settings, as a full model's `final/` does.
    let generation = std::fs::read(base_dir.join("generation_config.json")).unwrap();
    assert_eq!(std::fs::read(final_dir.join("merged/generation_config.json")).unwrap(), generation);
    let merged = reference_logits(&final_dir.join("merged"), &ids());
    assert!(max_rel_diff(&merged, &ours) <= lora_bound(4));
    let before = tensors(&base_dir.join("model.safetensors"));
    let after = tensors(&final_dir.join("merged/model.safetensors"));
    for ((name, b), (name2, a)) in before.iter().zip(&after) {
        assert_eq!(name, name2);
        let changed = b.iter().zip(a).any(|(x, y)| x != y);
        let adapted = name.contains("q_proj.weight") || name.contains("v_proj.weight");
        assert_eq!(changed, adapted, "{name}: changed {changed}");
    }
}

/// Trains 3 steps of adapters on q and v (r 4, α 8) with `extra` settings; returns the final
/// directory, its adapter_config.json and our logits of the trained adapter, checked against
/// PEFT's of the same directory.
fn trained_in_peft(out: &Path, extra: &str) -> (std::path::PathBuf, serde_json::Value, Vec<f32>) {
    let extra = format!("lora_r = 4\nlora_alpha = 8\nlora_target_modules = [\"q_proj\", \"v_proj\"]\n{extra}");
    let cfg = lora_config(out, &fixtures().join("models/llama"), &extra);
    let summary = run_alone(cfg, None, false, &AtomicBool::new(false), &mut Quiet);
    let final_dir = summary.run_dir.join("final");
    let config =
        serde_json::from_str(&std::fs::read_to_string(final_dir.join("adapter_config.json")).unwrap()).unwrap();
    let (_, trained) = model::load(&final_dir, &cpu()).unwrap();
    let ours = logits(&trained, &cpu());
    let worst = max_rel_diff(&ours, &reference_logits(&final_dir, &ids()));
    assert!(worst <= lora_bound(4), "worst relative logit difference to PEFT {worst}");
    (final_dir, config, ours)
}

/// rsLoRA (`use_rslora`) scales the update by α/√r: PEFT reads it from adapter_config.json and
/// computes our logits, which an α/r scale (twice smaller at r = 4) would not give.
#[test]
fn a_rank_stabilised_adapter_loads_in_peft() {
    let out = tempfile::tempdir().unwrap();
    let (final_dir, config, ours) = trained_in_peft(out.path(), "use_rslora = true\n");
    assert_eq!(config["use_rslora"], serde_json::Value::Bool(true));
    // The same adapter at α/r is another model.
    let mut plain = config.clone();
    plain["use_rslora"] = serde_json::Value::Bool(false);
    std::fs::write(final_dir.join("adapter_config.json"), plain.to_string()).unwrap();
    let (_, halved) = model::load(&final_dir, &cpu()).unwrap();
    assert!(max_rel_diff(&ours, &logits(&halved, &cpu())) > 1e-3);
}

/// A DoRA run (`use_dora`) trains the magnitudes with the adapters: PEFT loads what it writes
/// with our logits, and the merged model (each column scaled to its magnitude) gives them in
/// transformers.
#[test]
fn a_trained_dora_adapter_loads_in_peft_and_merges() {
    let out = tempfile::tempdir().unwrap();
    let (final_dir, config, ours) = trained_in_peft(out.path(), "use_dora = true\nmerge = true\n");
    assert_eq!(config["use_dora"], serde_json::Value::Bool(true));
    let merged = reference_logits(&final_dir.join("merged"), &ids());
    assert!(max_rel_diff(&merged, &ours) <= lora_bound(4));
    // The magnitudes moved off their start, the base's column norms.
    let (_, base) = model::load(&fixtures().join("models/llama"), &cpu()).unwrap();
    let saved = tensors(&final_dir.join("adapter_model.safetensors"));
    let magnitudes: Vec<_> = saved.iter().filter(|(name, _)| name.ends_with("lora_magnitude_vector")).collect();
    assert_eq!(magnitudes.len(), 2 * 2, "q and v in 2 layers");
    for (name, values) in magnitudes {
        let module = name.trim_start_matches("base_model.model.").trim_end_matches(".lora_magnitude_vector");
        let (_, linear) = base.linears().into_iter().find(|(n, _)| n == module).unwrap();
        let start = model::linear::column_norms(&linear.weight.val())
            .into_data()
            .convert::<f32>()
            .as_slice::<f32>()
            .unwrap()
            .to_vec();
        assert!(max_rel_diff(values, &start) > 1e-4, "{name} did not train");
    }
}

/// DoRA: a PEFT adapter (`tests/gen/make_dora_fixture.py`: every projection of the qwen2 fixture,
/// whose q/k/v biases DoRA's rescaled base output leaves out, magnitudes moved off their start)
/// loads here with PEFT's logits, and the gradient of every adapter tensor (A, B and the
/// magnitude) of a fixed function of the logits is PEFT's.
#[test]
fn a_dora_adapter_gives_peft_logits_and_gradients() {
    let dir = fixtures().join("adapters/qwen2-dora");
    let expected: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixtures().join("expected/dora.json")).unwrap()).unwrap();
    let want: Vec<Vec<Vec<f32>>> = serde_json::from_value(expected["logits"].clone()).unwrap();
    let (_, adapted) = model::load(&dir, &cpu()).unwrap();
    let ours = logits(&adapted, &cpu());
    let worst = max_rel_diff(&ours, &want.concat().concat());
    let bound = bounds::lora_logits(&fixtures().join("models/qwen2"), IDS[0].len(), 4) as f32;
    assert!(worst <= bound, "worst relative logit difference to PEFT {worst} (bound {bound})");
    let (_, base) = model::load(&fixtures().join("models/qwen2"), &cpu()).unwrap();
    assert!(max_rel_diff(&ours, &logits(&base, &cpu())) > 1e-3, "the adapter changes the logits");

    let device = cpu().autodiff();
    let (_, model) = model::load(&dir, &device).unwrap();
    let input = Tensor::<2, Int>::from_data(TensorData::new(IDS.concat(), [2, 8]), &device);
    let out = model.forward(input); // [2, 8, V]
    let n = out.shape().num_elements();
    let w: Vec<f32> = (0..n).map(|i| (0.37 * i as f64).sin() as f32).collect();
    let w = Tensor::<1>::from_data(TensorData::new(w, [n]), &device).reshape(out.dims());
    let grads = (out * w).sum().backward();
    let mut seen = 0;
    model::params::visit(&model, Some(&grads), |p| {
        let Some((module, kind)) = p.name.rsplit_once(".lora.") else { return };
        let kind = match kind {
            "a" => "lora_A",
            "b" => "lora_B",
            _ => "lora_magnitude_vector",
        };
        let want = &expected["grads"][format!("{module}.{kind}")];
        let g: Vec<f64> =
            p.grad.expect("an adapter gradient").into_data().convert::<f64>().as_slice::<f64>().unwrap().to_vec();
        let (norm, sum) = (g.iter().map(|v| v * v).sum::<f64>().sqrt(), g.iter().sum::<f64>());
        let (want_norm, want_sum) = (want["norm"].as_f64().unwrap(), want["sum"].as_f64().unwrap());
        eprintln!(
            "{module}.{kind} norm {:e} sum {:e}",
            (norm - want_norm).abs() / want_norm,
            (sum - want_sum).abs() / want_norm
        );
        assert!(
            (norm - want_norm).abs() <= 2e-4 * want_norm,
            "{module}.{kind}: norm {norm} where PEFT has {want_norm}"
        );
        assert!((sum - want_sum).abs() <= 2e-4 * want_norm, "{module}.{kind}: sum {sum} where PEFT has {want_sum}");
        seen += 1;
    });
    assert_eq!(seen, 2 * 7 * 3, "A, B and the magnitude of 7 projections in 2 layers");
}

/// Under bf16 the frozen base trains in half precision; `merge` folds the saved adapter into the
/// base as read from disk, so every weight no adapter touches stays bit for bit the base's and
/// transformers computes the adapter's logits from the merged model (folding into the training
/// copy rounded every weight to bf16: embeddings 2.4e-4 off, logits 1.9e-3).
#[test]
fn a_mixed_precision_merge_keeps_the_base_weights() {
    let out = tempfile::tempdir().unwrap();
    let base_dir = fixtures().join("models/llama");
    let mut cfg = lora_config(
        out.path(),
        &base_dir,
        "lora_r = 4\nlora_target_modules = [\"q_proj\", \"v_proj\"]\nmerge = true\n",
    );
    cfg.bf16 = Some(true);
    cfg.max_steps = 1;
    let summary = run_alone(cfg, None, false, &AtomicBool::new(false), &mut Quiet);
    let final_dir = summary.run_dir.join("final");
    let before = tensors(&base_dir.join("model.safetensors"));
    let after = tensors(&final_dir.join("merged/model.safetensors"));
    for ((name, b), (_, a)) in before.iter().zip(&after) {
        if !(name.contains("q_proj.weight") || name.contains("v_proj.weight")) {
            assert!(b == a, "{name} changed in the merge");
        }
    }
    let peft = reference_logits(&final_dir, &ids());
    let merged = reference_logits(&final_dir.join("merged"), &ids());
    let worst = max_rel_diff(&merged, &peft);
    assert!(worst <= lora_bound(4), "merged vs PEFT's adapter: {worst}");
}

/// Continuing a saved PEFT adapter: the reference is the model with that adapter as loaded.
#[test]
fn training_continues_a_peft_adapter_against_it_as_reference() {
    let out = tempfile::tempdir().unwrap();
    let adapter_dir = fixtures().join("adapters/llama-lora");
    let cfg = lora_config(out.path(), &adapter_dir, "eval_on_start = true\n");
    let summary = run_alone(cfg, None, false, &AtomicBool::new(false), &mut Quiet);
    let rows = read_metrics(&summary.run_dir.join("metrics.csv")).unwrap();
    let start = rows.iter().find(|r| r.split == Split::Eval && r.step == 0).unwrap();
    for metric in ["rewards/chosen", "rewards/rejected", "rewards/margins"] {
        assert_eq!(start.metric(metric), Some(0.0), "{metric} at step 0: policy = reference");
    }
    let end = rows.iter().rfind(|r| r.split == Split::Eval).unwrap();
    assert!(end.metric("rewards/margins").unwrap().abs() > 0.0);
    // The adapter kept its shape (r = 4 on every projection) and moved.
    let (cfg, settings) = model::AdapterConfig::read(&summary.run_dir.join("final")).unwrap();
    assert_eq!((cfg.r, settings.target_modules.len()), (4, 7));
    let diff = crate::common::max_diff(
        &tensors(&adapter_dir.join("adapter_model.safetensors")),
        &tensors(&summary.run_dir.join("final/adapter_model.safetensors")),
    );
    assert!(diff > 1e-4, "the adapter did not train");
}

fn pairs() -> Vec<TokenizedPair> {
    let pair = |p: &[u32], c: &[u32], r: &[u32]| TokenizedPair {
        line: 1,
        prompt_ids: p.to_vec(),
        chosen_ids: c.to_vec(),
        rejected_ids: r.to_vec(),
        label: None,
    };
    vec![pair(&[11, 45, 201], &[7, 99, 3, 150], &[42, 8]), pair(&[300, 2], &[17, 17, 88], &[120, 5, 64, 9, 31])]
}

/// The reference log-probs of `pairs`' sequences (chosen, chosen, rejected, rejected).
const REFERENCE: [f32; 4] = [-20.0, -25.0, -22.0, -21.0];

/// The gradients of one DPO micro-batch, keyed by parameter.
fn dpo_grads(policy: &Llama, checkpointing: Option<Checkpointing>) -> GradAccumulator {
    dpo_grads_in(policy, checkpointing, Packing::SharedPrompt)
}

/// [`dpo_grads`] with the batch laid out by `packing`.
fn dpo_grads_in(policy: &Llama, checkpointing: Option<Checkpointing>, packing: Packing) -> GradAccumulator {
    let device = cpu().autodiff();
    let batch = DeviceBatch::new(&data::collate(&pairs(), 0, None, packing), None, &device);
    let reference = REFERENCE.to_vec();
    let loss = LossConfig { beta: 0.1, ..LossConfig::default() };
    let mut grads = GradAccumulator::default();
    forward_backward(&Whole(policy), &batch, Stats::ALL, checkpointing, 1.0, &mut grads, |scores| {
        dpo_loss(&PairScores::from_scores(&batch, scores, &on_device(&reference, &batch)), &loss)
    })
    .unwrap();
    grads
}

/// The same gradients from burn's autodiff through the whole model, head included (TRL's padded
/// rows).
fn autodiff_grads(policy: &Llama) -> GradAccumulator {
    let device = cpu().autodiff();
    let batch = DeviceBatch::new(&data::collate(&pairs(), 0, None, Packing::Padded), None, &device);
    let reference = REFERENCE.to_vec();
    let loss = LossConfig { beta: 0.1, ..LossConfig::default() };
    let scores = dpo_train::dpo::logps::score(policy, &batch, Stats::ALL);
    let loss = dpo_loss(&PairScores::from_scores(&batch, &scores, &on_device(&reference, &batch)), &loss);
    let mut grads = GradAccumulator::default();
    grads.add(policy, &loss.backward());
    grads
}

/// The training step's hand-written LM-head backward (softmax and projection) equals autodiff's
/// through the padded rows, for a tied (llama) and an untied (qwen3) output projection, in every
/// batch layout.
#[test]
fn the_hand_written_head_backward_equals_autodiff() {
    let device = cpu().autodiff();
    for name in ["llama", "qwen3"] {
        let (_, model) = model::load(&fixtures().join("models").join(name), &device).unwrap();
        let autodiff = autodiff_grads(&model);
        for packing in [Packing::Padded, Packing::Packed, Packing::SharedPrompt] {
            let ours = dpo_grads_in(&model, None, packing);
            let head = if name == "llama" { "model.embed_tokens.weight" } else { "lm_head.weight" };
            assert!(ours.grads.contains_key(head));
            assert_same_grads(&autodiff, &ours, &fixtures().join("models").join(name), &model);
        }
    }
}

/// Asserts two computations of one DPO micro-batch's gradients (of `policy`, from `dir`) agree:
/// each entry within `bounds::dpo_gradient` of the gradient's norm (the scale of its terms), at
/// the batch's largest log-prob.
fn assert_same_grads(a: &GradAccumulator, b: &GradAccumulator, dir: &Path, policy: &Llama) {
    assert_eq!(a.grads.keys().collect::<Vec<_>>(), b.grads.keys().collect::<Vec<_>>());
    let batch = DeviceBatch::new(&data::collate(&pairs(), 0, None, Packing::Padded), None, &cpu().autodiff());
    let scores = dpo_train::model::host(&dpo_train::dpo::logps::score(policy, &batch, Stats::Off).logps);
    let logp = scores.iter().chain(&REFERENCE).fold(0f32, |m, x| m.max(x.abs()));
    let seq = pairs().iter().map(|p| p.prompt_ids.len() + p.chosen_ids.len().max(p.rejected_ids.len())).max().unwrap();
    let relative = bounds::dpo_gradient(dir, seq, 4 * seq, 0.1, f64::from(logp));
    let norm = f64::from(dpo_train::model::host(&a.global_norm().unwrap().unwrap())[0]);
    let bound = (relative * norm) as f32;
    for (name, g) in &a.grads {
        let (x, y) = (dpo_train::model::host(g), dpo_train::model::host(&b.grads[name]));
        let worst = x.iter().zip(&y).map(|(p, q)| (p - q).abs()).fold(0.0, f32::max);
        assert!(worst <= bound, "{name}: gradients differ by {worst} (bound {bound:e})");
    }
}

#[test]
fn activation_checkpointing_gives_the_plain_gradients() {
    let device = cpu().autodiff();
    let (_, full) = model::load(&fixtures().join("models/llama"), &device).unwrap();
    let plain = dpo_grads(&full, None);
    assert!(plain.grads.contains_key("model.embed_tokens.weight") && plain.grads.len() > 10);
    let dir = fixtures().join("models/llama");
    assert_same_grads(&plain, &dpo_grads(&full, Some(Checkpointing { dropout_seed: None })), &dir, &full);

    let mut lora = full.no_grad();
    lora.add_lora(&settings(4, &["all-linear"]), &AdapterInit::Fresh { seed: 1 }, &device).unwrap();
    let plain = dpo_grads(&lora, None);
    assert_eq!(plain.grads.len(), 2 * 7 * lora.num_layers(), "only adapters receive gradients");
    assert_same_grads(&plain, &dpo_grads(&lora, Some(Checkpointing { dropout_seed: None })), &dir, &lora);
}

/// Half precision is applied (the logits move) and stays close to f32; the logits are f32.
/// (transformers' own bf16 logits of this model differ from its f32 ones by 0.08 relative.)
#[test]
fn mixed_precision_logits_are_close_to_f32() {
    let device = cpu();
    let (_, model) = model::load(&fixtures().join("models/llama"), &device).unwrap();
    let exact = logits(&model, &device);
    let half_bound = |u: f64| bounds::half_logits(&fixtures().join("models/llama"), IDS[0].len(), u) as f32;
    for (dtype, tolerance) in
        [(FloatDType::BF16, half_bound(bounds::U_BF16)), (FloatDType::F16, half_bound(1.0 / 2048.0))]
    {
        let half = logits(&model.clone().with_compute_dtype(dtype), &device);
        let worst = max_rel_diff(&half, &exact);
        assert!(worst > 0.0 && worst < tolerance, "{dtype:?}: worst relative difference {worst}");
        // A frozen copy stored in half precision computes the same as casting on the fly.
        let stored = logits(&model.clone().cast_params(dtype).with_compute_dtype(dtype), &device);
        assert_eq!(stored, half, "{dtype:?}");
    }
}
