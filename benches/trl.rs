//! `make bench-trl`: dpo-train against TRL's `DPOTrainer` (the venv's TRL 1.16, transformers,
//! torch) on the same machine, in one run, side by side: the same model (saved in Hugging Face
//! format, loaded by both), the same preference pairs, batch size, `max_length`, loss, optimizer,
//! precision and number of threads. Each side trains one epoch; steps 2..N are timed
//! (`benches/trl_dpo.py` times TRL with a step callback, the same span as our `metrics.csv`
//! gives).
//!
//! The workload is a chat-sized one: a 32M-parameter Llama (hidden 512, 8 layers, 8 heads / 4
//! key-value heads, vocabulary 8192), 256 pairs whose sequences (prompt + completion) run 150-250
//! tokens, 4 pairs a step, `max_length` 512, f32. `BENCH_TRL_PROMPT=LO-HI` draws the prompts'
//! lengths from another range (default 16-96 tokens), to check that the ratios do not hang on one
//! prompt share.
//!
//! Rows: equal settings with the reference computed every step, equal settings with precomputed
//! reference log-probs, and each side's best (the faster of f32 and bf16, reference precomputed;
//! the bf16 rows are skipped on a CPU without bf16 matrix units, where torch's bf16 product runs its
//! scalar reference loop).
//! Each row prints both sides' model-FLOPs utilisation against the best matrix product in its dtype
//! measured in this run (the higher of before and after the runs): useful FLOPs only (each pair's
//! two sequences at their own length, PaLM's count; padding does not count, and neither does work
//! an implementation saves).

mod common;

use burn::tensor::FloatDType;
use common::{GQA32M, dpo_train_rate_at, matmul_peak, pair_forward_flops, passes, trl_rate};

const BATCH: usize = 4;
const PAIRS: usize = 256;
/// One epoch.
const STEPS: usize = PAIRS / BATCH;
const MAX_LENGTH: usize = 512;

/// `LO-HI` from `BENCH_TRL_PROMPT`, else 16-96.
fn prompt_range() -> std::ops::RangeInclusive<usize> {
    let text = std::env::var("BENCH_TRL_PROMPT").unwrap_or_default();
    let parsed = text.split_once('-').and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)));
    match parsed {
        Some((lo, hi)) if 1 <= lo && lo <= hi && hi < 149 => lo..=hi,
        _ if text.is_empty() => 16..=96,
        _ => {
            eprintln!("BENCH_TRL_PROMPT must be LO-HI with 1 <= LO <= HI < 149, got `{text}`");
            std::process::exit(1);
        }
    }
}

fn main() {
    let work = common::root().join("target/bench-assets");
    std::fs::create_dir_all(&work).expect("target/bench-assets");
    let model = common::model_dir(&work.join("gqa32m"), &GQA32M);
    let prompt = prompt_range();
    let name = format!("pairs-{}-{}.jsonl", prompt.start(), prompt.end());
    let data = common::sized_pairs(&work.join(name), &model, PAIRS, prompt.clone(), 150..=250, 1);
    let out = tempfile::tempdir().expect("a temporary directory");
    let ours = |flags: &[&str]| {
        dpo_train_rate_at(&model, &data, out.path(), (BATCH, STEPS, MAX_LENGTH), flags).pairs_per_second
    };
    let theirs = |flags: &[&str]| trl_rate(&model, &data, (BATCH, STEPS, MAX_LENGTH), flags).pairs_per_second;
    let forward = pair_forward_flops(&data, &model, &GQA32M, MAX_LENGTH);
    let (live, precomputed) = (forward * passes(true), forward * passes(false));
    // The peaks are measured before and after the runs and the higher kept: on a shared machine
    // one measurement can catch a slow moment and put an MFU above 100%.
    let peaks = || (matmul_peak(FloatDType::F32), matmul_peak(FloatDType::BF16));
    let before = peaks();
    // Without bf16 matrix units (AVX2 only) torch multiplies bf16 in its scalar reference loop, at
    // a small fraction of f32's rate: an epoch would take hours on each side and nobody trains so.
    let bf16 = before.1 >= before.0 / 2.0;
    let rates = [
        (ours(&[]), theirs(&[])),
        (ours(&["--precompute-ref-log-probs"]), theirs(&["--precompute"])),
        match bf16 {
            true => (ours(&["--precompute-ref-log-probs", "--bf16"]), theirs(&["--precompute", "--bf16"])),
            false => (0.0, 0.0),
        },
    ];
    let after = peaks();
    let (f32_peak, bf16_peak) = (before.0.max(after.0), before.1.max(after.1));

    println!(
        "DPO training, 32M Llama (hidden 512, 8 layers, 8/4 heads, vocabulary 8192), {PAIRS} pairs of 150-250 tokens \
         (prompts {}-{}), {BATCH} pairs a step, max_length {MAX_LENGTH}, one epoch, {} threads",
        prompt.start(),
        prompt.end(),
        common::torch_threads()
    );
    println!(
        "MFU: useful model FLOPs ({:.3} GFLOP in a pair's forward: no padding, each prompt once, the LM head where a \
         completion token is predicted) over the best matrix product in the row's dtype, {:.0} GFLOP/s f32, {:.0} GFLOP/s bf16 \
         (the higher of before and after the runs)",
        forward / 1e9,
        f32_peak / 1e9,
        bf16_peak / 1e9
    );
    println!(
        "{:<42} {:>10} {:>10} {:>9} {:>8} {:>8}",
        "pairs/s", "dpo-train", "TRL", "ours/TRL", "MFU ours", "MFU TRL"
    );
    let row = |label: &str, (a, peak_a): (f64, f64), (b, peak_b): (f64, f64), flops: f64| {
        let mfu = |rate: f64, peak: f64| 100.0 * rate * flops / peak;
        println!("{label:<42} {a:>10.3} {b:>10.3} {:>8.2}x {:>7.1}% {:>7.1}%", a / b, mfu(a, peak_a), mfu(b, peak_b));
    };
    let [(our_live, trl_live), (our_f32, trl_f32), (our_bf16, trl_bf16)] = rates;
    row("f32, reference every step", (our_live, f32_peak), (trl_live, f32_peak), live);
    row("f32, precomputed reference", (our_f32, f32_peak), (trl_f32, f32_peak), precomputed);
    if !bf16 {
        println!(
            "bf16 rows skipped: this CPU multiplies bf16 at {:.0} GFLOP/s against {:.0} f32 (no bf16 matrix units); \
             each side's best is its f32 row",
            bf16_peak / 1e9,
            f32_peak / 1e9
        );
        return;
    }
    row("bf16, precomputed reference", (our_bf16, bf16_peak), (trl_bf16, bf16_peak), precomputed);
    // Each side's faster precision, with that precision's peak.
    let best = |f: f64, b: f64| if f >= b { (f, f32_peak) } else { (b, bf16_peak) };
    row("best of each (f32 or bf16, precomputed)", best(our_f32, our_bf16), best(trl_f32, trl_bf16), precomputed);
}
