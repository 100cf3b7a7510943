//! [`CausalLm`]: the trainable causal language model.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use atomrl_core::{CandleContext, Error, Result};
use candle_core::{DType, Device, Tensor, Var};
use candle_nn::VarMap;

use crate::cache::KvCache;
use crate::config::ModelConfig;
use crate::input::{attention_bias, position_ids_from_mask, ForwardInput};
use crate::linear::{Linear, LoraAdapter};
use crate::lora::LoraState;
use crate::network::{Network, TensorSource};
use crate::ops::rope_tables;
use crate::params::{param_specs, Init, Rng};
use crate::weight_casts::{CastCache, SharedWeightCasts};
use crate::weights::{load_safetensors_dir, WEIGHTS_FILE};

/// The most memory a CPU generation view spends on transposed copies of the projection
/// weights ([`CausalLm::generation_view`]). Up to ~250M f32 parameters; a larger model's
/// copies would add gigabytes while its decode steps gain less (gemm's copy of a weight is
/// paid back by more rows of work at larger widths: Qwen2.5-0.5B's gate projection at 64 rows
/// gained 1.26×, the embedded model's 1.39–1.79×).
const TRANSPOSED_WEIGHTS_MAX_BYTES: usize = 1 << 30;

/// How the network reads the weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Gradients flow to the trainable variables (all base weights, or only the LoRA adapters).
    Train,
    /// Every tensor detached: an inference view sharing the weights' storage.
    Detached,
}

/// A decoder-only causal LM (Qwen2 / Qwen2.5 / Qwen3 / Llama) whose every weight is a candle
/// [`Var`] under its Hugging Face name, so that `loss.backward()` reaches all of them.
///
/// - Load with [`CausalLm::from_hf_dir`] (or [`CausalLm::from_hub`]), create with
///   [`CausalLm::from_config_random`], save with [`CausalLm::save_hf`].
/// - [`CausalLm::forward`] takes ids, a key-padding mask, positions and an optional
///   caller-owned [`KvCache`], and returns logits `[N, L, V]`.
/// - [`CausalLm::trainable_vars`] are what the optimiser updates (in place: the network sees
///   every update without rebuilding). With LoRA ([`CausalLm::add_lora`]) only the adapters
///   are trainable and the base weights are frozen with no gradient work spent on them.
/// - [`CausalLm::detached`] is an inference view on the same storage (for rollouts): nothing
///   it computes keeps a backward graph alive.
/// - Mixed precision: [`CausalLm::set_compute_dtype`] runs the forward (and backward) in bf16
///   or f16 while the variables — and so the gradients and the optimiser — stay in the master
///   dtype (f32).
/// - [`CausalLm::set_gradient_checkpointing`] recomputes each decoder layer in backward.
///
/// ```
/// use atomrl_model::{Architecture, CausalLm, ForwardInput, ModelConfig};
/// use candle_core::{DType, Device, Tensor};
/// let config = ModelConfig::new(Architecture::Qwen3, 32, 16, 32, 1, 2, 1)?;
/// let model = CausalLm::from_config_random(config, 0, DType::F32, &Device::Cpu)?;
/// let ids = Tensor::new(&[[1u32, 2, 3]], &Device::Cpu)?;
/// let logits = model.forward(&ForwardInput::new(ids), None)?;
/// assert_eq!(logits.dims(), &[1, 3, 32]);
/// let loss = logits.sqr()?.mean_all()?;
/// let grads = loss.backward()?;
/// assert!(model.trainable_vars().iter().all(|v| grads.get(v.as_tensor()).is_some()));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct CausalLm {
    pub(crate) config: ModelConfig,
    pub(crate) dtype: DType,
    compute_dtype: DType,
    checkpoint: bool,
    scores_budget: usize,
    head_cache: HeadCache,
    pub(crate) casts: CastCache,
    pub(crate) device: Device,
    pub(crate) weights: VarMap,
    pub(crate) lora: Option<LoraState>,
    net: Network,
    mode: Mode,
    train: bool,
    pub(crate) source_dir: Option<PathBuf>,
}

impl std::fmt::Debug for CausalLm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CausalLm")
            .field("architecture", &self.config.architecture)
            .field("dtype", &self.dtype)
            .field("compute_dtype", &self.compute_dtype)
            .field("gradient_checkpointing", &self.checkpoint)
            .field("device", &self.device)
            .field("num_parameters", &self.num_parameters())
            .field("lora", &self.lora)
            .field("train", &self.train)
            .finish()
    }
}

/// The LM head cast by the last training [`CausalLm::forward_hidden`], reused by
/// [`CausalLm::logits`] (a chunked log-softmax calls it many times per forward). A clone of
/// the model starts empty.
#[derive(Default)]
struct HeadCache(Arc<Mutex<Option<Linear>>>);

impl Clone for HeadCache {
    fn clone(&self) -> Self {
        Self::default()
    }
}

impl HeadCache {
    fn set(&self, head: Option<Linear>) {
        if let Ok(mut slot) = self.0.lock() {
            *slot = head;
        }
    }

    fn get(&self) -> Option<Linear> {
        self.0.lock().ok().and_then(|slot| slot.clone())
    }
}

struct Source<'a> {
    weights: &'a HashMap<String, Var>,
    /// The dtype frozen and detached tensors are cast to once, at build time.
    compute: DType,
    lora: Option<&'a LoraState>,
    lora_vars: Option<&'a HashMap<String, Var>>,
    frozen: bool,
    detached: bool,
}

impl TensorSource for Source<'_> {
    fn get(&self, name: &str) -> candle_core::Result<Tensor> {
        let var = self
            .weights
            .get(name)
            .ok_or_else(|| candle_core::Error::Msg(format!("missing tensor `{name}`")))?;
        Ok(if self.frozen || self.detached {
            var.as_detached_tensor().to_dtype(self.compute)?
        } else {
            var.as_tensor().clone()
        })
    }

    fn has(&self, name: &str) -> bool {
        self.weights.contains_key(name)
    }

    fn frozen(&self) -> bool {
        self.frozen || self.detached
    }

    fn lora(&self, module: &str) -> candle_core::Result<Option<LoraAdapter>> {
        let (Some(state), Some(vars)) = (self.lora, self.lora_vars) else {
            return Ok(None);
        };
        if !state.config.targets(module) {
            return Ok(None);
        }
        let (a, b) = crate::lora::adapter_names(module);
        let get = |n: &str| {
            vars.get(n)
                .map(|v| {
                    if self.detached {
                        v.as_detached_tensor().to_dtype(self.compute)
                    } else {
                        Ok(v.as_tensor().clone())
                    }
                })
                .ok_or_else(|| candle_core::Error::Msg(format!("missing LoRA tensor `{n}`")))?
        };
        Ok(Some(LoraAdapter {
            a: get(&a)?,
            b: get(&b)?,
            scale: state.config.scale(),
            dropout: state.config.dropout as f32,
        }))
    }
}

impl CausalLm {
    /// Loads a Hugging Face model folder: `config.json` and `model.safetensors` (or shards with
    /// `model.safetensors.index.json`), converting the weights to `dtype` (a bf16 checkpoint
    /// loads into f32 training weights). Tokenizer and generation files are copied by
    /// [`CausalLm::save_hf`].
    ///
    /// # Errors
    /// [`Error::File`] naming the missing or invalid file (`config.json`, an unsupported
    /// architecture, a missing or mis-shaped tensor).
    ///
    /// ```
    /// use candle_core::{DType, Device};
    /// let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/reference/models/tiny-qwen2");
    /// let model = atomrl_model::CausalLm::from_hf_dir(dir, DType::F32, &Device::Cpu)?;
    /// assert_eq!(model.config().vocab_size, 512);
    /// let err = atomrl_model::CausalLm::from_hf_dir("/no/such/model", DType::F32, &Device::Cpu);
    /// assert!(err.unwrap_err().to_string().contains("/no/such/model"));
    /// # Ok::<(), atomrl_core::Error>(())
    /// ```
    pub fn from_hf_dir(dir: impl AsRef<Path>, dtype: DType, device: &Device) -> Result<Self> {
        let dir = dir.as_ref();
        if !dir.is_dir() {
            return Err(Error::file(dir.display(), "model folder not found"));
        }
        let config = ModelConfig::from_file(dir.join("config.json"))?;
        let tensors = load_safetensors_dir(dir, dtype, device)?;
        config
            .check_checkpoint_layers(tensors.keys().map(String::as_str))
            .map_err(|e| in_weights_file(e, dir))?;
        let mut model = Self::from_tensors(config, tensors, dtype, device)
            .map_err(|e| in_weights_file(e, dir))?;
        model.source_dir = Some(dir.to_path_buf());
        Ok(model)
    }

