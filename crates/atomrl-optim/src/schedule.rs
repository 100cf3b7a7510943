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

/// The share of the time budget after which a run's pace says how many steps the budget will
/// hold (see [`LrHorizon`]); before it, the run keeps the peak it was given.
pub const HORIZON_PACE_SHARE: f64 = 0.05;

/// A lower peak learning rate for a run longer than the one `lr` was tuned for
/// (`lr_horizon_steps`, `lr_horizon_exponent`): the peak of a run of `H` optimizer steps is
/// `lr · (reference_steps / H)^exponent` when `H > reference_steps`, and `lr` otherwise.
///
/// The form is the horizon scaling law of Bjorck et al., "Scaling Optimal LR Across Token
/// Horizons" (ICLR 2025): the best rate falls as a power of the run's length. It matters
/// where the length is not chosen but found: a run bounded by a time budget makes as many
/// steps as the machine allows, and a rate tuned where the budget held 1,000 steps is too
/// large where it holds 7,000 (docs/ppo.md). The rule only lowers the rate: a run shorter
/// than the reference keeps `lr`.
///
/// ```
/// use atomrl_optim::LrHorizon;
/// let h = LrHorizon::new(1000, 0.15);
/// assert_eq!(h.scale(800.0), 1.0);
/// assert!((h.scale(7000.0) - 7f64.powf(-0.15)).abs() < 1e-12); // ~0.747
/// assert_eq!(LrHorizon::OFF.scale(7000.0), 1.0);
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LrHorizon {
    /// The number of optimizer steps the peak was tuned for; 0 turns the rule off.
    pub reference_steps: usize,
    /// How fast the peak falls with the run's length (0 turns the rule off).
    pub exponent: f64,
}

impl LrHorizon {
    /// No scaling: every run keeps its peak.
    pub const OFF: LrHorizon = LrHorizon {
        reference_steps: 0,
        exponent: 0.0,
    };

    /// The rule for a peak tuned over `reference_steps` optimizer steps (0: off).
    pub const fn new(reference_steps: usize, exponent: f64) -> Self {
        LrHorizon {
            reference_steps,
            exponent,
        }
    }

    /// The factor on the peak learning rate of a run of `horizon_steps` optimizer steps, in
    /// (0, 1].
    pub fn scale(&self, horizon_steps: f64) -> f64 {
        let reference = self.reference_steps as f64;
        if self.reference_steps == 0 || self.exponent <= 0.0 || horizon_steps <= reference {
            1.0
        } else {
            (reference / horizon_steps).powf(self.exponent)
        }
    }
}

/// The optimizer steps a run bounded by a time budget will make, from its pace so far: `done`
/// steps completed, `start_step` where this invocation began, `elapsed_s` of its `budget_s`
/// gone. At most `total`. `None` until [`HORIZON_PACE_SHARE`] of the budget has gone (the first
/// steps, slower while buffers and caches warm up, would understate the pace) or while the
/// budget is off.
///
/// ```
/// use atomrl_optim::budget_horizon;
/// // 500 steps in the first quarter of the budget: 2,000 in all.
/// assert_eq!(budget_horizon(500, 0, 100_000, 70.0, 280.0), Some(2000.0));
/// // Resumed at step 1,000: 1,000 + 4 × 500.
/// assert_eq!(budget_horizon(1500, 1000, 100_000, 70.0, 280.0), Some(3000.0));
/// assert_eq!(budget_horizon(500, 0, 1200, 70.0, 280.0), Some(1200.0));
/// assert_eq!(budget_horizon(10, 0, 100_000, 1.0, 280.0), None);
/// ```
pub fn budget_horizon(
    done: usize,
    start_step: usize,
    total: usize,
    elapsed_s: f64,
    budget_s: f64,
) -> Option<f64> {
    if budget_s <= 0.0 {
        return None;
    }
    let share = (elapsed_s / budget_s).min(1.0);
    if share < HORIZON_PACE_SHARE || done <= start_step {
        return None;
    }
    let projected = start_step as f64 + (done - start_step) as f64 / share;
    Some(projected.min(total as f64))
}

