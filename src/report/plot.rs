//! PNG plots of `metrics.csv`: one file per panel and a 2×3 dashboard, for one run or several
//! runs overlaid.
//!
//! The panels follow what TRL's `DPOTrainer` logs (`loss`, `rewards/chosen` vs
//! `rewards/rejected`, `rewards/margins`, `rewards/accuracies`) plus `learning_rate` and
//! `grad_norm`; an SFT stage, which logs no rewards, gets its loss, learning rate and grad norm
//! only ([`SFT_PLOT_FILES`]). Training curves are noisy, so each is drawn twice, as TensorBoard does: the raw
//! values faint, and an exponential moving average ([`ema`], [`ema_alpha`]) bold. Evaluations
//! are sparse and already averaged over the eval set, so they are drawn unsmoothed as line plus
//! markers. Text uses the DejaVu Sans font embedded in the binary, so rendering never depends on
//! the fonts installed on the machine.

use std::error::Error;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::ReportError;
use super::axes::{fit_range, step_range, tick_label};
use super::meta::{PlotMeta, StageKind};
use crate::train::log::{METRICS_FILE, MetricsRow, Split, read_metrics};

/// Size in pixels (width, height) of each single-panel PNG.
pub const PLOT_SIZE: (u32, u32) = (1000, 600);
/// Size in pixels (width, height) of `dashboard.png`.
pub const DASHBOARD_SIZE: (u32, u32) = (2000, 1200);

/// Weight of the newest value in the EMA that smooths a training curve of `points` values:
/// `s[0] = x[0]`, `s[t] = α·x[t] + (1 − α)·s[t−1]`, with α = 2/(span + 1) for a span of a tenth
/// of the curve (the usual span-to-α rule), kept within [0.05, 0.5]: long runs average over about
/// 40 logged points at most, short ones lag by a point or two instead of trailing the data.
pub fn ema_alpha(points: usize) -> f64 {
    (2.0 / (points as f64 / 10.0 + 1.0)).clamp(0.05, 0.5)
}

/// Series shorter than this are drawn unsmoothed: an EMA over one or two points only hides them.
const MIN_POINTS_TO_SMOOTH: usize = 3;

/// Opacity of the raw training values behind their EMA: visible, but clearly secondary.
const RAW_ALPHA: f64 = 0.4;

/// The file names written by [`render_run`] and [`render_comparison`] for DPO, in the order returned.
pub const PLOT_FILES: [&str; 6] =
    ["loss.png", "rewards.png", "margins.png", "accuracies.png", "lr_grad_norm.png", "dashboard.png"];
/// The same for an SFT stage, which logs no rewards: its dashboard is loss, learning rate, grad norm.
pub const SFT_PLOT_FILES: [&str; 3] = ["loss.png", "lr_grad_norm.png", "dashboard.png"];

/// Exponential moving average of `values` with weight `alpha`, seeded with the first value;
/// fewer than 3 values come back unchanged.
pub fn ema(values: &[f64], alpha: f64) -> Vec<f64> {
    let Some(&first) = values.first() else {
        return Vec::new();
    };
    if values.len() < MIN_POINTS_TO_SMOOTH {
        return values.to_vec();
    }
    let mut s = first;
    values
        .iter()
        .map(|&v| {
            s = alpha * v + (1.0 - alpha) * s;
            s
        })
        .collect()
}

/// Reads `<run_dir>/metrics.csv` and writes the plots into `run_dir`; returns their paths in
/// [`PLOT_FILES`] order ([`SFT_PLOT_FILES`] for an SFT stage, see [`StageKind::of`]).
pub fn render_run(run_dir: &Path, meta: &PlotMeta) -> Result<Vec<PathBuf>, ReportError> {
    let rows = read_metrics(&run_dir.join(METRICS_FILE))?;
    let stage = StageKind::of(&rows);
    render_cells(run_cells(&rows), stage, run_dir, &meta.title(stage))
}