    /// A model from named tensors (Hugging Face names; extra tensors are ignored, a tied
    /// `lm_head.weight` too). Each tensor is copied into a new [`Var`] of `dtype` on `device`.
    ///
    /// # Errors
    /// [`Error::File`] (path `model.safetensors`) naming a missing or mis-shaped tensor.
    ///
    /// ```
    /// use std::collections::HashMap;
    /// use atomrl_model::{Architecture, CausalLm, ModelConfig};
    /// use candle_core::{DType, Device};
    /// let c = ModelConfig::new(Architecture::Llama, 16, 8, 8, 1, 2, 2)?;
    /// let err = CausalLm::from_tensors(c, HashMap::new(), DType::F32, &Device::Cpu).unwrap_err();
    /// assert!(err.to_string().contains("missing tensor `model.embed_tokens.weight`"));
    /// # Ok::<(), atomrl_core::Error>(())
    /// ```
    pub fn from_tensors(
        config: ModelConfig,
        tensors: HashMap<String, Tensor>,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let func = "CausalLm::from_tensors";
        let weights = VarMap::new();
        {
            let mut data = weights
                .data()
                .lock()
                .map_err(|_| Error::value(func, "weights", "an unpoisoned lock", "poisoned"))?;
            for spec in param_specs(&config) {
                let t = tensors.get(&spec.name).ok_or_else(|| {
                    Error::file(WEIGHTS_FILE, format!("missing tensor `{}`", spec.name))
                })?;
                if t.dims() != spec.shape.as_slice() {
                    return Err(Error::file(
                        WEIGHTS_FILE,
                        format!(
                            "tensor `{}` has shape {:?}, config.json implies {:?}",
                            spec.name,
                            t.dims(),
                            spec.shape
                        ),
                    ));
                }
                let t = t
                    .to_dtype(dtype)
                    .and_then(|t| t.to_device(device))
                    .ctx(func)?;
                data.insert(spec.name, Var::from_tensor(&t).ctx(func)?);
            }
        }
        Self::assemble(config, weights, None, dtype, device)
    }

