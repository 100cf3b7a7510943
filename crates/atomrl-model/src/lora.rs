//! LoRA adapters: configuration, attaching, merging, and PEFT's on-disk layout.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use atomrl_core::{CandleContext, Error, Result};
use candle_core::{Tensor, Var};
use candle_nn::VarMap;
use serde_json::{json, Value};

use crate::model::{sorted_vars, CausalLm};
use crate::params::Rng;
use crate::weights::{load_safetensors_file, save_safetensors};

/// PEFT's adapter weights file.
pub const ADAPTER_WEIGHTS_FILE: &str = "adapter_model.safetensors";
/// PEFT's adapter configuration file.
pub const ADAPTER_CONFIG_FILE: &str = "adapter_config.json";

/// The linear layers LoRA can adapt.
pub const LORA_TARGETS: [&str; 7] = [
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
];

/// A LoRA configuration with PEFT's meaning: `W' = W + scale · B A`, `A [r, in]`,
/// `B [out, r]`, `scale = alpha / r` (or `alpha / √r` with rsLoRA).
///
/// ```
/// use atomrl_model::LoraConfig;
/// let c = LoraConfig::new(8, 16.0).with_targets(&["q_proj", "v_proj"])?.with_dropout(0.05)?;
/// assert_eq!(c.scale(), 2.0);
/// assert!(c.targets("model.layers.3.self_attn.v_proj"));
/// assert!(!c.targets("model.layers.3.mlp.up_proj"));
/// assert!(LoraConfig::new(8, 16.0).with_targets(&["lm_head"]).is_err());
/// # Ok::<(), atomrl_core::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct LoraConfig {
    /// Rank `r`.
    pub r: usize,
    /// `lora_alpha`.
    pub alpha: f64,
    /// `lora_dropout`, applied to the adapter's input in training mode.
    pub dropout: f64,
    /// Module names adapted (a subset of [`LORA_TARGETS`]).
    pub target_modules: Vec<String>,
    /// rsLoRA scaling (`alpha / √r`).
    pub use_rslora: bool,
}

impl LoraConfig {
    /// Rank `r`, `alpha`, no dropout, adapting the attention projections q/k/v/o.
    ///
    /// ```
    /// assert_eq!(atomrl_model::LoraConfig::new(4, 8.0).target_modules.len(), 4);
    /// ```
    pub fn new(r: usize, alpha: f64) -> Self {
        Self {
            r,
            alpha,
            dropout: 0.0,
            target_modules: LORA_TARGETS[..4].iter().map(|s| s.to_string()).collect(),
            use_rslora: false,
        }
    }

    /// Sets the adapted modules (`"all-linear"` means all of [`LORA_TARGETS`]).
    ///
    /// # Errors
    /// [`Error::Value`] naming `target_modules` for an unknown module.
    ///
    /// ```
    /// let c = atomrl_model::LoraConfig::new(4, 8.0).with_targets(&["all-linear"])?;
    /// assert_eq!(c.target_modules.len(), 7);
    /// # Ok::<(), atomrl_core::Error>(())
    /// ```
    pub fn with_targets(mut self, targets: &[&str]) -> Result<Self> {
        if targets == ["all-linear"] {
            self.target_modules = LORA_TARGETS.iter().map(|s| s.to_string()).collect();
            return Ok(self);
        }
        for t in targets {
            if !LORA_TARGETS.contains(t) {
                return Err(Error::value(
                    "LoraConfig",
                    "target_modules",
                    format!("names among {}", LORA_TARGETS.join(", ")),
                    t,
                ));
            }
        }
        self.target_modules = targets.iter().map(|s| s.to_string()).collect();
        Ok(self)
    }

    /// Sets the dropout probability.
    ///
    /// # Errors
    /// [`Error::Value`] unless `0 ≤ p < 1`.
    ///
    /// ```
    /// assert!(atomrl_model::LoraConfig::new(4, 8.0).with_dropout(1.0).is_err());
    /// ```
    pub fn with_dropout(mut self, p: f64) -> Result<Self> {
        if !(0.0..1.0).contains(&p) {
            return Err(Error::value("LoraConfig", "lora_dropout", "in [0, 1)", p));
        }
        self.dropout = p;
        Ok(self)
    }

