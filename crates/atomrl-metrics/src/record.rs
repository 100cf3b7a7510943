//! `MetricRow`: the scalars of one training step, in the order they were pushed.

use atomrl_core::{Error, Result};
use serde_json::{Map, Number, Value};

/// The key that holds the step in a serialised row; no metric may use it.
pub const STEP_KEY: &str = "step";

/// The scalars logged for one step, kept in insertion order.
///
/// A row serialises as one flat JSON object, `step` first, then the metrics in the order they
/// were pushed: `{"step":3,"reward/mean":0.5,"loss":0.01}`. Non-finite values (a skipped step
/// with a NaN loss, say) are written as `null` and read back as `NaN`.
///
/// # Example
/// ```
/// use atomrl_metrics::MetricRow;
///
/// let mut row = MetricRow::new(3);
/// row.push("reward/mean", 0.5).push("loss", f64::NAN);
/// assert_eq!(row.get("reward/mean"), Some(0.5));
/// assert_eq!(row.to_json()?, r#"{"step":3,"reward/mean":0.5,"loss":null}"#);
///
/// let back = MetricRow::from_json(&row.to_json()?)?;
/// assert_eq!(back.step, 3);
/// assert!(back.get("loss").is_some_and(f64::is_nan));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MetricRow {
    /// The optimizer step the metrics belong to.
    pub step: u64,
    /// `(name, value)` pairs, in insertion order, names unique.
    pub values: Vec<(String, f64)>,
}

impl MetricRow {
    /// An empty row for `step`.
    ///
    /// # Example
    /// ```
    /// use atomrl_metrics::MetricRow;
    ///
    /// let row = MetricRow::new(7);
    /// assert_eq!(row.step, 7);
    /// assert!(row.is_empty());
    /// ```
    pub fn new(step: u64) -> Self {
        Self {
            step,
            values: Vec::new(),
        }
    }

    /// Sets metric `name` to `value`: appended if new, replaced in place if already present
    /// (so the JSON object never has duplicate keys). Returns `self` for chaining.
    ///
    /// The name `step` is reserved for [`MetricRow::step`]; [`MetricRow::to_json`] rejects a
    /// row holding it.
    ///
    /// # Example
    /// ```
    /// use atomrl_metrics::MetricRow;
    ///
    /// let mut row = MetricRow::new(1);
    /// row.push("kl", 0.1).push("lr", 1e-6).push("kl", 0.2);
    /// assert_eq!(row.values, vec![("kl".to_string(), 0.2), ("lr".to_string(), 1e-6)]);
    /// ```
    pub fn push(&mut self, name: impl Into<String>, value: f64) -> &mut Self {
        let name = name.into();
        match self.values.iter_mut().find(|(n, _)| *n == name) {
            Some(slot) => slot.1 = value,
            None => self.values.push((name, value)),
        }
        self
    }

    /// [`MetricRow::push`] by value, for building a row in one expression.
    ///
    /// # Example
    /// ```
    /// use atomrl_metrics::MetricRow;
    ///
    /// let row = MetricRow::new(2).with("accuracy", 0.75).with("loss", 0.3);
    /// assert_eq!(row.len(), 2);
    /// ```
    pub fn with(mut self, name: impl Into<String>, value: f64) -> Self {
        self.push(name, value);
        self
    }

    /// The value of metric `name`, if present (`NaN` for a logged non-finite value).
    ///
    /// # Example
    /// ```
    /// use atomrl_metrics::MetricRow;
    ///
    /// let row = MetricRow::new(1).with("kl", 0.1);
    /// assert_eq!(row.get("kl"), Some(0.1));
    /// assert_eq!(row.get("entropy"), None);
    /// ```
    pub fn get(&self, name: &str) -> Option<f64> {
        self.values.iter().find(|(n, _)| n == name).map(|&(_, v)| v)
    }

