//! The GPU check's memory sections:
//! - `offload`: the offloaded optimizer on cuda:0 against the plain step, 20 steps each, f32 and
//!   bf16, full and LoRA: per-step losses, peak CUDA and host memory, the copies' time a step,
//!   check-gpu's estimate beside them (issue 39);
//! - `memory`: dpo-train's peak CUDA memory over a grid of model shapes x micro-batch x activation
//!   checkpointing x LoRA, and the ZeRO stages on two ranks sharing cuda:0 (`--gpus 0,0`, over
//!   Gloo: each rank's own caching allocator, so each rank's peak is what one GPU per rank would
//!   hold), on pairs of fixed lengths so each micro-batch's packed row is known, written as JSON
//!   rows (`results/gpu/memory-<gpu>.json`) for check-gpu's estimate to be held against (issue 34).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::common::{self, GQA32M, MEDIUM, QWEN05B, Shape, TrainRate, dpo_train_rate_at};
use crate::{built, output, pool};
use dpo_train::train::log::{Split, read_metrics};

const GIB: f64 = (1u64 << 30) as f64;

/// Steps of the offload comparison.
const STEPS: usize = 20;

/// The medium model and its pairs of fixed lengths: prompt 128 tokens, each sequence 512.
fn medium(work: &Path) -> (PathBuf, PathBuf, Lengths) {
    // The parity section's model, stored in f32: the offload's bf16 comparison drifts by the
    // arithmetic's rounding there, not by bf16-stored weights' ([`common::precision::inputs`]).
    let model = common::precision::model(work);
    let lengths = Lengths { prompt: 128, total: 512 };
    (model.clone(), lengths.pairs(work, "medium", &model), lengths)
}

/// Every pair's prompt and sequence (prompt + completion + eos) length, in tokens.
#[derive(Clone, Copy)]
struct Lengths {
    prompt: usize,
    total: usize,
}

impl Lengths {
    fn pairs(self, work: &Path, name: &str, model: &Path) -> PathBuf {
        let path = work.join(format!("fixed-{name}-{}-{}.jsonl", self.prompt, self.total));
        let (p, t) = (self.prompt, self.total);
        common::sized_pairs(&path, model, 64, p..=p, t..=t, 3)
    }
}

/// A run's rate and its per-step training losses.
fn run(
    model: &Path,
    data: &Path,
    out: &Path,
    (batch, steps, len): (usize, usize, usize),
    args: &[&str],
) -> (TrainRate, Vec<f64>) {
    let rate = dpo_train_rate_at(model, data, out, (batch, steps, len), args);
    let rows = read_metrics(&out.join(common::run_name(len, args)).join("metrics.csv")).expect("metrics.csv");
    let losses = rows.iter().filter(|r| r.split == Split::Train).map(|r| r.metric("loss").unwrap_or(f64::NAN));
    (rate, losses.collect())
}

/// An estimate's quotient by its measurement as "N.NNx the measured".
fn ratio(quotient: Option<f64>) -> String {
    quotient.map_or_else(|| "?".to_owned(), |q| format!("{q:.2}x the measured"))
}

fn gib(bytes: Option<f64>) -> String {
    bytes.map_or_else(|| "?".to_owned(), |b| format!("{:.2}", b / GIB))
}

/// check-gpu's estimate per GPU for the medium model at 2 pairs of `data` a step, GiB.
fn estimate(model: &Path, data: &Path, flags: &[&str]) -> String {
    let (model, data) = (model.to_str().unwrap_or_default(), data.to_str().unwrap_or_default());
    let mut args = vec!["--model", model, "--data", data, "--global-batch", "2", "--seq-len", "512"];
    args.extend(flags);
    args.push("--json");
    let said = output(&built("check-gpu"), &args);
    let value: Option<serde_json::Value> = serde_json::from_str(&said).ok();
    match value.as_ref().and_then(|v| v["memory_per_gpu_bytes"].as_f64()) {
        Some(bytes) => format!("{:.2}", bytes / GIB),
        None => format!("? ({})", said.lines().next().unwrap_or_default()),
    }
}

