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

/// The rows of a `metrics.jsonl` without the wall-clock metrics, which differ between runs:
/// `(name, value)` pairs with the values printed to 10 significant digits.
pub fn comparable(path: &std::path::Path) -> Vec<Vec<(String, String)>> {
    atomrl_trainer::logging::read_metrics(path)
        .unwrap()
        .into_iter()
        .map(|r| {
            let mut v: Vec<(String, String)> = vec![("step".into(), r.step.to_string())];
            v.extend(
                r.values
                    .into_iter()
                    .filter(|(k, _)| !k.starts_with("time/") && !k.starts_with("throughput/"))
                    .map(|(k, x)| (k, format!("{x:.9e}"))),
            );
            v
        })
        .collect()
}
