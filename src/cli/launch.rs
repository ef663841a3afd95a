//! Where a command runs: alone on one device, as one worker of a job (started by our launcher,
//! torchrun or SLURM), or as the launcher of this node's workers.
//!
//! Two rules keep a job finite: a process that has worker variables never launches, whatever the
//! world size (our launcher sets them, so a worker cannot start workers), and a single device runs
//! as one process with no launcher at all (`--devices cpu:1`, `--gpus 1`, `--gpus 3`).

use std::ffi::OsString;
use std::ops::ControlFlow;
use std::process::ExitCode;
use std::time::Duration;

use burn::tensor::Device;

use super::args::{DeviceArg, ParallelArgs};
use super::interrupt;
use crate::dist::launcher::{LaunchOutcome, PORT_TRIES, THREADS_VAR, free_port};
use crate::dist::{self, Backend, DistConfig, EnvSource, NodeSpec, ProcessGroup, WorkerEnv};

/// Bad device or data-parallel flags, named.
#[derive(Debug, thiserror::Error)]
pub enum LaunchFlagError {
    #[error("`--devices {0}`: expected `cpu:N` with N >= 1")]
    Devices(String),
    #[error("`--gpus {0}`: expected a count, a comma-separated list of indices, or `auto`")]
    Gpus(String),
    #[error("`--gpus {spec}`: {found} CUDA device(s) found; run on CPU processes with `--devices cpu:{wanted}`")]
    TooFewGpus { spec: String, found: usize, wanted: usize },
    #[error("`--gpus auto`: {0}")]
    Auto(String),
    #[error("`--device`: asks for CUDA device {index} and {found} CUDA device(s) are found; run with {}", no_cuda_advice(*.found))]
    NoCuda { index: usize, found: usize },
    #[error(
        "`--devices {devices}` runs CPU processes and `--device {device}` asks for a GPU: choose one (`--gpus N` runs one process per GPU)"
    )]
    Contradiction { devices: String, device: String },
    #[error(
        "`{flag}` launches processes, but this one is rank {rank} of {world} of a job already laid out ({vars} are set): drop the flag inside that job (one task per device, as `dpo-train slurm`'s script runs them), or run it outside"
    )]
    InsideJob { flag: String, vars: &'static str, rank: usize, world: usize },
    #[error("`--devices cpu:{}`: {}: {}", short.n, short.describe("processes", basis), short.advice(lone))]
    HostMemory { short: check_gpu::probe::HostShortfall, basis: &'static str, lone: &'static str },
    #[error(
        "one process needs about {need} before the data adds any ({terms}; check-gpu's estimate), and the host has {room} available, swap included: {advice}"
    )]
    OneProcess { need: String, terms: String, room: String, advice: &'static str },
}

/// The devices there are: `cuda:0` up to the last, else the CPU.
fn no_cuda_advice(found: usize) -> String {
    match found {
        0 => "`--device cpu`".to_owned(),
        1 => "`--device cuda:0` or `--device cpu`".to_owned(),
        n => format!("`--device cuda:0` to `cuda:{}`, or `--device cpu`", n - 1),
    }
}

/// What this process does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// Runs by itself on this device.
    Alone(DeviceArg),
    /// One rank of a job of several processes, on this device.
    Worker(DeviceArg),
    /// Starts this node's workers and waits for them.
    Launcher(LaunchPlan),
}

/// What a launcher starts: processes per node and the devices they see.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchPlan {
    pub nproc: usize,
    pub cuda: bool,
    /// `CUDA_VISIBLE_DEVICES` for every worker (each takes the device of its local rank, or with
    /// `shared` the one its entry of the `--gpus` list names).
    pub visible: Option<String>,
    /// Some ranks share a GPU (`--gpus 0,0`): the job runs over Gloo ([`backend`]).
    pub shared: bool,
}

