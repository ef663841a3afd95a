//! The `dpo-train` command line: [`args`] declares every flag, [`launch`] places the process
//! (alone, one worker, or the launcher of the workers), and one module per command runs it.
//! `main.rs` only parses and turns an error into one line and an exit code.

pub mod args;
pub mod bench_comm;
pub mod device;
pub mod env;
pub mod eval;
pub mod generate;
pub mod interrupt;
pub mod launch;
pub mod lengths;
pub mod progress;
pub mod slurm;
pub mod torch_panic;
pub mod train;

use std::io::Write;
use std::process::ExitCode;

use anyhow::Context;

pub use args::{Cli, Command, DataCommand, DeviceArg, PlotArgs, SynthArgs};
pub use launch::LaunchFlagError;

use crate::demo::synth::{self, SynthConfig};

/// The exit code of a run stopped by Ctrl-C or SIGTERM after saving a checkpoint.
pub const INTERRUPTED: u8 = 130;

/// Runs the parsed command; the exit code says whether it finished or was interrupted.
pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        None => train::run_train(cli.train, false),
        Some(Command::Train(args)) => train::run_train(args, false),
        Some(Command::Sft(args)) => train::run_train(args, true),
        Some(Command::Eval(args)) => eval::run_eval(args),
        Some(Command::Generate(args)) => generate::run_generate(args),
        Some(Command::Plot(args)) => run_plot(args).map(|()| ExitCode::SUCCESS),
        Some(Command::Data(DataCommand::Synth(args))) => run_synth(args).map(|()| ExitCode::SUCCESS),
        Some(Command::Data(DataCommand::Lengths(args))) => lengths::run_lengths(args).map(|()| ExitCode::SUCCESS),
        Some(Command::BenchComm(args)) => bench_comm::run_bench_comm(args),
        Some(Command::Env(args)) => env::run_env(args.json).map(|()| ExitCode::SUCCESS),
        Some(Command::Slurm(args)) => slurm::run_slurm(args).map(|()| ExitCode::SUCCESS),
    }
}

fn run_plot(args: PlotArgs) -> anyhow::Result<()> {
    let written = if let [run] = args.runs.as_slice() {
        crate::report::render_run(run, &crate::report::plot_meta_from_run(run))?
    } else {
        let mut runs = args
            .runs
            .iter()
            .map(|dir| {
                let rows = crate::train::log::read_metrics(&dir.join(crate::train::log::METRICS_FILE))?;
                Ok((crate::report::plot_meta_from_run(dir).run_name, rows))
            })
            .collect::<Result<Vec<_>, crate::report::ReportError>>()?;
        let names = distinct_labels(runs.iter().map(|(name, _)| name.clone()).collect(), &args.runs);
        runs.iter_mut().zip(names).for_each(|((name, _), label)| *name = label);
        let out = args.out.unwrap_or_else(|| args.runs[0].join("compare"));
        dpo_base::fsutil::check_dir_creatable(&out)
            .map_err(|message| crate::config::ConfigError::Flag { flag: "out".to_owned(), message })?;
        std::fs::create_dir_all(&out).with_context(|| format!("cannot create `{}`", out.display()))?;
        crate::report::render_comparison(&runs, &out, "comparison")?
    };
    let mut out = std::io::stdout().lock();
    for path in written {
        writeln!(out, "{}", path.display())?;
    }
    Ok(())
}

/// The legend's name of each run: its run name, or the path as given where runs share one
/// (`sweep-1/a`, `sweep-2/a`), which the legend could not tell apart.
fn distinct_labels(names: Vec<String>, dirs: &[std::path::PathBuf]) -> Vec<String> {
    let shared = |name: &String| names.iter().filter(|n| *n == name).count() > 1;
    names
        .iter()
        .zip(dirs)
        .map(|(name, dir)| if shared(name) { dir.display().to_string() } else { name.clone() })
        .collect()
}

