//! The errors of a sweep: each names the key, file or trial at fault.

use std::path::PathBuf;

/// What went wrong in a sweep.
#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    /// A key of the sweep file is missing or has a bad value.
    #[error("{key}: expected {expected}, got {got}")]
    Config {
        /// The key, e.g. `search.lr` or `sweep.trials`.
        key: String,
        /// What the key takes.
        expected: String,
        /// What the file gave.
        got: String,
    },
    /// A file could not be read, written or parsed.
    #[error("{path}: {detail}")]
    File {
        /// The file.
        path: PathBuf,
        /// What failed.
        detail: String,
    },
    /// A trial's process could not be started or watched.
    #[error("trial {trial}: {detail}")]
    Trial {
        /// The trial's number.
        trial: usize,
        /// What failed.
        detail: String,
    },
}

impl SweepError {
    /// A [`SweepError::Config`] for `key`.
    pub fn config(key: impl Into<String>, expected: impl Into<String>, got: impl ToString) -> Self {
        Self::Config {
            key: key.into(),
            expected: expected.into(),
            got: got.to_string(),
        }
    }

    /// A [`SweepError::File`] for `path`.
    pub fn file(path: impl Into<PathBuf>, detail: impl ToString) -> Self {
        Self::File {
            path: path.into(),
            detail: detail.to_string(),
        }
    }
}

/// The result of a sweep operation.
pub type Result<T> = std::result::Result<T, SweepError>;
