//! `compute_gae`: generalized advantage estimation (PPO with a critic) from token-level rewards
//! and values.

use atomrl_core::shape::{expect_binary_mask, expect_dims, expect_float, expect_rank, flat_f64};
use atomrl_core::{CandleContext, Error, Result};
use candle_core::Tensor;

const FUNC: &str = "compute_gae";

/// verl's `masked_whiten` adds this to the variance, and `masked_mean` to the token count.
const WHITEN_EPS: f64 = 1e-8;

/// Output of [`compute_gae`].
#[derive(Debug, Clone)]
pub struct GaeOutput {
    /// Per-token advantages `[N, T]` (whitened over the mask when asked), 0 outside the mask.
    pub advantages: Tensor,
    /// Per-token returns `[N, T]` (the critic's targets: unwhitened advantages + values), 0
    /// outside the mask.
    pub returns: Tensor,
}

/// Generalized advantage estimation over each row's tokens, from the last to the first
/// (Schulman et al. 2016; verl's `compute_gae_advantage_return`):
///
/// ```text
/// δ_t  = r_t + γ · V_next − V_t
/// A_t  = δ_t + γ λ · A_next            on valid tokens (mask 1)
/// V_next, A_next ← V_t, A_t            after a valid token; unchanged after a masked one
/// R_t  = A_t + V_t
/// ```
///
/// `V_next` and `A_next` start at 0 after the last token. A masked token inside a row (a tool
/// observation of a multi-turn rollout) takes no TD step: the next valid token's value and the
/// running advantage carry across it. With `whiten`, the advantages are then standardised over
/// every valid token of the batch: `(A − mean) / sqrt(var + 1e-8)`, with the masked mean
/// `Σ A·m / (Σ m + 1e-8)` and the unbiased (Bessel-corrected) masked variance. Computed in f64;
/// both outputs are 0 where the mask is 0.
///
/// # Shapes
/// - `rewards`: `[N, T]` token-level rewards (usually the outcome reward on each row's last
///   valid token, plus any per-token terms such as `−β·KL`).
/// - `values`: `[N, T]` the critic's value of each token; `mask`: `[N, T]`, 0/1.
/// - returns `advantages`, `returns`: `[N, T]`, dtype of `rewards`.
///
/// # Errors
/// Shapes that differ, a non-float tensor, a mask that is not 0/1, a non-finite reward or
/// value on a valid token (named by index), `gamma` or `lam` outside `[0, 1]`, and — with
/// `whiten` — fewer than 2 valid tokens (the variance is undefined).
///
/// ```
/// use atomrl_advantage::compute_gae;
/// use candle_core::{Device, Tensor};
/// let d = Device::Cpu;
/// // One row, outcome reward 1 on the last token, a critic that predicts 0.5 everywhere.
/// let r = Tensor::new(&[[0f32, 0.0, 1.0]], &d)?;
/// let v = Tensor::new(&[[0.5f32, 0.5, 0.5]], &d)?;
/// let m = Tensor::new(&[[1f32, 1.0, 1.0]], &d)?;
/// let out = compute_gae(&r, &v, &m, 1.0, 1.0, false)?;
/// // γ = λ = 1: every advantage is the return 1 minus the value 0.5.
/// assert_eq!(out.advantages.to_vec2::<f32>()?, [[0.5, 0.5, 0.5]]);
/// assert_eq!(out.returns.to_vec2::<f32>()?, [[1.0, 1.0, 1.0]]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn compute_gae(
    rewards: &Tensor,
    values: &Tensor,
    mask: &Tensor,
    gamma: f64,
    lam: f64,
    whiten: bool,
) -> Result<GaeOutput> {
    let (n, t) = check_inputs(rewards, values, mask, gamma, lam)?;
    let r = flat_f64(FUNC, rewards)?;
    let v = flat_f64(FUNC, values)?;
    let m = flat_f64(FUNC, mask)?;
    check_finite(&r, &m, "rewards", t)?;
    check_finite(&v, &m, "values", t)?;
    let mut advantages = vec![0.0; n * t];
    for row in 0..n {
        let span = row * t..(row + 1) * t;
        gae_row(
            &r[span.clone()],
            &v[span.clone()],
            &m[span.clone()],
            gamma,
            lam,
            &mut advantages[span],
        );
    }
    // Exact zeros (not −0.0) off the mask.
    let on_mask = |x: f64, mi: f64| if mi != 0.0 { x } else { 0.0 };
    let returns: Vec<f64> = (0..n * t)
        .map(|i| on_mask(advantages[i] + v[i], m[i]))
        .collect();
    if whiten {
        whiten_masked(&mut advantages, &m)?;
    }
    for (a, &mi) in advantages.iter_mut().zip(&m) {
        *a = on_mask(*a, mi);
    }
    let to_tensor = |x: Vec<f64>| {
        Tensor::from_vec(x, (n, t), rewards.device())
            .and_then(|x| x.to_dtype(rewards.dtype()))
            .ctx(FUNC)
    };
    Ok(GaeOutput {
        advantages: to_tensor(advantages)?,
        returns: to_tensor(returns)?,
    })
}

