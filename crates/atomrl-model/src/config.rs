//! The model configuration, read from and written to Hugging Face's `config.json`.

use std::path::Path;

use atomrl_core::{Error, Result};
use serde_json::{json, Map, Value};

/// The architectures this crate implements (the `architectures[0]` of `config.json`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Architecture {
    /// `Qwen2ForCausalLM` (Qwen2, Qwen2.5): bias on q/k/v, none on o.
    Qwen2,
    /// `Qwen3ForCausalLM`: RMSNorm on each head of q and k, no bias unless `attention_bias`.
    Qwen3,
    /// `LlamaForCausalLM` (default RoPE only): bias on q/k/v/o when `attention_bias`.
    Llama,
}

impl Architecture {
    /// Every supported architecture.
    pub const ALL: [Architecture; 3] = [Self::Qwen2, Self::Qwen3, Self::Llama];

    /// The Hugging Face class name (`Qwen2ForCausalLM`).
    ///
    /// ```
    /// assert_eq!(atomrl_model::Architecture::Qwen3.hf_class(), "Qwen3ForCausalLM");
    /// ```
    pub fn hf_class(self) -> &'static str {
        match self {
            Self::Qwen2 => "Qwen2ForCausalLM",
            Self::Qwen3 => "Qwen3ForCausalLM",
            Self::Llama => "LlamaForCausalLM",
        }
    }

    /// The Hugging Face `model_type` (`qwen2`).
    ///
    /// ```
    /// assert_eq!(atomrl_model::Architecture::Qwen2.model_type(), "qwen2");
    /// ```
    pub fn model_type(self) -> &'static str {
        match self {
            Self::Qwen2 => "qwen2",
            Self::Qwen3 => "qwen3",
            Self::Llama => "llama",
        }
    }

    /// The architecture named by a class name or a `model_type`, if supported.
    ///
    /// ```
    /// use atomrl_model::Architecture;
    /// assert_eq!(Architecture::from_name("Qwen2ForCausalLM"), Some(Architecture::Qwen2));
    /// assert_eq!(Architecture::from_name("qwen3"), Some(Architecture::Qwen3));
    /// assert_eq!(Architecture::from_name("GPT2LMHeadModel"), None);
    /// ```
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|a| a.hf_class() == name || a.model_type() == name)
    }
}

/// Hyper-parameters of a decoder-only causal LM, with Hugging Face's field names.
///
/// Read with [`ModelConfig::from_file`] / [`ModelConfig::from_json`]; build one for a random
/// model with [`ModelConfig::new`]. Fields of `config.json` this crate does not use are kept and
/// written back by [`ModelConfig::to_json`], so a saved model keeps its original configuration
/// (equality compares the fields above only).
#[derive(Debug, Clone)]
pub struct ModelConfig {
    /// The architecture.
    pub architecture: Architecture,
    /// `vocab_size` (`V`): rows of the embedding and of the LM head.
    pub vocab_size: usize,
    /// `hidden_size` (`H`).
    pub hidden_size: usize,
    /// `intermediate_size` of the SwiGLU MLP.
    pub intermediate_size: usize,
    /// `num_hidden_layers`.
    pub num_hidden_layers: usize,
    /// `num_attention_heads`.
    pub num_attention_heads: usize,
    /// `num_key_value_heads` (grouped-query attention; divides `num_attention_heads`).
    pub num_key_value_heads: usize,
    /// `head_dim` (default `hidden_size / num_attention_heads`).
    pub head_dim: usize,
    /// `rms_norm_eps`.
    pub rms_norm_eps: f64,
    /// `rope_theta` (also read from `rope_parameters.rope_theta`).
    pub rope_theta: f64,
    /// `tie_word_embeddings`: the LM head reuses `model.embed_tokens.weight`.
    pub tie_word_embeddings: bool,
    /// Whether q/k/v (Qwen2 always; Qwen3 and Llama with `attention_bias`) have a bias.
    pub qkv_bias: bool,
    /// Whether `o_proj` has a bias (Qwen3 and Llama with `attention_bias`).
    pub o_bias: bool,
    /// `max_position_embeddings` (informative: RoPE is computed for any position).
    pub max_position_embeddings: usize,
    /// `initializer_range`: the standard deviation of random initialisation.
    pub initializer_range: f64,
    raw: Map<String, Value>,
}

