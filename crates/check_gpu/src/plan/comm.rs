//! Step 9: time per optimizer step spent in collectives, from a measured bench.
//!
//! What each rank sends per optimizer step, as dpo-train runs each stage (`P` parameters, `T`
//! trained ones, `A` micro-batches per rank per step; gradients travel in fp32, trained weights
//! in fp32 (their masters; in the compute dtype `c` when offloaded, and in bf16/fp16 without
//! checkpointing, where the device keeps compute-dtype copies beside the masters, but the fp32
//! embedding), frozen ones in the compute dtype):
//!
//! | stage | collectives per optimizer step |
//! |---|---|
//! | none | all-reduce of 4T (DDP) |
//! | zero1 | all-reduce of 4T, all-gather of the updated trained weights |
//! | zero2 | reduce-scatter of 4T (A times with checkpointing: after each part's backward), all-gather of the updated trained weights |
//! | zero3 | all-gather of the weights 2A times (each part before its forward and again for its recompute and backward), reduce-scatter of 4T A times; a reference computed every step gathers its `c*P` A times more |
//!
//! A ring all-reduce of `S` bytes over `n` ranks moves `S × 2(n−1)/n` bytes through each rank's
//! link, an all-gather or reduce-scatter of `S` (the whole buffer) `S × (n−1)/n` (nccl-tests
//! PERFORMANCE.md), so each takes `S × factor / busbw`, with the bus bandwidth of that collective
//! measured at the size nearest DDP's 25 MiB bucket.

use serde::{Deserialize, Serialize};

use super::Log;
use crate::bench::{Bench, Collective, GRADIENT_BUCKET_BYTES};
use crate::memory::{FineTune, Precision, Reference, Sharding, masters_resident};
use crate::model::ModelShape;
use crate::snapshot::Snapshot;
use crate::units::list;

/// Bytes per gradient element (fp32).
const GRADIENT_BYTES_PER_PARAM: u64 = 4;

/// The setting a step runs in: what decides its collectives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepSetting {
    pub finetune: FineTune,
    pub sharding: Sharding,
    pub dtype: Precision,
    pub offload_optimizer: bool,
    pub gradient_checkpointing: bool,
    pub reference: Reference,
    /// Micro-batches each rank runs per optimizer step (at least 1).
    pub micro_batches: u64,
}

/// One kind of collective a step runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Transfer {
    pub collective: Collective,
    /// `gradients`, `updated weights`, `weights`, `reference weights`.
    pub what: String,
    /// Bytes of the whole buffer per call (nccl-tests' size).
    pub bytes: u64,
    /// Calls per optimizer step.
    pub calls: u64,
    /// `2(n−1)/n` for all-reduce, `(n−1)/n` otherwise.
    pub bus_factor: f64,
    /// Measured bus bandwidth of the collective, GB/s (1e9 bytes).
    pub busbw_gbps: f64,
    /// The measured size that bandwidth was taken at (the one nearest a 25 MiB bucket).
    pub measured_at_bytes: u64,
    /// `bytes × calls × bus_factor / busbw`.
    pub seconds: f64,
}

/// The communication estimate of a plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Communication {
    /// Trainable parameters × 4 bytes: the fp32 gradients.
    pub gradient_bytes: u64,
    pub world_size: usize,
    pub sharding: Sharding,
    /// `nccl` or `gloo`.
    pub backend: String,
    /// Each collective of the step, in the order it first runs.
    pub transfers: Vec<Transfer>,
    /// The transfers' seconds summed (none overlaps compute in this estimate).
    pub seconds_per_step: f64,
}

/// Bytes of gradients all-reduced per optimizer step.
pub fn gradient_bytes(model: &ModelShape, finetune: FineTune) -> u64 {
    trained(model, finetune).saturating_mul(GRADIENT_BYTES_PER_PARAM)
}

fn trained(model: &ModelShape, finetune: FineTune) -> u64 {
    match finetune {
        FineTune::Full => model.params,
        FineTune::Lora { rank } => model.lora_params(rank),
    }
}

