//! The stage types of a training step's data flow (see `docs/architecture.md`).
//!
//! ```text
//! Sample -> PromptBatch -> RolloutBatch -> RewardBatch -> AdvantageBatch -> TrainingBatch
//! ```
//! Types are added here as the crates that produce them land; the atomic crates return their
//! own named output structs, which the trainer assembles into these.

use candle_core::Tensor;
use serde::{Deserialize, Serialize};

/// One training example: a prompt and the ground truth its completions are scored against.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sample {
    /// The prompt text (before any chat template).
    pub prompt: String,
    /// The reference answer (e.g. `"72"`).
    pub ground_truth: String,
}

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
