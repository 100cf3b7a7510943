//! Shared foundation of AtomRL's atomic-function crates.
//!
//! - [`Error`]: the one error type; every variant names the function and argument at fault with
//!   the expected and actual value or shape.
//! - [`shape`]: checks run before computing (rank, dims, finiteness, 0/1 masks).
//! - [`registry`]: how a crate describes its functions ([`FnSpec`]) and runs them on named
//!   [`Inputs`] for the `atomrl-fn` command-line tool.
//! - [`stage`]: [`RewardBatch`], the rewards that pass from the reward functions to the
//!   advantages.
//! - [`device`]: [`DeviceSpec`] (`cpu`, `cuda`, `cuda:N`) and [`ComputeDtype`] (`f32`, `bf16`,
//!   `f16`), how every command names where and in what precision it computes.
//! - [`ChatMessage`] (one message of a conversation) and [`hub_cache_dir`] (the Hugging Face
//!   hub cache folder), shared by data and model loading.
//! - [`rng`]: [`rng::SplitMix64`], the one seeded generator every crate derives its seeds
//!   from (data order, random initialisation, sampling).
//! - [`profile`]: phase timers (device synchronised at each boundary) and an allocation
//!   counter, the instrument of `cargo xtask bench --profile`.
//! - [`allocator`]: glibc's allocator tuned for candle's CPU tensors (buffers kept, arenas).
//! - [`Trajectory`] and [`ToolCallRecord`]: what a multi-turn tool rollout did, passed from
//!   the sampler to the reward functions.
//!
//! Conventions used by every AtomRL crate: tensors are batch-first; `N` is the number of
//! completions (prompts × group size `G`), `T` the completion length, `V` the vocabulary; masks
//! are 0/1 float tensors with 1 on completion tokens.

#![deny(missing_docs)]

pub mod allocator;
pub mod cblas;
pub mod chat;
pub mod compare;
pub mod cpu_plan;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod device;
pub mod error;
pub mod golden;
pub mod hub;
pub mod launch_dims;
pub mod profile;
pub mod registry;
pub mod rng;
pub mod rollout_record;
pub mod shape;
pub mod stage;
pub mod trajectory;
pub mod value;

pub use chat::ChatMessage;
pub use device::{ComputeDtype, DeviceSpec};
pub use error::{CandleContext, Error, Result};
pub use hub::hub_cache_dir;
pub use registry::{check_example, ArgKind, ArgSpec, AtomicFn, FnSpec, OutputSpec};
pub use rollout_record::RolloutRecord;
pub use stage::RewardBatch;
pub use trajectory::{ToolCallRecord, Trajectory};
pub use value::{Inputs, OutputValue, Outputs};
