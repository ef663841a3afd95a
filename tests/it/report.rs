//! End-to-end checks of `dpo_train::report`: a synthetic DPO run and an SFT-only run are written
//! through `MetricsWriter` and rendered to PNG; each PNG is checked by its signature and IHDR
//! size, read by hand (PNG spec §5.2, §11.2.2).

use std::path::{Path, PathBuf};

use dpo_train::report::{
    DASHBOARD_SIZE, PLOT_FILES, PLOT_SIZE, PlotMeta, SFT_PLOT_FILES, plot_meta_from_run, render_comparison, render_run,
};
use dpo_train::train::log::{MetricsRow, MetricsWriter, Split, read_metrics};
use dpo_train::train::samples::{Sample, write_samples};

/// Width and height from a PNG's IHDR chunk, after checking the signature and chunk type.
fn png_size(path: &Path) -> (u32, u32) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(bytes.len() > 33, "{} is too short to be a PNG", path.display());
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "{}: bad signature", path.display());
    assert_eq!(&bytes[8..12], &13u32.to_be_bytes(), "IHDR length");
    assert_eq!(&bytes[12..16], b"IHDR", "{}: first chunk is not IHDR", path.display());
    let width = u32::from_be_bytes(bytes[16..20].try_into().unwrap());
    let height = u32::from_be_bytes(bytes[20..24].try_into().unwrap());
    (width, height)
}

fn assert_plots(paths: &[PathBuf], dir: &Path) {
    assert_plot_files(paths, dir, &PLOT_FILES);
}

fn assert_plot_files(paths: &[PathBuf], dir: &Path, files: &[&str]) {
    let names: Vec<String> = paths.iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
    assert_eq!(names, files);
    for path in paths {
        assert_eq!(path.parent().unwrap(), dir);
        let expected = if path.ends_with("dashboard.png") { DASHBOARD_SIZE } else { PLOT_SIZE };
        assert_eq!(png_size(path), expected, "{}", path.display());
        let tmp = PathBuf::from(format!("{}.tmp", path.display()));
        assert!(!tmp.exists(), "{} left behind", tmp.display());
    }
}

/// A DPO-looking run: loss falling from ln 2, rewards diverging, accuracies rising, a warmup then
/// cosine learning rate, with evaluations every 10 steps. `shift` varies the run.
fn dpo_rows(steps: u64, shift: f64) -> Vec<MetricsRow> {
    let mut rows = Vec::new();
    for step in 1..=steps {
        let t = step as f64 / steps as f64;
        // Deterministic "noise" so the raw curve is visibly noisier than its EMA.
        let noise = ((step as f64 * 12.9898).sin() * 43_758.545).fract() - 0.5;
        let mut row = MetricsRow::empty(step, 2.0 * t, Split::Train, step as f64 * 0.8);
        let margin = (3.0 + shift) * t + 0.6 * noise;
        row.set_metric("loss", (0.693 - 0.45 * t) * (1.0 + 0.5 * noise));
        row.set_metric("rewards/chosen", 0.4 * t + 0.2 * noise);
        row.set_metric("rewards/rejected", 0.4 * t - margin);
        row.set_metric("rewards/margins", margin);
        row.set_metric("rewards/accuracies", (0.5 + 0.45 * t + 0.3 * noise).clamp(0.0, 1.0));
        row.set_metric("logps/chosen", -120.0 + 10.0 * t);
        row.set_metric("logps/rejected", -130.0 - 20.0 * t);
        row.set_metric("num_tokens", 4096.0 * step as f64);
        let warmup = (step as f64 / 5.0).min(1.0);
        row.learning_rate = Some(5e-7 * warmup * 0.5 * (1.0 + (std::f64::consts::PI * t).cos()));
        row.grad_norm = Some(if step == 17 { f64::NAN } else { 8.0 * (1.0 - 0.6 * t) + 2.0 * noise });
        row.pairs_per_second = Some(12.5);
        row.tokens_per_second = Some(6400.0);
        rows.push(row);
        if step % 10 == 0 {
            let mut eval = MetricsRow::empty(step, 2.0 * t, Split::Eval, step as f64 * 0.8 + 0.3);
            eval.set_metric("loss", 0.7 - 0.35 * t);
            eval.set_metric("rewards/chosen", 0.3 * t);
            eval.set_metric("rewards/rejected", 0.3 * t - (2.5 + shift) * t);
            eval.set_metric("rewards/margins", (2.5 + shift) * t);
            eval.set_metric("rewards/accuracies", 0.55 + 0.35 * t);
            rows.push(eval);
        }
    }
    rows
}

fn write_run(dir: &Path, rows: &[MetricsRow]) {
    let mut writer = MetricsWriter::create(dir).unwrap();
    for row in rows {
        writer.append(row).unwrap();
    }
}

#[test]
fn renders_a_dpo_run() {
    let dir = tempfile::tempdir().unwrap();
    write_run(dir.path(), &dpo_rows(50, 0.0));
    std::fs::write(
        dir.path().join("config.toml"),
        "run_name = \"dpo-smoke\"\nmodel_name_or_path = \"Qwen/Qwen2.5-0.5B-Instruct\"\nbeta = 0.1\n",
    )
    .unwrap();
    let meta = plot_meta_from_run(dir.path());
    assert_eq!(meta.run_name, "dpo-smoke");
    let paths = render_run(dir.path(), &meta).unwrap();
    assert_plots(&paths, dir.path());
    keep_for_inspection(&paths, "dpo");
}

