//! Training trajectories compared step by step, and bf16's own drift from f32 over one, as
//! measured on the CPU (`cargo bench --bench precision`): the round-off the GPU check's bf16
//! parity is bounded by.
//!
//! A trajectory of 20 steps compounds round-off: each step's weights carry the earlier steps'
//! rounded gradients, so a bf16 run drifts from f32 by more than one step's rounding. How far is
//! a property of bf16, not of a device, and is measured where both runs are cheap.

use std::path::{Path, PathBuf};

use dpo_train::train::log::{Split, read_metrics};

use super::{MEDIUM, dpo_train_rate_at, long_pairs, model_dir, root, run_name};

/// Training steps of a trajectory.
pub const STEPS: usize = 20;

/// The committed measurements: `results/cpu/bf16-drift-<cpu>.json`.
pub const DRIFT_STEM: &str = "bf16-drift";

/// The trajectory's inputs, made under `work` (`target/bench-assets`) if missing: the medium
/// model with its weights stored in f32, and 64 long pairs.
///
/// Not [`super::generated`]'s bf16 storage: weights on bf16's grid start every bf16 copy exactly
/// at its master, so each update smaller than half a unit in the last place (1e-5 against about
/// 6e-5 at the initialisation's 0.02) leaves the copy where it was, for every weight at once,
/// until the masters cross a rounding boundary. The bf16 run then drifts by how its weights
/// round, not by its arithmetic: on the CPU 1.26 in loss against f32 over these 20 steps, where
/// f32-stored weights drift 3.3e-2 (2026-11-29, AMD EPYC).
pub fn inputs(work: &Path) -> (PathBuf, PathBuf) {
    (model(work), long_pairs(&work.join("long-pairs.jsonl"), 64))
}

/// [`inputs`]' model alone.
pub fn model(work: &Path) -> PathBuf {
    model_dir(&work.join("medium"), &MEDIUM)
}

/// One step of two trajectories side by side: `step, loss a / b, logps/chosen a / b`.
pub fn step_line(step: usize, a: (f64, f64), b: (f64, f64)) -> String {
    format!("  {:>2}  {:.6} / {:.6}   {:.3} / {:.3}", step, a.0, b.0, a.1, b.1)
}

/// Per-step (loss, logps/chosen) of [`STEPS`] steps of 2 pairs at max_length 512 and learning
/// rate 1e-5 of `model` on `data`, on `device` with `flags`.
pub fn trajectory(model: &Path, data: &Path, out: &Path, device: &str, flags: &[&str]) -> Vec<(f64, f64)> {
    let mut args = flags.to_vec();
    args.extend(["--device", device, "--learning-rate", "1e-5", "--logging-steps", "1"]);
    dpo_train_rate_at(model, data, out, (2, STEPS, 512), &args);
    let dir = out.join(run_name(512, &args));
    let rows = read_metrics(&dir.join("metrics.csv")).expect("metrics.csv");
    let train = rows.into_iter().filter(|r| r.split == Split::Train);
    train.map(|r| (r.metric("loss").unwrap_or(f64::NAN), r.metric("logps/chosen").unwrap_or(f64::NAN))).collect()
}

/// How far one trajectory is from another.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Drift {
    /// The largest difference of a step's loss.
    pub loss: f64,
    /// The largest difference of a step's chosen log-prob, relative to the other's.
    pub logp: f64,
}

impl Drift {
    /// `a` against `b`, step by step (NaN where their lengths differ: no bound holds it).
    pub fn between(a: &[(f64, f64)], b: &[(f64, f64)]) -> Self {
        if a.len() != b.len() {
            return Self { loss: f64::NAN, logp: f64::NAN };
        }
        let steps = a.iter().zip(b);
        let fold = |f: fn(&(f64, f64), &(f64, f64)) -> f64| steps.clone().map(|(x, y)| f(x, y)).fold(0.0, f64::max);
        Self { loss: fold(|x, y| (x.0 - y.0).abs()), logp: fold(|x, y| ((x.1 - y.1) / y.1).abs()) }
    }

    /// The GPU check's bound from bf16's drift on the CPU: twice it, CUDA's kernels (flash
    /// attention, cuBLAS) rounding in their own order and adding as much again.
    pub fn doubled(&self) -> Drift {
        Drift { loss: 2.0 * self.loss, logp: 2.0 * self.logp }
    }

    /// Whether both are within `bound`'s (false for NaN).
    pub fn within(&self, bound: &Drift) -> bool {
        self.loss <= bound.loss && self.logp <= bound.logp
    }
}

/// bf16's drift from f32 as the committed CPU measurements have it: the largest over
/// `results/cpu/bf16-drift-*.json`, and the files read. An error names what is missing.
pub fn cpu_bf16_drift() -> Result<(Drift, Vec<PathBuf>), String> {
    let dir = root().join("results/cpu");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(DRIFT_STEM)))
        .collect();
    files.sort();
    let mut worst = Drift { loss: 0.0, logp: 0.0 };
    for file in &files {
        let text = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
        let row: serde_json::Value = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", file.display()))?;
        let field = |k: &str| row[k].as_f64().ok_or_else(|| format!("{}: no number `{k}`", file.display()));
        worst = Drift { loss: worst.loss.max(field("loss_drift")?), logp: worst.logp.max(field("logp_drift")?) };
    }
    match files.is_empty() {
        true => Err(format!("no {}/{DRIFT_STEM}-*.json: `cargo bench --bench precision` measures it", dir.display())),
        false => Ok((worst, files)),
    }
}
