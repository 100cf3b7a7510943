//! Run configuration for AtomRL: [`GRPOArgs`] with the `grpo`, `dapo` and `sft` presets
//! (`presets/*.toml`), loaded from a TOML file plus `--set key=value` overrides
//! ([`load_args`]), validated ([`validate`]), and viewed as the typed settings each phase of a
//! step reads ([`GRPOArgs::experience`], [`GRPOArgs::update`], [`GRPOArgs::adamw`]). The
//! user-facing keys are the flat fields of [`GRPOArgs`]; the typed views are how code reads
//! them. `atomrl-trainer` re-exports this crate as `atomrl_trainer::config`.
//!
//! ```
//! use atomrl_config::{load_args, Recipe};
//! let set = ["model=\"Qwen/Qwen2.5-0.5B-Instruct\"", "dataset=\"openai/gsm8k\"", "beta=0.04"].map(String::from);
//! let a = load_args(None, Some(Recipe::Dapo), &set)?;
//! assert_eq!(a.recipe, Recipe::Dapo);
//! assert_eq!(a.update().loss.beta, 0.04);
//! assert!(a.experience(vec![], 0).dynamic_sampling);
//! # Ok::<(), atomrl_core::Error>(())
//! ```

#![deny(missing_docs)]

mod actor_critic;
mod args;
mod load;
mod parts;
mod preference;
mod resume;
mod rewards;
mod tools;
mod validate;

pub use actor_critic::{CriticArgs, TrpoArgs};
pub use args::{AccuracySpec, GRPOArgs, LoraArgs, LrSchedule, Recipe, RewardSpec};
/// The compute dtype and the device, re-exported from [`atomrl_core`] (their home since every
/// command shares them) so that configuration code finds them here too.
pub use atomrl_core::{ComputeDtype, DeviceSpec};
pub use load::{apply_override, differing_keys, flatten_table, load_args};
pub use parts::{LossConfig, PolicyObjective, UpdateConfig};
pub use preference::{DpoArgs, RewardModelArgs};
pub use resume::Resume;
pub use rewards::{
    build_accuracy, build_rewards, build_rewards_with, ModelRewardLoader, MODEL_REWARD,
};
pub use tools::build_tools;
pub use validate::{validate, MAX_STEP_ROWS, MAX_THREADS_OR_WORKERS};

/// The README's example, run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
