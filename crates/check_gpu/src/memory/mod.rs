//! Per-GPU memory estimate for data-parallel DPO with AdamW, each rank holding a full replica or,
//! with ZeRO sharding (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training
//! Trillion Parameter Models"), its `1/N` part of the optimizer state (zero1), also of the
//! gradients (zero2) and also of the weights (zero3), as dpo-train implements each stage.
//!
//! Two engines share the training state's terms (weights, gradients, optimizer, reference; the
//! table below): [`Engine::DpoTrain`], what check-gpu plans with, takes dpo-train's own
//! activations, LM head and peak from [`packed`] (held within 15% of peaks measured on an H100,
//! `tests/measured.rs`); [`Engine::Trl`], what `--compare trl` prints beside it, takes
//! transformers' under TRL's `DPOTrainer`, below.
//!
//! Sources: Hugging Face "Model training anatomy" (bytes per parameter for fp32 and mixed
//! precision), TRL's `DPOTrainer`, which runs chosen and rejected as one concatenated batch of
//! `2*b` rows, and for the activations a measurement of transformers' eager autograd (Llama and
//! Qwen2 with `attn_implementation="sdpa"`, full sequences without a padding mask):
//! `crates/check_gpu/tests/gen/activation_bytes.py` counts the bytes autograd saves per token and layer
//! (fixture `crates/check_gpu/tests/fixtures/activation_bytes.json`, the estimate matches it to the byte).
//! A decoder layer keeps, per token, `A = 8h + 4c*h + 2c*d*(a+kv) + 4c*i + 4a + 8` bytes: each of
//! its two RMSNorms its input in fp32 (`4h`), the normalized values and its output (`2c*h`) and
//! `1/rms` (4); attention q, k, v after RoPE and sdpa's output (`c*d*(2a+2kv)`, GQA's k and v at
//! `kv` heads) and the fused kernel's fp32 log-sum-exp (`4a`; no `s*s` scores); the SwiGLU MLP
//! gate, silu(gate), up and their product (`4c*i`). The final norm and the token ids add
//! `4h + 2c*h + 12` once. This replaces Korthikanti et al. 2022's `s*b*h*34` (GPT, 4h MLP), which
//! put Qwen2.5-1.5B's layer at half of it. A padding mask makes transformers repeat k and v to
//! all `a` heads (`kv` becomes `a` above; not measured).
//!
//! | term | none (DDP) | zero1 | zero2 | zero3 |
//! |---|---|---|---|---|
//! | weights | fp32: 4P; bf16/fp16: 2P half copy + 4P fp32 master = 6P | same (dpo-train: see below) | same | 4P/N + 4Pg (+ c*Pg half cast of the gathered piece) |
//! | gradients | 4P (fp32) | 4P | 4P/N + 4Pg with checkpointing, else 4P | 4P/N + 4Pg |
//! | optimizer | 8P (AdamW m and v in fp32) | 8P/N | 8P/N | 8P/N |
//! | reference | c*P, or 0 with precomputed log-probs | same | same | c*P/N + c*Pg |
//! | activations | s*2b*(L*A + 4h + 2c*h + 12) | same | same | always checkpointed |
//! | ... with checkpointing | s*2b*(L*c*h + A + 4h + 2c*h + 12): each layer's input, one layer recomputed | same | same | same |
//! | logits | 2b*s*V*4 (the fp32 log-softmax) | same | same | same |
//!
//! Why: zero1 keeps AdamW's moments for this rank's slice only. zero2 reduce-scatters each
//! layer's gradients right after that layer's backward, which bounds them only when the backward
//! runs layer by layer (checkpointing); one whole backward pass produces every gradient before
//! the reduce-scatter. zero3 keeps `1/N` of the weights and all-gathers `Pg`, the largest piece
//! used at one time ([`ModelShape::gathered_piece_params`]: one layer, the embedding or the
//! head), running the decoder one layer at a time with recomputation; its gradients are
//! reduce-scattered piece by piece as zero2's.
//!
//! dpo-train in mixed precision without recomputation (no checkpointing, not zero3) keeps the
//! trained parameters in the compute dtype between steps beside their fp32 masters, sharded under
//! zero1/2 (DeepSpeed's bf16 optimizer): weights `c*(P-E) + 4(P-E)/N + 4E` (+ `c*E` tied: the
//! head's cast), `E = V*h` the embedding, which stays whole in fp32; N = 1 for none. Recomputing
//! (checkpointing), each layer casts its fp32 weights as it runs: `4P + c*Pg`, as zero3's gathered
//! piece.
//!
//! `--offload-optimizer` (DeepSpeed's ZeRO-Offload) moves AdamW's moments and the fp32 masters of
//! the trained parameters to host memory and runs the update there (optimizer term 0): the GPU
//! keeps the trained parameters in the compute dtype only, `c*P` (zero3: `c*P/N + c*Pg`, the
//! piece gathered in the compute dtype), and under fp32 their fp32 values as before.
//! [`MemoryEstimate::host`] reports the host bytes per rank, 12P/N (4 master + 8 moments; N = 1
//! for none), outside the GPU total.
//!
//! LoRA rank r on q,k,v,o: weights = frozen base c*P (zero3: c*P/N + c*Pg) + adapters 4A;
//! gradients 4A and optimizer 8A, divided by N as above (a gathered adapter piece is one
//! layer's, A/L); reference 0 (adapter disabled = base).
//!
//! `P` parameters, `L * r * ((h+a*d) + 2*(h+kv*d) + (a*d+h))` adapter parameters (LoRA's `A`
//! above, not the activations' `A`), `N` world size, `c` bytes of the compute dtype (2 or 4), `s`
//! sequence length, `b` micro-batch, `h` hidden size, `i` MLP width, `a` heads, `kv` key/value
//! heads, `d` head dimension, `L` layers, `V` vocabulary. The total adds 10% (allocator
//! fragmentation, temporary buffers, NCCL) plus 500 MiB for the CUDA context. Sharded terms
//! round up (dpo-train pads each flat tensor to a multiple of `N`).

