//! Live probe through NVML (nvml-wrapper 0.13, which dlopens `libnvidia-ml.so.1` at run time, so
//! the binary starts on machines without the driver).
//!
//! Every per-field call is independent: `NotSupported` leaves the field unknown, any other
//! failure leaves it unknown and adds a line to `probe_notes`. Only failing to load or
//! initialise NVML, or to count the devices, stops the probe.
//! NVLink: a link whose remote PCI id is another GPU counts toward that pair; links into an
//! NVSwitch count toward every pair whose NVLink P2P status is OK (as `nvidia-smi topo -m` shows
//! `NV12`/`NV18` on DGX systems). NVML's `numa_node_id` is not used (see `sysfs`).

use std::path::Path;

use nvml_wrapper::enum_wrappers::device::{
    EccCounter, MemoryError, P2pCapabilitiesIndex, P2pStatus, TemperatureSensor, TopologyLevel,
};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};

use super::{ProbeError, sysfs};
use crate::snapshot::{Gpu, Link, P2p, Pair, Pcie, Process, Snapshot, Source};

/// Upper bound of NVLinks per GPU (`NVML_NVLINK_MAX_LINKS`).
const MAX_NVLINKS: u32 = 18;
/// CPUs covered by the affinity mask we ask for (`64 * 64` bits).
const AFFINITY_WORDS: usize = 64;

/// Keeps a value; turns an error into "unknown", noting errors other than `NotSupported`.
fn field<T>(r: Result<T, NvmlError>, what: &str, notes: &mut Vec<String>) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(NvmlError::NotSupported) => None,
        Err(e) => {
            notes.push(format!("{what}: {e}"));
            None
        }
    }
}

fn p2p(s: P2pStatus) -> P2p {
    match s {
        P2pStatus::Ok => P2p::Ok,
        P2pStatus::ChipsetNotSupported => P2p::ChipsetNotSupported,
        P2pStatus::GpuNotSupported => P2p::GpuNotSupported,
        P2pStatus::IohTopologyNotSupported => P2p::IohTopologyNotSupported,
        P2pStatus::DisabledByRegkey => P2p::DisabledByRegkey,
        P2pStatus::NotSupported => P2p::NotSupported,
        P2pStatus::Unknown => P2p::Unknown,
    }
}

fn level(l: TopologyLevel) -> Link {
    match l {
        TopologyLevel::Internal | TopologyLevel::Single => Link::Pix,
        TopologyLevel::Multiple => Link::Pxb,
        TopologyLevel::HostBridge => Link::Phb,
        TopologyLevel::Node => Link::Node,
        TopologyLevel::System => Link::Sys,
    }
}

/// Initialises NVML, the error that decides between "probe" and "no driver".
pub fn init() -> Result<Nvml, ProbeError> {
    Nvml::init().map_err(|source| ProbeError::NvmlLoad { source })
}

/// Probes system, GPUs and pairs. `sysfs_root` is normally [`sysfs::PCI_DEVICES`].
pub fn probe(nvml: &Nvml, sysfs_root: &Path) -> Result<Snapshot, ProbeError> {
    let mut snap = Snapshot::new(Source::Live);
    let notes = &mut snap.probe_notes;
    snap.system.driver_version = field(nvml.sys_driver_version(), "driver version", notes);
    snap.system.nvml_version = field(nvml.sys_nvml_version(), "NVML version", notes);
    snap.system.cuda_driver_version = field(nvml.sys_cuda_driver_version(), "CUDA driver version", notes).map(|v| {
        format!("{}.{}", nvml_wrapper::cuda_driver_version_major(v), nvml_wrapper::cuda_driver_version_minor(v))
    });
    let count = nvml.device_count().map_err(|source| ProbeError::DeviceCount { source })?;

    let mut links = Vec::new();
    for i in 0..count {
        let dev = match nvml.device_by_index(i) {
            Ok(d) => d,
            Err(e) => {
                snap.probe_notes.push(format!("GPU {i}: cannot open: {e}"));
                continue;
            }
        };
        snap.gpus.push(gpu(&dev, i, sysfs_root, &mut snap.probe_notes));
        links.push(NvLinks::of(&dev));
    }
    pairs(nvml, &mut snap, links);
    Ok(snap)
}

