//! `metrics.jsonl`: one [`MetricRow`] per line, appended as the run goes, cut back on resume.

use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};

use atomrl_core::{Error, Result};
use serde_json::Value;

use crate::record::{parse_row, MetricRow, STEP_KEY};

/// Appends JSON lines (each an object with a `step`) to a file, one flushed line at a time.
///
/// A run killed with SIGKILL leaves rows for steps after its last checkpoint (and possibly a
/// torn last line). [`JsonlWriter::open`] with `resume_after_step = Some(checkpoint_step)`
/// drops those rows, so the resumed run logs every step exactly once and the file ends up
/// identical to the one an uninterrupted run writes.
///
/// # Example
/// ```
/// use atomrl_metrics::{read_metrics, JsonlWriter, MetricRow};
///
/// let path = std::env::temp_dir().join(format!("atomrl-doc-jsonl-{}.jsonl", std::process::id()));
/// let mut w = JsonlWriter::open(&path, None)?;
/// for step in 1..=4 {
///     w.write(&MetricRow::new(step).with("loss", 1.0 / step as f64))?;
/// }
/// drop(w);
/// // Killed after step 4, resumed from the checkpoint of step 2: steps 3 and 4 are re-logged.
/// let mut w = JsonlWriter::open(&path, Some(2))?;
/// w.write(&MetricRow::new(3).with("loss", 1.0 / 3.0))?;
/// let steps: Vec<u64> = read_metrics(&path)?.iter().map(|r| r.step).collect();
/// assert_eq!(steps, vec![1, 2, 3]);
/// # std::fs::remove_file(&path)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct JsonlWriter {
    path: PathBuf,
    file: File,
    kept_rows: usize,
}

impl JsonlWriter {
    /// Opens `path` for appending.
    ///
    /// - `resume_after_step = None` (a fresh run): the file is created, or emptied if present.
    /// - `Some(s)` (resuming from the checkpoint of step `s`): the file is rewritten keeping only
    ///   the complete lines with `step <= s`, in their original bytes; a torn last line (no
    ///   trailing newline and not valid JSON, as SIGKILL can leave) is dropped. A missing file
    ///   is created empty. The rewrite goes through a temporary file renamed over `path`, so a
    ///   second kill during it loses nothing.
    ///
    /// # Errors
    /// [`Error::File`] when the file cannot be read or written, or when a complete line is not
    /// a JSON object with a non-negative integer `step` (the message names `path:line`).
    ///
    /// # Example
    /// See [`JsonlWriter`].
    pub fn open(path: impl AsRef<Path>, resume_after_step: Option<u64>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let kept_rows = match resume_after_step {
            None => {
                File::create(&path).map_err(|e| Error::file(path.display(), e))?;
                0
            }
            Some(step) => keep_rows_up_to(&path, step)?,
        };
        let file = OpenOptions::new()
            .append(true)
            .create(true)
            .open(&path)
            .map_err(|e| Error::file(path.display(), e))?;
        Ok(Self {
            path,
            file,
            kept_rows,
        })
    }

    /// Appends `row` as one line and flushes it to the OS (no fsync: a process kill loses
    /// nothing written, a power cut may).
    ///
    /// # Errors
    /// [`Error::File`] on a write failure; [`Error::Value`] when a metric is named `step`.
    ///
    /// # Example
    /// See [`JsonlWriter`].
    pub fn write(&mut self, row: &MetricRow) -> Result<()> {
        let line = row.to_json()?;
        self.write_line(&line)
    }

    /// Appends one already-serialised JSON object (no newline inside) and flushes.
    pub(crate) fn write_line(&mut self, line: &str) -> Result<()> {
        let mut buf = Vec::with_capacity(line.len() + 1);
        buf.extend_from_slice(line.as_bytes());
        buf.push(b'\n');
        // One write call per line keeps a kill from interleaving half lines.
        self.file
            .write_all(&buf)
            .and_then(|()| self.file.flush())
            .map_err(|e| Error::file(self.path.display(), e))
    }

