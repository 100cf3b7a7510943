//! Rollouts for RL post-training on Candle: what happens between "a batch of prompts" and "rows
//! to train on".
//!
//! - [`prompt`]: [`PromptEncoder`] renders an example through the chat template (system
//!   prompt, tool schemas) and left-truncates it to `max_prompt_length` tokens.
//! - [`make_experience`]: the "make experience" phase of a step: `G` sampled completions per
//!   prompt (single-turn, or multi-turn with tools), decoded and scored; whole groups, or only
//!   those with reward spread (DAPO dynamic sampling, further rounds until the batch is full);
//!   advantages; then the old policy's and the reference model's log-probs, once, split over
//!   workers and ranks. It returns an [`Experience`] (what the update reads) and a
//!   [`RolloutSummary`] (what the metrics report).
//! - [`evaluate`]: greedy held-out accuracy by the configured [`atomrl_reward::Accuracy`].
//! - [`parallel`]: the shard rule shared by CPU workers and data-parallel ranks
//!   ([`split_even`](parallel::split_even), [`run_shards`](parallel::run_shards)): every
//!   function here takes the workers and the collective and splits its work by it.
//!
//! ```
//! use atomrl_rollout::Experience;
//! use candle_core::Device;
//! // Two completions of one prompt: one of them a tool turn (outside the loss) then an answer.
//! let rows: [(&[u32], &[u32], &[bool]); 2] = [(&[1, 2], &[3, 9, 4], &[true, false, true]), (&[1, 2], &[5], &[true])];
//! let exp = Experience::from_rows(&rows, &[0.7, -0.7], &[true, true], 0, &Device::Cpu)?;
//! assert_eq!((exp.num_rows(), exp.normalizer.tokens), (2, 3.0));
//! assert!(exp.shared_prompts()?.is_some()); // the prompt runs once for both
//! # Ok::<(), atomrl_core::Error>(())
//! ```

#![deny(missing_docs)]

mod critic;
pub mod eval;
pub mod experience;
mod flat_groups;
mod length_buckets;
mod log_probs;
pub mod make;
mod model_reward;
mod pairs;
pub mod parallel;
pub mod prompt;
pub mod rollout;
mod sequence_scores;
pub mod summary;

pub use critic::{
    attach_values_and_gae, attach_values_and_gae_keeping_graphs, attach_values_and_gae_with,
    experience_values, outcome_token_rewards, values_statistics, GaeConfig, ValueStatistics,
};
pub use eval::{evaluate, EvalData, EvalResult};
pub use experience::{Experience, LossNormalizer, PairRole, TokenRow};
pub use log_probs::{experience_log_probs, experience_log_probs_and_hidden, sharded_log_probs};
pub use make::{make_experience, sampling_seed, ExperienceConfig, PromptBatch};
pub use model_reward::ModelReward;
pub use pairs::{
    best_worst_pairs, pair_margins, pair_sums, sample_preference_pairs, split_pairs, PairRow,
};
pub use prompt::{EncodedPrompt, PromptEncoder};
pub use rollout::RolloutContext;
pub use sequence_scores::experience_scores;
pub use summary::{RolloutSummary, ToolSummary};

/// The README's example, run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
