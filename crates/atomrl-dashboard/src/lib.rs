//! A local web dashboard over a folder of AtomRL runs (`atomrl-dashboard RUNS_DIR`): the runs
//! with their status, every metric as a live chart, the configuration, evaluations and
//! checkpoints of a run, a browser of its logged completions (rewards, advantages, lengths,
//! tool calls), and runs compared side by side.
//!
//! - [`RunsDir`]: the folder and the one check that turns a requested run name into a path
//!   inside it;
//! - [`RunMetrics`]: a run's `metrics.jsonl` as columns, read incrementally;
//!   [`min_max_downsample`] cuts a curve for the browser;
//! - [`Rollouts`]: its `samples.jsonl` by step; [`RunSummary`], [`RunDetail`]: the rest;
//! - [`router`]: the JSON API (see [`api`]) and the embedded page (with uPlot, vendored);
//! - [`Dashboard`]: binding (127.0.0.1 unless told otherwise) and serving.
//!
//! It is read-only: GET requests only, and nothing outside the runs folder is read.
//!
//! ```
//! use atomrl_dashboard::{Dashboard, DEFAULT_HOST};
//! let root = std::env::temp_dir().join(format!("atomrl-doc-dash-{}", std::process::id()));
//! std::fs::create_dir_all(&root)?;
//! let d = Dashboard::bind(&root, DEFAULT_HOST, 0)?; // any free port
//! assert!(d.url().starts_with("http://127.0.0.1:"));
//! assert!(d.exposure_warning().is_none());
//! assert!(Dashboard::bind(root.join("missing"), DEFAULT_HOST, 0).is_err());
//! # std::fs::remove_dir_all(&root)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![deny(missing_docs)]

pub mod api;
mod assets;
mod downsample;
mod error;
mod metrics_store;
mod rollouts;
mod run_info;
mod runs_dir;
mod server;

pub use api::{router, AppState};
pub use downsample::min_max_downsample;
pub use error::{DashboardError, Result};
pub use metrics_store::{Column, RunMetrics};
pub use rollouts::Rollouts;
pub use run_info::{detail, summarize, CheckpointInfo, ConfigInfo, EvalRow, RunDetail, RunSummary};
pub use runs_dir::RunsDir;
pub use server::{Dashboard, DEFAULT_HOST, DEFAULT_PORT};