    /// The file being written.
    ///
    /// # Example
    /// ```
    /// use atomrl_metrics::JsonlWriter;
    ///
    /// let path = std::env::temp_dir().join(format!("atomrl-doc-path-{}.jsonl", std::process::id()));
    /// let w = JsonlWriter::open(&path, None)?;
    /// assert_eq!(w.path(), path.as_path());
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// How many rows were kept from an earlier run when opening (0 for a fresh run).
    ///
    /// # Example
    /// ```
    /// use atomrl_metrics::{JsonlWriter, MetricRow};
    ///
    /// let path = std::env::temp_dir().join(format!("atomrl-doc-kept-{}.jsonl", std::process::id()));
    /// let mut w = JsonlWriter::open(&path, None)?;
    /// w.write(&MetricRow::new(1))?;
    /// w.write(&MetricRow::new(2))?;
    /// assert_eq!(JsonlWriter::open(&path, Some(1))?.kept_rows(), 1);
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn kept_rows(&self) -> usize {
        self.kept_rows
    }
}

/// Reads every row of a `metrics.jsonl` file. Blank lines are skipped, and so is a torn last
/// line (no trailing newline, not valid JSON) left by a killed run.
///
/// # Errors
/// [`Error::File`] when the file cannot be read or a line is not a valid row; the path is
/// given as `path:line` (1-based).
///
/// # Example
/// ```
/// use atomrl_metrics::read_metrics;
///
/// let path = std::env::temp_dir().join(format!("atomrl-doc-read-{}.jsonl", std::process::id()));
/// std::fs::write(&path, "{\"step\":1,\"kl\":0.5}\n{\"step\":2,\"kl\":nu")?;
/// let rows = read_metrics(&path)?;
/// assert_eq!(rows.len(), 1);
/// assert_eq!(rows[0].get("kl"), Some(0.5));
///
/// std::fs::write(&path, "{\"step\":1}\n{\"kl\":0.5}\n")?;
/// let err = read_metrics(&path).unwrap_err().to_string();
/// assert!(err.contains(".jsonl:2:"), "{err}");
/// # std::fs::remove_file(&path)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn read_metrics(path: impl AsRef<Path>) -> Result<Vec<MetricRow>> {
    let path = path.as_ref();
    let bytes = fs::read(path).map_err(|e| Error::file(path.display(), e))?;
    let mut rows = Vec::new();
    for line in split_lines(&bytes) {
        let Some(text) = line.text(path)? else {
            continue;
        };
        match parse_row(text) {
            Ok(row) => rows.push(row),
            Err(_) if !line.complete => {}
            Err((expected, got)) => {
                return Err(Error::file(
                    format!("{}:{}", path.display(), line.number),
                    format!("expected {expected}, got {got}"),
                ))
            }
        }
    }
    Ok(rows)
}

/// One line of a JSONL file.
struct Line<'a> {
    /// 1-based line number.
    number: usize,
    bytes: &'a [u8],
    /// Whether the line ended with a newline (only the last line may not).
    complete: bool,
}

impl<'a> Line<'a> {
    /// The line as text; `None` for a blank line or for a torn last line that is not UTF-8.
    fn text(&self, path: &Path) -> Result<Option<&'a str>> {
        match std::str::from_utf8(self.bytes) {
            Ok(s) if s.trim().is_empty() => Ok(None),
            Ok(s) => Ok(Some(s)),
            Err(_) if !self.complete => Ok(None),
            Err(e) => Err(Error::file(
                format!("{}:{}", path.display(), self.number),
                format!("not UTF-8 ({e})"),
            )),
        }
    }
}

fn split_lines(bytes: &[u8]) -> Vec<Line<'_>> {
    let mut lines: Vec<Line<'_>> = bytes
        .split(|&b| b == b'\n')
        .enumerate()
        .map(|(i, bytes)| Line {
            number: i + 1,
            bytes,
            complete: true,
        })
        .collect();
    // `split` yields the text after the last newline as a final (possibly empty) piece.
    if let Some(last) = lines.last_mut() {
        last.complete = false;
    }
    lines
}

/// Rewrites `path` keeping the lines whose `step` is at most `max_step`; returns their count.
fn keep_rows_up_to(path: &Path, max_step: u64) -> Result<usize> {
    let bytes = match fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(Error::file(path.display(), e)),
    };
    let mut kept = Vec::with_capacity(bytes.len());
    let mut count = 0;
    for line in split_lines(&bytes) {
        let Some(text) = line.text(path)? else {
            continue;
        };
        let step = match step_of(text) {
            Ok(step) => step,
            Err(_) if !line.complete => continue,
            Err(message) => {
                return Err(Error::file(
                    format!("{}:{}", path.display(), line.number),
                    message,
                ))
            }
        };
        if step <= max_step {
            kept.extend_from_slice(line.bytes);
            kept.push(b'\n');
            count += 1;
        }
    }
    if kept.len() == bytes.len() {
        return Ok(count); // nothing to drop
    }
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    fs::write(&tmp, &kept).map_err(|e| Error::file(tmp.display(), e))?;
    fs::rename(&tmp, path).map_err(|e| Error::file(path.display(), e))?;
    Ok(count)
}

