//! Reading and writing safetensors weights (single files and sharded checkpoints).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use atomrl_core::{Error, Result};
use candle_core::{DType, Device, Tensor};
use serde_json::Value;

/// Name of a single-file checkpoint.
pub const WEIGHTS_FILE: &str = "model.safetensors";
/// Name of the index of a sharded checkpoint.
pub const WEIGHTS_INDEX_FILE: &str = "model.safetensors.index.json";

/// Loads every tensor of a model folder (`model.safetensors`, or the shards listed in
/// `model.safetensors.index.json`), converted to `dtype` on `device`.
///
/// Converting on load is what lets a bf16 checkpoint become f32 training weights.
///
/// # Errors
/// [`Error::File`] naming the missing or unreadable file.
///
/// ```
/// use candle_core::{DType, Device};
/// let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/reference/models/tiny-qwen3");
/// let w = atomrl_model::load_safetensors_dir(dir, DType::F64, &Device::Cpu)?;
/// assert_eq!(w["model.embed_tokens.weight"].dims(), &[512, 64]);
/// assert_eq!(w["model.norm.weight"].dtype(), DType::F64);
/// # Ok::<(), atomrl_core::Error>(())
/// ```
pub fn load_safetensors_dir(
    dir: impl AsRef<Path>,
    dtype: DType,
    device: &Device,
) -> Result<HashMap<String, Tensor>> {
    let dir = dir.as_ref();
    let single = dir.join(WEIGHTS_FILE);
    let index = dir.join(WEIGHTS_INDEX_FILE);
    let files: Vec<std::path::PathBuf> = if single.is_file() {
        vec![single]
    } else if index.is_file() {
        shard_files(&index)?
            .into_iter()
            .map(|f| dir.join(f))
            .collect()
    } else {
        return Err(Error::file(
            single.display(),
            format!(
                "no weights: neither {WEIGHTS_FILE} nor {WEIGHTS_INDEX_FILE} exists in this folder"
            ),
        ));
    };
    let mut out = HashMap::new();
    for file in files {
        out.extend(load_safetensors_file(&file, dtype, device)?);
    }
    Ok(out)
}

/// Loads one safetensors file, converting every float tensor to `dtype`.
///
/// # Errors
/// [`Error::File`] naming the file when it is missing or not a valid safetensors file.
///
/// ```
/// use candle_core::{DType, Device};
/// let err = atomrl_model::load_safetensors_file("no/such/file.safetensors", DType::F32, &Device::Cpu);
/// assert!(err.unwrap_err().to_string().contains("no/such/file.safetensors"));
/// ```
pub fn load_safetensors_file(
    path: impl AsRef<Path>,
    dtype: DType,
    device: &Device,
) -> Result<HashMap<String, Tensor>> {
    let path = path.as_ref();
    if !path.is_file() {
        return Err(Error::file(path.display(), "file not found"));
    }
    let raw = candle_core::safetensors::load(path, device)
        .map_err(|e| Error::file(path.display(), format!("cannot read safetensors: {e}")))?;
    raw.into_iter()
        .map(|(name, t)| {
            let t = if t.dtype().is_float() && t.dtype() != dtype {
                t.to_dtype(dtype)
                    .map_err(|e| Error::file(path.display(), format!("converting `{name}`: {e}")))?
            } else {
                t
            };
            Ok((name, t))
        })
        .collect()
}

fn shard_files(index: &Path) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(index).map_err(|e| Error::file(index.display(), e))?;
    let v: Value = serde_json::from_str(&text)
        .map_err(|e| Error::file(index.display(), format!("not valid JSON: {e}")))?;
    let map = v
        .get("weight_map")
        .and_then(Value::as_object)
        .ok_or_else(|| Error::file(index.display(), "missing `weight_map` object"))?;
    let mut files: Vec<String> = map
        .values()
        .filter_map(Value::as_str)
        .map(str::to_owned)
        .collect();
    files.sort();
    files.dedup();
    Ok(files)
}

/// Writes tensors to a safetensors file with `{"format": "pt"}` metadata (what transformers
/// and PEFT expect), converting them to `dtype` first.
///
/// # Errors
/// [`Error::File`] naming the file when it cannot be written.
///
/// ```
/// use std::collections::BTreeMap;
/// use candle_core::{DType, Device, Tensor};
/// let path = std::env::temp_dir().join("atomrl_model_doctest_save.safetensors");
/// let mut t = BTreeMap::new();
/// t.insert("w".to_string(), Tensor::new(&[1f32, 2.0], &Device::Cpu)?);
/// atomrl_model::save_safetensors(&t, &path, DType::BF16)?;
/// let back = atomrl_model::load_safetensors_file(&path, DType::F32, &Device::Cpu)?;
/// assert_eq!(back["w"].to_vec1::<f32>()?, vec![1.0, 2.0]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn save_safetensors(
    tensors: &BTreeMap<String, Tensor>,
    path: impl AsRef<Path>,
    dtype: DType,
) -> Result<()> {
    let path = path.as_ref();
    let converted = tensors
        .iter()
        .map(|(k, t)| {
            let t = if t.dtype().is_float() {
                t.to_dtype(dtype)
            } else {
                Ok(t.clone())
            };
            t.and_then(|t| t.contiguous())
                .map(|t| (k.clone(), t))
                .map_err(|e| Error::file(path.display(), format!("converting `{k}`: {e}")))
        })
        .collect::<Result<Vec<_>>>()?;
    let metadata: HashMap<String, String> = [("format".to_string(), "pt".to_string())].into();
    safetensors::tensor::serialize_to_file(converted, Some(metadata), path)
        .map_err(|e| Error::file(path.display(), format!("cannot write safetensors: {e}")))
}
