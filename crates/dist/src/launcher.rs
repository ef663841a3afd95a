//! One worker process per rank, like `torchrun --nproc-per-node N`: each worker re-executes this
//! binary with the same arguments and torchrun's variables (`RANK`, `LOCAL_RANK`, `WORLD_SIZE`,
//! `MASTER_ADDR`, `MASTER_PORT`), which [`super::env::detect`] reads back. The launched binary must
//! therefore check [`super::env::detect`] before launching, or it would launch again.
//!
//! Local rank 0's stdout and stderr appear live; the other ranks' stdout is dropped and the last
//! lines of their stderr are kept for the error report. When a worker fails, the others are killed
//! (torchrun's default "fail fast"), so one lost rank cannot leave the rest waiting on a collective.
//!
//! Interrupts: the workers run in their own process group, so a Ctrl-C at the terminal reaches
//! only the launcher, which forwards each SIGINT (or SIGTERM) it gets to every worker once; the
//! workers agree to stop, save one checkpoint together and exit 130, and the launch reports
//! [`LaunchOutcome::Interrupted`]. A worker dies with its launcher (`PR_SET_PDEATHSIG`), so a
//! killed launcher never leaves workers behind.
//!
//! Hangs: each worker keeps its latest collective in a flight record ([`super::flight`]) in a
//! directory the launcher names. When a worker fails, or one is frozen for the timeout
//! ([`super::watch`]), the error carries one line per rank saying where each one is.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::flight;
use super::watch::{self, Liveness, Watchdog};

/// Lines of each worker's stderr kept for the error report.
const KEPT_LINES: usize = 20;
/// How often the monitor checks the workers.
const POLL: Duration = Duration::from_millis(50);
/// How long to wait for a finished worker's last stderr lines.
const READER_GRACE: Duration = Duration::from_secs(2);
/// How long a rank's refusal waits for the shown rank's (every rank checks the same input).
const REFUSAL_GRACE: Duration = Duration::from_secs(2);

/// The variable that carries the per-rank thread count to dpo-train (besides `OMP_NUM_THREADS`).
pub const THREADS_VAR: &str = "DPO_TRAIN_THREADS";
/// torch.distributed's default collective timeout, for launches that name none.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1800);
/// The exit code of a process stopped by an interrupt (128 + SIGINT, as shells report it).
pub const INTERRUPTED_EXIT: i32 = 130;

/// How a launch ended when no worker failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LaunchOutcome {
    /// Every worker finished.
    Finished,
    /// The workers stopped on an interrupt (exit 130), after saving.
    Interrupted,
    /// A second interrupt killed the workers: nothing since their last checkpoint was saved.
    Aborted,
}

/// This node's part of a multi-node job (`torchrun --nnodes --node-rank --master-addr
/// --master-port`). Global rank = `node_rank * nproc_per_node + local_rank`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSpec {
    /// Nodes in the job.
    pub nnodes: usize,
    /// This node's index in `0..nnodes`; node 0 hosts global rank 0 and the rendezvous store.
    pub node_rank: usize,
    /// Workers (GPUs) per node.
    pub nproc_per_node: usize,
    /// Address of node 0, reachable from every node.
    pub master_addr: String,
    /// A free port on node 0.
    pub master_port: u16,
    /// The collective timeout (`ddp_timeout`): a worker frozen this long ends the job.
    pub timeout: Duration,
}

impl NodeSpec {
    /// A single-node job of `nproc` workers on a free local port.
    pub fn local(nproc: usize) -> Result<Self, LaunchError> {
        Ok(Self {
            nnodes: 1,
            node_rank: 0,
            nproc_per_node: nproc,
            master_addr: "127.0.0.1".into(),
            master_port: free_port()?,
            timeout: DEFAULT_TIMEOUT,
        })
    }

    /// Processes in the whole job.
    pub fn world_size(&self) -> usize {
        self.nnodes * self.nproc_per_node
    }

    /// The global rank of this node's worker `local_rank`.
    pub fn global_rank(&self, local_rank: usize) -> usize {
        self.node_rank * self.nproc_per_node + local_rank
    }
}