impl PartialEq for ModelConfig {
    fn eq(&self, o: &Self) -> bool {
        let key = |c: &Self| {
            (
                c.architecture,
                [
                    c.vocab_size,
                    c.hidden_size,
                    c.intermediate_size,
                    c.num_hidden_layers,
                ],
                [
                    c.num_attention_heads,
                    c.num_key_value_heads,
                    c.head_dim,
                    c.max_position_embeddings,
                ],
                [c.rms_norm_eps, c.rope_theta, c.initializer_range],
                [c.tie_word_embeddings, c.qkv_bias, c.o_bias],
            )
        };
        key(self) == key(o)
    }
}

impl ModelConfig {
    /// A configuration for a new model (HF defaults for everything not given): `head_dim =
    /// hidden / heads`, `rms_norm_eps = 1e-6`, `rope_theta = 10000`, tied embeddings.
    ///
    /// # Errors
    /// [`Error::Value`] when a size is zero or the heads do not divide as they must.
    ///
    /// ```
    /// use atomrl_model::{Architecture, ModelConfig};
    /// let c = ModelConfig::new(Architecture::Qwen3, 512, 64, 128, 2, 4, 2)?;
    /// assert_eq!(c.head_dim, 16);
    /// assert!(!c.qkv_bias);
    /// # Ok::<(), atomrl_core::Error>(())
    /// ```
    pub fn new(
        architecture: Architecture,
        vocab_size: usize,
        hidden_size: usize,
        intermediate_size: usize,
        num_hidden_layers: usize,
        num_attention_heads: usize,
        num_key_value_heads: usize,
    ) -> Result<Self> {
        let c = Self {
            architecture,
            vocab_size,
            hidden_size,
            intermediate_size,
            num_hidden_layers,
            num_attention_heads,
            num_key_value_heads,
            head_dim: hidden_size.checked_div(num_attention_heads).unwrap_or(0),
            rms_norm_eps: 1e-6,
            rope_theta: 10000.0,
            tie_word_embeddings: true,
            qkv_bias: architecture == Architecture::Qwen2,
            o_bias: false,
            max_position_embeddings: 32768,
            initializer_range: 0.02,
            raw: Map::new(),
        };
        c.validate("ModelConfig::new")?;
        Ok(c)
    }

