//! Reads of the local hub cache (no network).

use std::path::PathBuf;

use crate::{HubSettings, RepoKind, RepoSpec};

/// The repository's folder in the cache (`models--org--name`), whether or not it exists.
pub(crate) fn repo_folder(settings: &HubSettings, kind: RepoKind, spec: &RepoSpec) -> PathBuf {
    settings.cache_dir.join(spec.cache_folder(kind))
}

/// The cached snapshot of `spec` (`refs/{revision}`, a commit-named snapshot, or for `main`
/// the only one), if any.
pub(crate) fn snapshot(settings: &HubSettings, kind: RepoKind, spec: &RepoSpec) -> Option<PathBuf> {
    let repo = repo_folder(settings, kind, spec);
    if !repo.is_dir() {
        return None;
    }
    atomrl_core::hub::snapshot_dir(&repo, &spec.id, &spec.revision).ok()
}
