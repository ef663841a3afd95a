//! `check-gpu --bench` end to end: a fake `dpo-train` (`DPO_TRAIN_BIN`, a shell script printing a
//! canned bench or failing) measured through the binary, and snapshots carrying a bench of the
//! captured A100 machine re-analysed: the table, the `--json` field, the nominal peak warning and
//! the plan's communication time.

#![cfg(unix)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::{Value, json};

const MIB: u64 = 1 << 20;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

/// A test's scratch directory, removed when the test ends, passed or failed.
struct TempDir(tempfile::TempDir);

impl std::ops::Deref for TempDir {
    type Target = Path;

    fn deref(&self) -> &Path {
        self.0.path()
    }
}

fn temp_dir(tag: &str) -> TempDir {
    TempDir(tempfile::Builder::new().prefix(&format!("check-gpu-benchcli-{tag}-")).tempdir().expect("temp dir"))
}

fn run(args: &[&str], dpo_train: Option<&Path>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_check-gpu"));
    cmd.args(args).env("NO_COLOR", "1").env_remove("DPO_TRAIN_VENV");
    match dpo_train {
        Some(p) => cmd.env("DPO_TRAIN_BIN", p),
        None => cmd.env_remove("DPO_TRAIN_BIN"),
    };
    cmd.output().expect("the check-gpu binary runs")
}

fn stdout_json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("stdout is one JSON object ({e}): {}", String::from_utf8_lossy(&out.stdout)))
}

/// Writes an executable script through `sh`, so this multi-threaded test process never holds a
/// write handle a concurrent fork could inherit (running the script would then fail `ETXTBSY`).
fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
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

fn measurement(op: &str, bytes: u64, seconds: f64) -> Value {
    json!({"op": op, "bytes": bytes, "seconds": seconds, "correct": true})
}

/// A bench as dpo-train prints it, over `world_size` ranks.
fn canned(backend: &str, world_size: usize, all_reduce_1g_seconds: f64) -> Value {
    // A CPU without bf16 matrix units multiplies in bf16 at well under 0.01 TFLOP/s.
    let (device, tflops) = if backend == "gloo" { ("cpu", 0.0004) } else { ("cuda:0", 250.0) };
    json!({
        "backend": backend,
        "world_size": world_size,
        "devices": [{"device": device, "copy_gbps": 1500.0, "matmul_tflops": tflops, "matmul_dtype": "bf16"}],
        "collectives": [
            measurement("all_reduce", 16 * MIB, 0.001),
            measurement("all_reduce", 1024 * MIB, all_reduce_1g_seconds),
            measurement("all_gather", 1024 * MIB, 0.05),
            measurement("reduce_scatter", 1024 * MIB, 0.05),
        ],
    })
}

