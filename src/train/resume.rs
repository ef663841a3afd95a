//! What a resume must keep: the global batch its checkpoints count steps of, a checkpoint to
//! resume a trained stage from, and steps left to train; each refused in one line with the
//! advice that makes it work.

use std::path::Path;

use super::checkpoint;
use super::context::{Objective, Run};
use super::stage::global_batch;
use crate::config::{ConfigError, SaveStrategy, TrainConfig};

/// A run resumes with the global batch its checkpoints were saved at, whatever the devices: their
/// data position and schedule count steps of that batch, and another would replay or skip data.
/// Checked for each stage directory (`sft/`, the run's) before anything is loaded or rewritten.
pub fn check_resume_batch(stage_dirs: &[&Path], cfg: &TrainConfig, world_size: usize) -> anyhow::Result<()> {
    let (now, accumulation) = global_batch(cfg, world_size)?;
    for ckpt in stage_dirs.iter().filter_map(|dir| checkpoint::latest(dir)) {
        match checkpoint::trainer_state(&ckpt).map_err(|e| checkpoint::resume_failed(e.into(), &ckpt))?.global_batch {
            Some(saved) if saved != now => anyhow::bail!(ConfigError::Invalid {
                key: "global_batch_size",
                message: format!(
                    "`{}` was saved at a global batch of {saved} pairs and this run's is {now} ({} per device x \
                     {world_size} devices x {accumulation} accumulation): {}",
                    ckpt.display(),
                    cfg.per_device_train_batch_size,
                    resume_batch_advice(saved, cfg.per_device_train_batch_size, world_size),
                ),
            }),
            _ => {}
        }
    }
    Ok(())
}

/// A run resumes under the command that trained it: its own directory's newest checkpoint is of
/// `dpo-train sft`'s objective or of `dpo-train train`'s DPO, and a resume by the other command
/// would train the other loss on those weights and append it to the run's metrics. Checkpoints
/// written before the objective was kept are not checked.
pub fn check_resume_objective(run_dir: &Path, objective: Objective) -> anyhow::Result<()> {
    // A `train` run's warm-up is in `sft/`: that run is `train`'s even before its DPO checkpoints.
    let warmed_up = run_dir.join(crate::run::SFT_DIR).is_dir();
    let saved = match checkpoint::latest(run_dir) {
        Some(ckpt) => {
            checkpoint::trainer_state(&ckpt).map_err(|e| checkpoint::resume_failed(e.into(), &ckpt))?.objective
        }
        None => None,
    };
    let saved = saved.or(warmed_up.then_some(Objective::Dpo));
    let Some(saved) = saved.filter(|saved| *saved != objective) else { return Ok(()) };
    let command = |o: Objective| match o {
        Objective::Sft => "dpo-train sft",
        Objective::Dpo => "dpo-train train",
    };
    let message = format!(
        "`{}` is a run of `{}` (its checkpoints train {}), not of `{}`: resume it with `{} --resume {}`, or start a new run from its `final/` or a checkpoint (`--model DIR`)",
        run_dir.display(),
        command(saved),
        saved.name().to_uppercase(),
        command(objective),
        command(saved),
        run_dir.display()
    );
    Err(ConfigError::Invalid { key: "resume", message }.into())
}

/// A resume trains its newest checkpoints' weights: a model directory (`--model`, changed with
/// `--resume-with-changes`) of another shape than theirs would be their config and reference,
/// and is refused. Checked against each stage's newest full-model checkpoint (an adapter's
/// shape is its own key, [`crate::config::resume::SHAPE_KEYS`]).
pub fn check_resume_model(stage_dirs: &[&Path], model_dir: &Path) -> anyhow::Result<()> {
    let now = crate::model::load_config(model_dir)?;
    for ckpt in stage_dirs.iter().filter_map(|dir| checkpoint::latest(dir)) {
        if !ckpt.join("config.json").is_file() {
            continue;
        }
        let saved = crate::model::load_config(&ckpt).map_err(|e| checkpoint::resume_failed(e.into(), &ckpt))?;
        let shape = |c: &crate::model::LlamaConfig| {
            [c.vocab_size, c.hidden_size, c.intermediate_size, c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim]
        };
        if shape(&saved) != shape(&now) || saved.family != now.family {
            let message = format!(
                "`{}` holds a {} model of hidden_size {}, {} layers and vocab_size {}, and `{}` is a {} model of {}, {} and {}: a resume trains the checkpoint's weights, so the model must have their shape; start a new run from the model instead (without `--resume`)",
                ckpt.display(),
                saved.family.model_type(),
                saved.hidden_size,
                saved.num_layers,
                saved.vocab_size,
                model_dir.display(),
                now.family.model_type(),
                now.hidden_size,
                now.num_layers,
                now.vocab_size
            );
            return Err(ConfigError::Invalid { key: "model_name_or_path", message }.into());
        }
    }
    Ok(())
}

