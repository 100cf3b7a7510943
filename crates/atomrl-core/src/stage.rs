//! The one data-flow type shared across crates: [`RewardBatch`], what the reward functions
//! (`atomrl-reward`) hand to the advantage estimators. The other atomic crates return their
//! own named output structs, which the trainer assembles (see `docs/architecture.md`).

use candle_core::Tensor;

/// Rewards of one rollout batch: the weighted total and each function's share.
///
/// # Shapes
/// - `total`: `[N]` f32, `Σ_f weight_f · per_fn[:, f]`
/// - `per_fn`: `[N, F]` f32, unweighted score of each reward function
/// - `names`: `F` function names, in the column order of `per_fn`
#[derive(Debug, Clone)]
pub struct RewardBatch {
    /// Weighted total reward per completion, `[N]`.
    pub total: Tensor,
    /// Unweighted reward of each function, `[N, F]`.
    pub per_fn: Tensor,
    /// The reward functions' names, one per column of `per_fn`.
    pub names: Vec<String>,
    /// The weights used for `total`, one per function.
    pub weights: Vec<f32>,
}
