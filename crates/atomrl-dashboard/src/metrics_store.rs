//! [`RunMetrics`]: a run's `metrics.jsonl` as columns, read incrementally (only the bytes
//! appended since the last read), tolerant of a line being written and of corrupt lines.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use atomrl_metrics::keys::WALL_TIME_S;
use atomrl_metrics::STEP_KEY;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, Visitor};

/// Messages kept per run (the first ones: the rest are counted).
const MAX_MESSAGES: usize = 20;

/// One metric's values: the rows that have it and its value there (NaN when not finite).
/// A metric logged on every row since its first (most are) keeps no row list: only where it
/// starts; the list is made at the first row without it.
#[derive(Debug, Clone, Default)]
pub struct Column {
    /// The first row with the metric.
    start: u32,
    /// Row indices, increasing; empty while the rows are `start..start + values.len()`.
    rows: Vec<u32>,
    /// Values, one per row with the metric.
    values: Vec<f64>,
}

impl Column {
    /// Adds the value of row `r` (rows come in increasing order).
    fn push(&mut self, r: u32, v: f64) {
        let contiguous = self.rows.is_empty();
        if self.values.is_empty() {
            self.start = r;
        } else if contiguous && r != self.start + self.values.len() as u32 {
            self.rows = (self.start..self.start + self.values.len() as u32).collect();
        }
        if !self.rows.is_empty() {
            self.rows.push(r);
        }
        self.values.push(v);
    }

    /// `(row, value)` pairs, in row order.
    pub fn points(&self) -> impl Iterator<Item = (u32, f64)> + '_ {
        let dense = self.rows.is_empty();
        self.values.iter().enumerate().map(move |(i, &v)| {
            let r = if dense {
                self.start + i as u32
            } else {
                self.rows[i]
            };
            (r, v)
        })
    }

    /// The values, one per row with the metric.
    pub fn values(&self) -> &[f64] {
        &self.values
    }

    /// Makes room for `n` more values.
    fn reserve(&mut self, n: usize) {
        self.values.reserve(n);
    }
}

/// A run's metrics as columns. [`RunMetrics::refresh`] reads what was appended to the file
/// since the last call; a file that shrank or was replaced (a resumed run rewrites it) is read
/// again from the start.
///
/// ```
/// use atomrl_dashboard::RunMetrics;
/// let path = std::env::temp_dir().join(format!("atomrl-doc-store-{}.jsonl", std::process::id()));
/// std::fs::write(&path, "{\"step\":1,\"loss\":0.5}\n{\"step\":2,\"loss\":0.25}\n{\"step\":3,\"lo")?;
/// let mut m = RunMetrics::new(&path);
/// m.refresh();
/// assert_eq!(m.steps(), [1, 2]);
/// assert_eq!(m.column("loss").unwrap().values(), [0.5, 0.25]);
/// assert!(m.messages().is_empty()); // the torn last line may still be being written
/// std::fs::write(&path, "{\"step\":1,\"loss\":0.5}\nnot json\n")?;
/// m.refresh();
/// assert_eq!(m.steps(), [1]);
/// assert!(m.messages()[0].contains(":2:"), "{:?}", m.messages());
/// # std::fs::remove_file(&path)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct RunMetrics {
    path: PathBuf,
    /// Identity of the file read: (inode, length read up to).
    inode: u64,
    offset: u64,
    /// Complete lines read (for `path:line` messages).
    lines: usize,
    steps: Vec<u64>,
    /// Wall time of each row (NaN when the row has none).
    wall: Vec<f64>,
    index: HashMap<String, usize>,
    columns: Vec<(String, Column)>,
    /// The column of each key position of the last row: rows repeat their keys in order, so
    /// a key equal to the last row's at its position skips the hash lookup (about a third of
    /// the read time of a large file).
    last_row_columns: Vec<usize>,
    /// The `(key start, key end, value)` of the line being read (kept for its allocation).
    spans: Vec<(u32, u32, f64)>,
    messages: Vec<String>,
    dropped_messages: usize,
    /// A last line without its newline (being written, or torn by a kill).
    partial: bool,
}

