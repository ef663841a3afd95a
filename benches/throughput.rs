//! `make bench` (throughput): DPO training pairs/s and tokens/s on a small (hidden 256, 4 layers)
//! and the medium model (hidden 768, 12 layers, 12 heads), 512-token sequences; evaluation
//! pairs/s; generation tokens/s; then how the cost grows with `max_length` (256 to 2048 tokens on
//! the medium model, every sequence that long), dpo-train's and TRL's `DPOTrainer`'s side by side.
//! Each line prints its model FLOPs utilisation: the model FLOP/s
//! achieved (policy forward + backward, plus the reference forward when it runs every step;
//! PaLM's count, [`common::forward_flops_per_token`]) over the best square matrix product
//! measured on the same backend, in the same precision, at the start of this run.
//!
//! Timings are printed, never asserted.

mod common;

use std::path::Path;
use std::time::Instant;

use burn::tensor::{Device, FloatDType};
use common::{
    MEDIUM, SMALL, Shape, dpo_train_rate, dpo_train_rate_at, forward_flops_per_token, matmul_peak, pair_forward_flops,
    passes, trl_rate,
};
use dpo_train::config::LossConfig;
use dpo_train::data::tokenizer::Tokenizer;
use dpo_train::eval::{EvalOptions, evaluate};
use dpo_train::model::generate::{SamplingConfig, generate, rng};

const SEQ_LEN: usize = 512;

#[allow(deprecated)] // burn's libtorch device is deprecated upstream; it is this project's backend.
/// Every section, or those named (`cargo bench --bench throughput -- growth`): `training`,
/// `evaluation`, `generation`, `growth`, `attention`, `optimizer`.
fn main() {
    let named: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let runs = |section: &str| named.is_empty() || named.iter().any(|n| n == section);
    let work = common::root().join("target/bench-assets");
    std::fs::create_dir_all(&work).expect("target/bench-assets");
    let data = common::long_pairs(&work.join("long-pairs.jsonl"), 64);
    let out = tempfile::tempdir().expect("a temporary directory");
    let peak_f32 = matmul_peak(FloatDType::F32);
    println!(
        "libtorch CPU, {} threads; matrix-multiply peak {:.0} GFLOP/s f32",
        common::torch_threads(),
        peak_f32 / 1e9
    );
    if runs("training") {
        let peak_bf16 = matmul_peak(FloatDType::BF16);
        println!("matrix-multiply peak {:.0} GFLOP/s bf16", peak_bf16 / 1e9);
        training(&work, &data, out.path(), (peak_f32, peak_bf16));
    }
    let device = Device::libtorch();
    let model = common::model_dir(&work.join("medium"), &MEDIUM);
    if runs("evaluation") {
        evaluation(&model, &data, &MEDIUM, peak_f32, &device);
    }
    if runs("generation") {
        generation(&model, &MEDIUM, peak_f32, &device);
    }
    if runs("growth") {
        growth(&work, out.path(), peak_f32);
    }
    if runs("attention") {
        attention(&MEDIUM, peak_f32);
    }
    if runs("optimizer") {
        optimizer(&work);
    }
}

/// DPO training of the small and medium models, f32 with the reference every step and bf16
/// with it precomputed.
fn training(work: &Path, data: &Path, out: &Path, (peak_f32, peak_bf16): (f64, f64)) {
    println!("DPO training, {SEQ_LEN}-token sequences, steps 2..N timed");
    for (name, shape, batch, steps) in [("small", &SMALL, 8, 6), ("medium", &MEDIUM, 2, 5)] {
        let model = common::model_dir(&work.join(name), shape);
        let forward = pair_forward_flops(data, &model, shape, SEQ_LEN);
        println!("  {name}: {:.3} useful GFLOP in a pair's forward", forward / 1e9);
        for (label, flags, peak, reference) in [
            ("f32, reference every step", &[][..], peak_f32, true),
            ("bf16, precomputed reference", &["--bf16", "--precompute-ref-log-probs"][..], peak_bf16, false),
        ] {
            let rate = dpo_train_rate(&model, data, out, batch, steps, flags);
            let mfu = rate.pairs_per_second * forward * passes(reference) / peak;
            println!(
                "  {name:<6} {label:<29} {:7.2} pairs/s {:9.0} tokens/s   MFU {:5.1}%",
                rate.pairs_per_second,
                rate.tokens_per_second,
                100.0 * mfu
            );
        }
    }
}