/// The captured 4×A100 PCIe machine saved as a snapshot, with `bench` added.
fn snapshot_with_bench(dir: &Path, gpus: &[u32], bench: Value) -> PathBuf {
    let path = dir.join("snap.json");
    let topo = fixture("a100-pcie-nvbridge.topo.txt");
    let query = fixture("a100-pcie-nvbridge.query.csv");
    let out = run(
        &[
            "--topo",
            topo.to_str().expect("path"),
            "--query",
            query.to_str().expect("path"),
            "--save",
            path.to_str().expect("path"),
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let mut snap: Value = serde_json::from_str(&std::fs::read_to_string(&path).expect("saved")).expect("json");
    assert!(snap.get("bench").is_none(), "no bench unless measured");
    let mut record = bench;
    record["gpus"] = json!(gpus);
    snap["bench"] = record;
    std::fs::write(&path, serde_json::to_string_pretty(&snap).expect("json")).expect("write");
    path
}

/// 1.5B parameters, full fine-tuning: 6e9 bytes of fp32 gradients. Over 4 GPUs the 16 MiB
/// all-reduce (nearest 25 MiB) took 1 ms: algbw 16.777216 GB/s, busbw × 1.5 = 25.165824 GB/s,
/// so 6e9 × 1.5 / 25.165824e9 = 0.357627868 s per step.
#[test]
fn a_saved_bench_gives_the_communication_time() {
    let dir = temp_dir("comm");
    let snap = snapshot_with_bench(&dir, &[0, 1, 2, 3], canned("nccl", 4, 0.1));
    let s = snap.to_str().expect("path");
    let out = run(&["--snapshot", s, "--model-params", "1.5B", "--json"], None);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stdout));
    let v = stdout_json(&out);
    let c = &v["communication"];
    assert_eq!(c["gradient_bytes"], 6_000_000_000u64);
    assert_eq!(c["sharding"], "none");
    assert_eq!(c["transfers"].as_array().map(Vec::len), Some(1), "{c}");
    assert_eq!(c["transfers"][0]["collective"], "all_reduce");
    assert_eq!(c["transfers"][0]["measured_at_bytes"], 16 * MIB);
    assert!((c["seconds_per_step"].as_f64().expect("seconds") - 0.357_627_868_65).abs() < 1e-9, "{c}");
    let b = &v["bench"];
    assert_eq!(b["gpus"], json!([0, 1, 2, 3]));
    assert_eq!(b["collectives"][0]["busbw_gbps"], 25.165_824);
    // Weakest link SYS between the two sockets: PCIe gen4 x16 = 16 × 1.969 GB/s.
    assert_eq!(b["nominal_peak"]["link"], "SYS");
    assert!((b["nominal_peak"]["gbps"].as_f64().expect("peak") - 31.504).abs() < 1e-9);
    assert_eq!(v["warnings"], json!([]));

    let out = run(&["--snapshot", s, "--model-params", "1.5B"], None);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Bench (nccl over GPU(s) 0,1,2,3, dpo-train bench-comm)"), "{text}");
    assert!(text.contains("  16 MiB               16777216     1000.0        16.78        25.17       0"), "{text}");
    assert!(text.contains("  cuda:0                 1500.0      250.00 bf16"), "{text}");
    assert!(text.contains("nominal peak     31.5 GB/s per direction over the weakest link SYS"), "{text}");
    assert!(
        text.contains(
            "communication ~0.36 s per optimizer step: 6.0 GB of gradients all-reduced at 25.2 GB/s measured bus bandwidth (nccl, 16 MiB messages)"
        ),
        "{text}"
    );
}

#[test]
fn slow_or_other_gpus_are_called_out() {
    let dir = temp_dir("slow");
    // 1 GiB all-reduce in 0.2 s: busbw 1.0737 / 0.2 × 1.5 = 8.05 GB/s, below 31.504 / 2.
    let snap = snapshot_with_bench(&dir, &[0, 1, 2, 3], canned("nccl", 4, 0.2));
    let out = run(&["--snapshot", snap.to_str().expect("path"), "--model-params", "1.5B", "--json"], None);
    assert_eq!(out.status.code(), Some(1), "a warning: exit 1");
    let v = stdout_json(&out);
    assert_eq!(
        v["warnings"],
        json!([
            "all_reduce bus bandwidth 8.1 GB/s at 1 GiB is below half the nominal 31.5 GB/s of the weakest link (SYS: PCIe gen4 x16; the CPU interconnect may be slower)"
        ])
    );
    // A bench of two GPUs says nothing about the four the plan chose.
    let snap = snapshot_with_bench(&dir, &[0, 1], canned("nccl", 2, 0.1));
    let v = stdout_json(&run(&["--snapshot", snap.to_str().expect("path"), "--model-params", "1.5B", "--json"], None));
    assert_eq!(v["communication"], Value::Null);
    let notes = v["notes"].as_array().expect("notes");
    assert!(
        notes
            .iter()
            .any(|n| n.as_str().is_some_and(|n| n
                .starts_with("the bench measured GPUs 0,1, not the chosen GPUs 0,1,2,3: no communication estimate"))),
        "{v}"
    );
    // ...but it is the plan's when --world-size 2 picks those two (one NVLink bridge: NV12,
    // 12 links x 25 GB/s = 300 GB/s nominal, far above 16 MiB in 1 ms).
    let v = stdout_json(&run(
        &["--snapshot", snap.to_str().expect("path"), "--model-params", "1.5B", "--world-size", "2", "--json"],
        None,
    ));
    assert_eq!(v["bench"]["nominal_peak"]["gbps"], 300.0);
    assert!(v["communication"]["seconds_per_step"].is_number(), "{v}");
}