/// One GPU's fields.
fn gpu(dev: &Device, i: u32, sysfs_root: &Path, notes: &mut Vec<String>) -> Gpu {
    let what = |f: &str| format!("GPU {i} {f}");
    let mut g = Gpu { index: i, ..Gpu::default() };
    g.name = field(dev.name(), &what("name"), notes);
    g.uuid = field(dev.uuid(), &what("uuid"), notes);
    g.pci_bus_id = field(dev.pci_info(), &what("PCI info"), notes).map(|p| p.bus_id);
    if let Some(m) = field(dev.memory_info(), &what("memory"), notes) {
        g.memory_total_bytes = Some(m.total);
        g.memory_used_bytes = Some(m.used);
        g.memory_free_bytes = Some(m.free);
    }
    g.compute_capability = field(dev.cuda_compute_capability(), &what("compute capability"), notes)
        .map(|c| format!("{}.{}", c.major, c.minor));
    g.architecture = field(dev.architecture(), &what("architecture"), notes).map(|a| a.to_string());
    g.pcie = Pcie {
        gen_current: field(dev.current_pcie_link_gen(), &what("PCIe gen"), notes),
        gen_max: field(dev.max_pcie_link_gen(), &what("PCIe max gen"), notes),
        width_current: field(dev.current_pcie_link_width(), &what("PCIe width"), notes),
        width_max: field(dev.max_pcie_link_width(), &what("PCIe max width"), notes),
    };
    g.temperature_c = field(dev.temperature(TemperatureSensor::Gpu), &what("temperature"), notes);
    g.power_draw_w = field(dev.power_usage(), &what("power draw"), notes).map(|mw| f64::from(mw) / 1000.0);
    g.power_limit_w = field(dev.enforced_power_limit(), &what("power limit"), notes).map(|mw| f64::from(mw) / 1000.0);
    if let Some(u) = field(dev.utilization_rates(), &what("utilization"), notes) {
        g.utilization_gpu_pct = Some(u.gpu);
        g.utilization_memory_pct = Some(u.memory);
    }
    g.throttle_reasons = field(dev.current_throttle_reasons(), &what("throttle reasons"), notes)
        .map(|r| crate::parse::query::throttle_names(r.bits()));
    health(dev, &what, &mut g, notes);
    g.processes = field(dev.running_compute_processes(), &what("processes"), notes).map(|ps| {
        ps.into_iter()
            .map(|p| Process {
                pid: p.pid,
                used_memory_bytes: match p.used_gpu_memory {
                    UsedGpuMemory::Used(b) => Some(b),
                    UsedGpuMemory::Unavailable => None,
                },
            })
            .collect()
    });
    if let Some(bus) = &g.pci_bus_id {
        g.numa_node = sysfs::numa_node(sysfs_root, bus);
        g.cpu_affinity = sysfs::local_cpulist(sysfs_root, bus);
    }
    if let Some(mask) = field(dev.cpu_affinity(AFFINITY_WORDS), &what("CPU affinity"), notes) {
        // `c_ulong` is 32 bits on some targets, so the conversion is not useless everywhere.
        #[allow(clippy::useless_conversion)]
        let words: Vec<u64> = mask.iter().map(|&w| u64::from(w)).collect();
        let cpus = crate::cpulist::from_bitmask(&words, std::ffi::c_ulong::BITS);
        if !cpus.is_empty() {
            g.cpu_affinity = Some(crate::cpulist::format(&cpus));
        }
    }
    g
}

