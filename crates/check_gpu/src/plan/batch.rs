//! Step 6, the batch split: `micro × world × accumulation = global` (rounded to the nearest
//! multiple of the world size when it does not divide, with the world size that would be exact),
//! the micro-batch the largest divisor of the per-GPU batch whose estimate fits the smallest
//! free memory (at most 8 when there is no memory to check against); and the learning-rate factors for the effective batch.

use super::fit::Estimator;
use super::{DEFAULT_MICRO_BATCH_CAP, Log, LrScale};
use crate::memory::MemoryEstimate;

/// The batch arithmetic of a plan.
pub(super) struct Split {
    pub micro: u64,
    pub accum: u64,
    /// `micro · world · accum`.
    pub effective: u64,
    /// The estimate at `micro`, when a model was given.
    pub estimate: Option<MemoryEstimate>,
    /// Smallest free memory among the chosen GPUs.
    pub min_free: Option<u64>,
}

/// Splits the global batch over `world` ranks whose smallest free memory is `min_free`
/// (`None`: unknown, as on CPU processes).
/// A micro-batch is at least `min_micro` rows where the per-GPU batch allows it (KTO's 2).
pub(super) fn split(
    world: usize,
    min_free: Option<u64>,
    (global, min_micro): (u64, u64),
    est: &Estimator,
    log: &mut Log,
) -> Split {
    let wu = (world as u64).max(1);
    let per_rank = per_rank(global, world);
    let effective = per_rank * wu;
    if effective != global {
        let exact = (1..=wu).rev().find(|&d| global.is_multiple_of(d) && global / d >= min_micro).unwrap_or(1);
        log.warnings.push(format!(
            "global batch {global} cannot be split exactly over {wu} GPUs: it rounds to {effective} ({per_rank} per GPU); for exactly {global} use --world-size {exact}"
        ));
    }
    // Divisors ascending, the largest that fits kept: the estimate grows with the micro-batch but
    // for accumulation's sum, which the whole per-rank batch in one pass does not hold. Without a
    // model or free memory the cap stands in for the check.
    let smallest = divisors(per_rank).into_iter().find(|&d| d >= min_micro).unwrap_or(per_rank);
    if smallest < min_micro {
        log.warnings.push(format!(
            "the loss needs at least {min_micro} rows a micro-batch, but the global batch gives each GPU {per_rank}: raise --global-batch"
        ));
    }
    let (mut micro, mut estimate) = (smallest, est.at(smallest));
    for m in divisors(per_rank).into_iter().filter(|&m| m > smallest) {
        let fits = match (est.at(m), min_free) {
            (Some(e), Some(free)) => (e.total <= free).then_some(Some(e)),
            (e, _) => (m <= DEFAULT_MICRO_BATCH_CAP).then_some(e),
        };
        let Some(e) = fits else { continue };
        (micro, estimate) = (m, e);
    }
    if !est.has_model() {
        log.notes.push(format!(
            "no model given (--model-params or --model): micro-batch not checked against memory, capped at {DEFAULT_MICRO_BATCH_CAP}"
        ));
    } else if min_free.is_none() {
        log.notes.push(format!("free memory unknown: micro-batch capped at {DEFAULT_MICRO_BATCH_CAP}"));
    }
    Split { micro, accum: per_rank / micro, effective, estimate, min_free }
}

/// Pairs per rank an optimizer step: the global batch over the ranks, rounded to the nearest.
pub(super) fn per_rank(global: u64, world: usize) -> u64 {
    let wu = (world as u64).max(1);
    if global.is_multiple_of(wu) { global / wu } else { (global.saturating_add(wu / 2) / wu).max(1) }
}

/// The divisors of `n`, ascending.
fn divisors(n: u64) -> Vec<u64> {
    let (mut low, mut high) = (Vec::new(), Vec::new());
    let mut d: u64 = 1;
    while d.saturating_mul(d) <= n {
        if n.is_multiple_of(d) {
            low.push(d);
            if d != n / d {
                high.push(n / d);
            }
        }
        d += 1;
    }
    low.extend(high.into_iter().rev());
    low
}

/// Learning-rate factors for a global batch against the one the rate was tuned at.
pub(super) fn lr_scale(global: u64, base: u64) -> LrScale {
    let ratio = global as f64 / base.max(1) as f64;
    LrScale { base_batch: base, linear: ratio, sqrt: ratio.sqrt() }
}

#[cfg(test)]
mod tests {
    use super::divisors;

    #[test]
    fn divisors_ascend() {
        assert_eq!(divisors(1), vec![1]);
        assert_eq!(divisors(21), vec![1, 3, 7, 21]);
        assert_eq!(divisors(36), vec![1, 2, 3, 4, 6, 9, 12, 18, 36]);
    }
}