impl RunMetrics {
    /// An empty store for the file at `path` (nothing is read until [`RunMetrics::refresh`]).
    pub fn new(path: &Path) -> Self {
        Self {
            path: path.to_path_buf(),
            inode: 0,
            offset: 0,
            lines: 0,
            steps: Vec::new(),
            wall: Vec::new(),
            index: HashMap::new(),
            columns: Vec::new(),
            last_row_columns: Vec::new(),
            spans: Vec::new(),
            messages: Vec::new(),
            dropped_messages: 0,
            partial: false,
        }
    }

    /// Reads what was appended since the last call (everything, when the file was replaced or
    /// shrank). A missing or unreadable file leaves a message.
    pub fn refresh(&mut self) {
        let mut file = match File::open(&self.path) {
            Ok(f) => f,
            Err(e) => {
                *self = Self::new(&self.path.clone());
                self.note(format!("{}: {e}", self.path.display()));
                return;
            }
        };
        let (inode, len) = match file.metadata() {
            Ok(m) => (inode_of(&m), m.len()),
            Err(e) => {
                self.note(format!("{}: {e}", self.path.display()));
                return;
            }
        };
        if inode != self.inode || len < self.offset {
            *self = Self::new(&self.path.clone());
            self.inode = inode;
        }
        if len == self.offset {
            return;
        }
        if let Err(e) = self.read_from(&mut file, len) {
            self.note(format!("{}: {e}", self.path.display()));
        }
    }

    /// Reads the file from `self.offset` to `len` in chunks small enough to stay in the CPU's
    /// cache while they are parsed (one pass over memory rather than a copy of the whole
    /// file, then a second pass); a line cut by a chunk's end is carried to the next.
    fn read_from(&mut self, file: &mut File, len: u64) -> std::io::Result<()> {
        const CHUNK: usize = 1 << 20;
        file.seek(SeekFrom::Start(self.offset))?;
        let mut left = len - self.offset;
        let mut buf: Vec<u8> = Vec::with_capacity(CHUNK.min(left as usize) + 4096);
        while left > 0 {
            let kept = buf.len();
            let want = CHUNK.min(left as usize);
            buf.resize(kept + want, 0);
            file.read_exact(&mut buf[kept..])?;
            left -= want as u64;
            let rows_before = self.steps.len();
            let used = self.consume(&buf);
            buf.drain(..used);
            if rows_before == 0 && left > 0 {
                self.reserve_for(left as f64 * (self.steps.len() as f64 / used.max(1) as f64));
            }
        }
        self.partial = !buf.is_empty();
        Ok(())
    }

    /// Makes room for about `rows` more rows in every column seen so far, so that a large file
    /// grows each column once instead of doubling it (and copying) a dozen times.
    fn reserve_for(&mut self, rows: f64) {
        let rows = rows.clamp(0.0, 1e8) as usize;
        self.steps.reserve(rows);
        self.wall.reserve(rows);
        for (_, c) in &mut self.columns {
            c.reserve(rows);
        }
    }

    /// Parses the complete lines of `bytes` (read from `self.offset`); returns the bytes used.
    fn consume(&mut self, bytes: &[u8]) -> usize {
        let mut start = 0;
        while let Some(nl) = memchr::memchr(b'\n', &bytes[start..]) {
            let line = &bytes[start..start + nl];
            self.lines += 1;
            self.add_line(line);
            start += nl + 1;
        }
        self.offset += start as u64;
        start
    }

