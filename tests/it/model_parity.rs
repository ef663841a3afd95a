//! Logits of every supported architecture against transformers' float32 forward, on the tiny
//! random models made by `tests/gen/make_fixtures.py` (llama with llama3 RoPE and tied embeddings,
//! sharded mistral, qwen2 stored in bf16 with q/k/v biases, qwen3 stored in f16 with q/k norms
//! and an explicit head_dim), for inference and for training forward passes.

use std::path::PathBuf;

use burn::tensor::{Device, Int, Tensor, TensorData};
use serde::Deserialize;

#[derive(Deserialize)]
struct Expected {
    input_ids: Vec<Vec<i64>>,
    attention_mask: Vec<Vec<i64>>,
    /// Per sequence, the logits of its non-padded positions.
    logits: Vec<Vec<Vec<f32>>>,
}

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

#[allow(deprecated)] // burn's libtorch device is deprecated upstream; it is this project's backend.
fn cpu() -> Device {
    Device::libtorch()
}

/// On the plain device (inference: torch's fused attention) and on the autodiff one (training:
/// attention from differentiable operations); the batch as it is (26 rows, fewer than the models'
/// 64 inputs: each projection on its own) and repeated three times (78 rows: a layer's q/k/v and
/// gate/up projections joined into one product each, `model::linear::Linear::forward_group`).
fn check(name: &str) {
    for repeats in [1, 3] {
        check_on(name, &cpu(), repeats);
        check_on(name, &cpu().autodiff(), repeats);
    }
}

fn check_on(name: &str, device: &Device, repeats: usize) {
    let dir = fixtures().join("models").join(name);
    let text = std::fs::read_to_string(fixtures().join(format!("expected/logits_{name}.json"))).unwrap();
    let expected: Expected = serde_json::from_str(&text).unwrap();
    let device = device.clone();
    let (cfg, model) = dpo_train::model::load(&dir, &device).unwrap();
    let (b, s) = (expected.input_ids.len(), expected.input_ids[0].len());
    let ids: Vec<i64> = expected.input_ids.concat().repeat(repeats);
    let input = Tensor::<2, Int>::from_data(TensorData::new(ids, [b * repeats, s]), &device);
    let logits = model.forward(input).into_data().convert::<f32>();
    let logits = logits.as_slice::<f32>().unwrap();
    let v = cfg.vocab_size;
    let mut worst = 0f32;
    for row in 0..b * repeats {
        let want_row = row % b; // the expected row this one repeats
        for (t, _) in expected.attention_mask[want_row].iter().enumerate().filter(|(_, m)| **m == 1) {
            for (j, &want) in expected.logits[want_row][t].iter().enumerate() {
                let got = logits[(row * s + t) * v + j];
                let err = (got - want).abs() / want.abs().max(1.0);
                worst = worst.max(err);
            }
        }
    }
    // Two f32 forwards of this model over s positions: at most twice the chain's error.
    let bound = crate::common::bounds::llama_logits(&dir, s);
    assert!(
        f64::from(worst) <= bound,
        "{name} (autodiff: {}, batch repeated {repeats}x): worst relative logit error {worst:e} (bound {bound:e})",
        device.is_autodiff()
    );
}

#[test]
fn llama_matches_transformers() {
    check("llama");
}

#[test]
fn mistral_sharded_matches_transformers() {
    check("mistral");
}

#[test]
fn qwen2_bf16_weights_match_transformers() {
    check("qwen2");
}

#[test]
fn qwen3_f16_weights_match_transformers() {
    check("qwen3");
}
