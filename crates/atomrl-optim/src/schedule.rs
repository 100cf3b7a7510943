//! Learning-rate schedules: linear warm-up, then constant, linear or cosine decay.

use serde::{Deserialize, Serialize};

/// Learning-rate schedule after warm-up (`lr_scheduler` in the run configuration).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum LrSchedule {
    /// Constant after warm-up.
    #[default]
    Constant,
    /// Linear decay to `min_lr_ratio · lr`.
    Linear,
    /// Cosine decay to `min_lr_ratio · lr`.
    Cosine,
}

/// The learning rate at optimizer step `step` (0-based) of `total` steps.
///
/// Warm-up rises linearly from `lr / warmup` to `lr` over `warmup` steps (as transformers'
/// `get_*_schedule_with_warmup`); then `constant` stays at `lr`, `linear` and `cosine` decay to
/// `min_lr_ratio · lr` at the last step.
///
/// ```
/// use atomrl_optim::LrSchedule;
/// use atomrl_optim::learning_rate;
/// assert_eq!(learning_rate(LrSchedule::Constant, 1.0, 0, 10, 0.0, 5), 1.0);
/// assert_eq!(learning_rate(LrSchedule::Linear, 1.0, 2, 10, 0.0, 0), 0.5);
/// assert!((learning_rate(LrSchedule::Cosine, 1.0, 0, 11, 0.1, 10) - 0.1).abs() < 1e-12);
/// ```
pub fn learning_rate(
    schedule: LrSchedule,
    lr: f64,
    warmup: usize,
    total: usize,
    min_lr_ratio: f64,
    step: usize,
) -> f64 {
    if step < warmup {
        return lr * (step + 1) as f64 / warmup as f64;
    }
    let decay_steps = total.saturating_sub(warmup).saturating_sub(1).max(1) as f64;
    let progress = ((step - warmup) as f64 / decay_steps).clamp(0.0, 1.0);
    let floor = lr * min_lr_ratio;
    match schedule {
        LrSchedule::Constant => lr,
        LrSchedule::Linear => floor + (lr - floor) * (1.0 - progress),
        LrSchedule::Cosine => {
            floor + (lr - floor) * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos())
        }
    }
}

/// Warm-up steps: `warmup_steps` when set, else `ceil(warmup_ratio · total)`.
///
/// ```
/// assert_eq!(atomrl_optim::warmup_steps(0, 0.1, 95), 10);
/// assert_eq!(atomrl_optim::warmup_steps(3, 0.5, 95), 3);
/// ```
pub fn warmup_steps(warmup_steps: usize, warmup_ratio: f64, total: usize) -> usize {
    if warmup_steps > 0 {
        warmup_steps
    } else {
        (warmup_ratio * total as f64).ceil() as usize
    }
}

/// The step the schedule should be at when the run is bounded by a time budget too
/// (`lr_schedule_on_budget`): the further along of the steps and the time. `step` is the
/// optimizer step about to run, `start_step` the step this invocation began at (0, or the
/// resumed one), `elapsed_s` the seconds since it began; the rest of the schedule, from
/// `start_step` to `total`, is laid over the budget. Warm-up follows the steps alone.
/// Returns `step` when `budget_s` is 0.
///
/// ```
/// use atomrl_optim::budget_schedule_step;
/// // Half the budget gone at step 10 of 100: the schedule is at step 50.
/// assert_eq!(budget_schedule_step(10, 0, 100, 0, 30.0, 60.0), 50);
/// // A fast machine: the steps are ahead of the time.
/// assert_eq!(budget_schedule_step(80, 0, 100, 0, 30.0, 60.0), 80);
/// // Resumed at step 60 with half of this invocation's budget gone: 60 + 40 / 2.
/// assert_eq!(budget_schedule_step(61, 60, 100, 0, 30.0, 60.0), 80);
/// assert_eq!(budget_schedule_step(10, 0, 100, 0, 30.0, 0.0), 10);
/// ```
pub fn budget_schedule_step(
    step: usize,
    start_step: usize,
    total: usize,
    warmup: usize,
    elapsed_s: f64,
    budget_s: f64,
) -> usize {
    if budget_s <= 0.0 || step < warmup || total == 0 {
        return step;
    }
    let share = (elapsed_s / budget_s).clamp(0.0, 1.0);
    let by_time = start_step as f64 + share * total.saturating_sub(start_step) as f64;
    step.max(by_time.floor() as usize).min(total - 1)
}

