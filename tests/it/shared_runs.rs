//! Nothing lost when runs share a machine, a cache or a directory, or are resumed differently:
//! damaged cache entries are rebuilt, never used; what a dead writer left is cleaned up; a run
//! directory has one writer; a resume refuses changes to what is trained.

use std::fs;
use std::path::Path;
use std::time::Duration;

use crate::common::cli::{data, dpo_train, finish, model, one_line_error, s, short_run, stderr, wait_until};

/// A short run of the fixture model into `out/name`, finished; `extra` flags replace the short
/// run's own values of the same flag.
fn run(out: &Path, name: &str, extra: &[&str]) -> std::process::Output {
    let mut args = short_run(out, name, &model(), &data(), &[]);
    for pair in extra.chunks(2) {
        match (args.iter().position(|a| a == pair[0]), pair.get(1)) {
            (Some(i), Some(value)) if !value.starts_with("--") => args[i + 1] = (*value).to_owned(),
            _ => args.extend(pair.iter().map(|a| (*a).to_owned())),
        }
    }
    let mut cmd = dpo_train();
    cmd.arg("train").args(args);
    finish(cmd, Duration::from_secs(120))
}

/// The tokenised-data cache's entries.
fn entries(out: &Path) -> Vec<std::path::PathBuf> {
    let dir = out.join(".data_cache");
    let mut all: Vec<_> = fs::read_dir(dir).unwrap().flatten().map(|e| e.path()).collect();
    all.sort();
    all
}

/// An entry with four flipped bytes (same size) is reported, tokenised again and stored anew;
/// the run trains on the right tokens (its result equals the first run's); a temporary file a
/// dead writer left in the cache is removed.
#[test]
fn a_damaged_cache_entry_is_rebuilt_and_a_dead_writer_s_file_removed() {
    let dir = tempfile::tempdir().unwrap();
    let first = run(dir.path(), "first", &[]);
    assert!(first.status.success(), "{}", stderr(&first));
    let [entry] = entries(dir.path()).try_into().expect("one entry");
    let mut bytes = fs::read(&entry).unwrap();
    let at = bytes.len() / 2;
    bytes[at..at + 4].iter_mut().for_each(|b| *b ^= 0x5a);
    fs::write(&entry, &bytes).unwrap();
    let dead =
        dir.path().join(".data_cache").join(format!(".{}.tmp-4999999", entry.file_name().unwrap().to_string_lossy()));
    fs::write(&dead, b"half an entry").unwrap();

    let second = run(dir.path(), "second", &[]);
    let said = stderr(&second);
    assert!(second.status.success(), "{said}");
    let warning = format!(
        "warning: the cache entry `{}` is damaged (its checksum does not match its contents): tokenising again",
        entry.display()
    );
    assert!(said.contains(&warning), "{said}");
    assert!(said.contains(&format!("removed `{}`, left by a writer that died", dead.display())), "{said}");
    assert!(!dead.exists());
    assert_eq!(entries(dir.path()), vec![entry.clone()], "the entry was stored anew");
    let third = run(dir.path(), "third", &[]);
    assert!(stderr(&third).contains("tokenised pairs read from the cache"), "{}", stderr(&third));
    let weights = |name: &str| crate::common::tensors(&dir.path().join(name).join("final/model.safetensors"));
    assert_eq!(crate::common::max_diff(&weights("first"), &weights("second")), 0.0, "trained on other tokens");
}

