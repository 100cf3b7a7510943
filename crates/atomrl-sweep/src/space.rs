//! The search space: one distribution per configuration key, from the `[search]` table.
//!
//! ```toml
//! [search]
//! lr = { log_uniform = [1e-5, 1e-3] }
//! temperature = { uniform = [0.6, 1.2] }
//! num_generations = { choice = [4, 8, 16] }
//! max_steps = { int = [100, 400] }
//! ```
//!
//! Every sampler works on the unit interval per parameter ([`Param::value_at`] maps `u ∈ [0, 1]`
//! to a value: linearly, on a log scale, rounded to an integer, or to the `⌊u·n⌋`-th choice), so
//! that grid, random and TPE sampling share one description.

use crate::error::{Result, SweepError};

/// The distribution of one key.
#[derive(Debug, Clone, PartialEq)]
pub enum Dist {
    /// Uniform on `[low, high]`.
    Uniform(f64, f64),
    /// Uniform in `log` on `[low, high]`, `0 < low`.
    LogUniform(f64, f64),
    /// An integer, uniform on `low..=high`.
    Int(i64, i64),
    /// One of the listed values.
    Choice(Vec<toml::Value>),
}

/// The distribution names the `[search]` table takes.
pub const DIST_NAMES: [&str; 4] = ["uniform", "log_uniform", "int", "choice"];

/// One searched key.
#[derive(Debug, Clone, PartialEq)]
pub struct Param {
    /// The configuration key (`lr`, `lora.r`).
    pub key: String,
    /// Its distribution.
    pub dist: Dist,
}

impl Param {
    /// The value at `u ∈ [0, 1]` of the distribution (`u` is clamped).
    ///
    /// ```
    /// use atomrl_sweep::space::{Dist, Param};
    /// let p = Param { key: "lr".into(), dist: Dist::LogUniform(1e-4, 1e-2) };
    /// assert!((p.value_at(0.5).as_float().unwrap() - 1e-3).abs() < 1e-12);
    /// let c = Param { key: "g".into(), dist: Dist::Choice(vec![4.into(), 8.into()]) };
    /// assert_eq!(c.value_at(0.99).as_integer(), Some(8));
    /// ```
    pub fn value_at(&self, u: f64) -> toml::Value {
        let u = if u.is_finite() {
            u.clamp(0.0, 1.0)
        } else {
            0.0
        };
        match &self.dist {
            Dist::Uniform(lo, hi) => toml::Value::Float(lo + u * (hi - lo)),
            Dist::LogUniform(lo, hi) => {
                toml::Value::Float((lo.ln() + u * (hi.ln() - lo.ln())).exp())
            }
            Dist::Int(lo, hi) => {
                let span = (hi - lo + 1) as f64;
                toml::Value::Integer(lo + ((u * span).floor() as i64).min(hi - lo))
            }
            Dist::Choice(values) => {
                let i = ((u * values.len() as f64).floor() as usize).min(values.len() - 1);
                values[i].clone()
            }
        }
    }

    /// The unit coordinate of `value` (the inverse of [`Param::value_at`]; clamped to the
    /// range; `None` for a value of another type or not among the choices).
    ///
    /// ```
    /// use atomrl_sweep::space::{Dist, Param};
    /// let p = Param { key: "lr".into(), dist: Dist::LogUniform(1e-4, 1e-2) };
    /// assert!((p.unit_of(&toml::Value::Float(1e-3)).unwrap() - 0.5).abs() < 1e-12);
    /// ```
    pub fn unit_of(&self, value: &toml::Value) -> Option<f64> {
        let num = value
            .as_float()
            .or_else(|| value.as_integer().map(|i| i as f64));
        let u = match &self.dist {
            Dist::Uniform(lo, hi) => (num? - lo) / (hi - lo),
            Dist::LogUniform(lo, hi) => {
                (num?.max(f64::MIN_POSITIVE).ln() - lo.ln()) / (hi.ln() - lo.ln())
            }
            Dist::Int(lo, hi) => (num? - *lo as f64 + 0.5) / (hi - lo + 1) as f64,
            Dist::Choice(values) => {
                let k = values.iter().position(|v| {
                    v == value
                        || (num.is_some()
                            && v.as_float().or_else(|| v.as_integer().map(|i| i as f64)) == num)
                })?;
                (k as f64 + 0.5) / values.len() as f64
            }
        };
        Some(u.clamp(0.0, 1.0))
    }

    /// The number of distinct values, for a discrete distribution.
    pub fn cardinality(&self) -> Option<usize> {
        match &self.dist {
            Dist::Int(lo, hi) => Some((hi - lo + 1) as usize),
            Dist::Choice(v) => Some(v.len()),
            _ => None,
        }
    }

    /// `points` evenly spaced values of a continuous distribution (ends included, on the log
    /// scale for `log_uniform`), every value of a discrete one.
    pub fn grid(&self, points: usize) -> Vec<toml::Value> {
        match self.cardinality() {
            Some(n) => (0..n)
                .map(|i| self.value_at((i as f64 + 0.5) / n as f64))
                .collect(),
            None if points <= 1 => vec![self.value_at(0.5)],
            None => (0..points)
                .map(|i| self.value_at(i as f64 / (points - 1) as f64))
                .collect(),
        }
    }
}