use serde::{Deserialize, Serialize};

use crate::model::ModelShape;

pub mod packed;

pub use packed::{BatchTokens, DataLengths, PairTokens};

/// CUDA context and kernels loaded per process.
pub const CUDA_CONTEXT_BYTES: u64 = 500 * 1024 * 1024;
/// Fragmentation and temporary buffers under transformers, as a percentage of the estimate.
pub const OVERHEAD_PERCENT: u64 = 10;
/// What torch's caching allocator holds beyond dpo-train's allocations (reserved over allocated:
/// 1.04 to 1.37 on the H100 grid of `results/gpu/memory-*.json`, most under 1.16), percent.
pub const ALLOCATOR_PERCENT: u64 = 15;

/// Whose allocations an estimate models.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    /// dpo-train: a packed row of these tokens, the head where completions are scored
    /// ([`packed`]).
    DpoTrain(BatchTokens),
    /// transformers under TRL's `DPOTrainer`: `2b` rows padded to `seq_len`, the fp32
    /// log-softmax of every position (the table above).
    Trl,
}

pub use dpo_vocab::{Precision, Sharding, masters_resident};

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
    /// No reference model: a reference-free loss (`--loss-type cpo|simpo|alphapo|orpo`), which
    /// check-gpu's `--loss-type` selects.
    #[value(skip)]
    None,
}

/// Everything the estimate depends on.
#[derive(Debug, Clone, Copy)]
pub struct MemoryRequest<'a> {
    pub model: &'a ModelShape,
    /// Pairs per micro-batch and GPU (`b`); the forward sees `2*b` rows.
    pub micro_batch: u64,
    pub seq_len: u64,
    pub dtype: Precision,
    pub finetune: FineTune,
    pub reference: Reference,
    pub gradient_checkpointing: bool,
    /// Data-parallel ranks `N` the sharded terms divide over (0 counts as 1).
    pub world_size: u64,
    pub sharding: Sharding,
    /// AdamW's moments and the fp32 masters in host memory.
    pub offload_optimizer: bool,
    pub engine: Engine,
    /// CUDA devices rather than CPU processes: dpo-train's LM head scores bigger blocks there
    /// (`dpo_vocab::head::chunk_elements`).
    pub cuda: bool,
    /// Micro-batches a rank runs an optimizer step (gradient accumulation; 0 counts as 1): past
    /// the first, dpo-train holds the summed gradients through each pass.
    pub accumulation: u64,
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
    /// dpo-train: the kernels' scratch, the caching allocator's share of the terms above and the
    /// CUDA context; transformers: 10% of the terms above plus the CUDA context.
    pub overhead: u64,
    pub total: u64,
    /// Host (CPU) memory per rank for the offloaded optimizer (moments and fp32 masters); not part
    /// of `total`.
    #[serde(default)]
    pub host: u64,
}