/// The precomputed reference's cache likewise: flipped bytes in its values are found by its
/// checksum, and the log-probs are computed again (the run's result is the first run's).
#[test]
fn a_damaged_reference_cache_entry_is_computed_again() {
    let dir = tempfile::tempdir().unwrap();
    let pre: &[&str] = &["--precompute-ref-log-probs", "true"];
    let first = run(dir.path(), "first", pre);
    assert!(first.status.success(), "{}", stderr(&first));
    let [entry] = fs::read_dir(dir.path().join(".ref_cache"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect::<Vec<_>>()
        .try_into()
        .expect("one entry");
    let mut bytes = fs::read(&entry).unwrap();
    let at = bytes.len() - 6; // inside the last values, past the header
    bytes[at] ^= 0x40;
    fs::write(&entry, &bytes).unwrap();
    let second = run(dir.path(), "second", pre);
    let said = stderr(&second);
    assert!(second.status.success(), "{said}");
    let warning = format!(
        "warning: the cache entry `{}` is damaged (its checksum does not match its contents): computing again",
        entry.display()
    );
    assert!(said.contains(&warning), "{said}");
    let weights = |name: &str| crate::common::tensors(&dir.path().join(name).join("final/model.safetensors"));
    assert_eq!(crate::common::max_diff(&weights("first"), &weights("second")), 0.0);
}

/// A second writer of a run still going is refused with one line naming the directory and the
/// process that holds it: the same `--run-name`, or `--resume` of it. Nothing of the second is
/// written into the first's directory.
#[test]
fn a_second_writer_of_a_live_run_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut args = short_run(dir.path(), "shared", &model(), &data(), &["--save-steps", "0", "--logging-steps", "1"]);
    let steps = args.iter().position(|a| a == "--max-steps").unwrap() + 1;
    args[steps] = "100000".into();
    let mut cmd = dpo_train();
    cmd.arg("train").args(&args);
    let first = cmd.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null()).spawn().unwrap();
    let first = KillOnDrop(first);
    let run_dir = dir.path().join("shared");
    let (limit, every) = (Duration::from_secs(60), Duration::from_millis(100));
    wait_until("the first run did not start training", limit, every, || run_dir.join("metrics.csv").exists());
    let config = fs::read_to_string(run_dir.join("config.toml")).unwrap();
    let busy = format!(
        "error: `{}` is being written by another dpo-train run (process {}): wait for it to end, or choose another `--run-name`",
        run_dir.display(),
        first.0.id()
    );
    let same_name = run(dir.path(), "shared", &["--warmup-steps", "1"]);
    let mut resume = dpo_train();
    resume.args(["train", "--resume", run_dir.to_str().unwrap()]);
    let resumed = finish(resume, Duration::from_secs(60));
    drop(first);
    assert_eq!(one_line_error(&same_name), busy);
    assert_eq!(one_line_error(&resumed), busy);
    assert_eq!(fs::read_to_string(run_dir.join("config.toml")).unwrap(), config, "the second wrote its config");
}

/// A child process killed (and reaped) when the test ends, passing or not.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `--resume` with flags that change what is trained (another model, another reference, another
/// max_length) is refused naming the key and both values; `--resume-with-changes` continues with
/// them and says so; the schedule's keys may change without it.
/// Runs named by the clock in the same second (a script looping over settings) each get a
/// directory: a finished run under the name a new run makes up gives it a suffix (it was refused
/// with "already holds a run"); a name the user chose is still refused, naming `--resume`.
#[test]
fn runs_named_in_the_same_second_each_get_a_directory() {
    let dir = tempfile::tempdir().unwrap();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    // A finished run under every name the new run can make (this second and the next minute).
    for t in now..now + 60 {
        let name = format!("{}-llama", dpo_train::clock::strftime("%Y%m%d-%H%M%S", t));
        let ckpt = dir.path().join(name).join("checkpoints/step-3");
        fs::create_dir_all(&ckpt).unwrap();
        fs::write(ckpt.join("trainer_state.json"), "{}").unwrap();
    }
    let (model, data) = (model(), data());
    let mut cmd = dpo_train();
    cmd.arg("train").args(["--model", s(&model), "--data", s(&data), "--max-steps", "1", "--num-samples", "0"]);
    cmd.args(["--output-dir", s(dir.path())]);
    let out = finish(cmd, Duration::from_secs(120));
    assert!(out.status.success(), "{}", stderr(&out));
    let runs = fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().path());
    let suffixed: Vec<_> = runs.filter(|p| p.join("final").is_dir()).collect();
    assert_eq!(suffixed.len(), 1, "{suffixed:?}");
    assert!(suffixed[0].to_string_lossy().ends_with("-llama-2"), "{suffixed:?}");
    let taken = format!("{}-llama", dpo_train::clock::strftime("%Y%m%d-%H%M%S", now));
    let mut cmd = dpo_train();
    cmd.arg("train").args(["--model", s(&model), "--data", s(&data), "--output-dir", s(dir.path())]);
    cmd.args(["--run-name", &taken]);
    let err = one_line_error(&finish(cmd, Duration::from_secs(120)));
    assert!(
        err.ends_with(&format!(
            "already holds a run: pass `--resume {}` or another `--run-name`",
            dir.path().join(&taken).display()
        )),
        "{err}"
    );
}

