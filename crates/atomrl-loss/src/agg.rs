//! `aggregate_loss`: reduce a per-token loss `[N, T]` to the scalar that is differentiated.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

use atomrl_core::{CandleContext, Error, Result};
use candle_core::Tensor;

use crate::check::{check_finite_where_valid, check_mask, positive, TokenMask};

const FUNC: &str = "aggregate_loss";

/// How a per-token loss `ℓ [N, T]` with mask `m` is reduced to one scalar.
///
/// `L_tok` is the number of valid tokens (`Σ m`, or [`AggOptions::global_tokens`]), `N_seq`
/// the number of rows (`N`, fully-masked rows included, or [`AggOptions::global_seqs`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum LossAgg {
    /// `Σ ℓ·m / L_tok` — every token weighs the same (DAPO). verl `token-mean`; TRL `bnpo`
    /// (local count) and `dapo` (global count).
    #[default]
    #[serde(alias = "token-mean")]
    #[serde(alias = "bnpo")]
    #[serde(alias = "dapo")]
    TokenMean,
    /// `Σ_i (Σ_t ℓ·m / max(Σ_t m, 1)) / N_seq` — mean over rows of each row's token mean (the
    /// original GRPO). verl `seq-mean-token-mean`; TRL `grpo`.
    #[serde(alias = "seq-mean-token-mean")]
    #[serde(alias = "grpo")]
    SeqMeanTokenMean,
    /// `Σ_i Σ_t ℓ·m / N_seq` — mean over rows of each row's token sum. verl `seq-mean-token-sum`.
    #[serde(alias = "seq-mean-token-sum")]
    SeqMeanTokenSum,
    /// `Σ ℓ·m / (N_seq · max_len)` — a constant normaliser (Dr. GRPO). verl
    /// `seq-mean-token-sum-norm`; TRL `dr_grpo`.
    #[serde(alias = "seq-mean-token-sum-norm")]
    #[serde(alias = "dr_grpo")]
    SeqMeanTokenSumNorm,
}

impl LossAgg {
    /// Every mode's canonical name, in declaration order.
    pub const NAMES: [&'static str; 4] = [
        "token_mean",
        "seq_mean_token_mean",
        "seq_mean_token_sum",
        "seq_mean_token_sum_norm",
    ];

    /// Every accepted spelling: canonical names, verl's (hyphenated) and TRL's.
    pub const ACCEPTED: [&'static str; 12] = [
        "token_mean",
        "seq_mean_token_mean",
        "seq_mean_token_sum",
        "seq_mean_token_sum_norm",
        "token-mean",
        "seq-mean-token-mean",
        "seq-mean-token-sum",
        "seq-mean-token-sum-norm",
        "grpo",
        "bnpo",
        "dr_grpo",
        "dapo",
    ];

    /// Canonical name (as accepted by [`FromStr`] and `atomrl-fn`).
    pub fn name(self) -> &'static str {
        match self {
            Self::TokenMean => "token_mean",
            Self::SeqMeanTokenMean => "seq_mean_token_mean",
            Self::SeqMeanTokenSum => "seq_mean_token_sum",
            Self::SeqMeanTokenSumNorm => "seq_mean_token_sum_norm",
        }
    }

    /// Whether the normaliser counts sequences (every mode but `token_mean`).
    pub fn is_per_sequence(self) -> bool {
        self != Self::TokenMean
    }

    pub(crate) fn parse_for(func: &str, arg: &str, s: &str) -> Result<Self> {
        Ok(match s {
            "token_mean" | "token-mean" | "bnpo" | "dapo" => Self::TokenMean,
            "seq_mean_token_mean" | "seq-mean-token-mean" | "grpo" => Self::SeqMeanTokenMean,
            "seq_mean_token_sum" | "seq-mean-token-sum" => Self::SeqMeanTokenSum,
            "seq_mean_token_sum_norm" | "seq-mean-token-sum-norm" | "dr_grpo" => {
                Self::SeqMeanTokenSumNorm
            }
            other => return Err(Error::unknown_choice(func, arg, &Self::ACCEPTED, other)),
        })
    }
}

impl fmt::Display for LossAgg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for LossAgg {
    type Err = Error;

