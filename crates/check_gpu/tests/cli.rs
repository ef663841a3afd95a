//! End-to-end tests of the `check-gpu` binary on captured `nvidia-smi` outputs and snapshot JSON
//! of real machine types: chosen GPUs, world size, batch split, key warnings and exit codes.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_check-gpu"))
        .args(args)
        .env("NO_COLOR", "1")
        .env_remove("DPO_TRAIN_VENV")
        .output()
        .expect("the check-gpu binary runs")
}

/// Runs with `--json` on a topo/query pair and returns (exit code, JSON).
fn plan_json(machine: &str, extra: &[&str]) -> (i32, Value) {
    json_of(&run_on(machine, &[&["--json"][..], extra].concat()))
}

/// Runs on a topo/query pair with `extra` flags (the text report).
fn run_on(machine: &str, extra: &[&str]) -> Output {
    let (topo, query) = (fixture(&format!("{machine}.topo.txt")), fixture(&format!("{machine}.query.csv")));
    let mut args = vec!["--topo", topo.to_str().expect("utf-8 path"), "--query", query.to_str().expect("utf-8 path")];
    args.extend_from_slice(extra);
    run(&args)
}

fn json_of(out: &Output) -> (i32, Value) {
    let code = out.status.code().expect("exit code");
    let v: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("stdout is one JSON object ({e}): {}", String::from_utf8_lossy(&out.stdout)));
    (code, v)
}

fn gpus(v: &Value) -> Vec<u64> {
    v["gpus"].as_array().expect("gpus").iter().filter_map(Value::as_u64).collect()
}

fn warnings(v: &Value) -> Vec<String> {
    v["warnings"].as_array().expect("warnings").iter().filter_map(|w| w.as_str().map(str::to_string)).collect()
}

fn excluded(v: &Value) -> Vec<(u64, String)> {
    v["excluded"]
        .as_array()
        .expect("excluded")
        .iter()
        .map(|e| (e["index"].as_u64().expect("index"), e["reason"].as_str().expect("reason").to_string()))
        .collect()
}

fn split(v: &Value) -> (u64, u64, u64, u64) {
    let n = |k: &str| v[k].as_u64().unwrap_or_else(|| panic!("{k}"));
    (n("world_size"), n("micro_batch"), n("grad_accum"), n("global_batch"))
}

#[test]
fn json_has_the_documented_keys() {
    let (_, v) = plan_json("dgx-a100", &["--model-params", "1.5B"]);
    for key in [
        "schema_version",
        "world_size",
        "gpus",
        "excluded",
        "micro_batch",
        "grad_accum",
        "global_batch",
        "lr_scale",
        "memory_per_gpu_bytes",
        "env",
        "command",
        "warnings",
    ] {
        assert!(v.get(key).is_some(), "missing top-level key `{key}`");
    }
    assert!(v["lr_scale"]["linear"].is_number() && v["lr_scale"]["sqrt"].is_number());
    assert!(v["env"].is_object());
}

#[test]
fn dgx_a100_uses_all_eight() {
    let (code, v) = plan_json("dgx-a100", &["--global-batch", "64", "--model-params", "1.5B"]);
    assert_eq!(code, 0, "{v}");
    assert_eq!(gpus(&v), (0..8).collect::<Vec<_>>());
    let (w, m, a, g) = split(&v);
    assert_eq!((w, m, a, g), (8, 8, 1, 64));
    assert_eq!(m * w * a, g);
    assert_eq!(v["topology"]["nvlink_islands"], serde_json::json!([[0, 1, 2, 3, 4, 5, 6, 7]]));
    assert_eq!(v["topology"]["numa_groups"].as_array().expect("groups").len(), 4);
    assert_eq!(v["env"]["CUDA_DEVICE_ORDER"], "PCI_BUS_ID");
    assert_eq!(v["env"]["CUDA_VISIBLE_DEVICES"], "0,1,2,3,4,5,6,7");
    assert_eq!(v["env"]["OMP_NUM_THREADS"], "16");
    assert!(v["env"].get("NCCL_P2P_DISABLE").is_none());
    assert_eq!(
        v["command"],
        "dpo-train train --model-name-or-path YOUR_MODEL_DIR --train-file YOUR_DATA.jsonl --gpus 8 --per-device-train-batch-size 8 --gradient-accumulation-steps 1 \
         --global-batch-size 64 --max-length 1024 --bf16 true --fp16 false --precompute-ref-log-probs false \
         --gradient-checkpointing false --sharding none --offload-optimizer false"
    );
}

