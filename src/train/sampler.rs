//! Which pairs each optimizer step sees: a fresh permutation per epoch, drawn from `seed + epoch`
//! (PyTorch's `DistributedSampler` convention), cut into global batches and then micro-batches.
//!
//! A step's batch depends only on (seed, step), so a resumed run sees exactly the batches the
//! uninterrupted run would have, and no data position needs saving beyond the step.

use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;

/// The batch plan of a run.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampler {
    /// Pairs in the training set.
    pub len: usize,
    /// Pairs per optimizer step.
    pub global_batch: usize,
    /// Pairs per forward/backward pass.
    pub micro_batch: usize,
    pub seed: u64,
}

impl Sampler {
    /// Optimizer steps per epoch; the last batch of an epoch may be short (nothing is dropped).
    pub fn steps_per_epoch(&self) -> u64 {
        self.len.div_ceil(self.global_batch.max(1)) as u64
    }

    /// The permutation of epoch `epoch`.
    pub fn permutation(&self, epoch: u64) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.len).collect();
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed.wrapping_add(epoch));
        order.shuffle(&mut rng);
        order
    }

    /// The pairs of optimizer step `step` (0-based), split into micro-batches.
    pub fn micro_batches(&self, step: u64) -> Vec<Vec<usize>> {
        let per_epoch = self.steps_per_epoch();
        let (epoch, within) = (step / per_epoch, (step % per_epoch) as usize);
        let order = self.permutation(epoch);
        let start = within * self.global_batch;
        let end = (start + self.global_batch).min(self.len);
        order[start..end].chunks(self.micro_batch.max(1)).map(<[usize]>::to_vec).collect()
    }

    /// The epoch reached after `step` optimizer steps, fractional as transformers logs it.
    pub fn epoch_at(&self, step: u64) -> f64 {
        step as f64 / self.steps_per_epoch() as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_pair_once_per_epoch_and_reproducible() {
        let s = Sampler { len: 10, global_batch: 4, micro_batch: 2, seed: 3 };
        assert_eq!(s.steps_per_epoch(), 3);
        let mut seen: Vec<usize> = (0..3).flat_map(|step| s.micro_batches(step).concat()).collect();
        assert_eq!(s.micro_batches(2).concat().len(), 2, "the short last batch");
        seen.sort_unstable();
        assert_eq!(seen, (0..10).collect::<Vec<_>>());
        assert_eq!(s.micro_batches(4), s.clone().micro_batches(4));
        assert_ne!(s.permutation(0), s.permutation(1), "epochs reshuffle");
    }
}
