//! `MetricsLogger`: one call per step feeds metrics.jsonl, TensorBoard and the progress bar.

use std::fs;
use std::path::{Path, PathBuf};

use atomrl_core::{Error, Result};
use serde_json::{Map, Value};

use crate::charts::write_charts;
use crate::jsonl::{read_metrics, JsonlWriter};
use crate::keys;
use crate::progress::Progress;
use crate::record::{MetricRow, STEP_KEY};
use crate::status::{unix_now, RunStatus};
use crate::tensorboard::TensorBoardWriter;
use atomrl_core::RolloutRecord;

/// File name of the per-step metrics in the output folder.
pub const METRICS_FILE: &str = "metrics.jsonl";
/// File name of the logged sample completions in the output folder.
pub const SAMPLES_FILE: &str = "samples.jsonl";
/// Folder (in the output folder) of the TensorBoard event files.
pub const TENSORBOARD_DIR: &str = "tensorboard";
/// Folder (in the output folder) of the PNG charts written by [`MetricsLogger::finish`].
pub const CHARTS_DIR: &str = "charts";
/// TensorBoard text tag of the sample completions.
pub const SAMPLES_TAG: &str = "samples";

/// Characters of prompt and completion shown in the progress line of a sample.
const PREVIEW_CHARS: usize = 160;

/// The trainer's logging front end:
///
/// ```text
/// output_dir/
///   metrics.jsonl        one MetricRow per logged step, with its wall time (time/wall_s)
///   samples.jsonl        one RolloutRecord per logged completion, with its step and index
///   status.json          running / finished / failed, and the process (RunStatus)
///   tensorboard/         events.out.tfevents.* (scalars + sample text)
///   charts/*.png         written by `finish`
/// ```
///
/// Dropped before [`MetricsLogger::finish`] (an error or a panic ended the run), the logger
/// marks the run `failed` in `status.json`.
///
/// Resuming (`resume_after_step = Some(s)`, the step of the checkpoint loaded) cuts
/// `metrics.jsonl` and `samples.jsonl` back to the rows with `step <= s` and marks a session
/// restart at `s + 1` in a new TensorBoard event file, so a run killed at any point and resumed
/// ends with the same JSONL rows as an uninterrupted run.
///
/// # Example
/// ```
/// use atomrl_metrics::{MetricRow, MetricsLogger};
///
/// let dir = std::env::temp_dir().join(format!("atomrl-doc-logger-{}", std::process::id()));
/// let mut logger = MetricsLogger::create(&dir, None, 10, false)?;
/// for step in 1..=10 {
///     let row = MetricRow::new(step)
///         .with("reward/mean", step as f64 / 10.0)
///         .with("loss", 1.0 / step as f64);
///     logger.log(&row)?;
/// }
/// let record = atomrl_core::RolloutRecord {
///     group: 0, prompt: "2+2?".into(), completion: "4".into(), reward: 1.0,
///     rewards: Default::default(), advantage: Some(0.0), correct: Some(true),
///     completion_tokens: 1, finish_reason: "eos".into(), tool_calls: vec![],
/// };
/// logger.log_samples(10, &[record])?;
/// let charts = logger.finish()?;
/// assert_eq!(charts.len(), 2); // reward.png, loss.png
/// assert!(dir.join("metrics.jsonl").exists() && dir.join("samples.jsonl").exists());
/// # std::fs::remove_dir_all(&dir)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct MetricsLogger {
    output_dir: PathBuf,
    /// The files and the progress output; `None` for a [`MetricsLogger::disabled`] logger.
    outputs: Option<Outputs>,
}

/// What an enabled logger writes to.
#[derive(Debug)]
struct Outputs {
    metrics: JsonlWriter,
    samples: JsonlWriter,
    tensorboard: TensorBoardWriter,
    progress: Progress,
    /// [`MetricsLogger::finish`] ran: dropping the logger then leaves the status alone.
    finished: std::cell::Cell<bool>,
}