    /// Adds one line as a row, or notes why it is not one.
    fn add_line(&mut self, line: &[u8]) {
        let text = match std::str::from_utf8(line) {
            Ok(t) => t.trim(),
            Err(_) => return self.note_line("not UTF-8"),
        };
        if text.is_empty() {
            return;
        }
        let mut spans = std::mem::take(&mut self.spans);
        if scan_spans(text, &mut spans) {
            let pair = |i: usize| {
                let (a, b, v) = spans[i];
                (&text[a as usize..b as usize], v)
            };
            self.add_pairs(spans.len(), pair);
        } else {
            match serde_json::from_str::<Row<'_>>(text) {
                Ok(row) => self.add_pairs(row.0.len(), |i| (row.0[i].0.as_ref(), row.0[i].1)),
                Err(e) => self.note_line(&format!("not a metrics row ({e})")),
            }
        }
        self.spans = spans;
    }

    /// Adds the row of `n` `(key, value)` pairs (`pair(i)`), or notes that it has no step.
    fn add_pairs<'k>(&mut self, n: usize, pair: impl Fn(usize) -> (&'k str, f64)) {
        let step = (0..n).map(&pair).find(|(k, _)| *k == STEP_KEY).map(|p| p.1);
        let Some(step) = step.filter(|v| v.is_finite() && *v >= 0.0 && v.fract() == 0.0) else {
            return self.note_line("no integer `step`");
        };
        let r = self.steps.len() as u32;
        self.steps.push(step as u64);
        let mut wall = f64::NAN;
        let mut position = 0;
        for (key, value) in (0..n).map(pair) {
            if key == STEP_KEY {
                continue;
            }
            if key == WALL_TIME_S {
                wall = value;
                continue;
            }
            let i = match self.last_row_columns.get(position) {
                Some(&i) if self.columns[i].0 == key => i,
                _ => {
                    let i = self.column_index(key);
                    self.last_row_columns.truncate(position);
                    self.last_row_columns.push(i);
                    i
                }
            };
            position += 1;
            self.columns[i].1.push(r, value);
        }
        self.wall.push(wall);
    }

    /// The column of metric `key`, created when new.
    fn column_index(&mut self, key: &str) -> usize {
        if let Some(&i) = self.index.get(key) {
            return i;
        }
        self.index.insert(key.to_string(), self.columns.len());
        self.columns.push((key.to_string(), Column::default()));
        self.columns.len() - 1
    }

    fn note_line(&mut self, why: &str) {
        let msg = format!(
            "{}:{}: {why}; line skipped",
            self.path.display(),
            self.lines
        );
        self.note(msg);
    }

    fn note(&mut self, msg: String) {
        if self.messages.len() < MAX_MESSAGES {
            self.messages.push(msg);
        } else {
            self.dropped_messages += 1;
        }
    }

    /// The step of each row.
    pub fn steps(&self) -> &[u64] {
        &self.steps
    }

    /// The wall time of each row, Unix seconds (NaN where a row has none: runs from before the
    /// logger wrote it).
    pub fn wall_times(&self) -> &[f64] {
        &self.wall
    }

    /// Metric `name`'s column.
    pub fn column(&self, name: &str) -> Option<&Column> {
        self.index.get(name).map(|&i| &self.columns[i].1)
    }

    /// Every metric's name and column, in the order they first appeared.
    pub fn columns(&self) -> impl Iterator<Item = (&str, &Column)> {
        self.columns.iter().map(|(n, c)| (n.as_str(), c))
    }

    /// What went wrong reading the file (corrupt lines, an unreadable file), first ones only.
    pub fn messages(&self) -> Vec<String> {
        let mut m = self.messages.clone();
        if self.dropped_messages > 0 {
            m.push(format!("… and {} more", self.dropped_messages));
        }
        m
    }

    /// Whether the file ends in a line without its newline (being written, or torn).
    pub fn has_partial_line(&self) -> bool {
        self.partial
    }

    /// A string that changes whenever the rows read change.
    pub fn version(&self) -> String {
        format!("{}-{}-{}", self.inode, self.offset, self.steps.len())
    }

    /// Metric `name` as `(step, value)` points with a finite value.
    pub fn finite_points(&self, name: &str) -> Vec<(u64, f64)> {
        self.column(name).map_or_else(Vec::new, |c| {
            c.points()
                .filter(|(_, v)| v.is_finite())
                .map(|(r, v)| (self.steps[r as usize], v))
                .collect()
        })
    }

    /// Every metric as `(x, y)` points with a finite value, `x` the step (`wall = false`) or
    /// the wall time (rows without one left out), in name order, passed to `f` with its name;
    /// the point buffers are reused from one metric to the next.
    pub fn for_each_curve(&self, wall: bool, mut f: impl FnMut(&str, &[f64], &[f64])) {
        let mut names: Vec<(&str, &Column)> = self.columns().collect();
        names.sort_unstable_by_key(|(n, _)| *n);
        let (mut xs, mut ys) = (Vec::new(), Vec::new());
        for (name, c) in names {
            xs.clear();
            ys.clear();
            for (r, v) in c.points() {
                let x = if wall {
                    self.wall[r as usize]
                } else {
                    self.steps[r as usize] as f64
                };
                if v.is_finite() && x.is_finite() {
                    xs.push(x);
                    ys.push(v);
                }
            }
            f(name, &xs, &ys);
        }
    }
}