#[test]
fn a_resume_refuses_changes_to_what_is_trained_unless_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let first = run(dir.path(), "r", &["--save-steps", "3"]);
    assert!(first.status.success(), "{}", stderr(&first));
    let run_dir = dir.path().join("r");
    let saved = run_dir.join("config.toml");
    let resume = |extra: &[&str]| {
        let mut cmd = dpo_train();
        cmd.args(["train", "--resume", run_dir.to_str().unwrap(), "--max-steps", "4"]).args(extra);
        finish(cmd, Duration::from_secs(120))
    };
    let other = crate::common::fixtures().join("models/qwen2");
    let err = one_line_error(&resume(&["--model", other.to_str().unwrap()]));
    let want = format!(
        "error: `resume`: `model_name_or_path` is \"{}\" in `{}` and \"{}\" now: that changes what is trained; pass `--resume-with-changes` to continue with it",
        model().display(),
        saved.display(),
        other.display()
    );
    assert_eq!(err, want);
    let reference = crate::common::fixtures().join("models/llama-ref");
    assert!(
        one_line_error(&resume(&["--ref-model", reference.to_str().unwrap()]))
            .contains("`ref_model_name_or_path` is unset in")
    );
    assert!(one_line_error(&resume(&["--max-length", "64"])).contains("`max_length` is 1024 in"));
    // The checkpoints hold the whole model: adapters cannot resume from them, accepted or not
    // (they were accepted, and the run's config.toml said `lora_r = 4` from then on: no resume
    // loaded its checkpoint again).
    let before = fs::read_to_string(&saved).unwrap();
    let err = one_line_error(&resume(&["--lora-r", "4", "--resume-with-changes"]));
    assert!(
        err.starts_with("error: `resume`: `lora_r` is unset in")
            && err.contains("a resume cannot change it, even with `--resume-with-changes`"),
        "{err}"
    );
    assert_eq!(fs::read_to_string(&saved).unwrap(), before);
    // So is a model of another shape: it became the checkpoints' config and reference, and
    // `final/` did not load.
    let err = one_line_error(&resume(&["--model", other.to_str().unwrap(), "--resume-with-changes"]));
    assert!(err.contains("a resume trains the checkpoint's weights, so the model must have their shape"), "{err}");
    assert_eq!(fs::read_to_string(&saved).unwrap(), before);
    let changed = resume(&["--max-length", "64", "--resume-with-changes", "--learning-rate", "5e-4"]);
    let said = stderr(&changed);
    assert!(changed.status.success(), "{said}");
    assert!(
        said.contains(&format!("resuming with a change: `max_length` = 64 (was 1024 in `{}`)", saved.display())),
        "{said}"
    );
    assert!(!said.contains("`learning_rate`"), "the schedule changes freely: {said}");
    // A resumed run stays where it is: a flag placing it elsewhere is refused (it was ignored,
    // yet written into the run's config.toml); the place it is at is accepted.
    let stays = format!(
        "a resumed run stays in `{}`: drop the flag to resume it there, or start a run under another name without `--resume`",
        run_dir.display()
    );
    let elsewhere = dir.path().join("elsewhere");
    for (flag, value) in [("--run-name", "other"), ("--output-dir", elsewhere.to_str().unwrap())] {
        assert_eq!(one_line_error(&resume(&[flag, value])), format!("error: `{flag}`: {stays}"));
    }
    assert!(!elsewhere.exists());
    assert!(!fs::read_to_string(&saved).unwrap().contains("other"));
    let here = resume(&["--run-name", "r", "--output-dir", dir.path().to_str().unwrap(), "--max-steps", "5"]);
    assert!(here.status.success(), "{}", stderr(&here));
    // Bare `--resume` takes the run `--run-name` names under `--output-dir`.
    let mut cmd = dpo_train();
    cmd.args([
        "train",
        "--resume",
        "--output-dir",
        dir.path().to_str().unwrap(),
        "--run-name",
        "r",
        "--max-steps",
        "6",
    ]);
    let named = finish(cmd, Duration::from_secs(120));
    assert!(named.status.success(), "{}", stderr(&named));
    assert!(String::from_utf8_lossy(&named.stdout).starts_with(&format!("run: {}\n", run_dir.display())));
}