/// The collectives of one optimizer step in `s`: `(collective, what, bytes per call, calls)`.
pub fn traffic(model: &ModelShape, s: &StepSetting) -> Vec<(Collective, &'static str, u64, u64)> {
    let t = trained(model, s.finetune);
    let c = s.dtype.bytes();
    let grads = t.saturating_mul(GRADIENT_BYTES_PER_PARAM);
    // Trained weights travel as their fp32 masters, or in the compute dtype when those are on the
    // host or beside compute-dtype copies on the device (whose embedding stays in fp32).
    let resident = masters_resident(s.dtype, s.offload_optimizer, s.gradient_checkpointing, s.sharding);
    let trained_bytes = match (s.offload_optimizer, resident, s.finetune) {
        (true, ..) | (false, true, FineTune::Lora { .. }) => t.saturating_mul(c),
        (false, true, FineTune::Full) => {
            let embedding = model.vocab_size.saturating_mul(model.hidden_size).min(t);
            (t - embedding).saturating_mul(c).saturating_add(embedding.saturating_mul(4))
        }
        (false, false, _) => t.saturating_mul(4),
    };
    let a = s.micro_batches.max(1);
    match s.sharding {
        Sharding::None => vec![(Collective::AllReduce, "gradients", grads, 1)],
        Sharding::Zero1 => {
            vec![
                (Collective::AllReduce, "gradients", grads, 1),
                (Collective::AllGather, "updated weights", trained_bytes, 1),
            ]
        }
        Sharding::Zero2 => {
            let scatters = if s.gradient_checkpointing { a } else { 1 };
            vec![
                (Collective::ReduceScatter, "gradients", grads, scatters),
                (Collective::AllGather, "updated weights", trained_bytes, 1),
            ]
        }
        Sharding::Zero3 => {
            // Full fine-tuning trains every weight; LoRA's frozen base travels in the compute dtype.
            let frozen = model.params.saturating_sub(if s.finetune == FineTune::Full { t } else { 0 });
            let weights = trained_bytes.saturating_add(frozen.saturating_mul(c));
            let mut v = vec![
                (Collective::AllGather, "weights", weights, 2 * a),
                (Collective::ReduceScatter, "gradients", grads, a),
            ];
            if s.reference == Reference::Keep {
                v.push((Collective::AllGather, "reference weights", model.params.saturating_mul(c), a));
            }
            v
        }
    }
}

/// The estimate for `model` trained in `setting` over the bench's ranks; `None` with fewer than
/// two ranks (nothing to communicate) or without a measurement of a collective the step runs.
pub fn estimate(model: &ModelShape, setting: &StepSetting, bench: &Bench) -> Option<Communication> {
    let n = bench.world_size;
    if n < 2 {
        return None;
    }
    let mut transfers = Vec::new();
    for (collective, what, bytes, calls) in traffic(model, setting) {
        let at = bench.nearest(collective, GRADIENT_BUCKET_BYTES)?;
        let busbw = at.busbw(n);
        if busbw <= 0.0 {
            return None;
        }
        let bus_factor = collective.bus_factor(n);
        transfers.push(Transfer {
            collective,
            what: what.to_string(),
            bytes,
            calls,
            bus_factor,
            busbw_gbps: busbw,
            measured_at_bytes: at.bytes,
            seconds: bytes as f64 * calls as f64 * bus_factor / (busbw * 1e9),
        });
    }
    Some(Communication {
        gradient_bytes: gradient_bytes(model, setting.finetune),
        world_size: n,
        sharding: setting.sharding,
        backend: bench.backend.clone(),
        seconds_per_step: transfers.iter().map(|t| t.seconds).sum(),
        transfers,
    })
}