    /// A new model with random weights: linear and embedding weights from
    /// Normal(0, `initializer_range`), norms 1, biases 0 (transformers' initialisation), from a
    /// deterministic generator seeded with `seed`.
    ///
    /// # Errors
    /// [`Error::Candle`] if a tensor cannot be created on `device`.
    ///
    /// ```
    /// use atomrl_model::{Architecture, CausalLm, ModelConfig};
    /// use candle_core::{DType, Device};
    /// let c = ModelConfig::new(Architecture::Qwen2, 64, 16, 32, 2, 4, 2)?;
    /// let a = CausalLm::from_config_random(c.clone(), 7, DType::F32, &Device::Cpu)?;
    /// let b = CausalLm::from_config_random(c.clone(), 7, DType::F32, &Device::Cpu)?;
    /// assert_eq!(a.num_parameters(), c.num_parameters());
    /// let w = "model.layers.0.mlp.up_proj.weight";
    /// assert_eq!(a.tensor(w).unwrap().to_vec2::<f32>()?, b.tensor(w).unwrap().to_vec2::<f32>()?);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn from_config_random(
        config: ModelConfig,
        seed: u64,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let func = "CausalLm::from_config_random";
        let mut rng = Rng::new(seed);
        let mut tensors = HashMap::new();
        for spec in param_specs(&config) {
            let n: usize = spec.shape.iter().product();
            let data: Vec<f64> = match spec.init {
                Init::Normal => (0..n)
                    .map(|_| rng.normal() * config.initializer_range)
                    .collect(),
                Init::Ones => vec![1.0; n],
                Init::Zeros => vec![0.0; n],
            };
            // Each tensor leaves f64 at once: holding every one in f64 until the end doubled
            // the build's memory, and the heap kept it (Qwen2.5-0.5B: 5.7 GB resident after
            // the build instead of 3.8). The values are the same cast, made earlier.
            let t = Tensor::from_vec(data, spec.shape.clone(), device)
                .and_then(|t| t.to_dtype(dtype))
                .ctx(func)?;
            tensors.insert(spec.name, t);
        }
        Self::from_tensors(config, tensors, dtype, device)
    }

    fn assemble(
        config: ModelConfig,
        weights: VarMap,
        lora: Option<LoraState>,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let mut net = build_network(&config, &weights, lora.as_ref(), Mode::Train, dtype, false)?;
        let scores_budget = crate::attention::default_scores_budget(device);
        net.set_attention_scores_budget(scores_budget);
        Ok(Self {
            net,
            config,
            dtype,
            compute_dtype: dtype,
            checkpoint: false,
            scores_budget,
            head_cache: HeadCache::default(),
            casts: CastCache::default(),
            device: device.clone(),
            weights,
            lora,
            mode: Mode::Train,
            train: false,
            source_dir: None,
        })
    }

    /// Rebuilds the network after the set of variables or the mode changed.
    pub(crate) fn rebuild(&mut self) -> Result<()> {
        self.net = build_network(
            &self.config,
            &self.weights,
            self.lora.as_ref(),
            self.mode,
            self.compute_dtype,
            self.checkpoint,
        )?;
        self.net.set_attention_scores_budget(self.scores_budget);
        self.head_cache.set(None);
        Ok(())
    }

    /// Sets the dtype the forward and backward compute in (mixed precision), leaving the
    /// variables in their master dtype [`CausalLm::dtype`].
    ///
    /// With `bf16` (or `f16`) over f32 weights, each training forward casts the trainable
    /// weights with a differentiable `to_dtype`, so activations are half precision and the
    /// gradients arrive in f32 on the master variables (which the optimiser updates in f32).
    /// The cast happens at the start of every [`CausalLm::forward_hidden`], so optimiser
    /// updates are always seen (the micro-batches of one step can share one cast:
    /// [`CausalLm::share_weight_casts`]); [`CausalLm::logits`] reuses the LM head cast by the last
    /// `forward_hidden` (compute the hidden states again after updating the weights). Frozen
    /// weights (the base under LoRA) and [`CausalLm::detached`] views are cast once, when
    /// built: a detached view of a bf16 model is a snapshot of the weights. RMSNorm and the
    /// attention softmax run in f32 internally; logits come out in the compute dtype
    /// (`atomrl-logprob` upcasts them to f32).
    ///
    /// # Errors
    /// [`Error::Value`] for a non-float dtype.
    ///
    /// ```
    /// use atomrl_model::{Architecture, CausalLm, ForwardInput, ModelConfig};
    /// use candle_core::{DType, Device, Tensor};
    /// let c = ModelConfig::new(Architecture::Qwen2, 32, 16, 32, 1, 2, 1)?;
    /// let mut m = CausalLm::from_config_random(c, 0, DType::F32, &Device::Cpu)?;
    /// m.set_compute_dtype(DType::BF16)?;
    /// let logits = m.forward(&ForwardInput::new(Tensor::new(&[[1u32, 2]], &Device::Cpu)?), None)?;
    /// assert_eq!(logits.dtype(), DType::BF16);
    /// let grads = logits.to_dtype(DType::F32)?.sqr()?.mean_all()?.backward()?;
    /// let g = grads.get(m.trainable_vars()[0].as_tensor()).unwrap();
    /// assert_eq!((m.dtype(), g.dtype()), (DType::F32, DType::F32));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_compute_dtype(&mut self, dtype: DType) -> Result<()> {
        if !dtype.is_float() {
            return Err(Error::value(
                "CausalLm::set_compute_dtype",
                "dtype",
                "a float dtype (f32, bf16, f16, f64)",
                format!("{dtype:?}"),
            ));
        }
        self.compute_dtype = dtype;
        self.rebuild()
    }

    /// The dtype the forward computes in (the master dtype unless
    /// [`CausalLm::set_compute_dtype`] changed it).
    ///
    /// ```
    /// # use atomrl_model::{Architecture, CausalLm, ModelConfig};
    /// # let c = ModelConfig::new(Architecture::Qwen2, 8, 4, 4, 1, 1, 1)?;
    /// let m = CausalLm::from_config_random(c, 0, candle_core::DType::F32, &candle_core::Device::Cpu)?;
    /// assert_eq!(m.compute_dtype(), candle_core::DType::F32);
    /// # Ok::<(), atomrl_core::Error>(())
    /// ```
    pub fn compute_dtype(&self) -> DType {
        self.compute_dtype
    }

    /// Gradient checkpointing: when on, a forward without a KV cache keeps only each decoder
    /// layer's input and recomputes the layer's activations in backward (about one extra
    /// forward of compute for activation memory ∝ layers × hidden instead of every
    /// intermediate tensor). Gradients are unchanged. Not supported with LoRA dropout in
    /// training mode (the forward then fails, saying so).
    ///
    /// ```
    /// # use atomrl_model::{Architecture, CausalLm, ModelConfig};
    /// # let c = ModelConfig::new(Architecture::Qwen2, 8, 4, 4, 1, 1, 1)?;
    /// let mut m = CausalLm::from_config_random(c, 0, candle_core::DType::F32, &candle_core::Device::Cpu)?;
    /// m.set_gradient_checkpointing(true);
    /// assert!(m.gradient_checkpointing());
    /// # Ok::<(), atomrl_core::Error>(())
    /// ```
    pub fn set_gradient_checkpointing(&mut self, on: bool) {
        self.checkpoint = on;
        self.net.checkpoint = on;
    }

    /// Whether gradient checkpointing is on.
    pub fn gradient_checkpointing(&self) -> bool {
        self.checkpoint
    }

    /// The most attention-score elements (`N × heads × queries × keys`) one attention may
    /// hold at once; past it, attention runs in chunks of queries whose scores fit, and its
    /// backward recomputes each chunk's probabilities instead of keeping `[N, H, L, S]` of
    /// them (FlashAttention's plan in tensor ops; values and gradients equal the unchunked
    /// form's up to rounding). Default [`default_scores_budget`](crate::default_scores_budget)
    /// of the model's device: 2²⁴ on the CPU (64 MiB of f32 scores), 2²⁶ on a GPU. It applies
    /// where the fused kernels run (the CPU, and CUDA unless `ATOMRL_CUDA_FUSED=0`).
    ///
    /// ```
    /// # use atomrl_model::{Architecture, CausalLm, ForwardInput, ModelConfig};
    /// # use candle_core::{DType, Device, Tensor};
    /// # let c = ModelConfig::new(Architecture::Qwen2, 8, 4, 4, 1, 1, 1)?;
    /// let mut m = CausalLm::from_config_random(c, 0, DType::F32, &Device::Cpu)?;
    /// let ids = Tensor::new(&[[1u32, 2, 3, 4, 5]], &Device::Cpu)?;
    /// let whole = m.forward(&ForwardInput::new(ids.clone()), None)?;
    /// m.set_attention_scores_budget(10); // two queries' scores at a time
    /// assert_eq!(m.attention_scores_budget(), 10);
    /// let chunked = m.forward(&ForwardInput::new(ids), None)?;
    /// let diff = (whole - chunked)?.abs()?.max_all()?.to_scalar::<f32>()?;
    /// assert!(diff < 1e-5);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_attention_scores_budget(&mut self, elements: usize) {
        self.scores_budget = elements.max(1);
        self.net.set_attention_scores_budget(self.scores_budget);
    }

    /// The attention-score budget of [`CausalLm::set_attention_scores_budget`].
    pub fn attention_scores_budget(&self) -> usize {
        self.scores_budget
    }

    /// Whether training forwards cast the weights to the compute dtype.
    fn casts(&self) -> bool {
        self.mode == Mode::Train && self.compute_dtype != self.dtype
    }

    /// Shares one cast of the trainable weights among the training forwards that run while
    /// the returned guard is alive (the micro-batches of one optimizer step), where each
    /// forward would otherwise cast them again ([`CausalLm::set_compute_dtype`]: the mixed-
    /// precision cast of the master weights, one parameter-sized copy and one kernel per
    /// weight). The first forward inside makes the cast; the gradients still reach the master
    /// variables, through the shared `to_dtype` nodes, exactly as with a cast per forward.
    ///
    /// Drop the guard before the weights change (the optimizer step): a forward inside the
    /// scope does not see updates made after its cast. Nothing changes without mixed
    /// precision, or for a frozen or detached model.
    ///
    /// ```
    /// use atomrl_model::{Architecture, CausalLm, ForwardInput, ModelConfig};
    /// use candle_core::{DType, Device, Tensor};
    /// let c = ModelConfig::new(Architecture::Qwen2, 32, 16, 32, 1, 2, 1)?;
    /// let mut m = CausalLm::from_config_random(c, 0, DType::F32, &Device::Cpu)?;
    /// m.set_compute_dtype(DType::BF16)?;
    /// let micro_batches = [[1u32, 2], [3, 4]];
    /// let mut sum = Vec::new();
    /// {
    ///     let _casts = m.share_weight_casts(); // one cast for both micro-batches
    ///     for ids in micro_batches {
    ///         let ids = Tensor::new(&[ids], &Device::Cpu)?;
    ///         let logits = m.forward(&ForwardInput::new(ids), None)?;
    ///         sum.push(logits.to_dtype(DType::F32)?.sqr()?.mean_all()?.backward()?);
    ///     }
    /// } // dropped before the weights change
    /// let w = m.trainable_vars()[0].clone();
    /// assert!(sum.iter().all(|g| g.get(w.as_tensor()).is_some()));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn share_weight_casts(&self) -> SharedWeightCasts<'_> {
        self.casts.open()
    }

    /// The configuration.
    ///
    /// ```
    /// # use atomrl_model::{Architecture, CausalLm, ModelConfig};
    /// # let c = ModelConfig::new(Architecture::Qwen2, 8, 4, 4, 1, 1, 1)?;
    /// let m = CausalLm::from_config_random(c, 0, candle_core::DType::F32, &candle_core::Device::Cpu)?;
    /// assert_eq!(m.config().hidden_size, 4);
    /// # Ok::<(), atomrl_core::Error>(())
    /// ```
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The weights' (master) dtype; see [`CausalLm::compute_dtype`] for the forward's.
    ///
    /// ```
    /// # use atomrl_model::{Architecture, CausalLm, ModelConfig};
    /// # let c = ModelConfig::new(Architecture::Qwen2, 8, 4, 4, 1, 1, 1)?;
    /// let m = CausalLm::from_config_random(c, 0, candle_core::DType::F64, &candle_core::Device::Cpu)?;
    /// assert_eq!(m.dtype(), candle_core::DType::F64);
    /// # Ok::<(), atomrl_core::Error>(())
    /// ```
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The device the weights live on.
    ///
    /// ```
    /// # use atomrl_model::{Architecture, CausalLm, ModelConfig};
    /// # let c = ModelConfig::new(Architecture::Qwen2, 8, 4, 4, 1, 1, 1)?;
    /// let m = CausalLm::from_config_random(c, 0, candle_core::DType::F32, &candle_core::Device::Cpu)?;
    /// assert!(m.device().is_cpu());
    /// # Ok::<(), atomrl_core::Error>(())
    /// ```
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The folder the model was loaded from, if any (its tokenizer files are copied on save).
    ///
    /// ```
    /// # use atomrl_model::{Architecture, CausalLm, ModelConfig};
    /// # let c = ModelConfig::new(Architecture::Qwen2, 8, 4, 4, 1, 1, 1)?;
    /// let m = CausalLm::from_config_random(c, 0, candle_core::DType::F32, &candle_core::Device::Cpu)?;
    /// assert!(m.source_dir().is_none());
    /// # Ok::<(), atomrl_core::Error>(())
    /// ```
    pub fn source_dir(&self) -> Option<&Path> {
        self.source_dir.as_deref()
    }

    /// Sets the folder whose tokenizer and generation files [`CausalLm::save_hf`] copies.
    ///
    /// ```
    /// # use atomrl_model::{Architecture, CausalLm, ModelConfig};
    /// # let c = ModelConfig::new(Architecture::Qwen2, 8, 4, 4, 1, 1, 1)?;
    /// let mut m = CausalLm::from_config_random(c, 0, candle_core::DType::F32, &candle_core::Device::Cpu)?;
    /// m.set_source_dir("tokenizer/folder");
    /// assert!(m.source_dir().is_some());
    /// # Ok::<(), atomrl_core::Error>(())
    /// ```
    pub fn set_source_dir(&mut self, dir: impl Into<PathBuf>) {
        self.source_dir = Some(dir.into());
    }

    /// The base weights as a [`VarMap`] keyed by Hugging Face name (the tied LM head is
    /// `model.embed_tokens.weight`). Updating a variable in place (as optimisers do) changes
    /// the model.
    ///
    /// ```
    /// # use atomrl_model::{Architecture, CausalLm, ModelConfig};
    /// # let c = ModelConfig::new(Architecture::Qwen2, 8, 4, 4, 1, 1, 1)?;
    /// let m = CausalLm::from_config_random(c, 0, candle_core::DType::F32, &candle_core::Device::Cpu)?;
    /// assert_eq!(m.varmap().all_vars().len(), m.named_vars().len());
    /// # Ok::<(), atomrl_core::Error>(())
    /// ```
    pub fn varmap(&self) -> &VarMap {
        &self.weights
    }

    /// The base weights, sorted by Hugging Face name.
    ///
    /// ```
    /// # use atomrl_model::{Architecture, CausalLm, ModelConfig};
    /// # let c = ModelConfig::new(Architecture::Qwen2, 8, 4, 4, 1, 1, 1)?;
    /// let m = CausalLm::from_config_random(c, 0, candle_core::DType::F32, &candle_core::Device::Cpu)?;
    /// assert_eq!(m.named_vars()[0].0, "model.embed_tokens.weight");
    /// # Ok::<(), atomrl_core::Error>(())
    /// ```
    pub fn named_vars(&self) -> Vec<(String, Var)> {
        sorted_vars(&self.weights)
    }

    /// The variables an optimiser should update, sorted by name: the LoRA adapters when LoRA
    /// is attached, otherwise every base weight.
    ///
    /// ```
    /// # use atomrl_model::{Architecture, CausalLm, ModelConfig};
    /// # let c = ModelConfig::new(Architecture::Qwen2, 8, 4, 4, 1, 1, 1)?;
    /// let m = CausalLm::from_config_random(c.clone(), 0, candle_core::DType::F32, &candle_core::Device::Cpu)?;
    /// let params: usize = m.trainable_vars().iter().map(|v| v.elem_count()).sum();
    /// assert_eq!(params, c.num_parameters());
    /// # Ok::<(), atomrl_core::Error>(())
    /// ```
    pub fn trainable_vars(&self) -> Vec<Var> {
        let map = match &self.lora {
            Some(l) => &l.vars,
            None => &self.weights,
        };
        sorted_vars(map).into_iter().map(|(_, v)| v).collect()
    }

    /// The [`VarMap`] of [`CausalLm::trainable_vars`]: the LoRA adapters (PEFT names) when
    /// attached, otherwise the base weights (HF names).
    ///
    /// ```
    /// # use atomrl_model::{Architecture, CausalLm, ModelConfig, LoraConfig};
    /// # let c = ModelConfig::new(Architecture::Qwen2, 8, 4, 4, 1, 1, 1)?;
    /// let mut m = CausalLm::from_config_random(c, 0, candle_core::DType::F32, &candle_core::Device::Cpu)?;
    /// m.add_lora(LoraConfig::new(2, 2.0).with_targets(&["v_proj"])?, 0)?;
    /// assert_eq!(m.trainable_varmap().all_vars().len(), 2);
    /// # Ok::<(), atomrl_core::Error>(())
    /// ```
    pub fn trainable_varmap(&self) -> &VarMap {
        match &self.lora {
            Some(l) => &l.vars,
            None => &self.weights,
        }
    }

    /// A base weight by Hugging Face name (sharing the variable's storage).
    ///
    /// ```
    /// # use atomrl_model::{Architecture, CausalLm, ModelConfig};
    /// # let c = ModelConfig::new(Architecture::Qwen2, 8, 4, 4, 1, 1, 1)?;
    /// let m = CausalLm::from_config_random(c, 0, candle_core::DType::F32, &candle_core::Device::Cpu)?;
    /// assert_eq!(m.tensor("model.norm.weight").unwrap().dims(), &[4]);
    /// assert!(m.tensor("nope").is_none());
    /// # Ok::<(), atomrl_core::Error>(())
    /// ```
    pub fn tensor(&self, name: &str) -> Option<Tensor> {
        let data = self.weights.data().lock().ok()?;
        data.get(name).map(|v| v.as_tensor().clone())
    }

    /// Number of base parameters.
    ///
    /// ```
    /// # use atomrl_model::{Architecture, CausalLm, ModelConfig};
    /// # let c = ModelConfig::new(Architecture::Qwen2, 8, 4, 4, 1, 1, 1)?;
    /// let m = CausalLm::from_config_random(c.clone(), 0, candle_core::DType::F32, &candle_core::Device::Cpu)?;
    /// assert_eq!(m.num_parameters(), c.num_parameters());
    /// # Ok::<(), atomrl_core::Error>(())
    /// ```
    pub fn num_parameters(&self) -> usize {
        self.named_vars().iter().map(|(_, v)| v.elem_count()).sum()
    }

    /// An inference view sharing the weights' storage: every tensor is detached, so nothing it
    /// computes (KV caches included) keeps a backward graph alive. Optimiser updates of this
    /// model are visible through the view — except with a compute dtype other than the master
    /// dtype ([`CausalLm::set_compute_dtype`]), where the view holds a cast copy made now (take
    /// a new view after each update). A view of a view is the same view.
    ///
    /// ```
    /// # use atomrl_model::{Architecture, CausalLm, ModelConfig, ForwardInput};
    /// # use candle_core::{Device, Tensor};
    /// # let c = ModelConfig::new(Architecture::Qwen2, 8, 4, 4, 1, 1, 1)?;
    /// let m = CausalLm::from_config_random(c, 0, candle_core::DType::F32, &Device::Cpu)?;
    /// let ids = Tensor::new(&[[1u32, 2]], &Device::Cpu)?;
    /// let logits = m.detached().forward(&ForwardInput::new(ids), None)?;
    /// assert!(!logits.track_op());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn detached(&self) -> Self {
        if self.mode == Mode::Detached {
            return self.clone();
        }
        let mut view = self.clone();
        view.mode = Mode::Detached;
        view.train = false;
        // Rebuilding from the same variables cannot fail where building did.
        if view.rebuild().is_err() {
            return self.clone();
        }
        view
    }

    /// A deep copy of the base weights in new storage, with the same master and compute
    /// dtypes: later updates of this model do not reach it, and its outputs equal this
    /// model's now exactly (so a KL against it starts at exactly 0, whether this model was
    /// loaded from disk or built or changed in memory). Attached LoRA adapters are not
    /// copied: the copy is the base model, what TRL's reference model is (the policy with its
    /// adapter disabled).
    ///
    /// # Errors
    /// [`Error::Candle`] when the copy cannot be allocated.
    ///
    /// ```
    /// # use atomrl_model::{Architecture, CausalLm, ModelConfig, ForwardInput};
    /// # use candle_core::{Device, Tensor};
    /// # let c = ModelConfig::new(Architecture::Qwen2, 8, 4, 4, 1, 1, 1)?;
    /// let m = CausalLm::from_config_random(c, 0, candle_core::DType::F32, &Device::Cpu)?;
    /// let frozen = m.frozen_copy()?;
    /// for (_, v) in m.named_vars() {
    ///     v.set(&v.as_tensor().zeros_like()?)?; // an update of the policy...
    /// }
    /// let (name, _) = &m.named_vars()[0];
    /// assert!(frozen.tensor(name).unwrap().abs()?.sum_all()?.to_scalar::<f32>()? > 0.0); // ...does not reach the copy
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn frozen_copy(&self) -> Result<Self> {
        let tensors = self
            .named_vars()
            .into_iter()
            .map(|(name, var)| var.as_tensor().copy().map(|t| (name, t)))
            .collect::<candle_core::Result<HashMap<_, _>>>()
            .ctx("CausalLm::frozen_copy")?;
        let mut copy = Self::from_tensors(self.config.clone(), tensors, self.dtype, &self.device)?;
        copy.set_compute_dtype(self.compute_dtype())?;
        copy.set_attention_scores_budget(self.scores_budget);
        Ok(copy)
    }

    /// A [`CausalLm::detached`] view for generating. On the CPU its projections also keep
    /// transposed copies of their weights for decode steps (up to a memory bound; see
    /// [`CausalLm::generation_view_for`]). On a GPU, RMSNorm and RoPE run candle-nn's fused
    /// forward-only kernels and the attention softmax AtomRL's own (feature `cuda`; else
    /// candle-nn's): one launch instead of five to seven each, about a third of a decode step's
    /// launches. Attention multiplies the query heads of a group against their shared key/value
    /// head instead of copying the KV cache once per query head; the logits equal the detached
    /// view's up to float rounding (the same formulas, f32 inside for half precision). On the
    /// CPU the fused kernels stay off: there they were no faster for decoding
    /// (2-core machine, 2,000 forwards of a tiny model: 2.1–2.6 s with the tensor-op forms,
    /// 2.6–2.8 s with fused RMSNorm and softmax). Scoring passes (old and reference log-probs)
    /// use [`CausalLm::detached`] everywhere, which computes exactly what the training forward
    /// computes.
    ///
    /// ```
    /// # use atomrl_model::{Architecture, CausalLm, ModelConfig, ForwardInput};
    /// # use candle_core::{Device, Tensor};
    /// # let c = ModelConfig::new(Architecture::Qwen2, 8, 4, 4, 1, 1, 1)?;
    /// let m = CausalLm::from_config_random(c, 0, candle_core::DType::F32, &Device::Cpu)?;
    /// let input = ForwardInput::new(Tensor::new(&[[1u32, 2, 3]], &Device::Cpu)?);
    /// let a = m.detached().forward(&input, None)?;
    /// let b = m.generation_view().forward(&input, None)?;
    /// assert!((a - b)?.abs()?.max_all()?.to_scalar::<f32>()? < 1e-5);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn generation_view(&self) -> Self {
        self.generation_view_for(usize::MAX)
    }

    /// [`CausalLm::generation_view`] for a batch of `rows` sequences. With one, the CPU view
    /// of a model under 1 GiB of projections (`TRANSPOSED_WEIGHTS_MAX_BYTES`) keeps the plain
    /// projections: a lone sequence's decode steps multiply one row at a time, which gemm's
    /// matrix-vector path does from the weights as they are, so transposed copies would only
    /// cost their making (5 ms of a 64-token prefill at the 4m bench shape). A larger model's view computes its few-row
    /// products as `(W · xᵀ)ᵀ` whatever the batch, as that costs nothing to set up: its prompt
    /// pass gains (Qwen2.5-0.5B, one 32-token prompt: the down projection 8.5 → 1.4 ms a
    /// layer).
    ///
    /// ```
    /// # use atomrl_model::{Architecture, CausalLm, ModelConfig, ForwardInput};
    /// # use candle_core::{Device, Tensor};
    /// # let c = ModelConfig::new(Architecture::Qwen2, 8, 4, 4, 1, 1, 1)?;
    /// let m = CausalLm::from_config_random(c, 0, candle_core::DType::F32, &Device::Cpu)?;
    /// let input = ForwardInput::new(Tensor::new(&[[1u32, 2, 3]], &Device::Cpu)?);
    /// let a = m.detached().forward(&input, None)?;
    /// let b = m.generation_view_for(1).forward(&input, None)?;
    /// assert_eq!((a - b)?.abs()?.max_all()?.to_scalar::<f32>()?, 0.0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn generation_view_for(&self, rows: usize) -> Self {
        let view = self.detached();
        if !self.device.is_cpu() {
            view.with_fused_kernels()
        } else if rows > 1 || self.net.projection_bytes() > TRANSPOSED_WEIGHTS_MAX_BYTES {
            view.with_transposed_weights()
        } else {
            view
        }
    }

    /// This view with each projection's weight also kept transposed, when the copies take at
    /// most [`TRANSPOSED_WEIGHTS_MAX_BYTES`]: a decode step's products then skip gemm's copy of
    /// each weight (`linear.rs`, `TRANSPOSED_ROWS`; equal up to float rounding). The embedded
    /// GRPO run's sampling is ~20% faster (docs/performance.md, item 14). Larger models,
    /// whose copies would cost gigabytes, compute those products as `(W · xᵀ)ᵀ` instead
    /// (item 23), with no memory beyond the weights.
    fn with_transposed_weights(mut self) -> Self {
        self.net = if self.net.projection_bytes() > TRANSPOSED_WEIGHTS_MAX_BYTES {
            self.net.with_transposed_products()
        } else {
            self.net.with_transposed_weights()
        };
        self
    }

    /// This view with candle's fused RMSNorm and softmax kernels (see [`crate::ops`]).
    pub(crate) fn with_fused_kernels(mut self) -> Self {
        self.net.set_fused_kernels(true);
        self
    }

    /// The network as a static decode step runs it ([`crate::StaticDecode`]): every tensor
    /// in the compute dtype and detached (no cast or graph work per step; shared storage when
    /// already so, as in a generation view).
    pub(crate) fn static_network(&self) -> candle_core::Result<Network> {
        let dtype = self.compute_dtype;
        self.net.map(&mut |t| Ok(t.to_dtype(dtype)?.detach()))
    }

    /// Training mode: turns LoRA dropout on (default off).
    ///
    /// ```
    /// # use atomrl_model::{Architecture, CausalLm, ModelConfig};
    /// # let c = ModelConfig::new(Architecture::Qwen2, 8, 4, 4, 1, 1, 1)?;
    /// let mut m = CausalLm::from_config_random(c, 0, candle_core::DType::F32, &candle_core::Device::Cpu)?;
    /// m.set_train(true);
    /// assert!(m.is_train());
    /// # Ok::<(), atomrl_core::Error>(())
    /// ```
    pub fn set_train(&mut self, train: bool) {
        self.train = train;
    }

    /// Whether training mode is on.
    ///
    /// ```
    /// # use atomrl_model::{Architecture, CausalLm, ModelConfig};
    /// # let c = ModelConfig::new(Architecture::Qwen2, 8, 4, 4, 1, 1, 1)?;
    /// let m = CausalLm::from_config_random(c, 0, candle_core::DType::F32, &candle_core::Device::Cpu)?;
    /// assert!(!m.is_train());
    /// # Ok::<(), atomrl_core::Error>(())
    /// ```
    pub fn is_train(&self) -> bool {
        self.train
    }

    /// An empty KV cache for this model.
    ///
    /// ```
    /// # use atomrl_model::{Architecture, CausalLm, ModelConfig};
    /// # let c = ModelConfig::new(Architecture::Qwen2, 8, 4, 4, 3, 1, 1)?;
    /// let m = CausalLm::from_config_random(c, 0, candle_core::DType::F32, &candle_core::Device::Cpu)?;
    /// assert_eq!(m.new_kv_cache().layers.len(), 3);
    /// # Ok::<(), atomrl_core::Error>(())
    /// ```
    pub fn new_kv_cache(&self) -> KvCache {
        KvCache::new(self.config.num_hidden_layers)
    }

    /// Logits `[N, L, V]` for `input` (see [`ForwardInput`] for the mask and position rules).
    /// With a cache, the new keys and values are appended to it and attention covers the `P`
    /// cached positions too.
    ///
    /// # Shapes
    /// `input_ids [N, L]`, `attention_mask [N, P + L]`, `position_ids [N, L]` → `[N, L, V]`.
    ///
    /// # Errors
    /// [`Error::Shape`] for mis-shaped inputs or a cache of another batch size,
    /// [`Error::Value`] for token ids `≥ V` (naming `input_ids` and the position).
    ///
    /// ```
    /// use atomrl_model::{Architecture, CausalLm, ForwardInput, ModelConfig};
    /// use candle_core::{DType, Device, Tensor};
    /// let d = Device::Cpu;
    /// let m = CausalLm::from_config_random(ModelConfig::new(Architecture::Qwen2, 16, 8, 8, 1, 2, 1)?, 1, DType::F32, &d)?;
    /// // Left-padded prompt, then one decode step with the cache.
    /// let mut cache = m.new_kv_cache();
    /// let prompt = ForwardInput::new(Tensor::new(&[[0u32, 3, 4]], &d)?)
    ///     .with_attention_mask(Tensor::new(&[[0u32, 1, 1]], &d)?);
    /// m.forward(&prompt, Some(&mut cache))?;
    /// let step = ForwardInput::new(Tensor::new(&[[5u32]], &d)?)
    ///     .with_attention_mask(Tensor::new(&[[0u32, 1, 1, 1]], &d)?);
    /// let logits = m.forward(&step, Some(&mut cache))?;
    /// assert_eq!((logits.dims(), cache.seq_len()), (&[1, 1, 16][..], 4));
    /// let bad = ForwardInput::new(Tensor::new(&[[16u32]], &d)?);
    /// assert!(m.forward(&bad, None).unwrap_err().to_string().contains("input_ids"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn forward(&self, input: &ForwardInput, cache: Option<&mut KvCache>) -> Result<Tensor> {
        let hidden = self.forward_hidden(input, cache)?;
        self.logits(&hidden)
    }

    /// Final-normed hidden states `[N, L, H]` (the LM head's input; `[N, L - from, H]` with
    /// [`ForwardInput::with_outputs_from`]); see [`CausalLm::forward`].
    ///
    /// # Errors
    /// As [`CausalLm::forward`].
    ///
    /// ```
    /// # use atomrl_model::{Architecture, CausalLm, ModelConfig, ForwardInput};
    /// # use candle_core::{Device, Tensor};
    /// # let m = CausalLm::from_config_random(ModelConfig::new(Architecture::Qwen2, 16, 8, 8, 1, 2, 1)?, 1, candle_core::DType::F32, &Device::Cpu)?;
    /// let h = m.forward_hidden(&ForwardInput::new(Tensor::new(&[[1u32, 2]], &Device::Cpu)?), None)?;
    /// assert_eq!(h.dims(), &[1, 2, 8]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn forward_hidden(
        &self,
        input: &ForwardInput,
        mut cache: Option<&mut KvCache>,
    ) -> Result<Tensor> {
        let func = "CausalLm::forward";
        let ids = &input.input_ids;
        if ids.rank() != 2 || ids.dim(1).ctx(func)? == 0 {
            return Err(Error::shape(
                func,
                "input_ids",
                "[N, L] with L >= 1",
                ids.dims(),
            ));
        }
        if ids.dtype().is_float() {
            return Err(Error::value(
                func,
                "input_ids",
                "an integer tensor of token ids",
                format!("{:?}", ids.dtype()),
            ));
        }
        let (n, l) = ids.dims2().ctx(func)?;
        if input.outputs_from >= l {
            return Err(Error::value(
                func,
                "outputs_from",
                format!("a position below L = {l}"),
                input.outputs_from,
            ));
        }
        let ids = ids.to_dtype(DType::U32).ctx(func)?;
        {
            // Checked where the caller put them, before the upload: ids built on the host
            // (the decoder's) cost a GPU run no device-to-host copy and synchronisation.
            let _p = atomrl_core::profile::phase("host.check_input_ids", &self.device);
            check_vocab(func, "input_ids", &ids, self.config.vocab_size)?;
        }
        let ids = ids.to_device(&self.device).ctx(func)?;
        let past = match cache.as_deref_mut() {
            Some(c) => {
                if c.layers.is_empty() {
                    c.layers = vec![None; self.config.num_hidden_layers];
                }
                if c.layers.len() != self.config.num_hidden_layers {
                    return Err(Error::value(
                        func,
                        "cache",
                        format!("{} layers", self.config.num_hidden_layers),
                        format!("{} layers", c.layers.len()),
                    ));
                }
                if let Some(b) = c.batch_size().filter(|&b| b != n) {
                    return Err(Error::shape(
                        func,
                        "cache",
                        format!("batch of N = {n} rows"),
                        &[b],
                    ));
                }
                c.seq_len()
            }
            None => 0,
        };
        // The mask as the caller gave it: the bias reads its rows on the host (no device round
        // trip for a host mask); positions derived from it are computed on the device.
        let mask = input.attention_mask.as_ref();
        let positions = match (&input.position_ids, &mask) {
            (Some(p), _) => {
                if p.dims() != [n, l] {
                    return Err(Error::shape(
                        func,
                        "position_ids",
                        format!("[N, L] = [{n}, {l}]"),
                        p.dims(),
                    ));
                }
                p.to_dtype(DType::U32)
                    .and_then(|t| t.to_device(&self.device))
                    .ctx(func)?
            }
            (None, Some(m)) => {
                if m.dims() != [n, past + l] {
                    return Err(Error::shape(
                        func,
                        "attention_mask",
                        format!("[N, P + L] = [{n}, {}]", past + l),
                        m.dims(),
                    ));
                }
                position_ids_from_mask(m, l)?
                    .to_device(&self.device)
                    .ctx(func)?
            }
            (None, None) => {
                let row: Vec<u32> = (past as u32..(past + l) as u32).collect();
                Tensor::new(row, &self.device)
                    .and_then(|r| r.unsqueeze(0)?.repeat((n, 1)))
                    .ctx(func)?
            }
        };
        let dtype = self.compute_dtype;
        let bias = attention_bias(func, mask, n, l, past, dtype, &self.device)?;
        let (cos, sin) = rope_tables(
            &positions,
            self.config.head_dim,
            self.config.rope_theta,
            dtype,
        )
        .ctx(func)?;
        let cast;
        let net = if self.casts() {
            let (net, head) = self.casts.get_or_cast(|| {
                let _p = atomrl_core::profile::phase("forward.cast_weights", &self.device);
                let net = self.net.cast(dtype).ctx(func)?;
                let head = net.head_cast(dtype).ctx(func)?;
                Ok((net, head))
            })?;
            self.head_cache.set(Some(head));
            cast = net;
            &cast
        } else {
            &self.net
        };
        net.hidden(
            &ids,
            (&cos, &sin),
            &bias,
            cache,
            self.train,
            input.outputs_from,
        )
        .ctx(func)
    }

    /// Logits `[.., V]` from hidden states `[.., H]` (the LM head alone): lets callers compute
    /// logits for a slice of positions or a chunk of rows at a time.
    ///
    /// # Errors
    /// [`Error::Shape`] when the last dimension is not `H`.
    ///
    /// ```
    /// # use atomrl_model::{Architecture, CausalLm, ModelConfig};
    /// # use candle_core::{DType, Device, Tensor};
    /// # let m = CausalLm::from_config_random(ModelConfig::new(Architecture::Qwen2, 16, 8, 8, 1, 2, 1)?, 1, DType::F32, &Device::Cpu)?;
    /// let h = Tensor::zeros((3, 8), DType::F32, &Device::Cpu)?;
    /// assert_eq!(m.logits(&h)?.dims(), &[3, 16]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn logits(&self, hidden: &Tensor) -> Result<Tensor> {
        let func = "CausalLm::logits";
        if hidden.dims().last() != Some(&self.config.hidden_size) {
            return Err(Error::shape(
                func,
                "hidden",
                format!("[.., H = {}]", self.config.hidden_size),
                hidden.dims(),
            ));
        }
        if self.casts() {
            let head = match self.head_cache.get() {
                Some(head) => head,
                None => self.net.head_cast(self.compute_dtype).ctx(func)?,
            };
            let hidden = hidden.to_dtype(self.compute_dtype).ctx(func)?;
            return head.forward(&hidden, false).ctx(func);
        }
        let hidden = hidden.to_dtype(self.compute_dtype).ctx(func)?;
        self.net.logits(&hidden).ctx(func)
    }

    /// The LM head's weight `[V, H]` as [`CausalLm::logits`] applies it (`logits = h · Wᵀ`,
    /// no bias): in the compute dtype, on the graph of the trainable variable it comes from
    /// (through the mixed-precision cast, or the tied embedding), detached when frozen. For
    /// callers that fuse the head with what follows it (`atomrl-logprob` recomputes the
    /// head in backward for large vocabularies).
    ///
    /// # Errors
    /// Casting errors.
    ///
    /// ```
    /// # use atomrl_model::{Architecture, CausalLm, ModelConfig};
    /// # use candle_core::{DType, Device, Tensor};
    /// # let m = CausalLm::from_config_random(ModelConfig::new(Architecture::Qwen2, 16, 8, 8, 1, 2, 1)?, 1, DType::F32, &Device::Cpu)?;
    /// let h = Tensor::ones((3, 8), DType::F32, &Device::Cpu)?;
    /// let w = m.lm_head_weight()?;
    /// let d = (m.logits(&h)? - h.matmul(&w.t()?)?)?.abs()?.max_all()?.to_scalar::<f32>()?;
    /// assert!(d < 1e-6);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn lm_head_weight(&self) -> Result<Tensor> {
        let func = "CausalLm::lm_head_weight";
        if self.casts() {
            let head = match self.head_cache.get() {
                Some(head) => head,
                None => self.net.head_cast(self.compute_dtype).ctx(func)?,
            };
            return Ok(head.weight);
        }
        Ok(self.net.head_weight().clone())
    }

    /// Logits `[N, L, V]` of a (possibly padded) batch without a cache: shorthand for
    /// [`CausalLm::forward`] with positions from the mask.
    ///
    /// # Errors
    /// As [`CausalLm::forward`].
    ///
    /// ```
    /// # use atomrl_model::{Architecture, CausalLm, ModelConfig};
    /// # use candle_core::{DType, Device, Tensor};
    /// # let m = CausalLm::from_config_random(ModelConfig::new(Architecture::Qwen2, 16, 8, 8, 1, 2, 1)?, 1, DType::F32, &Device::Cpu)?;
    /// let ids = Tensor::new(&[[1u32, 2, 0]], &Device::Cpu)?;
    /// let mask = Tensor::new(&[[1u32, 1, 0]], &Device::Cpu)?;
    /// assert_eq!(m.forward_logits(&ids, Some(&mask))?.dims(), &[1, 3, 16]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn forward_logits(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        let mut input = ForwardInput::new(input_ids.clone());
        input.attention_mask = attention_mask.cloned();
        self.forward(&input, None)
    }
}

