//! Models and datasets named on the Hugging Face Hub, resolved to local files.
//!
//! One resolver for every place a model or dataset is named (`atomrl-train`, `atomrl-infer`,
//! the examples, `atomrl-fn`'s `model_dir`, [`CausalLm::from_hub`-style constructors]): a local
//! folder is used as is; otherwise `org/name[@revision]` is looked up in the hub cache, and
//! what the cache lacks is downloaded (feature `download`, on by default) with `hf-hub` into
//! the standard layout `models--org--name/{blobs,snapshots,refs}` — the layout Python's
//! `huggingface_hub` reads and writes, so each reuses the other's files.
//!
//! - [`HubSettings`]: the standard environment (`HF_ENDPOINT`, `HF_HOME`, `HF_HUB_CACHE`,
//!   `HF_TOKEN` and the token file, `HF_HUB_OFFLINE`).
//! - [`RepoSpec`]: a repository id with an optional revision (`org/name@v1`).
//! - [`resolve_model`] / [`model_dir`]: a model (or PEFT adapter) folder; [`model_files`] says
//!   which files of a repository a model needs.
//! - [`resolve_dataset_split`]: the parquet or JSONL shards of one split of a dataset.
//!
//! Errors are one line naming the repository and file: unknown repository or file (404), gated
//! or private without a token (401/403, "set HF_TOKEN"), no network, offline with a cache miss.
//! An interrupted download leaves only a `.part` file, which never counts as complete and is
//! resumed by the next attempt.
//!
//! ```
//! // A local folder is returned as is, with no network and no cache.
//! let dir = std::env::temp_dir();
//! let settings = atomrl_hub::HubSettings::from_env();
//! assert_eq!(atomrl_hub::resolve_model(dir.to_str().unwrap(), &settings)?, dir);
//! # Ok::<(), atomrl_core::Error>(())
//! ```
//!
//! [`CausalLm::from_hub`-style constructors]: https://docs.rs/atomrl-model

mod cache;
#[cfg(feature = "download")]
mod download;
mod model_files;
#[cfg(feature = "download")]
mod progress;
mod resolve;
mod settings;
mod spec;
#[cfg(feature = "test-server")]
pub mod test_server;

pub use model_files::{model_files, model_files_complete};
pub use resolve::{model_dir, resolve_dataset_split, resolve_model};
pub use settings::HubSettings;
pub use spec::{RepoKind, RepoSpec};