/// Why a launch failed.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("invalid launch: {0}")]
    Invalid(String),
    #[error("could not find a free port on 127.0.0.1")]
    NoFreePort(#[source] std::io::Error),
    #[error("could not find the path of the running executable")]
    CurrentExe(#[source] std::io::Error),
    #[error("could not start rank {rank}")]
    Spawn {
        rank: usize,
        #[source]
        source: std::io::Error,
    },
    #[error("could not wait for rank {rank}")]
    Wait {
        rank: usize,
        #[source]
        source: std::io::Error,
    },
    /// A worker failed; the others were killed. `report` has one line per rank of this node;
    /// `echoed`: the worker's stderr was shown as it ran (this node's first rank).
    #[error("rank {rank} failed ({status}); its last stderr line: `{last_line}`")]
    RankFailed { rank: usize, status: String, code: Option<i32>, last_line: String, report: Vec<String>, echoed: bool },
    /// A worker was frozen, or stuck in one collective, past the timeout; every worker was killed.
    #[error("the job stopped making progress: {reason}")]
    Hung { reason: String, report: Vec<String> },
}

impl LaunchError {
    /// Whether rank 0 failed because the rendezvous port was taken before it could listen there
    /// ([`free_port`]'s race): nothing ran yet, and another port may be tried.
    pub fn port_taken(&self) -> bool {
        matches!(self, Self::RankFailed { rank: 0, last_line, .. } if says_port_taken(last_line))
    }

    /// Whether the error is already on the terminal: a rank whose stderr was shown refused its
    /// input (exit 1) and said why in one line, which repeating would make two.
    pub fn already_said(&self) -> bool {
        matches!(self, Self::RankFailed { echoed: true, code: Some(1), .. })
    }

    /// Where each rank of this node was when the job ended (empty for other errors).
    pub fn report(&self) -> &[String] {
        match self {
            LaunchError::RankFailed { report, .. } | LaunchError::Hung { report, .. } => report,
            _ => &[],
        }
    }
}

/// Runs `world_size` workers of this binary on this machine and waits for all of them.
///
/// `per_rank_env(rank)` adds variables to one worker (e.g. `CUDA_VISIBLE_DEVICES`); `args` are
/// the worker's arguments (normally this process's own, `std::env::args_os().skip(1)`).
pub fn launch(
    world_size: usize,
    per_rank_env: impl Fn(usize) -> Vec<(String, String)>,
    args: &[OsString],
) -> Result<LaunchOutcome, LaunchError> {
    launch_node(&NodeSpec::local(world_size)?, per_rank_env, args, &AtomicUsize::new(0))
}

/// Runs this node's `nproc_per_node` workers of a (possibly multi-node) job and waits for them.
/// Each increment of `interrupts` (the launcher's own Ctrl-C / SIGTERM count) is forwarded to
/// every worker as one SIGINT.
pub fn launch_node(
    spec: &NodeSpec,
    per_rank_env: impl Fn(usize) -> Vec<(String, String)>,
    args: &[OsString],
    interrupts: &AtomicUsize,
) -> Result<LaunchOutcome, LaunchError> {
    let program = std::env::current_exe().map_err(LaunchError::CurrentExe)?;
    run_workers(&program, spec, &per_rank_env, args, interrupts)
}

/// Tries on fresh ports when the one [`free_port`] gave was taken before the store listened.
pub const PORT_TRIES: usize = 3;

/// Whether c10d's error `message` says the store could not listen because its port was taken.
pub fn says_port_taken(message: &str) -> bool {
    message.contains("EADDRINUSE")
}

/// A free TCP port on 127.0.0.1 (bound and released; another process could take it in between,
/// the usual race of torchrun's `--master-port=0` too).
pub fn free_port() -> Result<u16, LaunchError> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(LaunchError::NoFreePort)?;
    Ok(listener.local_addr().map_err(LaunchError::NoFreePort)?.port())
}

/// A running worker and the reader of its stderr.
struct Worker {
    rank: usize,
    child: Child,
    stderr_tail: Arc<Mutex<VecDeque<String>>>,
    /// Its stderr is shown as it runs (this node's first rank).
    echoed: bool,
    reader: Option<JoinHandle<()>>,
}

impl Worker {
    fn last_line(&mut self) -> String {
        if let Some(reader) = self.reader.take() {
            // The reader ends at EOF, shortly after the worker exits, unless a process the worker
            // started still holds the pipe: then wait a bounded time and report what was read.
            let deadline = Instant::now() + READER_GRACE;
            while !reader.is_finished() && Instant::now() < deadline {
                std::thread::sleep(POLL);
            }
            if reader.is_finished() {
                // A panic in the reader only loses lines.
                let _ = reader.join();
            }
        }
        let tail = self.stderr_tail.lock().map(|t| t.back().cloned()).unwrap_or_default();
        tail.unwrap_or_default()
    }
}