impl MetricsLogger {
    /// Creates `output_dir` and opens its `metrics.jsonl`, `samples.jsonl` and a new
    /// TensorBoard event file in `tensorboard/`; see [`MetricsLogger`] for resuming. The
    /// progress bar covers `total_steps` and is shown when `show_progress` is set and stderr is
    /// a terminal (plain lines when stderr is redirected; see [`Progress`]).
    ///
    /// # Errors
    /// [`Error::File`] when a folder or file cannot be created, or an existing JSONL file is
    /// corrupt before its last line (see [`JsonlWriter::open`]).
    ///
    /// # Example
    /// See [`MetricsLogger`].
    pub fn create(
        output_dir: &Path,
        resume_after_step: Option<u64>,
        total_steps: u64,
        show_progress: bool,
    ) -> Result<Self> {
        fs::create_dir_all(output_dir).map_err(|e| Error::file(output_dir.display(), e))?;
        let metrics = JsonlWriter::open(output_dir.join(METRICS_FILE), resume_after_step)?;
        let samples = JsonlWriter::open(output_dir.join(SAMPLES_FILE), resume_after_step)?;
        let mut tensorboard = TensorBoardWriter::create(output_dir.join(TENSORBOARD_DIR))?;
        if let Some(step) = resume_after_step {
            tensorboard.add_session_start(step.saturating_add(1))?;
        }
        let progress = Progress::new(total_steps, resume_after_step.unwrap_or(0), show_progress);
        RunStatus::start(output_dir, total_steps)?;
        Ok(Self {
            output_dir: output_dir.to_path_buf(),
            outputs: Some(Outputs {
                metrics,
                samples,
                tensorboard,
                progress,
                finished: std::cell::Cell::new(false),
            }),
        })
    }

