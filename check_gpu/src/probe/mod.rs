//! The live probe: NVML for GPUs and pairs, sysfs for NUMA nodes, NCCL by dlopen, and the
//! `NCCL_*`, `CUDA_*` and `OMP_NUM_THREADS` environment.

pub mod nccl;
pub mod nvml;
pub mod sysfs;

use std::collections::BTreeMap;
use std::path::Path;

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

/// The host memory available to a new process, `MemAvailable` of `/proc/meminfo`; `None` where
/// there is no such file (not Linux) or it lacks the line.
pub fn host_memory_available() -> Option<u64> {
    mem_available(&std::fs::read_to_string("/proc/meminfo").ok()?)
}

/// `MemAvailable:   16280176 kB` of `/proc/meminfo` text, in bytes.
pub fn mem_available(meminfo: &str) -> Option<u64> {
    let value = meminfo.lines().find_map(|l| l.strip_prefix("MemAvailable:"))?;
    let kib: u64 = value.trim().strip_suffix("kB")?.trim().parse().ok()?;
    kib.checked_mul(1024)
}

/// Probes this machine. Fails only when NVML cannot be loaded or cannot count devices.
pub fn probe_live() -> Result<Snapshot, ProbeError> {
    let nvml = nvml::init()?;
    let mut snap = nvml::probe(&nvml, Path::new(sysfs::PCI_DEVICES))?;
    snap.system.cpu_count = Some(cpu_count());
    snap.system.memory_available_bytes = host_memory_available();
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
    fn meminfo() {
        let text = "MemTotal:       32567284 kB\nMemFree:         1034560 kB\nMemAvailable:   16280176 kB\n";
        assert_eq!(mem_available(text), Some(16_280_176 * 1024));
        assert_eq!(mem_available("MemTotal: 1 kB\n"), None);
        assert_eq!(mem_available("MemAvailable: lots\n"), None);
        // This machine's, where there is one.
        if std::path::Path::new("/proc/meminfo").exists() {
            assert!(host_memory_available().is_some_and(|b| b > 0));
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
