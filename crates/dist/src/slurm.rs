//! The sbatch script of a multi-node `dpo-train train` job (what `dpo-train slurm` prints), after
//! the usual SLURM + NCCL recipe: `#SBATCH` resources, NCCL variables, `MASTER_ADDR` from the first
//! host of the allocation, then `srun` with one task per GPU. Each task finds its rank in
//! `SLURM_PROCID`/`SLURM_NTASKS`/`SLURM_LOCALID` ([`super::env::detect`]), so no launcher runs
//! inside the job.

use std::path::PathBuf;

/// The resources and the config of the job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlurmOptions {
    /// Nodes to allocate (`--nodes`).
    pub nodes: usize,
    /// GPUs per node, and so tasks per node (`--gres=gpu:N`, `--ntasks-per-node`).
    pub gpus_per_node: usize,
    /// What follows `dpo-train train` on every task: the config file and flags, each one word.
    pub train_args: Vec<String>,
    /// The run's directory: where it has a `config.toml` (the script submitted again, or
    /// requeued), the tasks resume it from its newest checkpoint.
    pub run_dir: PathBuf,
    /// Wall-clock limit in SLURM's syntax (`--time`, e.g. `24:00:00`).
    pub time: String,
    /// The partition (`--partition`), or the cluster's default.
    pub partition: Option<String>,
    /// `--job-name`.
    pub job_name: String,
    /// CPU cores per task (`--cpus-per-task`), also the worker's thread count.
    pub cpus_per_task: usize,
    /// Host memory per GPU in SLURM's syntax (`--mem-per-gpu`, e.g. `64G`).
    pub mem_per_gpu: String,
    /// Seconds before the time limit at which SLURM sends every task SIGTERM (`--signal`), so the
    /// ranks finish their step and save a checkpoint; 0: none. At the limit itself SLURM sends
    /// SIGTERM and SIGKILL `KillWait` later (30 s by default), too soon to save a large model and
    /// its optimizer state: the steps since the last periodic checkpoint would be lost.
    pub save_before_limit: u32,
}

/// The sbatch script for `opts`. `dpo-train` must be on the nodes' `PATH`.
///
/// The rendezvous port is derived from the job id (`20000 + SLURM_JOB_ID % 20000`), so two jobs
/// sharing a node do not collide.
pub fn sbatch_script(opts: &SlurmOptions) -> String {
    let mut lines = vec![
        "#!/bin/bash".to_string(),
        format!("#SBATCH --job-name={}", opts.job_name),
        format!("#SBATCH --nodes={}", opts.nodes),
        format!("#SBATCH --ntasks-per-node={}", opts.gpus_per_node),
        format!("#SBATCH --gres=gpu:{}", opts.gpus_per_node),
        format!("#SBATCH --cpus-per-task={}", opts.cpus_per_task),
        format!("#SBATCH --mem-per-gpu={}", opts.mem_per_gpu),
        format!("#SBATCH --time={}", opts.time),
    ];
    if opts.save_before_limit > 0 {
        // Every task: each rank finishes its step, they save one checkpoint and exit 130.
        lines.push(format!("#SBATCH --signal=TERM@{}", opts.save_before_limit));
    }
    if let Some(partition) = &opts.partition {
        lines.push(format!("#SBATCH --partition={partition}"));
    }
    let train: Vec<String> = opts.train_args.iter().map(|w| shell_quote(w)).collect();
    let threads = opts.cpus_per_task;
    lines.extend([
        "#SBATCH --output=slurm-%j.out".to_string(),
        "#SBATCH --error=slurm-%j.out".to_string(),
        String::new(),
        "set -euo pipefail".to_string(),
        String::new(),
        "# NCCL: a failed or stuck collective ends the job instead of hanging it.".to_string(),
        "export TORCH_NCCL_ASYNC_ERROR_HANDLING=1".to_string(),
        "export NCCL_DEBUG=${NCCL_DEBUG:-WARN}".to_string(),
        "export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-^lo,docker}".to_string(),
        String::new(),
        "# Threads per task: its share of the node's cores.".to_string(),
        format!("export OMP_NUM_THREADS={threads}"),
        format!("export DPO_TRAIN_THREADS={threads}"),
        String::new(),
        "# Rank 0 runs on the first node and serves the rendezvous store there.".to_string(),
        "export MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1)".to_string(),
        "export MASTER_PORT=$((20000 + SLURM_JOB_ID % 20000))".to_string(),
        String::new(),
        "# Submitted again (or requeued), the job resumes its run from the newest checkpoint.".to_string(),
        format!("RUN_DIR={}", shell_quote(&opts.run_dir.to_string_lossy())),
        "RESUME=()".to_string(),
        "if [ -f \"$RUN_DIR/config.toml\" ]; then RESUME=(--resume \"$RUN_DIR\"); fi".to_string(),
        String::new(),
        "# One task per GPU; dpo-train reads SLURM_PROCID, SLURM_NTASKS and SLURM_LOCALID.".to_string(),
        // `--device cuda`: each task takes the GPU of its local rank. An empty array under `set -u`
        // needs the `+` form before bash 4.4.
        format!(
            "srun --kill-on-bad-exit=1 dpo-train train {} --device cuda ${{RESUME[@]+\"${{RESUME[@]}}\"}}",
            train.join(" ")
        ),
    ]);
    let mut script = lines.join("\n");
    script.push('\n');
    script
}

/// `s` as one shell word: unchanged when it has only safe characters, else single-quoted.
fn shell_quote(s: &str) -> String {
    let safe = !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c));
    if safe { s.to_string() } else { format!("'{}'", s.replace('\'', r"'\''")) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_reviewed_fixture() {
        let opts = SlurmOptions {
            nodes: 2,
            gpus_per_node: 4,
            train_args: vec!["--config".into(), "configs/llama-1b.toml".into()],
            run_dir: PathBuf::from("runs/20261207-000000-llama-1b"),
            time: "24:00:00".into(),
            partition: Some("gpu".into()),
            job_name: "dpo".into(),
            cpus_per_task: 8,
            mem_per_gpu: "64G".into(),
            save_before_limit: 300,
        };
        let expected = include_str!("../../../tests/fixtures/slurm/two_nodes.sbatch");
        let script = sbatch_script(&opts);
        for (i, (got, want)) in script.lines().zip(expected.lines()).enumerate() {
            assert_eq!(got, want, "line {}", i + 1);
        }
        assert_eq!(script, expected);
    }

    #[test]
    fn no_partition_line_without_a_partition_and_quoted_paths() {
        let opts = SlurmOptions {
            nodes: 1,
            gpus_per_node: 8,
            train_args: ["--config", "my runs/it's.toml", "--beta", "0.2"].map(String::from).to_vec(),
            run_dir: PathBuf::from("my runs/x"),
            time: "1:00:00".into(),
            partition: None,
            job_name: "x".into(),
            cpus_per_task: 4,
            mem_per_gpu: "32G".into(),
            save_before_limit: 0,
        };
        let script = sbatch_script(&opts);
        assert!(!script.contains("--partition"));
        assert!(!script.contains("--signal"));
        assert!(script.contains("RUN_DIR='my runs/x'\n"));
        assert!(script.contains("#SBATCH --ntasks-per-node=8\n#SBATCH --gres=gpu:8\n"));
        assert!(script.ends_with(
            "srun --kill-on-bad-exit=1 dpo-train train --config 'my runs/it'\\''s.toml' --beta 0.2 --device cuda \
             ${RESUME[@]+\"${RESUME[@]}\"}\n"
        ));
    }
}
