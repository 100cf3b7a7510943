//! Downloads through `hf-hub`'s blocking client into the standard cache layout.

use std::path::{Path, PathBuf};

use atomrl_core::{Error, Result};
use hf_hub::api::sync::{Api, ApiBuilder, ApiError, ApiRepo};
use hf_hub::{Repo, RepoType};

use crate::model_files::{index_shards, model_files, model_files_complete};
use crate::progress::FileProgress;
use crate::{cache, HubSettings, RepoKind, RepoSpec};

/// Connection drops are resumed from the `.part` file this many times before giving up.
const RETRIES: usize = 3;

/// A hub client for one resolution.
pub(crate) struct Client {
    api: Api,
    settings: HubSettings,
}

impl Client {
    pub(crate) fn new(settings: &HubSettings) -> Result<Self> {
        let api = ApiBuilder::new()
            .with_endpoint(settings.endpoint.clone())
            .with_cache_dir(settings.cache_dir.clone())
            .with_token(settings.token.clone())
            // Our own progress (FileProgress) names the repository and prints a line when
            // stderr is not a terminal.
            .with_progress(false)
            .with_retries(RETRIES)
            .with_user_agent("atomrl", env!("CARGO_PKG_VERSION"))
            .build()
            .map_err(|e| Error::file(&settings.endpoint, format!("hub client: {e}")))?;
        Ok(Self {
            api,
            settings: settings.clone(),
        })
    }

    /// Downloads what the cache lacks of the model `spec`; returns its snapshot folder.
    pub(crate) fn model(&self, spec: &RepoSpec) -> Result<PathBuf> {
        let repo = self.repo(RepoKind::Model, spec);
        let (sha, listing) = self.listing(&repo, RepoKind::Model, spec)?;
        if !listing
            .iter()
            .any(|f| f == "config.json" || f == "adapter_config.json")
        {
            return Err(Error::file(
                spec,
                "has no config.json or adapter_config.json: not a model repository",
            ));
        }
        let mut wanted = model_files(&listing, &[]);
        if let Some(index) = wanted.iter().find(|f| f.ends_with(".index.json")).cloned() {
            let path = self.fetch(&repo, RepoKind::Model, spec, &sha, &index)?;
            let text =
                std::fs::read_to_string(&path).map_err(|e| Error::file(path.display(), e))?;
            let shards =
                index_shards(&text).map_err(|e| Error::file(format!("{spec}/{index}"), e))?;
            if let Some(absent) = shards.iter().find(|s| !listing.contains(s)) {
                return Err(Error::file(
                    format!("{spec}/{index}"),
                    format!("names the shard `{absent}`, which the repository does not have"),
                ));
            }
            wanted = model_files(&listing, &shards);
        }
        let mut snapshot = None;
        for file in &wanted {
            let path = self.fetch(&repo, RepoKind::Model, spec, &sha, file)?;
            snapshot = snapshot.or_else(|| snapshot_of(&path, file));
        }
        let snapshot = snapshot.ok_or_else(|| Error::file(spec, "no file downloaded"))?;
        model_files_complete(&snapshot).map_err(|missing| {
            Error::file(
                spec,
                format!("the repository has no {missing}: not a loadable model"),
            )
        })?;
        Ok(snapshot)
    }

