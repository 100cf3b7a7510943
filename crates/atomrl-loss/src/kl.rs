//! `compute_kl_penalty`: per-token estimators of KL(π ‖ π_ref) from sampled-token log-probs.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

use atomrl_core::{CandleContext, Error, Result};
use candle_core::Tensor;

use crate::check::{check_mask, checked_tokens};

const FUNC: &str = "compute_kl_penalty";

/// k3's log-ratio is clamped to `[-20, 20]` before `exp`, its result to `[-K3_CLAMP, K3_CLAMP]`
/// (verl's `low_var_kl`).
pub const K3_CLAMP: f64 = 10.0;

/// A per-token estimator of KL(π ‖ π_ref) from `logp = log π(y_t)` and `ref = log π_ref(y_t)`
/// of the sampled token (Schulman, "Approximating KL divergence", 2020).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum KlEstimator {
    /// `logp − ref`: unbiased, high variance, can be negative. verl `k1` / `kl`.
    #[serde(alias = "kl")]
    K1,
    /// `½ (logp − ref)²`: biased, low variance. verl `k2` / `mse`.
    #[serde(alias = "mse")]
    K2,
    /// `exp(ref − logp) − (ref − logp) − 1`, with `ref − logp` clamped to ±20 and the result to
    /// ±10: unbiased, non-negative, low variance (GRPO's choice). verl `k3` / `low_var_kl`;
    /// TRL's `beta` term.
    #[default]
    #[serde(alias = "low_var_kl")]
    K3,
    /// `|logp − ref|`. verl `abs`.
    Abs,
}

impl KlEstimator {
    /// Every estimator's canonical name, in declaration order.
    pub const NAMES: [&'static str; 4] = ["k1", "k2", "k3", "abs"];

    /// Every accepted spelling (canonical names and verl's aliases).
    pub const ACCEPTED: [&'static str; 7] = ["k1", "k2", "k3", "abs", "kl", "mse", "low_var_kl"];

    /// Canonical name.
    pub fn name(self) -> &'static str {
        match self {
            Self::K1 => "k1",
            Self::K2 => "k2",
            Self::K3 => "k3",
            Self::Abs => "abs",
        }
    }
}

impl fmt::Display for KlEstimator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for KlEstimator {
    type Err = Error;

    /// Parses a canonical name or one of verl's aliases `kl` (= `k1`), `mse` (= `k2`),
    /// `low_var_kl` (= `k3`).
    fn from_str(s: &str) -> Result<Self, Error> {
        Ok(match s {
            "k1" | "kl" => Self::K1,
            "k2" | "mse" => Self::K2,
            "k3" | "low_var_kl" => Self::K3,
            "abs" => Self::Abs,
            other => {
                return Err(Error::unknown_choice(
                    FUNC,
                    "estimator",
                    &Self::ACCEPTED,
                    other,
                ))
            }
        })
    }
}

/// Output of [`compute_kl_penalty`]; both tensors carry the autograd graph of `log_probs`.
#[derive(Debug, Clone)]
pub struct KlOutput {
    /// Per-token KL estimate `[N, T]`, 0 where masked.
    pub kl: Tensor,
    /// Masked token mean `Σ kl·m / Σ m`, rank 0 (use [`aggregate_loss`](crate::aggregate_loss)
    /// on `kl` for another reduction).
    pub kl_mean: Tensor,
}

/// Per-token KL penalty between the policy and a reference policy, from the log-probs of the
/// sampled tokens.
///
/// With `d = logp − ref`:
///
/// | estimator | per-token value |
/// |---|---|
/// | `k1` | `d` |
/// | `k2` | `½ d²` |
/// | `k3` | `clamp(exp(−d') + d' − 1, −10, 10)` with `d' = clamp(d, −20, 20)` |
/// | `abs` | `|d|` |
///
/// `kl_mean = Σ kl·m / Σ m`. Differentiable with respect to `log_probs` (and `ref_log_probs`);
/// positions clamped by k3 get a zero gradient, as in verl. Masked-out positions are ignored
/// (even NaN or infinite) and get a zero gradient.
///
/// # Shapes
/// - `log_probs`, `ref_log_probs`: `[N, T]`, float.
/// - `mask`: `[N, T]`, 0/1.
/// - returns `kl` `[N, T]` and `kl_mean` (rank 0), in `log_probs`' dtype.
///
/// # Errors
/// `log_probs` not `[N, T]` or not float, `ref_log_probs` or `mask` of other dims, a mask
/// value other than 0/1, an entirely masked batch, a non-finite input where `mask = 1`.
///
/// # Example
/// ```
/// use atomrl_loss::{compute_kl_penalty, KlEstimator};
/// use candle_core::{Device, Tensor};
///
/// let logp = Tensor::new(&[[-1.0f64, -2.0, -0.5]], &Device::Cpu)?;
/// let refp = Tensor::new(&[[-1.0f64, -1.0, -9.0]], &Device::Cpu)?;
/// let mask = Tensor::new(&[[1f64, 1.0, 0.0]], &Device::Cpu)?;
/// let out = compute_kl_penalty(&logp, &refp, &mask, KlEstimator::K3)?;
/// let kl = out.kl.to_vec2::<f64>()?;
/// assert_eq!(kl[0][0], 0.0);
/// assert!((kl[0][1] - (1f64.exp() - 2.0)).abs() < 1e-12); // e^1 − 1 − 1
/// assert_eq!(kl[0][2], 0.0);                              // masked
/// assert!((out.kl_mean.to_scalar::<f64>()? - (1f64.exp() - 2.0) / 2.0).abs() < 1e-12);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn compute_kl_penalty(
    log_probs: &Tensor,
    ref_log_probs: &Tensor,
    mask: &Tensor,
    estimator: KlEstimator,
) -> Result<KlOutput> {
    let m = check_mask(FUNC, "log_probs", log_probs, mask)?;
    let logp = checked_tokens(FUNC, "log_probs", log_probs, "log_probs", &m)?;
    let refp = checked_tokens(FUNC, "ref_log_probs", ref_log_probs, "log_probs", &m)?;
    let d = logp.sub(&refp).ctx(FUNC)?;
    let kl = match estimator {
        KlEstimator::K1 => d,
        KlEstimator::K2 => d.sqr().and_then(|x| x.affine(0.5, 0.0)).ctx(FUNC)?,
        KlEstimator::Abs => d.abs().ctx(FUNC)?,
        KlEstimator::K3 => {
            // verl: kl = clamp(ref − logp, −20, 20); clamp(exp(kl) − kl − 1, −10, 10).
            let x = d.neg().and_then(|x| x.clamp(-20.0, 20.0)).ctx(FUNC)?;
            x.exp()
                .and_then(|e| e.sub(&x))
                .and_then(|v| v.affine(1.0, -1.0))
                .and_then(|v| v.clamp(-K3_CLAMP, K3_CLAMP))
                .ctx(FUNC)?
        }
    };
    let kl = m.select(FUNC, &kl)?;
    let kl_mean = kl
        .sum_all()
        .and_then(|s| s.affine(1.0 / m.valid as f64, 0.0))
        .ctx(FUNC)?;
    Ok(KlOutput { kl, kl_mean })
}

