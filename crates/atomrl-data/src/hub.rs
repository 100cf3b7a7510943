//! Hub datasets, found in the local Hugging Face hub cache (no network: downloading is
//! `atomrl-hub`'s, which the trainer calls through [`crate::DataSource::load_with`]).
//!
//! `atomrl-train` or `huggingface-cli download openai/gsm8k --repo-type dataset` fills
//! `<cache>/datasets--openai--gsm8k/snapshots/<commit>/main/{train,test}-00000-of-00001.parquet`
//! with `refs/main` holding `<commit>`; this module finds those files.

use std::path::{Path, PathBuf};

use atomrl_core::{Error, Result};

/// The hub cache folder: `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else
/// `~/.cache/huggingface/hub` (the same rule as for models, [`atomrl_core::hub_cache_dir`]).
///
/// ```
/// let dir = atomrl_data::hub_cache_dir();
/// assert!(dir.ends_with("hub") || std::env::var_os("HF_HUB_CACHE").is_some());
/// ```
pub fn hub_cache_dir() -> PathBuf {
    atomrl_core::hub_cache_dir()
}

/// The parquet file of one split of a hub dataset in the hub cache `cache_dir`.
///
/// Looks in the snapshot named by `refs/main` (or the only snapshot, when there is no
/// `refs/main`) for `{config}/{split}-*.parquet` (GSM8K: `main/train-00000-of-00001.parquet`),
/// then `data/{split}-*.parquet`, then `{split}-*.parquet` at the snapshot root (with no
/// `config`, also `default/{split}-*.parquet`); `{split}.parquet` counts too.
///
/// # Errors
/// [`Error::Value`] for a `repo_id` that is not `org/name` or a bad split name;
/// [`Error::File`] when the dataset is not cached (saying how to download it), when no file of
/// the split is found, or when the split has several shards (use
/// [`resolve_hub_dataset_shards`]).
///
/// ```
/// use atomrl_data::resolve_hub_dataset;
/// let cache = std::env::temp_dir().join("atomrl_doctest_hub_dataset");
/// let snap = cache.join("datasets--openai--gsm8k/snapshots/abc123/main");
/// std::fs::create_dir_all(&snap).unwrap();
/// std::fs::create_dir_all(cache.join("datasets--openai--gsm8k/refs")).unwrap();
/// std::fs::write(cache.join("datasets--openai--gsm8k/refs/main"), "abc123").unwrap();
/// std::fs::write(snap.join("test-00000-of-00001.parquet"), b"").unwrap();
/// let path = resolve_hub_dataset(&cache, "openai/gsm8k", Some("main"), "test")?;
/// assert!(path.ends_with("main/test-00000-of-00001.parquet"));
/// let err = resolve_hub_dataset(&cache, "openai/other", None, "test").unwrap_err();
/// assert!(err.to_string().contains("huggingface-cli download openai/other --repo-type dataset"));
/// # Ok::<(), atomrl_core::Error>(())
/// ```
pub fn resolve_hub_dataset(
    cache_dir: &Path,
    repo_id: &str,
    config: Option<&str>,
    split: &str,
) -> Result<PathBuf> {
    let mut shards = resolve_hub_dataset_shards(cache_dir, repo_id, config, split)?;
    if shards.len() > 1 {
        return Err(Error::file(
            shards[0].display(),
            format!(
                "split `{split}` of `{repo_id}` has {} shards; load them all with \
                 `resolve_hub_dataset_shards`",
                shards.len()
            ),
        ));
    }
    // `resolve_hub_dataset_shards` never returns an empty list.
    shards
        .pop()
        .ok_or_else(|| Error::file(cache_dir.display(), "no shard"))
}

/// Every parquet shard of one split of a hub dataset, in name order (for example
/// `train-00000-of-00002.parquet`, `train-00001-of-00002.parquet`); see
/// [`resolve_hub_dataset`] for where they are looked for.
///
/// # Errors
/// As [`resolve_hub_dataset`], except that several shards are not an error.
///
/// ```
/// let err = atomrl_data::resolve_hub_dataset_shards(
///     "/no/cache".as_ref(), "openai/gsm8k", Some("main"), "train").unwrap_err();
/// assert!(err.to_string().contains("datasets--openai--gsm8k"));
/// ```
pub fn resolve_hub_dataset_shards(
    cache_dir: &Path,
    repo_id: &str,
    config: Option<&str>,
    split: &str,
) -> Result<Vec<PathBuf>> {
    const FUNC: &str = "resolve_hub_dataset";
    let parts: Vec<&str> = repo_id.split('/').collect();
    if parts.len() != 2
        || parts
            .iter()
            .any(|p| p.is_empty() || *p == "." || *p == "..")
    {
        return Err(Error::value(FUNC, "repo_id", "`org/name`", repo_id));
    }
    let plain = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
            && !s.starts_with('.')
    };
    if !plain(split) {
        return Err(Error::value(
            FUNC,
            "split",
            "a split name such as `train` or `test`",
            split,
        ));
    }
    if let Some(c) = config.filter(|c| !plain(c)) {
        return Err(Error::value(
            FUNC,
            "config",
            "a config name such as `main`",
            c,
        ));
    }
    let repo = cache_dir.join(format!("datasets--{}--{}", parts[0], parts[1]));
    if !repo.is_dir() {
        return Err(Error::file(
            repo.display(),
            format!(
                "dataset `{repo_id}` is not in the hub cache {} (this function reads the cache \
                 only: `atomrl-train` and the examples download it, as does \
                 `huggingface-cli download {repo_id} --repo-type dataset`; HF_HUB_CACHE or \
                 HF_HOME choose another cache)",
                cache_dir.display()
            ),
        ));
    }
    let snapshot = atomrl_core::hub::snapshot_dir(&repo, repo_id, "main")?;
    let files = atomrl_core::hub::list_files(&snapshot)?;
    let picked = atomrl_core::hub::select_split_files(&files, config, split);
    if picked.is_empty() {
        return Err(Error::file(
            snapshot.display(),
            format!(
                "no `{split}` split of `{repo_id}`{} in the cached snapshot (looked for {})",
                config
                    .map(|c| format!(" (config `{c}`)"))
                    .unwrap_or_default(),
                atomrl_core::hub::split_patterns(config, split)
            ),
        ));
    }
    Ok(picked.iter().map(|f| snapshot.join(f)).collect())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn bad_ids() {
        let c = Path::new("/nonexistent");
        for id in ["gsm8k", "a/b/c", "/x", "../x"] {
            let err = resolve_hub_dataset(c, id, None, "train").unwrap_err();
            assert!(matches!(err, Error::Value { .. }), "{id}: {err}");
        }
        assert!(resolve_hub_dataset(c, "a/b", None, "../x").is_err());
        assert!(resolve_hub_dataset(c, "a/b", Some("x/y"), "train").is_err());
    }
}
