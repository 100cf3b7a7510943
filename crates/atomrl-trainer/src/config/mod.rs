//! Run configuration: [`GRPOArgs`] with the `grpo`, `dapo` and `sft` presets, loaded from a
//! TOML file plus `--set key=value` overrides.

mod args;
mod load;
mod parts;
mod resume;
mod rewards;
mod tools;
mod validate;

pub use args::{AccuracySpec, GRPOArgs, LoraArgs, LrSchedule, Recipe, RewardSpec};
/// The compute dtype and the device, re-exported from [`atomrl_core`] (their home since every
/// command shares them) so that configuration code finds them here too.
pub use atomrl_core::{ComputeDtype, DeviceSpec};
pub use load::load_args;
pub use parts::{LossConfig, UpdateConfig};
pub use resume::Resume;
pub use rewards::{build_accuracy, build_rewards};
pub use tools::build_tools;
pub use validate::validate;