#[test]
fn dgx_a100_text_report() {
    let topo = fixture("dgx-a100.topo.txt");
    let query = fixture("dgx-a100.query.csv");
    let out = run(&[
        "--topo",
        topo.to_str().expect("path"),
        "--query",
        query.to_str().expect("path"),
        "--global-batch",
        "64",
        "--model-params",
        "1.5B",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("  GPU0  X     NV12  NV12"), "{text}");
    assert!(text.contains("NVLink islands: [0,1,2,3,4,5,6,7]"), "{text}");
    assert!(text.contains("NUMA groups: node 1: [2,3], node 3: [0,1], node 5: [6,7], node 7: [4,5]"), "{text}");
    assert!(text.contains("micro-batch 8 x 8 GPU(s) x accumulation 1 = global batch 64"), "{text}");
    assert!(text.contains("export CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7"), "{text}");
    assert!(!text.contains('\u{1b}'), "no colour when stdout is not a terminal");
}

#[test]
fn dgx_h100_with_nics() {
    let (code, v) = plan_json("dgx-h100", &["--model-params", "1.5B"]);
    assert_eq!(code, 0, "{v}");
    assert_eq!(gpus(&v).len(), 8);
    assert_eq!(split(&v), (8, 8, 1, 64));
    assert_eq!(v["env"]["OMP_NUM_THREADS"], "28");
    assert_eq!(
        v["topology"]["numa_groups"],
        serde_json::json!([{"node": 0, "gpus": [0, 1, 2, 3]}, {"node": 1, "gpus": [4, 5, 6, 7]}])
    );
    assert_eq!(v["snapshot"]["pairs"][0]["link"], "NV18");
}

/// Unsharded, a 1.5B full fine-tuning fits on neither 15 GiB T4 (what would is listed).
#[test]
fn t4_pair_full_fine_tuning_does_not_fit() {
    let (code, v) = plan_json("t4x2-phb", &["--model-params", "1.5B", "--sharding", "none"]);
    assert_eq!(code, 2, "{v}");
    assert_eq!(v["world_size"], 0);
    assert!(warnings(&v)[0].starts_with("nothing fits: even micro-batch 1"), "{v}");
    let alts = v["alternatives"].as_array().expect("alternatives");
    let lora = alts
        .iter()
        .find(|a| a["flags"] == "--lora-r 16 --lora-target-modules q_proj,k_proj,v_proj,o_proj")
        .expect("LoRA is suggested");
    assert_eq!(lora["fits"], true);
    assert!(alts.iter().any(|a| a["flags"] == "--gradient-checkpointing"));
    assert!(alts.iter().any(|a| a["flags"] == "--precompute-ref-log-probs"));
    assert_eq!(v["dtype"], "fp16", "T4 has no bf16");
}

/// With `--sharding auto` the pair shards it: only zero3 with the optimizer offloaded fits.
#[test]
fn t4_pair_full_fine_tuning_needs_zero3_and_offload() {
    let (code, v) = plan_json("t4x2-phb", &["--model-params", "1.5B"]);
    assert_eq!(code, 0, "{v}");
    assert_eq!((v["sharding"].as_str(), v["offload_optimizer"].as_bool()), (Some("zero3"), Some(true)), "{v}");
    assert!(v["alternatives"].as_array().expect("alternatives").is_empty());
    let cmd = v["command"].as_str().expect("command");
    let tail = " --fp16 true --precompute-ref-log-probs false --gradient-checkpointing true --sharding zero3 --offload-optimizer true";
    assert!(cmd.ends_with(tail), "{cmd}");
    // The fp32 master and AdamW's moments, 12 bytes per parameter over two ranks: 12 * 1.5e9 / 2
    // of host memory per GPU.
    assert_eq!(v["memory"]["host"], 9_000_000_000u64);
    assert_eq!(v["memory"]["optimizer"], 0);
}

#[test]
fn t4_pair_with_lora_is_ready() {
    let (code, v) = plan_json("t4x2-phb", &["--model-params", "1.5B", "--lora", "16"]);
    assert_eq!(code, 0, "{v}");
    assert_eq!(gpus(&v), vec![0, 1]);
    assert_eq!(split(&v), (2, 2, 16, 64));
    let cmd = v["command"].as_str().expect("command");
    assert!(
        cmd.contains("--fp16")
            && cmd.contains("--lora-r 16")
            && cmd.starts_with(
                "dpo-train train --model-name-or-path YOUR_MODEL_DIR --train-file YOUR_DATA.jsonl --gpus 2 "
            ),
        "{cmd}"
    );
    assert_eq!(v["env"]["OMP_NUM_THREADS"], "4");
}

#[test]
fn t4_bf16_requested_warns() {
    let (code, v) = plan_json("t4x2-phb", &["--model-params", "500M", "--lora", "8", "--dtype", "bf16"]);
    assert_eq!(code, 1, "{v}");
    assert!(warnings(&v).iter().any(|w| w.contains("bf16 needs compute capability 8.0")), "{v}");
}

/// A query without `compute_cap` (drivers before R510): bf16 follows the GPUs' names, and a GPU
/// no name places plans in fp16 with a warning, never bf16 unchecked.
#[test]
fn without_compute_capability_bf16_follows_the_name() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let topo = fixture("t4x2-phb.topo.txt");
    let query_of = |name: &str| {
        let path = dir.path().join(format!("{}.csv", name.replace(' ', "_")));
        let rows: String = (0..2)
            .map(|i| format!("{i}, {name}, GPU-{i}, 00000000:00:0{}.0, 15360 MiB, 0 MiB, 14930 MiB\n", 4 + i))
            .collect();
        let header = "index, name, uuid, pci.bus_id, memory.total [MiB], memory.used [MiB], memory.free [MiB]\n";
        std::fs::write(&path, format!("{header}{rows}")).expect("the query file");
        path
    };
    for (name, dtype, warned) in
        [("Tesla T4", "fp16", false), ("NVIDIA L4", "bf16", false), ("Mystery GPU", "fp16", true)]
    {
        let query = query_of(name);
        let args = ["--topo", topo.to_str().unwrap(), "--query", query.to_str().unwrap(), "--model-params", "500M"];
        let (code, v) = json_of(&run(&[&args[..], &["--lora", "8", "--json"]].concat()));
        assert_eq!(v["dtype"], dtype, "{name}: {v}");
        let unknown = warnings(&v).iter().any(|w| w.contains("compute capability of GPU 0 (Mystery GPU) is unknown"));
        assert_eq!((unknown, code == 1), (warned, warned), "{name}: {v}");
    }
    let query = query_of("Tesla V100-PCIE-16GB");
    let args = ["--topo", topo.to_str().unwrap(), "--query", query.to_str().unwrap(), "--model-params", "500M"];
    let (_, v) = json_of(&run(&[&args[..], &["--lora", "8", "--dtype", "bf16", "--json"]].concat()));
    let older = "bf16 needs compute capability 8.0 or newer and the chosen GPUs include GPU 0 (Tesla V100-PCIE-16GB), older than that";
    assert!(warnings(&v).iter().any(|w| w.contains(older)), "{v}");
}