    /// Parses a canonical name, verl's hyphenated spelling (`token-mean`, ...), or one of TRL's
    /// `loss_type` names: `grpo` (= `seq_mean_token_mean`), `bnpo` and `dapo` (= `token_mean`;
    /// DAPO's global count is [`AggOptions::global_tokens`]), `dr_grpo`
    /// (= `seq_mean_token_sum_norm`).
    fn from_str(s: &str) -> Result<Self, Error> {
        Self::parse_for(FUNC, "loss_agg", s)
    }
}

/// Options of [`aggregate_loss`] (and the aggregation part of
/// [`PolicyLossOptions`](crate::PolicyLossOptions)).
///
/// # Gradient accumulation
/// When a batch is split into micro-batches whose losses are summed (gradient accumulation),
/// pass the *whole batch's* normaliser: `global_tokens` = valid tokens over all micro-batches
/// (for `token_mean`), `global_seqs` = rows over all micro-batches (for the `seq_mean_*` modes).
/// The micro-batch losses then add up exactly to the full-batch loss. (Averaging per-micro-batch
/// token means instead weighs tokens of short micro-batches more: TRL issue #3021.)
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AggOptions {
    /// The reduction; default `token_mean`.
    pub mode: LossAgg,
    /// The constant length of `seq_mean_token_sum_norm` (the generation budget); default `T`.
    /// Ignored by the other modes.
    pub max_len: Option<usize>,
    /// Global number of valid tokens replacing `Σ m` in `token_mean` (> 0). Ignored by the
    /// `seq_mean_*` modes.
    pub global_tokens: Option<f64>,
    /// Global number of rows replacing `N` in the `seq_mean_*` modes (> 0). Ignored by
    /// `token_mean`.
    pub global_seqs: Option<f64>,
}

impl Default for AggOptions {
    fn default() -> Self {
        Self {
            mode: LossAgg::TokenMean,
            max_len: None,
            global_tokens: None,
            global_seqs: None,
        }
    }
}

impl AggOptions {
    /// Options with the given mode and no global normaliser.
    pub fn new(mode: LossAgg) -> Self {
        Self {
            mode,
            ..Self::default()
        }
    }

    pub(crate) fn validate(&self, func: &str) -> Result<()> {
        if self.max_len == Some(0) {
            return Err(Error::value(func, "max_len", ">= 1", 0));
        }
        if let Some(g) = self.global_tokens {
            positive(func, "global_tokens", g)?;
        }
        if let Some(g) = self.global_seqs {
            positive(func, "global_seqs", g)?;
        }
        Ok(())
    }
}

/// Reduces a per-token loss to a scalar, differentiably.
///
/// With `ℓ` the per-token loss, `m` the mask, `L_tok = global_tokens.unwrap_or(Σ m)` and
/// `N_seq = global_seqs.unwrap_or(N)`:
///
/// | mode | loss |
/// |---|---|
/// | `token_mean` | `Σ ℓ·m / L_tok` |
/// | `seq_mean_token_mean` | `Σ_i (Σ_t ℓ·m / max(Σ_t m, 1)) / N_seq` |
/// | `seq_mean_token_sum` | `Σ_i Σ_t ℓ·m / N_seq` |
/// | `seq_mean_token_sum_norm` | `Σ ℓ·m / (N_seq · max_len)`, `max_len` defaulting to `T` |
///
/// A fully-masked row contributes 0 and still counts in `N` (verl's semantics). Masked-out
/// positions of `per_token` are ignored, even if they are NaN or infinite, and receive a zero
/// gradient.
///
/// # Shapes
/// - `per_token`: `[N, T]`, float.
/// - `mask`: `[N, T]`, 0/1 (1 = completion token).
/// - returns: a rank-0 tensor of `per_token`'s dtype, with the autograd graph of `per_token`.
///
/// # Errors
/// `per_token` not `[N, T]` or not float, `mask` of other dims, a mask value other than 0/1,
/// an entirely masked batch, a non-finite `per_token` value where `mask = 1`, `max_len = 0`,
/// `global_tokens` or `global_seqs` not > 0.
///
/// # Example
/// ```
/// use atomrl_loss::{aggregate_loss, AggOptions, LossAgg};
/// use candle_core::{Device, Tensor};
///
/// let l = Tensor::new(&[[1f32, 2.0, 3.0], [4.0, 0.0, 0.0]], &Device::Cpu)?;
/// let m = Tensor::new(&[[1f32, 1.0, 1.0], [1.0, 0.0, 0.0]], &Device::Cpu)?;
/// let tok = aggregate_loss(&l, &m, &AggOptions::new(LossAgg::TokenMean))?;
/// assert_eq!(tok.to_scalar::<f32>()?, 10.0 / 4.0);
/// let seq = aggregate_loss(&l, &m, &AggOptions::new(LossAgg::SeqMeanTokenMean))?;
/// assert_eq!(seq.to_scalar::<f32>()?, (2.0 + 4.0) / 2.0);
/// let dr = aggregate_loss(&l, &m, &AggOptions { max_len: Some(5), ..AggOptions::new("dr_grpo".parse()?) })?;
/// assert_eq!(dr.to_scalar::<f32>()?, 10.0 / (2.0 * 5.0));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn aggregate_loss(per_token: &Tensor, mask: &Tensor, opts: &AggOptions) -> Result<Tensor> {
    opts.validate(FUNC)?;
    let m = check_mask(FUNC, "per_token", per_token, mask)?;
    check_finite_where_valid(FUNC, "per_token", per_token, &m)?;
    let masked = m.select(FUNC, per_token)?;
    aggregate_masked(FUNC, &masked, &m, opts)
}

