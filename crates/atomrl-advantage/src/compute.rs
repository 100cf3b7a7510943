//! `compute_advantages`: group-relative advantages from one reward per completion.

use atomrl_core::shape::{expect_finite, expect_float, expect_rank, flat_f64};
use atomrl_core::{CandleContext, Error, Result};
use candle_core::Tensor;

use crate::group_stats::GroupStats;
use crate::mode::AdvantageMode;

const FUNC: &str = "compute_advantages";

/// Default `eps` added to the standard deviation (verl's and TRL's value).
pub const DEFAULT_EPS: f64 = 1e-6;

/// verl's `masked_whiten` adds this constant to the variance, whatever `eps` is.
const WHITEN_EPS: f64 = 1e-8;

/// Output of [`compute_advantages`].
#[derive(Debug, Clone)]
pub struct AdvantageOutput {
    /// One advantage per completion, `[N]`, same dtype and device as the rewards.
    pub advantages: Tensor,
    /// Mean reward of each group, `[N / G]`.
    pub group_mean: Tensor,
    /// Unbiased standard deviation of each group's rewards, `[N / G]` (0 for a flat group).
    pub group_std: Tensor,
    /// Number of groups whose rewards are all equal (they carry no learning signal).
    pub num_flat_groups: usize,
}

/// Turns one reward per completion into one advantage per completion, relative to the other
/// completions of the same prompt.
///
/// Rows are grouped consecutively: row `i` belongs to group `i / G`. With `mean_g`, `std_g`
/// the group's mean and unbiased (N−1) standard deviation:
///
/// | mode | advantage |
/// |---|---|
/// | `raw` | `r` |
/// | `grpo` | `(r − mean_g) / (std_g + eps)` |
/// | `grpo_no_std` | `r − mean_g` |
/// | `batch` | `(r − mean_g) / (std(r over the batch) + eps)` |
/// | `rloo` | `r_i − (Σ_g r − r_i) / (G − 1)` |
/// | `reinforce_pp` | `x = r − mean_g`; `x / sqrt(Σ x² / (N − 1) + 1e-8)` |
///
/// A group whose rewards are all equal gets advantages of exactly 0 in every mode but `raw`.
/// Statistics are computed in f64 whatever the input dtype.
///
/// # Shapes
/// - `rewards`: `[N]`, float, one scalar reward per completion, `N = prompts × G`.
/// - returns `advantages`: `[N]` (dtype of `rewards`); `group_mean`, `group_std`: `[N / G]`.
///
/// # Errors
/// `rewards` not of rank 1 or not float, a non-finite reward (its index is named),
/// `group_size < 2`, `N` not a positive multiple of `group_size`, `eps ≤ 0` or not finite.
///
/// # Example
/// ```
/// use atomrl_advantage::{compute_advantages, AdvantageMode, DEFAULT_EPS};
/// use candle_core::{Device, Tensor};
///
/// let rewards = Tensor::new(&[1f32, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0], &Device::Cpu)?;
/// let out = compute_advantages(&rewards, 4, AdvantageMode::Grpo, DEFAULT_EPS)?;
/// let a = out.advantages.to_vec1::<f32>()?;
/// assert!((a[0] - 0.866_024).abs() < 1e-5); // (1 − 0.5) / (0.57735 + 1e-6)
/// assert_eq!(&a[4..], &[0.0; 4]);           // the flat second group teaches nothing
/// assert_eq!(out.num_flat_groups, 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn compute_advantages(
    rewards: &Tensor,
    group_size: usize,
    mode: AdvantageMode,
    eps: f64,
) -> Result<AdvantageOutput> {
    check_grouped_rewards(FUNC, "rewards", rewards, group_size)?;
    if !(eps > 0.0 && eps.is_finite()) {
        return Err(Error::value(FUNC, "eps", "> 0 and finite", eps));
    }
    let r = flat_f64(FUNC, rewards)?;
    let stats = GroupStats::of_groups(&r, group_size);
    let advantages = advantages_from_group_stats(&r, &stats, mode, eps)?;

    let to_tensor = |v: Vec<f64>| {
        Tensor::new(v, rewards.device())
            .and_then(|t| t.to_dtype(rewards.dtype()))
            .ctx(FUNC)
    };
    Ok(AdvantageOutput {
        advantages: to_tensor(advantages)?,
        group_mean: to_tensor(stats.iter().map(|s| s.mean).collect())?,
        group_std: to_tensor(stats.iter().map(|s| s.std).collect())?,
        num_flat_groups: stats.iter().filter(|s| s.flat).count(),
    })
}

