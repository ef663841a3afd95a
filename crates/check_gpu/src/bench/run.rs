//! Runs the measurement: check-gpu does not link libtorch, so `dpo-train bench-comm` runs the
//! collectives through its own c10d process group (the one training uses) and prints one
//! [`Bench`] as JSON on stdout; its stderr (progress, NCCL messages) passes through.

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::Bench;

/// Environment variable naming the `dpo-train` binary to run.
pub const BIN_ENV: &str = "DPO_TRAIN_BIN";

/// Where the collectives run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Devices {
    /// This many CPU processes over Gloo.
    Cpu(usize),
    /// These GPUs (NVML indices, PCI bus order) over NCCL.
    Gpus(Vec<u32>),
}

impl Devices {
    /// Parses `--devices`: `cpu:N` with N from 1 to 1024.
    pub fn parse(spec: &str) -> Result<Devices, String> {
        let n = spec
            .trim()
            .strip_prefix("cpu:")
            .and_then(|n| n.parse::<usize>().ok())
            .ok_or_else(|| format!("invalid device spec `{spec}`: expected `cpu:N`, e.g. `cpu:2`"))?;
        if !(1..=1024).contains(&n) {
            return Err(format!("invalid device spec `{spec}`: expected 1 to 1024 CPU processes"));
        }
        Ok(Devices::Cpu(n))
    }

    /// Number of ranks.
    pub fn world_size(&self) -> usize {
        match self {
            Devices::Cpu(n) => *n,
            Devices::Gpus(g) => g.len(),
        }
    }
}

/// What to measure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BenchRequest {
    pub devices: Devices,
    pub min_bytes: u64,
    pub max_bytes: u64,
}

/// Why no bench came back. Each names the command, so the one-line error says what ran.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error(
        "cannot find the dpo-train binary for --bench: `{BIN_ENV}` is not set and `{}` does not exist (build dpo-train, or set {BIN_ENV})",
        next_to.display()
    )]
    NotFound { next_to: PathBuf },
    #[error(
        "--bench: no usable GPU to measure (see the plan's exclusions); measure CPU processes with --devices cpu:N"
    )]
    NothingToMeasure,
    #[error(
        "--bench: NVML could not be loaded, so there is no GPU to measure; measure CPU processes with --devices cpu:N"
    )]
    NoGpuHere,
    #[error("cannot run `{command}`")]
    Spawn {
        command: String,
        #[source]
        source: std::io::Error,
    },
    #[error("`{command}` {status}{}", last_line(.last_stderr))]
    Failed { command: String, status: String, last_stderr: Option<String> },
    #[error("`{command}` printed no bench JSON on stdout: {message}{}", last_line(.last_stderr))]
    Json { command: String, message: String, last_stderr: Option<String> },
    #[error("`{command}` {message}")]
    Invalid { command: String, message: String },
}

fn last_line(line: &Option<String>) -> String {
    line.as_deref().map_or_else(String::new, |l| format!("; last stderr line: {l}"))
}

/// The binary to run: `DPO_TRAIN_BIN` when set and not empty, else `dpo-train` next to the
/// running executable (`cargo build` and installs put both in one directory).
pub fn locate(env_value: Option<OsString>, current_exe: Option<PathBuf>) -> Result<PathBuf, BenchError> {
    if let Some(v) = env_value.filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(v));
    }
    let name = format!("dpo-train{}", std::env::consts::EXE_SUFFIX);
    let next_to = current_exe.as_deref().and_then(Path::parent).map_or_else(|| PathBuf::from(&name), |d| d.join(&name));
    if next_to.is_file() { Ok(next_to) } else { Err(BenchError::NotFound { next_to }) }
}

/// The arguments of `dpo-train` for a request.
pub fn arguments(req: &BenchRequest) -> Vec<String> {
    let devices = match &req.devices {
        Devices::Cpu(n) => vec!["--devices".to_string(), format!("cpu:{n}")],
        // One index alone would read as a count: `3,` is device 3 alone.
        Devices::Gpus(g) if g.len() == 1 => vec!["--gpus".to_string(), format!("{},", g[0])],
        Devices::Gpus(g) => vec!["--gpus".to_string(), crate::units::list(g)],
    };
    let mut args = vec!["bench-comm".to_string()];
    args.extend(devices);
    args.extend(["--min-bytes".to_string(), req.min_bytes.to_string()]);
    args.extend(["--max-bytes".to_string(), req.max_bytes.to_string()]);
    args
}