/// Overlays several runs (`(label, rows)`, one colour each) into the [`PLOT_FILES`] in
/// `out_dir`, which is created if needed. Training curves are EMA-smoothed, evaluations dashed
/// with markers.
pub fn render_comparison(
    runs: &[(String, Vec<MetricsRow>)],
    out_dir: &Path,
    meta_title: &str,
) -> Result<Vec<PathBuf>, ReportError> {
    std::fs::create_dir_all(out_dir).map_err(|e| ReportError::io("create", out_dir, e))?;
    let sft = runs.iter().all(|(_, rows)| StageKind::of(rows) == StageKind::Sft);
    let stage = if sft { StageKind::Sft } else { StageKind::Dpo };
    render_cells(comparison_cells(runs), stage, out_dir, meta_title)
}

// ---------------------------------------------------------------------------------------------
// What to draw.

/// A value read from a row.
#[derive(Debug, Clone, Copy)]
enum Field {
    Metric(&'static str),
    LearningRate,
    GradNorm,
}

impl Field {
    fn get(self, row: &MetricsRow) -> Option<f64> {
        match self {
            Field::Metric(name) => row.metric(name),
            Field::LearningRate => row.learning_rate,
            Field::GradNorm => row.grad_norm,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Field::Metric(name) => name,
            Field::LearningRate => "learning_rate",
            Field::GradNorm => "grad_norm",
        }
    }
}

/// `(step, value)` for the rows of `split`, finite values only, sorted by step.
fn series(rows: &[MetricsRow], split: Split, field: Field) -> Vec<(f64, f64)> {
    let mut points: Vec<(f64, f64)> = rows
        .iter()
        .filter(|r| r.split == split)
        .filter_map(|r| Some((r.step as f64, field.get(r)?)))
        .filter(|(_, v)| v.is_finite())
        .collect();
    points.sort_by(|a, b| a.0.total_cmp(&b.0));
    points
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum CurveKind {
    /// A training curve: optionally the raw values faint, then the EMA bold.
    Train { raw: bool, smooth: bool },
    /// An evaluation curve: a thin (or dashed) line with a marker per evaluation.
    Eval { dashed: bool },
}

#[derive(Debug, Clone)]
struct Curve {
    /// Legend text; smoothed curves get ` (EMA α=…)` appended when drawn.
    label: String,
    color: RGBColor,
    kind: CurveKind,
    points: Vec<(f64, f64)>,
}

/// One set of axes.
#[derive(Debug, Clone)]
struct Chart {
    caption: String,
    y_label: &'static str,
    /// A fixed y range (accuracies live in [0, 1]); otherwise fitted to the data.
    y_fixed: Option<(f64, f64)>,
    curves: Vec<Curve>,
    /// Whether to draw a legend (a chart stacked under one with the same curves skips it).
    legend: bool,
}

/// One dashboard cell: charts stacked top to bottom.
type Cell = Vec<Chart>;

// Colours: matplotlib's "tab10", which stays distinguishable for colour-blind readers.
const TAB10: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];
const TRAIN_COLOR: RGBColor = TAB10[0];
const EVAL_COLOR: RGBColor = TAB10[1];
const CHOSEN_COLOR: RGBColor = TAB10[2];
const REJECTED_COLOR: RGBColor = TAB10[3];
const CHOSEN_EVAL_COLOR: RGBColor = RGBColor(20, 90, 20);
const REJECTED_EVAL_COLOR: RGBColor = RGBColor(130, 20, 20);
const TEXT_COLOR: RGBColor = RGBColor(30, 30, 30);
const NOTE_COLOR: RGBColor = RGBColor(120, 120, 120);
const GRID_COLOR: RGBColor = RGBColor(225, 225, 225);
const LEGEND_BORDER: RGBColor = RGBColor(190, 190, 190);

/// The six cells for one run: loss, rewards, margins, accuracies, learning rate, grad norm.
fn run_cells(rows: &[MetricsRow]) -> [Cell; 6] {
    let train = |field: Field, label: &str, color: RGBColor, smooth: bool| Curve {
        label: label.to_string(),
        color,
        kind: CurveKind::Train { raw: true, smooth },
        points: series(rows, Split::Train, field),
    };
    let eval = |field: Field, label: &str, color: RGBColor| Curve {
        label: label.to_string(),
        color,
        kind: CurveKind::Eval { dashed: false },
        points: series(rows, Split::Eval, field),
    };
    let simple = |field: Field, y_fixed: Option<(f64, f64)>, with_eval: bool, smooth: bool| {
        let mut curves = vec![train(field, "train", TRAIN_COLOR, smooth)];
        if with_eval {
            curves.push(eval(field, "eval", EVAL_COLOR));
        }
        vec![Chart { caption: field.name().to_string(), y_label: field.name(), y_fixed, curves, legend: true }]
    };
    let chosen = Field::Metric("rewards/chosen");
    let rejected = Field::Metric("rewards/rejected");
    let rewards = vec![Chart {
        caption: "rewards/chosen vs rewards/rejected".to_string(),
        y_label: "rewards",
        y_fixed: None,
        curves: vec![
            train(chosen, "train chosen", CHOSEN_COLOR, true),
            train(rejected, "train rejected", REJECTED_COLOR, true),
            eval(chosen, "eval chosen", CHOSEN_EVAL_COLOR),
            eval(rejected, "eval rejected", REJECTED_EVAL_COLOR),
        ],
        legend: true,
    }];
    [
        simple(Field::Metric("loss"), None, true, true),
        rewards,
        simple(Field::Metric("rewards/margins"), None, true, true),
        simple(Field::Metric("rewards/accuracies"), Some((0.0, 1.0)), true, true),
        // The schedule is exact, so it is not smoothed; evaluations have no learning rate.
        simple(Field::LearningRate, None, false, false),
        simple(Field::GradNorm, None, false, true),
    ]
}

/// The six cells for several runs; rewards become two stacked charts (chosen, rejected) so one
/// colour can stay one run.
fn comparison_cells(runs: &[(String, Vec<MetricsRow>)]) -> [Cell; 6] {
    let chart = |field: Field, y_fixed: Option<(f64, f64)>, with_eval: bool, smooth: bool| {
        // Every run smoothed or none: a short run drawn raw beside smoothed ones reads as noisier.
        let long = |rows: &[MetricsRow]| series(rows, Split::Train, field).len() >= MIN_POINTS_TO_SMOOTH;
        let smooth = smooth && runs.iter().all(|(_, rows)| long(rows));
        let mut curves = Vec::new();
        for (i, (label, rows)) in runs.iter().enumerate() {
            let color = TAB10[i % TAB10.len()];
            curves.push(Curve {
                label: format!("{label} train"),
                color,
                kind: CurveKind::Train { raw: false, smooth },
                points: series(rows, Split::Train, field),
            });
            if with_eval {
                curves.push(Curve {
                    label: format!("{label} eval"),
                    color,
                    kind: CurveKind::Eval { dashed: true },
                    points: series(rows, Split::Eval, field),
                });
            }
        }
        Chart { caption: field.name().to_string(), y_label: field.name(), y_fixed, curves, legend: true }
    };
    [
        vec![chart(Field::Metric("loss"), None, true, true)],
        vec![
            chart(Field::Metric("rewards/chosen"), None, true, true),
            // Same runs, same colours: the legend above serves both.
            Chart { legend: false, ..chart(Field::Metric("rewards/rejected"), None, true, true) },
        ],
        vec![chart(Field::Metric("rewards/margins"), None, true, true)],
        vec![chart(Field::Metric("rewards/accuracies"), Some((0.0, 1.0)), true, true)],
        vec![chart(Field::LearningRate, None, false, false)],
        vec![chart(Field::GradNorm, None, false, true)],
    ]
}

// ---------------------------------------------------------------------------------------------
// Drawing.

/// The bytes of the font all text is drawn with.
static FONT: &[u8] = include_bytes!(concat!(env!("CARGO_MANIFEST_DIR"), "/assets/fonts/DejaVuSans.ttf"));
/// The family name the font is registered under; plotters' default family.
const FONT_FAMILY: &str = "sans-serif";

/// Registers the embedded font with plotters once per process (plotters' `ab_glyph` backend
/// loads no system fonts; every style falls back to the registered `Normal` face).
fn ensure_font() -> Result<(), ReportError> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok = *REGISTERED.get_or_init(|| plotters::style::register_font(FONT_FAMILY, FontStyle::Normal, FONT).is_ok());
    if ok { Ok(()) } else { Err(ReportError::Font) }
}

