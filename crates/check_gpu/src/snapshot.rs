//! The one model of a machine: serde types filled by the live NVML probe, by the `nvidia-smi`
//! parsers and by `--snapshot` files, then read by the planner and the renderer.
//!
//! Every field a probe may fail to read is an `Option`: `None` means "unknown" (the NVML call
//! returned `NotSupported` or failed, or the offline input did not carry it). Link names follow
//! the `nvidia-smi topo -m` legend (X, NV#, PIX, PXB, PHB, NODE, SYS).

use std::collections::BTreeMap;
use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::bench::BenchRecord;

/// Version of the snapshot JSON layout; bumped on incompatible changes.
pub const SNAPSHOT_SCHEMA_VERSION: u32 = 1;

/// Errors reading or writing snapshot files.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// The file could not be read.
    #[error("cannot read snapshot `{path}`")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The JSON is malformed or does not match the snapshot layout.
    #[error("{path}:{line}:{column}: expected a check-gpu snapshot JSON object: {message}")]
    Json { path: PathBuf, line: usize, column: usize, message: String },
    /// The file was written by an incompatible version.
    #[error("{path}:1: expected `schema_version` {expected}, found {found}")]
    Version { path: PathBuf, expected: u32, found: u32 },
    /// Writing the temporary file or renaming it failed.
    #[error("cannot write snapshot `{path}`")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Where a snapshot came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// NVML on this machine.
    Live,
    /// `nvidia-smi topo -m` and/or `nvidia-smi --query-gpu` text files.
    NvidiaSmi,
}

/// A whole machine: system versions, GPUs and GPU pairs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    /// Layout version, [`SNAPSHOT_SCHEMA_VERSION`].
    pub schema_version: u32,
    /// How the snapshot was produced.
    pub source: Source,
    /// Driver, CUDA, NVML and NCCL versions, CPU count and the environment.
    pub system: System,
    /// One entry per GPU, ordered by index.
    pub gpus: Vec<Gpu>,
    /// One entry per unordered GPU pair (`a < b`).
    #[serde(default)]
    pub pairs: Vec<Pair>,
    /// Probe calls that failed for another reason than `NotSupported`.
    #[serde(default)]
    pub probe_notes: Vec<String>,
    /// What `check-gpu --bench` measured when the snapshot was taken (absent in older files).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bench: Option<BenchRecord>,
}

/// Machine-wide facts.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct System {
    /// e.g. `550.54.15`.
    pub driver_version: Option<String>,
    /// CUDA version supported by the driver, e.g. `12.4`.
    pub cuda_driver_version: Option<String>,
    /// e.g. `12.550.54.15`.
    pub nvml_version: Option<String>,
    /// Logical CPUs usable by the job (for `OMP_NUM_THREADS`).
    pub cpu_count: Option<u32>,
    /// NUMA nodes holding CPUs the job may use (a training run on CPUs starts a process on each);
    /// `None` when not probed (offline input, older snapshots).
    #[serde(default)]
    pub cpu_numa_nodes: Option<u32>,
    /// Host memory available to a new process (`MemAvailable` of `/proc/meminfo`, or the job's
    /// cgroup limit less its working set where that is lower), what a run on
    /// CPU processes is checked against; `None` when not probed (offline input, older snapshots).
    #[serde(default)]
    pub memory_available_bytes: Option<u64>,
    /// NCCL found by the probe; `None` when not probed (offline input).
    pub nccl: Option<Nccl>,
    /// `NCCL_*`, `CUDA_*` and `OMP_NUM_THREADS` variables in effect when probed.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
}

/// The NCCL library the trainer would load.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Nccl {
    /// Path of the loaded `libnccl.so.2`, or the bare name when the system loader found it.
    pub path: Option<String>,
    /// Decoded version, e.g. `2.21.5`.
    pub version: Option<String>,
    /// Raw `ncclGetVersion` code, e.g. `22105`.
    pub version_code: Option<i32>,
    /// Why NCCL was not found or could not be queried.
    pub error: Option<String>,
    /// Every location tried, in order.
    #[serde(default)]
    pub searched: Vec<String>,
}

/// PCIe link state. A width below the maximum is a degraded link; a generation below the
/// maximum is usually the idle power saving of the link and is only shown.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pcie {
    pub gen_current: Option<u32>,
    pub gen_max: Option<u32>,
    pub width_current: Option<u32>,
    pub width_max: Option<u32>,
}

impl Pcie {
    /// True when the link trained at a narrower width than the card supports.
    pub fn is_degraded(&self) -> bool {
        matches!((self.width_current, self.width_max), (Some(c), Some(m)) if c < m)
    }
}

