//! Running the `dpo-train` binary as a user does: a fixture model and data, a bounded wait, the
//! one-line error a bad input gets.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use super::fixtures;

pub fn model() -> PathBuf {
    fixtures().join("models/llama")
}

pub fn data() -> PathBuf {
    fixtures().join("data/prefs.jsonl")
}

pub fn dpo_train() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_dpo-train"));
    cmd.env_remove("RANK").env_remove("WORLD_SIZE").env_remove("SLURM_PROCID");
    cmd
}

/// Runs to the end; a run still going after `limit` is killed and fails the test (a liveness
/// bound: the endless launch chain this guards against never ends).
pub fn finish(mut cmd: Command, limit: Duration) -> Output {
    let child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("dpo-train starts");
    wait_or_kill(child, limit)
}

pub fn wait_or_kill(mut child: Child, limit: Duration) -> Output {
    let deadline = Instant::now() + limit;
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!("still running after {limit:?}; stderr: {}", String::from_utf8_lossy(&out.stderr));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().expect("output")
}

/// Polls `ready` every `every` until it holds; failing the test with `what` if it still does not
/// after `limit` (a liveness bound, so a run that never gets there cannot hang the suite).
pub fn wait_until(what: &str, limit: Duration, every: Duration, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !ready() {
        assert!(Instant::now() < deadline, "{what} (waited {limit:?})");
        std::thread::sleep(every);
    }
}

pub fn train<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> Output {
    let mut cmd = dpo_train();
    cmd.arg("train").args(args);
    finish(cmd, Duration::from_secs(120))
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The one line a bad input gets, with exit code 1.
pub fn one_line_error(out: &Output) -> String {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(1), "stderr: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "not one line: {err}");
    err.trim_end().to_owned()
}

pub fn s(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

/// The flags of a short f32 run of `model` on `data` into `out/name`, plus `extra`.
pub fn short_run(out: &Path, name: &str, model: &Path, data: &Path, extra: &[&str]) -> Vec<String> {
    let mut args = vec![
        "--model",
        s(model),
        "--data",
        s(data),
        "--output-dir",
        s(out),
        "--run-name",
        name,
        "--max-steps",
        "3",
        "--per-device-train-batch-size",
        "4",
        "--learning-rate",
        "1e-3",
        "--bf16",
        "false",
        "--gradient-checkpointing",
        "false",
        "--num-samples",
        "0",
    ];
    args.extend_from_slice(extra);
    args.into_iter().map(str::to_owned).collect()
}

/// The processes whose parent is `pid`.
pub fn children_of(pid: i32) -> Vec<i32> {
    fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|p| {
            let stat = fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
            // `pid (comm) state ppid ...`; comm may hold spaces, so read after the last `)`.
            stat.rsplit(')').next().and_then(|rest| rest.split_whitespace().nth(1)).and_then(|pp| pp.parse().ok())
                == Some(pid)
        })
        .collect()
}
