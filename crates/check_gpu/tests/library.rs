//! Library-level tests: the API `dpo-train` calls (`parse`, `plan`, `memory::estimate`,
//! `Snapshot`) on the captured `nvidia-smi` fixtures.

use std::path::{Path, PathBuf};

use check_gpu::parse::{self, Input};
use check_gpu::snapshot::Link;
use check_gpu::{
    Engine, FineTune, MemoryRequest, ModelShape, PairTokens, PlanRequest, Precision, Reference, Sharding, Snapshot,
    Status, estimate, plan,
};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

fn machine(name: &str) -> Snapshot {
    let tp = fixture(&format!("{name}.topo.txt"));
    let qp = fixture(&format!("{name}.query.csv"));
    let topo = parse::read(&tp).expect("topo fixture");
    let query = parse::read(&qp).expect("query fixture");
    parse::offline_snapshot(Some(Input { text: &topo, path: &tp }), Some(Input { text: &query, path: &qp }))
        .expect("fixture parses")
}

fn request(params: &str) -> PlanRequest {
    let n = check_gpu::model::parse_param_count(params).expect("count");
    PlanRequest { model: Some(ModelShape::from_param_count(n)), ..PlanRequest::default() }
}

#[test]
fn every_topo_fixture_parses() {
    for (name, gpus, nics) in [
        ("t4x2-phb", 2, 0),
        ("dgx-a100", 8, 10),
        ("dgx-h100", 8, 12),
        ("rtx4090x8-sys", 8, 0),
        ("rtx4090x4-node", 4, 0),
        ("a100-pcie-nvbridge", 4, 0),
        ("a100-degraded", 4, 0),
        ("mixed-a6000", 4, 0),
    ] {
        let path = fixture(&format!("{name}.topo.txt"));
        let m = parse::parse_topo(&parse::read(&path).expect("read"), &path).expect(name);
        assert_eq!(m.gpus.len(), gpus, "{name}");
        assert_eq!(m.nics.len(), nics, "{name}");
        for (i, row) in m.links.iter().enumerate() {
            assert_eq!(row[i], Link::SelfLink, "{name} diagonal");
            for (j, l) in row.iter().enumerate() {
                assert_eq!(*l, m.links[j][i], "{name} symmetric at {i},{j}");
            }
        }
    }
}

#[test]
fn dgx_h100_nic_legend_names() {
    let path = fixture("dgx-h100.topo.txt");
    let m = parse::parse_topo(&parse::read(&path).expect("read"), &path).expect("parses");
    assert_eq!(m.nics[0], "mlx5_0");
    assert_eq!(m.nics[11], "mlx5_11");
    assert_eq!(m.gpus[4].cpu_affinity.as_deref(), Some("56-111,168-223"));
    assert_eq!(m.gpus[4].gpu_numa_id, None);
}

#[test]
fn query_formats_agree() {
    // The same kind of machine through header+units (T4), noheader+nounits (A100) and header+nounits (H100).
    let t4 = machine("t4x2-phb");
    assert_eq!(t4.gpus[0].memory_total_bytes, Some(15360 << 20));
    let a100 = machine("dgx-a100");
    assert_eq!(a100.gpus[7].pci_bus_id.as_deref(), Some("00000000:BD:00.0"));
    assert_eq!(a100.system.driver_version.as_deref(), Some("470.223.02"));
    let h100 = machine("dgx-h100");
    assert_eq!(h100.gpus[0].compute_capability_pair(), Some((9, 0)));
    assert_eq!(h100.gpus[0].pcie.gen_max, Some(5));
    assert_eq!(h100.system.cpu_count, Some(224));
}

#[test]
fn plan_invariants_on_every_machine() {
    for name in
        ["t4x2-phb", "dgx-a100", "dgx-h100", "rtx4090x8-sys", "a100-pcie-nvbridge", "a100-degraded", "mixed-a6000"]
    {
        let snap = machine(name);
        for global in [1, 7, 32, 64, 100] {
            let req = PlanRequest { global_batch: global, finetune: FineTune::Lora { rank: 8 }, ..request("500M") };
            let p = plan(&snap, &req);
            if p.status == Status::NotReady {
                continue;
            }
            assert_eq!(p.world_size, p.gpus.len(), "{name}");
            assert_eq!(p.micro_batch * p.world_size as u64 * p.grad_accum, p.global_batch, "{name} global {global}");
            let per_gpu = p.global_batch / p.world_size as u64;
            assert!(per_gpu.is_multiple_of(p.micro_batch), "{name}: the micro-batch divides the per-GPU batch");
            let total = p.memory_per_gpu_bytes.expect("a model was given");
            assert!(total <= p.min_free_bytes.expect("free memory known"), "{name}: the plan fits");
            assert!(p.excluded.iter().all(|e| !p.gpus.contains(&e.index)), "{name}");
        }
    }
}