/// The offloaded optimizer against the plain one on cuda:0 (issue 39, item 2).
pub fn offload(work: &Path, out: &Path, json: &Path, failures: &mut Vec<String>) -> String {
    let (model, data, lengths) = medium(work);
    let mut text = format!(
        "medium model (110M), 2 pairs a step of 512-token sequences (prompt 128), {STEPS} steps at learning rate 1e-5; \
         peaks in GiB (CUDA allocated / reserved, host resident), check-gpu's estimate for the same run\n"
    );
    // bf16 keeps 8 significant bits: moving the update to the host changes which way a weight
    // rounds, as moving the whole run to the CPU does (the parity section's bound).
    for (precision, flags, tol) in [("f32", &[][..], 1e-3), ("bf16", &["--bf16"][..], 5e-2)] {
        for (mode, extra) in [("full", &[][..]), ("LoRA r 16", &["--lora-r", "16"][..])] {
            let mut args = vec!["--device", "cuda:0", "--learning-rate", "1e-5", "--logging-steps", "1"];
            args.extend(flags);
            args.extend(extra);
            let (plain, plain_losses) = run(&model, &data, out, (2, STEPS, 512), &args);
            args.extend(["--offload-optimizer", "true"]);
            let (off, off_losses) = run(&model, &data, out, (2, STEPS, 512), &args);
            for (rate, offload) in [(&plain, false), (&off, true)] {
                let shape = ("medium", &MEDIUM, "llama");
                let (lora, bf16) = (!extra.is_empty(), !flags.is_empty());
                let measured = Measured {
                    shape,
                    lengths,
                    micro_batch: 2,
                    checkpointing: false,
                    lora,
                    bf16,
                    offload,
                    steps: STEPS,
                    zero: None,
                };
                common::record(json, measured.row(rate)).unwrap_or_else(|e| failures.push(e));
            }
            let diff = plain_losses.iter().zip(&off_losses).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
            let ok = plain_losses.len() == STEPS && off_losses.len() == STEPS && diff <= tol;
            if !ok {
                failures.push(format!("offload ({precision}, {mode}): loss differs from the plain step by {diff:.2e}"));
            }
            let dtype = if flags.is_empty() { "fp32" } else { "bf16" };
            let mut est = vec!["--dtype", dtype];
            est.extend(if extra.is_empty() { &[][..] } else { &["--lora", "16"][..] });
            let plain_est = estimate(&model, &data, &est);
            est.push("--offload-optimizer");
            let _ = writeln!(
                text,
                "{precision} {mode}: largest loss difference over {STEPS} steps {diff:.2e} (allowed {tol:.0e}): {}\n  \
                 plain:     {} / {} CUDA, {} host, {:.1} ms a step; check-gpu {}\n  \
                 offloaded: {} / {} CUDA, {} host, {:.1} ms a step, copies {:.1} ms a step; check-gpu {}",
                if ok { "ok" } else { "FAILED" },
                gib(plain.cuda_peak_bytes),
                gib(plain.cuda_reserved_bytes),
                gib(plain.peak_bytes),
                1e3 * plain.step_seconds,
                plain_est,
                gib(off.cuda_peak_bytes),
                gib(off.cuda_reserved_bytes),
                gib(off.peak_bytes),
                1e3 * off.step_seconds,
                off.offload_copy_ms.unwrap_or(f64::NAN),
                estimate(&model, &data, &est),
            );
            print!(
                "{}",
                text.lines()
                    .rev()
                    .take(3)
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .map(|l| format!("{l}\n"))
                    .collect::<String>()
            );
        }
    }
    text
}