    /// Number of metrics in the row (the step not counted).
    ///
    /// # Example
    /// ```
    /// use atomrl_metrics::MetricRow;
    ///
    /// assert_eq!(MetricRow::new(1).with("kl", 0.1).len(), 1);
    /// ```
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// Whether the row holds no metric.
    ///
    /// # Example
    /// ```
    /// use atomrl_metrics::MetricRow;
    ///
    /// assert!(MetricRow::new(1).is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// The row as one line of JSON (no trailing newline): `step` first, then the metrics in
    /// insertion order; non-finite values become `null`.
    ///
    /// # Errors
    /// [`Error::Value`] when a metric is named `step`.
    ///
    /// # Example
    /// ```
    /// use atomrl_metrics::MetricRow;
    ///
    /// let row = MetricRow::new(4).with("accuracy", 1.0).with("grad_norm", f64::INFINITY);
    /// assert_eq!(row.to_json()?, r#"{"step":4,"accuracy":1.0,"grad_norm":null}"#);
    /// assert!(MetricRow::new(4).with("step", 1.0).to_json().is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn to_json(&self) -> Result<String> {
        let mut map = Map::with_capacity(self.values.len() + 1);
        map.insert(STEP_KEY.to_string(), Value::from(self.step));
        for (name, value) in &self.values {
            if name == STEP_KEY {
                return Err(Error::value(
                    "MetricRow::to_json",
                    "values",
                    "metric names other than `step` (reserved for the step)",
                    name,
                ));
            }
            let v = Number::from_f64(*value).map_or(Value::Null, Value::Number);
            map.insert(name.clone(), v);
        }
        Ok(Value::Object(map).to_string())
    }

    /// Parses one JSON line written by [`MetricRow::to_json`]: an object with a non-negative
    /// integer `step` and numbers (or `null`, read as `NaN`) for every other key.
    ///
    /// # Errors
    /// [`Error::Value`] naming what is wrong (invalid JSON, no `step`, a non-numeric metric).
    ///
    /// # Example
    /// ```
    /// use atomrl_metrics::MetricRow;
    ///
    /// let row = MetricRow::from_json(r#"{"step": 5, "kl": 0.25, "loss": null}"#)?;
    /// assert_eq!(row.step, 5);
    /// assert_eq!(row.get("kl"), Some(0.25));
    /// assert!(MetricRow::from_json(r#"{"kl": 0.25}"#).is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn from_json(line: &str) -> Result<Self> {
        parse_row(line)
            .map_err(|(expected, got)| Error::value("MetricRow::from_json", "line", expected, got))
    }
}

/// Parses a row; on failure returns `(expected, got)` for the caller's error.
pub(crate) fn parse_row(line: &str) -> std::result::Result<MetricRow, (String, String)> {
    let value: Value = serde_json::from_str(line)
        .map_err(|e| ("a JSON object".to_string(), format!("invalid JSON ({e})")))?;
    let Value::Object(map) = value else {
        return Err(("a JSON object".into(), short(&value)));
    };
    // serde_json (without its `float_roundtrip` feature) may parse a float one ulp off; take
    // the numbers from the text with std's correctly rounded parser instead.
    let raw = raw_values(line).filter(|r| r.len() == map.len());
    let mut row = MetricRow::new(0);
    let mut has_step = false;
    for (i, (key, v)) in map.into_iter().enumerate() {
        if key == STEP_KEY {
            row.step = v
                .as_u64()
                .ok_or_else(|| ("`step` to be a non-negative integer".to_string(), short(&v)))?;
            has_step = true;
            continue;
        }
        let x = match &v {
            Value::Null => f64::NAN,
            Value::Number(n) => raw
                .as_ref()
                .and_then(|r| r[i].parse::<f64>().ok())
                .or_else(|| n.as_f64())
                .unwrap_or(f64::NAN),
            other => return Err((format!("`{key}` to be a number or null"), short(other))),
        };
        row.values.push((key, x));
    }
    if !has_step {
        return Err(("an object with a `step` key".into(), "no `step`".into()));
    }
    Ok(row)
}