fn run_workers(
    program: &Path,
    spec: &NodeSpec,
    per_rank_env: &dyn Fn(usize) -> Vec<(String, String)>,
    args: &[OsString],
    interrupts: &AtomicUsize,
) -> Result<LaunchOutcome, LaunchError> {
    if spec.nproc_per_node == 0 || spec.nnodes == 0 {
        return Err(LaunchError::Invalid("at least one node and one process per node are needed".into()));
    }
    if spec.node_rank >= spec.nnodes {
        return Err(LaunchError::Invalid(format!(
            "node rank {} is not below the node count {}",
            spec.node_rank, spec.nnodes
        )));
    }
    let records = FlightDir::create()?;
    let mut workers: Vec<Worker> = Vec::with_capacity(spec.nproc_per_node);
    for local_rank in 0..spec.nproc_per_node {
        // Ctrl-C while the workers start: no more are started, and those started end.
        if interrupts.load(Ordering::SeqCst) > 0 {
            kill_all(&mut workers);
            return Ok(LaunchOutcome::Interrupted);
        }
        match Worker::spawn(program, spec, local_rank, per_rank_env, args, &records.0) {
            Ok(worker) => workers.push(worker),
            Err(err) => {
                kill_all(&mut workers);
                return Err(err);
            }
        }
    }
    supervise(workers, interrupts, spec.timeout, &records.0)
}

/// The directory of the workers' flight records, removed with the launch.
struct FlightDir(PathBuf);