/// A process holding GPU memory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Process {
    pub pid: u32,
    /// Bytes; `None` when the driver does not report it.
    pub used_memory_bytes: Option<u64>,
}

/// One GPU. Memory is in bytes, power in watts, temperature in °C.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Gpu {
    pub index: u32,
    pub name: Option<String>,
    pub uuid: Option<String>,
    /// As NVML prints it: `00000000:07:00.0`.
    pub pci_bus_id: Option<String>,
    pub memory_total_bytes: Option<u64>,
    pub memory_used_bytes: Option<u64>,
    pub memory_free_bytes: Option<u64>,
    /// e.g. `8.0`.
    pub compute_capability: Option<String>,
    pub architecture: Option<String>,
    #[serde(default)]
    pub pcie: Pcie,
    pub temperature_c: Option<u32>,
    pub power_draw_w: Option<f64>,
    pub power_limit_w: Option<f64>,
    pub utilization_gpu_pct: Option<u32>,
    pub utilization_memory_pct: Option<u32>,
    /// Active clock throttle reasons, NVML names (`hw_slowdown`, `sw_power_cap`, ...).
    pub throttle_reasons: Option<Vec<String>>,
    pub ecc_enabled: Option<bool>,
    /// Uncorrectable ECC errors since the driver loaded.
    pub ecc_uncorrected_volatile: Option<u64>,
    /// Uncorrectable ECC errors over the board's life.
    pub ecc_uncorrected_aggregate: Option<u64>,
    pub pending_page_retirement: Option<bool>,
    pub mig_enabled: Option<bool>,
    pub persistence_mode: Option<bool>,
    /// Running compute processes; `None` when unknown.
    pub processes: Option<Vec<Process>>,
    /// NUMA node of the PCIe device (sysfs or the topo `NUMA Affinity` column).
    pub numa_node: Option<u32>,
    /// CPU list closest to the GPU, e.g. `0-15,32-47`.
    pub cpu_affinity: Option<String>,
}

/// Whether a GPU of this `nvidia-smi` name has bf16, for the generations its name gives away
/// (a `--query` file without `compute_cap`, which drivers before R510 do not know, or `--topo`
/// alone): Ampere and newer have it, Volta, Turing and older do not.
fn bf16_by_name(name: &str) -> Option<bool> {
    let words: Vec<String> = name.split([' ', '-', '_']).map(str::to_ascii_uppercase).collect();
    let has = |w: &str| words.iter().any(|x| x == w);
    let starts = |p: &str| words.iter().any(|x| x.starts_with(p));
    // Turing's Quadro RTX 6000 and Ada's "RTX 6000 Ada Generation" share words: the generation first.
    if has("ADA") || has("BLACKWELL") {
        return Some(true);
    }
    let older = ["V100", "T4", "P100", "P40", "P4", "P6", "K80", "K40", "M60", "M40", "M10", "T1000", "T400", "T600"];
    // The Quadro brand ended with Turing; Ampere's workstation cards are "RTX A6000".
    if older.iter().any(|w| has(w)) || has("GTX") || has("TITAN") || has("QUADRO") {
        return Some(false);
    }
    let rtx = words.iter().position(|w| w == "RTX").and_then(|i| words.get(i + 1));
    if let Some(model) = rtx {
        // GeForce RTX 2080 (Turing) against 3090, 4090, 5090 (Ampere on); RTX A6000 (Ampere).
        let series = model.trim_start_matches(|c: char| !c.is_ascii_digit()).chars().next();
        return match (model.starts_with('A'), series) {
            (true, _) => Some(true),
            (false, Some('2')) => Some(false),
            (false, Some('3'..='9')) => Some(true),
            _ => None,
        };
    }
    let newer = [
        "A100", "A800", "A40", "A30", "A10", "A10G", "A16", "A2", "H100", "H800", "H200", "H20", "GH200", "L4", "L40",
        "L40S", "L20", "B100", "B200", "GB200", "B300", "GB300",
    ];
    if newer.iter().any(|w| has(w)) || starts("H100") || starts("A100") || starts("H200") {
        return Some(true);
    }
    None
}

/// Throttle reasons that mean the hardware itself is slowing the GPU down.
pub const HARDWARE_THROTTLES: [&str; 3] = ["hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown"];

/// Where [`Gpu::available_memory`] took its figure from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryBasis {
    /// The reported free memory.
    Free,
    /// Free memory unknown: the total less the memory in use.
    TotalLessUsed,
    /// Free and used memory unknown: the whole of it.
    Total,
}