    /// The adapter's scale: `alpha / r`, or `alpha / √r` with rsLoRA.
    ///
    /// ```
    /// let mut c = atomrl_model::LoraConfig::new(4, 8.0);
    /// c.use_rslora = true;
    /// assert_eq!(c.scale(), 4.0);
    /// ```
    pub fn scale(&self) -> f64 {
        if self.use_rslora {
            self.alpha / (self.r as f64).sqrt()
        } else {
            self.alpha / self.r as f64
        }
    }

    /// Whether the module at `path` (`model.layers.0.self_attn.q_proj`) is adapted.
    ///
    /// ```
    /// assert!(atomrl_model::LoraConfig::new(4, 8.0).targets("model.layers.0.self_attn.q_proj"));
    /// ```
    pub fn targets(&self, path: &str) -> bool {
        let last = path.rsplit('.').next().unwrap_or(path);
        self.target_modules.iter().any(|t| t == last || t == path)
    }

    /// PEFT's `adapter_config.json` for this configuration.
    ///
    /// ```
    /// let j = atomrl_model::LoraConfig::new(4, 8.0).to_peft_json(None);
    /// assert_eq!((j["peft_type"].as_str(), j["r"].as_u64()), (Some("LORA"), Some(4)));
    /// ```
    pub fn to_peft_json(&self, base_model: Option<&str>) -> Value {
        json!({
            "alpha_pattern": {},
            "auto_mapping": null,
            "base_model_name_or_path": base_model,
            "bias": "none",
            "fan_in_fan_out": false,
            "inference_mode": true,
            "init_lora_weights": true,
            "layers_pattern": null,
            "layers_to_transform": null,
            "lora_alpha": self.alpha,
            "lora_dropout": self.dropout,
            "modules_to_save": null,
            "peft_type": "LORA",
            "r": self.r,
            "rank_pattern": {},
            "revision": null,
            "target_modules": self.target_modules,
            "task_type": "CAUSAL_LM",
            "use_dora": false,
            "use_rslora": self.use_rslora,
        })
    }

    /// Parses PEFT's `adapter_config.json`.
    ///
    /// # Errors
    /// [`Error::File`] (path `adapter_config.json`) for a missing field or an unsupported
    /// option (DoRA, bias training, per-module ranks, a regex `target_modules`).
    ///
    /// ```
    /// use atomrl_model::LoraConfig;
    /// let c = LoraConfig::new(4, 8.0).with_targets(&["up_proj"])?;
    /// assert_eq!(LoraConfig::from_peft_json(&c.to_peft_json(None))?, c);
    /// # Ok::<(), atomrl_core::Error>(())
    /// ```
    pub fn from_peft_json(v: &Value) -> Result<Self> {
        let file = ADAPTER_CONFIG_FILE;
        let bad = |msg: &str| Error::file(file, msg);
        if v.get("peft_type")
            .and_then(Value::as_str)
            .is_some_and(|t| t != "LORA")
        {
            return Err(bad("only `peft_type: LORA` is supported"));
        }
        if v.get("use_dora").and_then(Value::as_bool) == Some(true) {
            return Err(bad("DoRA (`use_dora: true`) is not supported"));
        }
        if v.get("bias")
            .and_then(Value::as_str)
            .is_some_and(|b| b != "none")
        {
            return Err(bad("only `bias: none` is supported"));
        }
        for key in ["rank_pattern", "alpha_pattern"] {
            if v.get(key)
                .and_then(Value::as_object)
                .is_some_and(|m| !m.is_empty())
            {
                return Err(bad(&format!("`{key}` is not supported")));
            }
        }
        let r = v
            .get("r")
            .and_then(Value::as_u64)
            .ok_or_else(|| bad("missing `r`"))? as usize;
        let alpha = v
            .get("lora_alpha")
            .and_then(Value::as_f64)
            .ok_or_else(|| bad("missing `lora_alpha`"))?;
        let targets: Vec<String> = match v.get("target_modules") {
            Some(Value::Array(a)) => a
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect(),
            Some(Value::String(s)) if s == "all-linear" => vec![s.clone()],
            _ => return Err(bad("`target_modules` must be an array of module names")),
        };
        let refs: Vec<&str> = targets.iter().map(String::as_str).collect();
        let mut c = Self::new(r, alpha)
            .with_targets(&refs)
            .map_err(|e| Error::file(file, e))?
            .with_dropout(v.get("lora_dropout").and_then(Value::as_f64).unwrap_or(0.0))
            .map_err(|e| Error::file(file, e))?;
        c.use_rslora = v
            .get("use_rslora")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        Ok(c)
    }
}

