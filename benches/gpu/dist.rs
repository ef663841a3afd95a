//! `make gpu-check`'s `dist` section: the distributed code on CUDA, with two ranks sharing `cuda:0`
//! (`--gpus 0,0`: NCCL refuses two ranks on one GPU, so they meet over Gloo with the collectives
//! staged through host memory). Plain data parallelism, ZeRO-1/2/3 and the offloaded optimizer
//! on two ranks train the parameters one rank trains on the same micro-batches (f32, within
//! 1e-5); Ctrl-C to the launcher saves one checkpoint and exits 130; a killed rank ends the job,
//! named, within 30 s; no worker outlives its job.
//!
//! `GPU_CHECK_ON_CPU=1` runs this section with CPU processes in place of the GPU (`--device cpu`,
//! `--devices cpu:2`), to try it where there is no GPU.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use super::{built, common};

/// The largest parameter difference allowed between one rank and two (issue 33, item 5).
const BOUND: f32 = 1e-5;

/// Where the ranks run: one rank's flags and two ranks'.
pub struct Placement {
    pub one: [&'static str; 2],
    pub two: [&'static str; 2],
}

/// Two ranks sharing `cuda:0`.
pub const CUDA: Placement = Placement { one: ["--device", "cuda:0"], two: ["--gpus", "0,0"] };
/// CPU processes, for a dry run.
pub const CPU: Placement = Placement { one: ["--device", "cpu"], two: ["--devices", "cpu:2"] };

/// The settings two ranks are checked in, with the flags that select them.
const SETTINGS: [(&str, &[&str]); 5] = [
    ("plain DDP", &[]),
    ("zero1", &["--sharding", "zero1"]),
    ("zero2", &["--sharding", "zero2"]),
    ("zero3", &["--sharding", "zero3"]),
    ("offloaded optimizer", &["--offload-optimizer"]),
];

pub fn dist(on: &Placement, out: &Path, failures: &mut Vec<String>) -> String {
    let dir = out.join("dist");
    std::fs::create_dir_all(&dir).expect("a folder for the runs");
    let config = write_config(&dir);
    let mut text = format!(
        "fixture llama, f32, 4 steps of 6 pairs (3 a rank, or 2 micro-batches of 3 on one rank); one rank `{}`, two `{}`\n",
        on.one.join(" "),
        on.two.join(" ")
    );
    let one = train(&config, "one", &on.one, &[]).map(|_| weights(&dir.join("one")));
    let Ok(want) = one else {
        failures.push("dist: the one-rank run failed".to_owned());
        return text + &one.err().unwrap_or_default();
    };
    for (name, flags) in SETTINGS {
        let run = name.replace(' ', "-");
        let line = match train(&config, &run, &on.two, flags) {
            Ok(secs) => {
                let diff = max_diff(&want, &weights(&dir.join(&run)));
                let ok = diff <= BOUND;
                if !ok {
                    failures.push(format!("dist: {name} on two ranks differs from one rank by {diff:e}"));
                }
                format!(
                    "{name}: largest parameter difference {diff:.2e} (allowed {BOUND:e}), {secs:.1} s: {}",
                    verdict(ok)
                )
            }
            Err(why) => {
                failures.push(format!("dist: {name} on two ranks failed"));
                format!("{name}: failed: {why}")
            }
        };
        text += &(line + "\n");
    }
    text += &interrupted(&config, on, failures);
    text += &killed(&config, on, failures);
    text
}

fn verdict(ok: bool) -> &'static str {
    if ok { "ok" } else { "FAILED" }
}

/// The runs' settings (`tests/it/ddp.rs`'s: AdamW's ε 1e-3, so a rounding difference cannot flip
/// a step's sign; global batch 6 whatever the ranks).
fn write_config(dir: &Path) -> PathBuf {
    let fixtures = common::root().join("tests/fixtures");
    let text = format!(
        "model_name_or_path = \"{m}\"\nref_model_name_or_path = \"{r}\"\ntrain_file = \"{d}\"\noutput_dir = \"{o}\"\n\
         bf16 = false\ngradient_checkpointing = false\nlearning_rate = 1e-3\nweight_decay = 0.01\nmax_grad_norm = 0.5\n\
         adam_epsilon = 1e-3\nper_device_train_batch_size = 3\nglobal_batch_size = 6\nmax_steps = 4\n\
         logging_steps = 1\nsave_steps = 0\nnum_samples = 0\nseed = 11\nddp_timeout = 60\n",
        m = fixtures.join("models/llama").display(),
        r = fixtures.join("models/llama-ref").display(),
        d = fixtures.join("data/prefs.jsonl").display(),
        o = dir.display(),
    );
    let path = dir.join("dist.toml");
    std::fs::write(&path, text).expect("the runs' config");
    path
}

fn command(config: &Path, run: &str, place: &[&str], flags: &[&str]) -> Command {
    let mut cmd = Command::new(built("dpo-train"));
    cmd.args(["train", "--config", config.to_str().unwrap_or_default(), "--run-name", run]).args(place).args(flags);
    cmd
}

/// Trains `run` to its end: the seconds it took, or its last lines.
fn train(config: &Path, run: &str, place: &[&str], flags: &[&str]) -> Result<f64, String> {
    let started = Instant::now();
    let out = command(config, run, place, flags).output().map_err(|e| format!("dpo-train did not run: {e}"))?;
    if out.status.success() { Ok(started.elapsed().as_secs_f64()) } else { Err(tail(&out)) }
}

fn tail(out: &Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = err.lines().collect();
    format!("{} ({})", lines[lines.len().saturating_sub(3)..].join(" / "), out.status)
}

/// A run's final parameters by name (none where it saved none).
fn weights(run_dir: &Path) -> Vec<(String, Vec<f32>)> {
    let read = dpo_train::model::Weights::open(&run_dir.join("final")).and_then(|w| w.all_values());
    read.unwrap_or_default()
}

/// The largest difference between two runs' parameters (infinite where their names or sizes
/// differ, or a run saved none).
fn max_diff(a: &[(String, Vec<f32>)], b: &[(String, Vec<f32>)]) -> f32 {
    let same =
        !a.is_empty() && a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.0 == y.0 && x.1.len() == y.1.len());
    if !same {
        return f32::INFINITY;
    }
    let diffs = a.iter().zip(b).flat_map(|(x, y)| x.1.iter().zip(&y.1).map(|(p, q)| (p - q).abs()));
    diffs.fold(0.0, |m, d| if d.is_nan() { f32::INFINITY } else { m.max(d) })
}

