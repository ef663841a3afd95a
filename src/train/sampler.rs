//! Which pairs each optimizer step sees: a fresh permutation per epoch, drawn from `seed + epoch`
//! (PyTorch's `DistributedSampler` convention), or the data's order (`train_sampling_strategy =
//! "sequential"`), cut into global batches and then micro-batches.
//!
//! A step's batch depends only on (seed, step), so a resumed run sees exactly the batches the
//! uninterrupted run would have, and no data position needs saving beyond the step.
//!
//! ## Each rank's share
//!
//! W ranks together see exactly the batches of one device with the same global batch.
//!
//! One device cuts the step's G pairs into micro-batches of m. With W ranks and accumulation
//! A = G / (m·W), the same G pairs are cut into A chunks of m·W, and rank r takes the r-th run of m
//! pairs of each chunk: chunk c holds the single-device micro-batches c·W .. c·W + W − 1, and rank
//! r's c-th micro-batch is the single-device micro-batch c·W + r. The ranks' micro-batches are
//! thus a partition of the single-device ones (the sharding of DDP with `DistributedSampler` plus
//! gradient accumulation, but with the single-device order kept).
//!
//! For the same gradient, each rank scales a micro-batch's loss by `pairs / step_pairs` (the
//! whole step's pairs, [`RankStep::step_pairs`], as the single-device trainer does) and the
//! gradients are summed across ranks; with a mean all-reduce, multiply that scale by W.

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
    /// A permutation an epoch; `false`: the data's order every epoch.
    pub shuffle: bool,
}

impl Sampler {
    /// Optimizer steps per epoch; the last batch of an epoch may be short (nothing is dropped).
    pub fn steps_per_epoch(&self) -> u64 {
        self.len.div_ceil(self.global_batch.max(1)) as u64
    }

    /// The permutation of epoch `epoch`.
    pub fn permutation(&self, epoch: u64) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.len).collect();
        if !self.shuffle {
            return order;
        }
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

    /// The epoch reached after `step` optimizer steps over `world_size` ranks, fractional as
    /// transformers logs it: whole epochs, plus the share of the epoch under way's micro-batch
    /// rounds (`micro_batch · world_size` pairs each, the last one short: each rank's dataloader
    /// batches) its steps have taken. 17 pairs, micro-batch 2, 2 a step: 2/9 after one step, not 1/5.
    pub fn epoch_at(&self, step: u64, world_size: usize) -> f64 {
        let (whole, within) = (step / self.steps_per_epoch(), step % self.steps_per_epoch());
        let round = (self.micro_batch * world_size).max(1);
        let rounds = self.len.div_ceil(round).max(1) as u64;
        let per_step = (self.global_batch / round).max(1) as u64;
        whole as f64 + (within * per_step).min(rounds) as f64 / rounds as f64
    }
}

/// A step's global batch that the ranks cannot share evenly.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ShardError {
    #[error("the global batch {global_batch} is not a multiple of micro-batch {micro_batch} x world size {world_size}")]
    Indivisible { global_batch: usize, micro_batch: usize, world_size: usize },
    #[error("rank {rank} is not below the world size {world_size}")]
    RankOutOfRange { rank: usize, world_size: usize },
    #[error("the micro-batch size must be positive")]
    ZeroMicroBatch,
}

/// One rank's part of one optimizer step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankStep {
    /// This rank's micro-batches (pair indices), at most A of them; all non-empty.
    pub micro_batches: Vec<Vec<usize>>,
    /// Pairs in the whole step over all ranks (G, or fewer for the last step of an epoch).
    pub step_pairs: usize,
}

/// Rank `rank`'s micro-batches of `step` under `sampler` (whose `micro_batch` is the per-device m).
///
/// The global batch must be a multiple of m·W, so that every full step gives each rank A
/// micro-batches. The short last step of an epoch is cut the same way, so a rank may get fewer (or
/// no) micro-batches there; it must still join the step's all-reduce.
pub fn rank_step(sampler: &Sampler, step: u64, world_size: usize, rank: usize) -> Result<RankStep, ShardError> {
    validate(sampler.global_batch, sampler.micro_batch, world_size, rank)?;
    let pairs: Vec<usize> = sampler.micro_batches(step).concat();
    Ok(RankStep { micro_batches: shard_step(&pairs, sampler.micro_batch, world_size, rank), step_pairs: pairs.len() })
}

/// Rank `rank`'s micro-batches of one step whose pairs, in single-device order, are `pairs`: of
/// every chunk of `micro_batch * world_size` pairs, the `rank`-th run of `micro_batch` (empty runs
/// of a short chunk are left out).
///
/// # Panics
///
/// Panics if `micro_batch` is 0 ([`rank_step`] checks it first).
pub fn shard_step(pairs: &[usize], micro_batch: usize, world_size: usize, rank: usize) -> Vec<Vec<usize>> {
    assert!(micro_batch > 0, "shard_step: micro_batch must be positive");
    pairs
        .chunks(micro_batch * world_size.max(1))
        .filter_map(|chunk| chunk.chunks(micro_batch).nth(rank))
        .map(<[usize]>::to_vec)
        .collect()
}