/// [`compute_advantages`] on host values whose group statistics are already known (e.g. from
/// the group filter of DAPO's dynamic sampling, which needs them first): the statistics are
/// computed once per step. `stats[i]` describes rows `i·G .. (i+1)·G` of `rewards`, with
/// `G = rewards.len() / stats.len()`. Same formulas and f64 arithmetic, so the same bits.
///
/// # Errors
/// No groups, `rewards.len()` not `G ×` the number of groups (with `G ≥ 2`), a non-finite
/// reward (its index is named), `eps ≤ 0` or not finite.
///
/// ```
/// use atomrl_advantage::{advantages_from_group_stats, AdvantageMode, GroupStats, DEFAULT_EPS};
/// let r = [1.0, 0.0, 2.0, 2.0];
/// let stats = GroupStats::of_groups(&r, 2);
/// assert!(stats[1].flat);
/// let a = advantages_from_group_stats(&r, &stats, AdvantageMode::GrpoNoStd, DEFAULT_EPS)?;
/// assert_eq!(a, vec![0.5, -0.5, 0.0, 0.0]);
/// # Ok::<(), atomrl_core::Error>(())
/// ```
pub fn advantages_from_group_stats(
    rewards: &[f64],
    stats: &[GroupStats],
    mode: AdvantageMode,
    eps: f64,
) -> Result<Vec<f64>> {
    let func = "advantages_from_group_stats";
    let n = rewards.len();
    let group_size = if stats.is_empty() { 0 } else { n / stats.len() };
    if group_size < 2 || group_size * stats.len() != n {
        return Err(Error::value(
            func,
            "len(rewards)",
            format!("G × {} groups with G >= 2", stats.len()),
            n,
        ));
    }
    if let Some(i) = rewards.iter().position(|r| !r.is_finite()) {
        return Err(Error::value(
            func,
            format!("rewards[{i}]"),
            "a finite reward",
            rewards[i],
        ));
    }
    if !(eps > 0.0 && eps.is_finite()) {
        return Err(Error::value(func, "eps", "> 0 and finite", eps));
    }
    let r = rewards;
    let centred = |i: usize| {
        let s = stats[i / group_size];
        if s.flat {
            0.0
        } else {
            r[i] - s.mean
        }
    };
    Ok(match mode {
        AdvantageMode::Raw => r.to_vec(),
        AdvantageMode::GrpoNoStd => (0..n).map(centred).collect(),
        AdvantageMode::Grpo => (0..n)
            .map(|i| centred(i) / (stats[i / group_size].std + eps))
            .collect(),
        AdvantageMode::Batch => {
            let batch_std = GroupStats::of(r).std;
            (0..n).map(|i| centred(i) / (batch_std + eps)).collect()
        }
        AdvantageMode::Rloo => {
            let g = group_size as f64;
            // r_i − (S − r_i)/(G−1) = G/(G−1) · (r_i − mean): verl's form, exact 0 when flat.
            (0..n).map(|i| centred(i) * g / (g - 1.0)).collect()
        }
        AdvantageMode::ReinforcePp => {
            let x: Vec<f64> = (0..n).map(centred).collect();
            // Each group of x sums to 0, so the batch mean is 0 by construction: skipping the
            // shift keeps flat groups at exactly 0 (verl's masked_whiten subtracts ~1e-17).
            let var = x.iter().map(|v| v * v).sum::<f64>() / (n as f64 - 1.0).max(1.0);
            let scale = 1.0 / (var + WHITEN_EPS).sqrt();
            x.iter().map(|v| v * scale).collect()
        }
    })
}