impl Gpu {
    /// The memory a run can take and where the figure comes from: the free memory (never more
    /// than the total), else total − used, else the total; `None` when neither free nor total
    /// memory is known.
    pub fn available_memory(&self) -> Option<(u64, MemoryBasis)> {
        match (self.memory_free_bytes, self.memory_total_bytes, self.memory_used_bytes) {
            (Some(free), total, _) => Some((total.map_or(free, |t| free.min(t)), MemoryBasis::Free)),
            (None, Some(total), Some(used)) => Some((total.saturating_sub(used), MemoryBasis::TotalLessUsed)),
            (None, Some(total), None) => Some((total, MemoryBasis::Total)),
            (None, None, _) => None,
        }
    }

    /// Name for messages: `GPU 3 (NVIDIA A100-SXM4-80GB)`.
    pub fn label(&self) -> String {
        match &self.name {
            Some(n) => format!("GPU {} ({n})", self.index),
            None => format!("GPU {}", self.index),
        }
    }

    /// Compute capability as `(major, minor)`.
    pub fn compute_capability_pair(&self) -> Option<(u32, u32)> {
        let cc = self.compute_capability.as_deref()?;
        let (maj, min) = cc.split_once('.')?;
        Some((maj.trim().parse().ok()?, min.trim().parse().ok()?))
    }

    /// Whether the GPU computes in bf16 (compute capability 8.0 or newer): from its compute
    /// capability, else from its name where that names a generation; `None`: unknown.
    pub fn has_bf16(&self) -> Option<bool> {
        match self.compute_capability_pair() {
            Some((major, _)) => Some(major >= 8),
            None => self.name.as_deref().and_then(bf16_by_name),
        }
    }

    /// Active throttle reasons that come from the hardware.
    pub fn hardware_throttles(&self) -> Vec<&str> {
        self.throttle_reasons
            .iter()
            .flatten()
            .filter(|r| HARDWARE_THROTTLES.contains(&r.as_str()))
            .map(String::as_str)
            .collect()
    }
}

/// A GPU-to-GPU connection in `nvidia-smi topo -m` vocabulary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Link {
    /// The GPU itself.
    SelfLink,
    /// A bonded set of this many NVLinks.
    NvLink(u32),
    /// At most one PCIe bridge.
    Pix,
    /// Several PCIe bridges, no host bridge.
    Pxb,
    /// Through a PCIe host bridge (the CPU).
    Phb,
    /// Between host bridges inside one NUMA node.
    Node,
    /// Across the SMP interconnect between NUMA nodes (QPI/UPI/Infinity Fabric).
    Sys,
    /// `N/A` or not probed.
    Unknown,
}

impl Link {
    /// Parses a topo matrix cell (`X`, `NV12`, `PIX`, ..., the old names `SOC` and `CPU`, `N/A`).
    pub fn parse(cell: &str) -> Option<Link> {
        let cell = cell.trim();
        Some(match cell {
            "X" => Link::SelfLink,
            "PIX" => Link::Pix,
            "PXB" => Link::Pxb,
            "PHB" | "CPU" => Link::Phb,
            "NODE" => Link::Node,
            "SYS" | "SOC" => Link::Sys,
            "N/A" | "?" => Link::Unknown,
            _ => Link::NvLink(cell.strip_prefix("NV")?.parse().ok()?),
        })
    }

    /// Higher is closer (faster). Used to pick the best-connected subsets.
    pub fn rank(self) -> u32 {
        match self {
            Link::SelfLink => 100,
            Link::NvLink(n) => 10 + n.min(80),
            Link::Pix => 6,
            Link::Pxb => 5,
            Link::Phb => 4,
            Link::Node => 3,
            Link::Sys => 2,
            Link::Unknown => 1,
        }
    }
}

impl fmt::Display for Link {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Link::SelfLink => f.write_str("X"),
            Link::NvLink(n) => write!(f, "NV{n}"),
            Link::Pix => f.write_str("PIX"),
            Link::Pxb => f.write_str("PXB"),
            Link::Phb => f.write_str("PHB"),
            Link::Node => f.write_str("NODE"),
            Link::Sys => f.write_str("SYS"),
            Link::Unknown => f.write_str("?"),
        }
    }
}

impl From<Link> for String {
    fn from(l: Link) -> String {
        l.to_string()
    }
}

impl TryFrom<String> for Link {
    type Error = String;
    fn try_from(s: String) -> Result<Link, String> {
        Link::parse(&s).ok_or_else(|| format!("unknown link `{s}`, expected X, NV#, PIX, PXB, PHB, NODE or SYS"))
    }
}

