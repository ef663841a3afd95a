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
    /// The run's directory: where it holds a checkpoint (the script submitted again, or
    /// requeued), the tasks resume it from its newest; else they start it (again).
    pub run_dir: PathBuf,
    /// The directory the job's tasks run in: where the script was made, so the relative paths of
    /// its config and flags mean there what they meant when they were checked.
    pub workdir: PathBuf,
    /// The dpo-train the tasks run, unless the job's `DPO_TRAIN` names another.
    pub program: PathBuf,
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

/// The sbatch script for `opts`. The nodes must see `opts.program` where it is here (a shared
/// file system), or the job's `DPO_TRAIN` name theirs.
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
        "# The config's and flags' relative paths mean what they meant where the script was made.".to_string(),
        format!("cd {}", shell_quote(&opts.workdir.to_string_lossy())),
        String::new(),
        "# NCCL: a failed or stuck collective ends the job instead of hanging it.".to_string(),
        "export TORCH_NCCL_ASYNC_ERROR_HANDLING=1".to_string(),
        "export NCCL_DEBUG=${NCCL_DEBUG:-WARN}".to_string(),
        "export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-^lo,docker}".to_string(),
        String::new(),
        "# Threads per task: its share of the node's cores (srun takes --cpus-per-task from".to_string(),
        "# SRUN_CPUS_PER_TASK since SLURM 22.05, no longer from the allocation).".to_string(),
        format!("export SRUN_CPUS_PER_TASK={threads}"),
        format!("export OMP_NUM_THREADS={threads}"),
        format!("export DPO_TRAIN_THREADS={threads}"),
        String::new(),
        "# Rank 0 runs on the first node and serves the rendezvous store there.".to_string(),
        "export MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1)".to_string(),
        "export MASTER_PORT=$((20000 + SLURM_JOB_ID % 20000))".to_string(),
        String::new(),
        "# Submitted again (or requeued), the job resumes its run from the newest checkpoint (its".to_string(),
        "# warm-up's, or its own); a run that died before its first starts again.".to_string(),
        format!("RUN_DIR={}", shell_quote(&opts.run_dir.to_string_lossy())),
        "RESUME=()".to_string(),
        "if compgen -G \"$RUN_DIR/checkpoints/step-*\" >/dev/null || compgen -G \"$RUN_DIR/sft/checkpoints/step-*\" >/dev/null; then".to_string(),
        "  RESUME=(--resume \"$RUN_DIR\")".to_string(),
        "fi".to_string(),
        String::new(),
        format!("DPO_TRAIN=${{DPO_TRAIN:-{}}}", shell_quote(&opts.program.to_string_lossy())),
        "# One task per GPU; dpo-train reads SLURM_PROCID, SLURM_NTASKS and SLURM_LOCALID.".to_string(),
        // `--device cuda`: each task takes the GPU of its local rank. An empty array under `set -u`
        // needs the `+` form before bash 4.4.
        format!(
            "srun --kill-on-bad-exit=1 \"$DPO_TRAIN\" train {} --device cuda ${{RESUME[@]+\"${{RESUME[@]}}\"}}",
            train.join(" ")
        ),
    ]);
    let mut script = lines.join("\n");
    script.push('\n');
    script
}

/// Seconds of a time limit in SLURM's syntax (`minutes`, `minutes:seconds`,
/// `hours:minutes:seconds`, `days-hours`, `days-hours:minutes`, `days-hours:minutes:seconds`);
/// `None` for `UNLIMITED`/`INFINITE` or text that is none of these.
pub fn time_limit_seconds(time: &str) -> Option<u64> {
    let (days, rest) = match time.split_once('-') {
        Some((d, rest)) => (d.parse::<u64>().ok()?, Some(rest)),
        None => (0, None),
    };
    let num = |p: &str| p.parse::<u64>().ok();
    let parts: Vec<&str> = rest.unwrap_or(time).split(':').collect();
    let (h, m, sec) = match (rest.is_some(), parts.as_slice()) {
        (false, [m]) => (0, num(m)?, 0),
        (false, [m, s]) => (0, num(m)?, num(s)?),
        (_, [h, m, s]) => (num(h)?, num(m)?, num(s)?),
        (true, [h]) => (num(h)?, 0, 0),
        (true, [h, m]) => (num(h)?, num(m)?, 0),
        _ => return None,
    };
    Some(((days * 24 + h) * 60 + m) * 60 + sec)
}

