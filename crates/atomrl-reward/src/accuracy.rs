//! [`Accuracy`]: which completions count as "correct" in training metrics and evaluation.

use atomrl_core::{Error, Result};
use serde_json::Value;

use crate::builtin::{reward_fn_by_name, Correctness};
use crate::reward_fn::{RewardContext, RewardFn};

/// A named reward and a threshold: a completion is correct when its score is at least the
/// threshold. The default is the `correctness` reward with default options and threshold 1
/// (the GSM8K answer matches); a task with another notion of "correct" configures its own, and
/// the trainer's `accuracy` metric and held-out evaluation both use it.
///
/// ```
/// use atomrl_reward::{Accuracy, RewardContext};
/// let ctx = RewardContext::new().with_ground_truth(["12", "12"]);
/// let done = ["#### 12".to_string(), "#### 13".to_string()];
/// assert_eq!(Accuracy::default().correct(&done, &ctx)?, vec![1.0, 0.0]);
/// // Correct = at least half of the steps right.
/// let steps = Accuracy::from_config("steps", &serde_json::Value::Null, 0.5)?;
/// assert_eq!(steps.name(), "steps");
/// assert!(Accuracy::from_config("correctness", &serde_json::Value::Null, f32::NAN).is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Accuracy {
    reward: Box<dyn RewardFn>,
    threshold: f32,
}

impl Default for Accuracy {
    fn default() -> Self {
        Self {
            reward: Box::new(Correctness::default()),
            threshold: 1.0,
        }
    }
}

impl std::fmt::Debug for Accuracy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Accuracy")
            .field("reward", &self.reward.name())
            .field("threshold", &self.threshold)
            .finish()
    }
}

impl Accuracy {
    /// Correct when `reward` scores at least `threshold`.
    ///
    /// # Errors
    /// [`Error::Value`] when `threshold` is not finite.
    ///
    /// See [`Accuracy`] for an example.
    pub fn new(reward: Box<dyn RewardFn>, threshold: f32) -> Result<Self> {
        if !threshold.is_finite() {
            return Err(Error::value(
                "Accuracy",
                "threshold",
                "a finite score",
                threshold,
            ));
        }
        Ok(Self { reward, threshold })
    }

    /// The built-in reward `name` with `options` (as [`reward_fn_by_name`]) and `threshold`.
    ///
    /// # Errors
    /// An unknown reward or option; a threshold that is not finite.
    ///
    /// See [`Accuracy`] for an example.
    pub fn from_config(name: &str, options: &Value, threshold: f32) -> Result<Self> {
        Self::new(reward_fn_by_name(name, options)?, threshold)
    }

    /// The reward's name.
    ///
    /// See [`Accuracy`] for an example.
    pub fn name(&self) -> &str {
        self.reward.name()
    }

    /// 1.0 for each completion whose score reaches the threshold, else 0.0.
    ///
    /// # Errors
    /// The reward's errors (e.g. missing ground truth in `ctx`).
    ///
    /// See [`Accuracy`] for an example.
    pub fn correct(&self, completions: &[String], ctx: &RewardContext) -> Result<Vec<f32>> {
        let func = "Accuracy::correct";
        let scores: Vec<f32> = self
            .reward
            .score(completions, ctx)?
            .to_dtype(candle_core::DType::F32)
            .and_then(|t| t.to_vec1())
            .map_err(|e| Error::candle(func, e))?;
        Ok(scores
            .iter()
            .map(|&s| f32::from(u8::from(s >= self.threshold)))
            .collect())
    }
}
