//! Training metrics for AtomRL: `metrics.jsonl`, TensorBoard events, PNG charts, the progress
//! bar.
//!
//! The trainer builds one [`MetricRow`] per step and hands it to a [`MetricsLogger`], which
//! writes it to
//! - `output_dir/metrics.jsonl` ([`JsonlWriter`]): one flat JSON object per line, `step` first,
//!   non-finite values as `null`; read back with [`read_metrics`];
//! - `output_dir/tensorboard/events.out.tfevents.*` ([`TensorBoardWriter`]): the same scalars,
//!   for `tensorboard --logdir output_dir`;
//! - the terminal ([`Progress`]): a bar with reward, accuracy, loss, KL, learning rate and
//!   seconds per step.
//!
//! Every metric key is a constant of [`keys`].
//!
//! Sample completions go to `samples.jsonl`, TensorBoard's Text tab and the terminal
//! ([`MetricsLogger::log_samples`]); at the end [`MetricsLogger::finish`] draws PNG charts
//! into `output_dir/charts/` ([`write_charts`]).
//!
//! Exact resume: opening with `resume_after_step = Some(s)` (the checkpoint's step) drops the
//! rows a killed run wrote after step `s`, and a torn last line, so the resumed run's
//! `metrics.jsonl` has the same rows as an uninterrupted run.
//!
//! ```
//! use atomrl_metrics::{read_metrics, MetricRow, MetricsLogger};
//!
//! let dir = std::env::temp_dir().join(format!("atomrl-doc-logging-{}", std::process::id()));
//! let mut logger = MetricsLogger::create(&dir, None, 3, false)?;
//! for step in 1..=3 {
//!     let mut row = MetricRow::new(step);
//!     row.push("reward/mean", 0.25 * step as f64).push("loss", f64::NAN);
//!     logger.log(&row)?;
//! }
//! let rows = read_metrics(logger.metrics_path())?;
//! assert_eq!(rows.len(), 3);
//! assert_eq!(rows[2].get("reward/mean"), Some(0.75));
//! # drop(logger); // its drop writes the run status
//! # std::fs::remove_dir_all(&dir)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![deny(missing_docs)]

mod best;
mod charts;
mod jsonl;
pub mod keys;
mod logger;
mod progress;
mod record;
mod status;
mod tensorboard;

pub use best::{final_and_best, lower_is_better};
pub use charts::{chart_files, padded_range, register_chart_font, write_charts, CHART_SIZE};
pub use jsonl::{read_metrics, JsonlWriter};
pub use logger::{
    MetricsLogger, CHARTS_DIR, METRICS_FILE, SAMPLES_FILE, SAMPLES_TAG, TENSORBOARD_DIR,
};
pub use progress::{progress_summary, Progress};
pub use record::{MetricRow, STEP_KEY};
pub use status::{unix_now, RunState, RunStatus, STATUS_FILE};
pub use tensorboard::TensorBoardWriter;
