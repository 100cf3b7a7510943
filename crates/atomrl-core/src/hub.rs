//! The Hugging Face hub cache folder and its snapshots, shared by model and dataset loading.

use std::path::{Path, PathBuf};

use crate::{Error, Result};

/// The hub cache folder: `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else
/// `~/.cache/huggingface/hub`.
///
/// ```
/// let dir = atomrl_core::hub_cache_dir();
/// assert!(dir.ends_with("hub") || std::env::var_os("HF_HUB_CACHE").is_some());
/// ```
pub fn hub_cache_dir() -> PathBuf {
    if let Some(p) = std::env::var_os("HF_HUB_CACHE") {
        return PathBuf::from(p);
    }
    if let Some(p) = std::env::var_os("HF_HOME") {
        return PathBuf::from(p).join("hub");
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_default();
    home.join(".cache").join("huggingface").join("hub")
}

/// The snapshot of a cached hub repository (`repo`: its `models--…` or `datasets--…` folder)
/// at `revision`: the commit named by `refs/{revision}`, else the snapshot named `revision`
/// (a commit), else, for `main`, the only snapshot.
///
/// # Errors
/// [`Error::File`] naming the missing or ambiguous cache entry.
///
/// ```
/// let repo = std::env::temp_dir().join("atomrl_doctest_snapshot/models--org--tiny");
/// std::fs::create_dir_all(repo.join("snapshots/abc123")).unwrap();
/// std::fs::create_dir_all(repo.join("refs")).unwrap();
/// std::fs::write(repo.join("refs/main"), "abc123\n").unwrap();
/// let snap = atomrl_core::hub::snapshot_dir(&repo, "org/tiny", "main")?;
/// assert_eq!(snap, repo.join("snapshots/abc123"));
/// assert!(atomrl_core::hub::snapshot_dir(&repo, "org/tiny", "v2").is_err());
/// # Ok::<(), atomrl_core::Error>(())
/// ```
pub fn snapshot_dir(repo: &Path, repo_id: &str, revision: &str) -> Result<PathBuf> {
    let snaps_dir = repo.join("snapshots");
    let ref_file = repo.join("refs").join(revision);
    if ref_file.is_file() {
        let commit = std::fs::read_to_string(&ref_file)
            .map_err(|e| Error::file(ref_file.display(), e))?
            .trim()
            .to_string();
        let snap = snaps_dir.join(&commit);
        if !snap.is_dir() || commit.is_empty() {
            return Err(Error::file(
                snap.display(),
                format!(
                    "`refs/{revision}` of `{repo_id}` names revision `{commit}`, which is not in \
                     the cache"
                ),
            ));
        }
        return Ok(snap);
    }
    let snap = snaps_dir.join(revision);
    if !revision.is_empty() && snap.is_dir() {
        return Ok(snap);
    }
    if revision != "main" {
        return Err(Error::file(
            snap.display(),
            format!("no snapshot of `{repo_id}` at revision `{revision}`"),
        ));
    }
    let mut snaps: Vec<PathBuf> = match std::fs::read_dir(&snaps_dir) {
        Ok(entries) => entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_dir())
            .collect(),
        Err(_) => Vec::new(),
    };
    match snaps.len() {
        1 => Ok(snaps.remove(0)),
        0 => Err(Error::file(
            snaps_dir.display(),
            format!("no snapshot of `{repo_id}` in the cache"),
        )),
        n => Err(Error::file(
            ref_file.display(),
            format!("{n} snapshots of `{repo_id}` and no `refs/main` to choose one"),
        )),
    }
}
