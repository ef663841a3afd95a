//! `check_gpu`: inspect NVIDIA GPUs through NVML, NCCL and the PCIe/NVLink layout, and plan a
//! data-parallel `dpo-train` run (which GPUs, batch split, learning-rate factors, memory,
//! environment and the command line).
//!
//! Data flows one way: a [`Snapshot`] comes from [`probe_live`], from [`parse::offline_snapshot`]
//! (`nvidia-smi topo -m` + `--query-gpu` CSV) or from [`Snapshot::load`]; [`plan()`] turns it and
//! a [`PlanRequest`] into a [`Plan`]; [`render`] prints either. The trainer calls
//! [`plan()`] for `--gpus auto` and [`memory::estimate`] for memory checks; `dpo-train bench-comm`
//! prints the [`bench::Bench`] that `check-gpu --bench` reads.

pub mod bench;
pub mod cli;
pub mod cpulist;
pub mod memory;
pub mod model;
pub mod parse;
pub mod peak;
pub mod plan;
pub mod probe;
pub mod render;
pub mod snapshot;
pub mod topology;
pub mod units;

pub use memory::{
    BatchTokens, DataLengths, Engine, FineTune, MemoryEstimate, MemoryRequest, PairTokens, Precision, Reference,
    Sharding, estimate,
};
pub use model::ModelShape;
pub use plan::{LengthsError, Plan, PlanRequest, Status, plan};
pub use probe::{ProbeError, probe_live};
pub use snapshot::Snapshot;
