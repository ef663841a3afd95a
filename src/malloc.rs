//! Allocator settings for a training process: glibc's for the CPU's tensors, torch's caching
//! allocator's for CUDA's ([`cuda_segments`]).
//!
//! libtorch's CPU tensors come from `malloc`. With glibc's defaults every buffer above the
//! (adaptive) mmap threshold is a fresh mapping whose pages the kernel faults in and zeroes on
//! first touch, and freed heap memory is trimmed back to the system, so each step pays again for
//! the activations of the last. Keeping freed memory for reuse takes the medium benchmark's
//! forward pass from 4.3–4.9 s to 2.5–3.1 s on two cores; serving the largest buffers (the LM
//! head's vocabulary-wide rows, above the 32 MiB ceiling of the mmap threshold) from the heap as
//! well takes its bf16 training step from 3.6 s to 3.2 s. The price is a resident set that stays
//! at its high-water mark instead of following the live tensors.

/// How far above its live tensors a CPU run's resident set can reach while freed memory is kept
/// (measured up to 3x: docs/performance.md); a run that could not fit at that returns it instead
/// ([`follow_live_tensors`]).
pub const KEPT_FACTOR: u64 = 3;

/// Whether the user chose allocator settings through the environment (`MALLOC_*_` or
/// `GLIBC_TUNABLES`): then dpo-train changes none.
fn user_chose() -> bool {
    std::env::vars_os().any(|(k, _)| {
        let k = k.to_string_lossy();
        (k.starts_with("MALLOC_") && k.ends_with('_')) || k == "GLIBC_TUNABLES"
    })
}

/// Serves every allocation from the heap (no per-buffer mappings) and stops trimming, unless the
/// user already chose allocator settings through the environment.
pub fn keep_freed_memory() {
    if user_chose() {
        return;
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator parameters; it is called before any thread starts.
    unsafe {
        libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
        libc::mallopt(libc::M_TOP_PAD, 256 << 20);
        libc::mallopt(libc::M_MMAP_MAX, 0);
    }
}

/// Returns freed memory to the system again, for a run whose resident set could not stay at its
/// high-water mark in this host's memory: each buffer above 64 KiB gets its own mapping, unmapped
/// when freed, and the heap's free top is trimmed, so the resident set follows the live tensors
/// (as `MALLOC_MMAP_THRESHOLD_=65536` makes it, which `make bench` measures check-gpu's estimate
/// against), at the cost of faulting pages in again each step. `false` where the user chose the
/// allocator's settings (nothing changes).
pub fn follow_live_tensors() -> bool {
    if user_chose() {
        return false;
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt and malloc_trim change allocator parameters and return free memory; glibc
    // takes its arena locks for both.
    unsafe {
        libc::mallopt(libc::M_MMAP_MAX, 65536);
        libc::mallopt(libc::M_MMAP_THRESHOLD, 64 << 10);
        libc::mallopt(libc::M_TOP_PAD, 128 << 10);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 128 << 10);
        libc::malloc_trim(0);
    }
    true
}

/// Starts a new high-water mark of this process's resident set (Linux's `/proc/self/clear_refs`);
/// `false` where the system does not offer it.
pub fn reset_peak_resident() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// The high-water mark of this process's resident set in bytes (`VmHWM`), where the system
/// reports it.
pub fn peak_resident() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Expandable segments for CUDA's caching allocator unless the user set torch's allocator
/// variables (`dpo_torch::allocator::DEFAULT_CUDA_ALLOCATOR` says why): applied by the first call,
/// at the start of `main` before any CUDA tensor; later calls say what it did.
pub fn cuda_segments() -> &'static dpo_torch::allocator::AllocatorSettings {
    static APPLIED: std::sync::OnceLock<dpo_torch::allocator::AllocatorSettings> = std::sync::OnceLock::new();
    APPLIED.get_or_init(|| dpo_torch::allocator::configure_cuda_allocator(|name| std::env::var(name).ok()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 64 MiB buffer touched after a reset raises the mark by at least as much (other tests'
    /// allocations in this process can only add to it).
    #[test]
    fn the_peak_follows_a_buffer_and_resets() {
        if !reset_peak_resident() {
            return; // not Linux
        }
        let before = peak_resident().unwrap();
        let mut buffer = vec![0u8; 64 << 20];
        buffer.iter_mut().step_by(4096).for_each(|b| *b = 1);
        let during = peak_resident().unwrap();
        assert!(during >= before + (60 << 20), "{before} -> {during}");
        drop(std::hint::black_box(buffer));
        assert!(reset_peak_resident());
    }
}
