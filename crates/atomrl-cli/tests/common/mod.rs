//! Helpers shared by the trainer's integration tests.

#![allow(dead_code, clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The tiny random Qwen2 fixture (~107k parameters, ChatML template).
pub fn model_dir() -> String {
    concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/fixtures/reference/models/tiny-qwen2"
    )
    .to_string()
}

/// A fresh folder, removed when the guard drops (at the end of the test, pass or fail).
pub struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl std::ops::Deref for TempDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

/// A fresh, empty folder named after the test and the process.
pub fn temp_dir(name: &str) -> TempDir {
    let dir = std::env::temp_dir().join(format!("atomrl-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    TempDir(dir)
}

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
