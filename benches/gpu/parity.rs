//! The GPU's numbers against the CPU's: packed rows' attention (torch's variable-length kernel
//! against the CPU's padded span batch) and 20 training steps of the medium model in f32 and bf16
//! against the CPU's f32 steps (`make gpu-check`'s `attention` and `parity` sections).

use std::fmt::Write as _;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;

use burn::tensor::{Device, FloatDType, Tensor};

use crate::common;
use crate::common::precision::{Drift, STEPS, step_line, trajectory};

/// One packed row of two shared-prompt pairs (the rejected completions attend to their prompt)
/// on cuda:0, where torch's variable-length kernel attends it, against the padded span batch on
/// the CPU in f32 (the path the CPU tests check against attention written out): the output and
/// the gradients of q, k and v, 8 query heads on 4 key/value heads of 64, in f32 and bf16.
#[allow(deprecated)]
pub fn attention(failures: &mut Vec<String>) -> String {
    use burn::tensor::Distribution;
    use dpo_train::data::Span;
    use dpo_train::model::fused::{Spans, causal_attention, varlen_backward_failure, varlen_failure, varlen_ran};
    let spans = || {
        let span = |start, len, prefix| Span { start, len, prefix };
        let list = vec![
            span(0, 190, None),
            span(190, 120, Some((0, 40))),
            span(310, 130, None),
            span(440, 200, Some((310, 30))),
        ];
        std::sync::Arc::new(Spans::new(list))
    };
    let cpu = Device::libtorch().autodiff();
    let t = |h| Tensor::<4>::random([1, h, 640, 64], Distribution::Normal(0.0, 1.0), &Device::libtorch());
    let (q, k, v, w) = (t(8), t(4), t(4), t(8));
    // [output, dq, dk, dv] of Σ w ⊙ attention on `device` in `dtype`, as f32 host data.
    let run = |device: &Device, dtype: FloatDType| {
        let on = |x: &Tensor<4>| Tensor::<4>::from_data(x.clone().into_data(), device).cast(dtype);
        let (q, k, v) = (on(&q).require_grad(), on(&k).require_grad(), on(&v).require_grad());
        let y = causal_attention(q.clone(), k.clone(), v.clone(), spans());
        let grads = (y.clone() * on(&w)).sum().backward();
        let grad = |x: &Tensor<4>| x.grad(&grads).expect("a gradient");
        [y, grad(&q), grad(&k), grad(&v)].map(|x| x.cast(FloatDType::F32).into_data().to_vec::<f32>().expect("f32"))
    };
    let reference = run(&cpu, FloatDType::F32);
    let mut text = String::from("largest difference over the largest value, output / dq / dk / dv:\n");
    for (name, dtype, tol) in [("f32", FloatDType::F32, 1e-4), ("bf16", FloatDType::BF16, 2e-2)] {
        let got = catch_unwind(AssertUnwindSafe(|| run(&Device::libtorch_cuda(0).autodiff(), dtype)));
        let Ok(got) = got else {
            failures.push(format!("attention on cuda:0 ({name}) panicked"));
            let _ = writeln!(text, "{name}: panicked");
            continue;
        };
        let rel: Vec<f64> = got
            .iter()
            .zip(&reference)
            .map(|(g, r)| {
                let diff = g.iter().zip(r).map(|(a, b)| f64::from((a - b).abs())).fold(0.0, f64::max);
                diff / r.iter().map(|b| f64::from(b.abs())).fold(0.0, f64::max)
            })
            .collect();
        let ok = rel.iter().all(|&d| d <= tol);
        let shown: Vec<String> = rel.iter().map(|d| format!("{d:.1e}")).collect();
        let _ =
            writeln!(text, "{name}: {} (allowed {tol:.0e}): {}", shown.join(" / "), if ok { "ok" } else { "FAILED" });
        if !ok {
            failures.push(format!("packed attention on cuda:0 ({name}) differs from the CPU: {}", shown.join(" / ")));
        }
    }
    match varlen_failure() {
        None if varlen_ran() => {
            text.push_str("torch's variable-length kernel ran (flash attention in bf16, memory-efficient in f32)\n");
            if let Some(e) = varlen_backward_failure() {
                failures.push(format!("the variable-length kernel's backward failed, torch's autograd took over: {e}"));
                let _ = writeln!(text, "its own backward FAILED and torch's autograd differentiated it instead: {e}");
            }
        }
        None => {
            failures.push("the variable-length kernel never ran on cuda:0".to_owned());
            text.push_str("the variable-length kernel never ran: FAILED\n");
        }
        Some(e) => {
            failures.push(format!("the variable-length kernel failed, packed rows fell back to padded batches: {e}"));
            let _ = writeln!(text, "the variable-length kernel FAILED and the padded batch ran instead: {e}");
        }
    }
    text
}

/// The medium model 20 steps on cuda:0 in f32 and bf16 against 20 steps on the CPU in f32:
/// per-step loss and chosen log-prob side by side, with the largest differences.
///
/// f32 keeps the loss within 1e-3 and the log-prob within 1e-3 relative. bf16 drifts from f32 by
/// its own round-off, compounded over the steps (the weights carry each step's rounded gradients):
/// the CPU's bf16 run, measured against its f32 run and committed (`cargo bench --bench
/// precision`, [`common::precision`]), gives its size, and CUDA's kernels, which round in their own
/// order (flash attention, cuBLAS), may add as much again: twice that drift is allowed.
pub fn parity(work: &Path, out: &Path, failures: &mut Vec<String>) -> String {
    let (model, data) = common::precision::inputs(work);
    let cpu = trajectory(&model, &data, out, "cpu", &[]);
    let mut text = String::new();
    let bf16_bound = match common::precision::cpu_bf16_drift() {
        Ok((d, files)) => {
            let names: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
            let _ = writeln!(
                text,
                "bf16's own drift from f32 on the CPU: loss {:.2e}, log-prob {:.2e} relative ({})\n",
                d.loss,
                d.logp,
                names.join(", ")
            );
            d.doubled()
        }
        Err(e) => {
            failures.push(format!("bf16 has no bound: {e}"));
            let _ = writeln!(text, "bf16 has no bound: {e}\n");
            Drift { loss: f64::NAN, logp: f64::NAN }
        }
    };
    let f32_bound = Drift { loss: 1e-3, logp: 1e-3 };
    for (name, flags, bound) in [("f32", &[][..], f32_bound), ("bf16", &["--bf16"][..], bf16_bound)] {
        let gpu = trajectory(&model, &data, out, "cuda:0", flags);
        let _ =
            writeln!(text, "{name} on cuda:0 against f32 on the CPU: step, loss cuda / cpu, logps/chosen cuda / cpu");
        for (step, (g, c)) in gpu.iter().zip(&cpu).enumerate() {
            let _ = writeln!(text, "{}", step_line(step + 1, *g, *c));
        }
        let d = Drift::between(&gpu, &cpu);
        let ok = gpu.len() == STEPS && d.within(&bound);
        let _ = writeln!(
            text,
            "{name}: largest loss difference {:.2e} (allowed {:.1e}), largest relative log-prob difference {:.2e} (allowed {:.1e}): {}\n",
            d.loss,
            bound.loss,
            d.logp,
            bound.logp,
            if ok { "ok" } else { "FAILED" }
        );
        if !ok {
            failures
                .push(format!("{name} on cuda:0 differs from the CPU: loss {:.2e}, log-prob {:.2e}", d.loss, d.logp));
        }
    }
    text
}