/// A run resumes under the command that trained it: `dpo-train sft --resume` of a DPO run (and
/// `train --resume` of an `sft` run) is refused, where it trained the other loss on the run's
/// weights and appended it to its metrics.
#[test]
fn a_run_resumes_under_its_own_command() {
    let dir = tempfile::tempdir().unwrap();
    let dpo = run(dir.path(), "dpo", &["--save-steps", "3"]);
    assert!(dpo.status.success(), "{}", stderr(&dpo));
    let mut sft = dpo_train();
    sft.arg("sft").args(short_run(dir.path(), "sft", &model(), &data(), &["--save-steps", "3"]));
    let sft = finish(sft, Duration::from_secs(120));
    assert!(sft.status.success(), "{}", stderr(&sft));
    // Its summary is kept, as a DPO run's is.
    let summary = fs::read_to_string(dir.path().join("sft/summary.txt")).unwrap();
    assert!(summary.contains("sft: 3 steps -> ") && summary.contains("\nmachine: "), "{summary}");
    for (command, name, other) in [("sft", "dpo", "train"), ("train", "sft", "sft")] {
        let run_dir = dir.path().join(name);
        let metrics = fs::read_to_string(run_dir.join("metrics.csv")).unwrap();
        let mut cmd = dpo_train();
        cmd.args([command, "--resume", s(&run_dir), "--max-steps", "5"]);
        let err = one_line_error(&finish(cmd, Duration::from_secs(120)));
        let want = format!(
            "is a run of `dpo-train {other}` (its checkpoints train {}), not of `dpo-train {command}`: resume it with `dpo-train {other} --resume {}`",
            name.to_uppercase(),
            run_dir.display()
        );
        assert!(err.starts_with("error: `resume`: ") && err.contains(&want), "{err}");
        assert_eq!(fs::read_to_string(run_dir.join("metrics.csv")).unwrap(), metrics);
    }
    // A `train` run with a warm-up is `train`'s before its first DPO checkpoint too.
    let warm = run(dir.path(), "warm", &["--sft-steps", "2"]);
    assert!(warm.status.success(), "{}", stderr(&warm));
    let warm = dir.path().join("warm");
    for done in ["checkpoints", "final", "metrics.csv"] {
        let path = warm.join(done);
        if path.is_dir() { fs::remove_dir_all(&path).unwrap() } else { fs::remove_file(&path).unwrap() }
    }
    let mut cmd = dpo_train();
    cmd.args(["sft", "--resume", s(&warm), "--max-steps", "5"]);
    let err = one_line_error(&finish(cmd, Duration::from_secs(120)));
    assert!(err.contains("is a run of `dpo-train train`"), "{err}");
    assert!(!warm.join("checkpoints").exists());
}

/// What a dead writer left in a run (a checkpoint staged when it was killed, the ranks' slices of
/// a zero2 checkpoint a full disk stopped) is removed by the next run that holds the directory.
#[test]
fn staging_left_by_a_dead_writer_is_removed_by_the_next_run() {
    let dir = tempfile::tempdir().unwrap();
    // A full disk (a 200 KiB file limit) under zero2 on two workers: a rank's slices fail.
    let args = short_run(
        dir.path(),
        "z",
        &model(),
        &data(),
        &["--save-steps", "2", "--devices", "cpu:2", "--sharding", "zero2"],
    );
    let mut cmd = std::process::Command::new("bash");
    cmd.args(["-c", "ulimit -f 200; exec \"$0\" train \"$@\"", env!("CARGO_BIN_EXE_dpo-train")]).args(&args);
    let full = finish(cmd, Duration::from_secs(120));
    assert_eq!(full.status.code(), Some(2), "{}", stderr(&full));
    let staging = |run: &str| -> Vec<String> {
        let Ok(entries) = fs::read_dir(dir.path().join(run).join("checkpoints")) else { return Vec::new() };
        entries.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).filter(|n| n.starts_with('.')).collect()
    };
    // The same run again, the disk freed: it starts afresh and clears what the first left.
    let again = run(dir.path(), "z", &["--save-steps", "2", "--devices", "cpu:2", "--sharding", "zero2"]);
    assert!(again.status.success(), "{}", stderr(&again));
    assert_eq!(staging("z"), Vec::<String>::new());

    // A checkpoint staged when its writer was killed (kill -9 in the middle of a save).
    let first = run(dir.path(), "k", &["--save-steps", "3"]);
    assert!(first.status.success(), "{}", stderr(&first));
    let partial = dir.path().join("k/checkpoints/.step-9.partial");
    fs::create_dir_all(&partial).unwrap();
    fs::write(partial.join("model.safetensors"), b"half a file").unwrap();
    let mut resume = dpo_train();
    resume.args(["train", "--resume", dir.path().join("k").to_str().unwrap(), "--max-steps", "4"]);
    let resumed = finish(resume, Duration::from_secs(120));
    let said = stderr(&resumed);
    assert!(resumed.status.success(), "{said}");
    assert!(said.contains(&format!("removed `{}`, left by a writer that died", partial.display())), "{said}");
    assert_eq!(staging("k"), Vec::<String>::new());
}