impl MemoryEstimate {
    /// The bytes handed to tensors at the peak (`torch.cuda.max_memory_allocated`): the total
    /// less the caching allocator's share and the CUDA context.
    pub fn allocated(&self) -> u64 {
        [self.weights, self.gradients, self.optimizer, self.reference, self.activations, self.logits]
            .iter()
            .fold(0u64, |a, &b| a.saturating_add(b))
            .saturating_add(packed::WORKSPACE_BYTES)
    }
}

/// Product, saturating: absurd inputs (a 2^60-token sequence) give an estimate that fits
/// nowhere, never one that wraps around to "ready".
pub(crate) fn mul(x: &[u64]) -> u64 {
    x.iter().fold(1u64, |acc, &y| acc.saturating_mul(y))
}

/// One rank's training state, by term (bytes).
struct State {
    weights: u64,
    gradients: u64,
    /// Gradient accumulation's sum ([`accumulated`]).
    accumulator: u64,
    optimizer: u64,
    reference: u64,
    host: u64,
}

/// A sharded tensor's division over `n` ranks, and the piece a rank holds whole at one time.
#[derive(Clone, Copy)]
struct Split {
    n: u64,
    /// Elements of the largest piece gathered or reduce-scattered at one time.
    part: u64,
}

impl Split {
    /// `per*count` divided over the ranks (rounded up).
    fn shard(self, per: u64, count: u64) -> u64 {
        mul(&[per, count]).div_ceil(self.n)
    }

    /// This rank's shard plus one whole piece at `per` bytes.
    fn shard_and_piece(self, per: u64, count: u64) -> u64 {
        self.shard(per, count).saturating_add(mul(&[per, self.part]))
    }
}

/// Full fine-tuning: every parameter trains (see the module doc's table).
fn full_state(req: &MemoryRequest<'_>, n: u64) -> State {
    let (p, c, mixed) = (req.model.params, req.dtype.bytes(), req.dtype.is_mixed());
    let split = Split { n, part: req.model.gathered_piece_params() };
    let stage = req.sharding;
    let weights = match (stage, req.offload_optimizer) {
        // Offloaded, the GPU keeps the compute dtype's values only (the masters are on the host).
        (Sharding::Zero3, true) => split.shard_and_piece(c, p),
        (_, true) => mul(&[c, p]),
        (Sharding::Zero3, false) => {
            let cast = if mixed { mul(&[c, split.part]) } else { 0 };
            split.shard_and_piece(4, p).saturating_add(cast)
        }
        _ if resident(req) => resident_weights(req, split),
        // dpo-train recomputing: each layer casts its fp32 weights as it runs, one piece at a time.
        _ if mixed && matches!(req.engine, Engine::DpoTrain(_)) => mul(&[4, p]).saturating_add(mul(&[c, split.part])),
        (_, false) => mul(&[if mixed { c + 4 } else { 4 }, p]),
    };
    let gradients = sharded_gradients(req, split, p);
    let reference = match (req.reference, stage) {
        (Reference::Precompute | Reference::None, _) => 0,
        (Reference::Keep, Sharding::Zero3) => split.shard_and_piece(c, p),
        (Reference::Keep, _) => mul(&[c, p]),
    };
    let (optimizer, host) = optimizer_terms(req, n, p);
    State { weights, gradients, accumulator: accumulated(req, split, p), optimizer, reference, host }
}

/// [`masters_resident`] for dpo-train's estimate (TRL's autocast keeps fp32 parameters); without
/// them each layer casts its fp32 weights as it runs.
fn resident(req: &MemoryRequest<'_>) -> bool {
    let dpo_train = matches!(req.engine, Engine::DpoTrain(_));
    dpo_train && masters_resident(req.dtype, req.offload_optimizer, req.gradient_checkpointing, req.sharding)
}

