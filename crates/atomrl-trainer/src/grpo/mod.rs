//! The GRPO and DAPO recipes: rollouts, rewards, advantages, the clipped policy update.

pub(crate) mod accumulate;
mod step;
mod trainer;
mod update;

pub use accumulate::{
    accumulate_and_step, zero_gradient_step, MicroStatistics, StepOutcome, StepSettings,
};
/// The padded tensors of an update (from `atomrl-logprob`).
pub use atomrl_logprob::TrainingBatch;
/// Prompts, rollouts and evaluation (from `atomrl-rollout`).
pub use atomrl_rollout::{
    add_round, evaluate, evaluate_sharded, generate_group_rows, generate_group_rows_distributed,
    generate_group_rows_sharded, EncodedPrompt, EvalResult, PromptEncoder, RolloutContext,
    RolloutRow, Rollouts,
};
/// Generation decoded for rewards and updates, single-turn or with tools (from
/// `atomrl-sample`).
pub use atomrl_sample::{generate_rows, GeneratedRow, ToolUse};
pub use trainer::{GRPOTrainer, TrainSummary, Trainer};
pub use update::{policy_update, UpdateContext, UpdateStats};
