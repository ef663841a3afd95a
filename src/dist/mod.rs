//! Data-parallel training across processes: PyTorch's c10d process groups (Gloo on CPU, NCCL on
//! CUDA with the `nccl` feature) behind a safe Rust type, plus what a torchrun/SLURM-style job needs
//! around them.
//!
//! - [`process_group`]: [`ProcessGroup`] — rendezvous, bucketed gradient all-reduce, broadcast,
//!   barrier, all-gather — following `torch.distributed` and DDP's gradient buckets.
//! - [`env`]: which rank this process is, from torchrun's or SLURM's variables.
//! - [`launcher`]: `torchrun --nproc-per-node` for this binary: one worker process per rank.
//! - [`slurm`]: the sbatch script for a multi-node job.
//!
//! - [`fused`]: torch's fused AdamW kernel, which the same C++ shim exposes.
//! - [`cuda_memory`]: the CUDA caching allocator's peak, and [`profiler`]: torch's profiler around
//!   chosen steps, through the shim too.
//!
//! The C++ lives in `csrc/c10d.cpp`; only [`process_group`], [`fused`], [`cuda_memory`] and
//! [`profiler`] touch it.

pub mod bench;
pub mod cuda_memory;
pub mod env;
pub mod flight;
pub mod fused;
pub mod launcher;
pub mod process_group;
pub mod profiler;
pub mod shards;
pub mod slurm;
pub mod watch;

pub(crate) mod bridge;

pub use env::{EnvError, EnvSource, WorkerEnv};
pub use launcher::{LaunchError, LaunchOutcome, NodeSpec, launch, launch_node};
pub use process_group::{
    Backend, Compression, DEFAULT_BUCKET_BYTES, DistConfig, DistError, ProcessGroup, allreduce_bandwidth,
};
pub use slurm::{SlurmOptions, sbatch_script};
