//! The GRPO and DAPO recipes: the experience of a step (from `atomrl-rollout`), the clipped
//! policy update, the step's metrics.

mod step;
mod update;

pub(crate) use step::{step_report, GrpoStep};
pub use update::{policy_and_value_update, policy_update, UpdateStats, ValueTerm};
