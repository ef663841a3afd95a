//! The GPU check's pool (`benches/gpu/pool.rs`), which runs the sections that measure no time side
//! by side: its scheduling, on threads instead of GPU runs.

#[allow(dead_code)] // the check's own helpers (the GPU's memory) are not used here
#[path = "../../benches/gpu/pool.rs"]
mod pool;

use pool::{Job, Ledger, run_within};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

/// Jobs overlap as far as the budget and the slots allow, never further, and their results
/// come back in order; a job over the budget runs alone.
#[test]
fn jobs_overlap_within_the_budget() {
    let (now, most_seen, bytes_now, most_bytes) =
        (AtomicUsize::new(0), AtomicUsize::new(0), AtomicU64::new(0), AtomicU64::new(0));
    let sizes = [4u64, 4, 4, 9, 2, 2, 2, 2, 2];
    let jobs = sizes
        .iter()
        .enumerate()
        .map(|(i, &bytes)| {
            let (now, most_seen, bytes_now, most_bytes) = (&now, &most_seen, &bytes_now, &most_bytes);
            Job {
                bytes,
                run: Box::new(move || {
                    most_seen.fetch_max(now.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
                    most_bytes.fetch_max(bytes_now.fetch_add(bytes, Ordering::SeqCst) + bytes, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(20));
                    bytes_now.fetch_sub(bytes, Ordering::SeqCst);
                    now.fetch_sub(1, Ordering::SeqCst);
                    i
                }) as Box<dyn FnOnce() -> usize + Send>,
            }
        })
        .collect();
    let order = run_within(&Ledger::new(8, 3), jobs);
    assert_eq!(order, (0..sizes.len()).collect::<Vec<_>>());
    // The 9-byte job ran alone; otherwise at most 8 bytes and 3 jobs at once, and some overlap.
    assert_eq!(most_bytes.load(Ordering::SeqCst), 9);
    assert_eq!(most_seen.load(Ordering::SeqCst), 3);
}