#[test]
fn snapshots_round_trip_with_and_without_a_bench() {
    let dir = temp_dir("roundtrip");
    let snap = snapshot_with_bench(&dir, &[0, 1, 2, 3], canned("nccl", 4, 0.1));
    let again = dir.join("again.json");
    let a = stdout_json(&run(
        &["--snapshot", snap.to_str().expect("path"), "--json", "--save", again.to_str().expect("path")],
        None,
    ));
    let b = stdout_json(&run(&["--snapshot", again.to_str().expect("path"), "--json"], None));
    assert_eq!(a, b);
    assert_eq!(b["snapshot"]["bench"]["collectives"][0]["seconds"], 0.001);
    // A snapshot written before --bench existed still loads, with no bench.
    let old = fixture("a100-pcie-busy.snapshot.json");
    let out = run(&["--snapshot", old.to_str().expect("path"), "--json"], None);
    assert!(matches!(out.status.code(), Some(0..=2)), "{}", String::from_utf8_lossy(&out.stderr));
    let v = stdout_json(&out);
    assert_eq!(v["bench"], Value::Null);
    assert_eq!(v["communication"], Value::Null);
}

/// A saved bench whose time is not positive or whose world size is 0 is refused where the value
/// is, as other malformed fields are (it showed as negative microseconds, or planned for 1
/// process, and dropped the communication estimate without a word).
#[test]
fn impossible_bench_values_are_refused_at_their_line() {
    let dir = temp_dir("impossible");
    for (field, value, message) in [
        ("seconds", json!(-0.5), "`seconds` must be a time above 0, found -0.5"),
        ("seconds", json!(0.0), "`seconds` must be a time above 0, found 0"),
        ("world_size", json!(0), "a count of bytes or ranks must be at least 1, found 0"),
        ("bytes", json!(0), "a count of bytes or ranks must be at least 1, found 0"),
    ] {
        let mut bench = canned("nccl", 4, 0.1);
        match field {
            "world_size" => bench[field] = value,
            _ => bench["collectives"][1][field] = value,
        }
        let snap = snapshot_with_bench(&dir, &[0, 1, 2, 3], bench);
        let out = run(&["--snapshot", snap.to_str().expect("path"), "--model-params", "1.5B"], None);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{field}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        let at = format!("{}:", snap.display());
        assert!(err.contains(&at) && err.contains(message), "{field}: {err}");
    }
}

