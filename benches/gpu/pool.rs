//! Work that measures no time run side by side on the one GPU (issue 33, item 6: the whole check
//! within 15 minutes). A peak of CUDA memory is each process's own caching allocator's, and a
//! loss or a parameter is the same bits however busy the GPU is, so the memory grid's runs, the
//! parity and the dist sections need not wait for each other; the timed rows (`targets`,
//! `lora8b`, `offload`) still run alone.
//!
//! What bounds the overlap is the GPU's memory: each job holds a reservation (its estimate) out
//! of a budget, and starts only when the reservations running leave room for it (or when nothing
//! runs, so a job larger than the budget still runs, alone).

use std::sync::{Condvar, Mutex};

/// One job: the GPU memory it may take, in bytes, and the work.
pub struct Job<'a, T> {
    pub bytes: u64,
    pub run: Box<dyn FnOnce() -> T + Send + 'a>,
}

/// Runs `jobs` against `ledger`, starting each (in order) when the reservations running, this
/// caller's and any other's, leave room for it; returns their results in the jobs' order.
pub fn run_within<'a, T: Send>(ledger: &Ledger, jobs: Vec<Job<'a, T>>) -> Vec<T> {
    std::thread::scope(|scope| {
        let mut handles = Vec::with_capacity(jobs.len());
        for job in jobs {
            // Admitted in order on this thread, so a large job is not passed over for ever.
            ledger.admit(job.bytes);
            handles.push(scope.spawn(move || {
                let _held = Held { ledger, bytes: job.bytes };
                (job.run)()
            }));
        }
        handles.into_iter().map(|h| h.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))).collect()
    })
}

/// The GPU's ledger for the whole check: 60% of its memory (the rest for the sections beside the
/// pooled runs, and the CUDA contexts), at most 4 runs at once (the host's cores drive them);
/// without `nvidia-smi`'s figure, one run at a time.
pub fn gpu() -> &'static Ledger {
    static GPU: std::sync::OnceLock<Ledger> = std::sync::OnceLock::new();
    GPU.get_or_init(|| Ledger::new(gpu_memory_bytes().map_or(0, |b| b / 10 * 6), 4))
}

/// A budget of bytes and of runs, and the reservations held against it now.
pub struct Ledger {
    /// (bytes, jobs) held.
    held: Mutex<(u64, usize)>,
    freed: Condvar,
    budget: u64,
    most: usize,
}

impl Ledger {
    /// `budget` bytes and at most `most` jobs at once.
    pub fn new(budget: u64, most: usize) -> Self {
        Self { held: Mutex::new((0, 0)), freed: Condvar::new(), budget, most: most.max(1) }
    }

    /// Waits until `bytes` fit beside what runs (or nothing runs) and a slot is free, then takes them.
    fn admit(&self, bytes: u64) {
        let mut held = self.held.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        while held.1 > 0 && (held.1 >= self.most || held.0.saturating_add(bytes) > self.budget) {
            held = self.freed.wait(held).unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        *held = (held.0.saturating_add(bytes), held.1 + 1);
    }
}

/// A running job's reservation, given back when the job ends (a panic included).
struct Held<'l> {
    ledger: &'l Ledger,
    bytes: u64,
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        let mut held = self.ledger.held.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        *held = (held.0.saturating_sub(self.bytes), held.1 - 1);
        self.ledger.freed.notify_all();
    }
}

/// The GPU's memory in bytes as `nvidia-smi` reports it (device 0).
pub fn gpu_memory_bytes() -> Option<u64> {
    let said = std::process::Command::new("nvidia-smi")
        .args(["--query-gpu=memory.total", "--format=csv,noheader,nounits", "-i", "0"])
        .output()
        .ok()?;
    let mib: u64 = String::from_utf8_lossy(&said.stdout).lines().next()?.trim().parse().ok()?;
    Some(mib << 20)
}
