//! Work on another thread that runs as the calling thread's would: torch keeps grad mode,
//! dispatch keys and the profiler's callbacks per thread (`at::ThreadLocalState`), and a plain
//! `std::thread` starts without them, so its operators would be missing from a profile. torch's
//! own worker threads (autograd's, `at::launch`) carry the state over the same way.

use std::ffi::c_void;
use std::thread::{Scope, ScopedJoinHandle};

use super::{TorchError, check, ffi};

/// The caller's torch state, captured for another thread.
struct Captured(*mut c_void);

// SAFETY: an `at::ThreadLocalState` is a value (copied on capture, read on entry), made to be
// carried to another thread; only one thread at a time holds this handle.
unsafe impl Send for Captured {}

impl Drop for Captured {
    fn drop(&mut self) {
        // SAFETY: the handle came from `c10d_thread_state_capture` and is freed once, here.
        unsafe { ffi::c10d_thread_state_free(self.0) }
    }
}

/// Runs `f` on a new thread of `scope`, under the calling thread's torch state.
pub fn spawn_scoped<'scope, T: Send + 'scope>(
    scope: &'scope Scope<'scope, '_>,
    f: impl FnOnce() -> T + Send + 'scope,
) -> Result<ScopedJoinHandle<'scope, T>, TorchError> {
    let mut state = std::ptr::null_mut();
    // SAFETY: `state` is a valid out-pointer; the shim catches every C++ exception.
    check("thread_state_capture", unsafe { ffi::c10d_thread_state_capture(&mut state) })?;
    let captured = Captured(state);
    Ok(scope.spawn(move || {
        let _entered = Entered::new(&captured);
        f()
    }))
}

/// The captured state, entered on this thread until dropped (a panic of the work included).
struct Entered(*mut c_void);

impl Entered {
    fn new(captured: &Captured) -> Option<Self> {
        let mut guard = std::ptr::null_mut();
        // SAFETY: `captured` is alive for the call and `guard` a valid out-pointer; a failure
        // (an allocation) leaves this thread with torch's defaults.
        let code = unsafe { ffi::c10d_thread_state_enter(captured.0, &mut guard) };
        (code == 0).then_some(Self(guard))
    }
}

impl Drop for Entered {
    fn drop(&mut self) {
        // SAFETY: the guard came from `c10d_thread_state_enter` on this thread; ended once, here.
        unsafe { ffi::c10d_thread_state_exit(self.0) }
    }
}
