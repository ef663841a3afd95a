//! Per-GPU memory estimate for data-parallel DPO with AdamW (every rank holds a full replica).
//!
//! Sources: Hugging Face "Model training anatomy" (bytes per parameter for fp32 and mixed
//! precision), Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
//! Models" (activations per layer `s*b*h*(34 + 5*a*s/h)` bytes in half precision, of which
//! `5*a*s/h` is the attention scores: dpo-train's fused attention, flash or memory-efficient,
//! keeps only its output and log-sum-exp, so that term is left out), and TRL's `DPOTrainer`,
//! which runs chosen and rejected as one concatenated batch of `2*b` rows.
//!
//! | term | full fine-tuning | LoRA rank r (q,k,v,o) |
//! |---|---|---|
//! | weights | fp32: 4P; bf16/fp16: 2P half copy + 4P fp32 master = 6P | base c*P frozen + 4A |
//! | gradients | 4P (fp32) | 4A |
//! | optimizer | 8P (AdamW m and v in fp32) | 8A |
//! | reference | c*P, or 0 with precomputed log-probs | 0 (adapter disabled = base) |
//! | activations | L * s*2b*h*34 * c/2 | same |
//! | ... with checkpointing | L * 2*s*2b*h * c/2 + one layer's full activations | same |
//! | logits | 2b*s*V*4 (fp32) | same |
//!
//! `P` parameters, `A = L * r * ((h+a*d) + 2*(h+kv*d) + (a*d+h))` adapter parameters, `c` bytes
//! of the compute dtype (2 or 4), `s` sequence length, `b` micro-batch, `h` hidden size, `a`
//! heads, `L` layers, `V` vocabulary. The total adds 10% (allocator fragmentation, temporary
//! buffers, NCCL) plus 500 MiB for the CUDA context.

use serde::{Deserialize, Serialize};

use crate::model::ModelShape;

/// CUDA context and kernels loaded per process.
pub const CUDA_CONTEXT_BYTES: u64 = 500 * 1024 * 1024;
/// Fragmentation and temporary buffers, as a percentage of the estimate.
pub const OVERHEAD_PERCENT: u64 = 10;

/// Training precision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    /// bfloat16 mixed precision (compute capability 8.0+).
    Bf16,
    /// float16 mixed precision.
    Fp16,
    /// full float32.
    Fp32,
}

impl Dtype {
    /// Bytes per element of the compute dtype.
    pub fn bytes(self) -> u64 {
        match self {
            Dtype::Bf16 | Dtype::Fp16 => 2,
            Dtype::Fp32 => 4,
        }
    }

    /// The lowercase name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Dtype::Bf16 => "bf16",
            Dtype::Fp16 => "fp16",
            Dtype::Fp32 => "fp32",
        }
    }
}

/// Which parameters train.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum FineTune {
    /// Every parameter.
    Full,
    /// LoRA adapters of this rank on q, k, v and o projections.
    Lora { rank: u64 },
}

/// How the reference model's log-probabilities are obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Reference {
    /// A frozen copy lives on every GPU.
    Keep,
    /// Computed once before training (`--precompute-ref-log-probs`).
    Precompute,
}

/// Everything the estimate depends on.
#[derive(Debug, Clone, Copy)]
pub struct MemoryRequest<'a> {
    pub model: &'a ModelShape,
    /// Pairs per micro-batch and GPU (`b`); the forward sees `2*b` rows.
    pub micro_batch: u64,
    pub seq_len: u64,
    pub dtype: Dtype,
    pub finetune: FineTune,
    pub reference: Reference,
    pub gradient_checkpointing: bool,
}

/// Bytes per GPU, by term.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryEstimate {
    pub weights: u64,
    pub gradients: u64,
    pub optimizer: u64,
    pub reference: u64,
    pub activations: u64,
    pub logits: u64,
    /// 10% of the terms above plus the CUDA context.
    pub overhead: u64,
    pub total: u64,
}