    /// Reads `config.json`.
    ///
    /// # Errors
    /// [`Error::File`] naming the file when it is missing, not JSON, lacks a field, or names an
    /// unsupported architecture or RoPE scaling.
    ///
    /// ```
    /// let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/reference/models/tiny-qwen2");
    /// let c = atomrl_model::ModelConfig::from_file(format!("{dir}/config.json"))?;
    /// assert_eq!((c.vocab_size, c.hidden_size, c.num_hidden_layers), (512, 64, 2));
    /// # Ok::<(), atomrl_core::Error>(())
    /// ```
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::file(path.display(), format!("cannot read model config: {e}")))?;
        let value: Value = serde_json::from_str(&text)
            .map_err(|e| Error::file(path.display(), format!("not valid JSON: {e}")))?;
        Self::from_json(&value).map_err(|e| match e {
            Error::File { message, .. } => Error::file(path.display(), message),
            other => other,
        })
    }

    /// Parses the JSON of a `config.json`.
    ///
    /// # Errors
    /// [`Error::File`] (path `config.json`) when a field is missing or unsupported.
    ///
    /// ```
    /// use serde_json::json;
    /// let c = atomrl_model::ModelConfig::from_json(&json!({
    ///     "architectures": ["Qwen2ForCausalLM"], "vocab_size": 32, "hidden_size": 8,
    ///     "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
    ///     "num_key_value_heads": 1, "rope_parameters": {"rope_theta": 1e6, "rope_type": "default"}
    /// }))?;
    /// assert_eq!(c.rope_theta, 1e6);
    /// assert!(c.qkv_bias && c.tie_word_embeddings);
    /// let err = atomrl_model::ModelConfig::from_json(&json!({"architectures": ["BertModel"]}));
    /// assert!(err.unwrap_err().to_string().contains("unsupported architecture `BertModel`"));
    /// # Ok::<(), atomrl_core::Error>(())
    /// ```
    pub fn from_json(value: &Value) -> Result<Self> {
        let file = "config.json";
        let obj = value
            .as_object()
            .ok_or_else(|| Error::file(file, "expected a JSON object"))?;
        let name = obj
            .get("architectures")
            .and_then(|a| a.get(0))
            .and_then(Value::as_str)
            .or_else(|| obj.get("model_type").and_then(Value::as_str))
            .ok_or_else(|| {
                Error::file(file, "neither `architectures` nor `model_type` is given")
            })?;
        let architecture = Architecture::from_name(name).ok_or_else(|| {
            let supported: Vec<_> = Architecture::ALL.iter().map(|a| a.hf_class()).collect();
            Error::file(
                file,
                format!(
                    "unsupported architecture `{name}`; supported: {}",
                    supported.join(", ")
                ),
            )
        })?;
        let usize_field = |key: &str| -> Result<usize> {
            obj.get(key)
                .and_then(Value::as_u64)
                .map(|x| x as usize)
                .ok_or_else(|| {
                    Error::file(
                        file,
                        format!("missing or invalid `{key}` (a non-negative integer)"),
                    )
                })
        };
        let opt_f64 = |key: &str| optional_field(obj, key, "a number", Value::as_f64);
        let opt_bool = |key: &str| optional_field(obj, key, "true or false", Value::as_bool);
        let opt_usize = |key: &str| {
            // `32768.0` is the integer Python would take it for.
            let integral = |v: &Value| {
                v.as_u64().or_else(|| {
                    v.as_f64()
                        .filter(|x| *x >= 0.0 && x.fract() == 0.0 && *x < u64::MAX as f64)
                        .map(|x| x as u64)
                })
            };
            optional_field(obj, key, "a non-negative integer", integral)
                .map(|x| x.map(|x| x as usize))
        };
        let hidden_size = usize_field("hidden_size")?;
        let num_attention_heads = usize_field("num_attention_heads")?;
        let head_dim = match opt_usize("head_dim")? {
            Some(h) => h,
            None => hidden_size.checked_div(num_attention_heads).unwrap_or(0),
        };
        let rope = obj
            .get("rope_parameters")
            .or_else(|| obj.get("rope_scaling"))
            .filter(|v| !v.is_null());
        if let Some(rope) = rope {
            let kind = rope
                .get("rope_type")
                .or_else(|| rope.get("type"))
                .and_then(Value::as_str);
            if let Some(kind) = kind.filter(|k| *k != "default") {
                return Err(Error::file(
                    file,
                    format!("unsupported RoPE type `{kind}` (only `default`)"),
                ));
            }
        }
        let rope_theta = opt_f64("rope_theta")?
            .or_else(|| {
                rope.and_then(|r| r.get("rope_theta"))
                    .and_then(Value::as_f64)
            })
            .unwrap_or(10000.0);
        if opt_bool("use_sliding_window")? == Some(true) {
            return Err(Error::file(
                file,
                "sliding-window attention (`use_sliding_window: true`) is not supported",
            ));
        }
        if opt_bool("mlp_bias")? == Some(true) {
            return Err(Error::file(file, "`mlp_bias: true` is not supported"));
        }
        if let Some(act) = obj.get("hidden_act").and_then(Value::as_str) {
            if act != "silu" {
                return Err(Error::file(
                    file,
                    format!("unsupported `hidden_act` `{act}` (only `silu`)"),
                ));
            }
        }
        let attention_bias = opt_bool("attention_bias")?.unwrap_or(false);
        let (qkv_bias, o_bias) = match architecture {
            Architecture::Qwen2 => (true, false),
            Architecture::Qwen3 | Architecture::Llama => (attention_bias, attention_bias),
        };
        let c = Self {
            architecture,
            vocab_size: usize_field("vocab_size")?,
            hidden_size,
            intermediate_size: usize_field("intermediate_size")?,
            num_hidden_layers: usize_field("num_hidden_layers")?,
            num_attention_heads,
            num_key_value_heads: opt_usize("num_key_value_heads")?.unwrap_or(num_attention_heads),
            head_dim,
            rms_norm_eps: opt_f64("rms_norm_eps")?.unwrap_or(1e-6),
            rope_theta,
            tie_word_embeddings: opt_bool("tie_word_embeddings")?.unwrap_or(true),
            qkv_bias,
            o_bias,
            max_position_embeddings: opt_usize("max_position_embeddings")?.unwrap_or(32768),
            initializer_range: opt_f64("initializer_range")?.unwrap_or(0.02),
            raw: obj.clone(),
        };
        c.validate(file).map_err(|e| Error::file(file, e))?;
        Ok(c)
    }

    /// Checks that a checkpoint's tensor `names` hold exactly this config's decoder layers
    /// (`model.layers.0.` to `model.layers.{num_hidden_layers - 1}.`). Loading takes a layer's
    /// weights by name, so a `num_hidden_layers` below the checkpoint's would silently drop the
    /// layers past it, and one far above it would build a model of that size before finding
    /// the first weight missing.
    ///
    /// # Errors
    /// [`Error::File`] (`model.safetensors`) with both counts.
    ///
    /// ```
    /// use atomrl_model::{Architecture, ModelConfig};
    /// let c = ModelConfig::new(Architecture::Qwen2, 32, 8, 16, 2, 2, 1)?;
    /// let names = ["model.embed_tokens.weight", "model.layers.0.mlp.up_proj.weight", "model.layers.1.mlp.up_proj.weight"];
    /// assert!(c.check_checkpoint_layers(names).is_ok());
    /// let err = c.check_checkpoint_layers(names[..2].iter().copied()).unwrap_err().to_string();
    /// assert!(err.contains("num_hidden_layers = 2") && err.contains("holds 1 decoder layer"), "{err}");
    /// # Ok::<(), atomrl_core::Error>(())
    /// ```
    pub fn check_checkpoint_layers<'a>(
        &self,
        names: impl IntoIterator<Item = &'a str>,
    ) -> Result<()> {
        let held = names
            .into_iter()
            .filter_map(|n| {
                n.strip_prefix("model.layers.")?
                    .split('.')
                    .next()?
                    .parse()
                    .ok()
            })
            .map(|i: usize| i + 1)
            .max()
            .unwrap_or(0);
        if held == self.num_hidden_layers {
            return Ok(());
        }
        let plural = if held == 1 { "" } else { "s" };
        Err(Error::file(
            "model.safetensors",
            format!(
                "config.json says num_hidden_layers = {}, but the checkpoint holds {held} \
                 decoder layer{plural} (model.layers.0 to model.layers.{})",
                self.num_hidden_layers,
                held.saturating_sub(1)
            ),
        ))
    }

    fn validate(&self, func: &str) -> Result<()> {
        let sizes = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
        ];
        for (name, v) in sizes {
            if v == 0 {
                return Err(Error::value(func, name, "a positive integer", v));
            }
        }
        if self.num_attention_heads % self.num_key_value_heads != 0 {
            return Err(Error::value(
                func,
                "num_key_value_heads",
                format!(
                    "a divisor of num_attention_heads = {}",
                    self.num_attention_heads
                ),
                self.num_key_value_heads,
            ));
        }
        // transformers takes these as given; a non-positive θ or a negative ε only turns every
        // output into NaN, long after loading.
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            let expected = "a finite number > 0";
            return Err(Error::value(func, "rope_theta", expected, self.rope_theta));
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps >= 0.0) {
            let expected = "a finite number >= 0";
            return Err(Error::value(
                func,
                "rms_norm_eps",
                expected,
                self.rms_norm_eps,
            ));
        }
        if self.head_dim % 2 != 0 {
            return Err(Error::value(
                func,
                "head_dim",
                "an even number (RoPE)",
                self.head_dim,
            ));
        }
        Ok(())
    }

    /// The `config.json` content: the original fields, with this crate's fields written over.
    ///
    /// ```
    /// use atomrl_model::{Architecture, ModelConfig};
    /// let c = ModelConfig::new(Architecture::Qwen2, 32, 8, 16, 1, 2, 1)?;
    /// let j = c.to_json(candle_core::DType::F32);
    /// assert_eq!(j["architectures"][0], "Qwen2ForCausalLM");
    /// assert_eq!(ModelConfig::from_json(&j)?, ModelConfig::from_json(&j)?);
    /// # Ok::<(), atomrl_core::Error>(())
    /// ```
    pub fn to_json(&self, dtype: candle_core::DType) -> Value {
        let mut obj = self.raw.clone();
        let dtype = match dtype {
            candle_core::DType::BF16 => "bfloat16",
            candle_core::DType::F16 => "float16",
            candle_core::DType::F64 => "float64",
            _ => "float32",
        };
        let fields = json!({
            "architectures": [self.architecture.hf_class()],
            "model_type": self.architecture.model_type(),
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "tie_word_embeddings": self.tie_word_embeddings,
            "max_position_embeddings": self.max_position_embeddings,
            "initializer_range": self.initializer_range,
            "hidden_act": "silu",
            "torch_dtype": dtype,
            "dtype": dtype,
        });
        if let Value::Object(fields) = fields {
            obj.extend(fields);
        }
        if self.architecture != Architecture::Qwen2 {
            obj.insert("attention_bias".into(), Value::Bool(self.qkv_bias));
        }
        match obj.get_mut("rope_parameters") {
            Some(Value::Object(rope)) => {
                rope.insert("rope_theta".into(), self.rope_theta.into());
            }
            _ => {
                obj.insert(
                    "rope_parameters".into(),
                    json!({"rope_theta": self.rope_theta, "rope_type": "default"}),
                );
            }
        }
        obj.entry("use_sliding_window")
            .or_insert(Value::Bool(false));
        obj.entry("bos_token_id").or_insert(Value::Null);
        obj.entry("eos_token_id").or_insert(Value::Null);
        Value::Object(obj)
    }

    /// Number of parameters of the model (the tied LM head counted once).
    ///
    /// ```
    /// use atomrl_model::{Architecture, ModelConfig};
    /// let c = ModelConfig::new(Architecture::Llama, 10, 4, 8, 1, 2, 2)?;
    /// // embed 40 + attention 4*16 + mlp 3*32 + 2 norms 8 + final norm 4
    /// assert_eq!(c.num_parameters(), 40 + 64 + 96 + 8 + 4);
    /// # Ok::<(), atomrl_core::Error>(())
    /// ```
    pub fn num_parameters(&self) -> usize {
        let (h, d) = (self.hidden_size, self.head_dim);
        let (q, kv) = (self.num_attention_heads * d, self.num_key_value_heads * d);
        let mut layer = h * q + 2 * h * kv + q * h + 3 * h * self.intermediate_size + 2 * h;
        if self.qkv_bias {
            layer += q + 2 * kv;
        }
        if self.o_bias {
            layer += h;
        }
        if self.architecture == Architecture::Qwen3 {
            layer += 2 * d;
        }
        let head = if self.tie_word_embeddings {
            0
        } else {
            self.vocab_size * h
        };
        self.vocab_size * h + self.num_hidden_layers * layer + h + head
    }
}

/// An optional `config.json` field: `None` when absent or `null` (as transformers reads it),
/// an error naming the field when present with another type (`"rms_norm_eps": "1e-6"` must not
/// become the default in silence).
fn optional_field<T>(
    obj: &Map<String, Value>,
    key: &str,
    kind: &str,
    read: impl Fn(&Value) -> Option<T>,
) -> Result<Option<T>> {
    match obj.get(key).filter(|v| !v.is_null()) {
        None => Ok(None),
        Some(v) => read(v)
            .map(Some)
            .ok_or_else(|| Error::file("config.json", format!("`{key}` must be {kind}, got {v}"))),
    }
}