/// `--bench --devices cpu:2` runs the fake dpo-train with its arguments on this machine, with or
/// without NVML.
#[test]
fn bench_runs_dpo_train_and_reports_it() {
    let dir = temp_dir("run");
    let args = dir.join("args.txt");
    let ok = script(
        &dir,
        "dpo-train",
        &format!(
            "#!/bin/sh\necho \"$@\" > '{}'\necho 'measuring...' >&2\necho '{}'\n",
            args.display(),
            canned("gloo", 2, 0.5)
        ),
    );
    let saved = dir.join("cpu.json");
    let out = run(&["--bench", "--devices", "cpu:2", "--json", "--save", saved.to_str().expect("path")], Some(&ok));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("measuring..."), "dpo-train's stderr passes through: {stderr}");
    let v = stdout_json(&out);
    assert_eq!(
        std::fs::read_to_string(&args).expect("args").trim(),
        "bench-comm --devices cpu:2 --min-bytes 1048576 --max-bytes 67108864"
    );
    assert_eq!(v["bench"]["backend"], "gloo");
    assert_eq!(v["bench"]["gpus"], json!([]));
    assert_eq!(v["bench"]["nominal_peak"], Value::Null);
    assert_eq!(v["bench"]["no_peak_reason"], "no nominal peak for CPU processes");
    // Saved either way (a machine without NVML saves no GPU, the bench only), and shown again.
    let text = String::from_utf8_lossy(&run(&["--snapshot", saved.to_str().expect("path")], None).stdout).into_owned();
    assert!(text.contains("Bench (gloo over 2 CPU process(es), dpo-train bench-comm)"), "{text}");
    assert!(text.contains("nominal peak     none: no nominal peak for CPU processes"), "{text}");
    // Printed with its exponent, not as 0.00.
    assert!(text.contains(&format!("  {:<16} {:>12} {:>11} bf16\n", "cpu", "1500.0", "4.0e-4")), "{text}");

    let out = run(&["--bench", "--devices", "cpu:2", "--bench-max-bytes", "4M"], Some(&ok));
    assert_eq!(
        std::fs::read_to_string(&args).expect("args").trim(),
        "bench-comm --devices cpu:2 --min-bytes 1048576 --max-bytes 4194304"
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("  all_reduce            size(B)   time(us)  algbw(GB/s)  busbw(GB/s)  #wrong"), "{text}");

    // The CPU plan's gradient all-reduce at the busbw nearest 25 MiB: 16 MiB in 1 ms over 2 ranks
    // is 16.78 GB/s algbw, x 2(2-1)/2 = 16.78 GB/s busbw.
    // The plan runs the 2 processes benched, whose collectives' time it is.
    let v = stdout_json(&run(&["--bench", "--devices", "cpu:2", "--model-params", "0.5B", "--json"], Some(&ok)));
    assert!(v["command"].as_str().expect("command").contains(" --devices cpu:2 "), "{v}");
    let c = &v["communication"];
    let busbw = 16.0 * MIB as f64 / 0.001 / 1e9;
    assert!((c["transfers"][0]["busbw_gbps"].as_f64().expect("busbw") - busbw).abs() < 1e-9, "{c}");
    let grads = c["gradient_bytes"].as_f64().expect("gradient bytes");
    assert!(grads > 1.8e9 && grads < 2.2e9, "0.5B f32 gradients: {c}");
    assert!((c["seconds_per_step"].as_f64().expect("seconds") - grads / (busbw * 1e9)).abs() < 1e-9, "{c}");
    let out = run(&["--bench", "--devices", "cpu:2", "--model-params", "0.5B"], Some(&ok));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("of gradients all-reduced at 16.8 GB/s measured bus bandwidth"), "{text}");
}

#[test]
fn bench_failures_are_one_line_with_exit_2() {
    let dir = temp_dir("fail");
    let fail = script(&dir, "fail.sh", "#!/bin/sh\necho 'starting' >&2\necho 'Gloo connect timed out' >&2\nexit 1\n");
    let out = run(&["--bench", "--devices", "cpu:2"], Some(&fail));
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last = stderr.lines().last().expect("an error line");
    assert_eq!(
        last,
        format!(
            "check-gpu: error: `{} bench-comm --devices cpu:2 --min-bytes 1048576 --max-bytes 67108864` exited with status 1; last stderr line: Gloo connect timed out",
            fail.display()
        )
    );
    let garbage = script(&dir, "garbage.sh", "#!/bin/sh\necho 'not json'\n");
    let out = run(&["--bench", "--devices", "cpu:2"], Some(&garbage));
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("printed no bench JSON on stdout: expected"), "{stderr}");
    // Flags: --devices needs --bench, --bench measures this machine (not a snapshot), sizes parse.
    for args in [
        vec!["--devices", "cpu:2"],
        vec!["--bench", "--devices", "gpu:2"],
        vec!["--bench", "--bench-max-bytes", "lots"],
        vec!["--bench", "--snapshot", "x.json"],
    ] {
        assert_eq!(run(&args, Some(&fail)).status.code(), Some(3), "{args:?}");
    }
}