/// One measured run as a row of `results/gpu/memory-<gpu>.json` (what `tests/measured.rs` reads).
struct Measured<'a> {
    shape: (&'a str, &'a Shape, &'a str),
    lengths: Lengths,
    micro_batch: usize,
    checkpointing: bool,
    lora: bool,
    bf16: bool,
    offload: bool,
    steps: usize,
    /// The ZeRO stage of two ranks sharing cuda:0; one rank when `None`.
    zero: Option<&'static str>,
}

impl Measured<'_> {
    /// dpo-train's flags for this cell on `cuda:0` (two ranks sharing it under a ZeRO stage).
    fn args(&self) -> Vec<&'static str> {
        let mut args = match self.zero {
            Some(stage) => vec!["--gpus", "0,0", "--sharding", stage],
            None => vec!["--device", "cuda:0"],
        };
        args.extend(if self.bf16 { &["--bf16"][..] } else { &[] });
        args.extend(if self.checkpointing { &["--gradient-checkpointing", "true"][..] } else { &[] });
        args.extend(if self.lora { &["--lora-r", "16"][..] } else { &[] });
        args
    }

    /// check-gpu's estimate of this run per rank on CUDA, at `tokens` a micro-batch (where
    /// `None`, the cell's fixed lengths').
    fn estimate(
        &self,
        model: &check_gpu::ModelShape,
        tokens: Option<check_gpu::BatchTokens>,
    ) -> check_gpu::MemoryEstimate {
        let sharding = check_gpu::Sharding::ALL.into_iter().find(|s| s.name() == self.zero.unwrap_or("none"));
        let completion = (self.lengths.total - self.lengths.prompt) as u64;
        let fixed = check_gpu::PairTokens { prompt: self.lengths.prompt as u64, completion };
        check_gpu::estimate(&check_gpu::MemoryRequest {
            model,
            micro_batch: self.micro_batch as u64,
            seq_len: self.lengths.total as u64,
            dtype: if self.bf16 { check_gpu::Precision::Bf16 } else { check_gpu::Precision::Fp32 },
            finetune: if self.lora { check_gpu::FineTune::Lora { rank: 16 } } else { check_gpu::FineTune::Full },
            reference: check_gpu::Reference::Keep,
            gradient_checkpointing: self.checkpointing,
            world_size: if self.zero.is_some() { 2 } else { 1 },
            sharding: sharding.unwrap_or(check_gpu::Sharding::None),
            offload_optimizer: self.offload,
            engine: check_gpu::Engine::DpoTrain(tokens.unwrap_or_else(|| fixed.batch(self.micro_batch as u64))),
            cuda: true,
            accumulation: 1,
        })
    }

    /// What the run may take of the GPU: its estimate for every rank and half as much again for
    /// what the caching allocator reserves past its peak; the whole GPU's worth where there is no
    /// estimate (the model unread).
    fn reservation(&self, estimate: Option<&check_gpu::MemoryEstimate>) -> u64 {
        let ranks = if self.zero.is_some() { 2 } else { 1 };
        estimate.map_or(u64::MAX, |e| e.total / 2 * 3 * ranks)
    }

    fn row(&self, rate: &TrainRate) -> serde_json::Value {
        let (name, shape, model_type) = self.shape;
        serde_json::json!({
            "shape": name,
            "model_type": model_type,
            "hidden": shape.hidden, "layers": shape.layers, "heads": shape.heads, "kv_heads": shape.kv_heads,
            "intermediate": shape.intermediate, "vocab": shape.vocab, "tied_embeddings": true,
            "precision": if self.bf16 { "bf16" } else { "fp32" },
            "micro_batch": self.micro_batch,
            "max_length": self.lengths.total,
            "prompt_tokens": self.lengths.prompt,
            "completion_tokens": self.lengths.total - self.lengths.prompt,
            "gradient_checkpointing": self.checkpointing,
            "lora_r": if self.lora { 16 } else { 0 },
            "reference": "keep",
            "sharding": self.zero.unwrap_or("none"),
            "world_size": if self.zero.is_some() { 2 } else { 1 },
            "offload_optimizer": self.offload,
            "steps": self.steps,
            "cuda_allocated_bytes": rate.cuda_peak_bytes,
            "cuda_reserved_bytes": rate.cuda_reserved_bytes,
            "host_resident_bytes": rate.peak_bytes,
        })
    }
}

