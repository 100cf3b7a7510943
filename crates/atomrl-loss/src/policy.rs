//! `compute_policy_loss`: the clipped surrogate policy loss of PPO, GRPO, DAPO, Dr. GRPO and
//! GSPO, with optional dual clip.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

use atomrl_core::shape::{expect_float, flat_f64, scalar_f64};
use atomrl_core::{CandleContext, Error, Result};
use candle_core::Tensor;

use crate::agg::{aggregate_masked, AggOptions};
use crate::check::{check_mask, checked_tokens, non_negative, TokenMask};

const FUNC: &str = "compute_policy_loss";

/// The log-ratio is clamped to `[-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP]` before `exp` (verl).
pub const LOG_RATIO_CLAMP: f64 = 20.0;

/// Default lower clip `ε_low` (PPO's 0.2).
pub const DEFAULT_CLIP_LOW: f64 = 0.2;

/// Default upper clip `ε_high` (PPO's 0.2; DAPO's clip-higher uses 0.28).
pub const DEFAULT_CLIP_HIGH: f64 = 0.2;

/// At which level the importance ratio is taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum RatioLevel {
    /// One ratio per token, `r_{i,t} = exp(logp − old)` (PPO, GRPO, DAPO).
    #[default]
    Token,
    /// One ratio per sequence, the geometric mean of its token ratios:
    /// `log s_i = Σ_t m·(logp − old) / Σ_t m`, used for every token of row `i` (GSPO; TRL
    /// `importance_sampling_level="sequence"`).
    #[serde(alias = "gspo")]
    Sequence,
}

impl RatioLevel {
    /// Every level's name, in declaration order.
    pub const NAMES: [&'static str; 2] = ["token", "sequence"];

    /// Canonical name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Token => "token",
            Self::Sequence => "sequence",
        }
    }
}

impl fmt::Display for RatioLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for RatioLevel {
    type Err = Error;

    /// Parses `token` or `sequence` (alias `gspo`).
    fn from_str(s: &str) -> Result<Self, Error> {
        Ok(match s {
            "token" => Self::Token,
            "sequence" | "gspo" => Self::Sequence,
            other => {
                return Err(Error::unknown_choice(
                    FUNC,
                    "ratio_level",
                    &Self::NAMES,
                    other,
                ))
            }
        })
    }
}

/// Options of [`compute_policy_loss`]; [`Default`] gives PPO's symmetric clip 0.2, no dual
/// clip, token-level ratio and `token_mean` aggregation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PolicyLossOptions {
    /// `ε_low`: the ratio is clipped from below at `1 − ε_low` (≥ 0; default 0.2).
    pub clip_low: f64,
    /// `ε_high`: the ratio is clipped from above at `1 + ε_high` (≥ 0; default 0.2, DAPO 0.28).
    pub clip_high: f64,
    /// Dual-clip constant `c > 1`: for negative advantages the loss is capped at `−A·c`
    /// (verl's `clip_ratio_c`, usually 3). `None` (default) disables dual clip.
    pub clip_ratio_c: Option<f64>,
    /// Token- or sequence-level ratio (default token).
    pub ratio_level: RatioLevel,
    /// How the per-token loss is reduced, with the optional global normalisers.
    pub agg: AggOptions,
}

impl Default for PolicyLossOptions {
    fn default() -> Self {
        Self {
            clip_low: DEFAULT_CLIP_LOW,
            clip_high: DEFAULT_CLIP_HIGH,
            clip_ratio_c: None,
            ratio_level: RatioLevel::Token,
            agg: AggOptions::default(),
        }
    }
}

impl PolicyLossOptions {
    fn validate(&self) -> Result<()> {
        non_negative(FUNC, "clip_low", self.clip_low)?;
        non_negative(FUNC, "clip_high", self.clip_high)?;
        if let Some(c) = self.clip_ratio_c {
            if !(c > 1.0 && c.is_finite()) {
                return Err(Error::value(FUNC, "clip_ratio_c", "> 1 and finite", c));
            }
        }
        self.agg.validate(FUNC)
    }
}

