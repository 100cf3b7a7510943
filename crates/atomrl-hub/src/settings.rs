//! The standard Hugging Face environment, read once.

use std::path::PathBuf;

/// The public hub, used when `HF_ENDPOINT` is not set.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// Where and how to reach the hub, as `huggingface_hub` reads it from the environment.
///
/// ```
/// let mut s = atomrl_hub::HubSettings::from_env();
/// s.offline = true;
/// s.cache_dir = std::env::temp_dir().join("atomrl_doctest_settings");
/// assert!(s.endpoint.starts_with("http"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubSettings {
    /// `HF_ENDPOINT`, else `https://huggingface.co` (no trailing `/`).
    pub endpoint: String,
    /// The hub cache: `HF_HUB_CACHE`, else `HF_HOME/hub`, else `~/.cache/huggingface/hub`.
    pub cache_dir: PathBuf,
    /// `HF_TOKEN`, else the token file (`HF_TOKEN_PATH`, else `HF_HOME/token`, else
    /// `~/.cache/huggingface/token`), the file `huggingface-cli login` writes.
    pub token: Option<String>,
    /// `HF_HUB_OFFLINE` set to `1`, `ON`, `YES` or `TRUE`: read the cache only.
    pub offline: bool,
    /// A progress bar per downloaded file on a terminal (one line per file otherwise); off when
    /// `HF_HUB_DISABLE_PROGRESS_BARS` is true.
    pub progress: bool,
}

impl HubSettings {
    /// Reads the environment.
    pub fn from_env() -> Self {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        let endpoint = var("HF_ENDPOINT")
            .map(|e| e.trim().trim_end_matches('/').to_string())
            .unwrap_or_else(|| DEFAULT_ENDPOINT.to_string());
        let hf_home = var("HF_HOME").map(PathBuf::from).unwrap_or_else(|| {
            let home = std::env::var_os("HOME")
                .map(PathBuf::from)
                .unwrap_or_default();
            home.join(".cache").join("huggingface")
        });
        let token = var("HF_TOKEN").map(|t| t.trim().to_string()).or_else(|| {
            let file = var("HF_TOKEN_PATH")
                .map(PathBuf::from)
                .unwrap_or_else(|| hf_home.join("token"));
            std::fs::read_to_string(file)
                .ok()
                .map(|t| t.trim().to_string())
                .filter(|t| !t.is_empty())
        });
        Self {
            endpoint,
            cache_dir: atomrl_core::hub_cache_dir(),
            token,
            offline: var("HF_HUB_OFFLINE").is_some_and(|v| is_true(&v)),
            progress: !var("HF_HUB_DISABLE_PROGRESS_BARS").is_some_and(|v| is_true(&v)),
        }
    }
}

/// `huggingface_hub`'s reading of a boolean variable.
fn is_true(v: &str) -> bool {
    matches!(
        v.trim().to_ascii_uppercase().as_str(),
        "1" | "ON" | "YES" | "TRUE"
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn booleans() {
        for t in ["1", "on", "Yes", "TRUE "] {
            assert!(super::is_true(t), "{t}");
        }
        for f in ["0", "", "no", "off", "false", "2"] {
            assert!(!super::is_true(f), "{f}");
        }
    }
}
