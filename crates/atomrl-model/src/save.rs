//! Saving a model as a Hugging Face folder that transformers loads unchanged.

use std::collections::BTreeMap;
use std::path::Path;

use atomrl_core::{CandleContext, Error, Result};
use candle_core::{DType, Tensor};
use serde_json::{json, Value};

use crate::model::CausalLm;
use crate::weights::{load_safetensors_dir, save_safetensors, WEIGHTS_FILE};

/// Files copied from the source folder when present (tokenizer and generation settings).
pub const COPIED_FILES: [&str; 8] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "chat_template.jinja",
];

impl CausalLm {
    /// Saves the model as a Hugging Face folder in the weights' dtype: `model.safetensors`
    /// (HF names, `{"format": "pt"}` metadata, no `lm_head.weight` when tied), `config.json`,
    /// and the tokenizer / generation files of [`CausalLm::source_dir`] (a minimal
    /// `generation_config.json` is written when there is none). Attached LoRA adapters are
    /// merged into the saved weights (the model itself is unchanged).
    ///
    /// # Errors
    /// [`Error::File`] naming the file that cannot be written or copied.
    ///
    /// ```
    /// use atomrl_model::CausalLm;
    /// use candle_core::{DType, Device};
    /// let src = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/reference/models/tiny-qwen3");
    /// let out = std::env::temp_dir().join("atomrl_model_doctest_save_hf");
    /// let m = CausalLm::from_hf_dir(src, DType::F32, &Device::Cpu)?;
    /// m.save_hf(&out)?;
    /// assert!(out.join("tokenizer.json").is_file());
    /// let back = CausalLm::from_hf_dir(&out, DType::F32, &Device::Cpu)?;
    /// assert_eq!(back.config(), m.config());
    /// # Ok::<(), atomrl_core::Error>(())
    /// ```
    pub fn save_hf(&self, dir: impl AsRef<Path>) -> Result<()> {
        self.save_hf_as(dir, self.dtype)
    }

    /// [`CausalLm::save_hf`] writing the weights (and `torch_dtype`) in `dtype`, e.g. bf16.
    ///
    /// # Errors
    /// As [`CausalLm::save_hf`].
    ///
    /// ```
    /// use atomrl_model::{Architecture, CausalLm, ModelConfig};
    /// use candle_core::{DType, Device};
    /// let c = ModelConfig::new(Architecture::Qwen2, 16, 8, 8, 1, 2, 1)?;
    /// let m = CausalLm::from_config_random(c, 0, DType::F32, &Device::Cpu)?;
    /// let out = std::env::temp_dir().join("atomrl_model_doctest_save_bf16");
    /// m.save_hf_as(&out, DType::BF16)?;
    /// let cfg = std::fs::read_to_string(out.join("config.json")).unwrap();
    /// assert!(cfg.contains("bfloat16"));
    /// # Ok::<(), atomrl_core::Error>(())
    /// ```
    pub fn save_hf_as(&self, dir: impl AsRef<Path>, dtype: DType) -> Result<()> {
        let mut weights: BTreeMap<String, Tensor> = self.merged_weights()?;
        if self.config.tie_word_embeddings {
            weights.remove("lm_head.weight");
        }
        self.save_hf_folder(dir.as_ref(), &weights, dtype)
    }

    /// Writes `weights` (in `dtype`), this model's `config.json`, its source folder's tokenizer
    /// files and a generation config to `dir`: the folder of [`CausalLm::save_hf_as`], or of a
    /// model built on this one with other weights (the critic's).
    pub(crate) fn save_hf_folder(
        &self,
        dir: &Path,
        weights: &BTreeMap<String, Tensor>,
        dtype: DType,
    ) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|e| Error::file(dir.display(), e))?;
        save_safetensors(weights, dir.join(WEIGHTS_FILE), dtype)?;
        write_json(&dir.join("config.json"), &self.config.to_json(dtype))?;
        let src = self.source_dir.as_deref().filter(|s| !same_dir(s, dir));
        for name in COPIED_FILES {
            if let Some(from) = src.map(|s| s.join(name)).filter(|p| p.is_file()) {
                let to = dir.join(name);
                std::fs::copy(&from, &to).map_err(|e| {
                    Error::file(
                        from.display(),
                        format!("cannot copy to {}: {e}", to.display()),
                    )
                })?;
            }
        }
        let gen = dir.join("generation_config.json");
        if !gen.is_file() {
            let raw = self.config.to_json(dtype);
            let v = json!({
                "bos_token_id": raw.get("bos_token_id").cloned().unwrap_or(Value::Null),
                "eos_token_id": raw.get("eos_token_id").cloned().unwrap_or(Value::Null),
            });
            write_json(&gen, &v)?;
        }
        Ok(())
    }

    /// Sets this model's weights, in place, to those of the Hugging Face folder `dir` (as
    /// [`CausalLm::save_hf`] writes them): resuming a full fine-tuning run, whose optimizer
    /// holds these very variables, so a new model would not do.
    ///
    /// # Errors
    /// [`Error::File`] for unreadable weights or a weight of the model the folder lacks;
    /// [`Error::Candle`] for a weight of another shape.
    ///
    /// ```
    /// use atomrl_model::{Architecture, CausalLm, ModelConfig};
    /// use candle_core::{DType, Device};
    /// let c = ModelConfig::new(Architecture::Qwen2, 16, 8, 8, 1, 2, 1)?;
    /// let saved = CausalLm::from_config_random(c.clone(), 0, DType::F32, &Device::Cpu)?;
    /// let out = std::env::temp_dir().join("atomrl_model_doctest_load_weights");
    /// saved.save_hf(&out)?;
    /// let m = CausalLm::from_config_random(c, 1, DType::F32, &Device::Cpu)?;
    /// m.load_weights(&out)?;
    /// let name = "model.embed_tokens.weight";
    /// let diff = (m.tensor(name).unwrap() - saved.tensor(name).unwrap())?.abs()?.sum_all()?;
    /// assert_eq!(diff.to_scalar::<f32>()?, 0.0);
    /// assert!(m.load_weights(std::env::temp_dir().join("atomrl_no_such_dir")).is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn load_weights(&self, dir: impl AsRef<Path>) -> Result<()> {
        let dir = dir.as_ref();
        let weights = load_safetensors_dir(dir, self.dtype, &self.device)?;
        for (name, var) in self.named_vars() {
            let t = weights.get(&name).ok_or_else(|| {
                Error::file(dir.display(), format!("checkpoint lacks weight `{name}`"))
            })?;
            var.set(t).ctx("CausalLm::load_weights")?;
        }
        Ok(())
    }
}

fn same_dir(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

fn write_json(path: &Path, v: &Value) -> Result<()> {
    let text = serde_json::to_string_pretty(v).map_err(|e| Error::file(path.display(), e))?;
    std::fs::write(path, text).map_err(|e| Error::file(path.display(), e))
}