/// [`aggregate_loss`] on an already checked and masked (0 where `m = 0`) per-token loss.
pub(crate) fn aggregate_masked(
    func: &str,
    masked: &Tensor,
    m: &TokenMask,
    opts: &AggOptions,
) -> Result<Tensor> {
    let seqs = opts.global_seqs.unwrap_or(m.n as f64);
    match opts.mode {
        LossAgg::TokenMean => {
            let tokens = opts.global_tokens.unwrap_or(m.valid as f64);
            masked
                .sum_all()
                .and_then(|s| s.affine(1.0 / tokens, 0.0))
                .ctx(func)
        }
        LossAgg::SeqMeanTokenMean => {
            let counts = m
                .float
                .sum(1)
                .and_then(|c| c.clamp(1.0, f64::INFINITY))
                .ctx(func)?;
            masked
                .sum(1)
                .and_then(|rows| rows.div(&counts))
                .and_then(|means| means.sum_all())
                .and_then(|s| s.affine(1.0 / seqs, 0.0))
                .ctx(func)
        }
        LossAgg::SeqMeanTokenSum => masked
            .sum_all()
            .and_then(|s| s.affine(1.0 / seqs, 0.0))
            .ctx(func),
        LossAgg::SeqMeanTokenSumNorm => {
            let max_len = opts.max_len.unwrap_or(m.t) as f64;
            masked
                .sum_all()
                .and_then(|s| s.affine(1.0 / (seqs * max_len), 0.0))
                .ctx(func)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use approx::assert_relative_eq;
    use candle_core::Device;

    fn t(v: &[[f64; 3]]) -> Tensor {
        Tensor::from_vec(v.concat(), (v.len(), 3), &Device::Cpu).unwrap()
    }

    fn agg(l: &Tensor, m: &Tensor, opts: AggOptions) -> f64 {
        aggregate_loss(l, m, &opts)
            .unwrap()
            .to_scalar::<f64>()
            .unwrap()
    }

    #[test]
    fn aliases_parse_to_their_modes() {
        assert_eq!(
            "grpo".parse::<LossAgg>().unwrap(),
            LossAgg::SeqMeanTokenMean
        );
        assert_eq!("bnpo".parse::<LossAgg>().unwrap(), LossAgg::TokenMean);
        assert_eq!("dapo".parse::<LossAgg>().unwrap(), LossAgg::TokenMean);
        assert_eq!(
            "dr_grpo".parse::<LossAgg>().unwrap(),
            LossAgg::SeqMeanTokenSumNorm
        );
        assert_eq!(
            "seq-mean-token-sum".parse::<LossAgg>().unwrap(),
            LossAgg::SeqMeanTokenSum
        );
        for name in LossAgg::NAMES {
            assert_eq!(name.parse::<LossAgg>().unwrap().to_string(), name);
        }
        let e = "token_sum".parse::<LossAgg>().unwrap_err().to_string();
        assert!(
            e.starts_with("aggregate_loss: `loss_agg` must be one of token_mean,"),
            "{e}"
        );
    }

    #[test]
    fn fully_masked_rows_count_in_n() {
        let l = t(&[[1.0, 2.0, 3.0], [9.0, 9.0, 9.0]]);
        let m = t(&[[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]]);
        assert_relative_eq!(
            agg(&l, &m, AggOptions::new(LossAgg::SeqMeanTokenMean)),
            1.5 / 2.0
        );
        assert_relative_eq!(
            agg(&l, &m, AggOptions::new(LossAgg::SeqMeanTokenSum)),
            3.0 / 2.0
        );
        assert_relative_eq!(
            agg(&l, &m, AggOptions::new(LossAgg::SeqMeanTokenSumNorm)),
            3.0 / 6.0
        );
        assert_relative_eq!(agg(&l, &m, AggOptions::new(LossAgg::TokenMean)), 1.5);
    }

    #[test]
    fn masked_nan_is_ignored_and_gets_zero_gradient() {
        let v = candle_core::Var::new(&[[1.0f64, f64::NAN, 3.0]], &Device::Cpu).unwrap();
        let m = Tensor::new(&[[1.0f64, 0.0, 1.0]], &Device::Cpu).unwrap();
        let loss = aggregate_loss(v.as_tensor(), &m, &AggOptions::default()).unwrap();
        assert_eq!(loss.to_scalar::<f64>().unwrap(), 2.0);
        let g = loss.backward().unwrap();
        let g = g.get(v.as_tensor()).unwrap().to_vec2::<f64>().unwrap();
        assert_eq!(g, vec![vec![0.5, 0.0, 0.5]]);
    }

    #[test]
    fn micro_batches_with_global_normalisers_sum_to_the_full_batch() {
        let l = t(&[[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [-1.0, 0.5, 2.0]]);
        let m = t(&[[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [1.0, 1.0, 0.0]]);
        for mode in LossAgg::NAMES {
            let mode: LossAgg = mode.parse().unwrap();
            let full = agg(&l, &m, AggOptions::new(mode));
            let opts = AggOptions {
                mode,
                max_len: None,
                global_tokens: Some(6.0),
                global_seqs: Some(3.0),
            };
            let parts: f64 = [(0, 1), (1, 2)]
                .iter()
                .map(|&(a, n)| {
                    agg(
                        &l.narrow(0, a, n).unwrap(),
                        &m.narrow(0, a, n).unwrap(),
                        opts,
                    )
                })
                .sum();
            assert_relative_eq!(parts, full, epsilon = 1e-12);
        }
    }

    #[test]
    fn errors_name_the_argument() {
        let l = t(&[[1.0, 2.0, 3.0]]);
        let e = aggregate_loss(&l, &t(&[[0.0, 0.0, 0.0]]), &AggOptions::default())
            .unwrap_err()
            .to_string();
        assert_eq!(e, "aggregate_loss: `mask` must be at least one 1 (an entirely masked batch has no loss), got all zeros");
        let e = aggregate_loss(&l, &t(&[[1.0, 0.5, 0.0]]), &AggOptions::default())
            .unwrap_err()
            .to_string();
        assert_eq!(e, "aggregate_loss: `mask[0, 1]` must be 0 or 1, got 0.5");
        let m2 = Tensor::new(&[[1.0f64, 1.0]], &Device::Cpu).unwrap();
        let e = aggregate_loss(&l, &m2, &AggOptions::default())
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "aggregate_loss: `mask` has shape [1, 2], expected [N, T] (same as per_token) = [1, 3]"
        );
        let bad = AggOptions {
            global_tokens: Some(0.0),
            ..AggOptions::default()
        };
        let e = aggregate_loss(&l, &t(&[[1.0, 1.0, 1.0]]), &bad)
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "aggregate_loss: `global_tokens` must be > 0 and finite, got 0"
        );
    }
}