/// An SFT stage logs loss, learning rate and grad norm, no rewards: it gets those panels (and the
/// rare eval loss), not DPO's reward panels saying "no rewards logged".
#[test]
fn renders_an_sft_run_without_reward_panels() {
    let dir = tempfile::tempdir().unwrap();
    let mut rows: Vec<MetricsRow> = (1..=30)
        .map(|step| {
            let mut row = MetricsRow::empty(step, step as f64 / 30.0, Split::Train, step as f64);
            row.set_metric("loss", 2.0 / (1.0 + step as f64 * 0.1));
            row.set_metric("num_tokens", 512.0 * step as f64);
            row.learning_rate = Some(1e-4 * (1.0 - step as f64 / 30.0));
            row.grad_norm = Some(3.0 / (1.0 + step as f64 * 0.05));
            row
        })
        .collect();
    let mut eval = MetricsRow::empty(30, 1.0, Split::Eval, 31.0);
    eval.set_metric("loss", 0.9);
    rows.push(eval);
    write_run(dir.path(), &rows);
    let meta = PlotMeta { run_name: "sft".into(), model: "tiny".into(), beta: 0.1 };
    let paths = render_run(dir.path(), &meta).unwrap();
    assert_plot_files(&paths, dir.path(), &SFT_PLOT_FILES);
    for file in ["rewards.png", "margins.png", "accuracies.png"] {
        assert!(!dir.path().join(file).exists(), "{file}");
    }
    keep_for_inspection(&paths, "sft");
}

#[test]
fn renders_tiny_and_empty_runs() {
    // Only a header: every panel is empty.
    let dir = tempfile::tempdir().unwrap();
    MetricsWriter::create(dir.path()).unwrap();
    let meta = plot_meta_from_run(dir.path());
    assert_plots(&render_run(dir.path(), &meta).unwrap(), dir.path());

    // One train row and one eval row at the same step: degenerate ranges.
    let dir = tempfile::tempdir().unwrap();
    let mut rows = dpo_rows(10, 0.0);
    rows.retain(|r| r.step == 10);
    write_run(dir.path(), &rows);
    let paths = render_run(dir.path(), &meta).unwrap();
    assert_plots(&paths, dir.path());
    keep_for_inspection(&paths, "tiny");
}

#[test]
fn missing_metrics_file_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let meta = plot_meta_from_run(dir.path());
    let err = render_run(dir.path(), &meta).unwrap_err();
    assert!(err.to_string().contains("metrics.csv"), "{err}");
}

#[test]
fn renders_a_comparison_of_two_runs() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("compare");
    // Round-trip through the CSV, as `dpo-train plot A B` does.
    let mut runs = Vec::new();
    for (label, shift) in [("beta=0.1", 0.0), ("beta=0.5", -1.5)] {
        let run_dir = dir.path().join(label);
        std::fs::create_dir(&run_dir).unwrap();
        write_run(&run_dir, &dpo_rows(50, shift));
        runs.push((label.to_string(), read_metrics(&run_dir.join("metrics.csv")).unwrap()));
    }
    runs[1].1.retain(|r| r.step <= 40);
    let paths = render_comparison(&runs, &out, "β sweep · Qwen2.5-0.5B").unwrap();
    assert_plots(&paths, &out);
    keep_for_inspection(&paths, "cmp");
}

#[test]
fn writes_samples() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("samples_val.txt");
    let samples = vec![
        Sample {
            prompt: "Name a prime number.".into(),
            policy: "7 is prime.\nIt has no divisors but 1 and itself.".into(),
            reference: "9".into(),
            chosen: "7".into(),
            desirable: None,
        },
        Sample {
            prompt: "Say hi.".into(),
            policy: "Hi!".into(),
            reference: "Hello.".into(),
            chosen: "Hi there!".into(),
            // A KTO row: its own completion, under its label.
            desirable: Some(false),
        },
    ];
    write_samples(&path, "step 120 (final)", &samples).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.starts_with("Samples: step 120 (final) (2 prompts)\n"));
    assert!(text.contains(
        "[1/2]\nPROMPT:\n    Name a prime number.\nPOLICY:\n    7 is prime.\n    It has no divisors but 1 and itself.\nREFERENCE:\n    9\nCHOSEN:\n    7\n"
    ));
    assert!(text.contains("[2/2]\nPROMPT:\n    Say hi.\n"));
    assert!(text.contains("REFERENCE:\n    Hello.\nUNDESIRABLE:\n    Hi there!\n"), "{text}");
    assert_eq!(text.matches(&"-".repeat(80)).count(), 2);
    assert!(!dir.path().join("samples_val.txt.tmp").exists());
}

/// Copies the PNGs to `$REPORT_PLOTS_DIR/<prefix>_<name>` when that variable is set, so a person
/// can look at them; does nothing otherwise.
fn keep_for_inspection(paths: &[PathBuf], prefix: &str) {
    let Some(dir) = std::env::var_os("REPORT_PLOTS_DIR") else {
        return;
    };
    let dir = PathBuf::from(dir);
    std::fs::create_dir_all(&dir).unwrap();
    for path in paths {
        let name = path.file_name().unwrap().to_string_lossy();
        std::fs::copy(path, dir.join(format!("{prefix}_{name}"))).unwrap();
    }
}