/// Estimates the peak memory of one rank (see the module doc for every formula).
pub fn estimate(req: &MemoryRequest<'_>) -> MemoryEstimate {
    let m = req.model;
    let p = m.params;
    let c = req.dtype.bytes();
    // Saturating throughout: absurd inputs (a 2^60-token sequence) give an estimate that fits
    // nowhere, never one that wraps around to "ready".
    let mul = |x: &[u64]| x.iter().fold(1u64, |acc, &y| acc.saturating_mul(y));
    let (weights, gradients, optimizer, reference) = match req.finetune {
        FineTune::Full => {
            let weights = match req.dtype {
                Dtype::Fp32 => mul(&[4, p]),
                Dtype::Bf16 | Dtype::Fp16 => mul(&[2 + 4, p]),
            };
            let reference = match req.reference {
                Reference::Keep => mul(&[c, p]),
                Reference::Precompute => 0,
            };
            (weights, mul(&[4, p]), mul(&[8, p]), reference)
        }
        FineTune::Lora { rank } => {
            let a = m.lora_params(rank);
            (mul(&[c, p]).saturating_add(mul(&[4, a])), mul(&[4, a]), mul(&[8, a]), 0)
        }
    };
    let (s, rows, h) = (req.seq_len, req.micro_batch.saturating_mul(2), m.hidden_size);
    // Korthikanti et al. without the attention scores: s*b*h*34 bytes at 2 bytes per value.
    let layer_full = mul(&[s, rows, 34, h, c]) / 2;
    let activations = if req.gradient_checkpointing {
        (mul(&[m.num_layers, 2, s, rows, h, c]) / 2).saturating_add(layer_full)
    } else {
        mul(&[m.num_layers, layer_full])
    };
    let logits = mul(&[rows, s, m.vocab_size, 4]);
    let sum =
        [weights, gradients, optimizer, reference, activations, logits].iter().fold(0u64, |a, &b| a.saturating_add(b));
    let overhead = (sum.saturating_mul(OVERHEAD_PERCENT) / 100).saturating_add(CUDA_CONTEXT_BYTES);
    let total = sum.saturating_add(overhead);
    MemoryEstimate { weights, gradients, optimizer, reference, activations, logits, overhead, total }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> ModelShape {
        ModelShape::from_param_count(1_000_000_000)
    }

    fn req(model: &ModelShape) -> MemoryRequest<'_> {
        MemoryRequest {
            model,
            micro_batch: 1,
            seq_len: 1024,
            dtype: Dtype::Bf16,
            finetune: FineTune::Full,
            reference: Reference::Keep,
            gradient_checkpointing: false,
        }
    }

    #[test]
    fn bytes_per_parameter() {
        let m = shape();
        let e = estimate(&req(&m));
        // Mixed precision: 6 + 4 + 8 = 18 bytes/param, plus a 2-byte bf16 reference.
        assert_eq!(e.weights + e.gradients + e.optimizer, 18 * m.params);
        assert_eq!(e.reference, 2 * m.params);
        let e = estimate(&MemoryRequest { dtype: Dtype::Fp32, ..req(&m) });
        assert_eq!(e.weights + e.gradients + e.optimizer, 16 * m.params);
        assert_eq!(e.reference, 4 * m.params);
        let e = estimate(&MemoryRequest { reference: Reference::Precompute, ..req(&m) });
        assert_eq!(e.reference, 0);
    }

    #[test]
    fn lora_terms() {
        let m = shape();
        let e = estimate(&MemoryRequest { finetune: FineTune::Lora { rank: 16 }, ..req(&m) });
        let a = m.lora_params(16);
        assert_eq!(e.weights, 2 * m.params + 4 * a);
        assert_eq!(e.gradients + e.optimizer, 12 * a);
        assert_eq!(e.reference, 0);
    }

    #[test]
    fn activations_logits_and_overhead() {
        let m = shape();
        let e = estimate(&req(&m));
        let (s, b2, h, l) = (1024, 2, m.hidden_size, m.num_layers);
        assert_eq!(e.activations, l * s * b2 * 34 * h);
        assert_eq!(e.logits, 2 * 1024 * m.vocab_size * 4);
        let sum = e.weights + e.gradients + e.optimizer + e.reference + e.activations + e.logits;
        assert_eq!(e.overhead, sum / 10 + CUDA_CONTEXT_BYTES);
        assert_eq!(e.total, sum + e.overhead);
        let ck = estimate(&MemoryRequest { gradient_checkpointing: true, ..req(&m) });
        assert_eq!(ck.activations, l * 2 * s * b2 * h + s * b2 * 34 * h);
        assert!(ck.activations < e.activations);
        let two = estimate(&MemoryRequest { micro_batch: 2, ..req(&m) });
        assert_eq!(two.activations, 2 * e.activations);
        assert_eq!(two.logits, 2 * e.logits);
    }
}
