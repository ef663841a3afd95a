//! A faster kernel given up on for the rest of the process when it fails, with one warning: the
//! variable-length attention and its own backward, the fused RMS-norm backward and `mm` with an
//! f32 output each have a slower way that always works, and a kernel a build of torch lacks
//! should cost speed, not the run.

use std::sync::OnceLock;

/// One fast path's state: in use until [`FastPath::give_up`] records why not.
#[derive(Debug)]
pub struct FastPath {
    /// What the warning calls the kernel (`torch's fused RMS-norm backward`).
    what: &'static str,
    /// What runs instead (`tensor operations take over`).
    instead: &'static str,
    failure: OnceLock<String>,
}

impl FastPath {
    pub const fn new(what: &'static str, instead: &'static str) -> Self {
        Self { what, instead, failure: OnceLock::new() }
    }

    /// Whether the fast path is still tried.
    pub fn usable(&self) -> bool {
        self.failure.get().is_none()
    }

    /// Why it was given up on, if it was.
    pub fn failure(&self) -> Option<&str> {
        self.failure.get().map(String::as_str)
    }

    /// Warns (the first time) and stops trying it.
    pub fn give_up(&self, error: impl std::fmt::Display) {
        let reason = error.to_string();
        if self.failure.set(reason.clone()).is_ok() {
            eprintln!("warning: {} failed ({reason}); {}", self.what, self.instead);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_given_up_on_stays_given_up_with_its_first_reason() {
        let path = FastPath::new("a kernel", "another way");
        assert!(path.usable() && path.failure().is_none());
        path.give_up("no kernel for this device");
        path.give_up("a later failure");
        assert!(!path.usable());
        assert_eq!(path.failure(), Some("no kernel for this device"));
    }
}
