//! The Hugging Face hub cache folder, shared by model and dataset loading.

use std::path::PathBuf;

/// The hub cache folder: `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else
/// `~/.cache/huggingface/hub`.
///
/// ```
/// let dir = atomrl_core::hub_cache_dir();
/// assert!(dir.ends_with("hub") || std::env::var_os("HF_HUB_CACHE").is_some());
/// ```
pub fn hub_cache_dir() -> PathBuf {
    if let Some(p) = std::env::var_os("HF_HUB_CACHE") {
        return PathBuf::from(p);
    }
    if let Some(p) = std::env::var_os("HF_HOME") {
        return PathBuf::from(p).join("hub");
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_default();
    home.join(".cache").join("huggingface").join("hub")
}
