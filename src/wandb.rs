//! Weights & Biases (`report_to = "wandb"`), through the `wandb` package of a python that has it.
//! A small script of ours runs beside training, reads one JSON message a line on its stdin (the
//! run's settings, then each logged row) and calls `wandb.init`, `log` and `finish` as
//! transformers' `WandbCallback` does: project `WANDB_PROJECT` or `huggingface`, the run's name,
//! the model's and the training's config, every value on the `train/global_step` axis. W&B's own
//! settings come from its environment (`WANDB_MODE`, `WANDB_DIR`, `WANDB_ENTITY`, `WANDB_RUN_ID`,
//! `WANDB_RESUME`, ...), and its messages go to stderr. Logging that fails mid-run warns once and
//! training goes on: the run's own files hold every value. A run dropped without
//! [`WandbRun::finish`] (the stage ended on an error) is marked failed.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};

/// The script: protocol replies on the original stdout, everything else (W&B's messages) on
/// stderr. Ctrl-C is the training's to handle: the run is finished when training says so, or
/// marked failed when its stdin closes without a word.
const SIDECAR: &str = r#"
import json, os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
reply = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
def say(**message):
    reply.write(json.dumps(message) + "\n")
    reply.flush()
try:
    import wandb
    settings = json.loads(sys.stdin.readline())
    run = wandb.init(project=os.getenv("WANDB_PROJECT", "huggingface"), name=settings["name"],
                     config=settings["config"])
    run.define_metric("train/global_step")
    run.define_metric("*", step_metric="train/global_step", step_sync=True)
except BaseException as e:
    say(error=f"{type(e).__name__}: {e}")
    sys.exit(0)
say(ready=run.url or "")
finished = False
for line in sys.stdin:
    message = json.loads(line)
    if "log" in message:
        run.log(message["log"])
    elif "summary" in message:
        run.summary.update(message["summary"])
    elif message.get("finish"):
        finished = True
        break
run.finish(exit_code=0 if finished else 1)
"#;

/// A W&B run fed by the script.
pub struct WandbRun {
    child: Child,
    stdin: Option<ChildStdin>,
}

fn json_map(values: &[(String, f64)]) -> serde_json::Map<String, serde_json::Value> {
    values.iter().map(|(k, v)| (k.clone(), serde_json::json!(v))).collect()
}

/// `python3` on `PATH`, then the python of the venv whose torch this build links: the first of
/// them that imports wandb.
pub fn python() -> Result<PathBuf, String> {
    let venv = Path::new(dpo_torch::TORCH_LIB).ancestors().nth(5).map(|v| v.join("bin/python"));
    python_among(&[Some(PathBuf::from("python3")), venv].into_iter().flatten().collect::<Vec<_>>())
}

/// The first of `candidates` that imports wandb.
pub fn python_among(candidates: &[PathBuf]) -> Result<PathBuf, String> {
    let imports = |python: &Path| {
        let mut probe = Command::new(python);
        probe.args(["-c", "import wandb"]).stdout(Stdio::null()).stderr(Stdio::null());
        probe.status().is_ok_and(|s| s.success())
    };
    candidates.iter().find(|p| imports(p)).cloned().ok_or_else(|| {
        let tried: Vec<String> = candidates.iter().map(|p| format!("`{}`", p.display())).collect();
        format!(
            "`wandb` needs the wandb package, which no python here imports ({}): `pip install wandb`",
            tried.join(", ")
        )
    })
}

/// A W&B run's config as transformers makes it: the model's `config.json` (`model_config`) with
/// the training's settings over it.
pub fn config(model_config: &str, training: &impl serde::Serialize) -> serde_json::Value {
    let mut config: serde_json::Map<String, serde_json::Value> = serde_json::from_str(model_config).unwrap_or_default();
    if let Ok(serde_json::Value::Object(training)) = serde_json::to_value(training) {
        config.extend(training);
    }
    config.into()
}

impl WandbRun {
    /// Starts the W&B run `name` with `config` (a JSON object) under `python`; the error is the
    /// script's or W&B's own.
    pub fn start(python: &Path, name: &str, config: serde_json::Value) -> Result<Self, String> {
        let mut child = Command::new(python)
            .args(["-u", "-c", SIDECAR])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot run `{}`: {e}", python.display()))?;
        let (Some(mut stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err("the wandb script has no pipes".to_owned());
        };
        let settings = serde_json::json!({ "name": name, "config": config });
        let _ = writeln!(stdin, "{settings}");
        let mut first = String::new();
        let _ = BufReader::new(stdout).read_line(&mut first);
        let reply: serde_json::Value = serde_json::from_str(&first).unwrap_or_default();
        if reply.get("ready").is_some() {
            return Ok(Self { child, stdin: Some(stdin) });
        }
        let _ = child.wait();
        Err(match reply.get("error").and_then(|e| e.as_str()) {
            Some(error) => format!("W&B did not start: {error}"),
            None => "the wandb script ended before W&B started (its messages are above)".to_owned(),
        })
    }

    /// Logs `values` at optimizer step `step`. A failure warns once and stops the logging.
    pub fn log(&mut self, values: &[(String, f64)], step: u64) {
        let mut row = json_map(values);
        row.insert("train/global_step".to_owned(), serde_json::json!(step));
        self.send(&serde_json::json!({ "log": row }), &format!("step {step}"));
    }

    /// Sets values of the run's summary (transformers' end-of-training `train_runtime`, ...).
    pub fn summary(&mut self, values: &[(String, f64)]) {
        self.send(&serde_json::json!({ "summary": json_map(values) }), "the summary");
    }

    /// Writes one message to the script; a failure (`at` names what was being logged) warns
    /// once and stops the logging.
    fn send(&mut self, message: &serde_json::Value, at: &str) {
        let Some(stdin) = self.stdin.as_mut() else { return };
        if let Err(e) = writeln!(stdin, "{message}") {
            eprintln!(
                "warning: W&B logging stopped at {at} (the wandb script is gone: {e}); metrics.csv has every value"
            );
            self.stdin = None;
        }
    }

    /// Ends the run as finished: W&B uploads what it holds and prints its summary.
    pub fn finish(mut self) {
        if let Some(mut stdin) = self.stdin.take() {
            let _ = writeln!(stdin, "{}", serde_json::json!({ "finish": true }));
        }
    }
}

impl Drop for WandbRun {
    /// Closes the script's input (without [`WandbRun::finish`] the run is marked failed) and
    /// waits for it.
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_python_without_wandb_is_named_with_the_install() {
        let err = python_among(&[PathBuf::from("/nonexistent/python")]).unwrap_err();
        assert_eq!(
            err,
            "`wandb` needs the wandb package, which no python here imports (`/nonexistent/python`): `pip install wandb`"
        );
    }
}