/// Runs `program` for `req` and parses what it prints.
pub fn run(program: &Path, req: &BenchRequest) -> Result<Bench, BenchError> {
    let args = arguments(req);
    let command = std::iter::once(quote(&program.to_string_lossy()))
        .chain(args.iter().map(|a| quote(a)))
        .collect::<Vec<_>>()
        .join(" ");
    let mut cmd = Command::new(program);
    cmd.args(&args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    if matches!(req.devices, Devices::Gpus(_)) {
        // `--gpus` names NVML indices, which follow PCI bus order; CUDA numbers the GPUs that way
        // only under PCI_BUS_ID, and an inherited CUDA_VISIBLE_DEVICES would renumber them.
        cmd.env("CUDA_DEVICE_ORDER", "PCI_BUS_ID").env_remove("CUDA_VISIBLE_DEVICES");
    }
    // SAFETY: `prctl` is async-signal-safe and touches no memory of the parent; it runs in the
    // forked child before `exec`.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
            // The bench dies with check-gpu (killed by a timeout, say), and its workers with it.
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(|source| BenchError::Spawn { command: command.clone(), source })?;
    // stderr is read on its own thread while stdout is read here, so neither pipe fills up and
    // blocks the child.
    let stderr = child.stderr.take().map(|pipe| std::thread::spawn(move || pass_through(pipe)));
    let mut stdout = String::new();
    let read = child.stdout.take().map_or(Ok(0), |mut pipe| pipe.read_to_string(&mut stdout));
    let status = child.wait().map_err(|source| BenchError::Spawn { command: command.clone(), source })?;
    let last_stderr = stderr.and_then(|t| t.join().ok()).flatten();
    if !status.success() {
        let status = match status.code() {
            Some(code) => format!("exited with status {code}"),
            None => format!("was killed ({status})"),
        };
        return Err(BenchError::Failed { command, status, last_stderr });
    }
    if let Err(e) = read {
        return Err(BenchError::Json { command, message: e.to_string(), last_stderr });
    }
    // NCCL_DEBUG writes to stdout too: the bench is the last line that parses as one.
    let parsed = serde_json::from_str::<Bench>(stdout.trim());
    let bench =
        parsed.or_else(|e| stdout.lines().rev().find_map(|l| serde_json::from_str::<Bench>(l.trim()).ok()).ok_or(e));
    let bench =
        bench.map_err(|e| BenchError::Json { command: command.clone(), message: e.to_string(), last_stderr })?;
    bench.validate(req.devices.world_size()).map_err(|message| BenchError::Invalid { command, message })?;
    Ok(bench)
}

/// Copies the child's stderr to ours line by line and returns its last non-empty line.
fn pass_through(pipe: impl Read) -> Option<String> {
    let mut last = None;
    for line in BufReader::new(pipe).lines() {
        let Ok(line) = line else { break };
        eprintln!("{line}");
        if !line.trim().is_empty() {
            last = Some(line.trim().to_string());
        }
    }
    last
}

/// A word as a shell would need it, so the command in an error can be pasted.
fn quote(word: &str) -> String {
    if !word.is_empty() && word.chars().all(|c| c.is_ascii_alphanumeric() || "-_./:,=+".contains(c)) {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    /// Writes an executable script through `sh`, so this (multi-threaded) test process never
    /// holds a write handle that a concurrent fork could inherit (exec would fail `ETXTBSY`).
    fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
        use std::io::Write;
        let path = dir.join(name);
        let mut child = Command::new("sh")
            .args(["-c", "cat > \"$1\" && chmod +x \"$1\"", "sh"])
            .arg(&path)
            .stdin(Stdio::piped())
            .spawn()
            .expect("sh runs");
        child.stdin.take().expect("stdin").write_all(body.as_bytes()).expect("write script");
        assert!(child.wait().expect("sh exits").success());
        path
    }

    fn temp_dir(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("check-gpu-bench-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        dir
    }

    const CANNED: &str = r#"{"backend":"gloo","world_size":2,"devices":[{"device":"cpu","copy_gbps":5.0,"matmul_tflops":0.1,"matmul_dtype":"bf16"}],"collectives":[{"op":"all_reduce","bytes":1048576,"seconds":0.001,"correct":true}]}"#;

    #[test]
    fn device_specs() {
        assert_eq!(Devices::parse("cpu:2"), Ok(Devices::Cpu(2)));
        assert_eq!(
            Devices::parse("cuda:0"),
            Err("invalid device spec `cuda:0`: expected `cpu:N`, e.g. `cpu:2`".into())
        );
        assert!(Devices::parse("cpu:0").expect_err("zero").contains("1 to 1024"));
        assert_eq!(Devices::Gpus(vec![0, 3]).world_size(), 2);
        let req = BenchRequest { devices: Devices::Gpus(vec![0, 3]), min_bytes: 1 << 20, max_bytes: 1 << 30 };
        assert_eq!(
            arguments(&req),
            ["bench-comm", "--gpus", "0,3", "--min-bytes", "1048576", "--max-bytes", "1073741824"]
        );
        // dpo-train reads a lone number as a count: GPU 3 alone is `3,`.
        let one = BenchRequest { devices: Devices::Gpus(vec![3]), ..req };
        assert_eq!(arguments(&one)[1..3], ["--gpus", "3,"]);
        assert_eq!(quote("a b"), "'a b'");
    }

    #[test]
    fn locates_the_binary() {
        assert_eq!(locate(Some("/x/dpo".into()), None).expect("env wins"), PathBuf::from("/x/dpo"));
        let dir = temp_dir("locate");
        let err = locate(Some(OsString::new()), Some(dir.join("check-gpu"))).expect_err("absent");
        assert_eq!(
            err.to_string(),
            format!(
                "cannot find the dpo-train binary for --bench: `DPO_TRAIN_BIN` is not set and `{}` does not exist (build dpo-train, or set DPO_TRAIN_BIN)",
                dir.join("dpo-train").display()
            )
        );
        let bin = script(&dir, "dpo-train", "#!/bin/sh\n");
        assert_eq!(locate(None, Some(dir.join("check-gpu"))).expect("next to"), bin);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn runs_and_parses_and_reports_failures() {
        let dir = temp_dir("run");
        let args_file = dir.join("args.txt");
        let ok = script(
            &dir,
            "ok.sh",
            &format!(
                "#!/bin/sh\necho \"$@ $CUDA_DEVICE_ORDER\" > '{}'\necho progress >&2\necho '{CANNED}'\n",
                args_file.display()
            ),
        );
        let req = BenchRequest { devices: Devices::Cpu(2), min_bytes: 1 << 20, max_bytes: 4 << 20 };
        let b = run(&ok, &req).expect("canned bench");
        assert_eq!((b.backend.as_str(), b.world_size, b.collectives.len()), ("gloo", 2, 1));
        let args = std::fs::read_to_string(&args_file).expect("args");
        // (CUDA_DEVICE_ORDER is only set for GPUs; on CPU processes whatever the caller had passes.)
        assert!(args.starts_with("bench-comm --devices cpu:2 --min-bytes 1048576 --max-bytes 4194304"), "{args}");
        let gpus = BenchRequest { devices: Devices::Gpus(vec![1, 2]), ..req.clone() };
        run(&ok, &gpus).expect("two GPUs");
        let args = std::fs::read_to_string(&args_file).expect("args");
        assert_eq!(args.trim(), "bench-comm --gpus 1,2 --min-bytes 1048576 --max-bytes 4194304 PCI_BUS_ID");

        let fail = script(
            &dir,
            "fail.sh",
            "#!/bin/sh\necho starting >&2\necho 'NCCL error: unhandled system error' >&2\nexit 1\n",
        );
        let err = run(&fail, &req).expect_err("exit 1").to_string();
        assert_eq!(
            err,
            format!(
                "`{} bench-comm --devices cpu:2 --min-bytes 1048576 --max-bytes 4194304` exited with status 1; last stderr line: NCCL error: unhandled system error",
                fail.display()
            )
        );
        // NCCL_DEBUG's lines on stdout around the JSON do not hide it.
        let noisy = script(
            &dir,
            "noisy.sh",
            &format!(
                "#!/bin/sh\necho 'NCCL INFO Bootstrap'\necho '{CANNED}'\necho 'NCCL INFO comm 0x1 Destroy COMPLETE'\n"
            ),
        );
        assert_eq!(run(&noisy, &req).expect("bench among NCCL's lines").world_size, 2);
        let garbage = script(&dir, "garbage.sh", "#!/bin/sh\necho 'not json'\n");
        let err = run(&garbage, &req).expect_err("bad json").to_string();
        assert!(err.contains("printed no bench JSON on stdout: expected"), "{err}");
        let err = run(&ok, &BenchRequest { devices: Devices::Cpu(4), ..req.clone() }).expect_err("world size");
        assert!(err.to_string().ends_with("reported world size 2, expected 4"), "{err}");
        let err = run(&dir.join("missing"), &req).expect_err("no such file").to_string();
        assert!(err.starts_with("cannot run `"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
