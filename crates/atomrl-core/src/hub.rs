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

/// Dataset file extensions a split may be stored in, in order of preference.
pub const DATASET_EXTENSIONS: [&str; 2] = ["parquet", "jsonl"];

/// The files of one split of a hub dataset, picked from the repository's file list `files`
/// (paths relative to the repository root, `/`-separated), sorted by name.
///
/// The folders are tried in this order and the first that holds the split wins: `{config}/`
/// (GSM8K: `main/train-00000-of-00001.parquet`), `data/`, the root, and (with no `config`)
/// `default/`. In a folder, a split's files are `{split}.{ext}` and every shard
/// `{split}-*.{ext}`, for `ext` in [`DATASET_EXTENSIONS`] (parquet first; one extension per
/// split, never a mix). Used both on a cached snapshot and on a hub listing, so that a
/// download fetches exactly the files a cached read would use.
///
/// ```
/// use atomrl_core::hub::select_split_files;
/// let files = ["README.md", "main/train-00000-of-00002.parquet",
///     "main/train-00001-of-00002.parquet", "main/test-00000-of-00001.parquet",
///     "socratic/train-00000-of-00001.parquet"];
/// assert_eq!(select_split_files(&files, Some("main"), "train"),
///     ["main/train-00000-of-00002.parquet", "main/train-00001-of-00002.parquet"]);
/// assert_eq!(select_split_files(&["data/test.jsonl"], None, "test"), ["data/test.jsonl"]);
/// assert!(select_split_files(&files, Some("main"), "validation").is_empty());
/// ```
pub fn select_split_files<S: AsRef<str>>(
    files: &[S],
    config: Option<&str>,
    split: &str,
) -> Vec<String> {
    let mut dirs: Vec<String> = Vec::new();
    if let Some(c) = config {
        dirs.push(format!("{c}/"));
    }
    dirs.push("data/".into());
    dirs.push(String::new());
    if config.is_none() {
        dirs.push("default/".into());
    }
    for dir in &dirs {
        for ext in DATASET_EXTENSIONS {
            let exact = format!("{dir}{split}.{ext}");
            let prefix = format!("{dir}{split}-");
            let suffix = format!(".{ext}");
            let mut found: Vec<String> = files
                .iter()
                .map(AsRef::as_ref)
                .filter(|f| {
                    *f == exact
                        || (f.starts_with(&prefix)
                            && f.ends_with(&suffix)
                            && !f[prefix.len()..].contains('/'))
                })
                .map(str::to_string)
                .collect();
            if !found.is_empty() {
                found.sort();
                return found;
            }
        }
    }
    Vec::new()
}

/// What [`select_split_files`] looks for, for error messages: `main/train-*.parquet, …`.
///
/// ```
/// let s = atomrl_core::hub::split_patterns(Some("main"), "train");
/// assert!(s.starts_with("main/train-*.{parquet,jsonl}"));
/// ```
pub fn split_patterns(config: Option<&str>, split: &str) -> String {
    let mut dirs: Vec<String> = config.map(|c| format!("{c}/")).into_iter().collect();
    dirs.extend(["data/".to_string(), String::new()]);
    if config.is_none() {
        dirs.push("default/".into());
    }
    dirs.iter()
        .map(|d| format!("{d}{split}-*.{{parquet,jsonl}}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Every file under `dir` as a `/`-separated path relative to it (symlinks followed, as in a
/// hub snapshot), sorted; empty when `dir` does not exist.
///
/// # Errors
/// [`Error::File`] when a folder cannot be read.
///
/// ```
/// let dir = std::env::temp_dir().join("atomrl_doctest_list_files");
/// std::fs::create_dir_all(dir.join("main")).unwrap();
/// std::fs::write(dir.join("main/test.parquet"), b"").unwrap();
/// let files = atomrl_core::hub::list_files(&dir)?;
/// assert!(files.contains(&"main/test.parquet".to_string()));
/// # Ok::<(), atomrl_core::Error>(())
/// ```
pub fn list_files(dir: &Path) -> Result<Vec<String>> {
    fn walk(root: &Path, dir: &Path, depth: usize, out: &mut Vec<String>) -> Result<()> {
        // Snapshots are shallow (`config/split-*.parquet`); the bound guards against loops.
        if depth > 8 {
            return Ok(());
        }
        let entries = match std::fs::read_dir(dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(Error::file(dir.display(), e)),
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(root, &path, depth + 1, out)?;
            } else if path.is_file() {
                if let Ok(rel) = path.strip_prefix(root) {
                    let parts: Vec<String> = rel
                        .components()
                        .map(|c| c.as_os_str().to_string_lossy().into_owned())
                        .collect();
                    out.push(parts.join("/"));
                }
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    walk(dir, dir, 0, &mut out)?;
    out.sort();
    Ok(out)
}