/// The GAE recursion over one row (see [`compute_gae`]), into `out`.
fn gae_row(r: &[f64], v: &[f64], m: &[f64], gamma: f64, lam: f64, out: &mut [f64]) {
    let (mut next_value, mut next_adv) = (0.0, 0.0);
    for i in (0..r.len()).rev() {
        let delta = r[i] + gamma * next_value - v[i];
        let adv = delta + gamma * lam * next_adv;
        next_value = v[i] * m[i] + (1.0 - m[i]) * next_value;
        next_adv = adv * m[i] + (1.0 - m[i]) * next_adv;
        out[i] = next_adv;
    }
}

/// verl's `masked_whiten`: `(x − mean) / sqrt(var + 1e-8)` with the masked mean and the
/// unbiased masked variance.
fn whiten_masked(x: &mut [f64], m: &[f64]) -> Result<()> {
    let count: f64 = m.iter().sum();
    if count < 2.0 {
        return Err(Error::value(
            FUNC,
            "mask",
            "at least 2 valid tokens to whiten the advantages (or whiten = false)",
            count,
        ));
    }
    let masked_mean = |y: &dyn Fn(usize) -> f64| {
        (0..x.len()).map(|i| y(i) * m[i]).sum::<f64>() / (count + WHITEN_EPS)
    };
    let mean = masked_mean(&|i| x[i]);
    let var = masked_mean(&|i| (x[i] - mean).powi(2)) * count / (count - 1.0);
    let scale = 1.0 / (var + WHITEN_EPS).sqrt();
    for a in x.iter_mut() {
        *a = (*a - mean) * scale;
    }
    Ok(())
}

/// Checks shapes, dtypes, the mask and the coefficients; returns `(N, T)`.
fn check_inputs(
    rewards: &Tensor,
    values: &Tensor,
    mask: &Tensor,
    gamma: f64,
    lam: f64,
) -> Result<(usize, usize)> {
    let dims = expect_rank(FUNC, "rewards", rewards, 2, "[N, T]")?.to_vec();
    expect_float(FUNC, "rewards", rewards)?;
    let same = "[N, T] (same as rewards)";
    expect_dims(FUNC, "values", values, &dims, same)?;
    expect_float(FUNC, "values", values)?;
    expect_dims(FUNC, "mask", mask, &dims, same)?;
    expect_binary_mask(FUNC, "mask", mask)?;
    for (name, x) in [("gamma", gamma), ("lam", lam)] {
        if !(0.0..=1.0).contains(&x) {
            return Err(Error::value(FUNC, name, "in [0, 1]", x));
        }
    }
    Ok((dims[0], dims[1]))
}