/// The adapters attached to a model.
#[derive(Clone)]
pub(crate) struct LoraState {
    pub config: LoraConfig,
    /// Keyed by PEFT's names (`base_model.model.<module>.lora_A.weight`).
    pub vars: VarMap,
}

impl std::fmt::Debug for LoraState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoraState")
            .field("config", &self.config)
            .field("vars", &self.vars.all_vars().len())
            .finish()
    }
}

/// PEFT's names of the A and B matrices of `module`.
pub(crate) fn adapter_names(module: &str) -> (String, String) {
    (
        format!("base_model.model.{module}.lora_A.weight"),
        format!("base_model.model.{module}.lora_B.weight"),
    )
}

impl CausalLm {
    /// The adapted modules with their `(out, in)` sizes.
    fn lora_modules(&self, config: &LoraConfig) -> Vec<(String, usize, usize)> {
        let c = &self.config;
        let (h, q, kv, m) = (
            c.hidden_size,
            c.num_attention_heads * c.head_dim,
            c.num_key_value_heads * c.head_dim,
            c.intermediate_size,
        );
        let mut out = Vec::new();
        for i in 0..c.num_hidden_layers {
            for (name, o, inp) in [
                ("self_attn.q_proj", q, h),
                ("self_attn.k_proj", kv, h),
                ("self_attn.v_proj", kv, h),
                ("self_attn.o_proj", h, q),
                ("mlp.gate_proj", m, h),
                ("mlp.up_proj", m, h),
                ("mlp.down_proj", h, m),
            ] {
                let path = format!("model.layers.{i}.{name}");
                if config.targets(&path) {
                    out.push((path, o, inp));
                }
            }
        }
        out
    }

    /// Attaches new LoRA adapters (PEFT's initialisation: `A` Kaiming-uniform, `B = 0`, so
    /// the model's output is unchanged) and freezes the base weights: from now on
    /// [`CausalLm::trainable_vars`] are the adapters only, and backward spends no work on the
    /// base weights' gradients.
    ///
    /// # Errors
    /// [`Error::Value`] when adapters are already attached or `r = 0`.
    ///
    /// ```
    /// use atomrl_model::{Architecture, CausalLm, LoraConfig, ModelConfig};
    /// use candle_core::{DType, Device};
    /// let c = ModelConfig::new(Architecture::Qwen2, 16, 8, 8, 2, 2, 1)?;
    /// let mut m = CausalLm::from_config_random(c, 0, DType::F32, &Device::Cpu)?;
    /// m.add_lora(LoraConfig::new(2, 4.0), 0)?;
    /// assert_eq!(m.trainable_vars().len(), 2 * 4 * 2); // layers x targets x (A, B)
    /// # Ok::<(), atomrl_core::Error>(())
    /// ```
    pub fn add_lora(&mut self, config: LoraConfig, seed: u64) -> Result<()> {
        let func = "CausalLm::add_lora";
        if self.lora.is_some() {
            return Err(Error::value(
                func,
                "lora",
                "no adapters attached yet",
                "adapters already attached",
            ));
        }
        if config.r == 0 {
            return Err(Error::value(func, "r", "a positive rank", 0));
        }
        let modules = self.lora_modules(&config);
        // A rank past every adapted weight's larger side adds no capacity anywhere, only
        // memory: an `r` that large is a typo, which would otherwise end in an allocation
        // failure (an abort) instead of an error. Ranks past a small weight's smaller side
        // stay allowed, as in PEFT (r = 256 with Qwen2.5-0.5B's 128-row k_proj).
        if let Some((module, out_f, in_f)) = modules.iter().max_by_key(|(_, o, i)| (*o).max(*i)) {
            let most = (*out_f).max(*in_f);
            if config.r > most {
                return Err(Error::value(
                    func,
                    "r",
                    format!(
                        "at most {most}, the larger side of the largest adapted weight \
                         ({module}: [{out_f}, {in_f}])"
                    ),
                    config.r,
                ));
            }
        }
        let mut rng = Rng::new(seed);
        let vars = VarMap::new();
        {
            let mut data = vars
                .data()
                .lock()
                .map_err(|_| Error::value(func, "lora", "an unpoisoned lock", "poisoned"))?;
            for (module, out_f, in_f) in modules {
                let bound = 1.0 / (in_f as f64).sqrt();
                let a: Vec<f64> = (0..config.r * in_f)
                    .map(|_| (2.0 * rng.uniform() - 1.0) * bound)
                    .collect();
                let a = Tensor::from_vec(a, (config.r, in_f), &self.device)
                    .and_then(|t| t.to_dtype(self.dtype))
                    .ctx(func)?;
                let b = Tensor::zeros((out_f, config.r), self.dtype, &self.device).ctx(func)?;
                let (na, nb) = adapter_names(&module);
                data.insert(na, Var::from_tensor(&a).ctx(func)?);
                data.insert(nb, Var::from_tensor(&b).ctx(func)?);
            }
        }
        self.lora = Some(LoraState { config, vars });
        self.rebuild()
    }

