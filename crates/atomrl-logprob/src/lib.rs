//! Per-token log-probabilities and entropies for RL post-training of language models.
//!
//! - [`selective_log_softmax`]: the pure form, from logits `[N, T, V]` and chosen tokens
//!   `[N, T]`, computed a chunk of rows at a time (Qwen's vocabulary has 151,936 entries: an
//!   `[N, T, V]` f32 temporary would dwarf the model).
//! - [`get_action_log_probs`]: the model form on an [`atomrl_model::CausalLm`]: one forward
//!   pass for the hidden states, then the LM head and the log-softmax chunk by chunk, for the
//!   last `logits_to_keep` tokens (the completion), at a sampling temperature.
//! - [`get_shared_prompt_log_probs`]: the same numbers for completions grouped by prompt (as
//!   GRPO samples them), running each prompt through the model once.
//!
//! Both are differentiable, so the policy loss's gradient reaches the model. (The padded
//! rows a trainer feeds them, `atomrl_rollout::Experience`, live with the rollouts.)
//!
//! ```
//! use atomrl_logprob::selective_log_softmax;
//! use candle_core::{Device, Tensor};
//! let logits = Tensor::new(&[[[1f32, 1.0, 1.0, 1.0]]], &Device::Cpu)?;
//! let out = selective_log_softmax(&logits, &Tensor::new(&[[2u32]], &Device::Cpu)?, 1.0, false)?;
//! assert!((out.log_probs.to_vec2::<f32>()?[0][0] - 0.25f32.ln()).abs() < 1e-6);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Errors are [`atomrl_core::Error`] values naming the argument (`input_ids[1, 3]`,
//! `attention_mask`, `temperature`), the expected and the actual value.

#![deny(missing_docs)]

mod accumulate;
mod action;
#[cfg(feature = "cuda")]
mod cuda;
mod fused;
mod hidden;
pub mod kernel_check;
#[cfg(test)]
mod kernels_sim;
mod registry;
mod selective;
mod sequence;
mod shared_prompt;

pub use action::{get_action_log_probs, get_action_log_probs_chunked, FUSED_HEAD_MIN_VOCAB};
pub use atomrl_core::{Error, Result};
pub use hidden::get_hidden_log_probs;
pub use registry::functions;
pub use selective::{
    chunk_elements_for, selective_log_softmax, selective_log_softmax_chunked, TokenLogProbs,
    DEFAULT_CHUNK_ELEMENTS, MAX_DEVICE_CHUNK_ELEMENTS,
};
pub use sequence::{get_sequence_log_probs, SequenceBatch, SequenceLogProbs};
pub use shared_prompt::{
    get_shared_prompt_hidden, get_shared_prompt_last_hidden, get_shared_prompt_log_probs,
    SharedPromptBatch,
};
