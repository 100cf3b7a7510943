//! Helpers shared by the CLI's integration tests.

#![allow(dead_code, clippy::unwrap_used)]

use std::process::Command;

// The trainer's test helpers (fixture model, temporary folders, the dataset), shared rather
// than copied; this crate adds the binaries.
#[path = "../../../atomrl-trainer/tests/common/mod.rs"]
mod trainer;
pub use trainer::*;

/// `atomrl-train` (one compute thread, as CI).
pub fn train_bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_atomrl-train"));
    c.env("RAYON_NUM_THREADS", "1");
    c
}

/// `atomrl-infer` (one compute thread).
pub fn infer_bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_atomrl-infer"));
    c.env("RAYON_NUM_THREADS", "1");
    c
}
