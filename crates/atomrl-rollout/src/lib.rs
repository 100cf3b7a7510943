//! Rollouts for RL post-training on Candle: what happens between "a batch of prompts" and "rows
//! to train on".
//!
//! - [`prompt`]: [`PromptEncoder`] renders an example through the chat template (system
//!   prompt, tool schemas) and left-truncates it to `max_prompt_length` tokens.
//! - [`rollout`]: [`generate_group_rows`] samples `G` completions per prompt (single-turn, or
//!   multi-turn with tools), decodes and scores them into [`RolloutRow`]s; [`add_round`]
//!   keeps whole groups, or only those with reward spread (DAPO dynamic sampling).
//! - [`eval`]: greedy held-out accuracy ([`evaluate`]).
//! - [`parallel`]: the shard rule shared by CPU workers and data-parallel ranks
//!   ([`split_even`](parallel::split_even), [`run_shards`](parallel::run_shards)); the
//!   `_sharded` and `_distributed` forms of the functions above split their work by it.
//!
//! ```
//! use atomrl_rollout::{add_round, RolloutRow, Rollouts};
//! use atomrl_sample::FinishReason;
//!
//! let row = |reward: f64| RolloutRow {
//!     prompt_ids: vec![1, 2],
//!     completion_ids: vec![3],
//!     model_token: vec![true],
//!     completion: "7".into(),
//!     trajectory: None,
//!     stopped_at_max_turns: false,
//!     prompt: "What is 3+4?".into(),
//!     finish_reason: FinishReason::Eos,
//!     reward,
//!     rewards_per_fn: vec![reward],
//!     correct: reward,
//! };
//! // Two groups of G = 2: the first has reward spread, the second is flat.
//! let rows = vec![row(1.0), row(0.0), row(1.0), row(1.0)];
//! let mut step = Rollouts::default();
//! add_round(&mut step, rows, 2, true, 8)?; // DAPO dynamic sampling keeps the first group only
//! assert_eq!((step.rows.len(), step.zero_std_groups, step.dropped_groups), (2, 1, 1));
//! # Ok::<(), atomrl_core::Error>(())
//! ```

#![deny(missing_docs)]

pub mod eval;
pub mod parallel;
pub mod prompt;
pub mod rollout;

pub use eval::{evaluate, evaluate_distributed, evaluate_sharded, EvalData, EvalResult};
pub use prompt::{EncodedPrompt, PromptEncoder};
pub use rollout::{
    add_round, generate_group_rows, generate_group_rows_distributed, generate_group_rows_sharded,
    RolloutContext, RolloutRow, Rollouts,
};

/// The README's example, run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
