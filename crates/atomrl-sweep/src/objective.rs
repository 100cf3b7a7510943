//! The objective of a trial, read from its `metrics.jsonl`.

use std::path::Path;

use atomrl_metrics::{read_metrics, MetricRow};

use crate::error::{Result, SweepError};

/// Whether larger or smaller is better.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Larger is better (accuracy, reward).
    Max,
    /// Smaller is better (loss).
    Min,
}

/// Which value of the run counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum At {
    /// The last logged value.
    End,
    /// The best logged value.
    Best,
}

/// The metric a sweep optimises.
#[derive(Debug, Clone, PartialEq)]
pub struct Objective {
    /// A `metrics.jsonl` key; held-out accuracy (`eval/accuracy`) by default.
    pub metric: String,
    /// Maximise or minimise.
    pub mode: Mode,
    /// The value at the end or the best over the run.
    pub at: At,
}

impl Default for Objective {
    fn default() -> Self {
        Self {
            metric: "eval/accuracy".into(),
            mode: Mode::Max,
            at: At::End,
        }
    }
}

impl Objective {
    /// Whether larger is better.
    pub fn maximize(&self) -> bool {
        self.mode == Mode::Max
    }

    /// The objective over `rows`: the last or best finite value of the metric (`None` when the
    /// metric never appears).
    ///
    /// ```
    /// use atomrl_sweep::objective::{At, Mode, Objective};
    /// use atomrl_metrics::MetricRow;
    /// let mut a = MetricRow::new(1); a.push("eval/accuracy", 0.4);
    /// let mut b = MetricRow::new(2); b.push("eval/accuracy", 0.3);
    /// let o = Objective { at: At::Best, ..Objective::default() };
    /// assert_eq!(o.of_rows(&[a.clone(), b.clone()]), Some(0.4));
    /// assert_eq!(Objective::default().of_rows(&[a, b]), Some(0.3));
    /// ```
    pub fn of_rows(&self, rows: &[MetricRow]) -> Option<f64> {
        let mut values = rows.iter().filter_map(|r| r.get(&self.metric));
        match self.at {
            At::End => values.next_back(),
            At::Best => values
                .filter(|v| v.is_finite())
                .reduce(|a, b| match self.mode {
                    Mode::Max => a.max(b),
                    Mode::Min => a.min(b),
                }),
        }
    }

    /// The value the metric had at `step` (its last value logged at or before `step`), once
    /// the run has logged it at `step` or later; `None` before.
    pub fn at_step(&self, rows: &[MetricRow], step: u64) -> Option<f64> {
        let reached = rows
            .iter()
            .any(|r| r.step >= step && r.get(&self.metric).is_some());
        if !reached {
            return None;
        }
        rows.iter()
            .filter(|r| r.step <= step)
            .filter_map(|r| r.get(&self.metric))
            .next_back()
    }
}

/// The rows of a run's `metrics.jsonl` (none when it does not exist yet; a line being
/// written is skipped).
///
/// # Errors
/// A corrupt line, naming the file and line.
pub fn run_rows(run_dir: &Path) -> Result<Vec<MetricRow>> {
    let path = run_dir.join("metrics.jsonl");
    if !path.is_file() {
        return Ok(Vec::new());
    }
    read_metrics(&path).map_err(|e| SweepError::file(&path, e))
}