/// dpo-train's peak CUDA memory over a grid (issue 34, item 3), 3 steps a run (the moments
/// exist from step 2 on), each put in `results/gpu/memory-<gpu>.json` ([`common::record`]). The
/// runs share the GPU, as many at once as 60% of its memory holds by check-gpu's estimates
/// ([`pool`]): each peak is its own process's caching allocator's.
pub fn memory(work: &Path, out: &Path, json: &Path, failures: &mut Vec<String>) -> String {
    let cells = grid();
    // Each shape and its pairs made once, before the runs that share them start.
    let inputs: Vec<(PathBuf, PathBuf)> = cells
        .iter()
        .map(|cell| {
            let (name, shape, model_type) = cell.shape;
            let model = common::generated(work, shape, model_type);
            let data = cell.lengths.pairs(work, name, &model);
            (model, data)
        })
        .collect();
    let jobs = cells
        .iter()
        .zip(&inputs)
        .enumerate()
        .map(|(i, (cell, (model, data)))| {
            let dir = out.join(format!("memory-{i}"));
            let run = move || {
                std::fs::create_dir_all(&dir).expect("a folder for the run");
                let run = (cell.micro_batch, cell.steps, cell.lengths.total);
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    dpo_train_rate_at(model, data, &dir, run, &cell.args())
                }))
                .ok()
            };
            let estimate = check_gpu::ModelShape::from_hf_dir(model).ok().map(|shape| cell.estimate(&shape, None));
            pool::Job {
                bytes: cell.reservation(estimate.as_ref()),
                run: Box::new(run) as Box<dyn FnOnce() -> Option<TrainRate> + Send>,
            }
        })
        .collect();
    let rates = pool::run_within(pool::gpu(), jobs);
    let mut text = String::from(
        "shape, precision, micro-batch x (prompt + 2 completions) tokens, checkpointing, LoRA: peak CUDA allocated / reserved GiB \
         (up to 4 runs at once within 60% of the GPU's memory)\n",
    );
    for (cell, rate) in cells.iter().zip(rates) {
        let Some(rate) = rate else {
            failures.push(format!("memory grid: {} {} failed", cell.shape.0, cell.args().join(" ")));
            continue;
        };
        let packed = cell.lengths.prompt + 2 * (cell.lengths.total - cell.lengths.prompt);
        let line = format!(
            "{} {} mb {} x {packed}{}, checkpointing {}, LoRA {}: {} / {} (run {:.0} s)",
            cell.shape.0,
            if cell.bf16 { "bf16" } else { "f32" },
            cell.micro_batch,
            cell.zero.map_or_else(String::new, |z| format!(", {z} over 2 ranks on cuda:0 (per rank)")),
            cell.checkpointing,
            if cell.lora { "r 16 q,k,v,o" } else { "none" },
            gib(rate.cuda_peak_bytes),
            gib(rate.cuda_reserved_bytes),
            rate.wall_seconds
        );
        println!("{line}");
        text += &line;
        text.push('\n');
        common::record(json, cell.row(&rate)).unwrap_or_else(|e| failures.push(e));
    }
    text
}

