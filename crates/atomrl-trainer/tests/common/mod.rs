//! Helpers shared by the trainer's integration tests.

#![allow(dead_code, clippy::unwrap_used)]

use std::path::{Path, PathBuf};

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

/// `train.jsonl` in `dir`: 24 sums of two small numbers (`{"prompt", "ground_truth"}` rows).
pub fn write_dataset(dir: &Path) -> PathBuf {
    let path = dir.join("train.jsonl");
    let lines: Vec<String> = (0..24)
        .map(|i| serde_json::json!({"prompt": format!("What is {} plus {}?", i % 7, i % 5), "ground_truth": format!("{}", i % 7 + i % 5)}).to_string())
        .collect();
    std::fs::write(&path, lines.join("\n")).unwrap();
    path
}

/// `pairs.jsonl` in `dir`: 24 preference pairs, the sum preferred to a refusal (a pattern a
/// random model can pick up across pairs), half of them conversational.
pub fn write_pairs(dir: &Path) -> PathBuf {
    let path = dir.join("pairs.jsonl");
    let lines: Vec<String> = (0..24)
        .map(|i| {
            let (a, b) = (i % 7, i % 5);
            let q = format!("What is {a} plus {b}?");
            let (good, bad) = (format!("{}", a + b), "I do not know.".to_string());
            if i % 2 == 0 {
                serde_json::json!({"prompt": q, "chosen": good, "rejected": bad})
            } else {
                serde_json::json!({
                    "prompt": [{"role": "user", "content": q}],
                    "chosen": [{"role": "assistant", "content": good}],
                    "rejected": [{"role": "assistant", "content": bad}],
                })
            }
            .to_string()
        })
        .collect();
    std::fs::write(&path, lines.join("\n")).unwrap();
    path
}