/// Decides this process's role from its flags and worker variables; `cuda_devices` counts the
/// CUDA devices torch sees (asked only when a CUDA device is involved).
pub fn role(par: &ParallelArgs, worker: &WorkerEnv, cuda_devices: impl Fn() -> usize) -> Result<Role, LaunchFlagError> {
    // `--devices`/`--gpus` in a job another launcher laid out: a job of one task (an sbatch
    // script's own variables) launches them here; in one of several they would be ignored.
    let asked =
        par.devices.as_ref().map(|d| format!("--devices {d}")).or(par.gpus.as_ref().map(|g| format!("--gpus {g}")));
    let elsewhere = matches!(worker.source, EnvSource::Torchrun | EnvSource::Slurm);
    if let (Some(flag), true, true) = (&asked, elsewhere, worker.is_distributed()) {
        let vars = if worker.source == EnvSource::Slurm { "SLURM_PROCID/SLURM_NTASKS" } else { "RANK/WORLD_SIZE" };
        let (flag, rank, world) = (flag.clone(), worker.rank, worker.world_size);
        return Err(LaunchFlagError::InsideJob { flag, vars, rank, world });
    }
    if worker.source != EnvSource::Single && !(asked.is_some() && elsewhere) {
        // Started by a launcher: the job is already laid out; never launch again.
        // `auto` is CUDA where torch sees a device, unless our launcher started CPU workers.
        let auto_cuda = par.device == DeviceArg::Auto && par.devices.is_none() && cuda_devices() > 0;
        let device = if par.gpus.is_some() || matches!(par.device, DeviceArg::Cuda(_)) || auto_cuda {
            check_cuda(DeviceArg::Cuda(visible_slot(par, worker.local_rank)), &cuda_devices)?
        } else {
            DeviceArg::Cpu
        };
        return Ok(if worker.is_distributed() { Role::Worker(device) } else { Role::Alone(device) });
    }
    let single_node = par.nnodes <= 1;
    if let (Some(devices), DeviceArg::Cuda(i)) = (&par.devices, par.device) {
        return Err(LaunchFlagError::Contradiction { devices: devices.clone(), device: format!("cuda:{i}") });
    }
    if let Some(spec) = &par.devices {
        let n = spec.strip_prefix("cpu:").and_then(|n| n.parse::<usize>().ok()).filter(|&n| n >= 1);
        let nproc = n.ok_or_else(|| LaunchFlagError::Devices(spec.clone()))?;
        if nproc == 1 && single_node {
            return Ok(Role::Alone(DeviceArg::Cpu));
        }
        return Ok(Role::Launcher(LaunchPlan { nproc, cuda: false, visible: None, shared: false }));
    }
    if let Some(spec) = &par.gpus {
        let found = cuda_devices();
        let ids = gpu_ids(spec, found)?;
        if let ([only], true) = (ids.as_slice(), single_node) {
            return Ok(Role::Alone(DeviceArg::Cuda(*only)));
        }
        let distinct = distinct(&ids);
        let visible = distinct.iter().map(usize::to_string).collect::<Vec<_>>().join(",");
        let plan =
            LaunchPlan { nproc: ids.len(), cuda: true, visible: Some(visible), shared: distinct.len() < ids.len() };
        return Ok(Role::Launcher(plan));
    }
    Ok(Role::Alone(check_cuda(par.device, &cuda_devices)?))
}

/// One process's memory as a command estimates it, for the checks before anything starts.
#[derive(Debug, Clone, Copy)]
pub struct ProcessMemory {
    /// Bytes per process at its peak.
    pub each: u64,
    /// What `each` counts, for the message.
    pub basis: &'static str,
    /// What to lower when not even one process fits.
    pub lone: &'static str,
}

/// Refuses `--devices cpu:N` (N > 1) when N processes of `mem.each` bytes would not fit in the
/// memory this job has (`MemAvailable`, or its cgroup's limit): the workers would be killed one
/// by one, or the machine swap, long after the start. Unknown host memory is not checked.
pub fn check_host_memory(par: &ParallelArgs, mem: ProcessMemory) -> Result<(), LaunchFlagError> {
    let n = par.devices.as_deref().and_then(|s| s.strip_prefix("cpu:")).and_then(|n| n.parse::<u64>().ok());
    let Some(n) = n.filter(|&n| n > 1) else { return Ok(()) };
    match check_gpu::probe::HostShortfall::of(n, mem.each, check_gpu::probe::host_memory_available()) {
        Some(short) => Err(LaunchFlagError::HostMemory { short, basis: mem.basis, lone: mem.lone }),
        None => Ok(()),
    }
}

