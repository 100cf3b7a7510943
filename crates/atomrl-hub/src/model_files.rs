//! Which files of a hub repository make a loadable model (or PEFT adapter).

use std::path::Path;

/// Files fetched when the repository has them; none is required.
const OPTIONAL_FILES: [&str; 9] = [
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "chat_template.jinja",
    "adapter_config.json",
];

/// Single-file weights, and the index of sharded ones (Hugging Face names).
const WEIGHTS: &str = "model.safetensors";
const WEIGHTS_INDEX: &str = "model.safetensors.index.json";
const CONFIG: &str = "config.json";
const ADAPTER_CONFIG: &str = "adapter_config.json";
const ADAPTER_WEIGHTS: &str = "adapter_model.safetensors";

/// The files of a repository listing `available` that a model needs: `config.json`, the
/// optional files (generation config, tokenizer files, chat template), and the weights —
/// `model.safetensors`, or the index `model.safetensors.index.json` plus every shard its
/// `weight_map` names (`shards`, read from the index once it is local; pass `&[]` before). A
/// PEFT adapter repository gives `adapter_config.json` and `adapter_model.safetensors`.
///
/// ```
/// let listing = ["config.json", "tokenizer.json", "model.safetensors.index.json",
///     "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "README.md",
///     "pytorch_model.bin"];
/// let shards = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"];
/// let files = atomrl_hub::model_files(&listing, &shards);
/// assert_eq!(files, ["config.json", "tokenizer.json", "model.safetensors.index.json",
///     "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]);
/// ```
pub fn model_files<S: AsRef<str>>(available: &[S], shards: &[S]) -> Vec<String> {
    let has = |f: &str| available.iter().any(|a| a.as_ref() == f);
    let mut out: Vec<String> = Vec::new();
    if has(CONFIG) {
        out.push(CONFIG.into());
    }
    out.extend(
        OPTIONAL_FILES
            .iter()
            .filter(|f| has(f))
            .map(|f| f.to_string()),
    );
    if has(WEIGHTS) {
        out.push(WEIGHTS.into());
    } else if has(WEIGHTS_INDEX) {
        out.push(WEIGHTS_INDEX.into());
        for s in shards {
            if !out.iter().any(|o| o == s.as_ref()) {
                out.push(s.as_ref().to_string());
            }
        }
    }
    if has(ADAPTER_WEIGHTS) {
        out.push(ADAPTER_WEIGHTS.into());
    }
    out
}

/// The shard files named by a `model.safetensors.index.json` text, sorted and deduplicated.
///
/// # Errors
/// A message when the text is not JSON with a `weight_map` object of file names, or names a
/// path outside the folder.
pub(crate) fn index_shards(index_json: &str) -> Result<Vec<String>, String> {
    let value: serde_json::Value =
        serde_json::from_str(index_json).map_err(|e| format!("not JSON: {e}"))?;
    let map = value
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or("no `weight_map` object")?;
    let mut shards: Vec<String> = Vec::new();
    for file in map.values() {
        let name = file
            .as_str()
            .ok_or("a `weight_map` value is not a string")?;
        if name.contains("..") || name.starts_with('/') || name.is_empty() {
            return Err(format!("bad shard name `{name}`"));
        }
        if !shards.iter().any(|s| s == name) {
            shards.push(name.to_string());
        }
    }
    shards.sort();
    Ok(shards)
}

/// Whether the folder `dir` holds a complete model: `config.json`, `tokenizer.json` and the
/// weights (every shard of an index) — or a complete PEFT adapter. `Err` says what is missing.
///
/// ```
/// let dir = std::env::temp_dir().join("atomrl_doctest_complete");
/// std::fs::create_dir_all(&dir).unwrap();
/// std::fs::write(dir.join("config.json"), "{}").unwrap();
/// assert!(atomrl_hub::model_files_complete(&dir).unwrap_err().contains("tokenizer.json"));
/// ```
///
/// # Errors
/// The missing file's name.
pub fn model_files_complete(dir: &Path) -> Result<(), String> {
    let present = |f: &str| dir.join(f).is_file();
    if present(ADAPTER_CONFIG) && !present(CONFIG) {
        return if present(ADAPTER_WEIGHTS) {
            Ok(())
        } else {
            Err(ADAPTER_WEIGHTS.into())
        };
    }
    for f in [CONFIG, "tokenizer.json"] {
        if !present(f) {
            return Err(f.into());
        }
    }
    if present(WEIGHTS) {
        return Ok(());
    }
    if !present(WEIGHTS_INDEX) {
        return Err(format!("{WEIGHTS} (or {WEIGHTS_INDEX})"));
    }
    let text = std::fs::read_to_string(dir.join(WEIGHTS_INDEX))
        .map_err(|e| format!("{WEIGHTS_INDEX} ({e})"))?;
    let shards = index_shards(&text).map_err(|e| format!("{WEIGHTS_INDEX} ({e})"))?;
    match shards.iter().find(|s| !present(s)) {
        Some(missing) => Err(missing.clone()),
        None => Ok(()),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn adapter_repo() {
        let files = model_files(
            &[
                "adapter_config.json",
                "adapter_model.safetensors",
                "README.md",
            ],
            &[],
        );
        assert_eq!(files, ["adapter_config.json", "adapter_model.safetensors"]);
    }

    #[test]
    fn index_parsing() {
        let text = r#"{"metadata": {}, "weight_map": {"a": "m-2.safetensors", "b": "m-1.safetensors", "c": "m-2.safetensors"}}"#;
        assert_eq!(
            index_shards(text).unwrap(),
            ["m-1.safetensors", "m-2.safetensors"]
        );
        assert!(index_shards("{}").is_err());
        assert!(index_shards(r#"{"weight_map": {"a": "../x"}}"#).is_err());
    }
}