    /// The attached LoRA configuration, if any.
    ///
    /// ```
    /// # use atomrl_model::{Architecture, CausalLm, ModelConfig};
    /// # let c = ModelConfig::new(Architecture::Qwen2, 8, 4, 4, 1, 1, 1)?;
    /// let m = CausalLm::from_config_random(c, 0, candle_core::DType::F32, &candle_core::Device::Cpu)?;
    /// assert!(m.lora_config().is_none());
    /// # Ok::<(), atomrl_core::Error>(())
    /// ```
    pub fn lora_config(&self) -> Option<&LoraConfig> {
        self.lora.as_ref().map(|l| &l.config)
    }

    /// The adapters, sorted by PEFT name (empty without LoRA).
    ///
    /// ```
    /// # use atomrl_model::{Architecture, CausalLm, ModelConfig, LoraConfig};
    /// # let c = ModelConfig::new(Architecture::Qwen2, 8, 4, 4, 1, 1, 1)?;
    /// let mut m = CausalLm::from_config_random(c, 0, candle_core::DType::F32, &candle_core::Device::Cpu)?;
    /// m.add_lora(LoraConfig::new(2, 2.0).with_targets(&["q_proj"])?, 0)?;
    /// assert_eq!(m.lora_vars()[0].0, "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight");
    /// # Ok::<(), atomrl_core::Error>(())
    /// ```
    pub fn lora_vars(&self) -> Vec<(String, Var)> {
        self.lora
            .as_ref()
            .map(|l| sorted_vars(&l.vars))
            .unwrap_or_default()
    }

    /// Base weights with the adapters merged in (`W + scale · B A`), by HF name; the base
    /// weights themselves when no adapter is attached. Tensors are detached.
    ///
    /// # Errors
    /// [`Error::Candle`] if a merge product fails.
    ///
    /// ```
    /// # use atomrl_model::{Architecture, CausalLm, ModelConfig};
    /// # let c = ModelConfig::new(Architecture::Qwen2, 8, 4, 4, 1, 1, 1)?;
    /// let m = CausalLm::from_config_random(c, 0, candle_core::DType::F32, &candle_core::Device::Cpu)?;
    /// assert!(m.merged_weights()?.contains_key("model.norm.weight"));
    /// # Ok::<(), atomrl_core::Error>(())
    /// ```
    pub fn merged_weights(&self) -> Result<BTreeMap<String, Tensor>> {
        let func = "CausalLm::merged_weights";
        let mut out: BTreeMap<String, Tensor> = self
            .named_vars()
            .into_iter()
            .map(|(k, v)| (k, v.as_detached_tensor()))
            .collect();
        let Some(lora) = &self.lora else {
            return Ok(out);
        };
        let adapters: HashMap<String, Var> = sorted_vars(&lora.vars).into_iter().collect();
        for (module, _, _) in self.lora_modules(&lora.config) {
            let (na, nb) = adapter_names(&module);
            let (Some(a), Some(b)) = (adapters.get(&na), adapters.get(&nb)) else {
                continue;
            };
            let name = format!("{module}.weight");
            if let Some(w) = out.get(&name) {
                let delta = b
                    .as_detached_tensor()
                    .matmul(&a.as_detached_tensor())
                    .ctx(func)?;
                let merged = (w + delta.affine(lora.config.scale(), 0.0).ctx(func)?).ctx(func)?;
                out.insert(name, merged);
            }
        }
        Ok(out)
    }