/// NVML peer-to-peer status for one capability.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum P2p {
    Ok,
    ChipsetNotSupported,
    GpuNotSupported,
    IohTopologyNotSupported,
    DisabledByRegkey,
    NotSupported,
    Unknown,
}

/// One unordered GPU pair.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pair {
    pub a: u32,
    pub b: u32,
    /// Topology level, or `NV#` when NVLink connects them.
    pub link: Link,
    /// Active NVLinks between the two (through an NVSwitch: the links each GPU has into it).
    pub nvlinks: Option<u32>,
    pub p2p_read: Option<P2p>,
    pub p2p_write: Option<P2p>,
    pub p2p_nvlink: Option<P2p>,
}

/// The file `--save DIR/` writes in `DIR`.
pub const SNAPSHOT_FILE: &str = "check-gpu-snapshot.json";

impl Snapshot {
    /// An empty snapshot of the given source.
    pub fn new(source: Source) -> Snapshot {
        Snapshot {
            schema_version: SNAPSHOT_SCHEMA_VERSION,
            source,
            system: System::default(),
            gpus: Vec::new(),
            pairs: Vec::new(),
            probe_notes: Vec::new(),
            bench: None,
        }
    }

    /// The GPU with this index.
    pub fn gpu(&self, index: u32) -> Option<&Gpu> {
        self.gpus.iter().find(|g| g.index == index)
    }

    /// The pair record for two GPUs, in either order.
    pub fn pair(&self, a: u32, b: u32) -> Option<&Pair> {
        let (a, b) = if a <= b { (a, b) } else { (b, a) };
        self.pairs.iter().find(|p| p.a == a && p.b == b)
    }

    /// The link between two GPUs (`X` for a GPU with itself, `Unknown` when not known).
    pub fn link(&self, a: u32, b: u32) -> Link {
        if a == b {
            return Link::SelfLink;
        }
        self.pair(a, b).map_or(Link::Unknown, |p| p.link)
    }