    /// Downloads what the cache lacks of one split of the dataset `spec`; returns its files.
    pub(crate) fn dataset_split(
        &self,
        spec: &RepoSpec,
        config: Option<&str>,
        split: &str,
    ) -> Result<Vec<PathBuf>> {
        let repo = self.repo(RepoKind::Dataset, spec);
        let (sha, listing) = self.listing(&repo, RepoKind::Dataset, spec)?;
        let picked = atomrl_core::hub::select_split_files(&listing, config, split);
        if picked.is_empty() {
            let data: Vec<&String> = listing
                .iter()
                .filter(|f| f.ends_with(".parquet") || f.ends_with(".jsonl"))
                .take(8)
                .collect();
            return Err(Error::file(
                spec,
                format!(
                    "no `{split}` split{} (looked for {}; data files: {})",
                    config
                        .map(|c| format!(" of config `{c}`"))
                        .unwrap_or_default(),
                    atomrl_core::hub::split_patterns(config, split),
                    if data.is_empty() {
                        "none".to_string()
                    } else {
                        data.iter()
                            .map(|s| s.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    }
                ),
            ));
        }
        picked
            .iter()
            .map(|f| self.fetch(&repo, RepoKind::Dataset, spec, &sha, f))
            .collect()
    }

    fn repo(&self, kind: RepoKind, spec: &RepoSpec) -> ApiRepo {
        let repo_type = match kind {
            RepoKind::Model => RepoType::Model,
            RepoKind::Dataset => RepoType::Dataset,
        };
        self.api.repo(Repo::with_revision(
            spec.id.clone(),
            repo_type,
            spec.revision.clone(),
        ))
    }

    /// The commit of the revision and the repository's file names.
    fn listing(
        &self,
        repo: &ApiRepo,
        kind: RepoKind,
        spec: &RepoSpec,
    ) -> Result<(String, Vec<String>)> {
        let info = repo
            .info()
            .map_err(|e| self.describe(e, kind, spec, None))?;
        Ok((
            info.sha,
            info.siblings.into_iter().map(|s| s.rfilename).collect(),
        ))
    }

    /// The local path of `file` at commit `sha`, downloaded when the snapshot lacks it.
    fn fetch(
        &self,
        repo: &ApiRepo,
        kind: RepoKind,
        spec: &RepoSpec,
        sha: &str,
        file: &str,
    ) -> Result<PathBuf> {
        let local = cache::repo_folder(&self.settings, kind, spec)
            .join("snapshots")
            .join(sha)
            .join(file);
        if local.is_file() {
            return Ok(local);
        }
        let progress = FileProgress::new(format!("{spec}/{file}"), self.settings.progress);
        let path = repo
            .download_with_progress(file, progress)
            .map_err(|e| self.describe(e, kind, spec, Some(file)))?;
        if path != local {
            // The branch moved between the listing and this file: the snapshot would mix
            // commits.
            return Err(Error::file(
                format!("{spec}/{file}"),
                format!(
                    "revision `{}` moved to another commit during the download; run again",
                    spec.revision
                ),
            ));
        }
        Ok(path)
    }

    /// One line naming the repository (and file) for a failed request.
    fn describe(
        &self,
        err: ApiError,
        kind: RepoKind,
        spec: &RepoSpec,
        file: Option<&str>,
    ) -> Error {
        let what = match (kind, file) {
            (RepoKind::Model, None) => format!("model `{spec}`"),
            (RepoKind::Dataset, None) => format!("dataset `{spec}`"),
            (_, Some(f)) => format!("`{f}` of `{spec}`"),
        };
        let place = match file {
            Some(f) => format!("{spec}/{f}"),
            None => spec.to_string(),
        };
        let endpoint = &self.settings.endpoint;
        let message = match err {
            ApiError::RequestError(e) => match *e {
                ureq::Error::Status(code, response) => {
                    let error_code = response.header("X-Error-Code").unwrap_or("").to_string();
                    status_message(
                        code,
                        &error_code,
                        &what,
                        spec,
                        self.settings.token.is_some(),
                    )
                }
                ureq::Error::Transport(t) => format!(
                    "cannot reach {endpoint} ({t}); check the network or HF_ENDPOINT, or set \
                     HF_HUB_OFFLINE=1 to use the hub cache only"
                ),
            },
            ApiError::TooManyRetries(e) => {
                format!("download of {what} failed {RETRIES} times ({e}); run again to resume it")
            }
            ApiError::LockAcquisition(p) => format!(
                "another process is downloading {what} (lock {}); wait for it and run again",
                p.display()
            ),
            other => format!("download of {what} failed: {other}"),
        };
        Error::file(place, message)
    }
}

/// The message for an HTTP error status (with the Hub's `X-Error-Code`).
fn status_message(
    code: u16,
    error_code: &str,
    what: &str,
    spec: &RepoSpec,
    has_token: bool,
) -> String {
    let token_hint = if has_token {
        "the token given (HF_TOKEN or the token file) has no access to it"
    } else {
        "if it is private or gated, set HF_TOKEN to a token with access"
    };
    match (code, error_code) {
        (_, "RevisionNotFound") => format!("revision `{}` not found (HTTP {code})", spec.revision),
        (_, "EntryNotFound") => format!("{what} not found (HTTP {code})"),
        (_, "GatedRepo") => format!("{what} is gated (HTTP {code}); {token_hint}"),
        (_, "RepoNotFound") | (404, _) => {
            format!("{what} not found on the hub (HTTP {code}); check the name; {token_hint}")
        }
        (401 | 403, _) => format!("access to {what} refused (HTTP {code}); {token_hint}"),
        _ => format!("the hub answered HTTP {code} for {what}"),
    }
}

/// The snapshot folder holding `path`, the local copy of the repository file `file`.
fn snapshot_of(path: &Path, file: &str) -> Option<PathBuf> {
    let depth = Path::new(file).components().count();
    path.ancestors().nth(depth).map(Path::to_path_buf)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn messages() {
        let spec = RepoSpec::parse("org/x@v2").unwrap();
        let m = status_message(404, "RevisionNotFound", "model `org/x@v2`", &spec, false);
        assert!(m.contains("revision `v2`"), "{m}");
        let m = status_message(401, "RepoNotFound", "model `org/x@v2`", &spec, false);
        assert!(m.contains("not found") && m.contains("HF_TOKEN"), "{m}");
        let m = status_message(403, "", "model `org/x@v2`", &spec, true);
        assert!(m.contains("no access"), "{m}");
        assert_eq!(
            snapshot_of(
                Path::new("/c/snapshots/abc/main/t.parquet"),
                "main/t.parquet"
            )
            .unwrap(),
            Path::new("/c/snapshots/abc")
        );
    }
}
