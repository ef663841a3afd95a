//! Training, one stage at a time (the supervised warm-up, then DPO):
//!
//! - [`stage`]: the loop, read top to bottom as nanoGPT's `train.py`; [`step`]: one optimizer
//!   step (micro-batches, backward, gradient sum, clipping, update); [`window`]: what a logging
//!   step reduces into one row; [`references`]: the frozen reference, evaluations and samples.
//! - [`context`]: the words they share (the run's data, where it executes, a stage, progress);
//!   [`marks`]: what a loop measures besides its metrics (peak memory, copies, profiler).
//! - [`policy`]: what trains (every weight, or LoRA adapters) and the reference; [`backprop`]: one
//!   micro-batch's backward with optional activation checkpointing; [`optim`]: AdamW, global-norm
//!   clipping, fp16 loss scaling; [`schedule`]: the learning rate; [`sampler`]: the batches of each
//!   step and each rank's share; [`workers`]: the collectives a loop needs.
//! - Files: [`checkpoint`] (atomic save, resume, `final/`), [`log`] (`metrics.csv`), [`samples`]
//!   (the sample files), [`ref_cache`] (precomputed reference log-probs).

pub mod backprop;
pub mod checkpoint;
pub mod context;
pub mod log;
pub mod marks;
pub mod optim;
pub mod partition;
pub mod policy;
pub mod ref_cache;
pub mod references;
pub mod resume;
pub mod sampler;
pub mod samples;
pub mod schedule;
pub mod stage;
pub mod step;
pub mod window;
pub mod workers;

pub use context::{DrawPlots, Objective, Progress, Run, RunData, Runtime, Stage, StageOutcome, WandbTarget};
pub use sampler::{RankStep, Sampler, ShardError, rank_step, shard_step};
pub use stage::run_stage;
pub use workers::Workers;