/// Output of [`compute_policy_loss`]. `loss` and `per_token_loss` carry the autograd graph of
/// `log_probs`; the statistics are detached numbers over the valid (mask = 1) tokens.
#[derive(Debug, Clone)]
pub struct PolicyLossOutput {
    /// The aggregated loss, a rank-0 tensor (dtype of `log_probs`): call `backward` on it.
    pub loss: Tensor,
    /// The per-token loss `ℓ`, `[N, T]`, 0 where masked.
    pub per_token_loss: Tensor,
    /// Share of valid tokens where the clipped term is the one taken (`−A·clip(r) > −A·r`);
    /// verl's `pg_clipfrac`. Equals `clip_frac_low + clip_frac_high`.
    pub clip_frac: f64,
    /// Share of valid tokens clipped at `1 − ε_low` (`A < 0`, `r < 1 − ε_low`).
    pub clip_frac_low: f64,
    /// Share of valid tokens clipped at `1 + ε_high` (`A > 0`, `r > 1 + ε_high`).
    pub clip_frac_high: f64,
    /// With dual clip only: share of valid tokens where the `−A·c` cap applies (`A < 0`);
    /// verl's `pg_clipfrac_lower`.
    pub clip_frac_lower: Option<f64>,
    /// Masked mean of `old − logp` (clamped token log-ratio): an estimate of KL(old ‖ new).
    pub ppo_kl: f64,
    /// Masked mean of the ratio used (token or sequence level).
    pub ratio_mean: f64,
    /// Maximum of the ratio over valid tokens.
    pub ratio_max: f64,
}

