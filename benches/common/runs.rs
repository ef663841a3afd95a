//! The benches' training runs, timed: dpo-train's (this build's, or an earlier executable's) from
//! its metrics.csv and reported peaks, and TRL's `DPOTrainer` through `benches/trl_dpo.py`.

use std::path::{Path, PathBuf};

use super::{root, torch_threads};

/// Training throughput measured from `metrics.csv`, from the end of step 1 (which pays for
/// warm-up) to the end of the last step, and the peak resident memory dpo-train reports.
#[derive(Debug, Clone, Copy)]
pub struct TrainRate {
    pub pairs_per_second: f64,
    pub tokens_per_second: f64,
    /// Peak resident memory while training (rank 0), bytes; `None` where it cannot be tracked.
    pub peak_bytes: Option<f64>,
    /// On CUDA, the most the CUDA allocator handed out while training (rank 0), bytes.
    pub cuda_peak_bytes: Option<f64>,
    /// On CUDA, the most it held from the driver (rank 0), bytes.
    pub cuda_reserved_bytes: Option<f64>,
    /// Under `--offload-optimizer`, rank 0's copies each way a step, milliseconds.
    pub offload_copy_ms: Option<f64>,
    /// Seconds a step, from the end of step 1 to the end of the last.
    pub step_seconds: f64,
    /// The whole process, start to exit (loading, tokenising, saving): what a GPU check's time
    /// budget is made of.
    pub wall_seconds: f64,
    /// Rank 0's largest micro-batch: its token positions and scored predictions.
    pub largest_batch: Option<(u64, u64)>,
}

/// Runs `dpo-train train` for `steps` DPO steps of `batch` pairs (TRL's defaults otherwise: the
/// sigmoid loss, AdamW; no warm-up stage, evaluation, samples or intermediate checkpoints;
/// constant learning rate; f32 without activation checkpointing unless `extra` says otherwise)
/// at `max_length` 512 with `extra` flags, and times it.
pub fn dpo_train_rate(model: &Path, data: &Path, out: &Path, batch: usize, steps: usize, extra: &[&str]) -> TrainRate {
    dpo_train_rate_at(model, data, out, (batch, steps, 512), extra)
}

/// [`dpo_train_rate`] with `(batch, steps, max_length)`. The peak is the resident set with the
/// allocator as training configures it (freed memory it keeps for reuse counts), unlike
/// `memory.rs`, which trades speed for a resident set that tracks live tensors.
pub fn dpo_train_rate_at(
    model: &Path,
    data: &Path,
    out: &Path,
    (batch, steps, max_length): (usize, usize, usize),
    extra: &[&str],
) -> TrainRate {
    dpo_train_rate_env(model, data, out, (batch, steps, max_length), extra, &[])
}

/// [`dpo_train_rate_at`] with environment variables `envs` set for the run.
pub fn dpo_train_rate_env(
    model: &Path,
    data: &Path,
    out: &Path,
    run: (usize, usize, usize),
    extra: &[&str],
    envs: &[(&str, &Path)],
) -> TrainRate {
    dpo_train_rate_of(Path::new(env!("CARGO_BIN_EXE_dpo-train")), model, data, out, run, extra, envs)
}

/// [`dpo_train_rate_env`] by the executable `bin`: this build's dpo-train, or an earlier one the
/// GPU check's `bisect` section brings (its config keys and metrics.csv are read alike).
pub fn dpo_train_rate_of(
    bin: &Path,
    model: &Path,
    data: &Path,
    out: &Path,
    (batch, steps, max_length): (usize, usize, usize),
    extra: &[&str],
    envs: &[(&str, &Path)],
) -> TrainRate {
    let run = run_name(max_length, extra);
    let _ = std::fs::remove_dir_all(out.join(&run));
    let config = out.join(format!("{run}.toml"));
    let text = format!(
        "model_name_or_path = \"{}\"\ntrain_file = \"{}\"\noutput_dir = \"{}\"\nrun_name = \"{run}\"\n\
         max_length = {max_length}\nper_device_train_batch_size = {batch}\nmax_steps = {steps}\n\
         logging_first_step = true\nlogging_steps = {logging}\n\
         save_strategy = \"no\"\nnum_samples = 0\nlr_scheduler_type = \"constant\"\nlearning_rate = 1e-6\n\
         bf16 = false\ngradient_checkpointing = false\n",
        model.display(),
        data.display(),
        out.display(),
        // Logged after step 1 and at the end only: a log reads the step's values back, which on a
        // GPU waits for every queued kernel (TRL's side logs nothing).
        logging = steps.max(1),
    );
    std::fs::write(&config, text).expect("the config is written");
    let mut args = vec!["train", "--config", config.to_str().unwrap_or_default()];
    args.extend(extra);
    let started = std::time::Instant::now();
    let output =
        std::process::Command::new(bin).args(&args).envs(envs.iter().copied()).output().expect("dpo-train runs");
    let wall_seconds = started.elapsed().as_secs_f64();
    let said = String::from_utf8_lossy(&output.stdout).into_owned() + &String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "dpo-train {} failed:\n{said}", args.join(" "));
    // A fast path given up on (`dpo_torch::fallback`) or another warning changes what a rate
    // means: the log shows it beside the run.
    for warning in said.lines().filter(|l| l.starts_with("warning:")) {
        println!("  {run}: {warning}");
    }
    let rows = dpo_train::train::log::read_metrics(&out.join(&run).join("metrics.csv")).expect("metrics.csv");
    drop_weights(&out.join(&run));
    let train: Vec<_> = rows.iter().filter(|r| r.split == dpo_train::train::log::Split::Train).collect();
    let (first, last) = (train[0], train[train.len() - 1]);
    let seconds = last.elapsed_seconds - first.elapsed_seconds;
    let tokens = last.metric("num_tokens").unwrap_or(0.0) - first.metric("num_tokens").unwrap_or(0.0);
    let timed_steps = (last.step - first.step) as usize;
    TrainRate {
        pairs_per_second: (timed_steps * batch) as f64 / seconds,
        tokens_per_second: tokens / seconds,
        peak_bytes: reported_peak(&said, "peak resident memory while training"),
        cuda_peak_bytes: reported_peak(&said, "peak CUDA memory allocated while training"),
        cuda_reserved_bytes: reported_peak(&said, "peak CUDA memory reserved while training"),
        offload_copy_ms: said
            .lines()
            .find_map(|l| l.split("offloaded optimizer's copies, rank 0: ").nth(1))
            .and_then(|rest| rest.split(' ').next()?.parse().ok()),
        step_seconds: seconds / timed_steps as f64,
        wall_seconds,
        largest_batch: largest_batch(&said),
    }
}