/// Full fine-tuning of 1.5B with `--sharding auto` on every machine: whatever stage the plan
/// picks fits the free memory, and the command asks for it.
#[test]
fn sharded_plans_fit_and_say_so() {
    for name in [
        "t4x2-phb",
        "dgx-a100",
        "dgx-h100",
        "rtx4090x8-sys",
        "rtx4090x4-node",
        "a100-pcie-nvbridge",
        "a100-degraded",
        "mixed-a6000",
    ] {
        let p = plan(&machine(name), &request("1.5B"));
        assert_ne!(p.status, Status::NotReady, "{name}: {:?}", p.warnings);
        assert!(p.memory_per_gpu_bytes.expect("a model") <= p.min_free_bytes.expect("free known"), "{name}");
        let settings = p.settings.as_ref().expect("a command");
        assert_eq!((settings.sharding, settings.offload_optimizer), (p.sharding, p.offload_optimizer), "{name}");
        assert!(p.command.contains(&format!(" --sharding {}", p.sharding.name())), "{name}: {}", p.command);
        let offload = format!(" --offload-optimizer {}", p.offload_optimizer);
        assert!(p.command.contains(&offload), "{name}: {}", p.command);
    }
}

#[test]
fn global_batch_smaller_than_gpu_count() {
    let p = plan(&machine("dgx-h100"), &PlanRequest { global_batch: 4, ..request("1.5B") });
    assert_eq!(p.world_size, 4);
    assert_eq!(p.gpus, vec![0, 1, 2, 3], "one NVLink island, first GPUs");
    assert_eq!((p.micro_batch, p.grad_accum, p.global_batch), (1, 1, 4));
}

#[test]
fn lr_factors() {
    let p = plan(&machine("dgx-a100"), &PlanRequest { global_batch: 256, ..request("1.5B") });
    assert!((p.lr_scale.linear - 4.0).abs() < 1e-12);
    assert!((p.lr_scale.sqrt - 2.0).abs() < 1e-12);
}

#[test]
fn trainer_memory_api() {
    let shape = ModelShape::from_param_count(1_500_000_000);
    let e = estimate(&MemoryRequest {
        model: &shape,
        micro_batch: 1,
        seq_len: 512,
        dtype: Precision::Bf16,
        finetune: FineTune::Full,
        reference: Reference::Precompute,
        gradient_checkpointing: true,
        world_size: 1,
        sharding: Sharding::None,
        offload_optimizer: false,
        engine: Engine::DpoTrain(PairTokens { prompt: 128, completion: 384 }.batch(1)),
        cuda: true,
        accumulation: 1,
    });
    // 4 B/param fp32 weights, cast to bf16 a piece at a time as checkpointing recomputes them (the
    // largest piece the 151936 x 1536 embedding), and 8 of AdamW; the gradients' phase (4 B/param)
    // outweighs one short pair's activations and softmax at the backward's start.
    assert_eq!(e.weights + e.optimizer, 12 * 1_500_000_000 + 2 * 151_936 * 1536);
    assert_eq!(e.gradients + e.activations + e.logits, 4 * 1_500_000_000);
    assert_eq!(e.reference, 0);
    assert!(e.total > e.allocated() && e.allocated() > e.weights + e.gradients + e.optimizer);
}

#[test]
fn hf_config_dir() {
    let dir = std::env::temp_dir().join(format!("check-gpu-model-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    std::fs::write(
        dir.join("config.json"),
        r#"{"architectures":["LlamaForCausalLM"],"model_type":"llama","hidden_size":2048,"intermediate_size":8192,
           "num_attention_heads":32,"num_hidden_layers":16,"num_key_value_heads":8,"head_dim":64,
           "vocab_size":128256,"tie_word_embeddings":true,"rms_norm_eps":1e-05,"torch_dtype":"bfloat16"}"#,
    )
    .expect("write");
    let shape = ModelShape::from_hf_dir(&dir).expect("config parses");
    // Llama-3.2-1B: 1,235,814,400 parameters with tied embeddings.
    assert_eq!(shape.params, 1_235_814_400);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_check-gpu"))
        .args(["--json", "--model", dir.to_str().expect("path"), "--topo"])
        .arg(fixture("dgx-h100.topo.txt"))
        .arg("--query")
        .arg(fixture("dgx-h100.query.csv"))
        .output()
        .expect("runs");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["model"]["params"], 1_235_814_400u64);
    let _ = std::fs::remove_dir_all(&dir);
}