fn build_network(
    config: &ModelConfig,
    weights: &VarMap,
    lora: Option<&LoraState>,
    mode: Mode,
    compute: DType,
    checkpoint: bool,
) -> Result<Network> {
    let func = "CausalLm::build";
    let poisoned = |arg: &str| Error::value(func, arg, "an unpoisoned lock", "poisoned");
    let weights = weights.data().lock().map_err(|_| poisoned("weights"))?;
    let lora_guard = match lora {
        Some(l) => Some(l.vars.data().lock().map_err(|_| poisoned("lora"))?),
        None => None,
    };
    let src = Source {
        weights: &weights,
        compute,
        lora,
        lora_vars: lora_guard.as_deref(),
        frozen: lora.is_some(),
        detached: mode == Mode::Detached,
    };
    let mut net = Network::build(config, &src).map_err(|e| Error::file(WEIGHTS_FILE, e))?;
    net.checkpoint = checkpoint;
    Ok(net)
}

/// Checks that every id of `ids` (u32) is below `vocab`, naming the first offender.
pub(crate) fn check_vocab(func: &str, arg: &str, ids: &Tensor, vocab: usize) -> Result<()> {
    let flat = ids
        .flatten_all()
        .and_then(|t| t.to_vec1::<u32>())
        .ctx(func)?;
    if let Some(i) = flat.iter().position(|&x| x as usize >= vocab) {
        return Err(Error::value(
            func,
            format!("{arg}[{}]", atomrl_core::shape::unravel(i, ids.dims())),
            format!("a token id in [0, {vocab})"),
            flat[i],
        ));
    }
    Ok(())
}