    /// Merges the adapters into the base weights (in place) and detaches them: the model is a
    /// plain model again, every base weight trainable.
    ///
    /// # Errors
    /// [`Error::Value`] when no adapter is attached.
    ///
    /// ```
    /// use atomrl_model::{Architecture, CausalLm, LoraConfig, ModelConfig};
    /// use candle_core::{DType, Device};
    /// let c = ModelConfig::new(Architecture::Qwen2, 16, 8, 8, 1, 2, 1)?;
    /// let mut m = CausalLm::from_config_random(c.clone(), 0, DType::F32, &Device::Cpu)?;
    /// m.add_lora(LoraConfig::new(2, 4.0), 0)?;
    /// m.merge_lora()?;
    /// assert!(m.lora_config().is_none());
    /// assert_eq!(m.trainable_vars().len(), m.named_vars().len());
    /// # Ok::<(), atomrl_core::Error>(())
    /// ```
    pub fn merge_lora(&mut self) -> Result<()> {
        let func = "CausalLm::merge_lora";
        if self.lora.is_none() {
            return Err(Error::value(func, "lora", "attached adapters", "none"));
        }
        let merged = self.merged_weights()?;
        for (name, var) in self.named_vars() {
            if let Some(t) = merged.get(&name) {
                // A deep copy: the merged tensor may share the variable's storage.
                var.set(&t.copy().ctx(func)?).ctx(func)?;
            }
        }
        self.lora = None;
        self.rebuild()
    }

    /// Saves the adapters in PEFT's layout: `adapter_model.safetensors` (names
    /// `base_model.model.<module>.lora_{A,B}.weight`) and `adapter_config.json`.
    ///
    /// # Errors
    /// [`Error::Value`] without adapters; [`Error::File`] when a file cannot be written.
    ///
    /// ```
    /// use atomrl_model::{Architecture, CausalLm, LoraConfig, ModelConfig};
    /// use candle_core::{DType, Device};
    /// let dir = std::env::temp_dir().join("atomrl_model_doctest_lora");
    /// let c = ModelConfig::new(Architecture::Qwen3, 16, 8, 8, 1, 2, 1)?;
    /// let mut m = CausalLm::from_config_random(c, 0, DType::F32, &Device::Cpu)?;
    /// m.add_lora(LoraConfig::new(2, 4.0), 0)?;
    /// m.save_lora(&dir)?;
    /// let mut fresh = CausalLm::from_config_random(m.config().clone(), 0, DType::F32, &Device::Cpu)?;
    /// fresh.load_lora(&dir)?;
    /// assert_eq!(fresh.lora_config(), m.lora_config());
    /// # Ok::<(), atomrl_core::Error>(())
    /// ```
    pub fn save_lora(&self, dir: impl AsRef<Path>) -> Result<()> {
        let func = "CausalLm::save_lora";
        let dir = dir.as_ref();
        let lora = self
            .lora
            .as_ref()
            .ok_or_else(|| Error::value(func, "lora", "attached adapters", "none"))?;
        std::fs::create_dir_all(dir).map_err(|e| Error::file(dir.display(), e))?;
        let tensors: BTreeMap<String, Tensor> = sorted_vars(&lora.vars)
            .into_iter()
            .map(|(k, v)| (k, v.as_detached_tensor()))
            .collect();
        save_safetensors(&tensors, dir.join(ADAPTER_WEIGHTS_FILE), self.dtype)?;
        let base = self.source_dir.as_ref().map(|p| p.display().to_string());
        let cfg = serde_json::to_string_pretty(&lora.config.to_peft_json(base.as_deref()))
            .unwrap_or_default();
        let path = dir.join(ADAPTER_CONFIG_FILE);
        std::fs::write(&path, cfg).map_err(|e| Error::file(path.display(), e))
    }

