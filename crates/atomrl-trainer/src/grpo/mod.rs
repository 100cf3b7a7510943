//! The GRPO and DAPO recipes: rollouts, rewards, advantages, the clipped policy update.

pub(crate) mod accumulate;
mod eval;
mod prompt;
mod rollout;
mod step;
mod trainer;
mod update;

pub use accumulate::{
    accumulate_and_step, zero_gradient_step, MicroStatistics, StepOutcome, StepSettings,
};
/// The padded tensors of an update (from `atomrl-logprob`).
pub use atomrl_logprob::TrainingBatch;
/// Generation decoded for rewards and updates, single-turn or with tools (from
/// `atomrl-sample`).
pub use atomrl_sample::{generate_rows, GeneratedRow, ToolUse};
pub use eval::{evaluate, evaluate_sharded, EvalResult};
pub use prompt::{EncodedPrompt, PromptEncoder};
pub use rollout::{
    add_round, generate_group_rows, generate_group_rows_distributed, generate_group_rows_sharded,
    RolloutContext, RolloutRow, Rollouts,
};
pub use trainer::{GRPOTrainer, TrainSummary, Trainer};
pub use update::{policy_update, UpdateContext, UpdateStats};