/// The learning rate of each step of one run (one invocation: a resumed run starts its own):
/// warm-up, then `schedule` over the steps or, with `on_budget`, over whichever of the steps
/// and the time budget runs out first (see [`budget_schedule_step`]).
///
/// ```
/// use atomrl_optim::{LrSchedule, RunSchedule};
/// let s = RunSchedule {
///     schedule: LrSchedule::Linear,
///     peak_lr: 1.0,
///     min_lr_ratio: 0.0,
///     warmup: 0,
///     total: 11,
///     start_step: 0,
///     budget_s: 0.0,
///     on_budget: false,
///     started: std::time::Instant::now(),
/// };
/// assert_eq!((s.lr_at(0), s.lr_at(5), s.lr_at(10)), (1.0, 0.5, 0.0));
/// ```
#[derive(Debug, Clone, Copy)]
pub struct RunSchedule {
    /// The schedule after warm-up.
    pub schedule: LrSchedule,
    /// The peak learning rate.
    pub peak_lr: f64,
    /// The final learning rate as a share of `peak_lr` (linear and cosine).
    pub min_lr_ratio: f64,
    /// Warm-up steps (see [`warmup_steps`]).
    pub warmup: usize,
    /// Optimizer steps of the whole run.
    pub total: usize,
    /// The step this invocation starts at (0, or the resumed one).
    pub start_step: usize,
    /// Seconds the steps of this invocation share (0: no budget, the schedule follows the
    /// steps).
    pub budget_s: f64,
    /// Lay the schedule over the budget too (`lr_schedule_on_budget`).
    pub on_budget: bool,
    /// When the steps started: the budget's clock. Starting it at the first step rather than
    /// at launch means a machine fast enough for the steps stays on the step schedule from
    /// the start.
    pub started: std::time::Instant,
}

impl RunSchedule {
    /// The learning rate of the step after `done` completed steps (see [`RunSchedule`] for an
    /// example).
    pub fn lr_at(&self, done: usize) -> f64 {
        let step = if self.on_budget {
            let elapsed = self.started.elapsed().as_secs_f64();
            budget_schedule_step(
                done,
                self.start_step,
                self.total,
                self.warmup,
                elapsed,
                self.budget_s,
            )
        } else {
            done
        };
        learning_rate(
            self.schedule,
            self.peak_lr,
            self.warmup,
            self.total,
            self.min_lr_ratio,
            step,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cosine_and_linear_end_at_the_floor_and_start_at_the_peak() {
        for s in [LrSchedule::Linear, LrSchedule::Cosine] {
            assert!((learning_rate(s, 2.0, 3, 20, 0.25, 3) - 2.0).abs() < 1e-12);
            assert!((learning_rate(s, 2.0, 3, 20, 0.25, 19) - 0.5).abs() < 1e-12);
            assert!(learning_rate(s, 2.0, 3, 20, 0.25, 10) < 2.0);
        }
        assert_eq!(learning_rate(LrSchedule::Constant, 2.0, 4, 20, 0.0, 1), 1.0);
    }

    #[test]
    fn a_schedule_on_the_budget_ends_decayed_when_the_time_runs_out() {
        let at = |elapsed| budget_schedule_step(300, 0, 800, 0, elapsed, 200.0);
        assert_eq!(at(0.0), 300);
        assert_eq!(at(200.0), 799);
        assert_eq!(at(1000.0), 799);
        assert_eq!(
            learning_rate(LrSchedule::Linear, 2e-4, 0, 800, 0.0, at(200.0)),
            0.0
        );
        // Warm-up is not compressed.
        assert_eq!(budget_schedule_step(3, 0, 800, 10, 150.0, 200.0), 3);
    }
}