/// A run directory given where a model is expected (`eval --model RUN`): refused, naming the
/// model in it to give (its `final/`, else its newest checkpoint), where loading it failed on a
/// missing `tokenizer.json`.
fn refuse_run_dir(flag: &str, dir: &std::path::Path) -> anyhow::Result<()> {
    let is_model = ["config.json", "adapter_config.json"].iter().any(|f| dir.join(f).is_file());
    if is_model || !dir.join("config.toml").is_file() {
        return Ok(());
    }
    let final_dir = dir.join("final");
    let give = if crate::train::checkpoint::model_file(&final_dir).is_some() {
        format!("`{}`", final_dir.display())
    } else if let Some(newest) = crate::train::checkpoint::latest(dir) {
        format!("its newest checkpoint, `{}`", newest.display())
    } else {
        "its `final/` or a checkpoint once it has one".to_owned()
    };
    let message = format!("`{}` is a dpo-train run, not a model: give {give}", dir.display());
    Err(crate::config::ConfigError::Flag { flag: flag.to_owned(), message }.into())
}

/// Bytes of memory a synthetic pair takes while the splits are made and written: they are
/// shuffled whole, then serialised into one buffer (1,000,000 pairs peaked 370 MB above the
/// process's own, measured with `/usr/bin/time`).
const SYNTH_PAIR_BYTES: u64 = 400;

fn run_synth(args: SynthArgs) -> anyhow::Result<()> {
    let named = args.out.file_name().map(|n| n.to_string_lossy().to_ascii_lowercase()).unwrap_or_default();
    if dpo_base::hub::is_data_file_name(&named) && !named.ends_with(".jsonl") {
        let message = format!(
            "`{}`: the splits are written as JSON Lines: name a `.jsonl` file (the train split; val and test beside it) or a directory",
            args.out.display()
        );
        return Err(crate::config::ConfigError::Flag { flag: "out".to_owned(), message }.into());
    }
    let counts = [("train", args.train), ("val", args.val), ("test", args.test)];
    let pairs = counts.iter().fold(0u64, |sum, (_, n)| sum.saturating_add(*n as u64));
    let (flag, _) = counts.iter().max_by_key(|(_, n)| *n).copied().unwrap_or(counts[0]);
    let what = format!("{pairs} pairs made and written in memory");
    launch::check_flag_memory(flag, pairs.saturating_mul(SYNTH_PAIR_BYTES), &what, "ask for fewer")?;
    // A `.jsonl` names the train split's file (val and test beside it), else a directory.
    let one_file = args.out.extension().is_some_and(|e| e == "jsonl");
    let dir = match one_file {
        true => args.out.parent().unwrap_or(std::path::Path::new("")),
        false => args.out.as_path(),
    };
    dpo_base::fsutil::check_dir_creatable(dir)
        .map_err(|message| crate::config::ConfigError::Flag { flag: "out".to_owned(), message })?;
    let cfg =
        SynthConfig { seed: args.seed, train: args.train, val: args.val, test: args.test, ..SynthConfig::default() };
    let data = synth::generate(&cfg);
    let written = if one_file {
        let stem = args.out.file_stem().map_or_else(String::new, |s| s.to_string_lossy().into_owned());
        let sibling = |split: &str| args.out.with_file_name(format!("{stem}_{split}.jsonl"));
        synth::write_jsonl(&args.out, &data.train)?;
        synth::write_jsonl(&sibling("val"), &data.val)?;
        synth::write_jsonl(&sibling("test"), &data.test)?;
        [args.out.clone(), sibling("val"), sibling("test")]
    } else {
        synth::write_splits(&args.out, &data)?
    };
    let mut out = std::io::stdout().lock();
    for (path, n) in written.iter().zip([data.train.len(), data.val.len(), data.test.len()]) {
        writeln!(out, "{} ({n} pairs)", path.display())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn runs_of_one_name_are_labelled_by_their_paths() {
        let dirs = ["x/a", "y/a", "z/b"].map(std::path::PathBuf::from);
        let names = ["a", "a", "b"].map(str::to_owned).to_vec();
        assert_eq!(super::distinct_labels(names, &dirs), ["x/a", "y/a", "b"]);
    }
}
