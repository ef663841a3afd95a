//! Each rank's share of an optimizer step, so that W ranks together see exactly the batches of
//! one device with the same global batch ([`crate::train::sampler::Sampler`]).
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

use crate::train::sampler::Sampler;

/// A step's global batch that the ranks cannot share evenly.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ShardError {
    #[error("The global batch {global_batch} is not a multiple of micro-batch {micro_batch} x world size {world_size}")]
    Indivisible { global_batch: usize, micro_batch: usize, world_size: usize },
    #[error("Rank {rank} is not below the world size {world_size}")]
    RankOutOfRange { rank: usize, world_size: usize },
    #[error("The micro-batch size must be positive")]
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
    fn rank_r_takes_the_rth_run_of_each_chunk() {
        // G = 12, m = 2, W = 3 → A = 2 chunks of 6.
        let pairs: Vec<usize> = (100..112).collect();
        assert_eq!(shard_step(&pairs, 2, 3, 0), vec![vec![100, 101], vec![106, 107]]);
        assert_eq!(shard_step(&pairs, 2, 3, 1), vec![vec![102, 103], vec![108, 109]]);
        assert_eq!(shard_step(&pairs, 2, 3, 2), vec![vec![104, 105], vec![110, 111]]);
    }

    #[test]
    fn ranks_partition_the_single_device_micro_batches() {
        let single = Sampler { len: 53, global_batch: 12, micro_batch: 2, seed: 7 };
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
        let s = Sampler { len: 10, global_batch: 4, micro_batch: 2, seed: 3 };
        for step in 0..4 {
            assert_eq!(rank_step(&s, step, 1, 0).unwrap().micro_batches, s.micro_batches(step));
        }
    }

    #[test]
    fn errors() {
        let s = Sampler { len: 10, global_batch: 6, micro_batch: 2, seed: 0 };
        assert_eq!(
            rank_step(&s, 0, 2, 0).unwrap_err().to_string(),
            "The global batch 6 is not a multiple of micro-batch 2 x world size 2"
        );
        assert_eq!(rank_step(&s, 0, 3, 3).unwrap_err().to_string(), "Rank 3 is not below the world size 3");
        let s = Sampler { micro_batch: 0, ..s };
        assert_eq!(rank_step(&s, 0, 1, 0).unwrap_err(), ShardError::ZeroMicroBatch);
    }
}
