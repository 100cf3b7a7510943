//! `compute_value_loss`: the clipped value loss of a PPO critic.

use atomrl_core::{CandleContext, Error, Result};
use candle_core::Tensor;

use crate::agg::{aggregate_masked, AggOptions};
use crate::check::{check_mask, checked_tokens};

const FUNC: &str = "compute_value_loss";

/// Output of [`compute_value_loss`].
#[derive(Debug, Clone)]
pub struct ValueLossOutput {
    /// `0.5 · agg(max((v − R)², (clip(v, v_old ± c) − R)²))`: scalar, differentiable w.r.t.
    /// `values`.
    pub loss: Tensor,
    /// Share of valid tokens whose clipped error is the larger (the clip is active).
    pub clip_frac: f64,
}

/// The clipped value loss of PPO's critic (verl's `compute_value_loss`; TRL's `vf_loss`):
///
/// ```text
/// v_clip = clamp(v, v_old − c, v_old + c)
/// l      = max((v − R)², (v_clip − R)²)
/// loss   = 0.5 · aggregate(l, mask)          by opts.mode (token_mean, seq_mean_*, …)
/// clip_frac = masked mean of [(v_clip − R)² > (v − R)²]
/// ```
///
/// # Shapes
/// `values` (the critic's new predictions), `old_values` (its predictions when the experience
/// was made), `returns` (the GAE targets) and `mask`: `[N, T]` each. Returns a scalar `loss`.
///
/// # Errors
/// Shapes that differ, a mask that is not 0/1 or is all zeros, non-finite inputs on valid
/// tokens, `clip_range_value` ≤ 0 or not finite, bad aggregation options.
///
/// ```
/// use atomrl_loss::{compute_value_loss, AggOptions, LossAgg};
/// use candle_core::{Device, Tensor};
/// let d = Device::Cpu;
/// let v = Tensor::new(&[[1.0f32, 0.0]], &d)?;
/// let old = Tensor::new(&[[0.0f32, 0.0]], &d)?;
/// let ret = Tensor::new(&[[1.0f32, 0.5]], &d)?;
/// let m = Tensor::new(&[[1.0f32, 1.0]], &d)?;
/// let out = compute_value_loss(&v, &old, &ret, &m, 0.2, &AggOptions::new(LossAgg::TokenMean))?;
/// // Token 0: v = 1 hits R, but clipped to 0.2 it misses by 0.8 -> 0.64. Token 1: 0.25 both.
/// assert!((out.loss.to_scalar::<f32>()? - 0.5 * (0.64 + 0.25) / 2.0).abs() < 1e-6);
/// assert_eq!(out.clip_frac, 0.5);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn compute_value_loss(
    values: &Tensor,
    old_values: &Tensor,
    returns: &Tensor,
    mask: &Tensor,
    clip_range_value: f64,
    opts: &AggOptions,
) -> Result<ValueLossOutput> {
    if !(clip_range_value > 0.0 && clip_range_value.is_finite()) {
        return Err(Error::value(
            FUNC,
            "clip_range_value",
            "> 0 and finite",
            clip_range_value,
        ));
    }
    opts.validate(FUNC)?;
    let m = check_mask(FUNC, "values", values, mask)?;
    let v = checked_tokens(FUNC, "values", values, "values", &m)?;
    let old = checked_tokens(FUNC, "old_values", old_values, "values", &m)?;
    let ret = checked_tokens(FUNC, "returns", returns, "values", &m)?;
    let clipped = clamp_between(
        &v,
        &(&old - clip_range_value).ctx(FUNC)?,
        &(&old + clip_range_value).ctx(FUNC)?,
    )?;
    let err = (&v - &ret).and_then(|x| x.sqr()).ctx(FUNC)?;
    let err_clipped = (&clipped - &ret).and_then(|x| x.sqr()).ctx(FUNC)?;
    let per_token = err.maximum(&err_clipped).ctx(FUNC)?;
    let per_token = m.select(FUNC, &per_token)?;
    let loss = (aggregate_masked(FUNC, &per_token, &m, opts)? * 0.5).ctx(FUNC)?;
    let clipped_more = err_clipped
        .gt(&err)
        .and_then(|x| x.to_dtype(m.float.dtype()))
        .ctx(FUNC)?;
    let clip_frac = m.mean_of(FUNC, &clipped_more)?;
    Ok(ValueLossOutput { loss, clip_frac })
}

/// `x` clamped element-wise to `[low, high]` (tensors of its shape), with the gradient of
/// `x` where it is inside.
fn clamp_between(x: &Tensor, low: &Tensor, high: &Tensor) -> Result<Tensor> {
    x.maximum(low).and_then(|y| y.minimum(high)).ctx(FUNC)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LossAgg;
    use candle_core::{Device, Var};

    #[test]
    fn gradient_flows_only_where_the_unclipped_error_is_the_larger() {
        let d = Device::Cpu;
        // Token 0: clip active (v far outside v_old ± c, unclipped error smaller) -> no
        // gradient through the clipped branch; token 1: unclipped error larger -> 2(v − R).
        let v = Var::new(&[[1.0f32, -1.0]], &d).unwrap();
        let old = Tensor::new(&[[0.0f32, 0.0]], &d).unwrap();
        let ret = Tensor::new(&[[1.0f32, 0.0]], &d).unwrap();
        let m = Tensor::new(&[[1.0f32, 1.0]], &d).unwrap();
        let opts = AggOptions::new(LossAgg::TokenMean);
        let out = compute_value_loss(v.as_tensor(), &old, &ret, &m, 0.2, &opts).unwrap();
        let g = out.loss.backward().unwrap();
        let grad: Vec<Vec<f32>> = g.get(v.as_tensor()).unwrap().to_vec2().unwrap();
        // loss = 0.5 * (l0 + l1) / 2; l1 = (v1 − 0)² (the clipped −0.2 is closer) -> d/dv1 = 0.5 * 2 * (−1) / 2.
        assert!((grad[0][1] - (-0.5)).abs() < 1e-6, "{grad:?}");
        assert_eq!(grad[0][0], 0.0);
        assert_eq!(out.clip_frac, 0.5);
    }

    #[test]
    fn masked_tokens_do_not_count_and_bad_inputs_are_named() {
        let d = Device::Cpu;
        let v = Tensor::new(&[[0.5f32, f32::NAN]], &d).unwrap();
        let z = Tensor::new(&[[0.0f32, 0.0]], &d).unwrap();
        let m = Tensor::new(&[[1.0f32, 0.0]], &d).unwrap();
        let opts = AggOptions::new(LossAgg::TokenMean);
        let out = compute_value_loss(&v, &z, &z, &m, 0.2, &opts).unwrap();
        // clip(0.5, −0.2, 0.2) = 0.2: errors 0.25 and 0.04 -> 0.5 * 0.25.
        assert!((out.loss.to_scalar::<f32>().unwrap() - 0.125).abs() < 1e-7);
        let err = compute_value_loss(&v, &z, &z, &m, 0.0, &opts).unwrap_err();
        assert!(err.to_string().contains("clip_range_value"));
        let wide = Tensor::new(&[[0.0f32, 0.0, 0.0]], &d).unwrap();
        let err = compute_value_loss(&v, &wide, &z, &m, 0.2, &opts).unwrap_err();
        assert!(err.to_string().contains("old_values"));
    }
}
