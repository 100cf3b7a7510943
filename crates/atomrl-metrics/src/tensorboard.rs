//! TensorBoard event files: TFRecord framing around hand-encoded `tensorflow.Event` protos.
//!
//! The protobuf messages are encoded by hand (varints and length-delimited fields, about 100
//! lines below): the handful of fields TensorBoard reads does not justify `prost` plus a build
//! script and vendored `.proto` files, and no small, well-kept crate writes event files.
//!
//! Messages written (field numbers from `tensorflow/core/util/event.proto` and
//! `tensorflow/core/framework/summary.proto`):
//!
//! ```text
//! Event      { double wall_time = 1; int64 step = 2; string file_version = 3;
//!              Summary summary = 5; SessionLog session_log = 7; }
//! Summary    { repeated Value value = 1; }
//! Value      { string tag = 1; float simple_value = 2; TensorProto tensor = 8;
//!              SummaryMetadata metadata = 9; }
//! SummaryMetadata { PluginData plugin_data = 1; }   PluginData { string plugin_name = 1; }
//! TensorProto { DataType dtype = 1; TensorShapeProto tensor_shape = 2; repeated bytes string_val = 8; }
//! SessionLog { SessionStatus status = 1; }           // START = 1
//! ```

use std::fs::{self, File, OpenOptions};
use std::io::{BufWriter, ErrorKind, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use atomrl_core::{Error, Result};

use crate::record::MetricRow;

/// The `file_version` of the first event, as TensorFlow writes it.
const FILE_VERSION: &str = "brain.Event:2";
/// `DataType.DT_STRING`.
const DT_STRING: u64 = 7;
/// `SessionLog.SessionStatus.START`.
const SESSION_START: u64 = 1;
/// Added to the rotated CRC32C of TFRecord framing.
const CRC_MASK_DELTA: u32 = 0xa282_ead8;

/// Writes scalars and text to a TensorBoard event file (`tensorboard --logdir` on the folder or
/// any parent shows them).
///
/// Each [`TensorBoardWriter::add_scalars`] call writes one event holding every finite value of
/// the row (TensorBoard cannot draw NaN or infinities; they stay in `metrics.jsonl` as `null`).
/// Events are flushed to the OS after every call.
///
/// # Example
/// ```
/// use atomrl_metrics::{MetricRow, TensorBoardWriter};
///
/// let dir = std::env::temp_dir().join(format!("atomrl-doc-tb-{}", std::process::id()));
/// let mut tb = TensorBoardWriter::create(&dir)?;
/// tb.add_scalars(&MetricRow::new(1).with("reward/mean", 0.5).with("loss", 0.1))?;
/// tb.add_text(1, "samples", "**prompt**: 2+2?\n\n**completion**: 4")?;
/// tb.flush()?;
/// let name = tb.path().file_name().and_then(|n| n.to_str()).unwrap_or_default();
/// assert!(name.starts_with("events.out.tfevents.") && name.ends_with(".atomrl"));
/// # std::fs::remove_dir_all(&dir)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct TensorBoardWriter {
    path: PathBuf,
    out: BufWriter<File>,
}

impl TensorBoardWriter {
    /// Creates `dir` if needed and a new event file in it,
    /// `events.out.tfevents.{unix_secs}.{hostname}.{pid}.atomrl` (a `.{n}` counter goes before
    /// `.atomrl` if that name is taken), starting with the `file_version` event.
    ///
    /// # Errors
    /// [`Error::File`] when the folder or the file cannot be created or written.
    ///
    /// # Example
    /// See [`TensorBoardWriter`].
    pub fn create(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref();
        fs::create_dir_all(dir).map_err(|e| Error::file(dir.display(), e))?;
        let now = wall_time();
        // TensorBoard reads a folder's event files in name order: the name's timestamp must
        // be later than any already there, or a run resumed within the same second (or after
        // a clock step back) would be read before the run it continues.
        let secs = match latest_name_secs(dir)? {
            Some(latest) if latest >= now as u64 => latest + 1,
            _ => now as u64,
        };
        let base = format!(
            "events.out.tfevents.{secs}.{}.{}",
            hostname(),
            std::process::id()
        );
        let mut n = 0u32;
        let (path, file) = loop {
            let name = if n == 0 {
                format!("{base}.atomrl")
            } else {
                format!("{base}.{n}.atomrl")
            };
            let path = dir.join(name);
            match OpenOptions::new().write(true).create_new(true).open(&path) {
                Ok(file) => break (path, file),
                Err(e) if e.kind() == ErrorKind::AlreadyExists && n < 1000 => n += 1,
                Err(e) => return Err(Error::file(path.display(), e)),
            }
        };
        let mut writer = Self {
            path,
            out: BufWriter::new(file),
        };
        let mut event = event_header(now, 0);
        event.bytes(3, FILE_VERSION.as_bytes());
        writer.write_event(&event)?;
        Ok(writer)
    }

