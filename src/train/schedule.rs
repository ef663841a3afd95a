//! Learning-rate schedules with linear warm-up, as transformers' `get_scheduler` defines them
//! (`optimization.py`: `_get_linear_schedule_with_warmup_lr_lambda`, the cosine variants with
//! `num_cycles = 0.5`; `constant` is `get_constant_schedule`, without warm-up). Step `k` is the `k`-th optimizer update, counted from 0, so with warm-up the
//! first update uses a learning rate of 0, exactly as transformers does.

use std::f64::consts::PI;

use crate::config::SchedulerType;

/// A pure function from the optimizer step to the learning rate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Schedule {
    pub kind: SchedulerType,
    pub peak: f64,
    pub warmup_steps: u64,
    pub total_steps: u64,
    /// Floor of `cosine_with_min_lr`, as a fraction of `peak`.
    pub min_lr_rate: f64,
}

impl Schedule {
    /// The learning rate of update `step`.
    pub fn lr(&self, step: u64) -> f64 {
        if self.kind == SchedulerType::Constant {
            return self.peak;
        }
        if step < self.warmup_steps {
            return self.peak * step as f64 / self.warmup_steps.max(1) as f64;
        }
        let decay_steps = self.total_steps.saturating_sub(self.warmup_steps).max(1) as f64;
        let progress = (step - self.warmup_steps) as f64 / decay_steps;
        let factor = match self.kind {
            SchedulerType::Constant | SchedulerType::ConstantWithWarmup => 1.0,
            SchedulerType::Linear => ((self.total_steps as f64 - step as f64) / decay_steps).max(0.0),
            SchedulerType::Cosine => (0.5 * (1.0 + (PI * progress).cos())).max(0.0),
            SchedulerType::CosineWithMinLr => {
                let cosine = 0.5 * (1.0 + (PI * progress).cos());
                (cosine * (1.0 - self.min_lr_rate) + self.min_lr_rate).max(0.0)
            }
        };
        self.peak * factor
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schedule(kind: SchedulerType) -> Schedule {
        Schedule { kind, peak: 1e-3, warmup_steps: 10, total_steps: 110, min_lr_rate: 0.1 }
    }

    /// Values computed by hand from transformers' lambdas (peak 1e-3, warm-up 10, 110 steps).
    #[test]
    fn values_at_chosen_steps() {
        let close = |a: f64, b: f64| assert!((a - b).abs() < 1e-15, "{a} != {b}");
        use SchedulerType::*;
        for kind in [ConstantWithWarmup, Linear, Cosine, CosineWithMinLr] {
            close(schedule(kind).lr(0), 0.0);
            close(schedule(kind).lr(5), 5e-4);
            close(schedule(kind).lr(10), 1e-3);
        }
        close(schedule(ConstantWithWarmup).lr(100), 1e-3);
        // transformers' constant schedule takes no warm-up, whatever warmup_steps says.
        for step in [0, 5, 100] {
            close(schedule(Constant).lr(step), 1e-3);
        }
        // linear: (110 - 60) / 100
        close(schedule(SchedulerType::Linear).lr(60), 5e-4);
        close(schedule(SchedulerType::Linear).lr(110), 0.0);
        // cosine at half of the decay: 0.5 · (1 + cos(π/2)) = 0.5
        close(schedule(SchedulerType::Cosine).lr(60), 5e-4);
        close(schedule(SchedulerType::Cosine).lr(110), 0.0);
        // cosine_with_min_lr: 0.5 · 0.9 + 0.1 at the middle, 0.1 at the end
        close(schedule(SchedulerType::CosineWithMinLr).lr(60), 5.5e-4);
        close(schedule(SchedulerType::CosineWithMinLr).lr(110), 1e-4);
    }
}
