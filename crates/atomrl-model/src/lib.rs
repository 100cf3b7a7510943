//! AtomRL's trainable causal language model: Qwen2 / Qwen2.5 / Qwen3 (and Llama) for Candle.
//!
//! The stock candle-transformers models run `backward()` but give a gradient to the LM head
//! only (their fused kernels have no backward). [`CausalLm`] is written from differentiable
//! tensor ops, keeps every weight as a [`candle_core::Var`] under its Hugging Face name, and
//! matches transformers (float32, eager attention) to about 1e-5 on the logits.
//!
//! - Loading: [`CausalLm::from_hf_dir`] (single or sharded safetensors, any float dtype
//!   converted on load), [`CausalLm::from_hub`] (the hub cache layout),
//!   [`CausalLm::from_config_random`].
//! - Forward: [`CausalLm::forward`] with a [`ForwardInput`] (ids, key-padding mask, positions)
//!   and an optional caller-owned [`KvCache`]; left and right padding both work (the mask
//!   value is the finite [`MASK_VALUE`]).
//! - Training: [`CausalLm::trainable_vars`] for an optimiser, [`CausalLm::save_hf`] to write
//!   a folder transformers loads unchanged.
//! - LoRA: [`CausalLm::add_lora`], [`CausalLm::merge_lora`], [`CausalLm::save_lora`] /
//!   [`CausalLm::load_lora`] in PEFT's layout; base weights frozen with no gradient work.
//! - [`kernel_check`]: each fused kernel alone on a device, against its tensor-op form (the
//!   per-kernel rows of `xtask device-check`).
//!
//! ```
//! use atomrl_model::{Architecture, CausalLm, ForwardInput, ModelConfig};
//! use candle_core::{DType, Device, Tensor};
//! let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/reference/models/tiny-qwen2");
//! let model = CausalLm::from_hf_dir(dir, DType::F32, &Device::Cpu)?;
//! let ids = Tensor::new(&[[3u32, 4, 5], [6, 7, 0]], &Device::Cpu)?;
//! let mask = Tensor::new(&[[1u32, 1, 1], [1, 1, 0]], &Device::Cpu)?;
//! let logits = model.forward(&ForwardInput::new(ids).with_attention_mask(mask), None)?;
//! assert_eq!(logits.dims(), &[2, 3, 512]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![deny(missing_docs)]

mod attention;
mod attention_times;
mod cache;
mod checkpoint;
mod config;
mod flash_attention;
mod hub;
mod input;
pub mod kernel_check;
mod kernels;
mod linear;
mod lora;
mod model;
mod model_dir_arg;
mod network;
mod ops;
mod params;
mod save;
mod static_decode;
mod value;
mod weight_casts;
mod weights;

pub use atomrl_core::{Error, Result};
pub use attention::{default_scores_budget, DEFAULT_SCORES_BUDGET, GPU_SCORES_BUDGET};
pub use attention_times::{attention_times, AttentionTime};
pub use cache::KvCache;
pub use config::{Architecture, ModelConfig};
pub use flash_attention::{FlashPolicy, FLASH_ATTENTION_ENV};
pub use hub::{hub_cache_dir, resolve_hub_snapshot};
pub use input::{position_ids_from_mask, ForwardInput, MASK_VALUE};
pub use kernels::exp_detached;
pub use lora::{LoraConfig, ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE, LORA_TARGETS};
pub use model::CausalLm;
pub use model_dir_arg::model_dir_arg;
pub use save::COPIED_FILES;
pub use static_decode::{static_decode_op_times, OpTime, StaticDecode};
pub use value::{
    HeadLayout, PolicyCut, ValueModel, CRITIC_ADAPTERS_FILE, SCORE_BIAS, SCORE_WEIGHT,
};
pub use weight_casts::SharedWeightCasts;
pub use weights::{
    load_safetensors_dir, load_safetensors_file, save_safetensors, WEIGHTS_FILE, WEIGHTS_INDEX_FILE,
};