impl FlightDir {
    fn create() -> Result<Self, LaunchError> {
        // One process may run several launches (tests do, in parallel).
        static LAUNCHES: AtomicUsize = AtomicUsize::new(0);
        let n = LAUNCHES.fetch_add(1, Ordering::SeqCst);
        let dir = std::env::temp_dir().join(format!("dpo-train-flight-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir)
            .map_err(|e| LaunchError::Invalid(format!("cannot create `{}`: {e}", dir.display())))?;
        Ok(Self(dir))
    }
}

impl Drop for FlightDir {
    fn drop(&mut self) {
        // Only diagnostics live here: a directory that cannot be removed costs a few bytes of /tmp.
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Worker {
    /// Starts local rank `local_rank` with torchrun's environment; rank 0's output is the
    /// launcher's, the others' stderr is kept for the error that names a failed rank.
    fn spawn(
        program: &Path,
        spec: &NodeSpec,
        local_rank: usize,
        per_rank_env: &dyn Fn(usize) -> Vec<(String, String)>,
        args: &[OsString],
        records: &Path,
    ) -> Result<Self, LaunchError> {
        let cores = std::thread::available_parallelism().map(usize::from).unwrap_or(1);
        let threads = worker_threads(std::env::var("OMP_NUM_THREADS").ok().as_deref(), cores, spec.nproc_per_node);
        let threads = threads.to_string();
        let rank = spec.global_rank(local_rank);
        let mut cmd = Command::new(program);
        cmd.args(args)
            .env("RANK", rank.to_string())
            .env("LOCAL_RANK", local_rank.to_string())
            .env("WORLD_SIZE", spec.world_size().to_string())
            .env("MASTER_ADDR", &spec.master_addr)
            .env("MASTER_PORT", spec.master_port.to_string())
            .env("OMP_NUM_THREADS", &threads)
            .env(THREADS_VAR, &threads)
            .env(flight::DIR_VAR, records)
            .envs(per_rank_env(rank))
            .stdin(Stdio::null())
            .stdout(if local_rank == 0 { Stdio::inherit() } else { Stdio::null() })
            .stderr(Stdio::piped())
            // Its own process group: a terminal's Ctrl-C reaches the launcher only, which forwards it once.
            .process_group(0);
        // SAFETY: `prctl` is async-signal-safe and touches no memory of the parent; it runs in the
        // forked child before `exec`.
        unsafe {
            cmd.pre_exec(|| {
                // Die with the launcher (it is the only one that watches the workers).
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn().map_err(|source| LaunchError::Spawn { rank, source })?;
        let stderr_tail = Arc::new(Mutex::new(VecDeque::with_capacity(KEPT_LINES)));
        let reader = child.stderr.take().map(|pipe| {
            let tail = Arc::clone(&stderr_tail);
            let echo = local_rank == 0;
            std::thread::spawn(move || keep_tail(pipe, &tail, echo))
        });
        Ok(Self { rank, child, stderr_tail, reader, echoed: local_rank == 0 })
    }
}

/// Torch threads a worker gets: the launcher's own `OMP_NUM_THREADS` where it is a positive
/// count (the user's or check-gpu's choice, which torchrun keeps too), else an equal share of the
/// cores.
fn worker_threads(omp_num_threads: Option<&str>, cores: usize, nproc: usize) -> usize {
    match omp_num_threads.and_then(|t| t.trim().parse::<usize>().ok()) {
        Some(threads) if threads > 0 => threads,
        _ => (cores / nproc).max(1),
    }
}

/// Waits for every worker, forwarding each new interrupt; the first rank to fail, or one frozen
/// past `timeout`, stops them all.
fn supervise(
    mut workers: Vec<Worker>,
    interrupts: &AtomicUsize,
    timeout: Duration,
    records: &Path,
) -> Result<LaunchOutcome, LaunchError> {
    let mut exits: Vec<Option<ExitStatus>> = vec![None; workers.len()];
    let mut watchdog = Watchdog::new(workers.len(), timeout);
    let mut forwarded = 0;
    while exits.iter().any(Option::is_none) {
        let asked = interrupts.load(Ordering::SeqCst);
        if asked >= 2 {
            // A second Ctrl-C aborts, however close behind the first: forwarded one by one, two
            // quick signals could reach a worker as one and it would save and exit as asked once.
            kill_all(&mut workers);
            return Ok(LaunchOutcome::Aborted);
        }
        if asked > forwarded {
            forwarded = asked;
            signal_running(&workers, &exits, libc::SIGINT);
        }
        for (worker, exit) in workers.iter_mut().zip(exits.iter_mut()).filter(|(_, e)| e.is_none()) {
            match worker.child.try_wait() {
                Ok(status) => *exit = status,
                Err(source) => {
                    let rank = worker.rank;
                    kill_all(&mut workers);
                    return Err(LaunchError::Wait { rank, source });
                }
            }
        }
        // Every rank stops on an interrupt together (they agree before each step): 130 is no failure.
        // A worker the interrupt reached before it could handle it (still starting) ended by the
        // signal itself: the job stops, as asked, with nothing to save.
        if forwarded > 0 && exits.iter().flatten().any(|s| s.signal() == Some(libc::SIGINT)) {
            kill_all(&mut workers);
            return Ok(LaunchOutcome::Interrupted);
        }
        let failed = exits.iter().position(|e| e.is_some_and(|s| !s.success() && s.code() != Some(INTERRUPTED_EXIT)));
        if let Some(i) = failed {
            let i = prefer_shown(&mut workers, &mut exits, i);
            let report = report(&workers, &exits, records);
            let (rank, status, last_line) = (workers[i].rank, exits[i].map(describe), workers[i].last_line());
            let code = exits[i].and_then(|s| s.code());
            let echoed = workers[i].echoed;
            kill_all(&mut workers);
            let status = status.unwrap_or_default();
            return Err(LaunchError::RankFailed { rank, status, code, last_line, report, echoed });
        }
        let running: Vec<(usize, usize, u32)> = workers
            .iter()
            .enumerate()
            .filter(|(i, _)| exits[*i].is_none())
            .map(|(i, w)| (i, w.rank, w.child.id()))
            .collect();
        if let Some(reason) = watchdog.check(records, &running) {
            let report = report(&workers, &exits, records);
            kill_all(&mut workers);
            return Err(LaunchError::Hung { reason, report });
        }
        std::thread::sleep(POLL);
    }
    for worker in &mut workers {
        worker.last_line();
    }
    let interrupted = exits.iter().flatten().any(|s| s.code() == Some(INTERRUPTED_EXIT));
    Ok(if interrupted { LaunchOutcome::Interrupted } else { LaunchOutcome::Finished })
}

/// Of ranks refusing their input (exit 1), the one whose stderr is shown, which has said why:
/// `failed` unless the shown rank also refuses within [`REFUSAL_GRACE`].
fn prefer_shown(workers: &mut [Worker], exits: &mut [Option<ExitStatus>], failed: usize) -> usize {
    let refused = |e: &Option<ExitStatus>| e.is_some_and(|s| s.code() == Some(1));
    let Some(shown) = workers.iter().position(|w| w.echoed) else { return failed };
    if shown == failed || !refused(&exits[failed]) {
        return failed;
    }
    let deadline = Instant::now() + REFUSAL_GRACE;
    while exits[shown].is_none() && Instant::now() < deadline {
        std::thread::sleep(POLL);
        exits[shown] = workers[shown].child.try_wait().ok().flatten();
    }
    if refused(&exits[shown]) { shown } else { failed }
}

/// One line per worker: running, stopped or exited, and where its flight record last saw it.
fn report(workers: &[Worker], exits: &[Option<ExitStatus>], records: &Path) -> Vec<String> {
    let ranks: Vec<(usize, Liveness)> = workers
        .iter()
        .zip(exits)
        .map(|(w, exit)| {
            let live = match exit {
                Some(status) => Liveness::Exited(describe(*status)),
                None if watch::is_stopped(w.child.id()) => Liveness::Stopped,
                None => Liveness::Running,
            };
            (w.rank, live)
        })
        .collect();
    watch::report(records, &ranks)
}

/// Sends `signal` to every worker still running.
fn signal_running(workers: &[Worker], exits: &[Option<ExitStatus>], signal: i32) {
    for (worker, _) in workers.iter().zip(exits).filter(|(_, e)| e.is_none()) {
        if let Ok(pid) = i32::try_from(worker.child.id()) {
            // SAFETY: `kill` has no memory effects; the pid is our unreaped child, so it cannot
            // have been reused by another process.
            unsafe { libc::kill(pid, signal) };
        }
    }
}

/// Copies a worker's stderr line by line into `tail` (the last [`KEPT_LINES`]), echoing it to
/// this process's stderr when `echo`.
fn keep_tail(pipe: impl std::io::Read, tail: &Mutex<VecDeque<String>>, echo: bool) {
    for line in BufReader::new(pipe).lines() {
        let Ok(line) = line else { break };
        if echo {
            // A closed stderr of the launcher must not stop the worker's pipe from draining.
            let _ = writeln!(std::io::stderr().lock(), "{line}");
        }
        if let Ok(mut tail) = tail.lock() {
            if tail.len() == KEPT_LINES {
                tail.pop_front();
            }
            tail.push_back(line);
        }
    }
}

/// Kills and reaps every worker still running.
fn kill_all(workers: &mut [Worker]) {
    for worker in workers.iter_mut() {
        if matches!(worker.child.try_wait(), Ok(None)) {
            // Already gone between the check and the kill is fine: the wait below reaps it.
            let _ = worker.child.kill();
        }
    }
    for worker in workers.iter_mut() {
        let _ = worker.child.wait();
        worker.last_line();
    }
}

/// `exit code 3`, or `killed by signal 9`.
fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(signal)) => format!("killed by signal {signal}"),
        (None, None) => status.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn global_ranks_of_a_multi_node_job() {
        let spec = NodeSpec {
            nnodes: 3,
            node_rank: 2,
            nproc_per_node: 4,
            master_addr: "n0".into(),
            master_port: 29500,
            timeout: DEFAULT_TIMEOUT,
        };
        assert_eq!(spec.world_size(), 12);
        assert_eq!((0..4).map(|l| spec.global_rank(l)).collect::<Vec<_>>(), vec![8, 9, 10, 11]);
    }

    /// Rank 0's last line when another process took the port first (as c10d said it in a run of
    /// the suite under load): a launch to try again on another port; any other failure is not.
    #[test]
    fn a_taken_rendezvous_port_is_told_apart() {
        let failed = |rank, last_line: &str| LaunchError::RankFailed {
            rank,
            status: "exit code 2".into(),
            code: Some(2),
            last_line: last_line.into(),
            report: Vec::new(),
            echoed: rank == 0,
        };
        let taken = "error: c10d `init_process_group` failed (code 2): rendezvous: The server socket has failed to \
                     listen on any local network address. port: 41715, useIpv6: false, code: -98, name: EADDRINUSE, \
                     message: address already in use";
        assert!(failed(0, taken).port_taken());
        assert!(!failed(1, taken).port_taken() && !failed(0, "error: cannot read `x`").port_taken());
    }

    #[test]
    fn a_set_thread_count_is_kept_and_otherwise_the_cores_are_shared() {
        assert_eq!(worker_threads(Some("3"), 16, 2), 3);
        assert_eq!(worker_threads(None, 16, 2), 8);
        assert_eq!(worker_threads(None, 2, 3), 1);
        for unusable in ["0", "", "four", "-2"] {
            assert_eq!(worker_threads(Some(unusable), 16, 4), 4, "{unusable:?}");
        }
    }

    #[test]
    fn invalid_specs_are_rejected_before_spawning() {
        let spec = NodeSpec {
            nnodes: 2,
            node_rank: 2,
            nproc_per_node: 1,
            master_addr: "n0".into(),
            master_port: 1,
            timeout: DEFAULT_TIMEOUT,
        };
        let err = launch_node(&spec, |_| Vec::new(), &[], &AtomicUsize::new(0)).unwrap_err();
        assert_eq!(err.to_string(), "invalid launch: node rank 2 is not below the node count 2");
        assert!(free_port().unwrap() > 0);
    }
}
