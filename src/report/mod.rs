//! Run reports: the PNG plots of a run, drawn from the `metrics.csv` the trainer writes
//! ([`crate::train::log`]): [`render_run`] for one run, [`render_comparison`] to overlay several.
//! Every image is written to `<name>.tmp` first and renamed, so a reader never sees half a file.

mod axes;
mod meta;
pub mod plot;

use std::path::{Path, PathBuf};

use crate::fsutil::FileError;
use crate::train::log::LogError;
pub use meta::{PlotMeta, StageKind, plot_meta_from_run};
pub use plot::{DASHBOARD_SIZE, PLOT_FILES, PLOT_SIZE, SFT_PLOT_FILES, ema, ema_alpha, render_comparison, render_run};

/// Errors drawing a run's plots; each names the file it concerns.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// A filesystem operation failed.
    #[error(transparent)]
    Io(#[from] FileError),
    /// `metrics.csv` could not be read.
    #[error(transparent)]
    Log(#[from] LogError),
    /// plotters failed to draw an image.
    #[error("cannot draw `{path}`")]
    Draw {
        path: PathBuf,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The font embedded in the binary could not be loaded (a build defect, not a user error).
    #[error("the embedded font `assets/fonts/DejaVuSans.ttf` is not a valid TrueType font")]
    Font,
}

impl ReportError {
    fn io(action: &'static str, path: &Path, source: std::io::Error) -> Self {
        Self::Io(FileError::new(action, path, source))
    }
}