    /// Writes the finite values of `row` as scalar summaries at `row.step`, tags = metric
    /// names. A row without finite values writes nothing.
    ///
    /// # Errors
    /// [`Error::File`] on a write failure.
    ///
    /// # Example
    /// See [`TensorBoardWriter`].
    pub fn add_scalars(&mut self, row: &MetricRow) -> Result<()> {
        let mut summary = Proto::default();
        for (tag, value) in &row.values {
            if !value.is_finite() {
                continue;
            }
            let mut v = Proto::default();
            v.bytes(1, tag.as_bytes());
            v.float(2, *value as f32);
            summary.message(1, &v);
        }
        if summary.buf.is_empty() {
            return Ok(());
        }
        let mut event = event_header(wall_time(), row.step);
        event.message(5, &summary);
        self.write_event(&event)
    }

    /// Writes `text` (rendered as Markdown by TensorBoard's Text tab) under `tag` at `step`.
    ///
    /// # Errors
    /// [`Error::File`] on a write failure.
    ///
    /// # Example
    /// See [`TensorBoardWriter`].
    pub fn add_text(&mut self, step: u64, tag: &str, text: &str) -> Result<()> {
        let mut plugin = Proto::default();
        plugin.bytes(1, b"text");
        let mut metadata = Proto::default();
        metadata.message(1, &plugin);
        let mut tensor = Proto::default();
        tensor.varint(1, DT_STRING);
        tensor.message(2, &Proto::default()); // a scalar: empty shape
        tensor.bytes(8, text.as_bytes());
        let mut value = Proto::default();
        value.bytes(1, tag.as_bytes());
        value.message(8, &tensor);
        value.message(9, &metadata);
        let mut summary = Proto::default();
        summary.message(1, &value);
        let mut event = event_header(wall_time(), step);
        event.message(5, &summary);
        self.write_event(&event)
    }

    /// Writes a `SessionLog { status: START }` event at `step`. A resumed run writes it with the
    /// first step it will log: TensorBoard then discards the events at `step` and later that a
    /// killed run wrote after its last checkpoint, so the resumed values are not drawn twice.
    ///
    /// # Errors
    /// [`Error::File`] on a write failure.
    ///
    /// # Example
    /// ```
    /// use atomrl_metrics::TensorBoardWriter;
    ///
    /// let dir = std::env::temp_dir().join(format!("atomrl-doc-tb-start-{}", std::process::id()));
    /// let mut tb = TensorBoardWriter::create(&dir)?;
    /// tb.add_session_start(11)?; // resuming from the checkpoint of step 10
    /// # std::fs::remove_dir_all(&dir)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn add_session_start(&mut self, step: u64) -> Result<()> {
        let mut log = Proto::default();
        log.varint(1, SESSION_START);
        let mut event = event_header(wall_time(), step);
        event.message(7, &log);
        self.write_event(&event)
    }

    /// Flushes buffered events to the OS (every `add_*` call already does).
    ///
    /// # Errors
    /// [`Error::File`] on a write failure.
    ///
    /// # Example
    /// See [`TensorBoardWriter`].
    pub fn flush(&mut self) -> Result<()> {
        self.out
            .flush()
            .map_err(|e| Error::file(self.path.display(), e))
    }

    /// The event file being written.
    ///
    /// # Example
    /// See [`TensorBoardWriter`].
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn write_event(&mut self, event: &Proto) -> Result<()> {
        let record = tf_record(&event.buf);
        self.out
            .write_all(&record)
            .and_then(|()| self.out.flush())
            .map_err(|e| Error::file(self.path.display(), e))
    }
}

/// An `Event` with `wall_time` and `step` set.
fn event_header(wall_time: f64, step: u64) -> Proto {
    let mut event = Proto::default();
    event.double(1, wall_time);
    // int64 on the wire: steps beyond i64::MAX do not occur; the varint of the u64 is the
    // same bytes as that of the i64 for every value that does.
    event.varint(2, step);
    event
}

/// The largest `{secs}` of the `events.out.tfevents.{secs}.*` files in `dir`.
fn latest_name_secs(dir: &Path) -> Result<Option<u64>> {
    let entries = fs::read_dir(dir).map_err(|e| Error::file(dir.display(), e))?;
    let mut latest = None;
    for entry in entries {
        let entry = entry.map_err(|e| Error::file(dir.display(), e))?;
        let name = entry.file_name();
        let secs = name
            .to_str()
            .and_then(|n| n.strip_prefix("events.out.tfevents."))
            .and_then(|rest| rest.split('.').next())
            .and_then(|s| s.parse::<u64>().ok());
        latest = latest.max(secs);
    }
    Ok(latest)
}

