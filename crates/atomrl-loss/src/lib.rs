//! Differentiable losses for RL post-training of language models, on candle.
//!
//! - [`compute_policy_loss`]: the clipped surrogate loss of PPO / GRPO / DAPO / Dr. GRPO / GSPO,
//!   with asymmetric clip, optional dual clip, token- or sequence-level ratio, and the
//!   statistics a trainer logs (clip fractions, `ppo_kl`, ratio mean and max).
//! - [`compute_kl_penalty`]: per-token KL estimators k1, k2, k3 (`low_var_kl`) and abs.
//! - [`aggregate_loss`]: the four reductions of a per-token loss (`token_mean`,
//!   `seq_mean_token_mean`, `seq_mean_token_sum`, `seq_mean_token_sum_norm`), with global
//!   normalisers for exact gradient accumulation.
//! - [`entropy_from_logits`]: per-token entropy, computed in chunks over positions.
//!
//! ```
//! use atomrl_loss::{compute_policy_loss, AggOptions, LossAgg, PolicyLossOptions};
//! use candle_core::{Device, Tensor, Var};
//!
//! let dev = Device::Cpu;
//! let logp = Var::new(&[[-0.9f32, -1.1, -0.3], [-2.0, -0.1, -0.4]], &dev)?;
//! let old = Tensor::new(&[[-1.0f32, -1.0, -0.3], [-2.0, -0.2, -0.4]], &dev)?;
//! let adv = Tensor::new(&[0.5f32, -1.0], &dev)?;
//! let mask = Tensor::new(&[[1f32, 1.0, 1.0], [1.0, 1.0, 0.0]], &dev)?;
//! let opts = PolicyLossOptions {
//!     clip_high: 0.28, // DAPO clip-higher
//!     agg: AggOptions::new(LossAgg::TokenMean),
//!     ..PolicyLossOptions::default()
//! };
//! let out = compute_policy_loss(&logp, &old, &adv, &mask, &opts)?;
//! let grads = out.loss.backward()?;
//! assert_eq!(grads.get(&logp).expect("gradient").dims(), &[2, 3]);
//! assert!(out.clip_frac >= 0.0 && out.clip_frac <= 1.0);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Conventions: tensors are batch-first, `[N, T]` with `N` completions of `T` tokens; masks are
//! 0/1 with 1 on completion tokens; inputs at masked-out positions are never read (they may be
//! NaN) and receive zero gradient; an entirely masked batch is an error. Every function works
//! for f32 and f64 (and keeps the dtype of `log_probs`). Semantics follow verl 0.9.1's
//! `core_algos` (`compute_policy_loss_vanilla`, `agg_loss`, `kl_penalty`); see `docs/losses.md`.
//! Errors are [`atomrl_core::Error`] values naming the argument, the expected and the actual
//! value.

#![deny(missing_docs)]

mod agg;
mod check;
mod dpo;
mod entropy;
mod kl;
mod kl_reward;
mod pairwise;
mod pg;
mod policy;
mod registry;
mod registry_pairwise;
mod reward_model;
mod sft;
mod value;

pub use agg::{aggregate_loss, AggOptions, LossAgg};
pub use atomrl_core::{Error, Result};
pub use dpo::{compute_dpo_loss, DpoLossOutput, DpoLossType, DpoOptions};
pub use entropy::{entropy_from_logits, entropy_from_logits_chunked, DEFAULT_CHUNK_ELEMS};
pub use kl::{compute_kl_penalty, KlEstimator, KlOutput, K3_CLAMP};
pub use kl_reward::{apply_kl_penalty, AdaptiveKlController, KlRewardOutput};
pub use pg::compute_pg_loss;
pub use policy::{
    compute_policy_loss, PolicyLossOptions, PolicyLossOutput, RatioLevel, DEFAULT_CLIP_HIGH,
    DEFAULT_CLIP_LOW, LOG_RATIO_CLAMP,
};
pub use registry::functions;
pub use reward_model::{compute_reward_model_loss, RewardModelLossOutput};
pub use sft::{compute_sft_loss, compute_sft_loss_from_logits, SftLossOutput, IGNORE_INDEX};
pub use value::{compute_value_loss, ValueLossOutput};
