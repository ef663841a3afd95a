//! Run reports: the metrics CSV, PNG plots and sample generations.
//!
//! A run directory holds `metrics.csv` ([`MetricsWriter`], one row per logged step and per
//! evaluation, with TRL's metric names), the PNG plots drawn from it ([`render_run`],
//! [`render_comparison`]) and the `samples_*.txt` files ([`write_samples`]). Every file except
//! the append-only CSV is written to `<name>.tmp` first and renamed, so a reader never sees half
//! a file.

pub mod metrics;
pub mod plot;
pub mod samples;

use std::path::{Path, PathBuf};

pub use metrics::{METRIC_NAMES, METRICS_FILE, MetricsRow, MetricsWriter, Split, read_metrics};
pub use plot::{
    DASHBOARD_SIZE, PLOT_FILES, PLOT_SIZE, PlotMeta, ema, ema_alpha, plot_meta_from_run, render_comparison, render_run,
};
pub use samples::{Sample, write_samples};

/// Errors from writing and reading run reports; each names the file it concerns.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// A filesystem operation failed.
    #[error("Failed to {action} `{path}`")]
    Io {
        /// What was attempted ("read", "create", "write", "rename into place", ...).
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The CSV layer failed to read or write a record.
    #[error("Malformed CSV in `{path}` at line {line}")]
    Csv {
        path: PathBuf,
        line: u64,
        #[source]
        source: csv::Error,
    },
    /// The first line of an existing `metrics.csv` is not the header this version writes.
    #[error("Unexpected header in `{path}`: expected `{expected}`, found `{found}`")]
    Header { path: PathBuf, expected: String, found: String },
    /// A row has the wrong number of fields.
    #[error("Row at line {line} of `{path}` has {found} fields, expected {expected}")]
    FieldCount { path: PathBuf, line: u64, found: usize, expected: usize },
    /// A cell does not parse as its column's type.
    #[error("Invalid value `{value}` in column `{column}` at line {line} of `{path}`")]
    Value { path: PathBuf, line: u64, column: &'static str, value: String },
    /// A row handed to [`MetricsWriter::append`] does not carry exactly the 11 TRL metrics.
    #[error("Metrics row for step {step} has {found} metric values, expected {expected} for `{path}`")]
    MetricCount { path: PathBuf, step: u64, found: usize, expected: usize },
    /// plotters failed to draw an image.
    #[error("Failed to draw `{path}`")]
    Draw {
        path: PathBuf,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The font embedded in the binary could not be loaded (a build defect, not a user error).
    #[error("The embedded font `assets/fonts/DejaVuSans.ttf` is not a valid TrueType font")]
    Font,
}

impl ReportError {
    fn io(action: &'static str, path: &Path, source: std::io::Error) -> Self {
        Self::Io { action, path: path.to_path_buf(), source }
    }
}

/// `<path>.tmp`: the name a file is written under before it is renamed into place.
fn tmp_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_os_string();
    name.push(".tmp");
    PathBuf::from(name)
}

/// Writes `bytes` to `path` atomically (see [`crate::fsutil::write_atomic`]).
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), ReportError> {
    crate::fsutil::write_atomic(path, bytes).map_err(|e| ReportError::io("write", path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_write_leaves_no_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.txt");
        write_atomic(&path, b"one").unwrap();
        write_atomic(&path, b"two").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, ["a.txt"]);
    }

    #[test]
    fn io_error_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let not_a_dir = dir.path().join("file");
        std::fs::write(&not_a_dir, b"").unwrap();
        let path = not_a_dir.join("x.png");
        let err = write_atomic(&path, b"").unwrap_err();
        assert_eq!(err.to_string(), format!("Failed to write `{}`", path.display()));
    }
}
