//! `dpo-train bench-comm`: the measurement behind `check-gpu --bench`, run by this binary's own
//! launcher and process group so it measures the path training takes. Rank 0 prints the
//! [`check_gpu::bench::Bench`] as one JSON object.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;

use super::INTERRUPTED;
use super::args::BenchCommArgs;
use super::launch::{Placed, ProcessMemory, place};
use crate::dist::{self, LaunchOutcome};

/// Runs `bench-comm`.
pub fn run_bench_comm(args: BenchCommArgs) -> anyhow::Result<ExitCode> {
    if args.min_bytes > args.max_bytes {
        let message = format!("{} is above --max-bytes {}", args.min_bytes, args.max_bytes);
        return Err(crate::config::ConfigError::Flag { flag: "min-bytes".into(), message }.into());
    }
    let timeout = Duration::from_secs(args.timeout);
    let each = check_gpu::memory::CUDA_CONTEXT_BYTES.saturating_add(args.max_bytes.saturating_mul(2));
    let basis = "a libtorch process and two buffers of --max-bytes";
    super::launch::check_host_memory(&args.parallel, ProcessMemory { each, basis, lone: "lower `--max-bytes`" })?;
    let (device, group) = match place(&args.parallel, &|| Ok(Vec::new()), timeout, &mut |_| Ok(()))? {
        Placed::Launched(LaunchOutcome::Finished) => return Ok(ExitCode::SUCCESS),
        Placed::Launched(LaunchOutcome::Interrupted | LaunchOutcome::Aborted) => {
            return Ok(ExitCode::from(INTERRUPTED));
        }
        Placed::Here { device, group, .. } => (device, group),
    };
    let group = match group {
        Some(g) => g,
        // One device: a group of one, so its numbers come from the same code.
        None => dist::bench::single_rank_group(dist::bench::tch_device(&device)?, timeout)?,
    };
    // Our launcher gives every worker of a node the same CUDA_VISIBLE_DEVICES and local rank r
    // uses entry r of it; a process alone uses the device it was given.
    let visible: Vec<String> = std::env::var("CUDA_VISIBLE_DEVICES")
        .map(|v| v.split(',').filter(|s| !s.is_empty()).map(str::to_owned).collect())
        .unwrap_or_default();
    let (device, world) = (group.device(), group.world_size());
    let named = |index: usize| visible.get(index).map_or(format!("cuda:{index}"), |id| format!("cuda:{id}"));
    let label = |rank: usize| match device {
        tch::Device::Cuda(own) if world == 1 => named(own),
        tch::Device::Cuda(_) => named(if visible.is_empty() { rank } else { rank % visible.len() }),
        _ => "cpu".to_owned(),
    };
    let bench = dist::bench::measure(&group, &label, (args.min_bytes, args.max_bytes))?;
    group.barrier()?;
    if group.rank() == 0 {
        let json = serde_json::to_string(&bench).context("cannot write the measurement as JSON")?;
        writeln!(std::io::stdout().lock(), "{json}")?;
    }
    Ok(ExitCode::SUCCESS)
}