/// The clipped surrogate policy-gradient loss (PPO), with the variants of GRPO, DAPO,
/// Dr. GRPO, GSPO and dual-clip PPO.
///
/// With `m` the mask and `A` the advantage (of the row, or of the token):
///
/// ```text
/// r  = exp(clamp(logp − old, −20, 20))                     (token level)
///    | exp(clamp(Σ_t m·(logp − old) / Σ_t m, −20, 20))      (sequence level, GSPO)
/// ℓ  = max(−A·r, −A·clip(r, 1 − ε_low, 1 + ε_high))
/// ℓ  = min(ℓ, −A·c)  where A < 0                            (dual clip, when c is given)
/// loss = aggregate(ℓ, m)                                    (see aggregate_loss)
/// ```
///
/// The result is differentiable with respect to `log_probs` (the ratio's gradient flows through
/// the unclipped term, and through the sequence mean at sequence level). Masked-out positions
/// of every input are ignored, even if NaN or infinite, and get a zero gradient. Clip values of
/// 0 are accepted (a fully clipped objective: verl's fixtures use it).
///
/// # Shapes
/// - `log_probs`, `old_log_probs`: `[N, T]`, float; log-probabilities of the sampled tokens
///   under the current and the behaviour policy.
/// - `advantages`: `[N]` (one per completion, broadcast over tokens) or `[N, T]`.
/// - `mask`: `[N, T]`, 0/1, 1 on completion tokens.
/// - returns `loss` (rank 0) and `per_token_loss` `[N, T]` in `log_probs`' dtype; the other
///   fields are f64 statistics.
///
/// # Errors
/// `log_probs` not `[N, T]` or not float; `old_log_probs`, `mask` or `advantages` of other
/// dims; a mask value other than 0/1; an entirely masked batch; a non-finite input where
/// `mask = 1`; `clip_low` or `clip_high` negative or not finite; `clip_ratio_c ≤ 1`;
/// `max_len = 0`; a global normaliser not > 0.
///
/// # Example
/// ```
/// use atomrl_loss::{compute_policy_loss, PolicyLossOptions};
/// use candle_core::{Device, Tensor, Var};
///
/// let dev = Device::Cpu;
/// let logp = Var::new(&[[-1.0f32, -0.5], [-2.0, -1.0]], &dev)?;
/// let old = Tensor::new(&[[-1.0f32, -1.0], [-1.5, -1.0]], &dev)?;
/// let adv = Tensor::new(&[1.0f32, -1.0], &dev)?;
/// let mask = Tensor::new(&[[1f32, 1.0], [1.0, 0.0]], &dev)?;
/// let out = compute_policy_loss(&logp, &old, &adv, &mask, &PolicyLossOptions::default())?;
/// // Row 0: r = [1, e^0.5 = 1.65 → clipped to 1.2]; row 1: r = e^-0.5 = 0.61 → clipped to 0.8.
/// let l = out.per_token_loss.to_vec2::<f32>()?;
/// assert_eq!(l, vec![vec![-1.0, -1.2], vec![0.8, 0.0]]);
/// assert!((out.loss.to_scalar::<f32>()? - (-1.4 / 3.0)).abs() < 1e-6);
/// assert!((out.clip_frac - 2.0 / 3.0).abs() < 1e-12);
/// let grads = out.loss.backward()?;
/// let g = grads.get(&logp).expect("gradient").to_vec2::<f32>()?;
/// assert_eq!(g, vec![vec![-1.0 / 3.0, 0.0], vec![0.0, 0.0]]); // clipped tokens get none
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn compute_policy_loss(
    log_probs: &Tensor,
    old_log_probs: &Tensor,
    advantages: &Tensor,
    mask: &Tensor,
    opts: &PolicyLossOptions,
) -> Result<PolicyLossOutput> {
    opts.validate()?;
    let m = check_mask(FUNC, "log_probs", log_probs, mask)?;
    let logp = checked_tokens(FUNC, "log_probs", log_probs, "log_probs", &m)?;
    let old = checked_tokens(FUNC, "old_log_probs", old_log_probs, "log_probs", &m)?;
    let adv = checked_advantages(FUNC, advantages, &m)?;

    let token_log_ratio = logp
        .sub(&old)
        .and_then(|d| d.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
        .ctx(FUNC)?;
    let log_ratio = match opts.ratio_level {
        RatioLevel::Token => token_log_ratio.clone(),
        RatioLevel::Sequence => {
            let counts = m
                .float
                .sum_keepdim(1)
                .and_then(|c| c.clamp(1.0, f64::INFINITY))
                .ctx(FUNC)?;
            logp.sub(&old)
                .and_then(|d| d.sum_keepdim(1))
                .and_then(|s| s.div(&counts))
                .and_then(|s| s.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
                .and_then(|s| s.broadcast_as((m.n, m.t)))
                .and_then(|s| s.contiguous())
                .ctx(FUNC)?
        }
    };
    let ratio = log_ratio.exp().ctx(FUNC)?;
    let neg_adv = adv.neg().ctx(FUNC)?;
    let unclipped = neg_adv.mul(&ratio).ctx(FUNC)?;
    let clipped_ratio = ratio
        .clamp(1.0 - opts.clip_low, 1.0 + opts.clip_high)
        .ctx(FUNC)?;
    let clipped = neg_adv.mul(&clipped_ratio).ctx(FUNC)?;
    let pessimistic = unclipped.maximum(&clipped).ctx(FUNC)?;
    let negative = adv.lt(0.0).ctx(FUNC)?;
    let (per_token, dual_bound) = match opts.clip_ratio_c {
        None => (pessimistic.clone(), None),
        Some(c) => {
            let bound = neg_adv.affine(c, 0.0).ctx(FUNC)?;
            let capped = pessimistic.minimum(&bound).ctx(FUNC)?;
            let l = negative.where_cond(&capped, &pessimistic).ctx(FUNC)?;
            (l, Some(bound))
        }
    };
    let per_token_loss = m.select(FUNC, &per_token)?;
    let loss = aggregate_masked(FUNC, &per_token_loss, &m, &opts.agg)?;

    // Statistics, detached, over the valid tokens.
    let as_float = |t: Tensor| t.to_dtype(m.float.dtype()).ctx(FUNC);
    let is_clipped = as_float(clipped.detach().gt(&unclipped.detach()).ctx(FUNC)?)?;
    let positive = as_float(adv.gt(0.0).ctx(FUNC)?)?;
    let negative_f = as_float(negative)?;
    let clip_frac = m.mean_of(FUNC, &is_clipped)?;
    let clip_frac_high = m.mean_of(FUNC, &is_clipped.mul(&positive).ctx(FUNC)?)?;
    let clip_frac_low = m.mean_of(FUNC, &is_clipped.mul(&negative_f).ctx(FUNC)?)?;
    let clip_frac_lower = match dual_bound {
        None => None,
        Some(bound) => {
            let capped = as_float(pessimistic.detach().gt(&bound).ctx(FUNC)?)?;
            Some(m.mean_of(FUNC, &capped.mul(&negative_f).ctx(FUNC)?)?)
        }
    };
    let ppo_kl = -m.mean_of(FUNC, &token_log_ratio)?;
    let ratio_mean = m.mean_of(FUNC, &ratio)?;
    let ratio_max = {
        let floor = ratio.zeros_like().ctx(FUNC)?; // ratios are > 0, so 0 never wins
        scalar_f64(
            FUNC,
            &m.pred
                .where_cond(&ratio.detach(), &floor)
                .and_then(|r| r.max_all())
                .ctx(FUNC)?,
        )?
    };

    Ok(PolicyLossOutput {
        loss,
        per_token_loss,
        clip_frac,
        clip_frac_low,
        clip_frac_high,
        clip_frac_lower,
        ppo_kl,
        ratio_mean,
        ratio_max,
    })
}

/// Checks `advantages` (`[N]` or `[N, T]`, float, finite where used) and returns it as
/// `[N, T]` in the working dtype, 0 where masked; errors name `func`.
pub(crate) fn checked_advantages(func: &str, advantages: &Tensor, m: &TokenMask) -> Result<Tensor> {
    let arg = "advantages";
    expect_float(func, arg, advantages)?;
    let dims = advantages.dims();
    let full = match dims {
        [n] if *n == m.n => {
            // Only rows with a valid token are used; name the row of a bad value.
            let values = flat_f64(func, advantages)?;
            let row_used = |i: usize| m.host[i * m.t..(i + 1) * m.t].iter().any(|&v| v != 0.0);
            if let Some((i, v)) = values
                .iter()
                .enumerate()
                .find(|(i, v)| row_used(*i) && !v.is_finite())
            {
                return Err(Error::value(
                    func,
                    format!("{arg}[{i}]"),
                    "finite (the row has valid tokens)",
                    v,
                ));
            }
            advantages
                .to_dtype(m.float.dtype())
                .and_then(|a| a.reshape((m.n, 1)))
                .and_then(|a| a.broadcast_as((m.n, m.t)))
                .and_then(|a| a.contiguous())
                .ctx(func)?
        }
        [n, t] if *n == m.n && *t == m.t => {
            return checked_tokens(func, arg, advantages, "log_probs", m);
        }
        _ => {
            return Err(Error::shape(
                func,
                arg,
                format!(
                    "[N] = [{}] or [N, T] = [{}, {}] (as log_probs)",
                    m.n, m.n, m.t
                ),
                dims,
            ))
        }
    };
    m.select(func, &full)
}

#[cfg(test)]
mod tests {
    use super::*;
    use approx::assert_relative_eq;
    use candle_core::{Device, Var};

    fn t2(v: &[&[f64]]) -> Tensor {
        let n = v.len();
        let t = v[0].len();
        Tensor::from_vec(v.concat(), (n, t), &Device::Cpu).unwrap()
    }

    #[test]
    fn dual_clip_caps_negative_advantages() {
        // r = e^2 ≈ 7.39 with A = −1: ℓ = max(7.39, 0.8) = 7.39, capped at c = 3.
        let lp = t2(&[&[0.0, 0.0]]);
        let old = t2(&[&[-2.0, 0.0]]);
        let adv = Tensor::new(&[-1.0f64], &Device::Cpu).unwrap();
        let mask = t2(&[&[1.0, 1.0]]);
        let opts = PolicyLossOptions {
            clip_ratio_c: Some(3.0),
            ..Default::default()
        };
        let out = compute_policy_loss(&lp, &old, &adv, &mask, &opts).unwrap();
        assert_eq!(
            out.per_token_loss.to_vec2::<f64>().unwrap(),
            vec![vec![3.0, 1.0]]
        );
        assert_eq!(out.clip_frac_lower, Some(0.5));
        assert_eq!(out.clip_frac, 0.0);
        let out =
            compute_policy_loss(&lp, &old, &adv, &mask, &PolicyLossOptions::default()).unwrap();
        assert_eq!(out.clip_frac_lower, None);
        assert_relative_eq!(
            out.per_token_loss.to_vec2::<f64>().unwrap()[0][0],
            2f64.exp()
        );
    }

    #[test]
    fn sequence_ratio_is_the_geometric_mean_with_gradient() {
        let lp = Var::new(&[[-1.0f64, -2.0, 5.0]], &Device::Cpu).unwrap();
        let old = t2(&[&[-1.1, -2.1, 0.0]]);
        let adv = Tensor::new(&[1.0f64], &Device::Cpu).unwrap();
        let mask = t2(&[&[1.0, 1.0, 0.0]]);
        let opts = PolicyLossOptions {
            ratio_level: RatioLevel::Sequence,
            ..Default::default()
        };
        let out = compute_policy_loss(lp.as_tensor(), &old, &adv, &mask, &opts).unwrap();
        let s = 0.1f64.exp();
        assert_relative_eq!(out.ratio_mean, s, epsilon = 1e-12);
        assert_relative_eq!(out.loss.to_scalar::<f64>().unwrap(), -s, epsilon = 1e-12);
        let g = out.loss.backward().unwrap();
        let g = g.get(lp.as_tensor()).unwrap().to_vec2::<f64>().unwrap();
        // d(−s)/d logp_t = −s · 1/2 for each of the two valid tokens, 0 for the masked one.
        assert_relative_eq!(g[0][0], -s / 2.0, epsilon = 1e-12);
        assert_relative_eq!(g[0][1], -s / 2.0, epsilon = 1e-12);
        assert_eq!(g[0][2], 0.0);
    }

    #[test]
    fn token_level_advantages_and_clip_fractions() {
        let lp = t2(&[&[0.5, -0.5, 0.0]]);
        let old = t2(&[&[0.0, 0.0, 0.0]]);
        let adv = t2(&[&[1.0, -1.0, 2.0]]);
        let mask = t2(&[&[1.0, 1.0, 1.0]]);
        let out =
            compute_policy_loss(&lp, &old, &adv, &mask, &PolicyLossOptions::default()).unwrap();
        assert_relative_eq!(out.clip_frac_high, 1.0 / 3.0);
        assert_relative_eq!(out.clip_frac_low, 1.0 / 3.0);
        assert_relative_eq!(out.clip_frac, 2.0 / 3.0);
        assert_relative_eq!(out.ratio_max, 0.5f64.exp());
        assert_relative_eq!(out.ppo_kl, 0.0);
        let l = out.per_token_loss.to_vec2::<f64>().unwrap();
        assert_relative_eq!(l[0][0], -1.2);
        assert_relative_eq!(l[0][1], 0.8);
        assert_relative_eq!(l[0][2], -2.0);
    }

    #[test]
    fn errors_name_the_argument() {
        let lp = t2(&[&[0.0, 0.0]]);
        let mask = t2(&[&[1.0, 1.0]]);
        let adv = Tensor::new(&[1.0f64], &Device::Cpu).unwrap();
        let run = |old: &Tensor, adv: &Tensor, mask: &Tensor, o: PolicyLossOptions| {
            compute_policy_loss(&lp, old, adv, mask, &o)
                .unwrap_err()
                .to_string()
        };
        let d = PolicyLossOptions::default();
        let e = run(&t2(&[&[0.0, 0.0, 0.0]]), &adv, &mask, d);
        assert_eq!(e, "compute_policy_loss: `old_log_probs` has shape [1, 3], expected [N, T] (same as log_probs) = [1, 2]");
        let e = run(
            &lp,
            &Tensor::new(&[1.0f64, 2.0], &Device::Cpu).unwrap(),
            &mask,
            d,
        );
        assert_eq!(e, "compute_policy_loss: `advantages` has shape [2], expected [N] = [1] or [N, T] = [1, 2] (as log_probs)");
        let e = run(&lp, &adv, &t2(&[&[1.0, 2.0]]), d);
        assert_eq!(e, "compute_policy_loss: `mask[0, 1]` must be 0 or 1, got 2");
        let e = run(&lp, &adv, &t2(&[&[0.0, 0.0]]), d);
        assert!(e.contains("`mask` must be at least one 1"), "{e}");
        let e = run(
            &lp,
            &adv,
            &mask,
            PolicyLossOptions {
                clip_low: -0.1,
                ..d
            },
        );
        assert_eq!(
            e,
            "compute_policy_loss: `clip_low` must be >= 0 and finite, got -0.1"
        );
        let e = run(
            &lp,
            &adv,
            &mask,
            PolicyLossOptions {
                clip_high: f64::NAN,
                ..d
            },
        );
        assert_eq!(
            e,
            "compute_policy_loss: `clip_high` must be >= 0 and finite, got NaN"
        );
        let e = run(
            &lp,
            &adv,
            &mask,
            PolicyLossOptions {
                clip_ratio_c: Some(1.0),
                ..d
            },
        );
        assert_eq!(
            e,
            "compute_policy_loss: `clip_ratio_c` must be > 1 and finite, got 1"
        );
        let e = run(&t2(&[&[f64::NEG_INFINITY, 0.0]]), &adv, &mask, d);
        assert_eq!(
            e,
            "compute_policy_loss: `old_log_probs[0, 0]` must be finite where mask = 1, got -inf"
        );
        let e = run(
            &lp,
            &Tensor::new(&[f64::NAN], &Device::Cpu).unwrap(),
            &mask,
            d,
        );
        assert_eq!(e, "compute_policy_loss: `advantages[0]` must be finite (the row has valid tokens), got NaN");
        let e = compute_policy_loss(&lp, &lp, &adv, &t2(&[&[1.0], &[1.0]]), &d).unwrap_err();
        assert!(
            matches!(&e, Error::Shape { arg, .. } if arg == "mask"),
            "{e}"
        );
        let e = compute_policy_loss(
            &lp,
            &lp,
            &adv,
            &mask,
            &PolicyLossOptions {
                clip_ratio_c: Some(0.5),
                ..d
            },
        );
        assert!(matches!(e, Err(Error::Value { ref arg, .. }) if arg == "clip_ratio_c"));
        let e = "token_sum".parse::<crate::LossAgg>().unwrap_err();
        assert!(matches!(e, Error::UnknownChoice { ref arg, .. } if arg == "loss_agg"));
        let e = "seq".parse::<RatioLevel>().unwrap_err().to_string();
        assert_eq!(
            e,
            "compute_policy_loss: `ratio_level` must be one of token, sequence, got `seq`"
        );
    }
}