    /// A logger that writes and prints nothing: what every data-parallel rank but rank 0
    /// holds, so that one process alone writes a run's files and progress. Its paths are
    /// those rank 0's logger writes.
    ///
    /// ```
    /// use atomrl_metrics::{MetricRow, MetricsLogger};
    /// let dir = std::env::temp_dir().join(format!("atomrl-doc-disabled-{}", std::process::id()));
    /// let mut logger = MetricsLogger::disabled(&dir);
    /// logger.log(&MetricRow::new(1).with("loss", 0.5))?;
    /// assert!(logger.finish()?.is_empty());
    /// assert!(!dir.exists());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn disabled(output_dir: &Path) -> Self {
        Self {
            output_dir: output_dir.to_path_buf(),
            outputs: None,
        }
    }

    /// Logs one step: appends the row to `metrics.jsonl` with the wall time
    /// ([`keys::WALL_TIME_S`], Unix seconds, for a wall-time axis), writes its finite values as
    /// TensorBoard scalars (which keep their own wall time) and updates the progress bar.
    ///
    /// # Errors
    /// [`Error::File`] on a write failure; [`Error::Value`] for a metric named `step`.
    ///
    /// # Example
    /// See [`MetricsLogger`].
    pub fn log(&mut self, row: &MetricRow) -> Result<()> {
        let Some(o) = &mut self.outputs else {
            return Ok(());
        };
        let mut stamped = row.clone();
        stamped.push(keys::WALL_TIME_S, unix_now());
        o.metrics.write(&stamped)?;
        o.tensorboard.add_scalars(row)?;
        o.progress.update(row);
        Ok(())
    }

    /// Logs the completions of `step`: one line each in `samples.jsonl` (the record with
    /// `step` and `index`), the first two as a Markdown text summary in TensorBoard (tag
    /// `samples`), and a one-line preview of the first above the progress bar. An empty slice
    /// logs nothing.
    ///
    /// # Errors
    /// [`Error::File`] on a write failure.
    ///
    /// # Example
    /// See [`MetricsLogger`].
    pub fn log_samples(&mut self, step: u64, records: &[RolloutRecord]) -> Result<()> {
        let (Some(o), Some(first)) = (&mut self.outputs, records.first()) else {
            return Ok(());
        };
        for (index, record) in records.iter().enumerate() {
            o.samples.write_line(&sample_line(step, index, record)?)?;
        }
        o.tensorboard.add_text(
            step,
            SAMPLES_TAG,
            &samples_markdown(&records[..records.len().min(2)]),
        )?;
        o.progress.println(format!(
            "step {step} sample (reward {:.3}): {} => {}",
            first.reward,
            preview(&first.prompt),
            preview(&first.completion)
        ));
        Ok(())
    }

    /// Finishes the progress bar, flushes TensorBoard, reads `metrics.jsonl` back and writes
    /// the PNG charts into `output_dir/charts/` (see [`write_charts`]); returns their paths.
    ///
    /// # Errors
    /// [`Error::File`] when the metrics cannot be read back or a chart cannot be written.
    ///
    /// # Example
    /// See [`MetricsLogger`].
    pub fn finish(&self) -> Result<Vec<PathBuf>> {
        let Some(o) = &self.outputs else {
            return Ok(Vec::new());
        };
        o.progress.finish();
        let rows = read_metrics(o.metrics.path())?;
        let charts = write_charts(&rows, &self.output_dir.join(CHARTS_DIR))?;
        RunStatus::end(&self.output_dir, Ok(()))?;
        o.finished.set(true);
        Ok(charts)
    }

    /// Flushes the TensorBoard event file (metrics and samples are flushed on every write).
    ///
    /// # Errors
    /// [`Error::File`] on a write failure.
    ///
    /// # Example
    /// ```
    /// use atomrl_metrics::MetricsLogger;
    ///
    /// let dir = std::env::temp_dir().join(format!("atomrl-doc-flush-{}", std::process::id()));
    /// let mut logger = MetricsLogger::create(&dir, None, 1, false)?;
    /// logger.flush()?;
    /// # drop(logger); // its drop writes the run status
    /// # std::fs::remove_dir_all(&dir)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn flush(&mut self) -> Result<()> {
        self.outputs
            .as_mut()
            .map_or(Ok(()), |o| o.tensorboard.flush())
    }

    /// Prints a message above the progress bar (see [`Progress::println`]).
    ///
    /// # Example
    /// ```
    /// use atomrl_metrics::MetricsLogger;
    ///
    /// let dir = std::env::temp_dir().join(format!("atomrl-doc-println-{}", std::process::id()));
    /// let logger = MetricsLogger::create(&dir, None, 1, false)?;
    /// logger.println("saved checkpoint-1");
    /// # drop(logger); // its drop writes the run status
    /// # std::fs::remove_dir_all(&dir)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn println(&self, msg: impl AsRef<str>) {
        if let Some(o) = &self.outputs {
            o.progress.println(msg);
        }
    }

    /// Prints a warning without breaking the progress bar: above the bar when one is shown,
    /// otherwise to stderr (also when progress output is off, unlike [`MetricsLogger::println`]).
    ///
    /// # Example
    /// ```
    /// use atomrl_metrics::MetricsLogger;
    ///
    /// let dir = std::env::temp_dir().join(format!("atomrl-doc-warn-{}", std::process::id()));
    /// let logger = MetricsLogger::create(&dir, None, 1, false)?;
    /// logger.warn("warning: step 1: update skipped");
    /// # drop(logger); // its drop writes the run status
    /// # std::fs::remove_dir_all(&dir)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn warn(&self, msg: impl AsRef<str>) {
        if let Some(o) = &self.outputs {
            o.progress.warn(msg);
        }
    }

    /// The output folder.
    ///
    /// # Example
    /// ```
    /// use atomrl_metrics::MetricsLogger;
    ///
    /// let dir = std::env::temp_dir().join(format!("atomrl-doc-dirs-{}", std::process::id()));
    /// let logger = MetricsLogger::create(&dir, None, 1, false)?;
    /// assert_eq!(logger.output_dir(), dir.as_path());
    /// assert_eq!(logger.metrics_path(), dir.join("metrics.jsonl"));
    /// assert!(logger.tensorboard_path().starts_with(dir.join("tensorboard")));
    /// # drop(logger); // its drop writes the run status
    /// # std::fs::remove_dir_all(&dir)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn output_dir(&self) -> &Path {
        &self.output_dir
    }

    /// The `metrics.jsonl` file.
    ///
    /// # Example
    /// See [`MetricsLogger::output_dir`].
    pub fn metrics_path(&self) -> PathBuf {
        self.output_dir.join(METRICS_FILE)
    }

    /// The TensorBoard event file of this process (the TensorBoard folder for a
    /// [`disabled`](MetricsLogger::disabled) logger).
    ///
    /// # Example
    /// See [`MetricsLogger::output_dir`].
    pub fn tensorboard_path(&self) -> PathBuf {
        self.outputs.as_ref().map_or_else(
            || self.output_dir.join(TENSORBOARD_DIR),
            |o| o.tensorboard.path().to_path_buf(),
        )
    }
}

