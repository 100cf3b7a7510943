//! The dashboard's errors.

use std::path::PathBuf;

/// What can go wrong serving a runs folder.
#[derive(Debug, thiserror::Error)]
pub enum DashboardError {
    /// The runs folder given at start does not exist or is not a folder.
    #[error("runs folder {path}: {reason}")]
    RunsDir {
        /// The folder as given.
        path: PathBuf,
        /// Why it cannot be served.
        reason: String,
    },
    /// A run name that is not a plain relative path inside the runs folder.
    #[error("run name {name:?}: {reason}")]
    BadName {
        /// The name as asked.
        name: String,
        /// Why it is refused.
        reason: &'static str,
    },
    /// No run of that name in the folder.
    #[error("no run {0:?} in the runs folder")]
    NoSuchRun(String),
    /// A request argument out of range.
    #[error("argument {name}: expected {expected}, got {got:?}")]
    BadArgument {
        /// The argument.
        name: &'static str,
        /// What it must be.
        expected: &'static str,
        /// What it was.
        got: String,
    },
    /// The server could not bind or serve.
    #[error("server at {addr}: {source}")]
    Serve {
        /// The address.
        addr: String,
        /// The cause.
        source: std::io::Error,
    },
}

/// The dashboard's result type.
pub type Result<T> = std::result::Result<T, DashboardError>;