/// The grid's cells: three shapes (one with a 152k vocabulary) x micro-batch x checkpointing x
/// LoRA in bf16, the medium model in f32, and the ZeRO stages on two ranks.
fn grid() -> Vec<Measured<'static>> {
    let shapes = [("32M", &GQA32M, "llama"), ("medium", &MEDIUM, "llama"), ("0.5B", &QWEN05B, "qwen2")];
    let short = Lengths { prompt: 128, total: 512 };
    let long = Lengths { prompt: 256, total: 1024 };
    let cell = |shape, lengths, micro_batch, (checkpointing, lora), bf16, zero| Measured {
        shape,
        lengths,
        micro_batch,
        checkpointing,
        lora,
        bf16,
        offload: false,
        steps: 3,
        zero,
    };
    let mut cells = Vec::new();
    for shape in shapes {
        let batches: &[(usize, Lengths)] = match shape.0 {
            "32M" => &[(8, short)],
            "medium" => &[(2, short), (8, short)],
            // Micro-batch and length both vary on the 0.5B shape with two batches (a third,
            // 8 short rows, was four more runs of the check's 15 minutes).
            _ => &[(2, short), (8, long)],
        };
        for &(micro_batch, lengths) in batches {
            for modes in [(false, false), (true, false), (false, true), (true, true)] {
                cells.push(cell(shape, lengths, micro_batch, modes, true, None));
            }
        }
    }
    cells.push(cell(shapes[1], short, 2, (false, false), false, None));
    // The ZeRO stages on two ranks (the medium model, bf16, micro-batch 2 a rank).
    for (stage, checkpointing) in [("zero1", false), ("zero2", false), ("zero2", true), ("zero3", false)] {
        cells.push(cell(shapes[1], short, 2, (checkpointing, false), true, Some(stage)));
    }
    cells
}

/// check-gpu on this GPU for the issue's run (the 0.5B shape, 256 pairs of 250-1000 tokens, TRL's
/// defaults): the plan from `--model M --data D`, and its command run as printed for 3 steps, alone
/// on the GPU (it plans for the whole of it), its peak beside the estimate (issue 34, items 2 to
/// 4); [`plan_estimates`] measures other micro-batches beside the other sections.
pub fn plan(work: &Path, out: &Path, failures: &mut Vec<String>) -> String {
    let model = common::generated(work, &QWEN05B, "qwen2");
    let data = crate::targets::pairs(work, &model); // the targets' rows' pairs
    let (m, d) = (model.to_str().unwrap_or_default(), data.to_str().unwrap_or_default());
    let said = output(&built("check-gpu"), &["--model", m, "--data", d, "--compare", "trl", "--json"]);
    let Ok(plan) = serde_json::from_str::<serde_json::Value>(&said) else {
        failures.push("plan: check-gpu printed no plan".to_owned());
        return format!("check-gpu said:\n{said}");
    };
    let command = plan["command"].as_str().unwrap_or_default().to_owned();
    let mut text = format!(
        "check-gpu --model M --data D: micro-batch {}, {} GiB planned ({} GiB allocated by its terms), TRL {} GiB; tokens {}\n$ {command}\n",
        plan["micro_batch"],
        gib(plan["memory_per_gpu_bytes"].as_f64()),
        gib(serde_json::from_value::<check_gpu::MemoryEstimate>(plan["memory"].clone())
            .ok()
            .map(|e| e.allocated() as f64)),
        gib(plan["memory_trl"]["total"].as_f64()),
        plan["tokens"]
    );
    let run_dir = out.join("plan-run");
    let words: Vec<&str> = command.split_whitespace().skip(1).collect();
    let ran = std::process::Command::new(built("dpo-train"))
        .args(&words)
        .args(["--max-steps", "3", "--save-strategy", "no", "--output-dir", run_dir.to_str().unwrap_or_default()])
        .output();
    match ran {
        Ok(o) if o.status.success() => {
            let said = String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr);
            for l in said.lines().filter(|l| l.contains("peak CUDA memory") || l.contains("largest micro-batch")) {
                text += &format!("  {l}\n");
            }
        }
        Ok(o) => {
            failures.push(format!("plan: the printed command exited with {}", o.status));
            text += &String::from_utf8_lossy(&o.stderr);
        }
        Err(e) => failures.push(format!("plan: dpo-train did not run: {e}")),
    }
    // Its final model (2 GB) is not read.
    let _ = std::fs::remove_dir_all(&run_dir);
    text
}