#[test]
fn rtx4090_two_sockets_all_sys() {
    let (code, v) = plan_json("rtx4090x8-sys", &["--model-params", "1.5B", "--lora", "16"]);
    assert_eq!(code, 1, "{v}");
    assert_eq!(gpus(&v).len(), 8);
    assert_eq!(split(&v), (8, 4, 2, 64));
    assert_eq!(v["env"]["NCCL_P2P_DISABLE"], "1");
    assert_eq!(v["env"]["NCCL_IB_DISABLE"], "1");
    assert!(warnings(&v).iter().any(|w| w.contains("RTX 40xx with driver 535.129.03")), "{v}");
    assert_eq!(v["topology"]["nvlink_islands"], serde_json::json!([]));
    assert_eq!(v["topology"]["numa_groups"].as_array().expect("groups").len(), 2);
}

#[test]
fn rtx4090_world_size_four_keeps_to_one_numa_node() {
    let (_, v) = plan_json("rtx4090x8-sys", &["--model-params", "1.5B", "--lora", "16", "--world-size", "4"]);
    assert_eq!(gpus(&v), vec![0, 1, 2, 3]);
    assert!(
        v["notes"]
            .as_array()
            .expect("notes")
            .iter()
            .any(|n| { n.as_str().is_some_and(|n| n.contains("kept to NUMA node 0")) })
    );
}

/// The issue's headline case: four 24 GB RTX 4090s (PCIe only) cannot hold a full replica of a
/// 1.5B model in bf16 (weights, gradients and AdamW state alone are 27 GB). zero1 fits at
/// micro-batch 1 and one pair a GPU a step (dpo-train keeps bf16 weights beside fp32 masters
/// sharded over the GPUs), but not accumulating a global batch of 64 at micro-batch 1: the 16
/// passes' summed fp32 gradients (6 GB) stay through them. zero2 with activation checkpointing
/// runs a GPU's 16 pairs in one pass.
#[test]
fn rtx4090x4_full_fine_tuning_shards() {
    let (code, v) = plan_json("rtx4090x4-node", &["--model-params", "1.5B"]);
    assert_eq!(code, 0, "{v}");
    assert_eq!(gpus(&v), vec![0, 1, 2, 3]);
    assert_eq!(split(&v), (4, 16, 1, 64));
    assert_eq!((v["sharding"].as_str(), v["offload_optimizer"].as_bool()), (Some("zero2"), Some(false)), "{v}");
    assert_eq!(v["gradient_checkpointing"], true);
    assert_eq!(
        v["command"],
        "dpo-train train --model-name-or-path YOUR_MODEL_DIR --train-file YOUR_DATA.jsonl --gpus 4 --per-device-train-batch-size 16 --gradient-accumulation-steps 1 \
         --global-batch-size 64 --max-length 1024 --bf16 true --fp16 false --precompute-ref-log-probs false \
         --gradient-checkpointing true --sharding zero2 --offload-optimizer false"
    );
    assert!(warnings(&v).is_empty() && v["alternatives"].as_array().expect("alternatives").is_empty(), "{v}");
    let (code, v) = plan_json("rtx4090x4-node", &["--model-params", "1.5B", "--global-batch", "4"]);
    assert_eq!(code, 0, "{v}");
    assert_eq!(split(&v), (4, 1, 1, 4));
    assert_eq!((v["sharding"].as_str(), v["gradient_checkpointing"].as_bool()), (Some("zero1"), Some(false)), "{v}");
    // Weights: bf16 copies of all but the embedding (E = 151936 * 1536), their fp32 masters over
    // 4 GPUs, the embedding whole in fp32 and its bf16 cast for the tied head.
    let (p, e) = (1_500_000_000u64, 233_373_696u64);
    assert_eq!(v["memory"]["weights"], 2 * (p - e) + (p - e) + 4 * e + 2 * e);
    assert_eq!(v["memory"]["optimizer"], 3_000_000_000u64);
    // zero2 with checkpointing: each layer casts its fp32 weights as it runs.
    let (code, v) =
        plan_json("rtx4090x4-node", &["--model-params", "1.5B", "--sharding", "zero2", "--gradient-checkpointing"]);
    assert_eq!(code, 0, "{v}");
    assert_eq!(split(&v), (4, 16, 1, 64));
    assert_eq!(v["gradient_checkpointing"], true);
    // Gradients: 4 * 1.5e9 / 4 + the largest piece in flight (the embedding, at 4 B), and the
    // step's updated slices, 4 * 1.5e9 / 4, exist once the activations and the head's buffers are freed:
    // counted beyond what those hold (more than the LM head's 4 B x 151936 * 1536 beside them).
    let freed = v["memory"]["activations"].as_u64().expect("bytes") + v["memory"]["logits"].as_u64().expect("bytes");
    assert_eq!(v["memory"]["gradients"], (2 * p + 4 * e).saturating_sub(freed).max(4 * e));
    // AdamW: 8 * 1.5e9 / 4; the fp32 weights whole, plus the largest piece's bf16 cast.
    assert_eq!(v["memory"]["optimizer"], 3_000_000_000u64);
    assert_eq!(v["memory"]["weights"], 4 * p + 2 * e);
    assert_eq!(v["memory"]["host"], 0);
    // As a full replica, as check-gpu planned it before sharding: nothing fits, only LoRA would.
    let (code, none) = plan_json("rtx4090x4-node", &["--model-params", "1.5B", "--sharding", "none"]);
    assert_eq!(code, 2, "{none}");
    assert!(warnings(&none)[0].starts_with("nothing fits: even micro-batch 1"), "{none}");
    let fitting: Vec<&Value> =
        none["alternatives"].as_array().expect("alternatives").iter().filter(|a| a["fits"] == true).collect();
    assert!(
        !fitting.is_empty()
            && fitting.iter().all(|a| a["flags"].as_str().is_some_and(|f| f.starts_with("--lora-r 16")))
    );
}