/// Ranks the resident masters are divided over: zero1 and zero2 shard them, none does not.
fn master_ranks(req: &MemoryRequest<'_>, n: u64) -> u64 {
    if req.sharding == Sharding::None { 1 } else { n }
}

/// Full fine-tuning's weights with resident masters: every parameter in the compute dtype with its
/// fp32 master (this rank's `1/N` under zero1/2), but the embedding, which stays whole in fp32
/// (no copy, no master); tied, the head casts it once a pass, held through the head's backward.
fn resident_weights(req: &MemoryRequest<'_>, split: Split) -> u64 {
    let (m, c) = (req.model, req.dtype.bytes());
    let embedding = mul(&[m.vocab_size, m.hidden_size]).min(m.params);
    let rest = m.params - embedding;
    let masters = Split { n: master_ranks(req, split.n), ..split }.shard(4, rest);
    let head_cast = if m.tied_embeddings { mul(&[c, embedding]) } else { 0 };
    [mul(&[c, rest]), masters, mul(&[4, embedding]), head_cast].iter().fold(0u64, |a, &b| a.saturating_add(b))
}

/// LoRA: a frozen base and `A` trained adapter parameters (see the module doc).
fn lora_state(req: &MemoryRequest<'_>, n: u64, rank: u64) -> State {
    let m = req.model;
    let (p, c, a) = (m.params, req.dtype.bytes(), m.lora_params(rank));
    let adapters = Split { n, part: a / m.num_layers.max(1) };
    // Offloaded, the adapters stay on the GPU in the compute dtype (their masters on the host);
    // resident, in the compute dtype beside their fp32 masters.
    let adapter_bytes = if req.offload_optimizer { c } else { 4 };
    let (base, adapter_weights) = match req.sharding {
        Sharding::Zero3 => {
            let base = Split { n, part: m.gathered_piece_params() }.shard_and_piece(c, p);
            (base, adapters.shard_and_piece(adapter_bytes, a))
        }
        _ if resident(req) => {
            let masters = Split { n: master_ranks(req, n), ..adapters }.shard(4, a);
            (mul(&[c, p]), mul(&[c, a]).saturating_add(masters))
        }
        _ => (mul(&[c, p]), mul(&[adapter_bytes, a])),
    };
    let gradients = sharded_gradients(req, adapters, a);
    let accumulator = accumulated(req, adapters, a);
    let (optimizer, host) = optimizer_terms(req, n, a);
    State { weights: base.saturating_add(adapter_weights), gradients, accumulator, optimizer, reference: 0, host }
}

/// fp32 gradients of `count` trained elements: whole under none and zero1 (and under zero2
/// when one backward pass makes them all), else this rank's shard plus the piece in flight.
/// A zero1/zero2 step updates a copy of this rank's slices (4 B a shard's element) beside the
/// whole model before gathering them (dpo-train's `AdamW::step_sharded`; DeepSpeed under TRL
/// steps its own flat partition), while zero1's whole gradients, or zero2's shard, are still held;
/// zero3 updates its slices at rest, and the offload on the host.
fn sharded_gradients(req: &MemoryRequest<'_>, split: Split, count: u64) -> u64 {
    let held = held_gradients(req, split, count);
    // The whole gradients are the backward's peak; the step holds only the shard.
    if req.sharding == Sharding::Zero2 && !req.gradient_checkpointing {
        return held;
    }
    let dpo_train = matches!(req.engine, Engine::DpoTrain(_));
    // Resident masters are updated in place; the copy is of the compute-dtype slices they are
    // written into (the embedding's, fp32, ignored: a few percent of the copy at most).
    let per = if resident(req) { req.dtype.bytes() } else { 4 };
    let updated = match req.sharding {
        Sharding::Zero1 | Sharding::Zero2 if dpo_train && !req.offload_optimizer => split.shard(per, count),
        _ => 0,
    };
    held.saturating_add(updated)
}

