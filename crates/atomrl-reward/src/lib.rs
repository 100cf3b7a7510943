//! Text-level reward functions for RL post-training of language models (GRPO, DAPO).
//!
//! A reward takes `N` completions (plus per-sample context: ground truth, prompts, lengths in
//! tokens) and returns one f32 reward per completion, `[N]`. Every reward here is available
//! three ways: a per-string function (`correctness_score`), a batch function returning a
//! tensor (`correctness_reward`), and a [`RewardFn`] implementor (`Correctness`) that
//! [`WeightedRewards`] combines into an [`atomrl_core::RewardBatch`] (`total [N]`,
//! `per_fn [N, F]`, names). [`reward_fn_by_name`] builds the built-ins from a trainer config.
//!
//! | reward | scores | range |
//! |---|---|---|
//! | [`correctness_reward`] | extracted answer equals the ground truth (numerically; `strict` also requires the hard format) | {0, 1} |
//! | [`digit_reward`] | the extracted answer is a number | {0, 1} |
//! | [`hard_format_reward`] | exactly `<think>\n…\n</think>\n<answer>\n…\n</answer>` | {0, 1} |
//! | [`soft_format_reward`] | the four tags appear in order | {0, 1} |
//! | [`mark_reward`] | partial credit per well-placed tag, minus trailing text | [0, 0.5] |
//! | [`overlong_penalty`] | DAPO soft overlong punishment on lengths in tokens | [−factor, 0] |
//! | [`step_reward`] | fraction of `a op b = c` steps that are right and use the problem's numbers | [0, 1] |
//!
//! ```
//! use atomrl_reward::{reward_fn_by_name, RewardContext, WeightedRewards};
//! use serde_json::json;
//!
//! let rewards = WeightedRewards::from_config(&json!([
//!     {"name": "correctness", "weight": 1.0},
//!     {"name": "hard_format", "weight": 0.2},
//!     {"name": "overlong", "weight": 1.0, "options": {"buffer_len": 64}}
//! ]))?;
//! let completions = vec![
//!     "<think>\n5+7\n</think>\n<answer>\n12\n</answer>".to_string(),
//!     "The answer is 1,000".to_string(),
//! ];
//! let ctx = RewardContext::new()
//!     .with_ground_truth(["12", "1000"])
//!     .with_completion_lengths(vec![20, 250])
//!     .with_max_completion_length(256);
//! let batch = rewards.score(&completions, &ctx)?;
//! assert_eq!(batch.names, vec!["correctness", "hard_format", "overlong"]);
//! let total = batch.total.to_vec1::<f32>()?;
//! assert!((total[0] - 1.2).abs() < 1e-6 && (total[1] - (1.0 - 58.0 / 64.0)).abs() < 1e-6);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! See `docs/rewards.md` for the exact extraction and normalisation rules and how to write your
//! own reward. Errors are [`atomrl_core::Error`] values naming the function, the argument, the
//! expected and the actual value.

#![deny(missing_docs)]
#![cfg_attr(test, allow(clippy::unwrap_used))]

mod accuracy;
mod batch;
mod builtin;
mod compose;
mod correctness;
mod extract;
mod format;
mod normalize;
mod number;
mod overlong;
mod registry;
mod reward_fn;
mod steps;
mod tags;

pub use accuracy::Accuracy;
pub use atomrl_core::{Error, Result, RewardBatch};
/// The multi-turn trajectory types of [`RewardContext::trajectories`] (defined in `atomrl-core`).
pub use atomrl_core::{ToolCallRecord, Trajectory};
pub use builtin::{
    reward_fn_by_name, Correctness, Digit, HardFormat, Mark, OverlongPenalty, SoftFormat, Steps,
    REWARD_NAMES,
};
pub use compose::{compose_rewards, WeightedRewards};
pub use correctness::{
    answer_number, answers_match, correctness_reward, correctness_score, digit_reward, digit_score,
    whole_number, CorrectnessOptions,
};
pub use extract::{
    extract_answer, extract_gsm8k_ground_truth, AnswerSource, ExtractOptions, Extracted,
};
pub use format::{
    hard_format_reward, is_hard_format, is_soft_format, mark_reward, mark_score,
    soft_format_reward, MarkOptions,
};
pub use normalize::normalize_text;
pub use number::{Number, DEFAULT_TOLERANCE};
pub use overlong::{overlong_penalty, overlong_penalty_one, OverlongOptions, OverlongVariant};
pub use registry::functions;
pub use reward_fn::{FnReward, RewardContext, RewardFn};
pub use steps::{parse_steps, step_reward, step_score, Step};
pub use tags::Tags;
