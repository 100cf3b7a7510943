//! Group-relative advantage estimators for RL post-training of language models.
//!
//! The central item is [`compute_advantages`]: one reward per completion (`[N]`, grouped as
//! `G` consecutive completions of the same prompt) in, one advantage per completion out, with
//! the group statistics a trainer logs. [`filter_groups`] is DAPO's dynamic-sampling filter.
//!
//! ```
//! use atomrl_advantage::{compute_advantages, AdvantageMode, DEFAULT_EPS};
//! use candle_core::{Device, Tensor};
//!
//! let rewards = Tensor::new(&[1f32, 0.0, 0.5, 0.5], &Device::Cpu)?;
//! let out = compute_advantages(&rewards, 2, AdvantageMode::GrpoNoStd, DEFAULT_EPS)?;
//! assert_eq!(out.advantages.to_vec1::<f32>()?, vec![0.5, -0.5, 0.0, 0.0]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Conventions: rewards are float tensors of shape `[N]`; statistics are computed in f64 and
//! the outputs have the rewards' dtype and device. Errors are [`atomrl_core::Error`] values
//! naming the argument, the expected and the actual value.

#![deny(missing_docs)]

mod compute;
mod filter;
mod gae;
mod group_stats;
mod mode;
mod registry;

pub use atomrl_core::{Error, Result};
pub use compute::{advantages_from_group_stats, compute_advantages, AdvantageOutput, DEFAULT_EPS};
pub use filter::{filter_groups, GroupFilter};
pub use gae::{compute_gae, GaeOutput};
pub use group_stats::GroupStats;
pub use mode::AdvantageMode;
pub use registry::functions;

// The README's example is compiled and run as a doctest so it cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeDoctests;