fn validate(global_batch: usize, micro_batch: usize, world_size: usize, rank: usize) -> Result<(), ShardError> {
    if micro_batch == 0 {
        return Err(ShardError::ZeroMicroBatch);
    }
    if rank >= world_size {
        return Err(ShardError::RankOutOfRange { rank, world_size });
    }
    if !global_batch.is_multiple_of(micro_batch * world_size) {
        return Err(ShardError::Indivisible { global_batch, micro_batch, world_size });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_pair_once_per_epoch_and_reproducible() {
        let s = Sampler { len: 10, global_batch: 4, micro_batch: 2, seed: 3, shuffle: true };
        assert_eq!(s.steps_per_epoch(), 3);
        let mut seen: Vec<usize> = (0..3).flat_map(|step| s.micro_batches(step).concat()).collect();
        assert_eq!(s.micro_batches(2).concat().len(), 2, "the short last batch");
        seen.sort_unstable();
        assert_eq!(seen, (0..10).collect::<Vec<_>>());
        assert_eq!(s.micro_batches(4), s.clone().micro_batches(4));
        // transformers' epoch counts micro-batch rounds: 5 of 2 pairs an epoch, 2 a step.
        let epochs: Vec<f64> = (1..=4).map(|step| s.epoch_at(step, 1)).collect();
        assert_eq!(epochs, [0.4, 0.8, 1.0, 1.4]);
        // Over 2 ranks a round is 4 pairs: 3 an epoch, one a step.
        assert_eq!((s.epoch_at(1, 2), s.epoch_at(3, 2)), (1.0 / 3.0, 1.0));
        assert_ne!(s.permutation(0), s.permutation(1), "epochs reshuffle");
    }

    #[test]
    fn a_sequential_sampler_cuts_the_data_in_order_every_epoch() {
        // KTO's KL rows rotate within consecutive blocks of the micro-batch: a step's
        // micro-batches must be those blocks, on every rank and in every epoch.
        let s = Sampler { len: 10, global_batch: 4, micro_batch: 2, seed: 3, shuffle: false };
        assert_eq!(s.micro_batches(0), [vec![0, 1], vec![2, 3]]);
        assert_eq!(s.micro_batches(2), [vec![8, 9]]);
        assert_eq!(s.micro_batches(3), s.micro_batches(0), "the next epoch starts over");
        let two = Sampler { global_batch: 8, ..s };
        assert_eq!(rank_step(&two, 0, 2, 1).unwrap().micro_batches, [vec![2, 3], vec![6, 7]]);
    }

    #[test]
    fn rank_r_takes_the_rth_run_of_each_chunk() {
        // G = 12, m = 2, W = 3 → A = 2 chunks of 6.
        let pairs: Vec<usize> = (100..112).collect();
        assert_eq!(shard_step(&pairs, 2, 3, 0), vec![vec![100, 101], vec![106, 107]]);
        assert_eq!(shard_step(&pairs, 2, 3, 1), vec![vec![102, 103], vec![108, 109]]);
        assert_eq!(shard_step(&pairs, 2, 3, 2), vec![vec![104, 105], vec![110, 111]]);
    }

    #[test]
    fn ranks_partition_the_single_device_micro_batches() {
        let single = Sampler { len: 53, global_batch: 12, micro_batch: 2, seed: 7, shuffle: true };
        for step in 0..single.steps_per_epoch() + 2 {
            let mut expected = single.micro_batches(step);
            let mut union: Vec<Vec<usize>> = Vec::new();
            for rank in 0..3 {
                let part = rank_step(&single, step, 3, rank).unwrap();
                assert_eq!(part.step_pairs, expected.concat().len());
                assert!(part.micro_batches.len() <= 2 && part.micro_batches.iter().all(|mb| !mb.is_empty()));
                union.extend(part.micro_batches);
            }
            union.sort();
            expected.sort();
            assert_eq!(union, expected, "step {step}");
        }
    }

    #[test]
    fn the_short_last_step_leaves_later_ranks_fewer_batches() {
        // 5 pairs, m = 2, W = 2: chunks [0 1 2 3] [4].
        let pairs = [0, 1, 2, 3, 4];
        assert_eq!(shard_step(&pairs, 2, 2, 0), vec![vec![0, 1], vec![4]]);
        assert_eq!(shard_step(&pairs, 2, 2, 1), vec![vec![2, 3]]);
        assert_eq!(shard_step(&[0], 2, 2, 1), Vec::<Vec<usize>>::new());
    }

    #[test]
    fn world_one_is_the_single_device_plan() {
        let s = Sampler { len: 10, global_batch: 4, micro_batch: 2, seed: 3, shuffle: true };
        for step in 0..4 {
            assert_eq!(rank_step(&s, step, 1, 0).unwrap().micro_batches, s.micro_batches(step));
        }
    }

    #[test]
    fn errors() {
        let s = Sampler { len: 10, global_batch: 6, micro_batch: 2, seed: 0, shuffle: true };
        assert_eq!(
            rank_step(&s, 0, 2, 0).unwrap_err().to_string(),
            "the global batch 6 is not a multiple of micro-batch 2 x world size 2"
        );
        assert_eq!(rank_step(&s, 0, 3, 3).unwrap_err().to_string(), "rank 3 is not below the world size 3");
        let s = Sampler { micro_batch: 0, ..s };
        assert_eq!(rank_step(&s, 0, 1, 0).unwrap_err(), ShardError::ZeroMicroBatch);
    }
}
