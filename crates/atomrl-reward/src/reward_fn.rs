//! The [`RewardFn`] trait and the per-sample context rewards are scored with.

use atomrl_core::{Error, Result};
use candle_core::Tensor;

use crate::batch::{check_len, rewards_tensor};
use atomrl_core::Trajectory;

/// Per-completion context a reward can use besides the completion text. Every field is
/// optional; a reward that needs one asks for it with `require_*`, which names the reward in its
/// error. Given vectors must have one entry per completion (row `i` of each describes
/// completion `i`; with `G` completions per prompt, repeat each prompt's entries `G` times).
///
/// # Example
/// ```
/// use atomrl_reward::RewardContext;
/// let ctx = RewardContext::new()
///     .with_ground_truth(["12", "12"])
///     .with_prompts(["What is 5+7?", "What is 5+7?"])
///     .with_completion_lengths(vec![30, 512])
///     .with_max_completion_length(512);
/// ctx.validate(2)?;
/// assert_eq!(ctx.require_ground_truth("mine")?[1], "12");
/// assert!(ctx.validate(3).is_err());
/// # Ok::<(), atomrl_reward::Error>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RewardContext {
    /// Reference answer of each completion's prompt, `[N]`.
    pub ground_truth: Option<Vec<String>>,
    /// Prompt of each completion, `[N]`.
    pub prompts: Option<Vec<String>>,
    /// Length of each completion in tokens (EOS included if generated), `[N]`.
    pub completion_lengths: Option<Vec<usize>>,
    /// The generation limit in tokens (used by the overlong penalty when it has no `max_len`).
    pub max_completion_length: Option<usize>,
    /// With tool rollouts, each completion's whole trajectory (text with the tool turns, and
    /// the calls with their results), `[N]`; the completion itself is the final model turn.
    pub trajectories: Option<Vec<Trajectory>>,
}

fn strings<S: Into<String>>(items: impl IntoIterator<Item = S>) -> Vec<String> {
    items.into_iter().map(Into::into).collect()
}

impl RewardContext {
    /// An empty context.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the ground truths.
    pub fn with_ground_truth<S: Into<String>>(
        mut self,
        ground_truth: impl IntoIterator<Item = S>,
    ) -> Self {
        self.ground_truth = Some(strings(ground_truth));
        self
    }

    /// Sets the prompts.
    pub fn with_prompts<S: Into<String>>(mut self, prompts: impl IntoIterator<Item = S>) -> Self {
        self.prompts = Some(strings(prompts));
        self
    }

    /// Sets the completion lengths (tokens).
    pub fn with_completion_lengths(mut self, lengths: Vec<usize>) -> Self {
        self.completion_lengths = Some(lengths);
        self
    }

    /// Sets the generation limit (tokens).
    pub fn with_max_completion_length(mut self, max_len: usize) -> Self {
        self.max_completion_length = Some(max_len);
        self
    }

    /// Sets the multi-turn trajectories.
    ///
    /// ```
    /// use atomrl_reward::{RewardContext, Trajectory};
    /// let ctx = RewardContext::new().with_trajectories(vec![Trajectory::default(); 2]);
    /// assert!(ctx.validate(2).is_ok() && ctx.validate(1).is_err());
    /// assert_eq!(ctx.require_trajectories("tool_use")?.len(), 2);
    /// assert!(RewardContext::new().require_trajectories("tool_use").is_err());
    /// # Ok::<(), atomrl_reward::Error>(())
    /// ```
    pub fn with_trajectories(mut self, trajectories: Vec<Trajectory>) -> Self {
        self.trajectories = Some(trajectories);
        self
    }

    /// Checks that every given vector has `n` entries.
    ///
    /// # Errors
    /// [`Error::Value`] naming the field, e.g. ``RewardContext: `prompts` must be N = 4 entries
    /// (one per completion), got 3 entries``.
    pub fn validate(&self, n: usize) -> Result<()> {
        const FUNC: &str = "RewardContext";
        if let Some(v) = &self.ground_truth {
            check_len(FUNC, "ground_truth", v.len(), n)?;
        }
        if let Some(v) = &self.prompts {
            check_len(FUNC, "prompts", v.len(), n)?;
        }
        if let Some(v) = &self.completion_lengths {
            check_len(FUNC, "completion_lengths", v.len(), n)?;
        }
        if let Some(v) = &self.trajectories {
            check_len(FUNC, "trajectories", v.len(), n)?;
        }
        Ok(())
    }

    /// The ground truths, or [`Error::Missing`] naming `func`.
    ///
    /// # Errors
    /// When `ground_truth` is `None`.
    pub fn require_ground_truth(&self, func: &str) -> Result<&[String]> {
        self.ground_truth.as_deref().ok_or_else(|| {
            Error::missing(
                func,
                "ground_truth",
                "[N] reference answers in the RewardContext",
            )
        })
    }

    /// The prompts, or [`Error::Missing`] naming `func`.
    ///
    /// # Errors
    /// When `prompts` is `None`.
    pub fn require_prompts(&self, func: &str) -> Result<&[String]> {
        self.prompts
            .as_deref()
            .ok_or_else(|| Error::missing(func, "prompts", "[N] prompts in the RewardContext"))
    }

