//! Datasets for AtomRL: JSONL, GSM8K parquet (hub layout), synthetic word problems; splits and
//! sampling.
//!
//! Everything becomes a `Vec<`[`Example`]`>` (a [`Prompt`], a ground truth and, for SFT, a
//! completion; for DPO and reward models, a [`Preference`] pair):
//!
//! | source | function |
//! |---|---|
//! | JSON Lines (`prompt`/`ground_truth`, `prompt`/`completion`, `messages`, GSM8K `question`/`answer`, `prompt`/`chosen`/`rejected`) | [`load_jsonl`], [`parse_jsonl`] |
//! | a parquet file in the same row shapes | [`load_parquet`] ([`load_gsm8k_parquet`]) |
//! | a hub dataset in the local hub cache (`openai/gsm8k`) | [`resolve_hub_dataset`], [`hub_cache_dir`] |
//! | any of the above, from a command-line string | [`DataSource::parse`], [`DataSource::load`] |
//! | synthetic grade-school word problems (offline default) | [`synthetic_word_problems`], [`synthetic_splits`] |
//!
//! Then [`train_eval_split`] holds out an eval set and [`EpochSampler`] hands out shuffled
//! batches of indices, resumable exactly from a saved [`SamplerState`]. All randomness here is
//! [`SplitMix64`], so data order does not change with dependency versions.
//!
//! ```
//! use atomrl_data::{synthetic_splits, EpochSampler};
//! let (train, eval) = synthetic_splits(100, 10, 0);
//! let mut sampler = EpochSampler::new(train.len(), 0);
//! let batch: Vec<_> = sampler.next_batch(8).into_iter().map(|i| &train[i]).collect();
//! assert_eq!((batch.len(), eval.len()), (8, 10));
//! ```

#![deny(missing_docs)]

mod example;
mod hub;
mod jsonl;
mod parquet;
mod preference;
mod sampler;
mod shuffle;
mod source;
mod split;
mod synthetic;

pub use example::{ChatMessage, Example, Prompt};
pub use hub::{hub_cache_dir, resolve_hub_dataset, resolve_hub_dataset_shards};
pub use jsonl::{load_jsonl, parse_jsonl, write_jsonl};
pub use parquet::{load_gsm8k_parquet, load_parquet};
pub use preference::{is_preference_dataset, require_preference_dataset, Preference};
pub use sampler::{EpochSampler, SamplerState};
pub use shuffle::{seeded_permutation, SplitMix64};
pub use source::{DataSource, SYNTHETIC_DEFAULT, SYNTHETIC_DEFAULT_PROBLEMS};
pub use split::{load_splits, load_splits_with, train_eval_split};
pub use synthetic::{
    synthetic_problems, synthetic_splits, synthetic_splits_with, synthetic_word_problems, Op, Step,
    SyntheticConfig, SyntheticProblem, SYNTHETIC_TEMPLATES,
};
