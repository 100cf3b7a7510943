//! The one resolver: a local folder, else the hub cache, else a download.

use std::path::{Path, PathBuf};

use atomrl_core::{Error, Result};

use crate::model_files::model_files_complete;
use crate::{cache, HubSettings, RepoKind, RepoSpec};

/// The local folder of the model `model`: `model` itself when it is a folder; otherwise the hub
/// id `org/name[@revision]`, from the cache when it holds a complete model
/// ([`model_files_complete`]), else downloaded (feature `download`) into the cache. Works for
/// PEFT adapter repositories too.
///
/// # Errors
/// [`Error::Value`] when `model` is neither a folder nor a hub id; [`Error::File`] naming the
/// repository (and file) when it is unknown (404), gated or private without a token (401/403),
/// the network is unreachable, or `HF_HUB_OFFLINE` is set and the cache lacks a file.
///
/// ```
/// let mut settings = atomrl_hub::HubSettings::from_env();
/// settings.offline = true;
/// settings.cache_dir = std::env::temp_dir().join("atomrl_doctest_empty_cache");
/// let err = atomrl_hub::resolve_model("org/absent", &settings).unwrap_err().to_string();
/// assert!(err.contains("org/absent") && err.contains("HF_HUB_OFFLINE"), "{err}");
/// ```
pub fn resolve_model(model: &str, settings: &HubSettings) -> Result<PathBuf> {
    let path = Path::new(model);
    if path.is_dir() {
        return Ok(path.to_path_buf());
    }
    let spec = RepoSpec::parse(model).map_err(|_| {
        Error::value(
            "resolve_model",
            "model",
            "a local model folder or a hub id `org/name[@revision]`",
            format!("`{model}` (no such folder)"),
        )
    })?;
    let missing = match cache::snapshot(settings, RepoKind::Model, &spec) {
        Some(dir) => match model_files_complete(&dir) {
            Ok(()) => return Ok(dir),
            Err(file) => file,
        },
        None => "the repository".to_string(),
    };
    if settings.offline {
        return Err(offline_miss(settings, &spec, &missing));
    }
    fetch_model(&spec, settings)
}

/// [`resolve_model`] with the settings of the environment ([`HubSettings::from_env`]).
///
/// # Errors
/// As [`resolve_model`].
///
/// ```
/// let dir = std::env::temp_dir();
/// assert_eq!(atomrl_hub::model_dir(dir.to_str().unwrap())?, dir);
/// # Ok::<(), atomrl_core::Error>(())
/// ```
pub fn model_dir(model: &str) -> Result<PathBuf> {
    resolve_model(model, &HubSettings::from_env())
}

/// The local files of one split of the hub dataset `spec` (parquet or JSONL shards, in name
/// order; see [`atomrl_core::hub::select_split_files`] for the folders and names tried): from
/// the cached snapshot when it holds the split, else listed on the hub and downloaded.
///
/// # Errors
/// As [`resolve_model`]; also when the repository has no file of the split (listing what was
/// looked for).
///
/// ```
/// let mut settings = atomrl_hub::HubSettings::from_env();
/// settings.offline = true;
/// settings.cache_dir = std::env::temp_dir().join("atomrl_doctest_empty_cache");
/// let spec = atomrl_hub::RepoSpec::parse("openai/gsm8k")?;
/// let err = atomrl_hub::resolve_dataset_split(&spec, Some("main"), "train", &settings);
/// assert!(err.unwrap_err().to_string().contains("openai/gsm8k"));
/// # Ok::<(), atomrl_core::Error>(())
/// ```
pub fn resolve_dataset_split(
    spec: &RepoSpec,
    config: Option<&str>,
    split: &str,
    settings: &HubSettings,
) -> Result<Vec<PathBuf>> {
    let mut missing = "the repository".to_string();
    if let Some(snap) = cache::snapshot(settings, RepoKind::Dataset, spec) {
        let files = atomrl_core::hub::list_files(&snap)?;
        let picked = atomrl_core::hub::select_split_files(&files, config, split);
        if !picked.is_empty() {
            return Ok(picked.iter().map(|f| snap.join(f)).collect());
        }
        missing = format!(
            "split `{split}` ({})",
            atomrl_core::hub::split_patterns(config, split)
        );
    }
    if settings.offline {
        return Err(offline_miss(settings, spec, &missing));
    }
    fetch_dataset(spec, config, split, settings)
}

/// The error of an offline run whose cache lacks `missing`.
fn offline_miss(settings: &HubSettings, spec: &RepoSpec, missing: &str) -> Error {
    Error::file(
        spec,
        format!(
            "HF_HUB_OFFLINE is set and the hub cache {} lacks {missing}; unset HF_HUB_OFFLINE to \
             download it",
            settings.cache_dir.display()
        ),
    )
}

#[cfg(feature = "download")]
fn fetch_model(spec: &RepoSpec, settings: &HubSettings) -> Result<PathBuf> {
    crate::download::Client::new(settings)?.model(spec)
}

#[cfg(feature = "download")]
fn fetch_dataset(
    spec: &RepoSpec,
    config: Option<&str>,
    split: &str,
    settings: &HubSettings,
) -> Result<Vec<PathBuf>> {
    crate::download::Client::new(settings)?.dataset_split(spec, config, split)
}

#[cfg(not(feature = "download"))]
fn fetch_model(spec: &RepoSpec, settings: &HubSettings) -> Result<PathBuf> {
    Err(no_download(spec, settings))
}

#[cfg(not(feature = "download"))]
fn fetch_dataset(
    spec: &RepoSpec,
    _config: Option<&str>,
    _split: &str,
    settings: &HubSettings,
) -> Result<Vec<PathBuf>> {
    Err(no_download(spec, settings))
}

#[cfg(not(feature = "download"))]
fn no_download(spec: &RepoSpec, settings: &HubSettings) -> Error {
    Error::file(
        spec,
        format!(
            "not in the hub cache {}, and this build reads the cache only (atomrl-hub's \
             `download` feature, on in the AtomRL binaries, downloads it)",
            settings.cache_dir.display()
        ),
    )
}
