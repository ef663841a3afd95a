//! `dpo-train env`: what this build and this machine have, for a bug report (as `accelerate env`
//! or `python -m torch.utils.collect_env`): dpo-train's version and commit, the torch it links and
//! that torch's CUDA and cuDNN, the backends compiled in and the NCCL library it would load, the
//! CUDA devices, the driver, the host, and the environment variables that change a run.
//! `--json` prints the same as one object.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use serde::Serialize;

use check_gpu::probe;
use dpo_torch::allocator::{AllocatorSettings, DEFAULT_CUDA_ALLOCATOR};

/// Everything `dpo-train env` reports.
#[derive(Debug, Serialize)]
pub struct EnvReport {
    pub dpo_train: Build,
    pub torch: Torch,
    pub backends: Backends,
    pub cuda: Cuda,
    pub host: Host,
    /// The variables that change a run, as set now.
    pub env: BTreeMap<String, String>,
}

#[derive(Debug, Serialize)]
pub struct Build {
    pub version: &'static str,
    pub commit: &'static str,
}

/// The torch this binary links (its `lib/` folder is in the binary's rpath).
#[derive(Debug, Serialize)]
pub struct Torch {
    pub lib: String,
    /// `torch.__version__`, read from its `version.py`.
    pub version: Option<String>,
    /// The CUDA it was built with (`torch.version.cuda`); `None` for a CPU build.
    pub cuda: Option<String>,
    /// The cuDNN wheel installed beside it (`nvidia-cudnn-cu*`).
    pub cudnn: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct Backends {
    /// Gloo, for CPU processes: always compiled in.
    pub gloo: bool,
    pub nccl: bool,
    /// Why NCCL is or is not in this build (from the build).
    pub nccl_build: &'static str,
    /// The NCCL library a process of this build would load, and its version.
    pub nccl_library: Option<String>,
    pub nccl_version: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct Cuda {
    /// CUDA devices torch sees (after `CUDA_VISIBLE_DEVICES`).
    pub torch_device_count: i64,
    pub cudnn_available: bool,
    /// What NVML reads of each GPU of the machine.
    pub gpus: Vec<Gpu>,
    pub driver: Option<String>,
    /// The CUDA version the driver supports.
    pub driver_cuda: Option<String>,
    /// Why NVML read nothing (no NVIDIA driver on this machine, most often).
    pub nvml_error: Option<String>,
    /// The caching allocator's settings a run gets, and from where.
    pub allocator: String,
}

#[derive(Debug, Serialize)]
pub struct Gpu {
    pub index: u32,
    pub name: Option<String>,
    pub memory_bytes: Option<u64>,
    pub compute_capability: Option<String>,
    pub pci_bus_id: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct Host {
    /// The CPU model and the instruction sets that pick torch's kernels.
    pub cpu: String,
    pub cores: u32,
    pub numa_nodes: Option<u32>,
    pub memory_total_bytes: Option<u64>,
    pub memory_available_bytes: Option<u64>,
    pub torch_threads: i32,
    /// How bf16 and fp16 matrix products run on this CPU ([`dpo_torch::product`]).
    pub half_products: String,
}

/// Whether the variable `name` changes a run: CUDA's, NCCL's, the rendezvous (torchrun's and
/// SLURM's), dpo-train's own, those that pick torch's CPU kernels and threads, the Hugging Face
/// cache a Hub name is read from, and W&B's run settings. Never a credential (`WANDB_API_KEY`,
/// `HF_TOKEN`, anything named as a key, token, secret or password): a report is pasted publicly.
pub fn changes_a_run(name: &str) -> bool {
    const PREFIXES: [&str; 6] = ["CUDA_", "NCCL_", "SLURM_", "DPO_TRAIN_", "TORCHELASTIC_", "LIBTORCH"];
    const SECRET: [&str; 5] = ["KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD"];
    const NAMES: [&str; 23] = [
        "HF_HOME",
        "HF_HUB_CACHE",
        "HUGGINGFACE_HUB_CACHE",
        "XDG_CACHE_HOME",
        "WANDB_PROJECT",
        "WANDB_ENTITY",
        "WANDB_MODE",
        "WANDB_DIR",
        "WANDB_RUN_GROUP",
        "PYTORCH_ALLOC_CONF",
        "PYTORCH_CUDA_ALLOC_CONF",
        "MASTER_ADDR",
        "MASTER_PORT",
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "OMP_NUM_THREADS",
        "ATEN_CPU_CAPABILITY",
        "ONEDNN_MAX_CPU_ISA",
        "MKL_ENABLE_INSTRUCTIONS",
        "LD_LIBRARY_PATH",
    ];
    let secret = SECRET.iter().any(|s| name.to_ascii_uppercase().contains(s));
    !secret && (PREFIXES.iter().any(|p| name.starts_with(p)) || NAMES.contains(&name))
}

/// How a run's CUDA caching allocator is set up.
fn allocator_line(settings: &AllocatorSettings) -> String {
    match settings {
        AllocatorSettings::User { var, value } => format!("{var}={value} (the environment's)"),
        AllocatorSettings::Default => {
            format!("{DEFAULT_CUDA_ALLOCATOR} (dpo-train's default; PYTORCH_ALLOC_CONF replaces it)")
        }
        AllocatorSettings::Unavailable(why) => format!("not set: {why}"),
    }
}

/// The report of this build on this machine, with `vars` as the environment.
pub fn report(vars: impl IntoIterator<Item = (String, String)>) -> EnvReport {
    let lib = torch_lib();
    let torch_root = Path::new(&lib).parent().map(Path::to_path_buf).unwrap_or_default();
    let site_packages = torch_root.parent().map(Path::to_path_buf).unwrap_or_default();
    let version_py = std::fs::read_to_string(torch_root.join("version.py")).unwrap_or_default();
    let nccl = probe::nccl::probe();
    let (snapshot, nvml_error) = match probe::probe_live() {
        Ok(s) => (Some(s), None),
        Err(e) => (None, Some(format!("{e:#}"))),
    };
    let mut system = check_gpu::snapshot::System::default();
    probe::host_facts(&mut system);
    let gpus = snapshot.as_ref().map_or_else(Vec::new, |s| {
        s.gpus
            .iter()
            .map(|g| Gpu {
                index: g.index,
                name: g.name.clone(),
                memory_bytes: g.memory_total_bytes,
                compute_capability: g.compute_capability.clone(),
                pci_bus_id: g.pci_bus_id.clone(),
            })
            .collect()
    });
    EnvReport {
        dpo_train: Build { version: env!("CARGO_PKG_VERSION"), commit: env!("DPO_TRAIN_COMMIT") },
        torch: Torch {
            lib,
            version: python_string(&version_py, "__version__"),
            cuda: python_string(&version_py, "cuda"),
            cudnn: wheel_version(&site_packages, "nvidia_cudnn_cu"),
        },
        backends: Backends {
            gloo: true,
            nccl: dpo_torch::has_nccl(),
            nccl_build: dpo_torch::NCCL_BUILD,
            // The copy this process loaded (libtorch_cuda links it), else the one the probe found.
            nccl_library: loaded_library("libnccl.so").or(nccl.path),
            nccl_version: nccl.version,
        },
        cuda: Cuda {
            torch_device_count: tch::Cuda::device_count(),
            cudnn_available: tch::Cuda::cudnn_is_available(),
            gpus,
            driver: snapshot.as_ref().and_then(|s| s.system.driver_version.clone()),
            driver_cuda: snapshot.as_ref().and_then(|s| s.system.cuda_driver_version.clone()),
            nvml_error,
            allocator: allocator_line(crate::malloc::cuda_segments()),
        },
        host: Host {
            cpu: crate::run::machine_cpu(),
            cores: system.cpu_count.unwrap_or(1),
            numa_nodes: system.cpu_numa_nodes,
            memory_total_bytes: mem_total(&std::fs::read_to_string("/proc/meminfo").unwrap_or_default()),
            memory_available_bytes: system.memory_available_bytes,
            torch_threads: tch::get_num_threads(),
            half_products: half_products(),
        },
        env: vars.into_iter().filter(|(k, _)| changes_a_run(k)).collect(),
    }
}

/// How bf16 and fp16 matrix products run on this CPU: torch's oneDNN kernels where it has units
/// for them, else on f32 copies (or as `DPO_TRAIN_CPU_F32_PRODUCTS` says).
fn half_products() -> String {
    let way = |kind| match dpo_torch::product::widens(kind, tch::Device::Cpu) {
        true => "on f32 copies",
        false => "by torch's own kernels",
    };
    format!("bf16 {}, fp16 {}", way(tch::Kind::BFloat16), way(tch::Kind::Half))
}

/// The line `dpo-train --version` prints after the name: the version, commit, torch and backends.
pub fn version_line() -> String {
    let torch_root = Path::new(&torch_lib()).parent().map(Path::to_path_buf).unwrap_or_default();
    let torch =
        python_string(&std::fs::read_to_string(torch_root.join("version.py")).unwrap_or_default(), "__version__");
    let backends = if dpo_torch::has_nccl() { "gloo, nccl" } else { "gloo" };
    format!(
        "{} (commit {}, torch {}, backends: {backends})",
        env!("CARGO_PKG_VERSION"),
        env!("DPO_TRAIN_COMMIT"),
        torch.as_deref().unwrap_or("unknown")
    )
}

/// `name = '...'` (or `name: Optional[str] = '...'`) of a Python file; `None` when unset or `None`.
fn python_string(text: &str, name: &str) -> Option<String> {
    text.lines().find_map(|line| {
        let (lhs, rhs) = line.split_once('=')?;
        let lhs = lhs.split(':').next()?.trim();
        (lhs == name).then(|| rhs.trim().trim_matches(|c| c == '\'' || c == '"').to_owned()).filter(|v| v != "None")
    })
}

/// The version of the wheel whose `.dist-info` folder in `site_packages` starts with `prefix`.
fn wheel_version(site_packages: &Path, prefix: &str) -> Option<String> {
    let names = std::fs::read_dir(site_packages).ok()?.filter_map(|e| e.ok()?.file_name().into_string().ok());
    let mut found: Vec<String> = names
        .filter(|n| n.starts_with(prefix) && n.ends_with(".dist-info"))
        .filter_map(|n| Some(n.trim_end_matches(".dist-info").split_once('-')?.1.to_owned()))
        .collect();
    found.sort();
    found.pop()
}

/// The folder of the libtorch this process loaded (`LD_LIBRARY_PATH` can point elsewhere than
/// the build's rpath, as on a machine that runs a bundle built here), else the build's.
fn torch_lib() -> String {
    loaded_library("libtorch_cpu.so")
        .and_then(|l| Some(Path::new(&l).parent()?.to_string_lossy().into_owned()))
        .unwrap_or_else(|| dpo_torch::TORCH_LIB.to_owned())
}

/// The path of the loaded shared library whose file name starts with `name`, from
/// `/proc/self/maps`.
fn loaded_library(name: &str) -> Option<String> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|path| Path::new(path).file_name().is_some_and(|f| f.to_string_lossy().starts_with(name)))
        .map(str::to_owned)
}

/// `MemTotal` of `/proc/meminfo` text, in bytes.
fn mem_total(meminfo: &str) -> Option<u64> {
    let value = meminfo.lines().find_map(|l| l.strip_prefix("MemTotal:"))?;
    value.trim().strip_suffix("kB")?.trim().parse::<u64>().ok()?.checked_mul(1024)
}

/// `dpo-train env [--json]`.
pub fn run_env(json: bool) -> anyhow::Result<()> {
    let vars = std::env::vars_os().filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)));
    let report = report(vars);
    let mut out = std::io::stdout().lock();
    if json {
        writeln!(out, "{}", serde_json::to_string_pretty(&report)?)?;
    } else {
        out.write_all(render(&report).as_bytes())?;
    }
    Ok(())
}

