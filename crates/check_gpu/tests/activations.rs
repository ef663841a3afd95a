//! The activation estimate against what transformers' eager autograd saves, measured by
//! `tests/gen/activation_bytes.py` (Llama and Qwen2 shapes, fp32 and bf16, sdpa) into
//! `tests/fixtures/activation_bytes.json`.

use check_gpu::{Engine, FineTune, MemoryRequest, ModelShape, Precision, Reference, Sharding, estimate};
use serde::Deserialize;

/// The largest relative error allowed per measured shape.
const TOLERANCE: f64 = 0.05;

#[derive(Deserialize)]
struct Fixture {
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    model_type: String,
    hidden_size: u64,
    intermediate_size: u64,
    num_attention_heads: u64,
    num_key_value_heads: u64,
    head_dim: u64,
    vocab_size: u64,
    dtype: String,
    rows: u64,
    seq_len: u64,
    layer_bytes_per_token: f64,
    head_bytes_per_token: f64,
    checkpointed_layer_bytes_per_token: f64,
}

fn cases() -> Vec<Case> {
    let text = include_str!("fixtures/activation_bytes.json");
    let f: Fixture = serde_json::from_str(text).expect("fixture parses");
    assert!(f.cases.len() >= 20, "{} cases", f.cases.len());
    f.cases
}

impl Case {
    fn shape(&self, layers: u64) -> ModelShape {
        let mut m = ModelShape {
            source: format!("{} fixture", self.model_type),
            params: 0,
            hidden_size: self.hidden_size,
            num_layers: layers,
            num_heads: self.num_attention_heads,
            num_kv_heads: self.num_key_value_heads,
            head_dim: self.head_dim,
            intermediate_size: self.intermediate_size,
            vocab_size: self.vocab_size,
            tied_embeddings: false,
            qkv_bias: self.model_type == "qwen2",
        };
        m.params = m.count_params();
        m
    }

    /// Activations and logits per token of the estimate with `layers` layers.
    fn estimated(&self, layers: u64, gradient_checkpointing: bool) -> f64 {
        let dtype = match self.dtype.as_str() {
            "float32" => Precision::Fp32,
            "bfloat16" => Precision::Bf16,
            other => panic!("dtype {other}"),
        };
        let model = self.shape(layers);
        let e = estimate(&MemoryRequest {
            model: &model,
            micro_batch: self.rows / 2,
            seq_len: self.seq_len,
            dtype,
            finetune: FineTune::Full,
            reference: Reference::Keep,
            gradient_checkpointing,
            world_size: 1,
            sharding: Sharding::None,
            offload_optimizer: false,
            engine: Engine::Trl,
            cuda: true,
            accumulation: 1,
        });
        (e.activations + e.logits) as f64 / (self.rows * self.seq_len) as f64
    }

    fn label(&self) -> String {
        let (h, i, a, kv, v) = (
            self.hidden_size,
            self.intermediate_size,
            self.num_attention_heads,
            self.num_key_value_heads,
            self.vocab_size,
        );
        format!("{} h{h} i{i} a{a}/{kv} V{v} {} {}x{}", self.model_type, self.dtype, self.rows, self.seq_len)
    }
}

fn within(estimated: f64, measured: f64, what: &str) {
    let err = (estimated - measured).abs() / measured;
    assert!(err <= TOLERANCE, "{what}: estimated {estimated} B/token, measured {measured} ({:.1}%)", err * 100.0);
}

/// One layer (two layers less one), the whole one-layer model with its head and logits, and
/// what a checkpointed layer keeps, each within 5% of the measurement for every shape.
#[test]
fn activations_match_transformers_autograd() {
    for c in cases() {
        let layer = c.estimated(2, false) - c.estimated(1, false);
        within(layer, c.layer_bytes_per_token, &format!("{} layer", c.label()));
        let whole = c.layer_bytes_per_token + c.head_bytes_per_token;
        within(c.estimated(1, false), whole, &format!("{} one layer and the head", c.label()));
        let kept = c.estimated(2, true) - c.estimated(1, true);
        within(kept, c.checkpointed_layer_bytes_per_token, &format!("{} checkpointed layer", c.label()));
    }
}
