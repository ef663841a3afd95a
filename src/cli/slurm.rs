//! `dpo-train slurm`: the sbatch script of a `dpo-train train` job of `--nodes` x
//! `--gpus-per-node` tasks. Its config (a file, flags, or both) is checked here as `train` checks
//! it, and its batch against the job's tasks, so a job `train` would refuse is refused before it
//! waits in the queue; the tasks get the same file and flags, and a run name fixed here, so that
//! the script submitted again, or requeued, resumes its run.

use super::args::SlurmArgs;
use super::train::config_name;
use dpo_base::hub::{self, Kind};

use crate::config::{ConfigError, ConfigFile, KEYS, Layered};
use crate::dist::{SlurmOptions, sbatch_script, time_limit_seconds};

pub fn run_slurm(args: SlurmArgs) -> anyhow::Result<()> {
    if let Some(limit) = time_limit_seconds(&args.time)
        && u64::from(args.save_before_limit) >= limit
    {
        let (before, time) = (args.save_before_limit, &args.time);
        let message = format!(
            "{before} is not less than `--time {time}` ({limit} s): the signal to save would come as the job starts; lower it, or 0 for none"
        );
        return Err(ConfigError::Flag { flag: "save-before-limit".to_owned(), message }.into());
    }
    let file = args.config.as_deref().map(ConfigFile::read).transpose()?;
    let layered = Layered::new(file, &args.overrides.values)?;
    layered.validate()?;
    crate::train::stage::global_batch(&layered.cfg, args.nodes * args.gpus_per_node)?;
    for note in absent_here(&layered) {
        eprintln!("note: {note}");
    }
    let mut train_args = Vec::new();
    if let Some(config) = &args.config {
        train_args.extend(["--config".to_owned(), config.display().to_string()]);
    }
    // One script, one run: named now, so that the script submitted again (or requeued) resumes it.
    let cfg = &layered.cfg;
    let run_name = cfg.run_name.clone().unwrap_or_else(|| {
        let name = crate::run::default_run_name(&config_name(args.config.as_deref(), &args.overrides.values));
        train_args.extend(["--run-name".to_owned(), name.clone()]);
        name
    });
    for (key, value) in &args.overrides.values {
        // Our keys by their flags; TRL's as its parser spells them (`--use_peft`).
        let flag = match KEYS.iter().any(|k| k.name == key) {
            true => dpo_vocab::flag(key),
            false => format!("--{key}"),
        };
        train_args.extend([flag, value.clone()]);
    }
    print!(
        "{}",
        sbatch_script(&SlurmOptions {
            nodes: args.nodes,
            gpus_per_node: args.gpus_per_node,
            train_args,
            run_dir: cfg.output_dir.join(run_name),
            workdir: std::env::current_dir()?,
            program: std::env::current_exe()?,
            time: args.time,
            partition: args.partition,
            job_name: args.job_name,
            cpus_per_task: args.cpus_per_task,
            mem_per_gpu: args.mem_per_gpu,
            save_before_limit: args.save_before_limit,
        })
    );
    Ok(())
}

/// The models and data the job reads that this host has neither as a path nor in its Hugging
/// Face cache, each located where it was set: notes, not refusals, as the job's nodes may mount
/// what the host that prints the script does not.
fn absent_here(layered: &Layered) -> Vec<String> {
    let cfg = &layered.cfg;
    let path = |p: &Option<std::path::PathBuf>| p.as_ref().map(|p| p.to_string_lossy().into_owned());
    let read = [
        ("model_name_or_path", Some(cfg.model_name_or_path.clone()), Kind::Model),
        ("ref_model_name_or_path", path(&cfg.ref_model_name_or_path), Kind::Model),
        ("tokenizer_name_or_path", path(&cfg.tokenizer_name_or_path), Kind::Model),
        ("train_file", Some(cfg.train_file.clone()), Kind::Dataset),
        ("eval_file", cfg.eval_file.clone(), Kind::Dataset),
        ("test_file", cfg.test_file.clone(), Kind::Dataset),
    ];
    read.into_iter()
        .filter_map(|(key, value, kind)| {
            let value = value.filter(|v| v != "demo")?;
            let here = std::path::Path::new(&value).exists() || matches!(hub::locate(&value, kind), Ok(Some(_)));
            let message = format!(
                "`{value}` is not on this host (nor in its Hugging Face cache): the job fails unless its nodes have it"
            );
            (!here).then(|| layered.locate(ConfigError::Invalid { key, message }).to_string())
        })
        .collect()
}