/// Ctrl-C to a `--devices cpu:N` launcher while its workers are still starting (before they can
/// handle it): no more workers start, those started end, and the job exits 130, not 2.
#[test]
fn ctrl_c_while_workers_start_stops_the_job_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = dpo_train();
    cmd.arg("train").args(short_run(dir.path(), "starting", &model(), &data(), &["--devices", "cpu:6"]));
    let child = cmd.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::piped()).spawn().unwrap();
    let pid = child.id() as i32;
    let (limit, every) = (Duration::from_secs(60), Duration::from_millis(5));
    wait_until("no worker started", limit, every, || !crate::common::cli::children_of(pid).is_empty());
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(pid, libc::SIGINT) };
    let out = crate::common::cli::wait_or_kill(child, Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(130), "{}", stderr(&out));
    std::thread::sleep(Duration::from_millis(300));
    assert!(crate::common::cli::children_of(pid).is_empty(), "workers left");
}

/// A resume at another global batch is refused with advice that works when followed: on 3 devices
/// a batch of 4 cannot split (it names the device counts that can), on 2 it names the batch flag,
/// and following it resumes; a launcher exits 1 for this bad input, as one process does, and says
/// it once.
#[test]
fn the_resume_batch_advice_works_when_followed() {
    let dir = tempfile::tempdir().unwrap();
    let first = run(
        dir.path(),
        "b",
        &["--per-device-train-batch-size", "2", "--gradient-accumulation-steps", "2", "--save-steps", "3"],
    );
    assert!(first.status.success(), "{}", stderr(&first));
    let run_dir = dir.path().join("b");
    let resume = |extra: &[&str]| {
        let mut cmd = dpo_train();
        cmd.args(["train", "--resume", run_dir.to_str().unwrap(), "--max-steps", "4"]).args(extra);
        finish(cmd, Duration::from_secs(120))
    };
    let three = resume(&["--devices", "cpu:3"]);
    assert_eq!(three.status.code(), Some(1), "{}", stderr(&three));
    assert!(
        stderr(&three).contains("4 pairs do not split over 3 devices: resume on 1, 2, 4 device(s)"),
        "{}",
        stderr(&three)
    );
    // Said once: every rank refuses, and the launcher does not repeat the one shown.
    assert_eq!(stderr(&three).lines().filter(|l| l.starts_with("error:")).count(), 1, "{}", stderr(&three));
    let two = resume(&["--devices", "cpu:2"]);
    assert_eq!(two.status.code(), Some(1), "{}", stderr(&two));
    let said = stderr(&two);
    let advice =
        said.split("add `").nth(1).and_then(|a| a.split('`').next()).unwrap_or_else(|| panic!("no advice: {said}"));
    assert_eq!(advice, "--global-batch-size 4");
    let followed = resume(&["--devices", "cpu:2", "--global-batch-size", "4"]);
    assert!(followed.status.success(), "{}", stderr(&followed));
}