/// The report as text, one fact a line.
pub fn render(r: &EnvReport) -> String {
    let gib = |b: u64| format!("{:.1} GiB", b as f64 / f64::from(1u32 << 30));
    let or_unknown = |v: &Option<String>| v.clone().unwrap_or_else(|| "unknown".to_owned());
    let mut out = format!("dpo-train {} (commit {})\n", r.dpo_train.version, r.dpo_train.commit);
    let t = &r.torch;
    out += &format!(
        "torch     {} at {} (CUDA {}, cuDNN {})\n",
        or_unknown(&t.version),
        t.lib,
        t.cuda.as_deref().unwrap_or("none: a CPU build"),
        or_unknown(&t.cudnn)
    );
    let b = &r.backends;
    let nccl_lib = match (&b.nccl_library, &b.nccl_version) {
        (Some(path), Some(v)) => format!("; would load {path}, NCCL {v}"),
        (Some(path), None) => format!("; would load {path}"),
        _ => String::new(),
    };
    out += &format!("backends  gloo, nccl {}{nccl_lib}\n", b.nccl_build);
    let c = &r.cuda;
    out += &format!("CUDA      torch sees {} device(s); cuDNN usable: {}\n", c.torch_device_count, c.cudnn_available);
    for g in &c.gpus {
        out += &format!(
            "          gpu {}: {}, {}, compute capability {}, {}\n",
            g.index,
            or_unknown(&g.name),
            g.memory_bytes.map_or_else(|| "memory unknown".to_owned(), gib),
            or_unknown(&g.compute_capability),
            or_unknown(&g.pci_bus_id)
        );
    }
    out += &format!("          caching allocator: {}\n", c.allocator);
    out += &match (&c.driver, &c.nvml_error) {
        (Some(d), _) => format!("driver    {d} (CUDA {})\n", or_unknown(&c.driver_cuda)),
        (None, Some(e)) => format!("driver    none read: {e}\n"),
        (None, None) => "driver    unknown\n".to_owned(),
    };
    let h = &r.host;
    out += &format!(
        "host      {}; {} core(s), {} NUMA node(s), {} memory ({} available); {} torch thread(s)\n",
        h.cpu,
        h.cores,
        h.numa_nodes.map_or_else(|| "unknown".to_owned(), |n| n.to_string()),
        h.memory_total_bytes.map_or_else(|| "unknown".to_owned(), gib),
        h.memory_available_bytes.map_or_else(|| "unknown".to_owned(), gib),
        h.torch_threads
    );
    out += &format!("          half-precision matrix products: {}\n", h.half_products);
    out += "environment\n";
    if r.env.is_empty() {
        out += "          (none of the variables that change a run is set)\n";
    }
    for (k, v) in &r.env {
        out += &format!("          {k}={v}\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_variables_that_change_a_run_are_kept() {
        let fake = [
            ("CUDA_VISIBLE_DEVICES", "1,3"),
            ("NCCL_DEBUG", "INFO"),
            ("MASTER_ADDR", "10.0.0.1"),
            ("RANK", "2"),
            ("SLURM_JOB_ID", "77"),
            ("DPO_TRAIN_PROFILE", "t.json"),
            ("ATEN_CPU_CAPABILITY", "avx2"),
            ("PYTORCH_ALLOC_CONF", "expandable_segments:False"),
            ("HOME", "/root"),
            ("PATH", "/bin"),
            ("MY_RANK", "1"),
        ];
        let r = report(fake.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        let kept: Vec<&str> = r.env.keys().map(String::as_str).collect();
        assert_eq!(
            kept,
            [
                "ATEN_CPU_CAPABILITY",
                "CUDA_VISIBLE_DEVICES",
                "DPO_TRAIN_PROFILE",
                "MASTER_ADDR",
                "NCCL_DEBUG",
                "PYTORCH_ALLOC_CONF",
                "RANK",
                "SLURM_JOB_ID"
            ]
        );
        assert!(render(&r).contains("          CUDA_VISIBLE_DEVICES=1,3\n"));
    }

    /// The allocator line says where the settings come from.
    #[test]
    fn the_allocator_line_names_its_source() {
        let user = AllocatorSettings::User { var: "PYTORCH_ALLOC_CONF", value: "expandable_segments:False".to_owned() };
        assert_eq!(allocator_line(&user), "PYTORCH_ALLOC_CONF=expandable_segments:False (the environment's)");
        assert!(
            allocator_line(&AllocatorSettings::Default).starts_with("expandable_segments:True (dpo-train's default")
        );
    }

    #[test]
    fn python_and_meminfo_values_are_read() {
        let py = "__version__ = '2.9.0+cu128'\ncuda: Optional[str] = '12.8'\nhip: Optional[str] = None\n";
        assert_eq!(python_string(py, "__version__").as_deref(), Some("2.9.0+cu128"));
        assert_eq!(python_string(py, "cuda").as_deref(), Some("12.8"));
        assert_eq!(python_string(py, "hip"), None);
        assert_eq!(mem_total("MemTotal:       32567284 kB\n"), Some(32567284 * 1024));
    }
}
