//! `make bench` (throughput): DPO training pairs/s and tokens/s on a small (hidden 256, 4 layers)
//! and the medium model (hidden 768, 12 layers, 12 heads), 512-token sequences; evaluation
//! pairs/s; generation tokens/s. Each line prints its model FLOPs utilisation: the model FLOP/s
//! achieved (policy forward + backward, plus the reference forward when it runs every step;
//! PaLM's count, [`common::forward_flops_per_token`]) over the best square matrix product
//! measured on the same backend, in the same precision, at the start of this run.
//!
//! Timings are printed, never asserted.

mod common;

use std::path::Path;
use std::time::Instant;

use burn::tensor::{Device, FloatDType};
use common::{MEDIUM, SMALL, Shape, dpo_flops_per_token, dpo_train_rate, forward_flops_per_token, matmul_peak};
use dpo_train::config::LossConfig;
use dpo_train::data::tokenizer::Tokenizer;
use dpo_train::eval::{EvalOptions, evaluate};
use dpo_train::model::generate::{SamplingConfig, generate, rng};

const SEQ_LEN: usize = 512;

#[allow(deprecated)] // burn's libtorch device is deprecated upstream; it is this project's backend.
fn main() {
    let work = common::root().join("target/bench-assets");
    std::fs::create_dir_all(&work).expect("target/bench-assets");
    let data = common::long_pairs(&work.join("long-pairs.jsonl"), 64);
    let out = tempfile::tempdir().expect("a temporary directory");
    let peak_f32 = matmul_peak(FloatDType::F32);
    let peak_bf16 = matmul_peak(FloatDType::BF16);
    println!(
        "libtorch CPU, {} threads; matrix-multiply peak {:.0} GFLOP/s f32, {:.0} GFLOP/s bf16",
        common::torch_threads(),
        peak_f32 / 1e9,
        peak_bf16 / 1e9
    );
    println!("DPO training, {SEQ_LEN}-token sequences, steps 2..N timed");
    for (name, shape, batch, steps) in [("small", &SMALL, 8, 6), ("medium", &MEDIUM, 2, 5)] {
        let model = common::model_dir(&work.join(name), shape);
        for (label, flags, peak, reference) in [
            ("f32, reference every step", &[][..], peak_f32, true),
            ("bf16, precomputed reference", &["--bf16", "--precompute-ref-log-probs"][..], peak_bf16, false),
        ] {
            let rate = dpo_train_rate(&model, &data, out.path(), batch, steps, flags);
            let mfu = rate.tokens_per_second * dpo_flops_per_token(shape, SEQ_LEN, reference) / peak;
            println!(
                "  {name:<6} {label:<29} {:7.2} pairs/s {:9.0} tokens/s   MFU {:5.1}%",
                rate.pairs_per_second,
                rate.tokens_per_second,
                100.0 * mfu
            );
        }
    }
    let device = Device::libtorch();
    let model = common::model_dir(&work.join("medium"), &MEDIUM);
    evaluation(&model, &data, &MEDIUM, peak_f32, &device);
    generation(&model, &MEDIUM, peak_f32, &device);
}

/// `dpo-train eval`'s scoring: the policy and the reference forward over every pair.
fn evaluation(model: &Path, data: &Path, shape: &Shape, peak: f64, device: &Device) {
    let opts = EvalOptions {
        model: model.to_owned(),
        ref_model: Some(model.to_owned()),
        tokenizer: None,
        data: data.to_owned(),
        columns: Default::default(),
        skip_bad_rows: false,
        split: None,
        loss: LossConfig::default(),
        max_length: Some(SEQ_LEN),
        batch_size: 4,
        device: device.clone(),
    };
    let started = Instant::now();
    let report = evaluate(&opts).expect("evaluation runs");
    let seconds = started.elapsed().as_secs_f64();
    let pairs = report.pairs as f64;
    // Two forwards (policy, reference) of 2 sequences per pair.
    let flops = pairs * 2.0 * SEQ_LEN as f64 * 2.0 * forward_flops_per_token(shape, SEQ_LEN);
    println!(
        "evaluation, medium, 4 pairs per pass: {:.2} pairs/s (loading included)   MFU {:.1}%",
        pairs / seconds,
        100.0 * flops / seconds / peak
    );
}

/// Greedy decoding with the KV cache: 8 sequences of 128 new tokens after a 64-token prompt.
fn generation(model_dir: &Path, shape: &Shape, peak: f64, device: &Device) {
    let (_, model) = dpo_train::model::load(model_dir, device).expect("the model loads");
    let tokenizer = Tokenizer::from_dir(model_dir).expect("the tokenizer loads");
    let prompt: Vec<u32> = (0..64).map(|i| (i * 5 % tokenizer.vocab_size()) as u32).collect();
    let cfg = SamplingConfig::greedy(128);
    let started = Instant::now();
    // No stop token, so every sequence runs to its full length.
    let out = generate(&model, &prompt, 8, u32::MAX, &cfg, &mut rng(0), device);
    let seconds = started.elapsed().as_secs_f64();
    let tokens: usize = out.iter().map(Vec::len).sum();
    // Each new token attends to 128 positions on average.
    let flops = tokens as f64 * forward_flops_per_token(shape, 64 + 64);
    println!(
        "generation, medium, 8 x 128 tokens after a 64-token prompt: {:.1} tokens/s   MFU {:.2}%",
        tokens as f64 / seconds,
        100.0 * flops / seconds / peak
    );
}