    /// The completion lengths, or [`Error::Missing`] naming `func`.
    ///
    /// # Errors
    /// When `completion_lengths` is `None`.
    pub fn require_completion_lengths(&self, func: &str) -> Result<&[usize]> {
        self.completion_lengths.as_deref().ok_or_else(|| {
            Error::missing(
                func,
                "completion_lengths",
                "[N] completion lengths in tokens in the RewardContext",
            )
        })
    }
}

impl RewardContext {
    /// The trajectories, or [`Error::Missing`] naming `func` (set only by tool rollouts).
    ///
    /// # Errors
    /// When `trajectories` is `None`.
    ///
    /// See [`RewardContext::with_trajectories`] for an example.
    pub fn require_trajectories(&self, func: &str) -> Result<&[Trajectory]> {
        self.trajectories.as_deref().ok_or_else(|| {
            Error::missing(
                func,
                "trajectories",
                "[N] multi-turn trajectories in the RewardContext (a run with `tools`)",
            )
        })
    }
}

/// A reward function: scores `N` completions given their [`RewardContext`].
///
/// Implement it for your own rewards (or wrap a closure with [`FnReward`]) and combine rewards
/// with [`WeightedRewards`](crate::WeightedRewards). Built-in implementations:
/// [`Correctness`](crate::Correctness), [`Digit`](crate::Digit),
/// [`HardFormat`](crate::HardFormat), [`SoftFormat`](crate::SoftFormat),
/// [`Mark`](crate::Mark), [`OverlongPenalty`](crate::OverlongPenalty).
///
/// # Shapes
/// - `completions`: `N` strings; `score` returns `[N]` (any float dtype; the composition
///   converts to f32 and rejects non-finite values).
///
/// # Example
/// ```
/// use atomrl_reward::{RewardContext, RewardFn, Result};
/// use candle_core::{Device, Tensor};
///
/// /// 1.0 when the completion is at most 200 characters.
/// struct Short;
///
/// impl RewardFn for Short {
///     fn name(&self) -> &str {
///         "short"
///     }
///     fn score(&self, completions: &[String], _ctx: &RewardContext) -> Result<Tensor> {
///         let v: Vec<f32> = completions.iter().map(|c| if c.chars().count() <= 200 { 1.0 } else { 0.0 }).collect();
///         Tensor::new(v, &Device::Cpu).map_err(|e| atomrl_reward::Error::candle("short", e))
///     }
/// }
///
/// let r = Short.score(&["ok".to_string()], &RewardContext::new())?;
/// assert_eq!(r.to_vec1::<f32>()?, vec![1.0]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait RewardFn: Send + Sync {
    /// Name used in logs and as the column name in [`RewardBatch`](atomrl_core::RewardBatch).
    fn name(&self) -> &str;

    /// One reward per completion, `[N]`.
    ///
    /// # Errors
    /// Whatever the reward rejects (e.g. missing context it needs); use [`atomrl_core::Error`]
    /// variants that name the function and argument.
    fn score(&self, completions: &[String], ctx: &RewardContext) -> Result<Tensor>;
}

/// A [`RewardFn`] from a per-completion closure `f(completion, ctx, i) -> f32`, where `i` is the
/// completion's row (index into the context's vectors).
///
/// # Example
/// ```
/// use atomrl_reward::{FnReward, RewardContext, RewardFn};
/// // 1.0 when the completion repeats the ground truth verbatim.
/// let echo = FnReward::new("echo", |c: &str, ctx: &RewardContext, i: usize| {
///     let gt = ctx.ground_truth.as_ref().map(|g| g[i].as_str()).unwrap_or("");
///     if !gt.is_empty() && c.contains(gt) { 1.0 } else { 0.0 }
/// });
/// let ctx = RewardContext::new().with_ground_truth(["42", "7"]);
/// let r = echo.score(&["it is 42".into(), "it is 8".into()], &ctx)?;
/// assert_eq!(r.to_vec1::<f32>()?, vec![1.0, 0.0]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct FnReward<F> {
    name: String,
    f: F,
}

impl<F> FnReward<F>
where
    F: Fn(&str, &RewardContext, usize) -> f32 + Send + Sync,
{
    /// Wraps `f` under `name`.
    pub fn new(name: impl Into<String>, f: F) -> Self {
        Self {
            name: name.into(),
            f,
        }
    }
}

impl<F> std::fmt::Debug for FnReward<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FnReward")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl<F> RewardFn for FnReward<F>
where
    F: Fn(&str, &RewardContext, usize) -> f32 + Send + Sync,
{
    fn name(&self) -> &str {
        &self.name
    }

    fn score(&self, completions: &[String], ctx: &RewardContext) -> Result<Tensor> {
        ctx.validate(completions.len())?;
        let v = completions
            .iter()
            .enumerate()
            .map(|(i, c)| (self.f)(c, ctx, i))
            .collect();
        rewards_tensor(&self.name, v)
    }
}

impl std::fmt::Debug for dyn RewardFn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RewardFn({})", self.name())
    }
}