/// Whether the flags run this command on CPU processes.
pub fn runs_on_cpu(par: &ParallelArgs) -> bool {
    par.gpus.is_none()
        && (par.devices.is_some()
            || par.device == DeviceArg::Cpu
            || (par.device == DeviceArg::Auto && cuda_device_count() == 0))
}

/// Refuses a run on the CPU whose one process needs `state` bytes (`terms`: what they are) before
/// its data adds any, beyond the host's available memory and free swap together: held whatever
/// the data, they cannot fit, and the kernel's OOM killer would end the run without a word (a
/// `--lora-r` of 10^9, a 70B model on a laptop). The data's share is not counted: a run of short
/// pairs may well fit where `max_length` pairs would not.
pub fn check_one_process(
    par: &ParallelArgs,
    state: u64,
    terms: String,
    advice: &'static str,
) -> Result<(), LaunchFlagError> {
    let Some(available) = check_gpu::probe::host_memory_available().filter(|_| runs_on_cpu(par)) else {
        return Ok(());
    };
    let room = available.saturating_add(check_gpu::probe::host::host_swap_free().unwrap_or(0));
    if state <= room {
        return Ok(());
    }
    let bytes = check_gpu::units::bytes;
    Err(LaunchFlagError::OneProcess { need: bytes(state), terms, room: bytes(room), advice })
}

/// Refuses `--{flag}` where its value makes this process hold `bytes` on the host (`what` they
/// are, for the message) and the job has less memory available: the allocation would abort, or
/// the OOM killer end the process, without a word (`data synth --train 10000000000000`).
pub fn check_flag_memory(flag: &str, bytes: u64, what: &str, advice: &str) -> Result<(), crate::config::ConfigError> {
    let Some(available) = check_gpu::probe::host_memory_available().filter(|&a| bytes > a) else { return Ok(()) };
    let size = check_gpu::units::bytes;
    let message =
        format!("{what} need about {}, and the host has {} available: {advice}", size(bytes), size(available));
    Err(crate::config::ConfigError::Flag { flag: flag.to_owned(), message })
}

/// The CUDA device indices of a `--gpus` value.
fn gpu_ids(spec: &str, found: usize) -> Result<Vec<usize>, LaunchFlagError> {
    let ids: Vec<usize> = if spec == "auto" {
        let snapshot = check_gpu::probe_live().map_err(|e| LaunchFlagError::Auto(e.to_string()))?;
        let plan = check_gpu::plan(&snapshot, &check_gpu::PlanRequest::default());
        if plan.gpus.is_empty() {
            return Err(LaunchFlagError::Auto("check-gpu selected no usable GPU".into()));
        }
        plan.gpus.iter().map(|&g| g as usize).collect()
    } else if let Ok(n) = spec.parse::<usize>() {
        if n > found {
            // Refused before the list is made: `--gpus 1000000000000` is a count, not an allocation.
            return Err(LaunchFlagError::TooFewGpus { spec: spec.to_owned(), found, wanted: n });
        }
        (0..n).collect()
    } else {
        listed_ids(spec).ok_or_else(|| LaunchFlagError::Gpus(spec.to_owned()))?
    };
    if ids.is_empty() {
        return Err(LaunchFlagError::Gpus(spec.to_owned()));
    }
    if ids.iter().any(|&i| i >= found) {
        return Err(LaunchFlagError::TooFewGpus { spec: spec.to_owned(), found, wanted: ids.len() });
    }
    Ok(ids)
}

/// The indices of a `--gpus` list (`0,2`; `3,` is the one-element list, a bare `3` a count).
pub(super) fn listed_ids(spec: &str) -> Option<Vec<usize>> {
    if !spec.contains(',') {
        return None;
    }
    spec.strip_suffix(',').unwrap_or(spec).split(',').map(|i| i.trim().parse::<usize>().ok()).collect()
}

/// `ids` without repeats, in their first order.
fn distinct(ids: &[usize]) -> Vec<usize> {
    let mut seen = std::collections::HashSet::new();
    ids.iter().copied().filter(|&i| seen.insert(i)).collect()
}