/// Under zero3 the plan counts what dpo-train sends per optimizer step: the weights (fp32
/// masters, 4P) all-gathered twice per micro-batch, the fp32 gradients reduce-scattered once per
/// micro-batch and the bf16 reference (2P) gathered once per micro-batch. The canned bench has
/// all-gather and reduce-scatter at 1 GiB in 50 ms only: algbw 21.47483648 GB/s, so with
/// A micro-batches and P = 1.5e9: A × (8 + 4 + 2) × 1.5e9 / 21.47483648e9 s.
#[test]
fn a_sharded_plan_counts_each_stages_collectives() {
    let dir = temp_dir("zero3");
    let snap = snapshot_with_bench(&dir, &[0, 1, 2, 3], canned("nccl", 4, 0.1));
    let s = snap.to_str().expect("path");
    let args = ["--snapshot", s, "--model-params", "1.5B", "--sharding", "zero3", "--json"];
    let v = stdout_json(&run(&args, None));
    assert_eq!(v["dtype"], "bf16", "{v}");
    // Micro-batch 16 over 4 GPUs: one micro-batch per rank per step (the line's ~0.98 s).
    let a = v["grad_accum"].as_u64().expect("accumulation");
    assert_eq!(a, 1, "{v}");
    let c = &v["communication"];
    assert_eq!(c["sharding"], "zero3");
    let ops: Vec<(String, u64, u64)> = c["transfers"]
        .as_array()
        .expect("transfers")
        .iter()
        .map(|t| {
            (
                t["collective"].as_str().expect("op").to_string(),
                t["bytes"].as_u64().expect("b"),
                t["calls"].as_u64().expect("n"),
            )
        })
        .collect();
    let p = 1_500_000_000u64;
    let want = [("all_gather", 4 * p, 2 * a), ("reduce_scatter", 4 * p, a), ("all_gather", 2 * p, a)];
    assert_eq!(ops, want.map(|(op, b, n)| (op.to_string(), b, n)), "{c}");
    let by_hand = a as f64 * 14.0 * 1.5e9 / 21.474_836_48e9;
    assert!((c["seconds_per_step"].as_f64().expect("seconds") - by_hand).abs() < 1e-9, "{c} vs {by_hand}");

    let out = run(&args[..args.len() - 1], None);
    let text = String::from_utf8_lossy(&out.stdout);
    let x = |n: u64| if n > 1 { format!("{n} x ") } else { String::new() };
    let line = format!(
        "communication ~0.98 s per optimizer step under zero3: {}6.0 GB of weights all-gathered at 16.1 GB/s + {}6.0 GB of gradients reduce-scattered at 16.1 GB/s + {}3.0 GB of reference weights all-gathered at 16.1 GB/s measured bus bandwidth (nccl, 1 GiB messages)",
        x(2 * a),
        x(a),
        x(a)
    );
    assert!(text.contains(&line), "{text}");
}

