//! DAPO's soft overlong punishment, on completion lengths in tokens.

use std::fmt;
use std::str::FromStr;

use atomrl_core::{Error, Result};
use candle_core::Tensor;

use crate::batch::rewards_tensor;

const FUNC: &str = "overlong_penalty";

/// Which formula [`overlong_penalty`] follows beyond `max_len`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum OverlongVariant {
    /// verl 0.9.1 (`verl/workers/reward_manager/dapo.py`): lengths above `max_len` are an error
    /// (a response cannot exceed the generation limit).
    #[default]
    Dapo,
    /// TRL's `get_soft_overlong_punishment`: lengths above `max_len` get `-1 · penalty_factor`
    /// (TRL has no factor; the default factor 1.0 gives its `-1`).
    Trl,
}

impl OverlongVariant {
    /// Canonical names.
    pub const NAMES: [&'static str; 2] = ["dapo", "trl"];

    /// Canonical name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Dapo => "dapo",
            Self::Trl => "trl",
        }
    }
}

impl fmt::Display for OverlongVariant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for OverlongVariant {
    type Err = Error;

    /// `dapo` (alias `verl`) or `trl`.
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "dapo" | "verl" => Ok(Self::Dapo),
            "trl" => Ok(Self::Trl),
            other => Err(Error::unknown_choice(FUNC, "variant", &Self::NAMES, other)),
        }
    }
}

/// Options of [`overlong_penalty`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OverlongOptions {
    /// The maximum completion length in tokens (`max_resp_len` in verl).
    pub max_len: usize,
    /// Length of the soft-punishment buffer just below `max_len` (`1..=max_len`).
    pub buffer_len: usize,
    /// Penalty at `max_len` (finite, `>= 0`; verl's `overlong_buffer.penalty_factor`).
    pub penalty_factor: f64,
    /// Behaviour above `max_len`.
    pub variant: OverlongVariant,
}

impl OverlongOptions {
    /// verl's formula with `penalty_factor = 1.0`.
    pub fn new(max_len: usize, buffer_len: usize) -> Self {
        Self {
            max_len,
            buffer_len,
            penalty_factor: 1.0,
            variant: OverlongVariant::Dapo,
        }
    }

    /// Checks `1 <= buffer_len <= max_len` and a finite, non-negative `penalty_factor`.
    ///
    /// # Errors
    /// [`Error::Value`] naming the option.
    pub fn validate(&self) -> Result<()> {
        if self.buffer_len == 0 {
            return Err(Error::value(FUNC, "buffer_len", "> 0", self.buffer_len));
        }
        if self.buffer_len > self.max_len {
            return Err(Error::value(
                FUNC,
                "buffer_len",
                format!("<= max_len = {}", self.max_len),
                self.buffer_len,
            ));
        }
        if !(self.penalty_factor.is_finite() && self.penalty_factor >= 0.0) {
            return Err(Error::value(
                FUNC,
                "penalty_factor",
                "a finite number >= 0",
                self.penalty_factor,
            ));
        }
        Ok(())
    }
}

/// The overlong penalty of one completion of `length` tokens (options assumed valid; see
/// [`overlong_penalty`] for the formula). `None` when `length > max_len` under
/// [`OverlongVariant::Dapo`].
///
/// # Example
/// ```
/// use atomrl_reward::{overlong_penalty_one, OverlongOptions};
/// let o = OverlongOptions::new(16, 4);
/// assert_eq!(overlong_penalty_one(12, &o), Some(0.0));
/// assert_eq!(overlong_penalty_one(15, &o), Some(-0.75));
/// assert_eq!(overlong_penalty_one(17, &o), None);
/// ```
pub fn overlong_penalty_one(length: usize, opts: &OverlongOptions) -> Option<f64> {
    if length > opts.max_len {
        return match opts.variant {
            OverlongVariant::Dapo => None,
            OverlongVariant::Trl => Some(-opts.penalty_factor),
        };
    }
    let expected = (opts.max_len - opts.buffer_len) as f64;
    let exceed = length as f64 - expected;
    Some((-exceed / opts.buffer_len as f64 * opts.penalty_factor).min(0.0))
}

/// DAPO's soft overlong punishment (verl 0.9.1, `verl/workers/reward_manager/dapo.py`):
///
/// ```text
/// expected = max_len - buffer_len
/// exceed   = length - expected
/// penalty  = min(-exceed / buffer_len * penalty_factor, 0)
/// ```
///
/// So 0 up to `max_len - buffer_len` tokens, then falling linearly to `-penalty_factor` at
/// `max_len`. Under [`OverlongVariant::Trl`] a length above `max_len` gets `-penalty_factor`
/// instead of an error. Add it to the task reward (e.g. with weight 1 in
/// [`WeightedRewards`](crate::WeightedRewards)).
///
/// # Shapes
/// - `lengths`: `N` completion lengths in tokens; returns `[N]` f32 (CPU), each in
///   `[-penalty_factor, 0]`.
///
/// # Errors
/// [`Error::Value`] when `buffer_len` is outside `1..=max_len`, `penalty_factor` is negative or
/// not finite, or (verl variant) a length exceeds `max_len` (named as `lengths[i]`).
///
/// # Example
/// ```
/// use atomrl_reward::{overlong_penalty, OverlongOptions};
/// let p = overlong_penalty(&[0, 12, 13, 16], &OverlongOptions::new(16, 4))?;
/// assert_eq!(p.to_vec1::<f32>()?, vec![0.0, 0.0, -0.25, -1.0]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn overlong_penalty(lengths: &[usize], opts: &OverlongOptions) -> Result<Tensor> {
    opts.validate()?;
    let values = lengths
        .iter()
        .enumerate()
        .map(|(i, &len)| {
            overlong_penalty_one(len, opts)
                .map(|p| p as f32)
                .ok_or_else(|| {
                    Error::value(
                        FUNC,
                        format!("lengths[{i}]"),
                        format!("<= max_len = {}", opts.max_len),
                        len,
                    )
                })
        })
        .collect::<Result<Vec<f32>>>()?;
    rewards_tensor(FUNC, values)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trl_variant_gives_minus_factor_beyond_max_len() {
        let o = OverlongOptions {
            variant: OverlongVariant::Trl,
            ..OverlongOptions::new(16, 4)
        };
        let p = overlong_penalty(&[12, 14, 16, 17, 1000], &o)
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        assert_eq!(p, vec![0.0, -0.5, -1.0, -1.0, -1.0]);
    }

    #[test]
    fn invalid_options_and_lengths_are_named() {
        let e = overlong_penalty(&[5, 17], &OverlongOptions::new(16, 4))
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "overlong_penalty: `lengths[1]` must be <= max_len = 16, got 17"
        );
        assert!(overlong_penalty(&[1], &OverlongOptions::new(16, 0))
            .unwrap_err()
            .to_string()
            .contains("buffer_len"));
        assert!(overlong_penalty(&[1], &OverlongOptions::new(16, 17)).is_err());
        let neg = OverlongOptions {
            penalty_factor: -1.0,
            ..OverlongOptions::new(16, 4)
        };
        assert!(overlong_penalty(&[1], &neg).is_err());
        assert!("foo".parse::<OverlongVariant>().is_err());
    }
}