/// Training cost against `max_length`: every sequence is `max_length` tokens (prompts of 32-64),
/// 2 pairs a step, f32, the reference computed every step; the same pairs and steps for TRL. Each
/// run's peak is its resident memory while training (dpo-train's report; `trl_dpo.py` resets and
/// reads `VmHWM` likewise).
fn growth(work: &Path, out: &Path, peak: f64) {
    const BATCH: usize = 2;
    let model = common::model_dir(&work.join("medium"), &MEDIUM);
    let gib = |b: Option<f64>| b.map_or("-".to_owned(), |b| format!("{:.2}", b / f64::from(1u32 << 30)));
    println!(
        "growth with max_length: medium, {BATCH} pairs a step, f32, reference every step, sequences max_length long"
    );
    println!(
        "  {:>10} {:>9} {:>10} {:>6} {:>9} | {:>9} {:>10} {:>6} {:>9} | {:>8}",
        "max_length", "pairs/s", "tokens/s", "MFU%", "peak GiB", "TRL p/s", "TRL tok/s", "MFU%", "peak GiB", "ours/TRL"
    );
    let (mut ours_peaks, mut trl_peaks) = (Vec::new(), Vec::new());
    for len in [256, 512, 1024, 2048] {
        let data = common::sized_pairs(&work.join(format!("full-{len}.jsonl")), &model, 64, 32..=64, len..=len, 7);
        // Timed steps (2..N) of at least 8k sequence tokens in all, whatever the length.
        let steps = 2 + 2048 / len;
        let ours = dpo_train_rate_at(&model, &data, out, (BATCH, steps, len), &[]);
        let theirs = trl_rate(&model, &data, (BATCH, steps, len), &[]);
        let tokens = |pairs_per_second: f64| pairs_per_second * 2.0 * len as f64;
        let flops = pair_forward_flops(&data, &model, &MEDIUM, len) * passes(true);
        let mfu = |pairs_per_second: f64| 100.0 * pairs_per_second * flops / peak;
        println!(
            "  {len:>10} {:>9.2} {:>10.0} {:>6.1} {:>9} | {:>9.2} {:>10.0} {:>6.1} {:>9} | {:>7.2}x",
            ours.pairs_per_second,
            tokens(ours.pairs_per_second),
            mfu(ours.pairs_per_second),
            gib(ours.peak_bytes),
            theirs.pairs_per_second,
            tokens(theirs.pairs_per_second),
            mfu(theirs.pairs_per_second),
            gib(Some(theirs.peak_bytes)),
            ours.pairs_per_second / theirs.pairs_per_second
        );
        ours_peaks.extend(ours.peak_bytes.map(|b| (len as f64, b)));
        trl_peaks.push((len as f64, theirs.peak_bytes));
    }
    for (who, points) in [("dpo-train", &ours_peaks), ("TRL", &trl_peaks)] {
        if let Some((base, slope, residual)) = linear_fit(points) {
            println!(
                "  {who} peak memory, least squares over max_length: {:.2} GiB + {:.2} GiB per 1k tokens of max_length, \
                 largest residual {:.1}%",
                base / f64::from(1u32 << 30),
                slope * 1024.0 / f64::from(1u32 << 30),
                100.0 * residual
            );
        }
    }
}

/// Least squares `y = a + b·x` over `points`: `(a, b, largest |residual| / y)`; `None` under two points.
fn linear_fit(points: &[(f64, f64)]) -> Option<(f64, f64, f64)> {
    let n = points.len() as f64;
    if points.len() < 2 {
        return None;
    }
    let (mx, my) = (points.iter().map(|p| p.0).sum::<f64>() / n, points.iter().map(|p| p.1).sum::<f64>() / n);
    let sxy: f64 = points.iter().map(|(x, y)| (x - mx) * (y - my)).sum();
    let sxx: f64 = points.iter().map(|(x, _)| (x - mx) * (x - mx)).sum();
    let b = sxy / sxx;
    let a = my - b * mx;
    let residual = points.iter().map(|(x, y)| ((a + b * x - y) / y).abs()).fold(0.0, f64::max);
    Some((a, b, residual))
}