    /// Sets the attached adapters, in place, to those saved in `dir` (by
    /// [`CausalLm::save_lora`]): resuming a LoRA run, whose optimizer holds these very
    /// variables, so attaching new ones ([`CausalLm::load_lora`]) would not do.
    ///
    /// # Errors
    /// [`Error::Value`] without adapters attached; [`Error::File`] naming a missing file or
    /// tensor, or a tensor of another shape.
    ///
    /// ```
    /// use atomrl_model::{Architecture, CausalLm, LoraConfig, ModelConfig};
    /// use candle_core::{DType, Device};
    /// let c = ModelConfig::new(Architecture::Qwen2, 8, 4, 4, 1, 1, 1)?;
    /// let mut saved = CausalLm::from_config_random(c.clone(), 0, DType::F32, &Device::Cpu)?;
    /// saved.add_lora(LoraConfig::new(2, 4.0), 1)?;
    /// let dir = std::env::temp_dir().join("atomrl_doctest_restore_lora");
    /// saved.save_lora(&dir)?;
    /// let mut m = CausalLm::from_config_random(c, 0, DType::F32, &Device::Cpu)?;
    /// m.add_lora(LoraConfig::new(2, 4.0), 2)?;
    /// let vars = m.lora_vars();
    /// m.restore_lora(&dir)?;
    /// for ((_, a), (_, b)) in vars.iter().zip(saved.lora_vars()) {
    ///     let d = (a.as_tensor() - b.as_tensor())?.abs()?.sum_all()?.to_scalar::<f32>()?;
    ///     assert_eq!(d, 0.0);
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn restore_lora(&self, dir: impl AsRef<Path>) -> Result<()> {
        let func = "CausalLm::restore_lora";
        if self.lora.is_none() {
            return Err(Error::value(func, "lora", "adapters attached", "none"));
        }
        let weights_path = dir.as_ref().join(ADAPTER_WEIGHTS_FILE);
        let raw = load_safetensors_file(&weights_path, self.dtype, &self.device)?;
        let raw: HashMap<String, Tensor> = raw
            .into_iter()
            .map(|(k, t)| (k.replace(".default.", "."), t))
            .collect();
        for (name, var) in self.lora_vars() {
            let t = raw.get(&name).ok_or_else(|| {
                Error::file(weights_path.display(), format!("missing tensor `{name}`"))
            })?;
            if t.dims() != var.dims() {
                return Err(Error::file(
                    weights_path.display(),
                    format!(
                        "tensor `{name}` has shape {:?}, expected {:?}",
                        t.dims(),
                        var.dims()
                    ),
                ));
            }
            var.set(t).ctx(func)?;
        }
        Ok(())
    }

    /// Loads adapters saved in PEFT's layout (by [`CausalLm::save_lora`] or by PEFT) and
    /// attaches them, freezing the base weights.
    ///
    /// # Errors
    /// [`Error::File`] naming the missing or invalid file or tensor; [`Error::Value`] when
    /// adapters are already attached.
    ///
    /// ```
    /// # use atomrl_model::{Architecture, CausalLm, ModelConfig};
    /// # let c = ModelConfig::new(Architecture::Qwen2, 8, 4, 4, 1, 1, 1)?;
    /// let mut m = CausalLm::from_config_random(c, 0, candle_core::DType::F32, &candle_core::Device::Cpu)?;
    /// let err = m.load_lora("/no/such/adapter").unwrap_err();
    /// assert!(err.to_string().contains("adapter_config.json"));
    /// # Ok::<(), atomrl_core::Error>(())
    /// ```
    pub fn load_lora(&mut self, dir: impl AsRef<Path>) -> Result<()> {
        let func = "CausalLm::load_lora";
        if self.lora.is_some() {
            return Err(Error::value(
                func,
                "lora",
                "no adapters attached yet",
                "adapters already attached",
            ));
        }
        let dir = dir.as_ref();
        let cfg_path = dir.join(ADAPTER_CONFIG_FILE);
        let text =
            std::fs::read_to_string(&cfg_path).map_err(|e| Error::file(cfg_path.display(), e))?;
        let v: Value = serde_json::from_str(&text)
            .map_err(|e| Error::file(cfg_path.display(), format!("not valid JSON: {e}")))?;
        let config = LoraConfig::from_peft_json(&v).map_err(|e| match e {
            Error::File { message, .. } => Error::file(cfg_path.display(), message),
            other => other,
        })?;
        let weights_path = dir.join(ADAPTER_WEIGHTS_FILE);
        let raw = load_safetensors_file(&weights_path, self.dtype, &self.device)?;
        let raw: HashMap<String, Tensor> = raw
            .into_iter()
            .map(|(k, t)| (k.replace(".default.", "."), t))
            .collect();
        let vars = VarMap::new();
        {
            let mut data = vars
                .data()
                .lock()
                .map_err(|_| Error::value(func, "lora", "an unpoisoned lock", "poisoned"))?;
            for (module, out_f, in_f) in self.lora_modules(&config) {
                let (na, nb) = adapter_names(&module);
                for (name, shape) in [(na, [config.r, in_f]), (nb, [out_f, config.r])] {
                    let t = raw.get(&name).ok_or_else(|| {
                        Error::file(weights_path.display(), format!("missing tensor `{name}`"))
                    })?;
                    if t.dims() != shape {
                        return Err(Error::file(
                            weights_path.display(),
                            format!(
                                "tensor `{name}` has shape {:?}, expected {shape:?}",
                                t.dims()
                            ),
                        ));
                    }
                    data.insert(name, Var::from_tensor(t).ctx(func)?);
                }
            }
        }
        self.lora = Some(LoraState { config, vars });
        self.rebuild()
    }
}
