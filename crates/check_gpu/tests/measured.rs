//! check-gpu's estimate of dpo-train held against dpo-train's peaks measured on a GPU
//! (`make gpu-check`'s memory and offload sections, `results/gpu/memory-*.json`): the bytes
//! handed to tensors within 15% of torch's `max_memory_allocated`, and the planned total (the
//! caching allocator's share and the CUDA context added) at least what the allocator held.

use check_gpu::{Engine, FineTune, MemoryRequest, ModelShape, PairTokens, Precision, Reference, Sharding, estimate};
use serde::Deserialize;

#[derive(Deserialize)]
struct Row {
    shape: String,
    model_type: String,
    hidden: u64,
    layers: u64,
    heads: u64,
    kv_heads: u64,
    intermediate: u64,
    vocab: u64,
    tied_embeddings: bool,
    precision: String,
    micro_batch: u64,
    prompt_tokens: u64,
    completion_tokens: u64,
    gradient_checkpointing: bool,
    lora_r: u64,
    reference: String,
    sharding: String,
    world_size: u64,
    offload_optimizer: bool,
    cuda_allocated_bytes: f64,
    cuda_reserved_bytes: f64,
}

impl Row {
    fn model(&self) -> ModelShape {
        let mut m = ModelShape {
            source: format!("shaped like {}", self.shape),
            params: 0,
            hidden_size: self.hidden,
            num_layers: self.layers,
            num_heads: self.heads,
            num_kv_heads: self.kv_heads,
            head_dim: self.hidden / self.heads,
            intermediate_size: self.intermediate,
            vocab_size: self.vocab,
            tied_embeddings: self.tied_embeddings,
            qkv_bias: self.model_type == "qwen2",
        };
        m.params = m.count_params();
        m
    }

    fn request<'a>(&self, model: &'a ModelShape) -> MemoryRequest<'a> {
        assert_eq!((self.reference.as_str(), self.sharding.as_str()), ("keep", "none"), "a new kind of row");
        MemoryRequest {
            model,
            micro_batch: self.micro_batch,
            seq_len: self.prompt_tokens + self.completion_tokens,
            dtype: if self.precision == "bf16" { Precision::Bf16 } else { Precision::Fp32 },
            finetune: if self.lora_r > 0 { FineTune::Lora { rank: self.lora_r } } else { FineTune::Full },
            reference: Reference::Keep,
            gradient_checkpointing: self.gradient_checkpointing,
            world_size: self.world_size,
            sharding: Sharding::None,
            offload_optimizer: self.offload_optimizer,
            engine: Engine::DpoTrain(
                PairTokens { prompt: self.prompt_tokens, completion: self.completion_tokens }.batch(self.micro_batch),
            ),
        }
    }
}

fn tables() -> Vec<(String, Vec<Row>)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../results/gpu");
    let mut found = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("results/gpu") {
        let path = entry.expect("an entry").path();
        let name = path.file_name().unwrap_or_default().to_string_lossy().into_owned();
        if name.starts_with("memory-") && name.ends_with(".json") {
            let text = std::fs::read_to_string(&path).expect("the table reads");
            found.push((name, serde_json::from_str(&text).expect("the table parses")));
        }
    }
    found
}

#[test]
fn the_estimate_is_within_15_percent_of_every_measured_peak() {
    let tables = tables();
    assert!(!tables.is_empty(), "no results/gpu/memory-*.json");
    let mut worst = 0.0f64;
    let mut failures = Vec::new();
    for (file, rows) in &tables {
        assert!(rows.len() >= 25, "{file}: {} rows", rows.len());
        for r in rows {
            let model = r.model();
            let e = estimate(&r.request(&model));
            let ratio = e.allocated() as f64 / r.cuda_allocated_bytes;
            worst = worst.max((ratio - 1.0).abs());
            let what = format!(
                "{file}: {} {} mb {} ({} + 2x{}), checkpointing {}, LoRA {}, offload {}",
                r.shape,
                r.precision,
                r.micro_batch,
                r.prompt_tokens,
                r.completion_tokens,
                r.gradient_checkpointing,
                r.lora_r,
                r.offload_optimizer
            );
            if (ratio - 1.0).abs() > 0.15 {
                failures.push(format!(
                    "{what}: estimated {:.3} GiB allocated, measured {:.3} ({ratio:.3}x)",
                    gib(e.allocated()),
                    r.cuda_allocated_bytes / GIB
                ));
            }
            if (e.total as f64) < r.cuda_reserved_bytes {
                failures.push(format!(
                    "{what}: planned {:.3} GiB, below the {:.3} the allocator held",
                    gib(e.total),
                    r.cuda_reserved_bytes / GIB
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // The rows span three shapes, one with a 150k vocabulary.
    let vocabs: std::collections::BTreeSet<u64> =
        tables.iter().flat_map(|(_, rows)| rows.iter().map(|r| r.vocab)).collect();
    assert!(vocabs.len() >= 3 && vocabs.iter().any(|&v| v > 150_000), "{vocabs:?}");
    println!("largest relative error {worst:.3}");
}

const GIB: f64 = (1u64 << 30) as f64;

fn gib(bytes: u64) -> f64 {
    bytes as f64 / GIB
}