/// torch's fused causal attention alone (`model::fused::causal_attention`, what training runs),
/// forward and backward on the medium model's heads at each growth length, 2048 positions a call:
/// the rate the attention share of a long sequence's FLOPs runs at, against the matrix-product
/// peak. Its products have the head dimension (64) as their inner size, which caps them well below
/// a square product's rate on CPUs.
#[allow(deprecated)] // burn's libtorch device is deprecated upstream; it is this project's backend.
fn attention(shape: &Shape, peak: f64) {
    use burn::tensor::{Distribution, Tensor};
    let device = Device::libtorch().autodiff();
    let (heads, dim) = (shape.heads, shape.hidden / shape.heads);
    println!("attention alone: torch's fused causal kernel, {heads} heads of {dim}, f32, forward + backward");
    for len in [256, 512, 1024, 2048] {
        let rows = 2048 / len;
        let t = || Tensor::<4>::random([rows, heads, len, dim], Distribution::Normal(0.0, 1.0), &device).require_grad();
        let (q, k, v) = (t(), t(), t());
        let pass = || {
            let spans = dpo_train::model::fused::Spans::none();
            let out = dpo_train::model::fused::causal_attention(q.clone(), k.clone(), v.clone(), spans);
            let grads = out.sum().backward();
            let _ = q.grad(&grads).map(|g| g.slice([0..1, 0..1, 0..1, 0..1]).into_data());
        };
        pass();
        let started = Instant::now();
        for _ in 0..3 {
            pass();
        }
        let seconds = started.elapsed().as_secs_f64() / 3.0;
        // q·kᵀ and p·v over the causal half, forward (1x) and backward (2x).
        let flops = 3.0 * (rows * heads) as f64 * 2.0 * 2.0 * (len * len * dim) as f64 / 2.0;
        println!(
            "  {len:>5} tokens x {rows}: {:6.1} ms   {:5.1} GFLOP/s   {:4.1}% of the matrix-product peak",
            seconds * 1e3,
            flops / seconds / 1e9,
            100.0 * flops / seconds / peak
        );
    }
}

/// One AdamW update (`train::optim::AdamW::step`, torch's fused kernel) of every parameter of the
/// 32M and the medium model from fixed gradients, as a training step runs it: eight updates, each
/// timed until the new values are readable.
#[allow(deprecated)] // burn's libtorch device is deprecated upstream; it is this project's backend.
fn optimizer(work: &Path) {
    use burn::tensor::{Distribution, Tensor};
    use dpo_train::model::params;
    use dpo_train::train::optim::{AdamW, AdamWConfig, GradAccumulator};
    let cfg = AdamWConfig { beta1: 0.9, beta2: 0.999, epsilon: 1e-8, weight_decay: 0.01 };
    for (name, shape) in [("gqa32m", &common::GQA32M), ("medium", &MEDIUM)] {
        let dir = common::model_dir(&work.join(name), shape);
        let (_, mut model) = dpo_train::model::load(&dir, &Device::libtorch().autodiff()).expect("the model loads");
        let (mut grads, mut count) = (GradAccumulator::default(), 0);
        params::visit(&model, None, |p| {
            count += p.numel();
            let grad = Tensor::<1>::random([p.numel()], Distribution::Normal(0.0, 1e-3), &Device::libtorch());
            grads.grads.insert(p.name, grad);
        });
        let mut opt = AdamW::default();
        let mut ms = Vec::new();
        for _ in 0..8 {
            let started = Instant::now();
            model = opt.step(model, &grads, 1e-4, &cfg).expect("the update runs");
            params::visit(&model, None, |p| drop(p.flat().narrow(0, 0, 1).into_data()));
            ms.push(started.elapsed().as_secs_f64() * 1e3);
        }
        let shown: Vec<String> = ms.iter().map(|m| format!("{m:.0}")).collect();
        println!("AdamW update, {name} ({:.1}M parameters): {} ms", count as f64 / 1e6, shown.join(" "));
    }
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
        config: None,
        loss: LossConfig::default(),
        truncation: Some(SEQ_LEN).into(),
        batch_size: 4,
        metrics_batch: None,
        packing: dpo_train::data::Packing::SharedPrompt,
        device: device.clone(),
    };
    let started = Instant::now();
    let report = evaluate(&opts).expect("evaluation runs");
    let seconds = started.elapsed().as_secs_f64();
    let pairs = report.pairs as f64;
    // Two forwards (policy, reference) per pair.
    let flops = pairs * 2.0 * pair_forward_flops(data, model, shape, SEQ_LEN);
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