/// ECC, page retirement, MIG and persistence: what makes a GPU unfit to train on.
fn health(dev: &Device, what: &dyn Fn(&str) -> String, g: &mut Gpu, notes: &mut Vec<String>) {
    g.ecc_enabled = field(dev.is_ecc_enabled(), &what("ECC mode"), notes).map(|e| e.currently_enabled);
    if g.ecc_enabled == Some(true) {
        g.ecc_uncorrected_volatile =
            field(dev.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile), &what("ECC volatile"), notes);
        g.ecc_uncorrected_aggregate =
            field(dev.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Aggregate), &what("ECC aggregate"), notes);
    }
    g.pending_page_retirement = field(dev.are_pages_pending_retired(), &what("page retirement"), notes);
    g.mig_enabled = field(dev.mig_mode(), &what("MIG mode"), notes).map(|m| m.current == 1);
    g.persistence_mode = field(dev.is_in_persistent_mode(), &what("persistence mode"), notes);
}

/// A GPU's active NVLinks: remote PCI bus ids, and links whose remote is not a PCI device.
struct NvLinks {
    remotes: Vec<String>,
    to_switch: usize,
}

impl NvLinks {
    fn of(dev: &Device) -> Self {
        let mut out = Self { remotes: Vec::new(), to_switch: 0 };
        for l in 0..MAX_NVLINKS {
            let link = dev.link_wrapper_for(l);
            // Links past the GPU's count fail with InvalidArg; that is the end of its links.
            if !matches!(link.is_active(), Ok(true)) {
                continue;
            }
            match link.remote_pci_info() {
                Ok(p) => out.remotes.push(p.bus_id),
                Err(_) => out.to_switch += 1,
            }
        }
        out
    }
}

/// Every pair of GPUs: NVLinks (direct, or through a switch), P2P status, PCIe topology.
fn pairs(nvml: &Nvml, snap: &mut Snapshot, mut links: Vec<NvLinks>) {
    let bus_ids: Vec<Option<String>> = snap.gpus.iter().map(|g| g.pci_bus_id.clone()).collect();
    // A remote that is none of our GPUs is a switch.
    for l in &mut links {
        let before = l.remotes.len();
        l.remotes.retain(|r| bus_ids.iter().flatten().any(|b| b == r));
        l.to_switch += before - l.remotes.len();
    }
    let indices: Vec<u32> = snap.gpus.iter().map(|g| g.index).collect();
    for a in 0..indices.len() {
        for b in a + 1..indices.len() {
            let (ia, ib) = (indices[a], indices[b]);
            let (Ok(da), Ok(db)) = (nvml.device_by_index(ia), nvml.device_by_index(ib)) else {
                continue;
            };
            let notes = &mut snap.probe_notes;
            let what = |f: &str| format!("GPU {ia}-{ib} {f}");
            let p2p_read = field(da.p2p_status(&db, P2pCapabilitiesIndex::Read), &what("P2P read"), notes).map(p2p);
            let p2p_write = field(da.p2p_status(&db, P2pCapabilitiesIndex::Write), &what("P2P write"), notes).map(p2p);
            let p2p_nvlink =
                field(da.p2p_status(&db, P2pCapabilitiesIndex::NvLink), &what("P2P NVLink"), notes).map(p2p);
            let direct_links =
                bus_ids[b].as_ref().map_or(0, |bid| links[a].remotes.iter().filter(|r| *r == bid).count()) as u32;
            let via_switch =
                if p2p_nvlink == Some(P2p::Ok) { links[a].to_switch.min(links[b].to_switch) as u32 } else { 0 };
            let nvlinks = direct_links.max(via_switch);
            let topo = nvml
                .device_by_index(ib)
                .ok()
                .and_then(|db2| field(da.topology_common_ancestor(db2), &what("topology"), notes));
            let link = if nvlinks > 0 { Link::NvLink(nvlinks) } else { topo.map_or(Link::Unknown, level) };
            snap.pairs.push(Pair { a: ia, b: ib, link, nvlinks: Some(nvlinks), p2p_read, p2p_write, p2p_nvlink });
        }
    }
}
