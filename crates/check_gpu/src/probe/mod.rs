//! The live probe: NVML for GPUs and pairs, sysfs for NUMA nodes, NCCL by dlopen, and the
//! `NCCL_*`, `CUDA_*` and `OMP_NUM_THREADS` environment.

pub mod host;
pub mod nccl;
pub mod nvml;
pub mod sysfs;

use std::collections::BTreeMap;
use std::path::Path;

pub use host::{HostShortfall, cgroup_headroom, host_memory_available, mem_available};

use crate::snapshot::Snapshot;

/// Why the live probe could not run at all (per-field failures are never errors).
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// `libnvidia-ml.so.1` is missing or NVML refused to initialise (no driver, driver/library mismatch).
    #[error("NVML could not be loaded (is the NVIDIA driver installed?)")]
    NvmlLoad {
        #[source]
        source: nvml_wrapper::error::NvmlError,
    },
    /// NVML loaded but could not count the GPUs.
    #[error("NVML could not count the GPUs")]
    DeviceCount {
        #[source]
        source: nvml_wrapper::error::NvmlError,
    },
}

/// Variables that change how CUDA, NCCL and OpenMP behave.
pub fn relevant_env(vars: impl IntoIterator<Item = (String, String)>) -> BTreeMap<String, String> {
    vars.into_iter()
        .filter(|(k, _)| k.starts_with("NCCL_") || k.starts_with("CUDA_") || k == "OMP_NUM_THREADS")
        .collect()
}

/// Logical CPUs available to this process.
pub fn cpu_count() -> u32 {
    std::thread::available_parallelism().map_or(1, |n| u32::try_from(n.get()).unwrap_or(u32::MAX))
}

/// NUMA nodes with CPUs this process may run on (sysfs `node*/cpulist` against the affinity of
/// `/proc/self/status`); `None` where either is missing (not Linux, no NUMA in the kernel).
pub fn cpu_numa_nodes() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let allowed = crate::cpulist::parse(status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:"))?)?;
    let nodes = std::fs::read_dir("/sys/devices/system/node").ok()?;
    let lists: Vec<String> = nodes
        .flatten()
        .filter(|e| {
            e.file_name().to_str().is_some_and(|n| n.strip_prefix("node").is_some_and(|i| i.parse::<u32>().is_ok()))
        })
        .filter_map(|e| std::fs::read_to_string(e.path().join("cpulist")).ok())
        .collect();
    numa_nodes_used(&lists, &allowed)
}

/// How many of the nodes' CPU lists hold a CPU of `allowed`; `None` when none does (lists unread).
pub fn numa_nodes_used(node_cpulists: &[String], allowed: &[u32]) -> Option<u32> {
    let used = node_cpulists
        .iter()
        .filter(|list| crate::cpulist::parse(list).is_some_and(|cpus| cpus.iter().any(|c| allowed.contains(c))))
        .count();
    u32::try_from(used).ok().filter(|&n| n > 0)
}

/// The host's own facts a plan on CPUs needs, with or without NVML: cores, NUMA nodes, memory.
pub fn host_facts(system: &mut crate::snapshot::System) {
    system.cpu_count = Some(cpu_count());
    system.cpu_numa_nodes = cpu_numa_nodes();
    system.memory_available_bytes = host_memory_available();
}

/// Probes this machine. Fails only when NVML cannot be loaded or cannot count devices.
pub fn probe_live() -> Result<Snapshot, ProbeError> {
    let nvml = nvml::init()?;
    let mut snap = nvml::probe(&nvml, Path::new(sysfs::PCI_DEVICES))?;
    host_facts(&mut snap.system);
    snap.system.env =
        relevant_env(std::env::vars_os().filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?))));
    snap.system.nccl = Some(nccl::probe());
    Ok(snap)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_filter() {
        let vars = [
            ("NCCL_DEBUG", "INFO"),
            ("CUDA_VISIBLE_DEVICES", "0"),
            ("OMP_NUM_THREADS", "4"),
            ("PATH", "/bin"),
            ("MY_NCCL", "x"),
        ];
        let env = relevant_env(vars.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        assert_eq!(env.keys().collect::<Vec<_>>(), ["CUDA_VISIBLE_DEVICES", "NCCL_DEBUG", "OMP_NUM_THREADS"]);
    }

    #[test]
    fn numa_nodes_of_the_allowed_cpus() {
        let nodes = ["0-15,32-47\n".to_owned(), "16-31,48-63\n".to_owned(), "\n".to_owned()];
        assert_eq!(numa_nodes_used(&nodes, &(0..64).collect::<Vec<_>>()), Some(2));
        // A job pinned to one socket (taskset, a SLURM allocation), and a memory-only node's empty list.
        assert_eq!(numa_nodes_used(&nodes, &[16, 17, 48]), Some(1));
        assert_eq!(numa_nodes_used(&nodes, &[99]), None);
        if std::path::Path::new("/sys/devices/system/node/node0/cpulist").exists() {
            assert!(cpu_numa_nodes().is_some_and(|n| n >= 1));
        }
    }

    #[test]
    fn no_driver_is_an_error_not_a_panic() {
        // This machine (and CI) has no NVIDIA driver; where one exists the probe must succeed.
        match probe_live() {
            Ok(s) => assert_eq!(s.source, crate::snapshot::Source::Live),
            Err(e) => assert_eq!(e.to_string(), "NVML could not be loaded (is the NVIDIA driver installed?)"),
        }
    }
}