impl Drop for MetricsLogger {
    /// A logger dropped before [`MetricsLogger::finish`] ends a run that did not finish: its
    /// status says `failed` (the trainer writes the error itself when it has one).
    fn drop(&mut self) {
        if let Some(o) = &self.outputs {
            if !o.finished.get() {
                let _ = RunStatus::end(&self.output_dir, Err("the run stopped before its end"));
            }
        }
    }
}

/// One line of `samples.jsonl`: `step`, `index`, then the record's fields.
fn sample_line(step: u64, index: usize, record: &RolloutRecord) -> Result<String> {
    let mut map = Map::new();
    map.insert(STEP_KEY.into(), Value::from(step));
    map.insert("index".into(), Value::from(index));
    match serde_json::to_value(record) {
        Ok(Value::Object(fields)) => map.extend(fields),
        Ok(_) => {}
        Err(e) => return Err(Error::file(SAMPLES_FILE, e)),
    }
    Ok(Value::Object(map).to_string())
}

/// The samples as Markdown for TensorBoard's Text tab, prompt and completion in code fences.
fn samples_markdown(samples: &[RolloutRecord]) -> String {
    let mut md = String::new();
    for (i, r) in samples.iter().enumerate() {
        let (prompt, completion, reward) = (&r.prompt, &r.completion, r.reward);
        if i > 0 {
            md.push_str("\n---\n\n");
        }
        md.push_str(&format!(
            "**sample {i}**, reward {reward}\n\n**prompt**\n\n"
        ));
        md.push_str(&fenced(prompt));
        md.push_str("\n**completion**\n\n");
        md.push_str(&fenced(completion));
    }
    md
}

/// `text` in a code fence longer than any run of backticks inside it.
fn fenced(text: &str) -> String {
    let longest = text.split(|c| c != '`').map(str::len).max().unwrap_or(0);
    let fence = "`".repeat(longest.max(2) + 1);
    format!("{fence}text\n{text}\n{fence}\n")
}

/// The first [`PREVIEW_CHARS`] characters of `text` on one line.
fn preview(text: &str) -> String {
    let one_line: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let one_line = one_line.trim();
    match one_line.char_indices().nth(PREVIEW_CHARS) {
        Some((i, _)) => format!("{}…", &one_line[..i]),
        None => one_line.to_string(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn fences_outgrow_backticks_in_the_text() {
        assert_eq!(fenced("x"), "```text\nx\n```\n");
        assert_eq!(fenced("a ```` b"), "`````text\na ```` b\n`````\n");
    }

    #[test]
    fn preview_is_one_line_and_bounded() {
        assert_eq!(preview(" a\nb\t"), "a b");
        let long = "é".repeat(500);
        let p = preview(&long);
        assert_eq!(p.chars().count(), PREVIEW_CHARS + 1);
        assert!(p.ends_with('…'));
    }

    #[test]
    fn markdown_lists_every_sample() {
        let record = |p: &str, c: &str, reward| RolloutRecord {
            group: 0,
            prompt: p.into(),
            completion: c.into(),
            reward,
            rewards: Default::default(),
            advantage: None,
            correct: None,
            completion_tokens: 1,
            finish_reason: "eos".into(),
            tool_calls: vec![],
        };
        let md = samples_markdown(&[record("p0", "c0", 1.0), record("p1", "c1", 0.0)]);
        assert!(md.contains("**sample 0**, reward 1") && md.contains("**sample 1**, reward 0"));
        assert!(md.contains("```text\nc1\n```"));
    }
}