/// The plan's model at micro-batches 8 and 16 without checkpointing (3 steps each, through the
/// GPU's [`pool`]): each measured peak beside check-gpu's estimate at the largest micro-batch
/// the run met (the model's error, a failure past 15%) and the one planned from the data's
/// lengths (issue 34, items 1 and 2).
pub fn plan_estimates(work: &Path, out: &Path, failures: &mut Vec<String>) -> String {
    let model = common::generated(work, &QWEN05B, "qwen2");
    let data = crate::targets::pairs(work, &model);
    let (m, d) = (model.to_str().unwrap_or_default(), data.to_str().unwrap_or_default());
    let lengths = output(&built("dpo-train"), &["data", "lengths", "--model", m, "--data", d]);
    let lengths: Option<check_gpu::DataLengths> = serde_json::from_str(&lengths).ok();
    let shape = check_gpu::ModelShape::from_hf_dir(&model).ok();
    // The plan's run at micro-batch `mb`: bf16, the reference kept, nothing recomputed or sharded.
    let run_at = |micro_batch| Measured {
        shape: ("0.5B", &QWEN05B, "qwen2"),
        lengths: Lengths { prompt: 0, total: 1024 },
        micro_batch,
        checkpointing: false,
        lora: false,
        bf16: true,
        offload: false,
        steps: 3,
        zero: None,
    };
    let estimate = |mb: usize, tokens| shape.as_ref().map(|s| run_at(mb).estimate(s, Some(tokens)));
    let batches = [8usize, 16];
    let planned: Vec<Option<check_gpu::MemoryEstimate>> =
        batches.iter().map(|&mb| lengths.as_ref().and_then(|l| estimate(mb, l.batch(mb as u64)))).collect();
    let jobs = batches
        .iter()
        .zip(&planned)
        .map(|(&mb, planned)| {
            let (model, data, dir) = (&model, &data, out.join(format!("estimate-{mb}")));
            let run = move || {
                std::fs::create_dir_all(&dir).expect("a folder for the run");
                dpo_train_rate_at(model, data, &dir, (mb, 3, 1024), &run_at(mb).args())
            };
            let bytes = run_at(mb).reservation(planned.as_ref());
            pool::Job { bytes, run: Box::new(run) as Box<dyn FnOnce() -> TrainRate + Send> }
        })
        .collect();
    let rates = pool::run_within(pool::gpu(), jobs);
    let mut text = String::new();
    for ((mb, rate), planned) in batches.into_iter().zip(rates).zip(planned) {
        // The model's error: the estimate at the largest micro-batch the run met. The plan's:
        // at the micro-batch it plans for from the data's lengths (mean + 4 sd, a margin).
        let met = rate.largest_batch.map(|(packed, scored)| check_gpu::BatchTokens { packed, scored, from_data: true });
        let at_met = met.and_then(|t| estimate(mb, t));
        let quotient = at_met.zip(rate.cuda_peak_bytes).map(|(e, m)| e.allocated() as f64 / m);
        let _ = writeln!(
            text,
            "micro-batch {mb}, no checkpointing: measured {} / {} GiB allocated / reserved (largest micro-batch {}); \
             estimated {} GiB allocated at that micro-batch ({}); planned from the data's lengths {} / {} GiB allocated / total",
            gib(rate.cuda_peak_bytes),
            gib(rate.cuda_reserved_bytes),
            met.map_or_else(|| "?".to_owned(), |t| format!("{} token positions, {} scored", t.packed, t.scored)),
            gib(at_met.map(|e| e.allocated() as f64)),
            ratio(quotient),
            gib(planned.map(|e| e.allocated() as f64)),
            gib(planned.map(|e| e.total as f64))
        );
        if quotient.is_some_and(|q| (q - 1.0).abs() > 0.15) {
            failures
                .push(format!("plan: micro-batch {mb}'s estimate at its largest micro-batch is off by more than 15%"));
        }
    }
    text
}