/// `--time` as the job gets it: a limit [`time_limit_seconds`] reads, or `UNLIMITED` /
/// `INFINITE`; anything else would reach sbatch, which refuses the job only once submitted.
pub fn parse_time(text: &str) -> Result<String, String> {
    let unlimited = ["UNLIMITED", "INFINITE"].iter().any(|u| text.eq_ignore_ascii_case(u));
    match unlimited || time_limit_seconds(text).is_some() {
        true => Ok(text.to_owned()),
        false => Err(
            "expected SLURM's syntax: minutes, minutes:seconds, hours:minutes:seconds, days-hours, days-hours:minutes, days-hours:minutes:seconds, or UNLIMITED"
                .to_owned(),
        ),
    }
}

/// `--mem-per-gpu` in SLURM's syntax: a whole number, then optionally one of its units K, M, G, T
/// (megabytes without one).
pub fn parse_memory(text: &str) -> Result<String, String> {
    let digits = text.strip_suffix(['K', 'M', 'G', 'T', 'k', 'm', 'g', 't']).unwrap_or(text);
    match !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
        true => Ok(text.to_owned()),
        false => {
            Err("expected a whole number with an optional unit K, M, G or T (SLURM's syntax, e.g. 64G)".to_owned())
        }
    }
}

/// A name an `#SBATCH` line takes (`--job-name`, `--partition`): one word without quotes or
/// control characters, which would end the line or split it (sbatch stops reading its options at
/// the first line that is not one, so a newline would drop the ones after it).
pub fn parse_word(text: &str) -> Result<String, String> {
    let bad = text.chars().find(|c| c.is_whitespace() || c.is_control() || "'\"\\#$`".contains(*c));
    match (text.is_empty(), bad) {
        (true, _) => Err("must not be empty".to_owned()),
        (false, Some(c)) => Err(format!("must be one word without quotes or `#`, `$`, `\\`: it holds {c:?}")),
        (false, None) => Ok(text.to_owned()),
    }
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
    fn values_for_sbatch_lines_are_checked() {
        for ok in ["24:00:00", "90", "2-12", "UNLIMITED", "infinite"] {
            assert_eq!(parse_time(ok).as_deref(), Ok(ok));
        }
        for bad in ["abc", "5:xx", "-3", "", "1:2:3:4"] {
            assert!(parse_time(bad).is_err(), "{bad}");
        }
        for ok in ["64G", "512", "1t", "0"] {
            assert_eq!(parse_memory(ok).as_deref(), Ok(ok));
        }
        for bad in ["lots", "G", "64GB", "-1G", "1.5G"] {
            assert!(parse_memory(bad).is_err(), "{bad}");
        }
        for ok in ["dpo-train", "gpu,gpu2", "sweep_3.a"] {
            assert_eq!(parse_word(ok).as_deref(), Ok(ok));
        }
        for bad in ["x\necho INJECTED", "my job", "a'b", "", "a#b", "$(id)"] {
            assert!(parse_word(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn time_limits_in_slurms_syntax() {
        let cases = [
            ("30", 1800),
            ("30:15", 1815),
            ("2:00:00", 7200),
            ("1-0", 86_400),
            ("1-2:30", 95_400),
            ("1-0:0:5", 86_405),
        ];
        for (text, seconds) in cases {
            assert_eq!(time_limit_seconds(text), Some(seconds), "{text}");
        }
        for text in ["UNLIMITED", "1:2:3:4", "", "a-1"] {
            assert_eq!(time_limit_seconds(text), None, "{text}");
        }
    }

    #[test]
    fn matches_the_reviewed_fixture() {
        let opts = SlurmOptions {
            nodes: 2,
            gpus_per_node: 4,
            train_args: vec!["--config".into(), "configs/llama-1b.toml".into()],
            run_dir: PathBuf::from("runs/20261207-000000-llama-1b"),
            workdir: PathBuf::from("/home/me/dpo"),
            program: PathBuf::from("/home/me/.cargo/bin/dpo-train"),
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
            workdir: PathBuf::from("/home/me/my runs"),
            program: PathBuf::from("/opt/dpo train/dpo-train"),
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
        assert!(script.contains("\ncd '/home/me/my runs'\n"));
        assert!(script.contains("DPO_TRAIN=${DPO_TRAIN:-'/opt/dpo train/dpo-train'}\n"));
        assert!(script.ends_with(
            "srun --kill-on-bad-exit=1 \"$DPO_TRAIN\" train --config 'my runs/it'\\''s.toml' --beta 0.2 --device cuda \
             ${RESUME[@]+\"${RESUME[@]}\"}\n"
        ));
    }
}
