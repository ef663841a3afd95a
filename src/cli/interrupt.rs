//! Ctrl-C and SIGTERM (a scheduler's preemption notice): the first asks the run to finish its
//! step, save a checkpoint and exit 130; a second aborts at once. A launcher instead forwards every
//! one to its workers ([`crate::dist::launcher`]), which save together.
//!
//! Signals are process-wide, so their state is too: two atomics, as ripgrep keeps its error flag.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use anyhow::Context;

use crate::dist::launcher::INTERRUPTED_EXIT;

static REQUESTED: AtomicBool = AtomicBool::new(false);
static COUNT: AtomicUsize = AtomicUsize::new(0);
static FORWARDING: AtomicBool = AtomicBool::new(false);
static TRAINING: AtomicBool = AtomicBool::new(false);
static INSTALLED: OnceLock<()> = OnceLock::new();

/// Installs the handler (once per process) and returns the flag a run polls between steps.
pub fn install() -> anyhow::Result<&'static AtomicBool> {
    if INSTALLED.get().is_none() {
        ctrlc::set_handler(on_signal).context("cannot install the Ctrl-C handler")?;
        let _ = INSTALLED.set(());
    }
    Ok(&REQUESTED)
}

fn on_signal() {
    let n = COUNT.fetch_add(1, Ordering::SeqCst) + 1;
    REQUESTED.store(true, Ordering::SeqCst);
    let forwarding = FORWARDING.load(Ordering::SeqCst);
    match (n, forwarding) {
        (1, true) => eprintln!("\ninterrupt: asking the workers to save a checkpoint and stop (Ctrl-C again to abort)"),
        (1, false) if TRAINING.load(Ordering::SeqCst) => {
            eprintln!("\ninterrupt: finishing the current step, then saving a checkpoint (Ctrl-C again to abort)")
        }
        // Reading, tokenising or loading: there is no step to finish yet.
        (1, false) => eprintln!("\ninterrupt: stopping (Ctrl-C again to abort)"),
        (_, true) => eprintln!("\ninterrupt: aborting the workers"),
        // `_exit`, not `exit`: exit's handlers tear down torch's statics under the thread still
        // running a kernel (a crash in aten's dispatcher, seen); an abort keeps no promise that
        // exit's flushing would serve.
        // SAFETY: `_exit` ends the process at once; it touches no memory of this program.
        (_, false) => unsafe { libc::_exit(INTERRUPTED_EXIT) },
    }
}

/// A stage's steps have begun: from now on an interrupt finishes the step and saves a checkpoint.
pub fn training_began() {
    TRAINING.store(true, Ordering::SeqCst);
}

/// From now on this process is a launcher: signals are counted for forwarding, not acted on.
pub fn forward_to_workers() -> &'static AtomicUsize {
    FORWARDING.store(true, Ordering::SeqCst);
    &COUNT
}