/// A long two-rank run, started in its own process group, once it has logged three steps (its
/// worker pids), or why not.
fn started(config: &Path, run: &str, on: &Placement) -> Result<(Child, Vec<u32>), String> {
    let mut cmd = command(config, run, &on.two, &["--max-steps", "100000"]);
    cmd.stdout(Stdio::null()).stderr(Stdio::piped()).process_group(0);
    let mut child = cmd.spawn().map_err(|e| format!("dpo-train did not start: {e}"))?;
    let metrics = config.with_file_name(run).join("metrics.csv");
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline {
        let steps = std::fs::read_to_string(&metrics).map_or(0, |t| t.lines().count());
        let workers = children(child.id());
        if steps >= 3 && workers.len() == 2 {
            return Ok((child, workers));
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("the run ended before training ({status})"));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    // SAFETY: a signal to the process group of our own child.
    unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
    let _ = child.wait();
    Err("the workers did not train within 120 s".to_owned())
}

/// Ctrl-C (SIGINT to the launcher): one checkpoint, exit 130, no worker left.
fn interrupted(config: &Path, on: &Placement, failures: &mut Vec<String>) -> String {
    let (child, workers) = match started(config, "interrupted", on) {
        Ok(started) => started,
        Err(why) => {
            failures.push("dist: Ctrl-C: the run did not start".to_owned());
            return format!("Ctrl-C: {why}\n");
        }
    };
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let out = finished(child, Duration::from_secs(90));
    let saved = dpo_train::train::checkpoint::list(&config.with_file_name("interrupted")).len();
    let said = out.as_ref().map(|o| String::from_utf8_lossy(&o.stderr).contains("interrupted at step"));
    let code = out.as_ref().ok().and_then(|o| o.status.code());
    let left = alive(&workers);
    let ok = code == Some(130) && said == Ok(true) && saved == 1 && left.is_empty();
    if !ok {
        failures.push("dist: Ctrl-C to the launcher of two ranks".to_owned());
    }
    format!(
        "Ctrl-C to the launcher: exit {code:?}, {saved} checkpoint(s), said \"interrupted at step\": {}, workers left {left:?}: {}\n",
        said.unwrap_or(false),
        verdict(ok)
    )
}

/// Rank 1 killed (SIGKILL): the launcher ends the job within 30 s, naming the rank.
fn killed(config: &Path, on: &Placement, failures: &mut Vec<String>) -> String {
    let (child, workers) = match started(config, "killed", on) {
        Ok(started) => started,
        Err(why) => {
            failures.push("dist: killed rank: the run did not start".to_owned());
            return format!("rank 1 killed: {why}\n");
        }
    };
    let rank1 = workers.iter().copied().find(|&pid| has_rank(pid, 1)).unwrap_or(workers[1]);
    let since = Instant::now();
    // SAFETY: a signal to our own grandchild.
    unsafe { libc::kill(rank1 as i32, libc::SIGKILL) };
    let out = finished(child, Duration::from_secs(30));
    let secs = since.elapsed().as_secs_f64();
    let stderr = out.as_ref().map(|o| String::from_utf8_lossy(&o.stderr).into_owned()).unwrap_or_default();
    let named = stderr.lines().any(|l| l.starts_with("rank 1: exited (killed by signal 9)"));
    let failed = out.as_ref().is_ok_and(|o| !o.status.success());
    let left = alive(&workers);
    let ok = named && failed && left.is_empty();
    if !ok {
        failures.push("dist: a killed rank of two".to_owned());
    }
    let last = stderr.lines().last().unwrap_or("(no output)").to_owned();
    format!(
        "rank 1 killed: the job ended in {secs:.1} s, rank named: {named}, workers left {left:?}: {}\n  {last}\n",
        verdict(ok)
    )
}

/// The child's output once it exits within `limit`; else its process group is killed.
fn finished(child: Child, limit: Duration) -> Result<Output, String> {
    let pid = child.id() as i32;
    let (done, result) = std::sync::mpsc::channel();
    std::thread::spawn(move || done.send(child.wait_with_output()));
    match result.recv_timeout(limit) {
        Ok(out) => out.map_err(|e| e.to_string()),
        Err(_) => {
            // SAFETY: a signal to the process group of our own child.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
            Err(format!("still running after {} s", limit.as_secs()))
        }
    }
}

fn children(pid: u32) -> Vec<u32> {
    let out = Command::new("pgrep").args(["-P", &pid.to_string()]).output();
    let text = out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default();
    text.split_whitespace().filter_map(|p| p.parse().ok()).collect()
}

fn has_rank(pid: u32, rank: usize) -> bool {
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
    environ.split(|&b| b == 0).any(|var| var == format!("RANK={rank}").as_bytes())
}

/// Which of `pids` still run, after a moment for the kernel to reap them.
fn alive(pids: &[u32]) -> Vec<u32> {
    std::thread::sleep(Duration::from_millis(500));
    pids.iter().copied().filter(|pid| Path::new(&format!("/proc/{pid}")).exists()).collect()
}