/// Checks that `x` is finite on valid tokens, naming the first bad `[row, column]`.
fn check_finite(x: &[f64], m: &[f64], name: &str, t: usize) -> Result<()> {
    match (0..x.len()).find(|&i| m[i] != 0.0 && !x[i].is_finite()) {
        Some(i) => Err(Error::value(
            FUNC,
            format!("{name}[{}, {}]", i / t, i % t),
            "finite where mask = 1",
            x[i],
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;
    use proptest::prelude::*;

    fn gae(
        r: &[f32],
        v: &[f32],
        m: &[f32],
        t: usize,
        g: f64,
        l: f64,
        w: bool,
    ) -> (Vec<f32>, Vec<f32>) {
        let d = Device::Cpu;
        let n = r.len() / t;
        let tensor = |x: &[f32]| Tensor::from_slice(x, (n, t), &d).unwrap();
        let out = compute_gae(&tensor(r), &tensor(v), &tensor(m), g, l, w).unwrap();
        let flat = |x: Tensor| x.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        (flat(out.advantages), flat(out.returns))
    }

    #[test]
    fn matches_the_recursion_by_hand() {
        // γ = 0.9, λ = 0.8, V = [1, 2, 3], r = [0, 0, 1].
        let (a, ret) = gae(
            &[0.0, 0.0, 1.0],
            &[1.0, 2.0, 3.0],
            &[1.0; 3],
            3,
            0.9,
            0.8,
            false,
        );
        let d2 = 1.0 - 3.0;
        let d1 = 0.0 + 0.9 * 3.0 - 2.0;
        let d0 = 0.0 + 0.9 * 2.0 - 1.0;
        let a2 = d2;
        let a1 = d1 + 0.72 * a2;
        let a0 = d0 + 0.72 * a1;
        for (got, want) in a.iter().zip([a0, a1, a2]) {
            assert!((f64::from(*got) - want).abs() < 1e-6, "{a:?}");
        }
        assert!((f64::from(ret[0]) - (a0 + 1.0)).abs() < 1e-6);
    }

    #[test]
    fn a_masked_observation_is_skipped_by_the_recursion() {
        // Token 1 is a tool observation: the row behaves as the two-token row [0, 2] → [r0, r2].
        let (with_gap, _) = gae(
            &[0.0, 5.0, 1.0],
            &[0.3, 9.0, 0.6],
            &[1.0, 0.0, 1.0],
            3,
            0.9,
            0.95,
            false,
        );
        let (plain, _) = gae(&[0.0, 1.0], &[0.3, 0.6], &[1.0, 1.0], 2, 0.9, 0.95, false);
        assert_eq!(with_gap[1], 0.0);
        assert!((with_gap[0] - plain[0]).abs() < 1e-6 && (with_gap[2] - plain[1]).abs() < 1e-6);
    }

    #[test]
    fn bad_inputs_are_named() {
        let d = Device::Cpu;
        let x = Tensor::new(&[[0f32, 1.0]], &d).unwrap();
        let one = Tensor::new(&[[1f32, 0.0]], &d).unwrap();
        let err = |r: Result<GaeOutput>| r.unwrap_err().to_string();
        assert!(err(compute_gae(&x, &x, &one, 1.5, 0.9, false)).contains("gamma"));
        assert!(err(compute_gae(&x, &x, &one, 1.0, -0.1, false)).contains("lam"));
        assert!(err(compute_gae(&x, &x, &one, 1.0, 1.0, true)).contains("at least 2"));
        let wide = Tensor::new(&[[0f32, 1.0, 2.0]], &d).unwrap();
        assert!(err(compute_gae(&x, &wide, &one, 1.0, 1.0, false)).contains("values"));
        let nan = Tensor::new(&[[f32::NAN, 1.0]], &d).unwrap();
        assert!(err(compute_gae(&nan, &x, &one, 1.0, 1.0, false)).contains("rewards[0, 0]"));
        // A NaN under the mask is ignored.
        let masked_nan = Tensor::new(&[[0f32, f32::NAN]], &d).unwrap();
        assert!(compute_gae(&masked_nan, &x, &one, 1.0, 1.0, false).is_ok());
    }

    proptest! {
        /// Whitened advantages have masked mean 0 and unbiased masked variance ~1; both outputs
        /// are 0 off the mask; returns = unwhitened advantages + values on the mask.
        #[test]
        fn whitening_and_masking_invariants(
            cells in proptest::collection::vec((-2.0f32..2.0, -1.0f32..1.0, any::<bool>()), 12),
            gamma in 0.0f64..=1.0,
            lam in 0.0f64..=1.0,
        ) {
            let r: Vec<f32> = cells.iter().map(|c| c.0).collect();
            let v: Vec<f32> = cells.iter().map(|c| c.1).collect();
            let mut m: Vec<f32> = cells.iter().map(|c| f32::from(u8::from(c.2))).collect();
            m[0] = 1.0;
            m[7] = 1.0;
            let (a, ret) = gae(&r, &v, &m, 4, gamma, lam, true);
            let (raw, _) = gae(&r, &v, &m, 4, gamma, lam, false);
            let n: f64 = m.iter().map(|&x| f64::from(x)).sum();
            let mean: f64 = a.iter().map(|&x| f64::from(x)).sum::<f64>() / n;
            prop_assert!(mean.abs() < 1e-4, "mean {}", mean);
            for i in 0..12 {
                if m[i] == 0.0 {
                    prop_assert_eq!((a[i], ret[i]), (0.0, 0.0));
                } else {
                    prop_assert!((ret[i] - (raw[i] + v[i])).abs() < 1e-5);
                }
            }
        }
    }
}