/// The device index a worker of our launcher takes among the devices it sees: its local rank's,
/// except where a `--gpus` list repeats a device (the launcher shows each device once, so rank
/// `r` takes the position of list entry `r` among them).
fn visible_slot(par: &ParallelArgs, local_rank: usize) -> usize {
    let Some(ids) = par.gpus.as_deref().and_then(listed_ids) else { return local_rank };
    let slot = ids.get(local_rank).and_then(|id| distinct(&ids).iter().position(|d| d == id));
    slot.unwrap_or(local_rank)
}

/// The process group's backend: NCCL between GPUs, Gloo between CPU processes and between ranks
/// that share a GPU (`--gpus 0,0`: NCCL refuses two ranks on one device; Gloo runs there with the
/// collectives staged through host memory, slower but the same numbers, a way to check the
/// distributed code on one GPU).
pub fn backend(par: &ParallelArgs, device: DeviceArg) -> Backend {
    let ids = par.gpus.as_deref().and_then(listed_ids).unwrap_or_default();
    let shared = distinct(&ids).len() < ids.len();
    if matches!(device, DeviceArg::Cuda(_)) && !shared { Backend::Nccl } else { Backend::Gloo }
}

/// A CUDA device must exist before anything touches it (torch would abort the process).
fn check_cuda(device: DeviceArg, cuda_devices: &impl Fn() -> usize) -> Result<DeviceArg, LaunchFlagError> {
    match device {
        DeviceArg::Auto => Ok(if cuda_devices() > 0 { DeviceArg::Cuda(0) } else { DeviceArg::Cpu }),
        DeviceArg::Cuda(i) => {
            let found = cuda_devices();
            if i < found { Ok(device) } else { Err(LaunchFlagError::NoCuda { index: i, found }) }
        }
        DeviceArg::Cpu => Ok(device),
    }
}

/// The burn device of a checked [`DeviceArg`].
#[allow(deprecated)] // burn marks its libtorch devices deprecated; libtorch is this project's backend.
pub fn device(arg: DeviceArg) -> Device {
    match arg {
        // Resolved by `check_cuda` before any device is made; the CPU if one slips through.
        DeviceArg::Cpu | DeviceArg::Auto => Device::libtorch(),
        DeviceArg::Cuda(i) => Device::libtorch_cuda(i),
    }
}

/// A plain `--device` checked for existence: for the commands that never launch.
pub fn single_device(arg: DeviceArg) -> Result<Device, LaunchFlagError> {
    Ok(device(check_cuda(arg, &cuda_device_count)?))
}

fn cuda_device_count() -> usize {
    usize::try_from(tch::Cuda::device_count()).unwrap_or(0)
}

/// Where this process ended up.
pub enum Placed {
    /// It launched the workers, which ran the command.
    Launched(LaunchOutcome),
    /// It runs the command itself: on `device`, in `group` when one of several ranks.
    Here { device: Device, group: Option<ProcessGroup>, worker: WorkerEnv },
}