    /// Reads and validates a snapshot JSON file.
    pub fn load(path: &Path) -> Result<Snapshot, SnapshotError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| SnapshotError::Read { path: path.to_path_buf(), source })?;
        Snapshot::from_json(&text, path)
    }

    /// Parses snapshot JSON; `path` only names the input in errors.
    pub fn from_json(text: &str, path: &Path) -> Result<Snapshot, SnapshotError> {
        // Check the version first so an old file gets the clearer message.
        if let Ok(serde_json::Value::Object(map)) = serde_json::from_str::<serde_json::Value>(text)
            && let Some(found) = map.get("schema_version").and_then(serde_json::Value::as_u64)
            && found != u64::from(SNAPSHOT_SCHEMA_VERSION)
        {
            return Err(SnapshotError::Version {
                path: path.to_path_buf(),
                expected: SNAPSHOT_SCHEMA_VERSION,
                found: u32::try_from(found).unwrap_or(u32::MAX),
            });
        }
        serde_json::from_str(text).map_err(|e| {
            let message = e.to_string();
            // serde_json appends " at line L column C"; the prefix already says where.
            let message = match message.rfind(" at line ") {
                Some(i) => message[..i].to_string(),
                None => message,
            };
            SnapshotError::Json { path: path.to_path_buf(), line: e.line().max(1), column: e.column(), message }
        })
    }

    /// Writes the snapshot as pretty JSON, atomically (temporary file in the same directory,
    /// then rename), so a reader never sees half a file; into a directory (`path` is one, or ends
    /// in `/`), as [`SNAPSHOT_FILE`] there. Returns the file written.
    pub fn save(&self, path: &Path) -> Result<PathBuf, SnapshotError> {
        if path.is_dir() || path.as_os_str().to_string_lossy().ends_with('/') {
            // A directory: the snapshot goes in it, under the name `--snapshot` is used with.
            let dir_err = |source| SnapshotError::Write { path: path.to_path_buf(), source };
            std::fs::create_dir_all(path).map_err(dir_err)?;
            return self.save(&path.join(SNAPSHOT_FILE));
        }
        let err = |source| SnapshotError::Write { path: path.to_path_buf(), source };
        let json = serde_json::to_string_pretty(self).map_err(|e| err(std::io::Error::other(e)))?;
        let dir = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let file_name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let tmp = dir.join(format!(".{file_name}.tmp{}", std::process::id()));
        let result = (|| {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(json.as_bytes())?;
            f.write_all(b"\n")?;
            f.sync_all()?;
            std::fs::rename(&tmp, path)
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result.map(|()| path.to_path_buf()).map_err(err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// bf16 from the compute capability where known, else from names `nvidia-smi` prints.
    #[test]
    fn bf16_follows_the_compute_capability_else_the_name() {
        let with = |name: &str, cc: Option<&str>| Gpu {
            name: Some(name.to_owned()),
            compute_capability: cc.map(str::to_owned),
            ..Gpu::default()
        };
        assert_eq!(with("Tesla V100-SXM2-32GB", Some("8.0")).has_bf16(), Some(true));
        let cases = [
            ("Tesla V100-SXM2-32GB", Some(false)),
            ("Tesla T4", Some(false)),
            ("Tesla P100-PCIE-16GB", Some(false)),
            ("Quadro RTX 6000", Some(false)),
            ("NVIDIA TITAN RTX", Some(false)),
            ("NVIDIA GeForce RTX 2080 Ti", Some(false)),
            ("NVIDIA GeForce GTX 1080 Ti", Some(false)),
            ("NVIDIA A100-SXM4-80GB", Some(true)),
            ("A100-SXM4-40GB", Some(true)),
            ("NVIDIA H100 80GB HBM3", Some(true)),
            ("NVIDIA GH200 480GB", Some(true)),
            ("NVIDIA A10G", Some(true)),
            ("NVIDIA L40S", Some(true)),
            ("NVIDIA RTX A6000", Some(true)),
            ("NVIDIA RTX 6000 Ada Generation", Some(true)),
            ("NVIDIA GeForce RTX 3090", Some(true)),
            ("NVIDIA GeForce RTX 4090", Some(true)),
            ("NVIDIA B200", Some(true)),
            ("Some Future GPU", None),
        ];
        for (name, want) in cases {
            assert_eq!(with(name, None).has_bf16(), want, "{name}");
        }
    }

    #[test]
    fn link_cells_round_trip() {
        for cell in ["X", "NV12", "NV18", "PIX", "PXB", "PHB", "NODE", "SYS"] {
            let link = Link::parse(cell).expect("valid cell");
            assert_eq!(link.to_string(), cell);
        }
        assert_eq!(Link::parse(" X "), Some(Link::SelfLink));
        assert_eq!(Link::parse("SOC"), Some(Link::Sys));
        assert_eq!(Link::parse("N/A"), Some(Link::Unknown));
        assert_eq!(Link::parse("NVx"), None);
        assert_eq!(Link::parse("FOO"), None);
        assert!(Link::NvLink(4).rank() > Link::Pix.rank());
        assert!(Link::Node.rank() > Link::Sys.rank());
    }

    #[test]
    fn degraded_only_on_width() {
        let mut p = Pcie { gen_current: Some(1), gen_max: Some(4), width_current: Some(16), width_max: Some(16) };
        assert!(!p.is_degraded());
        p.width_current = Some(8);
        assert!(p.is_degraded());
    }

    #[test]
    fn json_round_trip_and_atomic_save() {
        let mut s = Snapshot::new(Source::Live);
        s.gpus.push(Gpu { index: 0, name: Some("Tesla T4".into()), ..Gpu::default() });
        s.gpus.push(Gpu { index: 1, ..Gpu::default() });
        s.pairs.push(Pair {
            a: 0,
            b: 1,
            link: Link::NvLink(4),
            nvlinks: Some(4),
            p2p_read: Some(P2p::Ok),
            p2p_write: None,
            p2p_nvlink: None,
        });
        let dir = std::env::temp_dir().join(format!("check-gpu-snap-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("snap.json");
        s.save(&path).expect("save");
        let back = Snapshot::load(&path).expect("load");
        assert_eq!(back, s);
        assert_eq!(back.link(1, 0), Link::NvLink(4));
        assert_eq!(back.link(1, 1), Link::SelfLink);
        let leftovers: Vec<_> = std::fs::read_dir(&dir).expect("dir").collect();
        assert_eq!(leftovers.len(), 1, "no temporary file left behind");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn json_errors_name_file_and_line() {
        let err = Snapshot::from_json(
            "{\n  \"schema_version\": 1,\n  \"source\": \"live\",\n  \"gpus\": 3\n}",
            Path::new("s.json"),
        )
        .expect_err("gpus must be a list");
        let msg = err.to_string();
        assert!(msg.starts_with("s.json:4:"), "{msg}");
        assert!(msg.contains("expected a check-gpu snapshot"), "{msg}");
        let err = Snapshot::from_json("{\"schema_version\": 9}", Path::new("s.json")).expect_err("version");
        assert_eq!(err.to_string(), "s.json:1: expected `schema_version` 1, found 9");
        let err = Snapshot::from_json("not json", Path::new("s.json")).expect_err("garbage");
        assert!(err.to_string().starts_with("s.json:1:2: expected a check-gpu snapshot JSON object"), "{err}");
    }
}