/// Where a run of `world` processes resumes as it is: a global batch left to the devices
/// (`global_batch_size` unset) is resumed by as many again, or by others given that batch.
pub(super) fn resume_hint(run: &Run, world: usize, global: Option<usize>) -> String {
    let (Some(global), None, 2..) = (global, run.cfg.global_batch_size, world) else { return String::new() };
    let again = match dpo_torch::allocator::cuda_index(&run.rt.device) {
        Some(_) => format!("--gpus {world}"),
        None => format!("--devices cpu:{world}"),
    };
    format!(" and `{again}` (its {world} devices), or on others with `--global-batch-size {global}`")
}

/// A resumed run's stage directories (`sft/` inside the run's, then the run's) where a stage
/// trained (its `metrics.csv` or `final/` is there) but holds no checkpoint to continue from:
/// refused, where it started again from step 0 over them. A stage that finished stays resumable
/// to nothing (a warm-up's `final/`; a run of `save_strategy = "no"` whose `final/` is current).
pub fn check_resumable(run_dir: &Path, warm_up: &Path, cfg: &TrainConfig) -> anyhow::Result<()> {
    for dir in [warm_up, run_dir] {
        let trained = ["metrics.csv", "final"].iter().any(|f| dir.join(f).exists());
        let finished = match dir == warm_up {
            true => checkpoint::model_file(&dir.join("final")).is_some(),
            false => cfg.save_strategy == SaveStrategy::No && checkpoint::final_is_current(dir, None, cfg.merge),
        };
        if !trained || finished || checkpoint::latest(dir).is_some() {
            continue;
        }
        let what = match (dir.join("metrics.csv").exists(), dir.join("final").exists()) {
            (true, true) => "its metrics.csv and final/",
            (true, false) => "its metrics.csv",
            (false, _) => "its final/",
        };
        // Killed before any checkpoint or final/: the run's own command trains it again.
        let held = [warm_up, run_dir].iter().any(|d| checkpoint::holds_a_model(d));
        let fix = match held {
            true => "start another run (`--run-name`), or move them out of the way to train it again",
            false => {
                "run its command again without `--resume` to train it from step 0, or start another run (`--run-name`)"
            }
        };
        let message = format!(
            "`{}` holds a stage that trained, but no checkpoint to resume it from (none in `checkpoints/`): a resume would train it again from step 0 over {what}; {fix}",
            dir.display()
        );
        return Err(crate::config::ConfigError::Invalid { key: "resume", message }.into());
    }
    Ok(())
}

/// A resume from a checkpoint past the stage's last step has nothing to train: refused.
pub(super) fn steps_left(resume_from: Option<&Path>, total_steps: u64) -> Result<(), ConfigError> {
    match resume_from.and_then(|p| Some((p, checkpoint::step_of(p)?))) {
        Some((path, step)) if step > total_steps => {
            let message = format!(
                "`{}` is at step {step}, past the {total_steps} steps this stage trains (`max_steps`, else the epochs over the data): nothing is left to train; resume with more steps",
                path.display()
            );
            Err(ConfigError::Invalid { key: "max_steps", message })
        }
        _ => Ok(()),
    }
}

/// What resumes a checkpoint of global batch `saved` on `world` devices: the global batch again,
/// with a per-device batch that divides it over the devices (the largest up to `micro`), or, when
/// `saved` does not split over `world` devices at all, a device count that it does.
fn resume_batch_advice(saved: usize, micro: usize, world: usize) -> String {
    if !saved.is_multiple_of(world) {
        let counts: Vec<String> =
            (1..=saved.min(8)).filter(|d| saved.is_multiple_of(*d)).map(|d| d.to_string()).collect();
        return format!("{saved} pairs do not split over {world} devices: resume on {} device(s)", counts.join(", "));
    }
    let per_device = saved / world;
    let fits = (1..=micro.min(per_device)).rev().find(|m| per_device.is_multiple_of(*m)).unwrap_or(1);
    if fits == micro {
        format!("add `--global-batch-size {saved}`")
    } else {
        format!("add `--global-batch-size {saved} --per-device-train-batch-size {fits}`")
    }
}

#[cfg(test)]
mod tests {
    use super::resume_batch_advice;

    /// The advice is a batch that splits (followed, it is accepted), or a device count that does.
    #[test]
    fn resume_advice_is_a_batch_that_splits() {
        assert_eq!(resume_batch_advice(12, 3, 2), "add `--global-batch-size 12`");
        assert_eq!(resume_batch_advice(12, 4, 3), "add `--global-batch-size 12`");
        assert_eq!(resume_batch_advice(12, 8, 2), "add `--global-batch-size 12 --per-device-train-batch-size 6`");
        assert_eq!(resume_batch_advice(8, 3, 2), "add `--global-batch-size 8 --per-device-train-batch-size 2`");
        assert_eq!(resume_batch_advice(4, 2, 3), "4 pairs do not split over 3 devices: resume on 1, 2, 4 device(s)");
    }
}