/// Places this process ([`role`]): launches the workers (with this command line plus
/// `extra_args`) and waits, or returns the device and process group to run on. `before_workers`
/// runs first where several workers are about to meet (the launcher before it starts them; a
/// worker another launcher started, torchrun or SLURM, before the rendezvous): work every rank
/// needs, such as tokenising the data, is done there rather than with ranks waiting. Its argument
/// says whether this process shows progress.
pub fn place(
    par: &ParallelArgs,
    extra_args: &dyn Fn() -> anyhow::Result<Vec<OsString>>,
    timeout: Duration,
    before_workers: &mut dyn FnMut(bool) -> anyhow::Result<()>,
) -> anyhow::Result<Placed> {
    let worker = dist::env::detect()?;
    let device_arg = match role(par, &worker, cuda_device_count)? {
        Role::Launcher(plan) => {
            before_workers(true)?;
            // Ctrl-C during that work: no worker is started.
            if interrupt::install()?.load(std::sync::atomic::Ordering::SeqCst) {
                return Ok(Placed::Launched(LaunchOutcome::Interrupted));
            }
            // The workers' extra flags once `before_workers` is done (it may name their run).
            return launch(par, &plan, &extra_args()?, timeout).map(Placed::Launched);
        }
        Role::Alone(device_arg) => return Ok(Placed::Here { device: device(device_arg), group: None, worker }),
        Role::Worker(device_arg) => {
            interrupt::as_worker();
            device_arg
        }
    };
    match std::env::var(THREADS_VAR).ok().and_then(|t| t.parse::<i32>().ok()) {
        // Started by our launcher, which did `before_workers`.
        Some(threads) => {
            tch::set_num_threads(threads);
            // Tokenisation gets the same share of the cores. An error means the pool already
            // exists (only a test could build it first); it then keeps its size.
            let _ = rayon::ThreadPoolBuilder::new().num_threads(threads.max(1) as usize).build_global();
        }
        // Only rank 0 shows its progress.
        None => before_workers(worker.rank == 0)?,
    }
    let group = ProcessGroup::new(&DistConfig {
        rank: worker.rank,
        world_size: worker.world_size,
        local_rank: worker.local_rank,
        master_addr: worker.master_addr.clone(),
        master_port: worker.master_port,
        backend: backend(par, device_arg),
        timeout,
    })?;
    Ok(Placed::Here { device: device(device_arg), group: Some(group), worker })
}

/// Places a command that trains nothing (`eval`, `generate`): its processes checked against the
/// host's memory at a libtorch process's own each, then [`place`]d. `Break` carries a launcher's
/// exit once its workers are done; `Continue` the device and group this process runs on.
pub fn place_plain(par: &ParallelArgs) -> anyhow::Result<ControlFlow<ExitCode, (Device, Option<ProcessGroup>)>> {
    let floor = ProcessMemory {
        each: check_gpu::memory::CUDA_CONTEXT_BYTES,
        basis: "a libtorch process's own",
        lone: "free memory on this machine",
    };
    check_host_memory(par, floor)?;
    Ok(match place(par, &|| Ok(Vec::new()), Duration::from_secs(1800), &mut |_| Ok(()))? {
        Placed::Launched(LaunchOutcome::Finished) => ControlFlow::Break(ExitCode::SUCCESS),
        Placed::Launched(LaunchOutcome::Interrupted | LaunchOutcome::Aborted) => {
            ControlFlow::Break(ExitCode::from(super::INTERRUPTED))
        }
        Placed::Here { device, group, .. } => {
            if group.is_none() {
                interrupt::install_to_stop()?;
            }
            ControlFlow::Continue((device, group))
        }
    })
}

