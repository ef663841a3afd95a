//! Step 9: time per optimizer step spent all-reducing gradients, from a measured bench.
//!
//! Data parallelism all-reduces every trainable parameter's gradient once per optimizer step
//! (dpo-train's `Workers::sum_grads`, in DDP's 25 MiB buckets). A ring all-reduce of `S` bytes
//! over `n` ranks moves `S × 2(n−1)/n` bytes through each rank's link (nccl-tests
//! PERFORMANCE.md), so it takes `S × 2(n−1)/n / busbw`, with the bus bandwidth measured at the
//! size nearest one bucket. Gradients are fp32 (4 bytes; the `gradients` term of
//! [`crate::memory`]) whatever the compute dtype.

use serde::{Deserialize, Serialize};

use super::Log;
use crate::bench::{self, Bench, Collective, GRADIENT_BUCKET_BYTES};
use crate::memory::FineTune;
use crate::model::ModelShape;
use crate::snapshot::Snapshot;
use crate::units::list;

/// Bytes per gradient element (fp32).
const GRADIENT_BYTES_PER_PARAM: u64 = 4;

/// The communication estimate of a plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Communication {
    /// Trainable parameters × 4 bytes, all-reduced once per optimizer step.
    pub gradient_bytes: u64,
    pub world_size: usize,
    /// `2(n−1)/n`.
    pub bus_factor: f64,
    /// Measured all-reduce bus bandwidth, GB/s (1e9 bytes).
    pub busbw_gbps: f64,
    /// The measured size that bandwidth was taken at (the one nearest a 25 MiB bucket).
    pub measured_at_bytes: u64,
    /// `nccl` or `gloo`.
    pub backend: String,
    /// `gradient_bytes × bus_factor / busbw`.
    pub seconds_per_step: f64,
}

/// Bytes of gradients all-reduced per optimizer step.
pub fn gradient_bytes(model: &ModelShape, finetune: FineTune) -> u64 {
    let trainable = match finetune {
        FineTune::Full => model.params,
        FineTune::Lora { rank } => model.lora_params(rank),
    };
    trainable.saturating_mul(GRADIENT_BYTES_PER_PARAM)
}

/// The estimate for `gradient_bytes` over the bench's ranks; `None` with fewer than two ranks
/// (nothing to all-reduce) or without an all-reduce measurement.
pub fn estimate(gradient_bytes: u64, bench: &Bench) -> Option<Communication> {
    let n = bench.world_size;
    if n < 2 {
        return None;
    }
    let at = bench.nearest(Collective::AllReduce, GRADIENT_BUCKET_BYTES)?;
    let busbw = at.busbw(n);
    if busbw <= 0.0 {
        return None;
    }
    let bus_factor = Collective::AllReduce.bus_factor(n);
    Some(Communication {
        gradient_bytes,
        world_size: n,
        bus_factor,
        busbw_gbps: busbw,
        measured_at_bytes: at.bytes,
        backend: bench.backend.clone(),
        seconds_per_step: gradient_bytes as f64 * bus_factor / (busbw * 1e9),
    })
}

/// The plan's step: the snapshot's bench, when it measured exactly the chosen GPUs, gives the
/// estimate and its warnings; a bench of other devices only earns a note.
pub(super) fn communication(
    snap: &Snapshot,
    chosen: &[u32],
    model: Option<&ModelShape>,
    finetune: FineTune,
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
    let peak = bench::peak::nominal_peak(snap, &rec.gpus).ok();
    log.warnings.extend(bench::peak::warnings(rec, peak.as_ref()));
    estimate(gradient_bytes(model?, finetune), &rec.bench)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::Measurement;

    fn bench(world_size: usize) -> Bench {
        let mib = 1u64 << 20;
        let m = |bytes: u64, seconds: f64| Measurement { op: Collective::AllReduce, bytes, seconds, correct: true };
        Bench {
            backend: "nccl".into(),
            world_size,
            devices: Vec::new(),
            collectives: vec![m(mib, 0.0005), m(16 * mib, 0.001), m(64 * mib, 0.003)],
        }
    }

    /// By hand: 1e9 fp32 gradients = 4e9 bytes over 4 GPUs. Nearest 25 MiB is 16 MiB in 1 ms:
    /// algbw 16.777216 GB/s, busbw × 1.5 = 25.165824 GB/s; 4e9 × 1.5 / 25.165824e9 =
    /// 0.2384185791 s (= 4e9 / 16.777216e9: at one size the factor cancels).
    #[test]
    fn all_reduce_time_worked_by_hand() {
        let c = estimate(4_000_000_000, &bench(4)).expect("estimate");
        assert_eq!(c.measured_at_bytes, 16 << 20);
        assert_eq!(c.bus_factor, 1.5);
        assert!((c.busbw_gbps - 25.165_824).abs() < 1e-9, "{}", c.busbw_gbps);
        assert!((c.seconds_per_step - 0.238_418_579_1).abs() < 1e-9, "{}", c.seconds_per_step);
        assert_eq!(estimate(4_000_000_000, &bench(1)), None, "one rank communicates nothing");
    }

    #[test]
    fn lora_all_reduces_only_the_adapters() {
        let m = ModelShape::from_param_count(1_500_000_000);
        assert_eq!(gradient_bytes(&m, FineTune::Full), 4 * m.params);
        assert_eq!(gradient_bytes(&m, FineTune::Lora { rank: 16 }), 4 * m.lora_params(16));
    }
}
