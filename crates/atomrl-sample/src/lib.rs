//! Rollout generation for RL post-training of language models.
//!
//! - [`generate_samples`]: `G` sampled completions per prompt with batched KV-cache decoding
//!   (left-padded prompts computed once each, finished rows dropped from the running batch),
//!   returned as a [`RolloutBatch`]: ids, masks, lengths, [`FinishReason`]s and the sampling
//!   log-probabilities that `atomrl_logprob::get_action_log_probs` recomputes.
//! - [`SamplingParams`]: temperature (0 = greedy), top-k, top-p, min-p, repetition penalty,
//!   stop token ids and stop strings, seed.
//! - The pure per-step functions: [`process_logits`] / [`process_logits_row`] (the kept token
//!   sets), [`sample_from_processed`], [`sample_tokens`], with per-row generators [`RowRng`].
//! - [`BatchDecoder`]: the incremental decoder itself ([`CacheMode::KvCache`] or the
//!   no-cache [`CacheMode::Recompute`] baseline).
//! - [`generate_with_tools`]: multi-turn rollouts that pause at `<tool_call>`s, run the
//!   tools of an `atomrl_tools::ToolSet` and append their responses through the chat template,
//!   returned as a [`ToolRolloutBatch`] whose tool tokens are context, outside the loss mask.
//! - [`ChatTokenizer`]: `tokenizer.json` plus the model's own chat template (minijinja), with
//!   `tools` ([`ChatTokenizer::apply_chat_template_with_tools`],
//!   [`ChatTokenizer::tool_turn_text`]).
//!
//! ```
//! use atomrl_model::CausalLm;
//! use atomrl_sample::{generate_samples, ChatTokenizer, SamplingParams};
//! use candle_core::{DType, Device};
//! let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/reference/models/tiny-qwen2");
//! let model = CausalLm::from_hf_dir(dir, DType::F32, &Device::Cpu)?;
//! let tok = ChatTokenizer::from_hf_dir(dir)?;
//! let prompts = vec![tok.encode_chat_prompt("What is 2 + 2?")?];
//! let params = SamplingParams {
//!     num_generations: 4,
//!     max_new_tokens: 8,
//!     temperature: 0.9,
//!     top_p: 0.95,
//!     stop_token_ids: tok.eos_token_ids(),
//!     seed: 42,
//!     ..Default::default()
//! };
//! let out = generate_samples(&model, &prompts, &params, Some(&tok))?;
//! assert_eq!(out.completion_ids.dims()[0], 4);
//! let texts = tok.decode_completions(&out, &params.stop_strings)?;
//! assert_eq!(texts.len(), 4);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Errors are [`atomrl_core::Error`] values naming the argument or field at fault.

#![deny(missing_docs)]

mod chat;
mod decoded;
mod decoder;
mod device_pick;
mod generate;
pub mod kernel_check;
mod params;
mod philox;
#[cfg(feature = "cuda")]
mod pick_cuda;
#[cfg(test)]
mod pick_sim;
mod process;
mod registry;
mod rollout;
mod tool_rollout;
mod trajectory;

pub use atomrl_core::{Error, Result};
pub use chat::{ChatMessage, ChatTokenizer};
pub use decoded::{generate_rows, Completion, ToolUse};
pub use decoder::{BatchDecoder, CacheMode};
pub use generate::{generate_samples, generate_samples_with, MAX_ROWS};
pub use params::SamplingParams;
pub use process::{
    process_logits, process_logits_row, sample_from_processed, sample_tokens, RowRng,
    SampledTokens, FILTERED,
};
pub use registry::functions;
pub use rollout::{FinishReason, RolloutBatch};
pub use tool_rollout::{generate_with_tools, MAX_TOOL_TURNS_LIMIT};
pub use trajectory::{ToolRolloutBatch, ToolTrajectory};
