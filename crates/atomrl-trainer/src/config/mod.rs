//! Run configuration: [`GRPOArgs`] with the `grpo`, `dapo` and `sft` presets, loaded from a
//! TOML file plus `--set key=value` overrides.

mod args;
mod choices;
mod load;
mod rewards;
mod validate;

pub use args::{GRPOArgs, LoraArgs, LrSchedule, Recipe, RewardSpec};
pub use choices::{ComputeDtype, DeviceSpec, Resume};
pub use load::load_args;
pub use rewards::build_rewards;
pub use validate::validate;
