//! Training: the loop ([`trainer`]), what trains and the reference ([`policy`]), one
//! micro-batch's backward pass with optional activation checkpointing ([`backprop`]), AdamW with
//! global-norm clipping and fp16 loss scaling ([`optim`]), the learning-rate schedules
//! ([`schedule`]), the batch plan ([`sampler`]), checkpoints ([`checkpoint`]) and precomputed
//! reference log-probs ([`ref_cache`]).

pub mod backprop;
pub mod checkpoint;
pub mod log;
pub mod optim;
pub mod policy;
pub mod ref_cache;
pub mod sampler;
pub mod samples;
pub mod schedule;
pub mod trainer;
pub mod workers;

pub use sampler::{RankStep, Sampler, ShardError, rank_step, shard_step};
pub use workers::Workers;