/// Starts this node's workers and waits for them.
fn launch(
    par: &ParallelArgs,
    plan: &LaunchPlan,
    extra_args: &[OsString],
    timeout: Duration,
) -> anyhow::Result<LaunchOutcome> {
    let mut argv: Vec<OsString> = std::env::args_os().skip(1).collect();
    argv.extend(extra_args.iter().cloned());
    let mut spec = NodeSpec {
        nnodes: par.nnodes,
        node_rank: par.node_rank,
        nproc_per_node: plan.nproc,
        master_addr: par.master_addr.clone().unwrap_or_else(|| "127.0.0.1".into()),
        master_port: match par.master_port {
            Some(port) => port,
            None if par.nnodes > 1 => dist::env::DEFAULT_MASTER_PORT,
            None => free_port()?,
        },
        timeout,
    };
    eprintln!(
        "launching {} {} worker(s) on node {} of {} (world size {}){}",
        plan.nproc,
        if plan.cuda { "CUDA" } else { "CPU" },
        spec.node_rank,
        spec.nnodes,
        spec.world_size(),
        if plan.shared { ", sharing GPUs over Gloo (collectives through host memory)" } else { "" }
    );
    interrupt::install()?;
    let interrupts = interrupt::forward_to_workers();
    let visible = plan.visible.clone();
    let env = |_| visible.iter().map(|v| ("CUDA_VISIBLE_DEVICES".to_owned(), v.clone())).collect();
    // A port this launcher chose can be taken by another process before rank 0 listens on it.
    let retry = par.master_port.is_none() && par.nnodes == 1;
    for attempt in 1.. {
        match dist::launch_node(&spec, env, &argv, interrupts) {
            Err(e) if retry && attempt < PORT_TRIES && e.port_taken() => {
                eprintln!(
                    "port {} was taken before the rendezvous could listen on it: launching again",
                    spec.master_port
                );
                spec.master_port = free_port()?;
            }
            done => {
                return done.map_err(|e| {
                    // Where each rank was when the job ended, above the one-line error; a
                    // refusal of the input, already said, needs neither.
                    for line in e.report().iter().filter(|_| !e.already_said()) {
                        eprintln!("{line}");
                    }
                    e.into()
                });
            }
        }
    }
    unreachable!("the last try returns")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(devices: Option<&str>, gpus: Option<&str>, device: DeviceArg) -> ParallelArgs {
        ParallelArgs {
            device,
            gpus: gpus.map(str::to_owned),
            devices: devices.map(str::to_owned),
            nnodes: 1,
            node_rank: 0,
            master_addr: None,
            master_port: None,
        }
    }

    /// A worker our launcher started.
    fn worker(world_size: usize, local_rank: usize) -> WorkerEnv {
        WorkerEnv { rank: local_rank, local_rank, world_size, source: EnvSource::Launcher, ..WorkerEnv::single() }
    }

    #[test]
    fn one_device_runs_alone() {
        let single = WorkerEnv::single();
        assert_eq!(
            role(&flags(Some("cpu:1"), None, DeviceArg::Cpu), &single, || 0).unwrap(),
            Role::Alone(DeviceArg::Cpu)
        );
        let one_gpu = role(&flags(None, Some("1"), DeviceArg::Cpu), &single, || 1).unwrap();
        assert_eq!(one_gpu, Role::Alone(DeviceArg::Cuda(0)));
        let third = role(&flags(None, Some("2,"), DeviceArg::Cpu), &single, || 4).unwrap();
        assert_eq!(third, Role::Alone(DeviceArg::Cuda(2)));
        let bad = role(&flags(None, Some("0,x"), DeviceArg::Cpu), &single, || 4);
        assert!(matches!(bad, Err(LaunchFlagError::Gpus(_))), "{bad:?}");
        let listed = role(&flags(None, Some("0,3"), DeviceArg::Cpu), &single, || 4).unwrap();
        let plan = LaunchPlan { nproc: 2, cuda: true, visible: Some("0,3".into()), shared: false };
        assert_eq!(listed, Role::Launcher(plan));
    }

    /// Our launcher's workers carry its flags and never launch again; in a job another launcher
    /// laid out, the flags launch where the job has one task (an sbatch script's variables) and are
    /// refused where it has several, which they would not change.
    #[test]
    fn a_started_worker_never_launches_whatever_its_world_size() {
        for world in [1, 2, 4] {
            let r = role(&flags(Some("cpu:4"), None, DeviceArg::Cpu), &worker(world, 0), || 0).unwrap();
            let expected = if world == 1 { Role::Alone(DeviceArg::Cpu) } else { Role::Worker(DeviceArg::Cpu) };
            assert_eq!(r, expected, "world size {world}");
            let r = role(&flags(None, Some("4"), DeviceArg::Cpu), &worker(world, world - 1), || 4).unwrap();
            assert!(!matches!(r, Role::Launcher(_)), "world size {world}: {r:?}");
        }
        for source in [EnvSource::Torchrun, EnvSource::Slurm] {
            let one = WorkerEnv { source, ..worker(1, 0) };
            let r = role(&flags(Some("cpu:4"), None, DeviceArg::Cpu), &one, || 0).unwrap();
            assert!(matches!(r, Role::Launcher(LaunchPlan { nproc: 4, .. })), "{source:?}: {r:?}");
            let two = WorkerEnv { source, ..worker(2, 1) };
            let err = role(&flags(None, Some("4"), DeviceArg::Cpu), &two, || 4).unwrap_err().to_string();
            assert!(err.starts_with("`--gpus 4` launches processes, but this one is rank 1 of 2"), "{err}");
            // Without the flags a worker of a job laid out elsewhere runs as its rank.
            let plain = role(&flags(None, None, DeviceArg::Cpu), &two, || 0).unwrap();
            assert_eq!(plain, Role::Worker(DeviceArg::Cpu));
        }
    }

    #[test]
    fn a_missing_cuda_device_is_refused_before_torch_sees_it() {
        let err = role(&flags(None, None, DeviceArg::Cuda(0)), &WorkerEnv::single(), || 0).unwrap_err();
        assert_eq!(
            err.to_string(),
            "`--device`: asks for CUDA device 0 and 0 CUDA device(s) are found; run with `--device cpu`"
        );
        let err = role(&flags(None, None, DeviceArg::Cuda(2)), &WorkerEnv::single(), || 2).unwrap_err();
        assert!(err.to_string().ends_with("are found; run with `--device cuda:0` to `cuda:1`, or `--device cpu`"));
        let err = role(&flags(None, Some("2"), DeviceArg::Cpu), &WorkerEnv::single(), || 1).unwrap_err();
        assert_eq!(err.to_string(), "`--gpus 2`: 1 CUDA device(s) found; run on CPU processes with `--devices cpu:2`");
    }

    /// `auto` (the default) takes the first CUDA device torch sees, else the CPU; a torchrun
    /// worker its local rank's; a CPU worker of our own launcher (`--devices cpu:N`) the CPU.
    #[test]
    fn auto_is_the_first_cuda_device_else_the_cpu() {
        let single = WorkerEnv::single();
        let auto = |gpus: usize| role(&flags(None, None, DeviceArg::Auto), &single, move || gpus).unwrap();
        assert_eq!(auto(0), Role::Alone(DeviceArg::Cpu));
        assert_eq!(auto(2), Role::Alone(DeviceArg::Cuda(0)));
        let torchrun = role(&flags(None, None, DeviceArg::Auto), &worker(2, 1), || 2).unwrap();
        assert_eq!(torchrun, Role::Worker(DeviceArg::Cuda(1)));
        let cpu_worker = role(&flags(Some("cpu:2"), None, DeviceArg::Auto), &worker(2, 1), || 2).unwrap();
        assert_eq!(cpu_worker, Role::Worker(DeviceArg::Cpu));
        let cpu_launch = role(&flags(Some("cpu:2"), None, DeviceArg::Auto), &single, || 2).unwrap();
        assert_eq!(cpu_launch, Role::Launcher(LaunchPlan { nproc: 2, cuda: false, visible: None, shared: false }));
    }

    /// `--gpus 0,0,1`: three ranks, two of them on device 0. The launcher shows each device once;
    /// each worker takes its list entry's place among them, and the job runs over Gloo (NCCL
    /// refuses two ranks on one GPU). A list without repeats stays on NCCL, rank r on device r.
    #[test]
    fn a_repeated_gpu_is_shared_over_gloo() {
        let par = flags(None, Some("0,0,1"), DeviceArg::Auto);
        let plan = role(&par, &WorkerEnv::single(), || 2).unwrap();
        assert_eq!(
            plan,
            Role::Launcher(LaunchPlan { nproc: 3, cuda: true, visible: Some("0,1".into()), shared: true })
        );
        let slots: Vec<Role> = (0..3).map(|r| role(&par, &worker(3, r), || 2).unwrap()).collect();
        assert_eq!(slots, [0, 0, 1].map(|i| Role::Worker(DeviceArg::Cuda(i))));
        assert_eq!(backend(&par, DeviceArg::Cuda(0)), Backend::Gloo);
        assert_eq!(backend(&flags(None, Some("0,1"), DeviceArg::Auto), DeviceArg::Cuda(1)), Backend::Nccl);
        assert_eq!(backend(&flags(None, Some("2"), DeviceArg::Auto), DeviceArg::Cuda(1)), Backend::Nccl);
        assert_eq!(backend(&flags(Some("cpu:2"), None, DeviceArg::Auto), DeviceArg::Cpu), Backend::Gloo);
        let missing = role(&flags(None, Some("0,0,3"), DeviceArg::Auto), &WorkerEnv::single(), || 2);
        assert!(matches!(missing, Err(LaunchFlagError::TooFewGpus { .. })), "{missing:?}");
    }
}