/// Contradictory or oversized device flags are refused before anything starts, one line, exit 1.
#[test]
fn impossible_device_flags_are_refused_up_front() {
    let dir = tempfile::tempdir().unwrap();
    let both = run(dir.path(), "x", &["--devices", "cpu:2", "--device", "cuda:0"]);
    assert_eq!(
        one_line_error(&both),
        "error: `--devices cpu:2` runs CPU processes and `--device cuda:0` asks for a GPU: choose one (`--gpus N` runs one process per GPU)"
    );
    let many = run(dir.path(), "y", &["--devices", "cpu:100000"]);
    assert!(
        one_line_error(&many).starts_with("error: `--devices cpu:100000`: 100000 processes of about"),
        "{}",
        stderr(&many)
    );
    // One process whose weights and optimizer state alone exceed the host's memory and swap (an
    // adapter of rank 10^9 is terabytes) was killed by the kernel mid-allocation, without a word.
    let rank = run(dir.path(), "r", &["--lora-r", "1000000000"]);
    let said = one_line_error(&rank);
    assert!(said.starts_with("error: one process needs about") && said.ends_with("lower `--lora-r`"), "{said}");
    assert_eq!(rank.status.code(), Some(1));
    // Not even one of N fits: fewer processes is not the advice.
    let batch = run(dir.path(), "b", &["--devices", "cpu:2", "--per-device-train-batch-size", "100000000"]);
    assert!(one_line_error(&batch).contains("not even one fits: lower `--per-device-train-batch-size`"));
    let mut bench = dpo_train();
    bench.args(["bench-comm", "--devices", "cpu:1024", "--max-bytes", "68719476736"]);
    assert!(one_line_error(&finish(bench, Duration::from_secs(60))).contains("processes of about"));
    assert!(["x", "y", "r", "b"].iter().all(|name| !dir.path().join(name).exists()));
}

/// A setting that leaves nothing to score is refused with one line (`--max-length 1` kept every
/// pair with no scored token under keep_end, and trained at grad_norm 0); so are the other small
/// bad inputs: a TOML table names its line, an infinite learning rate says finite, a `--resume`
/// with no run to resume is bad input (exit 1).
#[test]
fn settings_that_score_nothing_and_small_bad_inputs_are_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let short = run(dir.path(), "s", &["--max-length", "1", "--truncation-mode", "keep_end"]);
    let want = "error: `--max-length`: must be at least 2: a sequence needs a token to predict from and a completion token to score";
    assert_eq!(one_line_error(&short), want);
    let mut eval = dpo_train();
    eval.args(["eval", "--model", model().to_str().unwrap(), "--data", data().to_str().unwrap(), "--max-length", "1"]);
    assert!(one_line_error(&finish(eval, Duration::from_secs(60))).contains("must be at least 2"));
    let config = dir.path().join("table.toml");
    fs::write(&config, "beta = 0.1\n[section]\nx = 1\n").unwrap();
    let table = run(dir.path(), "t", &["--config", config.to_str().unwrap()]);
    assert!(one_line_error(&table).contains("`, line 2: unknown key `section`"), "{}", stderr(&table));
    let inf = run(dir.path(), "i", &["--learning-rate", "inf"]);
    assert_eq!(one_line_error(&inf), "error: `--learning-rate`: must be finite and > 0, got inf");
    let empty = dir.path().join("empty");
    fs::create_dir(&empty).unwrap();
    let mut resume = dpo_train();
    resume.args(["train", "--resume", "--output-dir", empty.to_str().unwrap(), "--model", model().to_str().unwrap()]);
    assert!(one_line_error(&finish(resume, Duration::from_secs(60))).contains("no run to resume under"));
    assert!(!dir.path().join("s").exists() && !dir.path().join("t").exists());
}