/// More CPU bench processes than the host's memory holds are refused before any starts (one
/// line, exit 3): 1024 processes with two buffers of 64 GiB each fit on no host.
#[test]
fn more_bench_processes_than_the_host_holds_are_refused() {
    let dir = temp_dir("too-many");
    let fake = script(&dir, "dpo-train", "#!/bin/sh\necho started >> \"$0.ran\"\nexit 1\n");
    let out = run(&["--bench", "--devices", "cpu:1024", "--bench-max-bytes", "64G"], Some(&fake));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(err.starts_with("check-gpu: error: `--devices cpu:1024`: 1024 bench processes of about"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(!dir.join("dpo-train.ran").exists(), "a bench process started");
}

/// The bench dies with check-gpu: a `dpo-train` still measuring when check-gpu is killed (by a
/// timeout, say) is killed too, and starts nothing more.
#[test]
fn the_bench_dies_with_check_gpu() {
    let dir = temp_dir("orphan");
    let pid_file = dir.join("bench.pid");
    let body = format!("#!/bin/sh\necho $$ > '{}'\nexec sleep 60\n", pid_file.display());
    let fake = script(&dir, "dpo-train", &body);
    let mut check = Command::new(env!("CARGO_BIN_EXE_check-gpu"))
        .args(["--bench", "--devices", "cpu:2"])
        .env("DPO_TRAIN_BIN", &fake)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("check-gpu runs");
    let started = std::time::Instant::now();
    let pid = loop {
        if let Some(pid) = std::fs::read_to_string(&pid_file).ok().and_then(|p| p.trim().parse::<u32>().ok()) {
            break pid;
        }
        assert!(started.elapsed() < std::time::Duration::from_secs(20), "the bench never started");
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    check.kill().expect("kill check-gpu");
    check.wait().expect("reap check-gpu");
    let gone = (0..100).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(20));
        !Path::new(&format!("/proc/{pid}")).exists()
            || std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| s.contains(") Z "))
    });
    assert!(gone, "the bench (pid {pid}) outlived check-gpu");
}

/// How dpo-train reads the data (its columns, a dataset directory's split, a tokenizer of its own,
/// KTO's rows and `--unpair`) goes to `dpo-train data lengths` as train's own flags, with `--seq-len` as its
/// `--max-length`, and into the printed command after the data; a KTO plan counts rows.
#[test]
fn the_data_is_read_as_the_command_trains_on_it() {
    let dir = temp_dir("reading");
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/models/llama");
    let data = dir.join("pairs.jsonl");
    std::fs::write(&data, "{}\n").expect("data");
    let seen = dir.join("argv");
    let lengths = r#"{"pairs":20,"max_length":512,"packed_longest":[90],"scored_longest":[60]}"#;
    let body = format!("#!/bin/sh\nshift 6\necho \"$@\" > '{}'\necho '{lengths}'\n", seen.display());
    let fake = script(&dir, "lengths.sh", &body);
    let (topo, query) = (fixture("dgx-a100.topo.txt"), fixture("dgx-a100.query.csv"));
    let mut argv = vec!["--topo", topo.to_str().expect("path"), "--query", query.to_str().expect("path")];
    argv.extend(["--model", model.to_str().expect("path"), "--data", data.to_str().expect("path"), "--json"]);
    argv.extend(["--seq-len", "512", "--prompt-column", "question", "--rejected-column", "bad"]);
    argv.extend(["--dataset-train-split", "train_prefs", "--tokenizer", "tok", "--loss-type", "kto", "--unpair"]);
    let v = stdout_json(&run(&argv, Some(&fake)));
    let passed = std::fs::read_to_string(&seen).expect("dpo-train data lengths ran");
    assert_eq!(
        passed.trim(),
        "--prompt-column question --rejected-column bad --dataset-train-split train_prefs --tokenizer-name-or-path tok \
         --unpair true --max-length 512 --loss-type kto"
    );
    let command = v["command"].as_str().expect("command");
    let expected = format!(
        "--train-file {} --prompt-column question --rejected-column bad --dataset-train-split train_prefs \
         --tokenizer-name-or-path tok --unpair true --gpus",
        data.display()
    );
    assert!(command.contains(&expected) && command.ends_with("--loss-type kto"), "{command}");
    let notes = v["notes"].as_array().expect("notes");
    let rows = "planned for the data's longest rows: 20 row(s) tokenised at max length 512";
    assert!(notes.iter().any(|n| n.as_str().is_some_and(|n| n.starts_with(rows))), "{v}");
    // `--unpair` is KTOTrainer's: without a loss it is refused at the flags.
    let without_loss: Vec<&str> = argv.iter().copied().filter(|a| !["--loss-type", "kto"].contains(a)).collect();
    let out = run(&without_loss, Some(&fake));
    assert_eq!(out.status.code(), Some(3));
    // ... and with a loss that reads pairs as they are, one line naming both.
    let cpo: Vec<&str> = argv.iter().map(|a| if *a == "kto" { "cpo" } else { a }).collect();
    let out = run(&cpo, Some(&fake));
    assert_eq!(out.status.code(), Some(3));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("`--unpair` applies to KTOTrainer's losses") && said.contains("not `cpo`"), "{said}");
}