/// Seconds since the Unix epoch, as TensorFlow's `wall_time`.
fn wall_time() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// The machine's host name for the file name (`localhost` when unknown), restricted to
/// characters that are safe in a file name.
fn hostname() -> String {
    let raw = ["/proc/sys/kernel/hostname", "/etc/hostname"]
        .iter()
        .find_map(|p| fs::read_to_string(p).ok())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .or_else(|| std::env::var("COMPUTERNAME").ok())
        .unwrap_or_default();
    let clean: String = raw
        .trim()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        .collect();
    if clean.is_empty() {
        "localhost".to_string()
    } else {
        clean
    }
}

/// The TFRecord masked CRC32C of `data`.
pub(crate) fn masked_crc32c(data: &[u8]) -> u32 {
    let crc = crc32c::crc32c(data);
    crc.rotate_right(15).wrapping_add(CRC_MASK_DELTA)
}

/// One TFRecord: `u64` LE length, masked CRC of the length bytes, data, masked CRC of data.
pub(crate) fn tf_record(data: &[u8]) -> Vec<u8> {
    let len = (data.len() as u64).to_le_bytes();
    let mut out = Vec::with_capacity(data.len() + 16);
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc32c(&len).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc32c(data).to_le_bytes());
    out
}

/// A protobuf message being encoded (fields appended in the order written).
#[derive(Debug, Default)]
pub(crate) struct Proto {
    pub(crate) buf: Vec<u8>,
}

/// Protobuf wire types.
const VARINT: u64 = 0;
const FIXED64: u64 = 1;
const LEN: u64 = 2;
const FIXED32: u64 = 5;

impl Proto {
    fn raw_varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.buf.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.buf.push(v as u8);
    }

    fn key(&mut self, field: u32, wire_type: u64) {
        self.raw_varint((u64::from(field) << 3) | wire_type);
    }

    /// A varint field (`int64`, `uint64`, `enum`, `bool`).
    pub(crate) fn varint(&mut self, field: u32, v: u64) {
        self.key(field, VARINT);
        self.raw_varint(v);
    }

    /// A `double` field.
    pub(crate) fn double(&mut self, field: u32, v: f64) {
        self.key(field, FIXED64);
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    /// A `float` field.
    pub(crate) fn float(&mut self, field: u32, v: f32) {
        self.key(field, FIXED32);
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    /// A `string` or `bytes` field.
    pub(crate) fn bytes(&mut self, field: u32, v: &[u8]) {
        self.key(field, LEN);
        self.raw_varint(v.len() as u64);
        self.buf.extend_from_slice(v);
    }

    /// An embedded message field.
    pub(crate) fn message(&mut self, field: u32, m: &Proto) {
        self.bytes(field, &m.buf);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn varints_match_the_protobuf_spec() {
        for (v, expected) in [
            (0u64, vec![0x00]),
            (1, vec![0x01]),
            (127, vec![0x7f]),
            (128, vec![0x80, 0x01]),
            (300, vec![0xac, 0x02]),
            (u64::MAX, vec![0xff; 9].into_iter().chain([0x01]).collect()),
        ] {
            let mut p = Proto::default();
            p.raw_varint(v);
            assert_eq!(p.buf, expected, "{v}");
        }
    }

    #[test]
    fn field_keys_and_payloads() {
        let mut p = Proto::default();
        p.varint(2, 150);
        assert_eq!(p.buf, [0x10, 0x96, 0x01]);
        let mut p = Proto::default();
        p.bytes(1, b"testing");
        assert_eq!(
            p.buf,
            [0x0a, 0x07, b't', b'e', b's', b't', b'i', b'n', b'g']
        );
        let mut p = Proto::default();
        p.float(2, 1.0);
        assert_eq!(p.buf, [0x15, 0x00, 0x00, 0x80, 0x3f]);
        let mut p = Proto::default();
        p.double(1, 1.0);
        assert_eq!(p.buf, [0x09, 0, 0, 0, 0, 0, 0, 0xf0, 0x3f]);
    }

    #[test]
    fn masked_crc_of_known_value() {
        // crc32c("123456789") = 0xe3069283 (the CRC-32C check value).
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
        // ((crc >> 15) | (crc << 17)) + 0xa282ead8 (mod 2^32), worked out by hand.
        assert_eq!(masked_crc32c(b"123456789"), 0xc78a_b0e5);
    }

    #[test]
    fn record_framing_layout() {
        let rec = tf_record(b"abc");
        assert_eq!(rec.len(), 8 + 4 + 3 + 4);
        assert_eq!(&rec[..8], &3u64.to_le_bytes());
        assert_eq!(
            &rec[8..12],
            &masked_crc32c(&3u64.to_le_bytes()).to_le_bytes()
        );
        assert_eq!(&rec[12..15], b"abc");
        assert_eq!(&rec[15..], &masked_crc32c(b"abc").to_le_bytes());
    }

    #[test]
    fn hostname_is_file_name_safe() {
        let h = hostname();
        assert!(!h.is_empty());
        assert!(h
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')));
    }
}
