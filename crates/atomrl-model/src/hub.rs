//! Loading from the Hugging Face hub: the hub cache's layout, resolved locally.
//!
//! A hub model is read from the cache folder that `huggingface_hub` (and `hf-hub`) fill:
//! `<cache>/models--<org>--<name>/snapshots/<commit>/<files>`, with `refs/<revision>` holding
//! the commit. With the `hub` feature, missing files are first downloaded (`atomrl-hub`, through
//! `hf-hub`). After that, loading is [`CausalLm::from_hf_dir`] on the snapshot folder.

use std::path::{Path, PathBuf};

use atomrl_core::{Error, Result};
use candle_core::{DType, Device};

use crate::model::CausalLm;

pub use atomrl_core::hub_cache_dir;

/// The snapshot folder of `repo_id` (`org/name`) at `revision` (a branch or tag with a
/// `refs/` entry, or a commit hash) in the hub cache `cache_dir`.
///
/// # Errors
/// [`Error::File`] naming the missing cache entry.
///
/// ```
/// let cache = std::env::temp_dir().join("atomrl_doctest_hub");
/// let snap = cache.join("models--org--tiny/snapshots/abc123");
/// std::fs::create_dir_all(&snap).unwrap();
/// std::fs::create_dir_all(cache.join("models--org--tiny/refs")).unwrap();
/// std::fs::write(cache.join("models--org--tiny/refs/main"), "abc123").unwrap();
/// assert_eq!(atomrl_model::resolve_hub_snapshot(&cache, "org/tiny", "main")?, snap);
/// assert!(atomrl_model::resolve_hub_snapshot(&cache, "org/other", "main").is_err());
/// # Ok::<(), atomrl_core::Error>(())
/// ```
pub fn resolve_hub_snapshot(cache_dir: &Path, repo_id: &str, revision: &str) -> Result<PathBuf> {
    let repo = cache_dir.join(format!("models--{}", repo_id.replace('/', "--")));
    if !repo.is_dir() {
        return Err(Error::file(
            repo.display(),
            format!("`{repo_id}` is not in the hub cache"),
        ));
    }
    atomrl_core::hub::snapshot_dir(&repo, repo_id, revision)
}

impl CausalLm {
    /// Loads `repo_id` at `revision` (default `main`) from the hub cache
    /// ([`hub_cache_dir`]); with the `hub` feature, missing files are downloaded first
    /// (`HF_ENDPOINT`, `HF_TOKEN`, `HF_HUB_OFFLINE` are read as `huggingface_hub` reads them;
    /// see the `atomrl-hub` crate).
    ///
    /// # Errors
    /// [`Error::File`] naming the repository and the missing file, or the download's failure.
    ///
    /// ```
    /// use candle_core::{DType, Device};
    /// std::env::set_var("HF_HUB_OFFLINE", "1"); // this example reads the (empty) cache only
    /// let err = atomrl_model::CausalLm::from_hub_cache(
    ///     std::path::Path::new("/no/cache"), "Qwen/Qwen3-0.6B", None, DType::F32, &Device::Cpu);
    /// assert!(err.unwrap_err().to_string().contains("Qwen/Qwen3-0.6B"));
    /// ```
    pub fn from_hub(
        repo_id: &str,
        revision: Option<&str>,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        Self::from_hub_cache(&hub_cache_dir(), repo_id, revision, dtype, device)
    }

    /// [`CausalLm::from_hub`] with an explicit cache folder.
    ///
    /// # Errors
    /// As [`CausalLm::from_hub`].
    ///
    /// ```
    /// use candle_core::{DType, Device};
    /// std::env::set_var("HF_HUB_OFFLINE", "1");
    /// assert!(atomrl_model::CausalLm::from_hub_cache(
    ///     std::path::Path::new("/no/cache"), "a/b", Some("v1"), DType::F32, &Device::Cpu).is_err());
    /// ```
    pub fn from_hub_cache(
        cache_dir: &Path,
        repo_id: &str,
        revision: Option<&str>,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let settings = atomrl_hub::HubSettings {
            cache_dir: cache_dir.to_path_buf(),
            ..atomrl_hub::HubSettings::from_env()
        };
        let spec = match revision {
            Some(rev) => format!("{repo_id}@{rev}"),
            None => repo_id.to_string(),
        };
        let snap = atomrl_hub::resolve_model(&spec, &settings)?;
        Self::from_hf_dir(snap, dtype, device)
    }
}