/// The learning rate of each step of one run (one invocation: a resumed run starts its own):
/// warm-up, then `schedule` over the steps or, with `on_budget`, over whichever of the steps
/// and the time budget runs out first (see [`budget_schedule_step`]), its peak lowered for a
/// long run by `horizon` (see [`LrHorizon`]: the run's length is `total`, or with `on_budget`
/// the steps its pace will fit in the budget, [`budget_horizon`]).
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
///     horizon: atomrl_optim::LrHorizon::OFF,
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
    /// The lower peak of a run longer than the one the peak was tuned for.
    pub horizon: LrHorizon,
    /// When the steps started: the budget's clock. Starting it at the first step rather than
    /// at launch means a machine fast enough for the steps stays on the step schedule from
    /// the start.
    pub started: std::time::Instant,
}

impl RunSchedule {
    /// The learning rate of the step after `done` completed steps (see [`RunSchedule`] for an
    /// example).
    pub fn lr_at(&self, done: usize) -> f64 {
        let elapsed = self.started.elapsed().as_secs_f64();
        self.lr_after(done, elapsed)
    }

    /// [`RunSchedule::lr_at`] with `elapsed_s` seconds gone since the steps started.
    pub fn lr_after(&self, done: usize, elapsed_s: f64) -> f64 {
        let on_budget = self.on_budget && self.budget_s > 0.0;
        let step = if on_budget {
            budget_schedule_step(
                done,
                self.start_step,
                self.total,
                self.warmup,
                elapsed_s,
                self.budget_s,
            )
        } else {
            done
        };
        let scale = if on_budget {
            budget_horizon(done, self.start_step, self.total, elapsed_s, self.budget_s)
                .map_or(1.0, |h| self.horizon.scale(h))
        } else {
            self.horizon.scale(self.total as f64)
        };
        learning_rate(
            self.schedule,
            self.peak_lr * scale,
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

    fn schedule(total: usize, budget_s: f64, on_budget: bool) -> RunSchedule {
        RunSchedule {
            schedule: LrSchedule::Linear,
            peak_lr: 2e-4,
            min_lr_ratio: 0.0,
            warmup: 0,
            total,
            start_step: 0,
            budget_s,
            on_budget,
            horizon: LrHorizon::new(1000, 0.15),
            started: std::time::Instant::now(),
        }
    }

    #[test]
    fn a_run_of_known_length_scales_its_peak_once() {
        let long = schedule(7000, 0.0, false);
        let peak = 2e-4 * 7f64.powf(-0.15);
        assert!((long.lr_after(0, 0.0) - peak).abs() < 1e-15);
        assert!((long.lr_after(3500, 0.0) - peak * (1.0 - 3500.0 / 6999.0)).abs() < 1e-15);
        let short = schedule(1000, 0.0, false);
        assert_eq!(short.lr_after(0, 0.0), 2e-4);
    }

    #[test]
    fn a_run_on_a_budget_scales_its_peak_by_the_steps_its_pace_will_fit() {
        let s = schedule(100_000, 280.0, true);
        let off = RunSchedule {
            horizon: LrHorizon::OFF,
            ..s
        };
        // Before its pace is known, the run keeps the peak (the decay follows the time).
        assert_eq!(s.lr_after(100, 5.0), off.lr_after(100, 5.0));
        // 1,750 steps in the first quarter: 7,000 in all, three quarters of the way left.
        let expected = 2e-4 * 7f64.powf(-0.15) * (1.0 - 25_000.0 / 99_999.0);
        assert!((s.lr_after(1750, 70.0) - expected).abs() < 1e-15);
        // A slow machine (250 steps a quarter: 1,000 in all) keeps the tuned peak.
        let slow = 2e-4 * (1.0 - 25_000.0 / 99_999.0);
        assert!((s.lr_after(250, 70.0) - slow).abs() < 1e-15);
        // The same run with the rule off.
        assert!((off.lr_after(1750, 70.0) - slow).abs() < 1e-15);
    }
}
