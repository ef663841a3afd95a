//! The host memory a job's CPU processes can use (`/proc/meminfo`, capped by the job's cgroup),
//! and whether N processes of a given size fit in it: both binaries refuse `--devices cpu:N` that
//! would be killed one by one long after the start.

use std::path::Path;

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
    meminfo_bytes(meminfo, "MemAvailable")
}

/// Free swap (`SwapFree` of `/proc/meminfo`): what a single process may spill into once the
/// available memory is spent. `None` where unread.
pub fn host_swap_free() -> Option<u64> {
    meminfo_bytes(&std::fs::read_to_string("/proc/meminfo").ok()?, "SwapFree")
}

/// The `key:   N kB` line of `/proc/meminfo` text, in bytes.
fn meminfo_bytes(meminfo: &str, key: &str) -> Option<u64> {
    let value = meminfo.lines().find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))?;
    let kib: u64 = value.trim().strip_suffix("kB")?.trim().parse().ok()?;
    kib.checked_mul(1024)
}

/// `n` processes of about `each` bytes that do not fit in the `available` bytes this job has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostShortfall {
    pub n: u64,
    pub each: u64,
    pub available: u64,
}

impl HostShortfall {
    /// `None` when the processes fit, or where the memory is unknown (not checked).
    pub fn of(n: u64, each: u64, available: Option<u64>) -> Option<Self> {
        let available = available?;
        (n.saturating_mul(each) > available).then_some(Self { n, each, available })
    }

    /// How many such processes fit: 0 when not even one does.
    pub fn most(&self) -> u64 {
        self.available / self.each.max(1)
    }

    /// `N <what> of about X each (<basis>) need Y, and the host has Z available`.
    pub fn describe(&self, what: &str, basis: &str) -> String {
        let bytes = crate::units::bytes;
        let (n, need) = (self.n, bytes(self.n.saturating_mul(self.each)));
        format!(
            "{n} {what} of about {} each ({basis}) need {need}, and the host has {} available",
            bytes(self.each),
            bytes(self.available)
        )
    }

    /// The way out: `use at most `--devices cpu:M``, or `lone` where not even one process fits
    /// (then fewer processes would not help).
    pub fn advice(&self, lone: &str) -> String {
        match self.most() {
            0 => format!("not even one fits: {lone}"),
            most => format!("use at most `--devices cpu:{most}`"),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn meminfo() {
        let text = "MemTotal:       32567284 kB\nMemFree:         1034560 kB\nMemAvailable:   16280176 kB\n";
        assert_eq!(mem_available(text), Some(16_280_176 * 1024));
        assert_eq!(mem_available("MemTotal: 1 kB\n"), None);
        assert_eq!(mem_available("MemAvailable: lots\n"), None);
        assert_eq!(meminfo_bytes("SwapTotal: 8 kB\nSwapFree:  2 kB\n", "SwapFree"), Some(2048));
        assert_eq!(meminfo_bytes("SwapFreeish: 2 kB\n", "SwapFree"), None);
        // This machine's, where there is one.
        if std::path::Path::new("/proc/meminfo").exists() {
            assert!(host_memory_available().is_some_and(|b| b > 0));
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
    fn processes_that_do_not_fit() {
        const GIB: u64 = 1 << 30;
        assert_eq!(HostShortfall::of(4, 5 * GIB, Some(20 * GIB)), None);
        assert_eq!(HostShortfall::of(4, 5 * GIB, None), None);
        let four = HostShortfall::of(4, 5 * GIB, Some(12 * GIB)).unwrap();
        assert_eq!(four.most(), 2);
        assert_eq!(four.advice("lower it"), "use at most `--devices cpu:2`");
        assert_eq!(
            four.describe("processes", "an estimate"),
            "4 processes of about 5.0 GiB each (an estimate) need 20.0 GiB, and the host has 12.0 GiB available"
        );
        // Not even one: fewer processes is no advice.
        let huge = HostShortfall::of(2, u64::MAX, Some(12 * GIB)).unwrap();
        assert_eq!(huge.most(), 0);
        assert_eq!(huge.advice("lower it"), "not even one fits: lower it");
    }
}
