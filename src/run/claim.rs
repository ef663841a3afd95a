//! One writer per run directory. A run claims its directory before it writes there: a name the
//! run made up (the date and the config's name) is created exclusively, and made unique with a
//! suffix when another run took it in the same second; any directory is then locked (an advisory
//! `flock` on `.dpo-train.lock`, which holds the writer's PID) for as long as the run lives, so a
//! second writer (the same `--run-name`, a `--resume` of a run still going) is refused, naming the
//! directory and the process that holds it. The lock dies with its process: nothing stale is
//! left to clear by hand.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

/// The lock file inside a run directory.
pub const LOCK_FILE: &str = ".dpo-train.lock";

/// A run directory held by this process.
#[derive(Debug)]
pub struct Claim {
    pub dir: PathBuf,
    /// Whether this process created the directory (and may remove it if nothing was written).
    created: bool,
    /// The output directory above it, when this process created that too.
    created_parent: Option<PathBuf>,
    /// Held open: closing it releases the lock.
    _lock: File,
}

/// A directory another process writes, or one that cannot be claimed.
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    #[error(
        "`{dir}` is being written by another dpo-train run (process {pid}): wait for it to end, or choose another `--run-name`"
    )]
    Busy { dir: PathBuf, pid: String },
    #[error("cannot create or lock the run directory `{dir}`")]
    Io {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Claims `dir`: when its name was `generated`, a directory no other run has (`dir`, else
/// `dir-2`, `dir-3`, ...), created here; otherwise `dir` itself, created if absent. Then locks it.
pub fn claim(dir: &Path, generated: bool) -> Result<Claim, ClaimError> {
    let io = |source| ClaimError::Io { dir: dir.to_path_buf(), source };
    let parent = dir.parent().filter(|p| !p.as_os_str().is_empty() && !p.is_dir()).map(Path::to_path_buf);
    let (dir, created) = if generated {
        std::fs::create_dir_all(dir.parent().unwrap_or(Path::new("."))).map_err(io)?;
        unique(dir).map_err(io)?
    } else {
        let existed = dir.is_dir();
        std::fs::create_dir_all(dir).map_err(io)?;
        (dir.to_path_buf(), !existed)
    };
    let lock = lock(&dir)?;
    Ok(Claim { dir, created, created_parent: parent, _lock: lock })
}

impl Claim {
    /// After a run that failed before writing anything: removes the directory this process
    /// created (a refused run leaves nothing behind).
    pub fn remove_if_unused(&self) {
        if self.created {
            remove_if_unused(&self.dir);
            if let Some(parent) = &self.created_parent {
                // Only when empty: another run's directory or a cache keeps it.
                let _ = std::fs::remove_dir(parent);
            }
        }
    }
}

/// Removes `dir` if it holds nothing but a lock file.
pub fn remove_if_unused(dir: &Path) {
    let only_lock =
        std::fs::read_dir(dir).map(|entries| entries.flatten().all(|e| e.file_name() == LOCK_FILE)).unwrap_or(false);
    if only_lock {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// Creates a directory for a run whose workers will claim it (a launcher's): `dir`, or the first
/// free of `dir-2`, `dir-3`, ...
pub fn reserve(dir: &Path) -> Result<PathBuf, ClaimError> {
    let io = |source| ClaimError::Io { dir: dir.to_path_buf(), source };
    std::fs::create_dir_all(dir.parent().unwrap_or(Path::new("."))).map_err(io)?;
    unique(dir).map(|(dir, _)| dir).map_err(io)
}

/// Creates `dir`, or the first of `dir-2`, `dir-3`, ... that does not exist yet.
fn unique(dir: &Path) -> std::io::Result<(PathBuf, bool)> {
    for n in 1.. {
        let candidate = if n == 1 { dir.to_path_buf() } else { PathBuf::from(format!("{}-{n}", dir.display())) };
        match std::fs::create_dir(&candidate) {
            Ok(()) => return Ok((candidate, true)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    unreachable!("some suffix is free")
}

/// Locks `dir`'s lock file for this process and writes its PID there; `Busy` with the holder's
/// PID when another process holds it.
fn lock(dir: &Path) -> Result<File, ClaimError> {
    let path = dir.join(LOCK_FILE);
    let io = |source| ClaimError::Io { dir: dir.to_path_buf(), source };
    let mut file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&path).map_err(io)?;
    // SAFETY: flock on a file descriptor this function owns.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EWOULDBLOCK) {
            return Err(io(err));
        }
        let mut pid = String::new();
        let _ = file.read_to_string(&mut pid);
        let pid = pid.trim().to_owned();
        return Err(ClaimError::Busy {
            dir: dir.to_path_buf(),
            pid: if pid.is_empty() { "unknown".into() } else { pid },
        });
    }
    file.set_len(0).and_then(|()| file.rewind()).and_then(|()| writeln!(file, "{}", std::process::id())).map_err(io)?;
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generated_name_taken_in_the_same_second_gets_a_suffix() {
        let out = tempfile::tempdir().unwrap();
        let dir = out.path().join("20261126-101010-llama");
        let first = claim(&dir, true).unwrap();
        let second = claim(&dir, true).unwrap();
        assert_eq!((first.dir.clone(), second.dir.clone()), (dir.clone(), out.path().join("20261126-101010-llama-2")));
        assert_eq!(std::fs::read_to_string(dir.join(LOCK_FILE)).unwrap().trim(), std::process::id().to_string());
    }

    /// A second writer of one directory is refused while the first holds it, and may claim it
    /// once the first is gone. (Two claims in one process stand for two processes: `flock` locks
    /// belong to an open file, not to a process.)
    #[test]
    fn a_second_writer_is_refused_naming_the_holder() {
        let out = tempfile::tempdir().unwrap();
        let dir = out.path().join("mine");
        let first = claim(&dir, false).unwrap();
        let err = claim(&dir, false).unwrap_err().to_string();
        let want =
            format!("`{}` is being written by another dpo-train run (process {})", dir.display(), std::process::id());
        assert!(err.starts_with(&want), "{err}");
        drop(first);
        assert!(claim(&dir, false).is_ok());
    }

    #[test]
    fn an_unused_claim_leaves_nothing_behind() {
        let out = tempfile::tempdir().unwrap();
        let fresh = claim(&out.path().join("fresh"), true).unwrap();
        fresh.remove_if_unused();
        assert!(!out.path().join("fresh").exists());
        let used = claim(&out.path().join("used"), true).unwrap();
        std::fs::write(used.dir.join("metrics.csv"), "step\n").unwrap();
        used.remove_if_unused();
        assert!(out.path().join("used/metrics.csv").exists());
    }
}