/// The file's inode (Unix), or its length-independent stand-in elsewhere.
fn inode_of(meta: &std::fs::Metadata) -> u64 {
    #[cfg(unix)]
    {
        std::os::unix::fs::MetadataExt::ino(meta)
    }
    #[cfg(not(unix))]
    {
        let _ = meta;
        1
    }
}

/// One row as `(key, value)` pairs, keys borrowed from the line where they have no escapes: a
/// hand-written visitor rather than `serde_json::Value`, which would allocate a map and a
/// string per key of every row.
struct Row<'a>(Vec<(Cow<'a, str>, f64)>);

/// The `(key start, key end, value)` of a line as the logger writes it — `{"key":number,…}`
/// with `null` for non-finite values, no spaces, no escapes — into `out`, read without a JSON
/// parser, numbers by the standard library's correctly rounded parser (the logged bits
/// exactly; serde_json's default float parsing can be one unit in the last place off); `false`
/// for any other line, which [`serde_json`] then reads.
fn scan_spans(line: &str, out: &mut Vec<(u32, u32, f64)>) -> bool {
    out.clear();
    scan_into(line, out).is_some()
}

fn scan_into(line: &str, out: &mut Vec<(u32, u32, f64)>) -> Option<()> {
    let inner = line.strip_prefix('{')?.strip_suffix('}')?;
    if inner.is_empty() {
        return Some(());
    }
    let mut at = 1; // the byte offset of `item` in `line`
    for item in inner.split(',') {
        // `"key":value`, the key without quotes or escapes: byte scans, no substring search.
        let rest = item.strip_prefix('"')?;
        let end = rest.bytes().position(|c| c == b'"' || c == b'\\')?;
        let value = rest[end..].strip_prefix("\":")?;
        let v = match value.as_bytes().first()? {
            b'n' if value == "null" => f64::NAN,
            // JSON numbers only: `parse` would also take `inf`, `NaN` or a leading `+`.
            b'-' | b'0'..=b'9' => value.parse().ok()?,
            _ => return None,
        };
        let key_start = at + 1;
        out.push((key_start as u32, (key_start + end) as u32, v));
        at += item.len() + 1;
    }
    Some(())
}

impl<'de> serde::Deserialize<'de> for Row<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct RowVisitor;
        impl<'de> Visitor<'de> for RowVisitor {
            type Value = Row<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object of numbers")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Row<'de>, A::Error> {
                let mut pairs = Vec::with_capacity(48);
                while let Some(Key(k)) = map.next_key()? {
                    let Num(v) = map.next_value()?;
                    pairs.push((k, v));
                }
                Ok(Row(pairs))
            }
        }
        d.deserialize_map(RowVisitor)
    }
}