/// The plan's step: the snapshot's bench, when it measured exactly the chosen GPUs, gives the
/// estimate and its warnings; a bench of other devices only earns a note.
pub(super) fn communication(
    snap: &Snapshot,
    chosen: &[u32],
    model: Option<&ModelShape>,
    setting: &StepSetting,
    log: &mut Log,
) -> Option<Communication> {
    let rec = snap.bench.as_ref()?;
    let mut measured = rec.gpus.clone();
    measured.sort_unstable();
    let mut planned = chosen.to_vec();
    planned.sort_unstable();
    if measured != planned {
        let what = if rec.gpus.is_empty() {
            format!("{} CPU process(es) over {}", rec.bench.world_size, rec.bench.backend)
        } else {
            format!("GPUs {}", list(&rec.gpus))
        };
        log.notes.push(format!(
            "the bench measured {what}, not the chosen GPUs {}: no communication estimate (run check-gpu --bench)",
            list(chosen)
        ));
        return None;
    }
    let peak = crate::peak::nominal_peak(snap, &rec.gpus).ok();
    log.warnings.extend(crate::peak::warnings(rec, peak.as_ref()));
    estimate(model?, setting, &rec.bench)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::Measurement;

    const MIB: u64 = 1 << 20;

    /// All-reduce 16 MiB in 1 ms; all-gather and reduce-scatter 16 MiB in 0.5 ms.
    fn bench(world_size: usize) -> Bench {
        let m = |op, bytes: u64, seconds: f64| Measurement { op, bytes, seconds, correct: true };
        Bench {
            backend: "nccl".into(),
            world_size,
            devices: Vec::new(),
            collectives: vec![
                m(Collective::AllReduce, MIB, 0.0005),
                m(Collective::AllReduce, 16 * MIB, 0.001),
                m(Collective::AllReduce, 64 * MIB, 0.003),
                m(Collective::AllGather, 16 * MIB, 0.0005),
                m(Collective::ReduceScatter, 16 * MIB, 0.0005),
            ],
        }
    }

    fn setting(sharding: Sharding) -> StepSetting {
        StepSetting {
            finetune: FineTune::Full,
            sharding,
            dtype: Precision::Bf16,
            offload_optimizer: false,
            gradient_checkpointing: false,
            reference: Reference::Keep,
            micro_batches: 4,
        }
    }

    /// By hand: 1e9 parameters, fp32 gradients = 4e9 bytes over 4 GPUs. Nearest 25 MiB is 16
    /// MiB in 1 ms: algbw 16.777216 GB/s, busbw × 1.5 = 25.165824 GB/s; 4e9 × 1.5 / 25.165824e9
    /// = 0.2384185791 s (= 4e9 / 16.777216e9: at one size the factor cancels).
    #[test]
    fn all_reduce_time_worked_by_hand() {
        let m = ModelShape::from_param_count(1_000_000_000);
        let c = estimate(&m, &setting(Sharding::None), &bench(4)).expect("estimate");
        assert_eq!(c.gradient_bytes, 4 * m.params);
        let [t] = c.transfers.as_slice() else { panic!("one transfer: {c:?}") };
        assert_eq!(
            (t.collective, t.bytes, t.calls, t.measured_at_bytes),
            (Collective::AllReduce, 4 * m.params, 1, 16 * MIB)
        );
        assert_eq!(t.bus_factor, 1.5);
        assert!((t.busbw_gbps - 25.165_824).abs() < 1e-9, "{}", t.busbw_gbps);
        let by_hand = 4.0 * m.params as f64 / 16.777_216e9;
        assert!((c.seconds_per_step - by_hand).abs() < 1e-9, "{} vs {by_hand}", c.seconds_per_step);
        assert_eq!(estimate(&m, &setting(Sharding::None), &bench(1)), None, "one rank communicates nothing");
    }

    /// Each stage's collectives for P parameters, 4 micro-batches, bf16 (c = 2), 4 ranks.
    /// All-gather and reduce-scatter: 16 MiB in 0.5 ms = 33.554432 GB/s algbw, busbw × 0.75.
    #[test]
    fn each_stage_sends_what_dpo_train_sends() {
        let m = ModelShape::from_param_count(1_000_000_000);
        let p = m.params;
        let ops = |s: StepSetting| -> Vec<(Collective, u64, u64)> {
            traffic(&m, &s).into_iter().map(|(op, _, bytes, calls)| (op, bytes, calls)).collect()
        };
        use Collective::{AllGather as Ag, AllReduce as Ar, ReduceScatter as Rs};
        // Without checkpointing the device keeps bf16 copies beside the masters and gathers
        // those, the embedding (E = V·h) in fp32.
        let e = m.vocab_size * m.hidden_size;
        let copies = 2 * (p - e) + 4 * e;
        assert_eq!(ops(setting(Sharding::Zero1)), [(Ar, 4 * p, 1), (Ag, copies, 1)]);
        assert_eq!(ops(setting(Sharding::Zero2)), [(Rs, 4 * p, 1), (Ag, copies, 1)]);
        let zero1c = StepSetting { gradient_checkpointing: true, ..setting(Sharding::Zero1) };
        assert_eq!(ops(zero1c), [(Ar, 4 * p, 1), (Ag, 4 * p, 1)], "the fp32 weights gathered");
        let zero2c = StepSetting { gradient_checkpointing: true, ..setting(Sharding::Zero2) };
        assert_eq!(ops(zero2c), [(Rs, 4 * p, 4), (Ag, 4 * p, 1)], "one reduce-scatter per micro-batch's backward");
        assert_eq!(ops(setting(Sharding::Zero3)), [(Ag, 4 * p, 8), (Rs, 4 * p, 4), (Ag, 2 * p, 4)]);
        let pre = StepSetting { reference: Reference::Precompute, ..setting(Sharding::Zero3) };
        assert_eq!(ops(pre), [(Ag, 4 * p, 8), (Rs, 4 * p, 4)], "no reference pass, no reference gathers");
        let off = StepSetting { offload_optimizer: true, ..setting(Sharding::Zero1) };
        assert_eq!(ops(off), [(Ar, 4 * p, 1), (Ag, 2 * p, 1)], "offloaded masters: the device copy is bf16");
        let a = m.lora_params(16);
        let lora = StepSetting { finetune: FineTune::Lora { rank: 16 }, ..setting(Sharding::Zero3) };
        assert_eq!(ops(lora), [(Ag, 2 * p + 4 * a, 8), (Rs, 4 * a, 4), (Ag, 2 * p, 4)], "the base gathered in bf16");

        let z1 = estimate(&m, &zero1c, &bench(4)).expect("estimate");
        let ag = 4.0 * p as f64 * 0.75 / (33.554_432e9 * 0.75);
        assert!((z1.seconds_per_step - (4.0 * p as f64 / 16.777_216e9 + ag)).abs() < 1e-9, "{z1:?}");
        let z3 = estimate(&m, &setting(Sharding::Zero3), &bench(4)).expect("estimate");
        let by_hand = (8.0 * 4.0 + 4.0 * 4.0 + 4.0 * 2.0) * p as f64 / 33.554_432e9;
        assert!((z3.seconds_per_step - by_hand).abs() < 1e-9, "{} vs {by_hand}", z3.seconds_per_step);
    }

    #[test]
    fn a_bench_without_the_collective_gives_no_estimate() {
        let m = ModelShape::from_param_count(1_000_000_000);
        let mut b = bench(2);
        b.collectives.retain(|x| x.op == Collective::AllReduce);
        assert!(estimate(&m, &setting(Sharding::None), &b).is_some());
        assert_eq!(estimate(&m, &setting(Sharding::Zero3), &b), None);
    }

    #[test]
    fn lora_all_reduces_only_the_adapters() {
        let m = ModelShape::from_param_count(1_500_000_000);
        assert_eq!(gradient_bytes(&m, FineTune::Full), 4 * m.params);
        assert_eq!(gradient_bytes(&m, FineTune::Lora { rank: 16 }), 4 * m.lora_params(16));
    }
}