/// A run's directory is never trained over: a new run given the name of a finished one (even one
/// that kept no checkpoint) is refused, and so is a resume of a run whose checkpoints are gone
/// (it started again from step 0 over the metrics and `final/`); nothing in either is rewritten.
#[test]
fn a_finished_run_is_never_trained_over() {
    let dir = tempfile::tempdir().unwrap();
    let first = run(dir.path(), "done", &["--save-strategy", "no"]);
    assert!(first.status.success(), "{}", stderr(&first));
    let done = dir.path().join("done");
    let read = |f: &str| fs::read(done.join(f)).unwrap();
    let (model_before, metrics_before) = (read("final/model.safetensors"), read("metrics.csv"));
    let again = one_line_error(&run(dir.path(), "done", &["--max-steps", "2"]));
    assert!(again.contains("already holds a run: pass `--resume"), "{again}");
    let copy = dir.path().join("copy");
    let second = run(dir.path(), "copy", &[]);
    assert!(second.status.success(), "{}", stderr(&second));
    fs::remove_dir_all(copy.join("checkpoints")).unwrap();
    let metrics = fs::read(copy.join("metrics.csv")).unwrap();
    let mut cmd = dpo_train();
    cmd.args(["train", "--resume", s(&copy), "--max-steps", "5"]);
    let err = one_line_error(&finish(cmd, Duration::from_secs(120)));
    assert!(err.contains("no checkpoint to resume it from"), "{err}");
    assert_eq!(fs::read(copy.join("metrics.csv")).unwrap(), metrics);
    assert_eq!((read("final/model.safetensors"), read("metrics.csv")), (model_before, metrics_before));
}

/// A new run under the name of one whose warm-up has a checkpoint or a `final/` (the run itself
/// killed before its own) is refused: it overwrote the warm-up's checkpoints and metrics, or
/// started DPO from the old warm-up's model whatever its own warm-up settings said.
#[test]
fn a_new_run_never_trains_over_a_warm_up() {
    let dir = tempfile::tempdir().unwrap();
    let first = run(dir.path(), "warm", &["--sft-steps", "2", "--max-steps", "1"]);
    assert!(first.status.success(), "{}", stderr(&first));
    let warm = dir.path().join("warm");
    // As if killed after the warm-up: only `sft/` holds what was trained.
    for gone in ["final", "checkpoints"] {
        fs::remove_dir_all(warm.join(gone)).unwrap();
    }
    let metrics = fs::read(warm.join("sft/metrics.csv")).unwrap();
    let again = one_line_error(&run(dir.path(), "warm", &["--sft-steps", "3", "--max-steps", "1"]));
    assert!(again.contains("already holds a run: pass `--resume"), "{again}");
    fs::remove_dir_all(warm.join("sft/final")).unwrap();
    let again = one_line_error(&run(dir.path(), "warm", &["--sft-steps", "3", "--max-steps", "1"]));
    assert!(again.contains("already holds a run: pass `--resume"), "{again}");
    assert_eq!(fs::read(warm.join("sft/metrics.csv")).unwrap(), metrics);
}

/// A run killed before its first checkpoint (only its metrics.csv there) cannot be resumed, and
/// the refusal says what does train it: its own command again, which is accepted.
#[test]
fn a_run_killed_before_a_checkpoint_is_run_again_as_the_refusal_says() {
    let dir = tempfile::tempdir().unwrap();
    let first = run(dir.path(), "early", &[]);
    assert!(first.status.success(), "{}", stderr(&first));
    let early = dir.path().join("early");
    for gone in ["final", "checkpoints"] {
        fs::remove_dir_all(early.join(gone)).unwrap();
    }
    let mut cmd = dpo_train();
    cmd.args(["train", "--resume", s(&early)]);
    let err = one_line_error(&finish(cmd, Duration::from_secs(120)));
    assert!(
        err.ends_with("over its metrics.csv; run its command again without `--resume` to train it from step 0, or start another run (`--run-name`)"),
        "{err}"
    );
    let again = run(dir.path(), "early", &[]);
    assert!(again.status.success(), "{}", stderr(&again));
}