/// The `step` of one JSON line.
fn step_of(text: &str) -> std::result::Result<u64, String> {
    let value: Value =
        serde_json::from_str(text).map_err(|e| format!("expected a JSON object, got {e}"))?;
    value
        .get(STEP_KEY)
        .and_then(Value::as_u64)
        .ok_or_else(|| "expected an object with a non-negative integer `step`".to_string())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn temp(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!(
            "atomrl-jsonl-unit-{name}-{}.jsonl",
            std::process::id()
        ))
    }

    #[test]
    fn split_marks_only_the_last_piece_incomplete() {
        let lines = split_lines(b"a\nb\nc");
        assert_eq!(lines.len(), 3);
        assert!(lines[0].complete && lines[1].complete && !lines[2].complete);
        let lines = split_lines(b"a\n");
        assert_eq!(lines.len(), 2);
        assert!(lines[1].bytes.is_empty());
    }

    #[test]
    fn fresh_open_empties_the_file() {
        let path = temp("fresh");
        fs::write(&path, "{\"step\":1}\n").unwrap();
        let w = JsonlWriter::open(&path, None).unwrap();
        assert_eq!(w.kept_rows(), 0);
        assert_eq!(fs::read(&path).unwrap(), b"");
        fs::remove_file(&path).unwrap();
    }

    #[test]
    fn resume_keeps_original_bytes_and_drops_torn_line() {
        let path = temp("resume");
        let body =
            "{\"step\":1, \"kl\": 1e-3}\n\n{\"step\":2,\"kl\":null}\n{\"step\":3}\n{\"step\":4,\"k";
        fs::write(&path, body).unwrap();
        let mut w = JsonlWriter::open(&path, Some(2)).unwrap();
        assert_eq!(w.kept_rows(), 2);
        w.write(&MetricRow::new(3).with("kl", 0.5)).unwrap();
        assert_eq!(
            fs::read_to_string(&path).unwrap(),
            "{\"step\":1, \"kl\": 1e-3}\n{\"step\":2,\"kl\":null}\n{\"step\":3,\"kl\":0.5}\n"
        );
        assert!(!PathBuf::from(format!("{}.tmp", path.display())).exists());
        fs::remove_file(&path).unwrap();
    }

    #[test]
    fn resume_keeps_a_complete_last_line_missing_its_newline() {
        let path = temp("nonewline");
        fs::write(&path, "{\"step\":1}\n{\"step\":2}").unwrap();
        let mut w = JsonlWriter::open(&path, Some(5)).unwrap();
        assert_eq!(w.kept_rows(), 2);
        w.write(&MetricRow::new(3)).unwrap();
        let steps: Vec<u64> = read_metrics(&path)
            .unwrap()
            .iter()
            .map(|r| r.step)
            .collect();
        assert_eq!(steps, vec![1, 2, 3]);
        fs::remove_file(&path).unwrap();
    }

    #[test]
    fn resume_without_a_file_creates_it() {
        let path = temp("missing");
        let _ = fs::remove_file(&path);
        let w = JsonlWriter::open(&path, Some(10)).unwrap();
        assert_eq!(w.kept_rows(), 0);
        assert!(path.exists());
        fs::remove_file(&path).unwrap();
    }

    #[test]
    fn corrupt_middle_line_is_an_error_naming_the_line() {
        let path = temp("corrupt");
        fs::write(&path, "{\"step\":1}\n{\"step\":\n{\"step\":3}\n").unwrap();
        let err = JsonlWriter::open(&path, Some(2)).unwrap_err().to_string();
        assert!(err.contains(&format!("{}:2:", path.display())), "{err}");
        let err = read_metrics(&path).unwrap_err().to_string();
        assert!(err.contains(&format!("{}:2:", path.display())), "{err}");
        fs::remove_file(&path).unwrap();
    }

    #[test]
    fn torn_utf8_in_last_line_is_dropped() {
        let path = temp("utf8");
        let body = b"{\"step\":1}\n{\"step\":2,\"\xc3";
        fs::write(&path, body).unwrap();
        assert_eq!(read_metrics(&path).unwrap().len(), 1);
        assert_eq!(JsonlWriter::open(&path, Some(9)).unwrap().kept_rows(), 1);
        fs::remove_file(&path).unwrap();
    }
}
