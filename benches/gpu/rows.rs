//! One comparison row against TRL on `cuda:0` (the throughput, scale and targets sections):
//! dpo-train's pairs/s, MFU against the matrix-product peak measured here and peak CUDA memory,
//! then TRL's variants and the ratios.

use std::fmt::Write as _;
use std::path::Path;

use burn::tensor::{Device, FloatDType, Tensor};

use super::common::{Shape, dpo_train_rate_at, pair_forward_flops, passes, try_trl_rate};

/// One comparison: a model and its pairs, dpo-train's precision and packing, TRL beside it or not.
pub struct Row<'a> {
    pub name: &'a str,
    pub model: &'a Path,
    pub shape: &'a Shape,
    pub data: &'a Path,
    /// (pairs a step, steps, max_length)
    pub run: (usize, usize, usize),
    pub bf16: bool,
    pub padding_free: bool,
    /// Gradient checkpointing on both sides (TRL 1.16's default; off in the other sections).
    pub checkpointing: bool,
    /// TRL's side: as installed (and, in half precision, without cuDNN's attention), or, with
    /// `liger`, as installed and with Liger's kernels (`use_liger_kernel=True`); none without `with_trl`.
    pub with_trl: bool,
    pub liger: bool,
    /// LoRA adapters of rank 16 on q_proj and v_proj (PEFT's default targets) over a frozen base,
    /// on both sides; its useful work a step is three forwards (the policy's, its backward to the
    /// inputs only, the reference's), where full fine-tuning's backward also takes the weights'.
    pub lora: bool,
}

/// One row's line: dpo-train's pairs/s, MFU (against `peak`, the matrix-product FLOP/s of the
/// row's precision) and peak CUDA memory, then TRL's and the ratio.
pub fn compare(row: &Row, peak: f64, out: &Path, failures: &mut Vec<String>) -> String {
    let (_, _, max_length) = row.run;
    let forwards = if row.lora { passes(true) - 1.0 } else { passes(true) };
    let flops = pair_forward_flops(row.data, row.model, row.shape, max_length) * forwards;
    let mut ours_flags = vec!["--device", "cuda:0"];
    ours_flags.extend(if row.bf16 { &["--bf16"][..] } else { &[] });
    ours_flags.extend(if row.padding_free { &[][..] } else { &["--padding-free", "false"] });
    ours_flags.extend(if row.checkpointing { &["--gradient-checkpointing", "true"][..] } else { &[] });
    ours_flags.extend(if row.lora { &["--lora-r", "16", "--lora-alpha", "32"][..] } else { &[] });
    let mut trl_flags = vec!["--device", "cuda"];
    trl_flags.extend(if row.bf16 { &["--bf16"][..] } else { &[] });
    trl_flags.extend(if row.checkpointing { &["--gradient-checkpointing"][..] } else { &[] });
    trl_flags.extend(if row.lora { &["--lora-r", "16"][..] } else { &[] });
    let trl_flags = trl_flags.as_slice();
    let ours = dpo_train_rate_at(row.model, row.data, out, row.run, &ours_flags);
    let mfu = |rate: f64| 100.0 * rate * flops / peak;
    let mut text = format!(
        "{}, reference every step ({:.2} useful GFLOP a pair): dpo-train {:.1} pairs/s (MFU {:.1}%, peak CUDA allocated {:.2} GiB, run {:.0} s)",
        row.name,
        flops / 1e9,
        ours.pairs_per_second,
        mfu(ours.pairs_per_second),
        ours.cuda_peak_bytes.unwrap_or(f64::NAN) / f64::from(1u32 << 30),
        ours.wall_seconds
    );
    // TRL as installed, then, in half precision, with cuDNN's attention off as dpo-train runs.
    let mut variants = Vec::new();
    if row.with_trl {
        variants.push(("TRL", trl_flags.to_vec()));
    }
    if row.with_trl && row.bf16 && !row.liger {
        variants.push(("TRL without cuDNN's attention", [trl_flags, &["--no-cudnn-attention"]].concat()));
    }
    if row.with_trl && row.liger {
        variants.push(("TRL with Liger's kernels", [trl_flags, &["--liger"]].concat()));
    }
    for (who, flags) in &variants {
        match try_trl_rate(row.model, row.data, row.run, flags) {
            Ok(theirs) => {
                let _ = write!(
                    text,
                    "; {who} {:.1} pairs/s (MFU {:.1}%, peak CUDA allocated {:.2} GiB, run {:.0} s), {:.2}x",
                    theirs.pairs_per_second,
                    mfu(theirs.pairs_per_second),
                    theirs.peak_bytes / f64::from(1u32 << 30),
                    theirs.wall_seconds,
                    ours.pairs_per_second / theirs.pairs_per_second
                );
            }
            Err(e) => {
                let _ = write!(text, "; {who} did not run: {e}");
                failures.push(format!("{who} on cuda ({}): {}", row.name, e.lines().last().unwrap_or_default()));
            }
        }
    }
    text.push_str(if row.with_trl { "\n" } else { "; TRL not run for this row\n" });
    print!("{text}"); // progress, row by row
    text
}

/// The best of a few large square matrix products on `cuda:0` in `dtype`, FLOP/s.
#[allow(deprecated)]
pub fn cuda_matmul_peak(dtype: FloatDType) -> f64 {
    use burn::tensor::Distribution;
    let device = Device::libtorch_cuda(0);
    let mut best: f64 = 0.0;
    for n in [4096usize, 8192] {
        let a = Tensor::<2>::random([n, n], Distribution::Default, &device).cast(dtype);
        let b = Tensor::<2>::random([n, n], Distribution::Default, &device).cast(dtype);
        for _ in 0..5 {
            tch::Cuda::synchronize(0);
            let started = std::time::Instant::now();
            let c = a.clone().matmul(b.clone());
            let _ = c.slice([0..1, 0..1]).into_data(); // waits for the product
            best = best.max(2.0 * (n * n * n) as f64 / started.elapsed().as_secs_f64());
        }
    }
    best
}