/// `--model M --data D`: the plan counts dpo-train's packed rows from `dpo-train data lengths`
/// (here a fake printing the longest pairs), the micro-batch's tokens summed over the longest;
/// a dpo-train that fails leaves the plan at `--seq-len`, saying why in a note.
#[test]
fn data_lengths_plan_the_packed_rows() {
    let dir = temp_dir("lengths");
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/models/llama");
    let data = dir.join("pairs.jsonl");
    std::fs::write(&data, "{}\n").expect("data");
    let lengths = r#"{"pairs":20,"max_length":1024,"packed_longest":[900,800,700],"scored_longest":[600,500,400]}"#;
    let good =
        script(&dir, "lengths.sh", &format!("#!/bin/sh\n[ \"$1 $2\" = 'data lengths' ] || exit 3\necho '{lengths}'\n"));
    let fail =
        script(&dir, "fail.sh", "#!/bin/sh\necho 'error: `pairs.jsonl` line 1: no `prompt` field' >&2\nexit 1\n");
    let (topo, query) = (fixture("dgx-a100.topo.txt"), fixture("dgx-a100.query.csv"));
    let args = |extra: &[&str]| {
        let mut a = vec!["--topo", topo.to_str().expect("path"), "--query", query.to_str().expect("path")];
        a.extend(["--model", model.to_str().expect("path"), "--data", data.to_str().expect("path"), "--json"]);
        a.extend(extra);
        a.into_iter().map(str::to_owned).collect::<Vec<_>>()
    };
    let argv = args(&["--global-batch", "32"]);
    let v = stdout_json(&run(&argv.iter().map(String::as_str).collect::<Vec<_>>(), Some(&good)));
    // 32 over 8 GPUs: micro-batch 4, the three listed pairs and one more as long as the last.
    assert_eq!(v["micro_batch"], 4, "{v}");
    assert_eq!(v["tokens"], serde_json::json!({"packed": 3100, "scored": 1900, "from_data": true}), "{v}");
    let notes = v["notes"].as_array().expect("notes");
    assert!(
        notes
            .iter()
            .any(|n| n.as_str().is_some_and(|n| n.starts_with("planned for the data's longest pairs: 20 pair(s)"))),
        "{v}"
    );
    // 20 pairs under a global batch of 32: every step is the whole data, which the plan says.
    let whole = "the data's 20 pair(s) are fewer than the global batch of 32: each optimizer step takes all of them";
    assert!(notes.iter().any(|n| n.as_str().is_some_and(|n| n.starts_with(whole))), "{v}");
    // Data dpo-train refuses: a warning, and not ready (training would stop there), exit 2.
    let out = run(&argv.iter().map(String::as_str).collect::<Vec<_>>(), Some(&fail));
    assert_eq!(out.status.code(), Some(2));
    let v = stdout_json(&out);
    assert_eq!(v["status"], "not_ready", "{v}");
    assert_eq!(v["tokens"], serde_json::json!({"packed": 8192, "scored": 8192, "from_data": false}), "{v}");
    let warnings = v["warnings"].as_array().expect("warnings");
    assert!(
        warnings.iter().any(|n| n.as_str()
            == Some("dpo-train cannot read --data (error: `pairs.jsonl` line 1: no `prompt` field): training would stop there; planned for sequences of 1024 tokens (--seq-len)")),
        "{v}"
    );
    // 20 pairs under a micro-batch of 32 (one GPU): the whole data, not 12 more pairs as long
    // as the last listed.
    let one = args(&["--global-batch", "32", "--world-size", "1"]);
    let v = stdout_json(&run(&one.iter().map(String::as_str).collect::<Vec<_>>(), Some(&good)));
    assert_eq!(v["micro_batch"], 32, "{v}");
    assert_eq!(
        v["tokens"],
        serde_json::json!({"packed": 2400 + 17 * 700, "scored": 1500 + 17 * 400, "from_data": true}),
        "{v}"
    );
    // No dpo-train to ask: a note, and the plan at --seq-len.
    let v =
        stdout_json(&run(&argv.iter().map(String::as_str).collect::<Vec<_>>(), Some(&dir.join("no-such-dpo-train"))));
    let notes = v["notes"].as_array().expect("notes");
    assert!(notes.iter().any(|n| n.as_str().is_some_and(|n| n.starts_with("--data's lengths were not read ("))), "{v}");
}