/// The fp32 gradients of `count` trained elements a backward pass leaves: whole, but where each
/// part's leave reduce-scattered (zero3, and zero2 with checkpointing: this rank's shard and the
/// piece in flight). With accumulation these are what the step holds between its passes.
fn held_gradients(req: &MemoryRequest<'_>, split: Split, count: u64) -> u64 {
    match req.sharding {
        Sharding::Zero3 => split.shard_and_piece(4, count),
        Sharding::Zero2 if req.gradient_checkpointing => split.shard_and_piece(4, count),
        _ => mul(&[4, count]),
    }
}

/// Gradient accumulation's sum, held through every pass after a step's first (dpo-train's
/// `GradAccumulator`); the fresh gradients of each backward join it before it is added.
fn accumulated(req: &MemoryRequest<'_>, split: Split, count: u64) -> u64 {
    if req.accumulation > 1 { held_gradients(req, split, count) } else { 0 }
}

/// AdamW's m and v (8 bytes per trained element, `1/N` of them when sharded) on the GPU, or in
/// host memory with the fp32 masters (4 more bytes) when offloaded: `(gpu, host)`.
fn optimizer_terms(req: &MemoryRequest<'_>, n: u64, count: u64) -> (u64, u64) {
    let n = if req.sharding == Sharding::None { 1 } else { n };
    match req.offload_optimizer {
        true => (0, mul(&[12, count]).div_ceil(n)),
        false => (mul(&[8, count]).div_ceil(n), 0),
    }
}

/// Bytes per token one decoder layer keeps for the backward, `A` of the module doc:
/// `8h + 4c*h + 2c*d*(a+kv) + 4c*i + 4a + 8` (two RMSNorms, attention, SwiGLU MLP).
pub fn layer_activation_bytes(m: &ModelShape, c: u64) -> u64 {
    let (h, a, kv, d, i) = (m.hidden_size, m.num_heads, m.num_kv_heads, m.head_dim, m.intermediate_size);
    let norms = mul(&[2, mul(&[4, h]).saturating_add(mul(&[2, c, h])).saturating_add(4)]);
    let attention = mul(&[2, c, d, a.saturating_add(kv)]).saturating_add(mul(&[4, a]));
    let mlp = mul(&[4, c, i]);
    norms.saturating_add(attention).saturating_add(mlp)
}

/// Bytes per token kept once, outside the layers: the final RMSNorm (`4h + 2c*h + 4`) and the
/// int64 token ids the embedding saves (8).
pub fn head_activation_bytes(m: &ModelShape, c: u64) -> u64 {
    mul(&[4, m.hidden_size]).saturating_add(mul(&[2, c, m.hidden_size])).saturating_add(12)
}