/// Parses the `[search]` table, checking each range.
///
/// # Errors
/// A key whose value is not a one-entry table of a known distribution, a range with
/// `low >= high`, a `log_uniform` with `low <= 0`, an empty `choice`, or no key at all; each
/// names the key (`search.lr`).
///
/// ```
/// use atomrl_sweep::space::parse_search;
/// let t: toml::Table = toml::from_str("lr = { log_uniform = [1e-5, 1e-3] }")?;
/// assert_eq!(parse_search(&t)?.len(), 1);
/// let bad: toml::Table = toml::from_str("lr = { uniform = [1.0, 0.5] }")?;
/// assert!(parse_search(&bad).unwrap_err().to_string().contains("search.lr"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn parse_search(table: &toml::Table) -> Result<Vec<Param>> {
    if table.is_empty() {
        return Err(SweepError::config(
            "search",
            "at least one key, e.g. lr = { log_uniform = [1e-5, 1e-3] }",
            "an empty table",
        ));
    }
    table
        .iter()
        .map(|(key, value)| {
            Ok(Param {
                key: key.clone(),
                dist: parse_dist(&format!("search.{key}"), value)?,
            })
        })
        .collect()
}

fn parse_dist(name: &str, value: &toml::Value) -> Result<Dist> {
    let expected = "a table with one of uniform, log_uniform, int, choice";
    let table = value
        .as_table()
        .filter(|t| t.len() == 1)
        .ok_or_else(|| SweepError::config(name, expected, value))?;
    let (kind, arg) = table
        .iter()
        .next()
        .ok_or_else(|| SweepError::config(name, expected, value))?;
    let name = format!("{name}.{kind}");
    match kind.as_str() {
        "uniform" | "log_uniform" => {
            let (lo, hi) = float_pair(&name, arg)?;
            if kind == "log_uniform" && lo <= 0.0 {
                return Err(SweepError::config(&name, "low > 0 (a log scale)", lo));
            }
            Ok(if kind == "uniform" {
                Dist::Uniform(lo, hi)
            } else {
                Dist::LogUniform(lo, hi)
            })
        }
        "int" => {
            let pair = arg.as_array().filter(|a| a.len() == 2);
            let ints = pair.and_then(|a| Some((a[0].as_integer()?, a[1].as_integer()?)));
            let (lo, hi) =
                ints.ok_or_else(|| SweepError::config(&name, "[low, high] integers", arg))?;
            if lo >= hi {
                return Err(SweepError::config(
                    &name,
                    "low < high",
                    format!("[{lo}, {hi}]"),
                ));
            }
            Ok(Dist::Int(lo, hi))
        }
        "choice" => {
            let values = arg
                .as_array()
                .ok_or_else(|| SweepError::config(&name, "a list of values", arg))?;
            if values.is_empty() {
                return Err(SweepError::config(&name, "at least one value", "[]"));
            }
            Ok(Dist::Choice(values.clone()))
        }
        other => Err(SweepError::config(
            name,
            format!("one of {}", DIST_NAMES.join(", ")),
            other,
        )),
    }
}

fn float_pair(name: &str, arg: &toml::Value) -> Result<(f64, f64)> {
    let num = |v: &toml::Value| v.as_float().or_else(|| v.as_integer().map(|i| i as f64));
    let pair = arg.as_array().filter(|a| a.len() == 2);
    let (lo, hi) = pair
        .and_then(|a| Some((num(&a[0])?, num(&a[1])?)))
        .ok_or_else(|| SweepError::config(name, "[low, high] numbers", arg))?;
    if !(lo.is_finite() && hi.is_finite()) || lo >= hi {
        return Err(SweepError::config(
            name,
            "finite low < high",
            format!("[{lo}, {hi}]"),
        ));
    }
    Ok((lo, hi))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<Vec<Param>> {
        parse_search(&toml::from_str(s).unwrap())
    }

    #[test]
    fn bad_spaces_name_the_key() {
        for (text, key) in [
            ("lr = { uniform = [1.0, 1.0] }", "search.lr.uniform"),
            ("lr = { log_uniform = [0.0, 1.0] }", "search.lr.log_uniform"),
            (
                "lr = { log_uniform = [-1.0, 1.0] }",
                "search.lr.log_uniform",
            ),
            ("g = { choice = [] }", "search.g.choice"),
            ("g = { int = [5, 2] }", "search.g.int"),
            ("g = { normal = [0, 1] }", "search.g.normal"),
            ("g = 3", "search.g"),
            ("g = { int = [1, 2], choice = [1] }", "search.g"),
        ] {
            let err = parse(text).unwrap_err().to_string();
            assert!(err.starts_with(key), "{text}: {err}");
        }
    }

    #[test]
    fn values_cover_the_range_and_the_grid_its_ends() {
        let p = &parse("m = { int = [1, 3] }").unwrap()[0];
        let vals: Vec<i64> = p.grid(7).iter().filter_map(|v| v.as_integer()).collect();
        assert_eq!(vals, [1, 2, 3]);
        assert_eq!(p.value_at(1.0).as_integer(), Some(3));
        let lr = &parse("lr = { log_uniform = [1e-5, 1e-3] }").unwrap()[0];
        let g: Vec<f64> = lr.grid(3).iter().filter_map(|v| v.as_float()).collect();
        assert!(
            (g[0] - 1e-5).abs() < 1e-15
                && (g[1] - 1e-4).abs() < 1e-12
                && (g[2] - 1e-3).abs() < 1e-12
        );
    }
}