/// A key, borrowed when the JSON string has no escapes.
struct Key<'a>(Cow<'a, str>);

impl<'de> serde::Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(v.to_string())))
            }
        }
        d.deserialize_str(KeyVisitor)
    }
}

/// A metric value: a number, or NaN for `null` (how non-finite values are written) and for
/// anything that is not a number.
struct Num(f64);

impl<'de> serde::Deserialize<'de> for Num {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct NumVisitor;
        impl<'de> Visitor<'de> for NumVisitor {
            type Value = Num;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a number or null")
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Num, E> {
                Ok(Num(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Num, E> {
                Ok(Num(v as f64))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Num, E> {
                Ok(Num(v as f64))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Num, E> {
                Ok(Num(f64::NAN))
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Num, E> {
                Ok(Num(f64::NAN))
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Num, E> {
                Ok(Num(f64::NAN))
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, mut s: A) -> Result<Num, A::Error> {
                while s.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Num(f64::NAN))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Num, A::Error> {
                while m.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Num(f64::NAN))
            }
        }
        d.deserialize_any(NumVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The fast path reads back exactly what the logger wrote (serde_json's shortest
        /// form), and the same keys as serde_json does.
        #[test]
        fn scan_reads_logged_values_exactly(
            values in proptest::collection::vec(
                ("[a-z_/]{1,20}", proptest::option::of(proptest::num::f64::NORMAL | proptest::num::f64::ZERO)),
                0..40,
            ),
        ) {
            let mut map = serde_json::Map::new();
            map.insert("step".into(), 7.into());
            for (k, v) in &values {
                map.insert(k.clone(), v.map_or(serde_json::Value::Null, |x| serde_json::json!(x)));
            }
            let line = serde_json::Value::Object(map.clone()).to_string();
            let mut spans = Vec::new();
            prop_assert!(scan_spans(&line, &mut spans), "a logger line");
            let by_serde: Row<'_> = serde_json::from_str(&line).unwrap();
            prop_assert_eq!(spans.len(), by_serde.0.len());
            for (&(a, b, v), (ks, _)) in spans.iter().zip(&by_serde.0) {
                let k = &line[a as usize..b as usize];
                prop_assert_eq!(k, ks.as_ref());
                match map[k].as_f64() {
                    Some(x) => prop_assert_eq!(v.to_bits(), x.to_bits()),
                    None => prop_assert!(v.is_nan()),
                }
            }
        }
    }

    #[test]
    fn a_column_with_gaps_keeps_its_rows() {
        let mut c = Column::default();
        for (r, v) in [(2, 1.0), (3, 2.0), (5, 3.0), (6, 4.0)] {
            c.push(r, v);
        }
        let points: Vec<(u32, f64)> = c.points().collect();
        assert_eq!(points, [(2, 1.0), (3, 2.0), (5, 3.0), (6, 4.0)]);
        let mut dense = Column::default();
        (4..8).for_each(|r| dense.push(r, f64::from(r)));
        assert!(dense.rows.is_empty());
        assert_eq!(
            dense.points().map(|p| p.0).collect::<Vec<_>>(),
            [4, 5, 6, 7]
        );
    }

    #[test]
    fn other_lines_go_to_serde() {
        for line in [
            r#"{"step": 1, "loss": 0.5}"#,
            r#"{"step":1,"a\"b":0.5}"#,
            r#"{"step":1,"a,b":0.5}"#,
            r#"{"step":1,"note":"text"}"#,
            r#"{"step":1,"x":{"y":1}}"#,
            r#"{"step":1,"x":inf}"#,
        ] {
            assert!(!scan_spans(line, &mut Vec::new()), "{line}");
        }
        let mut spans = Vec::new();
        assert!(scan_spans(r#"{"step":1,"loss":null}"#, &mut spans));
        assert_eq!((spans.len(), spans[1].0, spans[1].1), (2, 11, 15));
        assert!(spans[1].2.is_nan());
    }
}
