//! `Progress`: the terminal progress bar with the key numbers of the last step.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::keys;
use crate::record::MetricRow;

/// Bar layout: position, elapsed and remaining time, then [`progress_summary`].
const TEMPLATE: &str = "{bar:30.cyan/blue} {pos}/{len} [{elapsed_precise}<{eta_precise}] {msg}";

/// The metrics shown in the progress message, with their short labels.
const SHOWN: [(&str, &str); 5] = [
    (keys::REWARD_MEAN, "reward"),
    (keys::ACCURACY, "acc"),
    (keys::LOSS, "loss"),
    (keys::KL, "kl"),
    (keys::LR, "lr"),
];

/// A progress bar on stderr showing the step and the key numbers of the last logged row.
///
/// Modes, from `new`'s `enabled` and whether stderr is a terminal:
/// - enabled, terminal: an indicatif bar; [`Progress::println`] prints above it.
/// - enabled, not a terminal (logs redirected to a file): no bar; each
///   [`Progress::update`] prints one plain line `step 12/100 | reward 0.53 | ...` and
///   [`Progress::println`] prints its message, both to stderr.
/// - disabled: silent.
///
/// # Example
/// ```
/// use atomrl_metrics::{MetricRow, Progress};
///
/// let progress = Progress::new(100, 0, false);
/// progress.update(&MetricRow::new(1).with("reward/mean", 0.5));
/// progress.println("sample: ...");
/// progress.finish();
/// assert!(!progress.has_bar());
/// ```
#[derive(Debug)]
pub struct Progress {
    bar: Option<ProgressBar>,
    /// Plain lines to stderr when there is no bar.
    lines: bool,
    total_steps: u64,
}

impl Progress {
    /// A bar for steps `start_step..total_steps` (a resumed run starts at its checkpoint step;
    /// the ETA counts only the steps run by this process).
    ///
    /// # Example
    /// See [`Progress`].
    pub fn new(total_steps: u64, start_step: u64, enabled: bool) -> Self {
        let terminal = std::io::stderr().is_terminal();
        let bar = (enabled && terminal).then(|| {
            let style = ProgressStyle::with_template(TEMPLATE)
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> ");
            let bar =
                ProgressBar::with_draw_target(Some(total_steps), ProgressDrawTarget::stderr())
                    .with_style(style)
                    .with_position(start_step.min(total_steps));
            bar.reset_eta();
            bar
        });
        Self {
            bar,
            lines: enabled && !terminal,
            total_steps,
        }
    }

    /// Moves the bar to `row.step` and shows [`progress_summary`] of the row.
    ///
    /// # Example
    /// See [`Progress`].
    pub fn update(&self, row: &MetricRow) {
        let message = progress_summary(row);
        if let Some(bar) = &self.bar {
            bar.set_position(row.step.min(self.total_steps));
            bar.set_message(message);
        } else if self.lines {
            eprintln!("step {}/{} | {message}", row.step, self.total_steps);
        }
    }

    /// Prints `msg` on its own line above the bar (to stderr; nothing when disabled).
    ///
    /// # Example
    /// See [`Progress`].
    pub fn println(&self, msg: impl AsRef<str>) {
        if let Some(bar) = &self.bar {
            bar.println(msg);
        } else if self.lines {
            eprintln!("{}", msg.as_ref());
        }
    }

    /// Prints a warning on its own line: above the bar when one is shown, otherwise to stderr
    /// (a warning is printed even when progress output is disabled).
    ///
    /// # Example
    /// See [`Progress`].
    pub fn warn(&self, msg: impl AsRef<str>) {
        match &self.bar {
            Some(bar) => bar.println(msg),
            None => eprintln!("{}", msg.as_ref()),
        }
    }

    /// Leaves the finished bar on screen.
    ///
    /// # Example
    /// See [`Progress`].
    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish();
        }
    }

    /// Whether an interactive bar is drawn.
    ///
    /// # Example
    /// See [`Progress`].
    pub fn has_bar(&self) -> bool {
        self.bar.is_some()
    }
}

/// The progress message for a row: reward, accuracy, loss, KL and learning rate when present,
/// then seconds per step, separated by ` | `.
///
/// # Example
/// ```
/// use atomrl_metrics::{progress_summary, MetricRow};
///
/// let row = MetricRow::new(3)
///     .with("reward/mean", 0.53125)
///     .with("accuracy", 0.5)
///     .with("loss", 0.0123)
///     .with("lr", 1e-6)
///     .with("time/step_s", 3.21);
/// assert_eq!(
///     progress_summary(&row),
///     "reward 0.531 | acc 0.500 | loss 0.0123 | lr 1.0e-6 | 3.2 s/step"
/// );
/// ```
pub fn progress_summary(row: &MetricRow) -> String {
    let mut parts: Vec<String> = SHOWN
        .iter()
        .filter_map(|&(key, label)| row.get(key).map(|v| (key, label, v)))
        // A NaN KL is how a step without a reference model (β = 0) records "not computed".
        .filter(|&(key, _, v)| !(key == keys::KL && v.is_nan()))
        .map(|(_, label, v)| format!("{label} {}", fmt_value(v)))
        .collect();
    if let Some(s) = row.get(keys::TIME_STEP_S) {
        parts.push(format!("{s:.1} s/step"));
    }
    parts.join(" | ")
}

/// Three significant-ish digits: fixed for ordinary magnitudes, scientific for tiny/huge ones.
fn fmt_value(v: f64) -> String {
    let a = v.abs();
    if !v.is_finite() {
        format!("{v}")
    } else if a == 0.0 {
        "0".to_string()
    } else if !(1e-3..1e4).contains(&a) {
        format!("{v:.1e}")
    } else if a < 0.1 {
        format!("{v:.4}")
    } else {
        format!("{v:.3}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_formatted_by_magnitude() {
        assert_eq!(fmt_value(0.0), "0");
        assert_eq!(fmt_value(0.5), "0.500");
        assert_eq!(fmt_value(-0.05), "-0.0500");
        assert_eq!(fmt_value(2e-7), "2.0e-7");
        assert_eq!(fmt_value(123.456), "123.456");
        assert_eq!(fmt_value(f64::NAN), "NaN");
    }

    #[test]
    fn missing_metrics_are_left_out() {
        assert_eq!(progress_summary(&MetricRow::new(1)), "");
        assert_eq!(
            progress_summary(&MetricRow::new(1).with("kl", 0.002).with("other", 1.0)),
            "kl 0.0020"
        );
        // β = 0 records the KL as NaN: not shown; a NaN loss is.
        assert_eq!(
            progress_summary(
                &MetricRow::new(1)
                    .with("kl", f64::NAN)
                    .with("loss", f64::NAN)
            ),
            "loss NaN"
        );
    }

    #[test]
    fn disabled_progress_has_no_bar() {
        let p = Progress::new(10, 3, false);
        assert!(!p.has_bar());
        p.update(&MetricRow::new(4));
        p.println("x");
        p.finish();
    }
}
