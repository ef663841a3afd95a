//! Atomic file and directory writes: outputs appear whole or not at all.

use std::io::Write;
use std::path::{Path, PathBuf};

/// A filesystem operation that failed, naming the file.
#[derive(Debug, thiserror::Error)]
#[error("cannot {action} `{path}`")]
pub struct FileError {
    /// What was attempted ("read", "create", "write", "rename into place", ...).
    pub action: &'static str,
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

impl FileError {
    pub fn new(action: &'static str, path: &Path, source: std::io::Error) -> Self {
        Self { action, path: path.to_path_buf(), source }
    }
}

/// Writes `data` to a temporary file beside `path` (creating the directory), syncs it, and
/// renames it over `path`.
pub fn write_atomic(path: &Path, data: &[u8]) -> std::io::Result<()> {
    write_atomic_with(path, |tmp| std::fs::File::create(tmp)?.write_all(data))
}

/// As [`write_atomic`], the file's content written by `write` to the temporary path it is given
/// (for writers that stream a large file rather than hold it in memory).
pub fn write_atomic_with(path: &Path, write: impl FnOnce(&Path) -> std::io::Result<()>) -> std::io::Result<()> {
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    let result = (|| {
        write(&tmp)?;
        std::fs::File::open(&tmp)?.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        // Best effort: the write already failed, and that error is the one to report.
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Replaces directory `dest` by the finished directory `staged` (same filesystem) in one rename;
/// an existing `dest` is moved aside first and removed after.
pub fn replace_dir(staged: &Path, dest: &Path) -> std::io::Result<()> {
    if dest.exists() {
        let old = dest.with_extension(format!("old-{}", std::process::id()));
        std::fs::rename(dest, &old)?;
        std::fs::rename(staged, dest)?;
        std::fs::remove_dir_all(&old)
    } else {
        std::fs::rename(staged, dest)
    }
}

/// Removes what writers that died left in `dir`: the temporary files of [`write_atomic`]
/// (`.NAME.tmp-PID`) and directories staged by PID (`.NAME.tmp-PID/`) whose process is gone.
/// Returns what it removed. A live writer's files are left alone.
pub fn remove_stale_temps(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut removed = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.rsplit_once(".tmp-").and_then(|(_, pid)| pid.parse::<u32>().ok()) else { continue };
        if !name.starts_with('.') || process_alive(pid) {
            continue;
        }
        let path = entry.path();
        let gone = if path.is_dir() { std::fs::remove_dir_all(&path) } else { std::fs::remove_file(&path) };
        if gone.is_ok() {
            removed.push(path);
        }
    }
    removed
}

/// Checks that directory `dir` exists or can be made: its nearest existing ancestor is a
/// directory, not a file. Said before a run writes anything, where `create_dir_all` later would
/// fail with its files half made.
pub fn check_dir_creatable(dir: &Path) -> Result<(), String> {
    for at in dir.ancestors().filter(|a| !a.as_os_str().is_empty()) {
        match std::fs::metadata(at) {
            Ok(m) if m.is_dir() => return Ok(()),
            Ok(_) => return Err(format!("`{}` is a file, not a directory", at.display())),
            // A path through a file reads as not a directory; the file itself is named above.
            Err(e) if matches!(e.kind(), std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory) => continue,
            Err(e) => return Err(format!("cannot read `{}`: {e}", at.display())),
        }
    }
    Ok(())
}

/// Whether process `pid` runs on this machine (Linux: it has a `/proc` entry).
pub fn process_alive(pid: u32) -> bool {
    pid == std::process::id() || Path::new("/proc").join(pid.to_string()).exists()
}

#[cfg(test)]
mod temp_tests {
    use super::*;

    #[test]
    fn a_directory_under_a_file_cannot_be_made() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("afile");
        std::fs::write(&file, b"x").unwrap();
        assert_eq!(check_dir_creatable(&dir.path().join("new/deeper")), Ok(()));
        assert_eq!(check_dir_creatable(Path::new("relative/dir")), Ok(()));
        let err = check_dir_creatable(&file.join("tb/dpo")).unwrap_err();
        assert_eq!(err, format!("`{}` is a file, not a directory", file.display()));
    }

    #[test]
    fn a_dead_writer_s_temporary_files_are_removed_and_a_live_one_s_kept() {
        let dir = tempfile::tempdir().unwrap();
        // PIDs above the kernel's maximum (4194304) are never alive.
        let dead = dir.path().join(".x.tokens.tmp-4999999");
        let live = dir.path().join(format!(".y.tokens.tmp-{}", std::process::id()));
        let staged = dir.path().join(".step-3.tmp-4999998");
        std::fs::write(&dead, b"half").unwrap();
        std::fs::write(&live, b"being written").unwrap();
        std::fs::create_dir(&staged).unwrap();
        std::fs::write(dir.path().join("kept.tokens"), b"whole").unwrap();
        let mut removed = remove_stale_temps(dir.path());
        removed.sort();
        assert_eq!(removed, vec![staged, dead]);
        assert!(live.exists() && dir.path().join("kept.tokens").exists());
    }
}