/// The raw text of each value of a flat JSON object whose values are scalars (numbers,
/// `null`, `true`, `false`), in order; `None` for anything else (the caller then keeps
/// serde_json's reading). Expects `line` to be valid JSON already.
fn raw_values(line: &str) -> Option<Vec<&str>> {
    let b = line.as_bytes();
    let skip_ws = |mut i: usize| {
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        i
    };
    let mut i = skip_ws(0);
    if b.get(i) != Some(&b'{') {
        return None;
    }
    i = skip_ws(i + 1);
    let mut values = Vec::new();
    if b.get(i) == Some(&b'}') {
        return Some(values);
    }
    loop {
        // Key: a string, possibly with escapes.
        if b.get(i) != Some(&b'"') {
            return None;
        }
        i += 1;
        while i < b.len() && b[i] != b'"' {
            i += if b[i] == b'\\' { 2 } else { 1 };
        }
        i = skip_ws(i + 1);
        if b.get(i) != Some(&b':') {
            return None;
        }
        let start = skip_ws(i + 1);
        let mut end = start;
        while end < b.len() && !matches!(b[end], b',' | b'}') && !b[end].is_ascii_whitespace() {
            if matches!(b[end], b'"' | b'{' | b'[') {
                return None;
            }
            end += 1;
        }
        values.push(line.get(start..end)?);
        i = skip_ws(end);
        match b.get(i) {
            Some(b',') => i = skip_ws(i + 1),
            Some(b'}') => return Some(values),
            _ => return None,
        }
    }
}

/// A JSON value shortened for an error message.
fn short(v: &Value) -> String {
    let s = v.to_string();
    match s.char_indices().nth(60) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn order_is_kept_and_step_first() {
        let row = MetricRow::new(9)
            .with("z", 1.0)
            .with("a", 2.0)
            .with("m", -0.5);
        assert_eq!(
            row.to_json().unwrap(),
            r#"{"step":9,"z":1.0,"a":2.0,"m":-0.5}"#
        );
        let back = MetricRow::from_json(&row.to_json().unwrap()).unwrap();
        assert_eq!(back, row);
    }

    #[test]
    fn non_finite_become_null_and_nan() {
        let row = MetricRow::new(1)
            .with("nan", f64::NAN)
            .with("inf", f64::INFINITY)
            .with("ninf", f64::NEG_INFINITY);
        let json = row.to_json().unwrap();
        assert_eq!(json, r#"{"step":1,"nan":null,"inf":null,"ninf":null}"#);
        let back = MetricRow::from_json(&json).unwrap();
        assert!(back.values.iter().all(|(_, v)| v.is_nan()));
    }

    #[test]
    fn integer_numbers_read_as_floats() {
        let row = MetricRow::from_json(r#"{"dropped_groups": 3, "step": 2}"#).unwrap();
        assert_eq!(row.step, 2);
        assert_eq!(row.get("dropped_groups"), Some(3.0));
    }

    #[test]
    fn bad_rows_are_rejected_with_a_reason() {
        for (line, needle) in [
            ("[1, 2]", "JSON object"),
            ("{\"step\": -1}", "non-negative integer"),
            ("{\"step\": 1.5}", "non-negative integer"),
            ("{\"step\": 1, \"kl\": \"x\"}", "`kl` to be a number"),
            ("{\"kl\": 1}", "`step`"),
            ("{\"step\": 1, ", "invalid JSON"),
        ] {
            let err = MetricRow::from_json(line).unwrap_err().to_string();
            assert!(err.contains(needle), "{line}: {err}");
        }
    }

    #[test]
    fn floats_round_trip_exactly() {
        // serde_json alone reads this one ulp off.
        let x = -5.576645484095888e-223;
        let row = MetricRow::new(0).with("a", x);
        let back = MetricRow::from_json(&row.to_json().unwrap()).unwrap();
        assert_eq!(back.get("a").unwrap().to_bits(), x.to_bits());
    }

    #[test]
    fn raw_values_of_flat_objects() {
        assert_eq!(
            raw_values(r#" { "step" : 1 , "a\"b,}" :-2.5e-3,"c":null } "#),
            Some(vec!["1", "-2.5e-3", "null"])
        );
        assert_eq!(raw_values("{}"), Some(vec![]));
        assert_eq!(raw_values(r#"{"a":"x"}"#), None);
        assert_eq!(raw_values(r#"{"a":[1]}"#), None);
        assert_eq!(raw_values("[1]"), None);
    }

    #[test]
    fn reserved_step_name_is_rejected() {
        let err = MetricRow::new(1).with("step", 2.0).to_json().unwrap_err();
        assert!(err.to_string().contains("reserved"), "{err}");
    }
}