/// Removes the checkpoints and final models of the finished run in `dir`, keeping its logs. The
/// timed runs save no checkpoint (`save_strategy = "no"`, as TRL's side saves nothing: an end
/// checkpoint was AdamW's moments beside the f32 weights, 6 of the 8 GB a 0.5B run wrote), but
/// `final/` is 2 GB for the 0.5B shape and 4 GB for the 1.1B, and a whole GPU check, which keeps
/// every run's directory to its end, would otherwise fill the disk of a 64 GiB machine.
pub fn drop_weights(dir: &Path) {
    for part in ["checkpoints", "final", "sft"] {
        let _ = std::fs::remove_dir_all(dir.join(part));
    }
}

/// Rank 0's figures of dpo-train's "largest micro-batch (...), per rank: T/N, ..." line.
fn largest_batch(said: &str) -> Option<(u64, u64)> {
    let line = said.lines().find(|l| l.contains("largest micro-batch"))?;
    let (t, n) = line.split("per rank: ").nth(1)?.split([',', ' ']).next()?.split_once('/')?;
    Some((t.parse().ok()?, n.parse().ok()?))
}

/// The directory under `out` where [`dpo_train_rate_env`] runs `max_length` with `extra` flags.
pub fn run_name(max_length: usize, extra: &[&str]) -> String {
    format!("run{max_length}{}", extra.join("").replace(['-', ':', '.'], "_"))
}

/// Rank 0's figure of dpo-train's "<what>, per rank: X GiB, ..." line.
fn reported_peak(said: &str, what: &str) -> Option<f64> {
    let line = said.lines().find(|l| l.contains(what))?;
    let gib: f64 = line.split("per rank: ").nth(1)?.split(' ').next()?.parse().ok()?;
    Some(gib * f64::from(1u32 << 30))
}

/// TRL's side of a comparison: `benches/trl_dpo.py`'s measurement.
#[derive(Debug, Clone, Copy)]
pub struct TrlRate {
    pub pairs_per_second: f64,
    /// Peak resident memory while training (peak allocated CUDA memory on a GPU), bytes.
    pub peak_bytes: f64,
    /// The whole process, start to exit.
    pub wall_seconds: f64,
}

/// The venv's python (`DPO_TRAIN_VENV`, else `.venv`), where TRL lives.
pub fn python() -> PathBuf {
    let venv = std::env::var_os("DPO_TRAIN_VENV").map_or_else(|| root().join(".venv"), PathBuf::from);
    venv.join("bin/python")
}

/// TRL's `DPOTrainer` for `steps` steps of `batch` pairs at `max_length`, with `flags` for
/// `benches/trl_dpo.py`, on the threads libtorch uses here.
pub fn trl_rate(
    model: &Path,
    data: &Path,
    (batch, steps, max_length): (usize, usize, usize),
    flags: &[&str],
) -> TrlRate {
    try_trl_rate(model, data, (batch, steps, max_length), flags).unwrap_or_else(|e| {
        eprintln!("{e}");
        std::process::exit(1)
    })
}

/// [`trl_rate`], with what went wrong as the error instead of exiting (for a bench that goes on
/// to its next section).
pub fn try_trl_rate(
    model: &Path,
    data: &Path,
    (batch, steps, max_length): (usize, usize, usize),
    flags: &[&str],
) -> Result<TrlRate, String> {
    let mut command = std::process::Command::new(python());
    command
        .arg(root().join("benches/trl_dpo.py"))
        .arg(model)
        .arg(data)
        .args(["--batch-size", &batch.to_string(), "--max-length", &max_length.to_string()])
        .args(["--steps", &steps.to_string(), "--threads", &torch_threads().to_string()])
        .args(flags);
    let started = std::time::Instant::now();
    let out = command
        .output()
        .map_err(|e| format!("{} does not run (make ref-venv installs TRL): {e}", python().display()))?;
    if !out.status.success() {
        return Err(format!("trl_dpo.py failed:\n{}", String::from_utf8_lossy(&out.stderr)));
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let value: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap_or_default())
        .map_err(|e| format!("trl_dpo.py printed no JSON line ({e}): {stdout}"))?;
    let number = |key: &str| value[key].as_f64().ok_or_else(|| format!("no {key} in trl_dpo.py's line: {stdout}"));
    let wall_seconds = started.elapsed().as_secs_f64();
    Ok(TrlRate { pairs_per_second: number("pairs_per_second")?, peak_bytes: number("peak_bytes")?, wall_seconds })
}
