//! dpo-dist: data-parallel training across processes: PyTorch's c10d process groups (Gloo on CPU,
//! NCCL on CUDA) behind a safe Rust type, plus what a torchrun/SLURM-style job needs around them.
//!
//! - [`process_group`]: [`ProcessGroup`] — rendezvous, bucketed gradient all-reduce, broadcast,
//!   barrier, all-gather — following `torch.distributed` and DDP's gradient buckets.
//! - [`env`]: which rank this process is, from torchrun's or SLURM's variables.
//! - [`launcher`]: `torchrun --nproc-per-node` for this binary: one worker process per rank.
//! - [`slurm`]: the sbatch script for a multi-node job.
//!
//! - [`flight`] and [`watch`]: each rank's flight record of its collectives, and the launcher's
//!   report of a hang; [`shards`]: ZeRO's slices and their collectives; [`bench`]: the collective
//!   bench `check-gpu --bench` runs.
//!
//! The C++ is `dpo-torch`'s shim; only [`process_group`] calls its C ABI.

pub mod bench;
pub mod env;
pub mod flight;
pub mod launcher;
pub mod process_group;
pub mod shards;
pub mod slurm;
pub mod watch;

pub use env::{EnvError, EnvSource, WorkerEnv, switch};
pub use launcher::{LaunchError, LaunchOutcome, NodeSpec, launch, launch_node};
pub use process_group::{
    Backend, Compression, DEFAULT_BUCKET_BYTES, DistConfig, DistError, ProcessGroup, allreduce_bandwidth,
};
pub use slurm::{SlurmOptions, sbatch_script, time_limit_seconds};
pub use slurm::{parse_memory, parse_time, parse_word};
