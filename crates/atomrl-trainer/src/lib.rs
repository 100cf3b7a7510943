//! GRPO, DAPO and SFT recipes composed from AtomRL's atomic crates.
//!
//! - [`data`] (the `atomrl-data` crate): datasets (JSONL, GSM8K parquet from the hub cache,
//!   synthetic word problems), splits and seeded epoch sampling.
//! - [`logging`] (the `atomrl-metrics` crate): `metrics.jsonl`, TensorBoard event files, PNG
//!   charts, the progress bar.
//! - [`config`]: [`config::GRPOArgs`] with the `grpo`, `dapo` and `sft` presets.
//! - [`optim`] (the `atomrl-optim` crate): AdamW with savable state, LR schedules, gradient
//!   accumulation and clipping.
//! - [`Trainer`] (also [`GRPOTrainer`]): the training loop every recipe shares — sampling,
//!   the recipe's step in two phases (make the [`Experience`](atomrl_rollout::Experience),
//!   then update the [`TrainState`]), checkpoints, exact resume, metrics, evaluation.
//! - [`grpo`]: the GRPO / DAPO update ([`grpo::policy_update`]); the experience comes from
//!   the `atomrl-rollout` crate. [`sft`]: the SFT step.
//! - [`accumulate`]: one optimizer step over micro-batches, workers and ranks.
//! - [`checkpoint`]: atomic HF-format checkpoints with the trainer state, for exact resume.
//! - [`runtime`]: the CPU plan (threads, workers), model and tokenizer loading.

#![deny(missing_docs)]

pub mod accumulate;
pub mod actor_critic;
pub mod checkpoint;
mod dpo;
pub mod grpo;
mod recipe;
pub mod reward_model;
pub mod run;
pub mod runtime;
pub mod sft;
mod state;
mod trainer;

/// Run configuration, re-exported from [`atomrl_config`].
pub use atomrl_config as config;
/// Datasets, re-exported from [`atomrl_data`].
pub use atomrl_data as data;
/// Metrics and logs, re-exported from [`atomrl_metrics`].
pub use atomrl_metrics as logging;
/// Optimisation, re-exported from [`atomrl_optim`].
pub use atomrl_optim as optim;
/// Prompts, experience and evaluation, re-exported from [`atomrl_rollout`].
pub use atomrl_rollout as rollout;
/// The shard rule of CPU workers and data-parallel ranks, re-exported from
/// [`atomrl_rollout::parallel`].
pub use atomrl_rollout::parallel;
pub use config::{GRPOArgs, Recipe};
pub use state::TrainState;
pub use trainer::{ExperienceHook, GRPOTrainer, TrainSummary, Trainer};
