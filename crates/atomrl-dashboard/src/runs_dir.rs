//! [`RunsDir`]: the folder the dashboard serves, the runs in it, and the one place a run name
//! from a request becomes a path (validated: nothing outside the folder is ever read).

use std::fs;
use std::path::{Component, Path, PathBuf};

use atomrl_metrics::{METRICS_FILE, STATUS_FILE};

use crate::error::{DashboardError, Result};

/// How deep under the root runs are looked for: `run`, `sweep/trial-003/run`, `group/sweep/trial/run`.
const MAX_DEPTH: usize = 4;

/// The runs folder: every run is a folder under it holding `metrics.jsonl` or `status.json`,
/// named by its path relative to the root (`grpo-a`, `sweep/trial-003/run`).
///
/// ```
/// use atomrl_dashboard::RunsDir;
/// let root = std::env::temp_dir().join(format!("atomrl-doc-runsdir-{}", std::process::id()));
/// std::fs::create_dir_all(root.join("a"))?;
/// std::fs::write(root.join("a/metrics.jsonl"), "")?;
/// let runs = RunsDir::open(&root)?;
/// assert_eq!(runs.list(), ["a"]);
/// assert!(runs.resolve("a").is_ok());
/// assert!(runs.resolve("../etc").is_err());
/// assert!(RunsDir::open(root.join("missing")).is_err());
/// # std::fs::remove_dir_all(&root)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct RunsDir {
    root: PathBuf,
}

impl RunsDir {
    /// The runs folder at `path` (which must exist; an empty folder is fine).
    ///
    /// # Errors
    /// [`DashboardError::RunsDir`] naming the path when it does not exist or is not a folder.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let err = |reason: String| DashboardError::RunsDir {
            path: path.to_path_buf(),
            reason,
        };
        let root = fs::canonicalize(path).map_err(|e| err(e.to_string()))?;
        if !root.is_dir() {
            return Err(err("not a folder".into()));
        }
        Ok(Self { root })
    }

    /// The folder, canonical.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The runs' names, sorted; folders reached through a symbolic link are not followed.
    pub fn list(&self) -> Vec<String> {
        let mut names = Vec::new();
        walk(&self.root, &self.root, 0, &mut names);
        names.sort();
        names
    }

    /// The folder of run `name`, checked: a relative path of plain components (no `..`, `.`,
    /// root or drive, no backslash or NUL), whose canonical form is inside the root (a
    /// symbolic link out of the folder is refused) and holds a run.
    ///
    /// # Errors
    /// [`DashboardError::BadName`] for a name that is not a plain relative path or leads out of
    /// the folder; [`DashboardError::NoSuchRun`] when it holds no run.
    pub fn resolve(&self, name: &str) -> Result<PathBuf> {
        let bad = |reason| DashboardError::BadName {
            name: name.to_string(),
            reason,
        };
        if name.is_empty() || name.len() > 1024 {
            return Err(bad("empty or too long"));
        }
        if name.contains(['\\', '\0']) {
            return Err(bad("contains a backslash or NUL"));
        }
        let rel = Path::new(name);
        if !rel.components().all(|c| matches!(c, Component::Normal(_))) {
            return Err(bad(
                "not a plain relative path (no `..`, `.` or leading `/`)",
            ));
        }
        let joined = self.root.join(rel);
        let real =
            fs::canonicalize(&joined).map_err(|_| DashboardError::NoSuchRun(name.to_string()))?;
        if !real.starts_with(&self.root) {
            return Err(bad("leads out of the runs folder"));
        }
        if !is_run(&real) {
            return Err(DashboardError::NoSuchRun(name.to_string()));
        }
        Ok(real)
    }
}

/// Whether `dir` holds a run.
pub(crate) fn is_run(dir: &Path) -> bool {
    dir.join(METRICS_FILE).is_file() || dir.join(STATUS_FILE).is_file()
}

/// Collects the runs under `dir` (at `depth` below `root`) into `out`, by relative name.
fn walk(root: &Path, dir: &Path, depth: usize, out: &mut Vec<String>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        // `file_type` does not follow links: a link is neither listed nor walked.
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        if !kind.is_dir() {
            continue;
        }
        let path = entry.path();
        if is_run(&path) {
            if let Ok(rel) = path.strip_prefix(root) {
                if let Some(name) = rel.to_str() {
                    out.push(name.to_string());
                }
            }
        } else if depth + 1 < MAX_DEPTH {
            walk(root, &path, depth + 1, out);
        }
    }
}
