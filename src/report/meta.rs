//! What a plot's title says (the run, the model, DPO's β) and which stage the plotted
//! `metrics.csv` comes from.

use std::path::Path;

use crate::train::log::MetricsRow;

/// The rewards TRL's DPO logs at every step; an SFT stage logs none.
const REWARDS: [&str; 4] = ["rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies"];

/// The stage a `metrics.csv` was written by: its rows say, so a stage is plotted the same in the
/// run and by `dpo-train plot` from its files alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StageKind {
    Dpo,
    /// Supervised fine-tuning (`dpo-train sft`, the warm-up in `<run>/sft/`): loss, learning rate
    /// and grad norm, no rewards.
    Sft,
}

impl StageKind {
    /// SFT when rows were logged and none has a reward; DPO otherwise (a stage that logged
    /// nothing yet is drawn with DPO's empty panels).
    pub fn of(rows: &[MetricsRow]) -> Self {
        let rewarded = rows.iter().any(|r| REWARDS.iter().any(|name| r.metric(name).is_some()));
        if rows.is_empty() || rewarded { Self::Dpo } else { Self::Sft }
    }
}

/// What the plot titles say about a run.
#[derive(Debug, Clone, PartialEq)]
pub struct PlotMeta {
    pub run_name: String,
    /// The model's Hugging Face id or local path.
    pub model: String,
    /// DPO's β; `NaN` when unknown (shown as `?`).
    pub beta: f64,
}

impl PlotMeta {
    /// `<run_name> · <model> · β = <beta>` for DPO; an SFT stage has no β: `<run_name> · <model> · SFT`.
    pub(super) fn title(&self, stage: StageKind) -> String {
        if stage == StageKind::Sft {
            return format!("{} · {} · SFT", self.run_name, self.model);
        }
        let beta = if self.beta.is_finite() { format!("{}", self.beta) } else { "?".to_string() };
        format!("{} · {} · β = {beta}", self.run_name, self.model)
    }
}

/// Reads `run_name`, `model_name_or_path` and `beta` from `<run_dir>/config.toml`, so a run can
/// be re-plotted from its files alone.
///
/// Keys are looked up at the top level, then inside any top-level table. Whatever is missing
/// (or the whole file, if absent or unreadable) falls back to the directory name, `?` and `NaN`.
pub fn plot_meta_from_run(run_dir: &Path) -> PlotMeta {
    let dir_name = run_dir
        .canonicalize()
        .unwrap_or_else(|_| run_dir.to_path_buf())
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| run_dir.display().to_string());
    let table = std::fs::read_to_string(run_dir.join("config.toml"))
        .ok()
        .and_then(|text| toml::from_str::<toml::Table>(&text).ok())
        .unwrap_or_default();
    let find = |key: &str| -> Option<&toml::Value> {
        table.get(key).or_else(|| table.values().filter_map(toml::Value::as_table).find_map(|t| t.get(key)))
    };
    PlotMeta {
        run_name: find("run_name").and_then(toml::Value::as_str).map_or(dir_name, str::to_string),
        model: find("model_name_or_path").and_then(toml::Value::as_str).unwrap_or("?").to_string(),
        beta: find("beta").and_then(|v| v.as_float().or_else(|| v.as_integer().map(|i| i as f64))).unwrap_or(f64::NAN),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::log::Split;

    #[test]
    fn meta_from_config_and_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join("my-run");
        std::fs::create_dir(&run).unwrap();
        let meta = plot_meta_from_run(&run);
        assert_eq!(meta.run_name, "my-run");
        assert_eq!(meta.model, "?");
        assert!(meta.beta.is_nan());
        assert_eq!(meta.title(StageKind::Dpo), "my-run · ? · β = ?");

        std::fs::write(
            run.join("config.toml"),
            "run_name = \"dpo-a\"\n[dpo]\nbeta = 0.1\n[model]\nmodel_name_or_path = \"Qwen/Qwen2.5-0.5B\"\n",
        )
        .unwrap();
        let meta = plot_meta_from_run(&run);
        assert_eq!(meta, PlotMeta { run_name: "dpo-a".into(), model: "Qwen/Qwen2.5-0.5B".into(), beta: 0.1 });
        assert_eq!(meta.title(StageKind::Dpo), "dpo-a · Qwen/Qwen2.5-0.5B · β = 0.1");
        // SFT has no β to show.
        assert_eq!(meta.title(StageKind::Sft), "dpo-a · Qwen/Qwen2.5-0.5B · SFT");
    }

    #[test]
    fn an_sft_stage_is_known_by_its_rows() {
        let mut row = MetricsRow::empty(1, 0.1, Split::Train, 1.0);
        row.set_metric("loss", 2.0);
        assert_eq!(StageKind::of(std::slice::from_ref(&row)), StageKind::Sft);
        row.set_metric("rewards/margins", 0.0);
        assert_eq!(StageKind::of(&[row]), StageKind::Dpo);
        assert_eq!(StageKind::of(&[]), StageKind::Dpo);
    }
}