pub(crate) fn sorted_vars(map: &VarMap) -> Vec<(String, Var)> {
    let Ok(data) = map.data().lock() else {
        return Vec::new();
    };
    let sorted: BTreeMap<_, _> = data.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    sorted.into_iter().collect()
}

/// A weights error of a model folder, as about `dir`'s weights file.
pub(crate) fn in_weights_file(e: Error, dir: &Path) -> Error {
    match e {
        Error::File { message, .. } => Error::file(dir.join(WEIGHTS_FILE).display(), message),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::{Architecture, ForwardInput};

    fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
        let (a, b) = (
            a.to_dtype(DType::F32).unwrap(),
            b.to_dtype(DType::F32).unwrap(),
        );
        (a - b)
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar()
            .unwrap()
    }

    /// A random model in a narrower dtype is the f64 one rounded, tensor by tensor: each
    /// tensor is cast as it is made, and its values do not depend on when.
    #[test]
    fn a_random_model_in_any_dtype_is_the_f64_one_rounded() {
        let c = ModelConfig::new(Architecture::Qwen2, 64, 16, 32, 2, 4, 2).unwrap();
        let wide = CausalLm::from_config_random(c.clone(), 5, DType::F64, &Device::Cpu).unwrap();
        for dtype in [DType::F32, DType::BF16] {
            let narrow = CausalLm::from_config_random(c.clone(), 5, dtype, &Device::Cpu).unwrap();
            let names = narrow.named_vars();
            assert_eq!(names.len(), wide.named_vars().len());
            for (name, var) in names {
                assert_eq!(var.dtype(), dtype, "{name}");
                let expected = wide.tensor(&name).unwrap().to_dtype(dtype).unwrap();
                let values = |t: &Tensor| t.to_dtype(DType::F64).unwrap().flatten_all().unwrap();
                let (a, b) = (values(var.as_tensor()), values(&expected));
                assert_eq!(
                    a.to_vec1::<f64>().unwrap(),
                    b.to_vec1::<f64>().unwrap(),
                    "{name} in {dtype:?}"
                );
            }
        }
    }

    /// The fused kernels (what a GPU generation view runs) give the tensor-op forms' logits
    /// on the CPU: full forward with padding, then cached decoding, for Qwen3 (q/k norms) in
    /// f32 and in bf16.
    #[test]
    fn fused_kernels_give_the_same_logits() {
        let mut c = ModelConfig::new(Architecture::Qwen3, 64, 32, 48, 2, 4, 2).unwrap();
        c.initializer_range = 0.2;
        for (dtype, tol) in [(DType::F32, 1e-5), (DType::BF16, 0.1)] {
            let mut m =
                CausalLm::from_config_random(c.clone(), 3, DType::F32, &Device::Cpu).unwrap();
            if dtype != DType::F32 {
                m.set_compute_dtype(dtype).unwrap();
            }
            let plain = m.detached();
            let fused = m.detached().with_fused_kernels();
            assert!(fused.net.fused && !plain.net.fused);
            let d = Device::Cpu;
            let ids = Tensor::new(&[[0u32, 5, 9, 13], [7, 8, 63, 1]], &d).unwrap();
            let mask = Tensor::new(&[[0u32, 1, 1, 1], [1, 1, 1, 1]], &d).unwrap();
            let input = ForwardInput::new(ids).with_attention_mask(mask.clone());
            let (mut ca, mut cb) = (plain.new_kv_cache(), fused.new_kv_cache());
            let a = plain.forward(&input, Some(&mut ca)).unwrap();
            let b = fused.forward(&input, Some(&mut cb)).unwrap();
            assert!(
                max_diff(&a, &b) < tol,
                "{dtype:?} prefill: {}",
                max_diff(&a, &b)
            );
            let next = Tensor::new(&[[3u32], [4]], &d).unwrap();
            let mask =
                Tensor::cat(&[&mask, &Tensor::ones((2, 1), DType::U32, &d).unwrap()], 1).unwrap();
            let step = ForwardInput::new(next).with_attention_mask(mask);
            let a = plain.forward(&step, Some(&mut ca)).unwrap();
            let b = fused.forward(&step, Some(&mut cb)).unwrap();
            assert!(
                max_diff(&a, &b) < tol,
                "{dtype:?} step: {}",
                max_diff(&a, &b)
            );
        }
        // On the CPU a generation view keeps the tensor-op forms.
        let m = CausalLm::from_config_random(c, 3, DType::F32, &Device::Cpu).unwrap();
        assert!(!m.generation_view().net.fused);
    }

    fn bits(t: &Tensor) -> Vec<u32> {
        t.flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap()
            .iter()
            .map(|x| x.to_bits())
            .collect()
    }

    /// A pass that wants the last position alone (or positions `2..`) gives the full pass's
    /// columns, fills the cache with the same keys and values bit for bit (so decoding after
    /// it is unchanged), and gives the same gradients: with q/k norms (Qwen3) and q/k/v
    /// biases (Qwen2), the tensor-op and fused forms, a left-padded batch, and gradient
    /// checkpointing. A first output position past the input is an error naming it.
    #[test]
    fn a_last_position_pass_equals_the_full_pass() {
        let d = Device::Cpu;
        let ids = Tensor::new(&[[0u32, 5, 9, 13, 2], [7, 8, 63, 1, 4]], &d).unwrap();
        let mask = Tensor::new(&[[0u32, 1, 1, 1, 1], [1, 1, 1, 1, 1]], &d).unwrap();
        let full_in = ForwardInput::new(ids).with_attention_mask(mask);
        for (from, last_in) in [
            (4, full_in.clone().with_last_position_only()),
            (2, full_in.clone().with_outputs_from(2)),
        ] {
            outputs_from_equals_the_full_pass(&full_in, &last_in, from);
        }
        let m = CausalLm::from_config_random(
            ModelConfig::new(Architecture::Qwen2, 64, 32, 48, 1, 4, 2).unwrap(),
            3,
            DType::F32,
            &d,
        )
        .unwrap();
        let e = m
            .forward_hidden(&full_in.clone().with_outputs_from(5), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("outputs_from") && e.contains("L = 5"), "{e}");
    }

    fn outputs_from_equals_the_full_pass(
        full_in: &ForwardInput,
        last_in: &ForwardInput,
        from: usize,
    ) {
        let d = Device::Cpu;
        let len = 5 - from;
        for arch in [Architecture::Qwen3, Architecture::Qwen2] {
            let mut c = ModelConfig::new(arch, 64, 32, 48, 3, 4, 2).unwrap();
            c.initializer_range = 0.2;
            c.qkv_bias = arch == Architecture::Qwen2;
            let m = CausalLm::from_config_random(c, 3, DType::F32, &d).unwrap();
            for view in [m.detached(), m.detached().with_fused_kernels()] {
                let (mut ca, mut cb) = (view.new_kv_cache(), view.new_kv_cache());
                let full = view.forward_hidden(full_in, Some(&mut ca)).unwrap();
                let last = view.forward_hidden(last_in, Some(&mut cb)).unwrap();
                assert_eq!(last.dims(), &[2, len, 32]);
                let diff = max_diff(&last, &full.narrow(1, from, len).unwrap());
                assert!(diff < 1e-5, "{arch:?}: {diff}");
                for (a, b) in ca.layers.iter().zip(&cb.layers) {
                    let ((ka, va), (kb, vb)) = (a.as_ref().unwrap(), b.as_ref().unwrap());
                    assert_eq!((bits(ka), bits(va)), (bits(kb), bits(vb)));
                }
            }
            for checkpointing in [false, true] {
                let mut m = m.clone();
                m.set_gradient_checkpointing(checkpointing);
                let full = m.forward_hidden(full_in, None).unwrap();
                let last = m.forward_hidden(last_in, None).unwrap();
                let weights = Tensor::arange(0f32, (64 * len) as f32, &d)
                    .unwrap()
                    .reshape((2, len, 32));
                let loss = |h: &Tensor| (h * weights.as_ref().unwrap()).unwrap().sum_all();
                let ga = loss(&full.narrow(1, from, len).unwrap())
                    .unwrap()
                    .backward()
                    .unwrap();
                let gb = loss(&last).unwrap().backward().unwrap();
                for v in m.trainable_vars() {
                    let (a, b) = (ga.get(v.as_tensor()), gb.get(v.as_tensor()));
                    match (a, b) {
                        (Some(a), Some(b)) => {
                            let scale = a.abs().unwrap().max_all().unwrap();
                            let scale: f32 = scale.to_scalar().unwrap();
                            let diff = max_diff(a, b) / scale.max(1.0);
                            assert!(diff < 1e-5, "{arch:?} {checkpointing}: {diff} of {scale}");
                        }
                        (a, b) => assert_eq!(a.is_some(), b.is_some()),
                    }
                }
            }
        }
    }
    #[test]
    fn attention_in_chunks_of_queries_equals_the_whole() {
        // Scores of 2 rows × 4 heads × 7 keys; budgets of 1 and 3 query rows a chunk, the
        // second not dividing the 5 queries. Left padding, a cached prompt before a
        // continuation, Qwen3 (q/k norms) and Qwen2 (q/k/v biases), checkpointing on and off.
        let d = Device::Cpu;
        let prompt = ForwardInput::new(Tensor::new(&[[0u32, 5], [7, 8]], &d).unwrap())
            .with_attention_mask(Tensor::new(&[[0u32, 1], [1, 1]], &d).unwrap());
        let ids = Tensor::new(&[[9u32, 13, 2, 3, 4], [63, 1, 4, 5, 6]], &d).unwrap();
        let mask = Tensor::new(&[[0u32, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]], &d).unwrap();
        let input = ForwardInput::new(ids).with_attention_mask(mask);
        let whole_input = {
            let ids = Tensor::cat(&[&prompt.input_ids, &input.input_ids], 1).unwrap();
            ForwardInput::new(ids).with_attention_mask(input.attention_mask.clone().unwrap())
        };
        for arch in [Architecture::Qwen3, Architecture::Qwen2] {
            let mut c = ModelConfig::new(arch, 64, 32, 48, 2, 4, 2).unwrap();
            c.initializer_range = 0.2;
            c.qkv_bias = arch == Architecture::Qwen2;
            let m = CausalLm::from_config_random(c, 3, DType::F32, &d).unwrap();
            for rows in [1, 3] {
                let mut chunked = m.clone();
                chunked.set_attention_scores_budget(2 * 4 * 7 * rows);
                // A continuation after a cached prompt (the shared-prompt scoring pass).
                let (mut ca, mut cb) = (m.new_kv_cache(), chunked.new_kv_cache());
                m.forward_hidden(&prompt, Some(&mut ca)).unwrap();
                chunked.forward_hidden(&prompt, Some(&mut cb)).unwrap();
                let a = m.forward_hidden(&input, Some(&mut ca)).unwrap();
                let b = chunked.forward_hidden(&input, Some(&mut cb)).unwrap();
                let diff = max_diff(&a, &b);
                assert!(diff < 1e-5, "{arch:?} {rows}: {diff}");
                for checkpointing in [false, true] {
                    let (mut m, mut chunked) = (m.clone(), chunked.clone());
                    m.set_gradient_checkpointing(checkpointing);
                    chunked.set_gradient_checkpointing(checkpointing);
                    let weights = Tensor::arange(0f32, (2 * 7 * 32) as f32, &d)
                        .unwrap()
                        .reshape((2, 7, 32))
                        .unwrap();
                    let loss = |m: &CausalLm| {
                        let h = m.forward_hidden(&whole_input, None).unwrap();
                        (h * &weights)
                            .unwrap()
                            .sum_all()
                            .unwrap()
                            .backward()
                            .unwrap()
                    };
                    let (ga, gb) = (loss(&m), loss(&chunked));
                    for v in m.trainable_vars() {
                        let (a, b) = (ga.get(v.as_tensor()), gb.get(v.as_tensor()));
                        let (a, b) = (a.unwrap(), b.unwrap());
                        let scale: f32 = a.abs().unwrap().max_all().unwrap().to_scalar().unwrap();
                        let diff = max_diff(a, b) / scale.max(1.0);
                        assert!(diff < 1e-5, "{arch:?} {rows} {checkpointing}: {diff}");
                    }
                }
            }
        }
    }
}