/// A supervised warm-up stopped by Ctrl-C resumes with its run: the run's `config.toml` is there
/// from its start, the line printed names the run, and `--resume` of the run (or of its `sft/`
/// folder) continues the warm-up from its checkpoint, then trains DPO in the run's directory.
#[test]
fn a_warm_up_stopped_by_ctrl_c_resumes_with_its_run() {
    use std::os::unix::process::CommandExt;
    use std::process::Stdio;
    let dir = tempfile::tempdir().unwrap();
    let extra = ["--sft-steps", "100000", "--logging-steps", "1", "--save-steps", "0"];
    let mut cmd = dpo_train();
    cmd.arg("train").args(short_run(dir.path(), "w", &model(), &data(), &extra));
    let child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).process_group(0).spawn().unwrap();
    let (run_dir, sft) = (dir.path().join("w"), dir.path().join("w/sft"));
    let trained = || fs::read_to_string(sft.join("metrics.csv")).map_or(0, |t| t.lines().count()) >= 3;
    wait_until("the warm-up never trained", Duration::from_secs(90), Duration::from_millis(100), trained);
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let out = crate::common::cli::wait_or_kill(child, Duration::from_secs(90));
    assert_eq!(out.status.code(), Some(130), "{}", stderr(&out));
    assert!(stderr(&out).contains(&format!("resume with `--resume {}`", run_dir.display())), "{}", stderr(&out));
    assert!(run_dir.join("config.toml").is_file());
    let stopped = dpo_train::train::checkpoint::list(&sft).pop().unwrap().0;
    for named in [&sft, &run_dir] {
        // Past the stop by one warm-up step: each resume finishes the warm-up and trains DPO.
        let steps = (stopped + 1).to_string();
        let mut cmd = dpo_train();
        cmd.args(["train", "--resume", s(named), "--sft-steps", &steps, "--resume-with-changes"]);
        let out = finish(cmd, Duration::from_secs(120));
        assert!(out.status.success(), "{}", stderr(&out));
        assert!(
            stderr(&out).contains("resuming sft from") || stderr(&out).contains("already done"),
            "{}",
            stderr(&out)
        );
        assert!(run_dir.join("final/model.safetensors").is_file() && !sft.join("sft").exists());
    }
}

/// A timed SLURM stop (`#SBATCH --signal=TERM@N` to every task, `srun --kill-on-bad-exit=1`): the
/// two tasks save one checkpoint and exit 130, and srun kills whatever task still runs at the
/// first such exit. Rank 0's plots are written by then: no task leaves before them (over Gloo
/// the group's teardown already held each task until rank 0 exited, 30-85 us apart here; the
/// run's last barrier holds them on any backend).
#[test]
fn a_timed_slurm_stop_keeps_rank_0_s_plots() {
    use std::process::{Child, Stdio};
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port().to_string();
    let mut args = short_run(dir.path(), "timed", &model(), &data(), &["--logging-steps", "1", "--device", "cpu"]);
    let steps = args.iter().position(|a| a == "--max-steps").unwrap() + 1;
    args[steps] = "100000".into();
    let mut tasks: Vec<Child> = (0..2)
        .map(|rank: usize| {
            let log = fs::File::create(dir.path().join(format!("task-{rank}.err"))).unwrap();
            let mut cmd = dpo_train();
            cmd.arg("train").args(&args).stdout(Stdio::null()).stderr(log);
            let rank = rank.to_string();
            let env = [("SLURM_PROCID", &*rank), ("SLURM_LOCALID", &*rank), ("SLURM_NTASKS", "2")];
            cmd.envs(env).envs([("SLURM_JOB_ID", "4242"), ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", &*port)]);
            cmd.spawn().unwrap()
        })
        .collect();
    let run = dir.path().join("timed");
    let trained = || fs::read_to_string(run.join("metrics.csv")).map_or(0, |t| t.lines().count()) >= 3;
    wait_until("the tasks never trained", Duration::from_secs(90), Duration::from_millis(100), trained);
    for task in &tasks {
        // SAFETY: a signal to our own child.
        unsafe { libc::kill(task.id() as i32, libc::SIGTERM) };
    }
    // srun: at the first task's exit other than 0, SIGKILL to the others.
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    let first = loop {
        assert!(std::time::Instant::now() < deadline, "no task exited");
        if let Some((rank, status)) =
            tasks.iter_mut().enumerate().find_map(|(rank, t)| t.try_wait().unwrap().map(|s| (rank, s)))
        {
            break (rank, status);
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    assert_eq!(first.1.code(), Some(130), "task {} exited first", first.0);
    for task in &mut tasks {
        let _ = task.kill();
        let _ = task.wait();
    }
    let said = fs::read_to_string(dir.path().join("task-0.err")).unwrap();
    assert!(said.contains("interrupted at step"), "{said}");
    assert_eq!(dpo_train::train::checkpoint::list(&run).len(), 1, "{said}");
    for plot in dpo_train::report::PLOT_FILES {
        assert!(run.join(plot).is_file(), "{plot} missing: {said}");
    }
}
