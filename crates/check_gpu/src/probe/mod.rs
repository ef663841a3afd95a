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

/// The host memory available to a new process of this job: `MemAvailable` of `/proc/meminfo`, or
/// less where the job's cgroup (v2: a container, a SLURM or systemd job) caps it. `None` where
/// there is no `/proc/meminfo` (not Linux) or it lacks the line.
pub fn host_memory_available() -> Option<u64> {
    let host = mem_available(&std::fs::read_to_string("/proc/meminfo").ok()?)?;
    let capped = std::fs::read_to_string("/proc/self/cgroup").ok().and_then(|own| {
        cgroup_headroom(&own, |file| std::fs::read_to_string(Path::new("/sys/fs/cgroup").join(file)).ok())
    });
    Some(capped.map_or(host, |room| room.min(host)))
}

/// The least headroom under a `memory.max` from this process's cgroup (the `0::` line of
/// `/proc/self/cgroup`) up to the root: the limit less the working set (`memory.current` without
/// `inactive_file` of `memory.stat`, page cache the kernel reclaims before it kills). `read` gets
/// a path relative to the cgroup mount. `None` where no level sets a limit (`max`) or v2 is absent.
pub fn cgroup_headroom(own: &str, read: impl Fn(&str) -> Option<String>) -> Option<u64> {
    let mut dir = own.lines().find_map(|l| l.strip_prefix("0::"))?.trim().trim_matches('/').to_owned();
    let mut least: Option<u64> = None;
    loop {
        let file = |name: &str| if dir.is_empty() { name.to_owned() } else { format!("{dir}/{name}") };
        let number = |name: &str| read(&file(name)).and_then(|t| t.trim().parse::<u64>().ok());
        if let (Some(max), Some(current)) = (number("memory.max"), number("memory.current")) {
            let stat = read(&file("memory.stat")).unwrap_or_default();
            let inactive = stat.lines().find_map(|l| l.strip_prefix("inactive_file ")?.trim().parse::<u64>().ok());
            let room = max.saturating_sub(current.saturating_sub(inactive.unwrap_or(0)));
            least = Some(least.map_or(room, |l| l.min(room)));
        }
        match dir.rsplit_once('/') {
            Some((parent, _)) => dir = parent.to_owned(),
            None if dir.is_empty() => return least,
            None => dir.clear(),
        }
    }
}

/// `MemAvailable:   16280176 kB` of `/proc/meminfo` text, in bytes.
pub fn mem_available(meminfo: &str) -> Option<u64> {
    let value = meminfo.lines().find_map(|l| l.strip_prefix("MemAvailable:"))?;
    let kib: u64 = value.trim().strip_suffix("kB")?.trim().parse().ok()?;
    kib.checked_mul(1024)
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
    fn cgroup_limit() {
        let files: BTreeMap<&str, &str> = [
            ("memory.max", "max\n"),
            ("memory.current", "900\n"),
            ("job/memory.max", "1000\n"),
            ("job/memory.current", "700\n"),
            ("job/memory.stat", "anon 500\ninactive_file 200\nactive_file 0\n"),
            ("job/step/memory.max", "max\n"),
            ("job/step/memory.current", "650\n"),
        ]
        .into();
        let read = |f: &str| files.get(f).map(|t| t.to_string());
        // The job's limit (1000) less its working set (700 - 200 reclaimable cache).
        assert_eq!(cgroup_headroom("0::/job/step\n", read), Some(500));
        // No level with a limit, or cgroup v1 only: no cap.
        assert_eq!(cgroup_headroom("0::/\n", read), None);
        assert_eq!(cgroup_headroom("12:memory:/job\n", read), None);
        // A limit below the usage leaves nothing rather than wrapping.
        let tight = |f: &str| match f {
            "memory.max" => Some("100".into()),
            "memory.current" => Some("300".into()),
            _ => None,
        };
        assert_eq!(cgroup_headroom("0::/\n", tight), Some(0));
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