#[cfg(test)]
mod tests {
    use super::*;
    use approx::assert_relative_eq;
    use candle_core::{Device, Var};

    fn kl(est: &str, d: f64) -> f64 {
        let lp = Tensor::new(&[[d]], &Device::Cpu).unwrap();
        let r = Tensor::new(&[[0.0f64]], &Device::Cpu).unwrap();
        let m = Tensor::new(&[[1.0f64]], &Device::Cpu).unwrap();
        let out = compute_kl_penalty(&lp, &r, &m, est.parse().unwrap()).unwrap();
        out.kl.to_vec2::<f64>().unwrap()[0][0]
    }

    #[test]
    fn estimators() {
        assert_relative_eq!(kl("k1", -0.3), -0.3);
        assert_relative_eq!(kl("kl", 0.3), 0.3);
        assert_relative_eq!(kl("k2", -0.3), 0.045);
        assert_relative_eq!(kl("abs", -0.3), 0.3);
        assert_relative_eq!(kl("low_var_kl", 0.3), (-0.3f64).exp() + 0.3 - 1.0);
        assert_eq!(kl("k3", -50.0), 10.0); // clamped result
        assert_eq!(kl("k3", 50.0), 10.0); // e^-20 + 20 − 1 = 19, clamped
        assert_relative_eq!(kl("k3", -2.0), 2f64.exp() - 3.0);
    }

    #[test]
    fn k3_gradient_is_one_minus_exp() {
        let lp = Var::new(&[[0.5f64]], &Device::Cpu).unwrap();
        let r = Tensor::new(&[[0.0f64]], &Device::Cpu).unwrap();
        let m = Tensor::new(&[[1.0f64]], &Device::Cpu).unwrap();
        let out = compute_kl_penalty(lp.as_tensor(), &r, &m, KlEstimator::K3).unwrap();
        let g = out.kl_mean.backward().unwrap();
        let g = g.get(lp.as_tensor()).unwrap().to_vec2::<f64>().unwrap()[0][0];
        assert_relative_eq!(g, 1.0 - (-0.5f64).exp(), epsilon = 1e-12);
    }

    #[test]
    fn unknown_estimator_is_rejected() {
        let e = "full".parse::<KlEstimator>().unwrap_err().to_string();
        assert_eq!(e, "compute_kl_penalty: `estimator` must be one of k1, k2, k3, abs, kl, mse, low_var_kl, got `full`");
    }
}
