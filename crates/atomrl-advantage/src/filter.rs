//! `filter_groups`: DAPO's dynamic sampling keeps only groups that carry a learning signal.

use atomrl_core::shape::flat_f64;
use atomrl_core::{CandleContext, Result};
use candle_core::Tensor;

use crate::compute::check_grouped_rewards;
use crate::group_stats::GroupStats;

const FUNC: &str = "filter_groups";

/// Output of [`filter_groups`].
#[derive(Debug, Clone)]
pub struct GroupFilter {
    /// 1.0 for rows of kept groups, 0.0 for rows of dropped groups, `[N]` (dtype of `metric`).
    pub keep_mask: Tensor,
    /// Indices (0-based) of the kept groups, ascending.
    pub kept_groups: Vec<usize>,
    /// Number of kept groups.
    pub num_kept: usize,
    /// Number of dropped groups (all values equal).
    pub num_dropped: usize,
}

/// Keeps the groups whose metric has non-zero spread (DAPO dynamic sampling, verl's
/// `filter_groups`): a group whose completions all scored the same has zero advantage under
/// every centring estimator and adds nothing but cost to the update.
///
/// # Shapes
/// - `metric`: `[N]`, float, usually the reward (or accuracy) of each completion.
/// - returns `keep_mask`: `[N]`; `kept_groups`: indices into the `N / G` groups.
///
/// # Errors
/// As [`compute_advantages`](crate::compute_advantages): rank, non-finite values,
/// `group_size < 2`, `N` not a positive multiple of `group_size`.
///
/// # Example
/// ```
/// use atomrl_advantage::filter_groups;
/// use candle_core::{Device, Tensor};
///
/// let acc = Tensor::new(&[1f32, 1.0, 0.0, 1.0, 0.0, 0.0], &Device::Cpu)?;
/// let f = filter_groups(&acc, 2)?;
/// assert_eq!(f.kept_groups, vec![1]);
/// assert_eq!(f.keep_mask.to_vec1::<f32>()?, vec![0.0, 0.0, 1.0, 1.0, 0.0, 0.0]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn filter_groups(metric: &Tensor, group_size: usize) -> Result<GroupFilter> {
    check_grouped_rewards(FUNC, "metric", metric, group_size)?;
    let values = flat_f64(FUNC, metric)?;
    let keep: Vec<bool> = GroupStats::of_groups(&values, group_size)
        .iter()
        .map(|s| !s.flat)
        .collect();
    let kept_groups: Vec<usize> = keep
        .iter()
        .enumerate()
        .filter(|(_, k)| **k)
        .map(|(i, _)| i)
        .collect();
    let mask: Vec<f64> = keep
        .iter()
        .flat_map(|&k| std::iter::repeat_n(if k { 1.0 } else { 0.0 }, group_size))
        .collect();
    let keep_mask = Tensor::new(mask, metric.device())
        .and_then(|t| t.to_dtype(metric.dtype()))
        .ctx(FUNC)?;
    Ok(GroupFilter {
        keep_mask,
        num_kept: kept_groups.len(),
        num_dropped: keep.len() - kept_groups.len(),
        kept_groups,
    })
}