#[test]
fn rtx4090x4_text_report_names_the_stage() {
    let (topo, query) = (fixture("rtx4090x4-node.topo.txt"), fixture("rtx4090x4-node.query.csv"));
    let out = run(&[
        "--topo",
        topo.to_str().expect("path"),
        "--query",
        query.to_str().expect("path"),
        "--model-params",
        "1.5B",
        // One pair a GPU a step: no accumulation, and zero1 fits.
        "--global-batch",
        "4",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("  sharding     zero1 over 4 GPU(s) (AdamW state partitioned)\n"), "{text}");
    assert!(text.contains("    weights         4.8 GiB  2 B/param (bf16) + 4 B/param fp32 master / 4 GPUs (the embedding: 4 B/param whole, cast to bf16 for the head)\n"), "{text}");
    assert!(text.contains(" + 2 B/param / 4 GPUs (the step's updated slices)"), "{text}");
    assert!(text.contains("    optimizer       2.8 GiB  8 B/param / 4 GPUs (AdamW m, v in fp32)\n"), "{text}");
    assert!(text.contains("  - a full replica needs 33.6 GiB per GPU even at micro-batch 1, more than is free: zero1 over 4 GPUs needs 19.9 GiB\n"), "{text}");
    assert!(text.contains(" --gradient-checkpointing false --sharding zero1 --offload-optimizer false\n"), "{text}");
}

/// `--sharding STAGE` and `--offload-optimizer` estimate that choice instead of searching.
#[test]
fn fixed_stage_and_offload() {
    let (code, v) =
        plan_json("rtx4090x4-node", &["--model-params", "1.5B", "--sharding", "zero3", "--offload-optimizer"]);
    assert_eq!(code, 0, "{v}");
    assert_eq!((v["sharding"].as_str(), v["offload_optimizer"].as_bool()), (Some("zero3"), Some(true)));
    let cmd = v["command"].as_str().expect("command");
    assert!(cmd.ends_with(" --bf16 true --fp16 false --precompute-ref-log-probs false --gradient-checkpointing true --sharding zero3 --offload-optimizer true"), "{cmd}");
    // The fp32 masters and moments of this rank's quarter: 12 * 1.5e9 / 4.
    assert_eq!(v["memory"]["host"], 4_500_000_000u64);
    // A stage that does not fit is not replaced by another.
    let (code, none) = plan_json("rtx4090x4-node", &["--model-params", "3B", "--sharding", "zero1"]);
    assert_eq!((code, none["sharding"].as_str()), (2, Some("zero1")), "{none}");
    // One GPU: nothing to shard over, so the search offloads the optimizer alone.
    let (code, one) = plan_json("rtx4090x4-node", &["--model-params", "1.5B", "--world-size", "1"]);
    assert_eq!(code, 0, "{one}");
    assert_eq!((one["sharding"].as_str(), one["offload_optimizer"].as_bool()), (Some("none"), Some(true)));
    let cmd = one["command"].as_str().expect("command");
    assert!(cmd.ends_with(" --gradient-checkpointing false --sharding none --offload-optimizer true"), "{cmd}");
    assert_eq!(one["memory"]["host"], 18_000_000_000u64);
}

#[test]
fn sharding_flag_errors() {
    let topo = fixture("rtx4090x4-node.topo.txt");
    let topo = topo.to_str().expect("utf-8 path");
    let out = run(&["--topo", topo, "--sharding", "zero4"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert_eq!(
        stderr,
        "check-gpu: error: invalid value 'zero4' for '--sharding <STAGE>' [possible values: auto, none, zero1, zero2, zero3]; tip: a similar value exists: 'zero3' (see --help)\n"
    );
    let out = run(&["--topo", topo, "--sharding", "zero2", "--world-size", "1"]);
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "check-gpu: error: `--sharding zero2` partitions over two GPUs or more and `--world-size 1` allows one\n"
    );
    // The offload is a switch, and `none` on one GPU is a plan like any other.
    assert_eq!(run(&["--topo", topo, "--offload-optimizer=true"]).status.code(), Some(3));
    assert!(run(&["--topo", topo, "--sharding", "none", "--world-size", "1"]).status.code().is_some_and(|c| c < 3));
}

/// Flag errors are one `check-gpu: error:` line, exit 3; `--help` and `--version` exit 0. The
/// bench's own flags conflict with offline input instead of being ignored.
#[test]
fn flag_errors_are_one_line() {
    let topo = fixture("t4x2-phb.topo.txt");
    let topo = topo.to_str().expect("utf-8 path");
    for args in [
        &["--topo", topo, "--devices", "cpu:2"][..],
        &["--topo", topo, "--bench-max-bytes", "1M"],
        &["--snapshot", topo, "--devices", "cpu:2", "--bench"],
        &["--no-such-flag"],
        &["--devices", "cpu:2"],
        &["--global-batch", "0"],
        // dpo-train's --max-length takes 2 at least: a plan at 1 printed a command it refused.
        &["--seq-len", "1"],
    ] {
        let out = run(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{args:?}: {stderr}");
        assert!(stderr.starts_with("check-gpu: error: ") && stderr.lines().count() == 1, "{args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
    let out = run(&["--topo", topo, "--devices", "cpu:2"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("'--topo <TOPO.txt>' cannot be used with"));
    for flag in ["--help", "--version"] {
        let out = run(&[flag]);
        assert_eq!(out.status.code(), Some(0), "{flag}");
        assert!(!out.stdout.is_empty() && out.stderr.is_empty(), "{flag}");
    }
    // The help opens with what the program does (a flattened group's text once stood there).
    let help = String::from_utf8_lossy(&run(&["--help"]).stdout).into_owned();
    assert!(help.starts_with("Inspect NVIDIA GPUs (NVML, NCCL, PCIe/NVLink topology) and plan"), "{help}");
}

/// A `--save` path that cannot be written: the plan is still printed, then the path, exit 3.
#[test]
fn unwritable_save_path_prints_the_plan_and_exits_3() {
    let (topo, query) = (fixture("t4x2-phb.topo.txt"), fixture("t4x2-phb.query.csv"));
    let save = std::env::temp_dir().join(format!("check-gpu-no-dir-{}", std::process::id())).join("s.json");
    let out = run(&[
        "--topo",
        topo.to_str().expect("utf-8 path"),
        "--query",
        query.to_str().expect("utf-8 path"),
        "--save",
        save.to_str().expect("utf-8 path"),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("dpo-train train --model-name-or-path YOUR_MODEL_DIR"));
    assert!(stderr.starts_with(&format!("check-gpu: error: cannot write snapshot `{}`: ", save.display())), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
}

#[test]
fn nvlink_bridged_pairs() {
    let (code, v) = plan_json("a100-pcie-nvbridge", &["--model-params", "1.5B"]);
    assert_eq!(code, 0, "{v}");
    assert_eq!(gpus(&v), vec![0, 1, 2, 3]);
    assert_eq!(split(&v), (4, 8, 2, 64));
    assert_eq!(v["topology"]["nvlink_islands"], serde_json::json!([[0, 1], [2, 3]]));
    let (_, two) = plan_json("a100-pcie-nvbridge", &["--model-params", "1.5B", "--world-size", "2"]);
    assert_eq!(gpus(&two), vec![0, 1], "two GPUs stay on one NVLink bridge");
    assert_eq!(split(&two), (2, 8, 4, 64));
}

#[test]
fn degraded_link_is_excluded() {
    let (code, v) = plan_json("a100-degraded", &["--model-params", "1.5B", "--lora", "16"]);
    assert_eq!(code, 1, "{v}");
    assert_eq!(gpus(&v), vec![0, 1, 3]);
    assert_eq!(
        excluded(&v),
        vec![(2, "degraded PCIe link: x8 of x16 (reseat the card or check the riser)".to_string())]
    );
    // 21 pairs per GPU: micro-batch 3 (the largest divisor that fits), not 1, the largest power of two.
    assert_eq!(split(&v), (3, 7, 3, 63));
    assert!(
        warnings(&v)
            .iter()
            .any(|w| w.starts_with("global batch 64 cannot be split exactly over 3 GPUs: it rounds to 63")),
        "{v}"
    );
}

#[test]
fn other_model_is_excluded() {
    let (code, v) = plan_json("mixed-a6000", &["--model-params", "1.5B", "--global-batch", "48"]);
    assert_eq!(code, 1, "{v}");
    assert_eq!(gpus(&v), vec![0, 1, 2]);
    let ex = excluded(&v);
    assert_eq!(ex.len(), 1);
    assert_eq!(ex[0].0, 3);
    assert!(ex[0].1.starts_with("different model (NVIDIA RTX A4000)"), "{}", ex[0].1);
    let (w, m, a, g) = split(&v);
    assert_eq!((w, g), (3, 48));
    assert_eq!(m * a, 16);
}

#[test]
fn ecc_and_hardware_throttle_from_extra_columns() {
    let q = fixture("a100-ecc-throttle.query.csv");
    let (code, v) = json_of(&run(&["--json", "--query", q.to_str().expect("path"), "--model-params", "1.5B"]));
    assert_eq!(code, 1, "{v}");
    assert_eq!(gpus(&v), vec![0, 2]);
    let ex = excluded(&v);
    assert!(ex[0].1.contains("2 uncorrectable ECC error(s)"), "{ex:?}");
    assert!(ex[1].1.contains("throttled by hardware (hw_slowdown)"), "{ex:?}");
    // A query alone says nothing of the links: islands unknown, not none, and said so.
    assert_eq!(
        (v["topology"]["links_known"].as_bool(), v["topology"]["nvlink_islands"].as_array().map(Vec::len)),
        (Some(false), Some(0))
    );
    assert!(warnings(&v).iter().any(|w| w.starts_with("the links between the GPUs are unknown (no --topo)")), "{v}");
    let text = run(&["--query", q.to_str().expect("path"), "--model-params", "1.5B"]);
    assert!(String::from_utf8_lossy(&text.stdout).contains("NVLink islands: unknown (no --topo)"));
}

#[test]
fn busy_gpu_snapshot() {
    let s = fixture("a100-pcie-busy.snapshot.json");
    let (code, v) = json_of(&run(&["--json", "--snapshot", s.to_str().expect("path"), "--model-params", "1.5B"]));
    assert_eq!(code, 1, "{v}");
    assert_eq!(gpus(&v), vec![0, 1, 3]);
    assert_eq!(excluded(&v), vec![(2, "busy: 1 other process(es) hold 31.5 GiB (pid 48213)".to_string())]);
    assert_eq!(v["env"]["NCCL_P2P_DISABLE"], "1", "P2P is not available across the sockets");
    // With two GPUs the batch splits exactly and the pair shares an NVLink bridge.
    let (code, two) = json_of(&run(&[
        "--json",
        "--snapshot",
        s.to_str().expect("path"),
        "--model-params",
        "1.5B",
        "--world-size",
        "2",
    ]));
    assert_eq!(code, 1, "GPU 2 is still excluded");
    assert_eq!(gpus(&two), vec![0, 1]);
    assert!(two["env"].get("NCCL_P2P_DISABLE").is_none());
    assert_eq!(split(&two), (2, 8, 4, 64));
}

#[test]
fn mig_gpu_snapshot() {
    let s = fixture("dgx-a100-mig.snapshot.json");
    let (code, v) = json_of(&run(&[
        "--json",
        "--snapshot",
        s.to_str().expect("path"),
        "--model-params",
        "1.5B",
        "--device-ids",
        "uuid",
    ]));
    assert_eq!(code, 1, "{v}");
    assert_eq!(gpus(&v), (0..7).collect::<Vec<_>>());
    assert!(excluded(&v)[0].1.starts_with("MIG mode is enabled"));
    assert_eq!(split(&v), (7, 9, 1, 63));
    assert!(v["env"]["CUDA_VISIBLE_DEVICES"].as_str().expect("visible").starts_with("GPU-1f2ae3c1-"));
}

#[test]
fn save_then_snapshot_round_trips() {
    let dir = std::env::temp_dir().join(format!("check-gpu-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let snap = dir.join("snap.json");
    let topo = fixture("a100-pcie-nvbridge.topo.txt");
    let query = fixture("a100-pcie-nvbridge.query.csv");
    let (_, a) = json_of(&run(&[
        "--json",
        "--topo",
        topo.to_str().expect("path"),
        "--query",
        query.to_str().expect("path"),
        "--save",
        snap.to_str().expect("path"),
    ]));
    let (_, b) = json_of(&run(&["--json", "--snapshot", snap.to_str().expect("path")]));
    assert_eq!(a, b);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn live_probe_without_driver() {
    let out = run(&[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked") && !stderr.contains("backtrace"), "{stderr}");
    if stdout.contains("NVML could not be loaded") {
        assert_eq!(out.status.code(), Some(2), "{stdout}");
        assert!(
            stdout.contains(
                "dpo-train train --model-name-or-path YOUR_MODEL_DIR --train-file YOUR_DATA.jsonl --devices cpu:"
            ),
            "{stdout}"
        );
        let (code, v) = json_of(&run(&["--json"]));
        assert_eq!(code, 2);
        assert!(v["command"].as_str().expect("command").starts_with(
            "dpo-train train --model-name-or-path YOUR_MODEL_DIR --train-file YOUR_DATA.jsonl --devices cpu:"
        ));
        assert!(warnings(&v)[0].starts_with("NVML could not be loaded"));
        // The CPU plan checks this host's MemAvailable (Linux): 1000T parameters fit on none.
        let out = run(&["--model-params", "1000T"]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let checked = std::path::Path::new("/proc/meminfo").exists();
        assert_eq!(stdout.contains("\n  ! does not fit in host memory: "), checked, "{stdout}");
        assert_eq!(stdout.contains(" is available (MemAvailable, or the cgroup's limit); "), checked, "{stdout}");
    } else {
        // A machine with the driver: the probe must produce a report.
        assert!(stdout.contains("from live NVML probe"), "{stdout}");
        assert!(matches!(out.status.code(), Some(0..=2)));
    }
}

#[test]
fn bad_inputs_exit_3_with_one_line() {
    let dir = std::env::temp_dir().join(format!("check-gpu-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let good_topo = fixture("t4x2-phb.topo.txt");
    let bad_topo = dir.join("topo.txt");
    std::fs::write(&bad_topo, "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tPHB\t0-7\nGPU1\tWAT\t X \t0-7\n").expect("write");
    let bad_csv = dir.join("q.csv");
    std::fs::write(&bad_csv, "0, Tesla T4, GPU-1\n").expect("write");
    let bad_json = dir.join("s.json");
    std::fs::write(&bad_json, "{\n  \"schema_version\": 1,\n  \"source\": \"live\",\n  \"gpus\": {}\n}\n")
        .expect("write");
    let cases: Vec<(Vec<&str>, String)> = vec![
        (vec!["--topo", bad_topo.to_str().expect("p")], format!("{}:3: column GPU0 of `GPU1`", bad_topo.display())),
        (
            vec!["--topo", good_topo.to_str().expect("p"), "--query", bad_csv.to_str().expect("p")],
            format!("{}:1: expected 13 comma-separated values", bad_csv.display()),
        ),
        (vec!["--snapshot", bad_json.to_str().expect("p")], format!("{}:4:", bad_json.display())),
        (vec!["--topo", "/nonexistent/topo.txt"], "cannot read `/nonexistent/topo.txt`: No such file".to_string()),
        (
            vec!["--topo", good_topo.to_str().expect("p"), "--model-params", "huge"],
            "invalid parameter count `huge`".to_string(),
        ),
    ];
    for (args, expected) in cases {
        let out = run(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.contains(&expected), "{args:?}: expected `{expected}` in {stderr}");
    }
    let _ = std::fs::remove_dir_all(&dir);
    // Unknown flags and out-of-range values are bad input too.
    assert_eq!(run(&["--no-such-flag"]).status.code(), Some(3));
    assert_eq!(run(&["--global-batch", "0"]).status.code(), Some(3));
    assert_eq!(run(&["--help"]).status.code(), Some(0));
}

/// Values at the edge of u64 are refused with the accepted range, never wrapped into a plan.
#[test]
fn huge_values_are_refused_with_their_range() {
    let topo = fixture("t4x2-phb.topo.txt");
    let topo = topo.to_str().expect("utf-8 path");
    for (flag, value, range) in [
        ("--seq-len", "18446744073709551615", "2..=1048576"),
        ("--global-batch", "18446744073709551615", "1..=1048576"),
        ("--lr-base-batch", "1048577", "1..=1048576"),
        ("--lora", "100000", "1..=65536"),
    ] {
        let out = run(&["--topo", topo, "--model-params", "1.5B", flag, value]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{flag} {value}: {stderr}");
        assert!(stderr.contains(range), "{flag} {value}: {stderr}");
    }
    let out = run(&["--topo", topo, "--model-params", "1e30"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(stderr.contains("parameter count `1e30` is out of range: expected 1 to 1e15"), "{stderr}");
    // The largest accepted values plan without overflow: a 1e15-parameter model fits nowhere.
    let (code, v) =
        plan_json("t4x2-phb", &["--model-params", "1e15", "--seq-len", "1048576", "--global-batch", "1048576"]);
    assert_eq!(code, 2, "{v}");
    assert!(warnings(&v).iter().any(|w| w.starts_with("nothing fits")), "{v}");
}

/// With `--model DIR` the command trains that directory; the config file is named where it goes.
#[test]
fn the_command_names_the_model_directory_and_the_config() {
    let dir = std::env::temp_dir().join(format!("check-gpu-model-{}", std::process::id()));
    let model = dir.join("my model");
    std::fs::create_dir_all(&model).expect("temp dir");
    std::fs::write(
        model.join("config.json"),
        r#"{"model_type":"qwen2","hidden_size":896,"num_hidden_layers":24,"num_attention_heads":14,
            "num_key_value_heads":2,"intermediate_size":4864,"vocab_size":151936,"tie_word_embeddings":true}"#,
    )
    .expect("write");
    let (code, v) = plan_json("t4x2-phb", &["--model", model.to_str().expect("utf-8 path"), "--lora", "8"]);
    assert!(code <= 1, "{v}");
    let cmd = v["command"].as_str().expect("command");
    let head =
        format!("dpo-train train --model-name-or-path '{}' --train-file YOUR_DATA.jsonl --gpus 2 ", model.display());
    assert!(cmd.starts_with(&head), "{cmd}");
    // `--model DIR/config.json` plans the same model, and dpo-train is given the directory.
    let file = model.join("config.json");
    let (_, v) = plan_json("t4x2-phb", &["--model", file.to_str().expect("utf-8 path"), "--lora", "8"]);
    assert!(v["command"].as_str().expect("command").starts_with(&head), "{v}");
    // A Hub name is read from the hub cache's snapshot of `main`; the command keeps the name.
    let cache = dir.join("hub");
    let snapshot = cache.join("models--org--qwen/snapshots").join("c".repeat(40));
    std::fs::create_dir_all(cache.join("models--org--qwen/refs")).expect("temp dir");
    std::fs::write(cache.join("models--org--qwen/refs/main"), "c".repeat(40)).expect("write");
    std::fs::create_dir_all(&snapshot).expect("temp dir");
    std::fs::copy(&file, snapshot.join("config.json")).expect("copy");
    let (topo, query) = (fixture("t4x2-phb.topo.txt"), fixture("t4x2-phb.query.csv"));
    let (topo, query) = (topo.to_str().expect("utf-8 path"), query.to_str().expect("utf-8 path"));
    let out = Command::new(env!("CARGO_BIN_EXE_check-gpu"))
        .args(["--json", "--model", "org/qwen", "--lora", "8", "--topo", topo, "--query", query])
        .env("HF_HUB_CACHE", &cache)
        .output()
        .expect("the check-gpu binary runs");
    // The command keeps the name: dpo-train finds it in the cache of the machine it runs on.
    let cached = "dpo-train train --model-name-or-path org/qwen --train-file";
    assert!(json_of(&out).1["command"].as_str().expect("command").starts_with(cached), "{out:?}");
    // A name the cache lacks: one line naming the flag and the download.
    let missing = Command::new(env!("CARGO_BIN_EXE_check-gpu"))
        .args(["--model", "org/nope", "--topo", topo, "--query", query])
        .env("HF_HUB_CACHE", &cache)
        .output()
        .expect("the check-gpu binary runs");
    let err = String::from_utf8_lossy(&missing.stderr);
    assert!(
        err.contains("`--model`: `org/nope` does not exist here") && err.contains("`hf download org/nope`"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--save DIR/` (or an existing directory) writes the snapshot into it, under the name
/// `--snapshot` reads back (was: "Not a directory").
#[test]
fn save_into_a_directory_writes_the_snapshot_file_there() {
    let dir = std::env::temp_dir().join(format!("check-gpu-save-dir-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let topo = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/t4x2-phb.topo.txt");
    let out = Command::new(env!("CARGO_BIN_EXE_check-gpu"))
        .args(["--topo", topo.to_str().unwrap(), "--save", &format!("{}/", dir.display())])
        .output()
        .unwrap();
    // Ready with a warning: `--topo` alone gives no compute capability, so the plan is in fp16.
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    let saved = dir.join("check-gpu-snapshot.json");
    let said = format!("Saved `{}` (read it back with --snapshot).", saved.display());
    assert!(String::from_utf8_lossy(&out.stdout).contains(&said), "{}", String::from_utf8_lossy(&out.stdout));
    let again =
        Command::new(env!("CARGO_BIN_EXE_check-gpu")).args(["--snapshot", saved.to_str().unwrap()]).output().unwrap();
    assert_eq!(again.status.code(), Some(1), "{}", String::from_utf8_lossy(&again.stderr));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A reference-free loss (`--loss-type orpo`) plans no reference model: the reference term is 0,
/// the total drops by at least the frozen copy's bytes at the same micro-batch, and the command
/// trains that loss. A loss with a reference is not a value of the flag (exit 3, one line).
#[test]
fn a_reference_free_loss_plans_no_reference() {
    let args = ["--model-params", "1.5B", "--sharding", "none", "--global-batch", "64"];
    let (_, with) = plan_json("dgx-a100", &args);
    let (code, free) = plan_json("dgx-a100", &[&args[..], &["--loss-type", "orpo"]].concat());
    assert_eq!(code, 0, "{free}");
    let reference = with["memory"]["reference"].as_u64().expect("reference bytes");
    assert!(reference > 0, "{with}");
    assert_eq!((free["reference"].as_str(), free["memory"]["reference"].as_u64()), (Some("none"), Some(0)));
    // The same micro-batch here: every other term the same, the total lower (the allocator's
    // overhead is a share of the rest, so it drops too).
    assert_eq!(free["micro_batch"], with["micro_batch"]);
    for term in ["weights", "gradients", "optimizer", "activations", "logits", "host"] {
        assert_eq!(free["memory"][term], with["memory"][term], "{term}");
    }
    let total = |v: &Value| v["memory"]["total"].as_u64().expect("total");
    assert!(total(&with) - total(&free) >= reference, "{free}");
    let cmd = free["command"].as_str().expect("command");
    assert!(cmd.ends_with(" --precompute-ref-log-probs false --gradient-checkpointing false --sharding none --offload-optimizer false --loss-type orpo"), "{cmd}");
    let out = run_on("dgx-a100", &["--loss-type", "sigmoid"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(err.contains("`sigmoid` is not a reference-free or unpaired loss"), "{err}");
}

/// `--loss-type kto` keeps the reference (as DPO does), plans at least 2 rows a micro-batch
/// (KTO's KL estimate pairs each prompt with another row's completion) on as many GPUs as give
/// each 2 rows (its command runs: dpo-train refuses KTO at one row a GPU) and passes the loss on;
/// a global batch of one row is warned about.
#[test]
fn kto_keeps_its_reference_and_two_rows_a_micro_batch() {
    let args = ["--model-params", "1.5B", "--sharding", "none", "--global-batch", "64", "--loss-type", "kto"];
    let (code, v) = plan_json("dgx-a100", &args);
    assert_eq!(code, 0, "{v}");
    assert!(v["memory"]["reference"].as_u64().expect("reference bytes") > 0, "{v}");
    assert!(v["micro_batch"].as_u64().expect("micro-batch") >= 2, "{v}");
    assert!(v["command"].as_str().expect("command").ends_with(" --loss-type kto"), "{v}");
    for (global, world) in [(8, 4), (6, 3), (7, 3), (2, 1)] {
        let args = ["--model-params", "1.5B", "--global-batch", &global.to_string(), "--loss-type", "kto"];
        let (_, v) = plan_json("dgx-a100", &args);
        assert_eq!(v["world_size"].as_u64(), Some(world), "{v}");
        assert!(v["micro_batch"].as_u64().expect("micro-batch") >= 2, "{v}");
        assert!(!v["warnings"].to_string().contains("rows a micro-batch"), "{v}");
        let exact = v["warnings"].to_string().contains("for exactly 7 use --world-size 1");
        assert_eq!(exact, global == 7, "{v}");
    }
    let (_, one) = plan_json("dgx-a100", &["--model-params", "1.5B", "--global-batch", "1", "--loss-type", "kto"]);
    let warnings = one["warnings"].to_string();
    assert!(warnings.contains("at least 2 rows a micro-batch"), "{one}");
    // KTOTrainer's other loss keeps the reference without the minimum.
    let (_, apo) =
        plan_json("dgx-a100", &["--model-params", "1.5B", "--global-batch", "8", "--loss-type", "apo_zero_unpaired"]);
    assert!(apo["memory"]["reference"].as_u64().expect("reference bytes") > 0, "{apo}");
    assert!(!apo["warnings"].to_string().contains("rows a micro-batch"), "{apo}");
    assert!(apo["command"].as_str().expect("command").ends_with(" --loss-type apo_zero_unpaired"), "{apo}");
}

/// `--data` puts the data in the command (no placeholder, no note), and a missing file is refused.
#[test]
fn data_given_to_the_plan_is_in_the_command() {
    let data = fixture("dgx-a100.query.csv"); // any existing file: check-gpu does not read it
    let (code, v) = plan_json("dgx-a100", &["--model-params", "1.5B", "--data", data.to_str().expect("path")]);
    assert_eq!(code, 0, "{v}");
    let cmd = v["command"].as_str().expect("command");
    let want = format!("dpo-train train --model-name-or-path YOUR_MODEL_DIR --train-file {} --gpus 8 ", data.display());
    assert!(cmd.starts_with(&want), "{cmd}");
    let out = run_on("dgx-a100", &["--data", "/no/such.jsonl"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(err.contains("`--data /no/such.jsonl`: no such file or directory"), "{err}");
    let out = run_on("dgx-a100", &["--model", "/no/such/model"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(err.contains("`--model /no/such/model`: no such file or directory"), "{err}");
}
