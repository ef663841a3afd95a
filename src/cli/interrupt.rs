//! Ctrl-C and SIGTERM (a scheduler's preemption notice): the first asks the run to finish its
//! step, save a checkpoint and exit 130; a second aborts at once. A launcher instead forwards every
//! one to its workers ([`crate::dist::launcher`]), which save together.
//!
//! A worker can be sent one request twice: by its launcher and directly, when the signal goes to
//! every process of the job (SLURM's `scancel` and its preemption or time-limit SIGTERM signal
//! every process of a job step; a terminal's Ctrl-C reaches torchrun's workers, and torchrun
//! forwards a SIGTERM too). So in a worker a signal within [`SAME_REQUEST`] of the first is that
//! request again, not the abort, which would lose the checkpoint the first one asked for.
//!
//! Signals are process-wide, so their state is too: atomics, as ripgrep keeps its error flag.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::dist::launcher::INTERRUPTED_EXIT;

static REQUESTED: AtomicBool = AtomicBool::new(false);
static COUNT: AtomicUsize = AtomicUsize::new(0);
static FORWARDING: AtomicBool = AtomicBool::new(false);
static TRAINING: AtomicBool = AtomicBool::new(false);
static SAVES: AtomicBool = AtomicBool::new(false);
static INSTALLED: OnceLock<()> = OnceLock::new();
static WORKER: AtomicBool = AtomicBool::new(false);
static FIRST: OnceLock<Instant> = OnceLock::new();
static AT_ONCE: AtomicBool = AtomicBool::new(false);

/// How long after a worker's first signal another counts as the same request delivered twice (a
/// launcher forwards within its 50 ms poll; a scheduler signals every process at once).
pub const SAME_REQUEST: Duration = Duration::from_secs(2);

/// Installs the handler for a training run (its workers save a checkpoint on a stop request),
/// returning the flag it polls between steps.
pub fn install_for_training() -> anyhow::Result<&'static AtomicBool> {
    SAVES.store(true, Ordering::SeqCst);
    install()
}

/// Installs the handler (once per process) and returns the flag a run polls between steps.
pub fn install() -> anyhow::Result<&'static AtomicBool> {
    if INSTALLED.get().is_none() {
        ctrlc::set_handler(on_signal).context("cannot install the Ctrl-C handler")?;
        let _ = INSTALLED.set(());
    }
    Ok(&REQUESTED)
}

/// Installs the handler for a command with nothing to save or finish (`eval`, `generate` in one
/// process): an interrupt says so and exits 130 at once, where the default signal death said
/// nothing.
pub fn install_to_stop() -> anyhow::Result<()> {
    AT_ONCE.store(true, Ordering::SeqCst);
    install().map(|_| ())
}

fn on_signal() {
    if AT_ONCE.load(Ordering::SeqCst) && !FORWARDING.load(Ordering::SeqCst) {
        eprintln!("\ninterrupt: stopped");
        // SAFETY: as below: `_exit` ends the process at once and touches no memory of this program.
        unsafe { libc::_exit(INTERRUPTED_EXIT) }
    }
    let first = *FIRST.get_or_init(Instant::now);
    if COUNT.load(Ordering::SeqCst) > 0 && WORKER.load(Ordering::SeqCst) && first.elapsed() < SAME_REQUEST {
        eprintln!("\ninterrupt: already stopping (the request reached this worker twice)");
        return;
    }
    let n = COUNT.fetch_add(1, Ordering::SeqCst) + 1;
    REQUESTED.store(true, Ordering::SeqCst);
    let forwarding = FORWARDING.load(Ordering::SeqCst);
    match (n, forwarding) {
        (1, true) if SAVES.load(Ordering::SeqCst) => {
            eprintln!("\ninterrupt: asking the workers to save a checkpoint and stop (Ctrl-C again to abort)")
        }
        // `generate`'s workers keep what they wrote and stop.
        (1, true) => eprintln!("\ninterrupt: asking the workers to stop (Ctrl-C again to abort)"),
        (1, false) if TRAINING.load(Ordering::SeqCst) => {
            eprintln!("\ninterrupt: finishing the current step, then saving a checkpoint (Ctrl-C again to abort)")
        }
        // Reading, tokenising or loading: there is no step to finish yet.
        (1, false) => eprintln!("\ninterrupt: stopping (Ctrl-C again to abort)"),
        (_, true) => eprintln!("\ninterrupt: aborting the workers"),
        // `_exit`, not `exit`: exit's handlers tear down torch's statics under the thread still
        // running a kernel (a crash in aten's dispatcher, seen); an abort keeps no promise that
        // exit's flushing would serve.
        (_, false) => {
            match TRAINING.load(Ordering::SeqCst) {
                true => eprintln!("\ninterrupt: aborted; the steps since the last checkpoint were not saved"),
                false => eprintln!("\ninterrupt: aborted before training began"),
            }
            // SAFETY: `_exit` ends the process at once; it touches no memory of this program.
            unsafe { libc::_exit(INTERRUPTED_EXIT) }
        }
    }
}

/// A stage's steps have begun: from now on an interrupt finishes the step and saves a checkpoint.
pub fn training_began() {
    TRAINING.store(true, Ordering::SeqCst);
}

/// This process is one rank of a job another process launched (ours, torchrun or SLURM's): see
/// [`SAME_REQUEST`].
pub fn as_worker() {
    WORKER.store(true, Ordering::SeqCst);
}

/// From now on this process is a launcher: signals are counted for forwarding, not acted on.
pub fn forward_to_workers() -> &'static AtomicUsize {
    FORWARDING.store(true, Ordering::SeqCst);
    &COUNT
}
