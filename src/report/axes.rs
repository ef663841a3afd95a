//! A chart's axes: the ranges fitted to its points and the text of its ticks, which follow the
//! ticks plotters places.

/// `(lo, hi)` of `values` padded by 5 % (a constant series gets ±10 % of its value, or ±1 at 0).
pub(super) fn fit_range(values: impl Iterator<Item = f64>) -> Option<(f64, f64)> {
    let (lo, hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if lo > hi {
        return None;
    }
    if hi - lo <= f64::EPSILON * hi.abs().max(lo.abs()) {
        let pad = if lo == 0.0 { 1.0 } else { lo.abs() * 0.1 };
        return Some((lo - pad, hi + pad));
    }
    let pad = (hi - lo) * 0.05;
    Some((lo - pad, hi + pad))
}

/// The x range: from the first logged step, with 2 % of air after the last (±1 for one step).
pub(super) fn step_range(steps: impl Iterator<Item = f64>) -> Option<(f64, f64)> {
    let (lo, hi) = steps.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if lo > hi {
        None
    } else if lo == hi {
        Some((lo - 1.0, hi + 1.0))
    } else {
        Some((lo, hi + (hi - lo) * 0.02))
    }
}

/// Tick text for a value on an axis over `range` with at most `ticks` ticks: as many decimals as
/// the ticks' step has (so neighbours never print alike), and scientific notation for
/// learning-rate-sized or huge numbers, its mantissa as precise as the step.
pub(super) fn tick_label(v: f64, range: (f64, f64), ticks: usize, magnitude: f64) -> String {
    let (span, step) = (range.1 - range.0, tick_step(range, ticks));
    let digits = |x: f64| x.abs().log10().floor();
    if magnitude != 0.0 && !(1e-3..1e5).contains(&magnitude) {
        // A tick at zero can land a rounding error away from it: 1e-6 of the span is zero.
        if v.abs() <= span * 1e-6 {
            return "0".to_string();
        }
        let decimals = (digits(magnitude) - digits(step)).clamp(1.0, 6.0) as usize;
        return format!("{v:.decimals$e}");
    }
    let decimals = (-digits(step)).clamp(0.0, 6.0) as usize;
    let text = format!("{v:.decimals$}");
    // `-0.00` reads as a bug.
    if text.trim_start_matches('-').chars().all(|c| c == '0' || c == '.') {
        text.trim_start_matches('-').to_string()
    } else {
        text
    }
}

/// The step between the ticks plotters draws over `range` when asked for at most `ticks`
/// (`compute_f64_key_points` in plotters 0.3.7): the finest of 10^k, 10^k/2 and 10^k/5 whose
/// ticks, on its multiples inside the range, number no more than asked.
fn tick_step((lo, hi): (f64, f64), ticks: usize) -> f64 {
    let span = hi - lo;
    if span.is_nan() || span <= f64::EPSILON || ticks == 0 {
        return 1.0;
    }
    let rem = |a: f64, b: f64| {
        let r = a - (a / b).floor() * b;
        if (r - b).abs() < f64::EPSILON { 0.0 } else { r }
    };
    let mut scale = 10f64.powf(span.log10().floor());
    if 1 + (span / scale).floor() as usize > ticks {
        scale *= 10.0;
    }
    loop {
        let old = scale;
        for div in [2.0, 5.0, 10.0] {
            let step = old / div;
            let left = lo - rem(lo, step);
            let left = if left < lo { left + step } else { left };
            let right = hi - rem(hi, step);
            if (1.0 + (right - left) / step).round() as usize > ticks {
                return scale;
            }
            scale = step;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_and_ticks() {
        assert_eq!(fit_range([1.0, 3.0].into_iter()), Some((0.9, 3.1)));
        assert_eq!(fit_range([0.0].into_iter()), Some((-1.0, 1.0)));
        assert_eq!(fit_range(std::iter::empty()), None);
        assert_eq!(tick_label(5.2e-7, (5e-7, 6e-7), 6, 6e-7), "5.2e-7");
        assert_eq!(tick_label(0.4, (0.0, 1.0), 6, 1.0), "0.4");
        assert_eq!(tick_label(120.0, (0.0, 500.0), 6, 500.0), "120");
        assert_eq!(tick_label(-0.0001, (-0.5, 0.5), 6, 0.5), "0.0");
        assert_eq!(tick_label(1e-22, (0.0, 5e-7), 6, 5e-7), "0");
        assert_eq!((tick_step((0.0, 1.0), 6), tick_step((0.0, 1.0), 11), tick_step((1.0, 52.0), 8)), (0.2, 0.1, 10.0));
        // A learning rate over 1.30e-5..1.52e-5 ticks every 5e-7: each tick prints apart (they
        // read 1.5e-5, 1.5e-5, 1.4e-5, ... at one decimal).
        let (lo, hi) = (1.30e-5, 1.52e-5);
        let step = tick_step((lo, hi), 6);
        assert!((step - 5e-7).abs() < 1e-12, "{step}");
        let labels: Vec<String> = (0..5).map(|i| tick_label(1.30e-5 + i as f64 * step, (lo, hi), 6, hi)).collect();
        assert_eq!(labels, ["1.30e-5", "1.35e-5", "1.40e-5", "1.45e-5", "1.50e-5"]);
        assert_eq!(step_range([5.0, 1.0, 51.0].into_iter()), Some((1.0, 52.0)));
        assert_eq!(step_range([7.0].into_iter()), Some((6.0, 8.0)));
    }
}