/// Checks a `[N]` float tensor of finite values grouped by `group_size ≥ 2`; returns `N`.
pub(crate) fn check_grouped_rewards(
    func: &str,
    arg: &str,
    values: &Tensor,
    group_size: usize,
) -> Result<usize> {
    let n = expect_rank(func, arg, values, 1, "[N]")?[0];
    expect_float(func, arg, values)?;
    if group_size < 2 {
        return Err(Error::value(func, "group_size", ">= 2", group_size));
    }
    if n == 0 || n % group_size != 0 {
        return Err(Error::value(
            func,
            format!("len({arg})"),
            format!("a positive multiple of group_size = {group_size}"),
            n,
        ));
    }
    expect_finite(func, arg, values)?;
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use approx::assert_relative_eq;
    use candle_core::Device;

    fn adv(r: &[f32], g: usize, mode: AdvantageMode) -> Vec<f32> {
        let t = Tensor::new(r, &Device::Cpu).unwrap();
        compute_advantages(&t, g, mode, DEFAULT_EPS)
            .unwrap()
            .advantages
            .to_vec1()
            .unwrap()
    }

    #[test]
    fn flat_groups_are_exactly_zero_in_every_centring_mode() {
        let r = [0.1f32, 0.1, 0.1, 0.1, 1.0, 0.0, 1.0, 0.0];
        for mode in ["grpo", "grpo_no_std", "batch", "rloo", "reinforce_pp"] {
            let a = adv(&r, 4, mode.parse().unwrap());
            assert_eq!(&a[..4], &[0.0; 4], "{mode}");
        }
    }

    #[test]
    fn rloo_is_leave_one_out() {
        let a = adv(&[1.0, 2.0, 6.0], 3, AdvantageMode::Rloo);
        assert_relative_eq!(a[0], 1.0 - 4.0, epsilon = 1e-6);
        assert_relative_eq!(a[2], 6.0 - 1.5, epsilon = 1e-6);
    }

    #[test]
    fn batch_mode_scales_by_the_batch_std() {
        let r = [0.0f32, 2.0, 0.0, 0.0];
        let a = adv(&r, 2, AdvantageMode::Batch);
        let std = (3.0f64 / 3.0).sqrt(); // mean 0.5, Σ(r−m)² = 3, N−1 = 3
        assert_relative_eq!(a[1] as f64, 1.0 / (std + 1e-6), epsilon = 1e-6);
        assert_eq!(&a[2..], &[0.0, 0.0]);
    }

    #[test]
    fn errors_name_the_argument() {
        let t = Tensor::new(&[1f32, 0.0, 0.5], &Device::Cpu).unwrap();
        let e = compute_advantages(&t, 1, AdvantageMode::Grpo, 1e-6)
            .unwrap_err()
            .to_string();
        assert_eq!(e, "compute_advantages: `group_size` must be >= 2, got 1");
        let e = compute_advantages(&t, 2, AdvantageMode::Grpo, 1e-6)
            .unwrap_err()
            .to_string();
        assert_eq!(e, "compute_advantages: `len(rewards)` must be a positive multiple of group_size = 2, got 3");
        let t = Tensor::new(&[1f32, f32::INFINITY], &Device::Cpu).unwrap();
        let e = compute_advantages(&t, 2, AdvantageMode::Grpo, 1e-6)
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "compute_advantages: `rewards[1]` must be finite, got inf"
        );
        let t = Tensor::new(&[1f32, 0.0], &Device::Cpu).unwrap();
        assert!(compute_advantages(&t, 2, AdvantageMode::Grpo, 0.0).is_err());
        let t = Tensor::new(&[[1f32, 0.0]], &Device::Cpu).unwrap();
        let e = compute_advantages(&t, 2, AdvantageMode::Grpo, 1e-6)
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "compute_advantages: `rewards` has shape [1, 2], expected [N]"
        );
    }
}