/// Text and spacing sizes in pixels for one image size.
#[derive(Debug, Clone, Copy)]
struct Scale {
    title: u32,
    caption: u32,
    axis_desc: u32,
    tick: u32,
    legend: u32,
    note: u32,
    margin: u32,
    x_label_area: u32,
    y_label_area: u32,
}

const SINGLE_SCALE: Scale = Scale {
    title: 24,
    caption: 21,
    axis_desc: 18,
    tick: 15,
    legend: 15,
    note: 20,
    margin: 12,
    x_label_area: 52,
    y_label_area: 88,
};

const DASHBOARD_SCALE: Scale = Scale {
    title: 30,
    caption: 20,
    axis_desc: 17,
    tick: 14,
    legend: 14,
    note: 18,
    margin: 14,
    x_label_area: 50,
    y_label_area: 84,
};

type Area<'a> = DrawingArea<BitMapBackend<'a>, Shift>;
type DrawResult = Result<(), Box<dyn Error + Send + Sync>>;

fn font(size: u32, color: &'static RGBColor) -> TextStyle<'static> {
    (FONT_FAMILY, size).into_font().color(color)
}

/// Writes the panel files and the dashboard into `out_dir`: DPO's five and a 2×3 dashboard, or
/// for SFT the loss and learning-rate panels and a 1×3 dashboard (its reward panels would be
/// empty).
fn render_cells(cells: [Cell; 6], stage: StageKind, out_dir: &Path, title: &str) -> Result<Vec<PathBuf>, ReportError> {
    ensure_font()?;
    let [loss, rewards, margins, accuracies, lr, grad_norm] = cells;
    let lr_grad: Cell = lr.iter().chain(&grad_norm).cloned().collect();
    let (files, singles, dashboard, grid): (&[&str], _, _, _) = match stage {
        StageKind::Dpo => (
            &PLOT_FILES,
            vec![loss.clone(), rewards.clone(), margins.clone(), accuracies.clone(), lr_grad],
            vec![loss, rewards, margins, accuracies, lr, grad_norm],
            (2, 3),
        ),
        StageKind::Sft => (&SFT_PLOT_FILES, vec![loss.clone(), lr_grad], vec![loss, lr, grad_norm], (1, 3)),
    };
    let mut written = Vec::with_capacity(files.len());
    for (name, cell) in files.iter().zip(&singles) {
        let path = out_dir.join(name);
        render_png(&path, PLOT_SIZE, |root| {
            let body = root.titled(title, font(SINGLE_SCALE.title, &TEXT_COLOR))?;
            draw_cell(&body, cell, &SINGLE_SCALE)
        })?;
        written.push(path);
    }
    let path = out_dir.join(files[files.len() - 1]);
    render_png(&path, DASHBOARD_SIZE, |root| {
        let body = root.titled(title, font(DASHBOARD_SCALE.title, &TEXT_COLOR))?;
        for (area, cell) in body.split_evenly(grid).iter().zip(&dashboard) {
            draw_cell(area, cell, &DASHBOARD_SCALE)?;
        }
        Ok(())
    })?;
    written.push(path);
    Ok(written)
}

/// Draws a PNG and moves it to `path` atomically: plotters encodes into `.<name>.partial.png`
/// (it picks the format from the extension), which is then renamed over `path`.
fn render_png(
    path: &Path,
    (width, height): (u32, u32),
    draw: impl FnOnce(&Area) -> DrawResult,
) -> Result<(), ReportError> {
    let draw_err = |source| ReportError::Draw { path: path.to_path_buf(), source };
    let name = path.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let partial = path.with_file_name(format!(".{name}.partial.png"));
    let drawn = (|| {
        let root = BitMapBackend::new(&partial, (width, height)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| draw_err(e.into()))?;
        // A little air above the title.
        let inner = root.margin(8, 0, 0, 0);
        draw(&inner).map_err(draw_err)?;
        root.present().map_err(|e| draw_err(e.into()))
    })();
    // A drawing that failed (a full disk) leaves no partial file, once the backend, which writes
    // as it is dropped, is gone.
    if drawn.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    drawn?;
    std::fs::rename(&partial, path).map_err(|e| ReportError::io("rename into place", path, e))
}

fn draw_cell(area: &Area, cell: &Cell, scale: &Scale) -> DrawResult {
    for (sub, chart) in area.split_evenly((cell.len(), 1)).iter().zip(cell) {
        draw_chart(sub, chart, scale)?;
    }
    Ok(())
}

/// The plot corner with the fewest data points near it, for the legend.
fn legend_corner(points: &[(f64, f64)], x: (f64, f64), y: (f64, f64)) -> SeriesLabelPosition {
    let norm = |p: &(f64, f64)| ((p.0 - x.0) / (x.1 - x.0), (p.1 - y.0) / (y.1 - y.0));
    let count = |right: bool, upper: bool| {
        points
            .iter()
            .map(norm)
            .filter(|(nx, ny)| {
                let in_x = if right { *nx >= 0.55 } else { *nx <= 0.45 };
                let in_y = if upper { *ny >= 0.55 } else { *ny <= 0.45 };
                in_x && in_y
            })
            .count()
    };
    [
        (SeriesLabelPosition::UpperRight, count(true, true)),
        (SeriesLabelPosition::UpperLeft, count(false, true)),
        (SeriesLabelPosition::LowerRight, count(true, false)),
        (SeriesLabelPosition::LowerLeft, count(false, false)),
    ]
    .into_iter()
    .min_by_key(|(_, n)| *n)
    .map_or(SeriesLabelPosition::UpperRight, |(pos, _)| pos)
}

fn draw_chart(area: &Area, chart: &Chart, scale: &Scale) -> DrawResult {
    let all_points: Vec<(f64, f64)> = chart.curves.iter().flat_map(|c| c.points.iter().copied()).collect();
    let empty = all_points.is_empty();
    let (x0, x1) = step_range(all_points.iter().map(|p| p.0)).unwrap_or((0.0, 1.0));
    let (y0, y1) = chart.y_fixed.or_else(|| fit_range(all_points.iter().map(|p| p.1))).unwrap_or((0.0, 1.0));

    let mut ctx = ChartBuilder::on(area)
        .caption(&chart.caption, font(scale.caption, &TEXT_COLOR))
        .margin(scale.margin)
        .margin_right(scale.margin * 2)
        .x_label_area_size(scale.x_label_area)
        .y_label_area_size(scale.y_label_area)
        .build_cartesian_2d(x0..x1, y0..y1)?;

    let y_magnitude = y0.abs().max(y1.abs());
    let (x_ticks, y_ticks) = if empty { (0, 0) } else { (8, 6) };
    let x_fmt = |v: &f64| tick_label(*v, (x0, x1), x_ticks, 1.0);
    let y_fmt = |v: &f64| tick_label(*v, (y0, y1), y_ticks, y_magnitude);
    ctx.configure_mesh()
        .x_desc("step")
        .y_desc(chart.y_label)
        .axis_desc_style(font(scale.axis_desc, &TEXT_COLOR))
        .label_style(font(scale.tick, &TEXT_COLOR))
        // An empty chart gets a bare frame: ticks for made-up ranges would only mislead.
        .x_labels(x_ticks)
        .y_labels(y_ticks)
        .x_label_formatter(&x_fmt)
        .y_label_formatter(&y_fmt)
        .bold_line_style(GRID_COLOR)
        .light_line_style(TRANSPARENT)
        .axis_style(RGBColor(120, 120, 120))
        .draw()?;

    if empty {
        let note = format!("no {} logged", chart.y_label);
        let style = font(scale.note, &NOTE_COLOR).pos(Pos::new(HPos::Center, VPos::Center));
        ctx.draw_series(std::iter::once(Text::new(note, ((x0 + x1) / 2.0, (y0 + y1) / 2.0), style)))?;
        return Ok(());
    }

    let mut legend_points = Vec::new();
    let mut labelled = false;
    for curve in chart.curves.iter().filter(|c| !c.points.is_empty()) {
        labelled = true;
        legend_points.extend(draw_curve(&mut ctx, curve)?);
    }

    if labelled && chart.legend {
        ctx.configure_series_labels()
            .position(legend_corner(&legend_points, (x0, x1), (y0, y1)))
            .margin(10)
            .legend_area_size(30)
            .label_font(font(scale.legend, &TEXT_COLOR))
            .background_style(WHITE.mix(0.88))
            .border_style(LEGEND_BORDER)
            .draw()?;
    }
    Ok(())
}

type Plot<'a, 'b> = ChartContext<'a, BitMapBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// Draws one curve with its legend entry; returns the points the legend must not cover.
fn draw_curve<'a, 'b: 'a>(
    ctx: &mut Plot<'a, 'b>,
    curve: &Curve,
) -> Result<Vec<(f64, f64)>, Box<dyn Error + Send + Sync>> {
    let color = curve.color;
    let points = || curve.points.iter().copied();
    let smooth =
        matches!(curve.kind, CurveKind::Train { smooth: true, .. }) && curve.points.len() >= MIN_POINTS_TO_SMOOTH;
    match curve.kind {
        CurveKind::Train { raw, .. } if smooth => {
            if raw {
                ctx.draw_series(LineSeries::new(points(), color.mix(RAW_ALPHA).stroke_width(1)))?;
            }
            let values: Vec<f64> = curve.points.iter().map(|p| p.1).collect();
            let alpha = ema_alpha(values.len());
            let line: Vec<(f64, f64)> = curve.points.iter().map(|p| p.0).zip(ema(&values, alpha)).collect();
            ctx.draw_series(LineSeries::new(line.iter().copied(), color.stroke_width(3)))?
                .label(format!("{} (EMA α={alpha:.2})", curve.label))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], color.stroke_width(3)));
            Ok(line)
        }
        CurveKind::Train { .. } => {
            // Too few points to smooth (or an exact schedule): the values themselves, bold,
            // with markers when there are only a couple.
            if curve.points.len() < MIN_POINTS_TO_SMOOTH {
                ctx.draw_series(curve.points.iter().map(|&p| Circle::new(p, 5, color.filled())))?;
            }
            ctx.draw_series(LineSeries::new(points(), color.stroke_width(3)))?
                .label(&curve.label)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], color.stroke_width(3)));
            Ok(points().collect())
        }
        CurveKind::Eval { dashed } => {
            if dashed {
                ctx.draw_series(DashedLineSeries::new(points(), 10, 6, color.stroke_width(2)))?;
            } else {
                ctx.draw_series(LineSeries::new(points(), color.stroke_width(2)))?;
            }
            ctx.draw_series(curve.points.iter().map(|&p| Circle::new(p, 5, color.filled())))?
                .label(&curve.label)
                .legend(move |(x, y)| {
                    // Two dashes for a dashed curve, one line otherwise, and the marker.
                    let (first_end, second_start) = if dashed { (8, 16) } else { (24, 24) };
                    EmptyElement::at((x, y))
                        + PathElement::new(vec![(0, 0), (first_end, 0)], color.stroke_width(2))
                        + PathElement::new(vec![(second_start, 0), (24, 0)], color.stroke_width(2))
                        + Circle::new((12, 0), 5, color.filled())
                });
            Ok(points().collect())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_close(a: &[f64], b: &[f64]) {
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() < 1e-12, "{a:?} vs {b:?}");
        }
    }

    #[test]
    fn ema_matches_hand_computation() {
        // s0 = 0; s1 = 0.1·10 + 0.9·0 = 1; s2 = 1 + 0.9·1 = 1.9; s3 = 1 + 0.9·1.9 = 2.71;
        // s4 = 0.1·0 + 0.9·2.71 = 2.439.
        assert_close(&ema(&[0.0, 10.0, 10.0, 10.0, 0.0], 0.1), &[0.0, 1.0, 1.9, 2.71, 2.439]);
    }

    #[test]
    fn ema_leaves_short_series_alone() {
        assert!(ema(&[], 0.1).is_empty());
        assert_close(&ema(&[3.0], 0.1), &[3.0]);
        assert_close(&ema(&[3.0, 5.0], 0.1), &[3.0, 5.0]);
    }

    #[test]
    fn ema_weight_follows_the_curve_length() {
        assert_eq!(ema_alpha(20), 0.5);
        assert!((ema_alpha(190) - 0.1).abs() < 1e-12);
        assert_eq!(ema_alpha(10_000), 0.05);
    }

    #[test]
    fn series_skips_non_finite_and_other_splits() {
        let mut rows = Vec::new();
        for (step, loss) in [(3, 0.5), (1, f64::NAN), (2, f64::INFINITY), (4, 0.25)] {
            let mut r = MetricsRow::empty(step, 0.0, Split::Train, 0.0);
            r.set_metric("loss", loss);
            rows.push(r);
        }
        let mut eval = MetricsRow::empty(4, 0.0, Split::Eval, 0.0);
        eval.set_metric("loss", 0.3);
        rows.push(eval);
        assert_eq!(series(&rows, Split::Train, Field::Metric("loss")), [(3.0, 0.5), (4.0, 0.25)]);
        assert_eq!(series(&rows, Split::Eval, Field::Metric("loss")), [(4.0, 0.3)]);
    }

    /// Overlaid runs are all smoothed or all drawn raw: a 2-point run beside a 3-point one
    /// smoothed alone misread as the noisier run.
    #[test]
    fn an_overlay_smooths_every_run_or_none() {
        let run = |name: &str, steps: u64| {
            let rows = (1..=steps)
                .map(|step| {
                    let mut r = MetricsRow::empty(step, 0.0, Split::Train, 0.0);
                    r.set_metric("loss", 1.0 / step as f64);
                    r
                })
                .collect();
            (name.to_owned(), rows)
        };
        let smoothed = |runs: &[(String, Vec<MetricsRow>)]| -> Vec<bool> {
            let [loss, ..] = comparison_cells(runs);
            let train = loss[0].curves.iter().filter_map(|c| match c.kind {
                CurveKind::Train { smooth, .. } => Some(smooth),
                CurveKind::Eval { .. } => None,
            });
            train.collect()
        };
        assert_eq!(smoothed(&[run("a", 3), run("b", 2)]), [false, false]);
        assert_eq!(smoothed(&[run("a", 3), run("b", 4)]), [true, true]);
    }

    #[test]
    fn legend_avoids_the_data() {
        // A falling loss fills the upper left and lower right.
        let pts: Vec<(f64, f64)> = (0..10).map(|i| (i as f64, 10.0 - i as f64)).collect();
        let pos = legend_corner(&pts, (0.0, 9.0), (0.0, 10.0));
        assert_eq!(pos, SeriesLabelPosition::UpperRight);
        let rising: Vec<(f64, f64)> = (0..10).map(|i| (i as f64, i as f64)).collect();
        assert_eq!(legend_corner(&rising, (0.0, 9.0), (0.0, 9.0)), SeriesLabelPosition::UpperLeft);
    }
}
