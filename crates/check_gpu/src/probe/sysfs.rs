//! Linux sysfs facts NVML gets wrong or lacks: the NUMA node of a PCIe device
//! (`/sys/bus/pci/devices/<domain:bus:dev.fn>/numa_node`; NVML's `numa_node_id` is only meaningful
//! on systems where the GPU is itself a NUMA node) and its local CPU list.

use std::path::Path;

/// Converts an NVML bus id (`00000000:07:00.0`, 8-digit domain) to the sysfs name (`0000:07:00.0`).
pub fn sysfs_bus_id(nvml_bus_id: &str) -> Option<String> {
    let id = nvml_bus_id.trim().to_ascii_lowercase();
    let (domain, rest) = id.split_once(':')?;
    let domain = u32::from_str_radix(domain, 16).ok()?;
    if rest.len() != 7 || !rest.contains('.') {
        return None;
    }
    Some(format!("{domain:04x}:{rest}"))
}

/// The NUMA node of a PCIe device under `root` (normally `/sys/bus/pci/devices`); `None` when
/// unknown or `-1` (no NUMA information).
pub fn numa_node(root: &Path, nvml_bus_id: &str) -> Option<u32> {
    let dir = root.join(sysfs_bus_id(nvml_bus_id)?);
    let text = std::fs::read_to_string(dir.join("numa_node")).ok()?;
    text.trim().parse::<i64>().ok().and_then(|n| u32::try_from(n).ok())
}

/// The device's `local_cpulist` (e.g. `0-15,32-47`).
pub fn local_cpulist(root: &Path, nvml_bus_id: &str) -> Option<String> {
    let dir = root.join(sysfs_bus_id(nvml_bus_id)?);
    let text = std::fs::read_to_string(dir.join("local_cpulist")).ok()?;
    let text = text.trim();
    crate::cpulist::parse(text).map(|_| text.to_string())
}

/// The real sysfs PCI device directory.
pub const PCI_DEVICES: &str = "/sys/bus/pci/devices";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_id_conversion() {
        assert_eq!(sysfs_bus_id("00000000:07:00.0").as_deref(), Some("0000:07:00.0"));
        assert_eq!(sysfs_bus_id("00000001:B7:00.0").as_deref(), Some("0001:b7:00.0"));
        assert_eq!(sysfs_bus_id("garbage"), None);
    }

    #[test]
    fn reads_fake_sysfs() {
        let root = std::env::temp_dir().join(format!("check-gpu-sysfs-{}", std::process::id()));
        let dev = root.join("0000:07:00.0");
        std::fs::create_dir_all(&dev).expect("temp dir");
        std::fs::write(dev.join("numa_node"), "1\n").expect("write");
        std::fs::write(dev.join("local_cpulist"), "16-31,144-159\n").expect("write");
        assert_eq!(numa_node(&root, "00000000:07:00.0"), Some(1));
        assert_eq!(local_cpulist(&root, "00000000:07:00.0").as_deref(), Some("16-31,144-159"));
        std::fs::write(dev.join("numa_node"), "-1\n").expect("write");
        assert_eq!(numa_node(&root, "00000000:07:00.0"), None);
        assert_eq!(numa_node(&root, "00000000:99:00.0"), None);
        let _ = std::fs::remove_dir_all(&root);
    }
}
