//! The GRPO and DAPO recipes: rollouts, rewards, advantages, the clipped policy update.

pub(crate) mod accumulate;
mod batch;
mod eval;
mod generation;
mod prompt;
mod rollout;
mod step;
mod trainer;
mod update;

pub use accumulate::{accumulate_and_step, zero_gradient_step, StepOutcome, StepSettings};
pub use batch::TrainingBatch;
pub use eval::{evaluate, evaluate_sharded, EvalResult};
pub use generation::{generate_rows, GeneratedRow, ToolUse};
pub use prompt::{EncodedPrompt, PromptEncoder};
pub use rollout::{
    add_round, generate_group_rows, generate_group_rows_sharded, RolloutContext, RolloutRow,
    Rollouts,
};
pub use trainer::{GRPOTrainer, TrainSummary, Trainer};
pub use update::{policy_update, UpdateContext, UpdateStats};