/// Relative `--model` and `--data` are printed absolute: the command runs from any directory
/// (run elsewhere, `models/llama` named no model there).
#[test]
fn the_command_names_local_paths_absolutely() {
    let dir = temp_dir("relative");
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures").canonicalize().expect("fixtures");
    let lengths = r#"{"pairs":20,"max_length":1024,"packed_longest":[900],"scored_longest":[600]}"#;
    let good = script(&dir, "lengths.sh", &format!("#!/bin/sh\necho '{lengths}'\n"));
    let (topo, query) = (fixture("dgx-a100.topo.txt"), fixture("dgx-a100.query.csv"));
    let out = Command::new(env!("CARGO_BIN_EXE_check-gpu"))
        .current_dir(&fixtures)
        .args(["--topo", topo.to_str().expect("path"), "--query", query.to_str().expect("path")])
        .args(["--model", "models/llama", "--data", "data/prefs.jsonl", "--json"])
        .env("NO_COLOR", "1")
        .env("DPO_TRAIN_BIN", &good)
        .output()
        .expect("the check-gpu binary runs");
    let v = stdout_json(&out);
    let command = v["command"].as_str().expect("a command");
    let abs = |p: &str| fixtures.join(p).display().to_string();
    let expected = format!("--model-name-or-path {} --train-file {} ", abs("models/llama"), abs("data/prefs.jsonl"));
    assert!(command.contains(&expected), "{command}");
}

/// KTO's KL completions rotate within each micro-batch, so its lengths depend on it: the plan
/// reads them again at the micro-batch it planned (here a fake whose longest rows grow at 2).
#[test]
fn kto_lengths_are_read_at_the_planned_micro_batch() {
    let dir = temp_dir("kto-lengths");
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/models/llama");
    let data = dir.join("rows.jsonl");
    std::fs::write(&data, "{}\n").expect("data");
    let at8 = r#"{"pairs":8,"max_length":256,"packed_longest":[392,204],"scored_longest":[386,198]}"#;
    let at2 = r#"{"pairs":8,"max_length":256,"packed_longest":[392,392],"scored_longest":[386,386]}"#;
    let body = format!(
        "#!/bin/sh\ncase \"$*\" in *'--per-device-train-batch-size 2'*) echo '{at2}' ;; *) echo '{at8}' ;; esac\n"
    );
    let fake = script(&dir, "lengths.sh", &body);
    let (topo, query) = (fixture("dgx-a100.topo.txt"), fixture("dgx-a100.query.csv"));
    let args = ["--topo", topo.to_str().expect("path"), "--query", query.to_str().expect("path")];
    let more = ["--model", model.to_str().expect("path"), "--data", data.to_str().expect("path"), "--json"];
    let kto = ["--loss-type", "kto", "--global-batch", "2", "--seq-len", "256"];
    let argv: Vec<&str> = args.iter().chain(&more).chain(&kto).copied().collect();
    let v = stdout_json(&run(&argv, Some(&fake)));
    assert_eq!(v["micro_batch"], 2, "{v}");
    assert_eq!(v["tokens"], serde_json::json!({"packed": 784, "scored": 772, "from_data": true}), "{v}");
}