/// Estimates the peak memory of one rank (see the module doc for every formula).
pub fn estimate(req: &MemoryRequest<'_>) -> MemoryEstimate {
    let m = req.model;
    let c = req.dtype.bytes();
    let n = req.world_size.max(1);
    let State { weights, gradients, accumulator, optimizer, reference, host } = match req.finetune {
        FineTune::Full => full_state(req, n),
        FineTune::Lora { rank } => lora_state(req, n, rank),
    };
    if let Engine::DpoTrain(tokens) = req.engine {
        let (activations, logits, first) = packed::dynamic(req, tokens);
        // The full gradients exist once the activations are freed: the larger phase counts,
        // beside what accumulation holds from the step's earlier passes.
        let gradients =
            accumulator.saturating_add(first.max(gradients.saturating_sub(activations.saturating_add(logits))));
        let terms = [weights, gradients, optimizer, reference, activations, logits];
        let sum = terms.iter().fold(0u64, |a, &b| a.saturating_add(b));
        let allocated = sum.saturating_add(packed::WORKSPACE_BYTES);
        let overhead = (allocated.saturating_mul(ALLOCATOR_PERCENT) / 100)
            .saturating_add(packed::WORKSPACE_BYTES)
            .saturating_add(CUDA_CONTEXT_BYTES);
        let total = sum.saturating_add(overhead);
        return MemoryEstimate { weights, gradients, optimizer, reference, activations, logits, overhead, total, host };
    }
    let tokens = mul(&[req.seq_len, req.micro_batch, 2]);
    let layer_full = mul(&[tokens, layer_activation_bytes(m, c)]);
    let head = mul(&[tokens, head_activation_bytes(m, c)]);
    // zero3 runs the decoder a layer at a time and recomputes it in the backward.
    let layers = if req.gradient_checkpointing || req.sharding == Sharding::Zero3 {
        mul(&[m.num_layers, tokens, m.hidden_size, c]).saturating_add(layer_full)
    } else {
        mul(&[m.num_layers, layer_full])
    };
    let activations = layers.saturating_add(head);
    let logits = mul(&[tokens, m.vocab_size, 4]);
    let sum =
        [weights, gradients, optimizer, reference, activations, logits].iter().fold(0u64, |a, &b| a.saturating_add(b));
    let overhead = (sum.saturating_mul(OVERHEAD_PERCENT) / 100).saturating_add(CUDA_CONTEXT_BYTES);
    let total = sum.saturating_add(overhead);
    MemoryEstimate { weights, gradients, optimizer, reference, activations, logits, overhead, total, host }
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
            dtype: Precision::Bf16,
            finetune: FineTune::Full,
            reference: Reference::Keep,
            gradient_checkpointing: false,
            world_size: 1,
            sharding: Sharding::None,
            offload_optimizer: false,
            engine: Engine::Trl,
            cuda: true,
            accumulation: 1,
        }
    }

    #[test]
    fn bytes_per_parameter() {
        let m = shape();
        let e = estimate(&req(&m));
        // Mixed precision: 6 + 4 + 8 = 18 bytes/param, plus a 2-byte bf16 reference.
        assert_eq!(e.weights + e.gradients + e.optimizer, 18 * m.params);
        assert_eq!(e.reference, 2 * m.params);
        let e = estimate(&MemoryRequest { dtype: Precision::Fp32, ..req(&m) });
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
        // Llama-3.2-1B's shape (h 2048, i 8192, 32 heads / 8 kv of 64) in bf16: per token and layer
        // 8h + 4ch + 2cd(a+kv) + 4ci + 4a + 8 = 16384 + 16384 + 10240 + 65536 + 128 + 8, the head
        // 4h + 2ch + 12.
        let (layer, head) = (108_680, 16_396);
        assert_eq!((m.intermediate_size, m.num_heads, m.num_kv_heads, m.head_dim), (8192, 32, 8, 64));
        assert_eq!((layer_activation_bytes(&m, 2), head_activation_bytes(&m, 2)), (layer, head));
        assert_eq!(e.activations, s * b2 * (l * layer + head));
        assert_eq!(e.logits, 2 * 1024 * m.vocab_size * 4);
        let sum = e.weights + e.gradients + e.optimizer + e.reference + e.activations + e.logits;
        assert_eq!(e.overhead, sum / 10 + CUDA_CONTEXT_BYTES);
        assert_eq!(e.total, sum + e.overhead);
        // Checkpointed: each layer's bf16 input, one layer recomputed, the head.
        let ck = estimate(&MemoryRequest { gradient_checkpointing: true, ..req(&m) });
        assert_eq!(ck.activations, s * b2 * (l * 2 * h + layer + head));
        assert!(ck.activations < e.activations);
        let two = estimate(&MemoryRequest { micro_batch: 2, ..req(&m) });
        assert_eq!(two.activations, 2 * e.activations);
        assert_eq!(two.logits, 2 * e.logits);
    }

    /// dpo-train's accumulated gradients stay through a step's later passes: 4 bytes a trained
    /// element more whole, this rank's shard and a piece under zero3, an adapter's under LoRA;
    /// one pass a step holds none. (Measured on the CPU, a 134M-parameter model at micro-batch 2:
    /// 3.01 GiB peak at one pass a step, 3.42 at four, +0.41 GiB where 4P is 0.50.)
    #[test]
    fn accumulation_holds_the_summed_gradients() {
        let m = ModelShape::from_param_count(P);
        let tokens = crate::PairTokens::bound(1024).batch(1);
        let grads = |r: MemoryRequest<'_>, k| {
            estimate(&MemoryRequest { accumulation: k, engine: Engine::DpoTrain(tokens), ..r }).gradients
        };
        let none = sharded(&m, Sharding::None);
        assert_eq!(grads(none, 4) - grads(none, 1), 4 * P);
        assert_eq!(grads(none, 0), grads(none, 1), "0 counts as one pass");
        let z3 = sharded(&m, Sharding::Zero3);
        assert_eq!(grads(z3, 2) - grads(z3, 1), (4 * P).div_ceil(4) + 4 * PG);
        let lora = MemoryRequest { finetune: FineTune::Lora { rank: 16 }, ..none };
        assert_eq!(grads(lora, 2) - grads(lora, 1), 4 * m.lora_params(16));
    }

    /// 1.5B parameters shaped like Qwen2.5-1.5B (tied): the largest gathered piece is the
    /// embedding, 151936 * 1536 = 233,373,696 parameters.
    const PG: u64 = 233_373_696;
    const P: u64 = 1_500_000_000;

    fn sharded(model: &ModelShape, sharding: Sharding) -> MemoryRequest<'_> {
        MemoryRequest { world_size: 4, sharding, ..req(model) }
    }

    #[test]
    fn zero_stages_by_hand() {
        let m = ModelShape::from_param_count(P);
        assert_eq!(m.gathered_piece_params(), PG);
        let none = estimate(&sharded(&m, Sharding::None));
        assert_eq!(
            (none.weights, none.gradients, none.optimizer, none.reference),
            (9e9 as u64, 6e9 as u64, 12e9 as u64, 3e9 as u64)
        );
        // zero1: only AdamW's m and v are split, 8 * 1.5e9 / 4.
        let z1 = estimate(&sharded(&m, Sharding::Zero1));
        assert_eq!(
            (z1.weights, z1.gradients, z1.optimizer, z1.reference),
            (9e9 as u64, 6e9 as u64, 3e9 as u64, 3e9 as u64)
        );
        assert_eq!(z1.activations, none.activations);
        // zero2 without checkpointing: the one backward pass holds every gradient.
        let z2 = estimate(&sharded(&m, Sharding::Zero2));
        assert_eq!((z2.gradients, z2.optimizer), (6e9 as u64, 3e9 as u64));
        // With checkpointing: 4 * 1.5e9 / 4 + one piece's 4 * PG.
        let z2c = estimate(&MemoryRequest { gradient_checkpointing: true, ..sharded(&m, Sharding::Zero2) });
        assert_eq!(z2c.gradients, 1_500_000_000 + 933_494_784);
        assert_eq!(z2c.weights, 9e9 as u64);
        // zero3 bf16: fp32 shards 1.5e9, the gathered piece in fp32 and its bf16 cast (6 * PG).
        let z3 = estimate(&sharded(&m, Sharding::Zero3));
        assert_eq!(z3.weights, 1_500_000_000 + 1_400_242_176);
        assert_eq!(z3.gradients, 1_500_000_000 + 933_494_784);
        assert_eq!(z3.optimizer, 3e9 as u64);
        assert_eq!(z3.reference, 750_000_000 + 466_747_392);
        // Always checkpointed.
        assert_eq!(z3.activations, z2c.activations);
        assert!(z3.activations < none.activations);
        // fp32: no half cast; the reference is fp32 too.
        let z3f = estimate(&MemoryRequest { dtype: Precision::Fp32, ..sharded(&m, Sharding::Zero3) });
        assert_eq!(z3f.weights, 1_500_000_000 + 933_494_784);
        assert_eq!(z3f.reference, 1_500_000_000 + 933_494_784);
        assert_eq!([none.host, z1.host, z2.host, z3.host], [0; 4]);
    }

    #[test]
    fn offload_moves_the_moments_and_masters_to_the_host() {
        let m = ModelShape::from_param_count(P);
        let off = |s| estimate(&MemoryRequest { offload_optimizer: true, ..sharded(&m, s) });
        // Unsharded: the GPU keeps the bf16 copy (2P); the host the fp32 master and moments, 12P.
        let none = off(Sharding::None);
        assert_eq!((none.weights, none.optimizer, none.host), (3e9 as u64, 0, 18e9 as u64));
        // zero2: each rank's host holds its quarter of the masters and moments, 12 * 1.5e9 / 4.
        let z2 = off(Sharding::Zero2);
        assert_eq!((z2.weights, z2.optimizer, z2.host), (3e9 as u64, 0, 4.5e9 as u64));
        // zero3: bf16 shards 2P/N and the gathered piece in bf16, 2 * PG.
        let z3 = off(Sharding::Zero3);
        assert_eq!((z3.weights, z3.optimizer, z3.host), (750_000_000 + 2 * PG, 0, 4.5e9 as u64));
        // fp32: the GPU keeps the fp32 parameters; the host a copy of this rank's slice and its moments.
        let f = estimate(&MemoryRequest {
            dtype: Precision::Fp32,
            offload_optimizer: true,
            ..sharded(&m, Sharding::Zero1)
        });
        assert_eq!((f.weights, f.optimizer, f.host), (6e9 as u64, 0, 4.5e9 as u64));
        // The host bytes are not in the GPU total.
        let sum = z3.weights + z3.gradients + z3.reference + z3.activations + z3.logits;
        assert_eq!(z3.total, sum + z3.overhead);
    }

    #[test]
    fn lora_under_sharding() {
        let m = ModelShape::from_param_count(P);
        let a = m.lora_params(16);
        let lora = |s| MemoryRequest { finetune: FineTune::Lora { rank: 16 }, ..sharded(&m, s) };
        let z1 = estimate(&lora(Sharding::Zero1));
        assert_eq!((z1.weights, z1.gradients, z1.optimizer), (2 * P + 4 * a, 4 * a, (8 * a).div_ceil(4)));
        // zero3 partitions the frozen base too, and gathers one layer's adapters (A / L).
        let z3 = estimate(&lora(Sharding::Zero3));
        let a_layer = a / m.num_layers;
        assert_eq!(z3.weights, 750_000_000 + 2 * PG + (4 * a).div_ceil(4) + 4 * a_layer);
        assert_eq!(z3.gradients, (4 * a).div_ceil(4) + 4 * a_layer);
        assert_eq!(z3.reference, 0);
        let off = estimate(&MemoryRequest { offload_optimizer: true, ..lora(Sharding::Zero2) });
        assert_eq!((off.weights, off.optimizer, off.host), (2 * P + 2 * a, 0, (12 * a).div_ceil(4)));
    }

    #[test]
    fn stages_only_ever_lower_the_total() {
        let m = ModelShape::from_param_count(P);
        let stages = [Sharding::None, Sharding::Zero1, Sharding::Zero2, Sharding::Zero3];
        for dtype in [Precision::Bf16, Precision::Fp32] {
            for finetune in [FineTune::Full, FineTune::Lora { rank: 16 }] {
                for gradient_checkpointing in [false, true] {
                    for reference in [Reference::Keep, Reference::Precompute] {
                        for world_size in [2, 4, 8] {
                            let totals: Vec<u64> = stages
                                .iter()
                                .map(|&sharding| {
                                    let r = MemoryRequest {
                                        dtype,
                                        finetune,
                                        gradient_checkpointing,
                                        reference,
                                        world_size,
                                        sharding,
                                        ..req(&m)
                                    };
                                    let e = estimate(&r);
                                    let off = estimate(&MemoryRequest { offload_optimizer: true, ..r });
                                    assert!(off.total <= e.total, "{r:?}");
                                    e.total
                                })
                                .collect();
                            assert!(totals.windows(2).all(|w| w[0] >= w[1]), "{dtype:?} {finetune:?} {totals:?}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn extremes_saturate_instead_of_wrapping() {
        let m = ModelShape::from_param_count(1_000_000_000_000_000);
        for sharding in [Sharding::None, Sharding::Zero3] {
            let r = MemoryRequest { seq_len: 1 << 20, micro_batch: 1 << 20, world_size: 0, sharding, ..req(&m) };
            for offload_optimizer in [false, true] {
                let e = estimate(&MemoryRequest { offload_optimizer, ..r });
                // Far beyond any GPU (2^62 bytes), and never below one of its own terms.
                assert!(e.total > 1 << 62, "{sharding:?}: {e:?}");
                assert!(e.total >= e.weights.max(e.activations).max(e.logits), "{sharding:?}: {e:?}");
            }
        }
    }
}
