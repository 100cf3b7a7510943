//! [`ValueModel`]: a causal LM's transformer with a scalar head — PPO's critic (the head on
//! every position, saved in the layout `transformers` reads as
//! `AutoModelForTokenClassification` with `num_labels = 1`, verl's critic) or a reward model
//! (the head read at each sequence's last token, saved as `AutoModelForSequenceClassification`,
//! TRL's `RewardTrainer`).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use atomrl_core::{CandleContext, Error, Result};
use candle_core::{DType, Device, Tensor, Var};

use crate::input::ForwardInput;
use crate::model::CausalLm;
use crate::weights::{load_safetensors_dir, load_safetensors_file, save_safetensors, WEIGHTS_FILE};

/// The LM head's name: a critic has none of its own (the backbone's is never used).
const LM_HEAD: &str = "lm_head.weight";

/// The file of a LoRA critic's unmerged adapters, beside its merged weights.
pub const CRITIC_ADAPTERS_FILE: &str = "critic_adapters.safetensors";

/// The head's weight `[1, H]` in the saved layout.
pub const SCORE_WEIGHT: &str = "score.weight";
/// The head's bias `[1]` in the saved layout.
pub const SCORE_BIAS: &str = "score.bias";

/// How much of a policy a copied critic keeps ([`ValueModel::from_policy_cut`]); `None`
/// keeps the policy's whole size, and the default keeps everything.
///
/// ```
/// let cut = atomrl_model::PolicyCut { num_layers: Some(1), ..Default::default() };
/// assert_eq!((cut.intermediate_size, cut.num_attention_heads), (None, None));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PolicyCut {
    /// The first `num_layers` decoder layers.
    pub num_layers: Option<usize>,
    /// Each MLP's first `intermediate_size` neurons.
    pub intermediate_size: Option<usize>,
    /// Each attention's first `num_attention_heads` query heads, with the key/value heads
    /// they read (the policy's query-to-key/value-head ratio is kept).
    pub num_attention_heads: Option<usize>,
}

impl PolicyCut {
    /// The cut of `num_layers` layers, `intermediate_size` neurons and `num_attention_heads`
    /// query heads (each `None`: the policy's).
    ///
    /// ```
    /// let cut = atomrl_model::PolicyCut::new(Some(1), None, Some(2));
    /// assert_eq!((cut.num_layers, cut.num_attention_heads), (Some(1), Some(2)));
    /// ```
    pub const fn new(
        num_layers: Option<usize>,
        intermediate_size: Option<usize>,
        num_attention_heads: Option<usize>,
    ) -> Self {
        Self {
            num_layers,
            intermediate_size,
            num_attention_heads,
        }
    }
}

/// A value model: the transformer of a [`CausalLm`] (its own copy of the weights, trained
/// with the critic's optimizer, or the policy's own with [`ValueModel::sharing_backbone`])
/// and a linear head `H → 1` on every position's final hidden state. `values[n, l]` is the value of the state after tokens `0..=l`.
///
/// Saved as `transformers`' token-classification layout: the transformer's weights under
/// `model.*`, the head as `score.weight [1, H]` and `score.bias [1]`, and `config.json` with
/// `architectures = ["<Arch>ForTokenClassification"]` and `num_labels = 1`
/// (`xtask/fixtures/check_critic_transformers.py` loads one in transformers and compares).
///
/// ```
/// use atomrl_model::{Architecture, CausalLm, ModelConfig, ValueModel};
/// use candle_core::{DType, Device, Tensor};
/// let d = Device::Cpu;
/// let policy = CausalLm::from_config_random(ModelConfig::new(Architecture::Qwen2, 16, 8, 8, 1, 2, 1)?, 1, DType::F32, &d)?;
/// let critic = ValueModel::from_policy(&policy)?;
/// let ids = Tensor::new(&[[1u32, 2, 3, 4]], &d)?;
/// let mask = Tensor::new(&[[1f32, 1.0, 1.0, 1.0]], &d)?;
/// // The values of the states before each of the last 2 tokens (the completion).
/// let v = critic.completion_values(&ids, &mask, 2)?;
/// assert_eq!(v.dims(), [1, 2]);
/// assert_eq!(v.to_vec2::<f32>()?, [[0.0, 0.0]]); // a fresh head predicts 0
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct ValueModel {
    backbone: CausalLm,
    weight: Var,
    /// Zero and untrained in the [`HeadLayout::Sequence`] layout (transformers' head has none).
    bias: Var,
    layout: HeadLayout,
    /// Written to the saved `config.json` (transformers' sequence classifier finds each row's
    /// last token by it).
    pad_token_id: Option<u32>,
    /// The transformer is the policy's own ([`ValueModel::sharing_backbone`]): only the head
    /// is this model's to train.
    shared: bool,
}

/// Which `transformers` head class a [`ValueModel`] is saved as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadLayout {
    /// `<Arch>ForTokenClassification` (`score.weight` and `score.bias`): a value per position,
    /// PPO's critic.
    Token,
    /// `<Arch>ForSequenceClassification` (`score.weight`, no bias, `pad_token_id` in the
    /// config): a score per sequence read at its last real token, a reward model.
    Sequence,
}

impl HeadLayout {
    /// The class-name suffix that replaces `ForCausalLM`.
    fn suffix(self) -> &'static str {
        match self {
            Self::Token => "ForTokenClassification",
            Self::Sequence => "ForSequenceClassification",
        }
    }
}

impl ValueModel {
    /// A critic starting from `policy`'s weights (copied: the two train apart), with a head of
    /// zeros, so that it first predicts 0 everywhere (verl and TRL start their critics from
    /// the policy too).
    ///
    /// # Errors
    /// Allocation failures.
    ///
    /// See [`ValueModel`] for an example.
    pub fn from_policy(policy: &CausalLm) -> Result<Self> {
        Self::from_policy_with_layout(policy, HeadLayout::Token)
    }

    /// A reward model starting from `policy`'s weights (copied) with a head of zeros, saved as
    /// `AutoModelForSequenceClassification` ([`HeadLayout::Sequence`]); TRL's `RewardTrainer`
    /// starts from the SFT model too.
    ///
    /// # Errors
    /// Allocation failures.
    ///
    /// See [`ValueModel::sequence_scores`] for an example.
    pub fn reward_model_from_policy(policy: &CausalLm) -> Result<Self> {
        Self::from_policy_with_layout(policy, HeadLayout::Sequence)
    }

    fn from_policy_with_layout(policy: &CausalLm, layout: HeadLayout) -> Result<Self> {
        Self::with_zero_head(policy.frozen_copy()?, layout)
    }

    /// A critic starting from the first `layers` decoder layers of `policy` (copied), its
    /// embeddings and final norm, with a head of zeros: a smaller critic whose forward and
    /// backward cost about `layers / L` of the policy's (OpenRLHF and verl let the critic be
    /// another, smaller model; this one needs no second checkpoint). Saved, its `config.json`
    /// says `num_hidden_layers = layers`. `layers = L` is [`ValueModel::from_policy`].
    ///
    /// # Errors
    /// `layers` of 0 or above the policy's layer count; allocation failures.
    ///
    /// ```
    /// use atomrl_model::{Architecture, CausalLm, ModelConfig, ValueModel};
    /// use candle_core::{DType, Device};
    /// let policy = CausalLm::from_config_random(ModelConfig::new(Architecture::Qwen2, 16, 8, 8, 3, 2, 1)?, 1, DType::F32, &Device::Cpu)?;
    /// let critic = ValueModel::from_policy_layers(&policy, 1)?;
    /// assert_eq!(critic.backbone().config().num_hidden_layers, 1);
    /// assert!(ValueModel::from_policy_layers(&policy, 4).is_err_and(|e| e.to_string().contains("`layers`")));
    /// # Ok::<(), atomrl_core::Error>(())
    /// ```
    pub fn from_policy_layers(policy: &CausalLm, layers: usize) -> Result<Self> {
        Self::truncated(
            policy,
            ("layers", layers),
            PolicyCut::default(),
            HeadLayout::Token,
            "ValueModel::from_policy_layers",
        )
    }

    /// A critic copied from `policy` at the size a `[critic]` table asks for: its first
    /// `num_layers` decoder layers (every one when `None`); each MLP cut to its first
    /// `intermediate_size` neurons (the first rows of `gate_proj` and `up_proj`, the first
    /// columns of `down_proj`); each attention cut to its first `num_attention_heads` query
    /// heads and the key/value heads those read (the first rows of `q_proj`, `k_proj` and
    /// `v_proj` and their biases, the first columns of `o_proj`); its embeddings and final
    /// norm whole, and a head of zeros. A cut starts as the policy's network with its later
    /// neurons or heads removed, an unranked structured pruning: the critic is retrained
    /// from the first step, so the slice is a starting point. A cut MLP costs about
    /// `intermediate_size / I` of the policy's, a cut attention about `num_attention_heads /
    /// H`. Saved, its `config.json` says the sizes (transformers loads it as any
    /// token-classification model). [`PolicyCut::default`] is [`ValueModel::from_policy`].
    ///
    /// # Errors
    /// `num_layers` outside `1..=L`, `intermediate_size` outside `1..=I`,
    /// `num_attention_heads` outside `1..=H` or not a multiple of the query heads per
    /// key/value head (the policy's), each naming its argument; allocation failures.
    ///
    /// ```
    /// use atomrl_model::{Architecture, CausalLm, ModelConfig, PolicyCut, ValueModel};
    /// use candle_core::{DType, Device};
    /// // 4 query heads over 2 key/value heads.
    /// let policy = CausalLm::from_config_random(ModelConfig::new(Architecture::Qwen2, 16, 8, 32, 3, 4, 2)?, 1, DType::F32, &Device::Cpu)?;
    /// let cut = PolicyCut::new;
    /// let critic = ValueModel::from_policy_cut(&policy, cut(Some(1), Some(8), Some(2)))?;
    /// let c = critic.backbone().config();
    /// assert_eq!((c.num_hidden_layers, c.intermediate_size), (1, 8));
    /// assert_eq!((c.num_attention_heads, c.num_key_value_heads, c.head_dim), (2, 1, 2));
    /// let wide = ValueModel::from_policy_cut(&policy, cut(None, Some(33), None));
    /// assert!(wide.is_err_and(|e| e.to_string().contains("`intermediate_size` must be in 1..=32")));
    /// let deep = ValueModel::from_policy_cut(&policy, cut(Some(4), None, None));
    /// assert!(deep.is_err_and(|e| e.to_string().contains("`num_layers` must be in 1..=3")));
    /// let odd = ValueModel::from_policy_cut(&policy, cut(None, None, Some(3)));
    /// assert!(odd.is_err_and(|e| e.to_string().contains("`num_attention_heads` must be a multiple of 2")));
    /// # Ok::<(), atomrl_core::Error>(())
    /// ```
    pub fn from_policy_cut(policy: &CausalLm, cut: PolicyCut) -> Result<Self> {
        let func = "ValueModel::from_policy_cut";
        if cut == PolicyCut::default() {
            return Self::from_policy(policy);
        }
        let total = policy.config().num_hidden_layers;
        Self::truncated(
            policy,
            ("num_layers", cut.num_layers.unwrap_or(total)),
            cut,
            HeadLayout::Token,
            func,
        )
    }

    /// A reward model starting from the first `layers` decoder layers of `policy` (copied),
    /// its embeddings and final norm, with a head of zeros ([`HeadLayout::Sequence`]): the
    /// reward-model form of [`ValueModel::from_policy_layers`], about `layers / L` of the
    /// cost of a step. `layers = L` is [`ValueModel::reward_model_from_policy`].
    ///
    /// # Errors
    /// `layers` of 0 or above the policy's layer count; allocation failures.
    ///
    /// ```
    /// use atomrl_model::{Architecture, CausalLm, HeadLayout, ModelConfig, ValueModel};
    /// use candle_core::{DType, Device};
    /// let policy = CausalLm::from_config_random(ModelConfig::new(Architecture::Qwen2, 16, 8, 8, 3, 2, 1)?, 1, DType::F32, &Device::Cpu)?;
    /// let rm = ValueModel::reward_model_from_policy_layers(&policy, 2)?;
    /// assert_eq!((rm.backbone().config().num_hidden_layers, rm.layout()), (2, HeadLayout::Sequence));
    /// assert!(ValueModel::reward_model_from_policy_layers(&policy, 0).is_err_and(|e| e.to_string().contains("`layers`")));
    /// # Ok::<(), atomrl_core::Error>(())
    /// ```
    pub fn reward_model_from_policy_layers(policy: &CausalLm, layers: usize) -> Result<Self> {
        Self::truncated(
            policy,
            ("layers", layers),
            PolicyCut::default(),
            HeadLayout::Sequence,
            "ValueModel::reward_model_from_policy_layers",
        )
    }

    /// `layers`: the argument's name in the caller's errors, and its value (`cut.num_layers`
    /// is not read).
    fn truncated(
        policy: &CausalLm,
        (layers_arg, layers): (&str, usize),
        cut: PolicyCut,
        layout: HeadLayout,
        func: &'static str,
    ) -> Result<Self> {
        let mut config = policy.config().clone();
        let total = config.num_hidden_layers;
        if layers == 0 || layers > total {
            return Err(Error::value(
                func,
                layers_arg,
                format!("in 1..={total} (the policy's decoder layers)"),
                layers,
            ));
        }
        let width = config.intermediate_size;
        if let Some(m) = cut.intermediate_size.filter(|&m| m == 0 || m > width) {
            return Err(Error::value(
                func,
                "intermediate_size",
                format!("in 1..={width} (the policy's MLP width)"),
                m,
            ));
        }
        let heads = cut
            .num_attention_heads
            .map(|h| attention_heads_kept(&config, h, func))
            .transpose()?;
        let dropped = |name: &str| {
            name.strip_prefix("model.layers.")
                .and_then(|rest| rest.split('.').next())
                .and_then(|i| i.parse::<usize>().ok())
                .is_some_and(|i| i >= layers)
        };
        let narrowed = |name: &str| {
            let mlp = cut
                .intermediate_size
                .and_then(|m| mlp_neuron_dim(name).map(|dim| (dim, m)));
            mlp.or_else(|| heads.and_then(|h| attention_head_dim(name, &config, h)))
        };
        let tensors = policy
            .named_vars()
            .into_iter()
            .filter(|(name, _)| !dropped(name))
            .map(|(name, var)| {
                let t = var.as_tensor();
                match narrowed(&name) {
                    Some((dim, len)) => t.narrow(dim, 0, len).and_then(|t| t.force_contiguous()),
                    None => t.copy(),
                }
                .map(|t| (name, t))
            })
            .collect::<candle_core::Result<HashMap<_, _>>>()
            .ctx(func)?;
        if let Some((q, kv)) = heads {
            config.num_attention_heads = q;
            config.num_key_value_heads = kv;
        }
        config.num_hidden_layers = layers;
        config.intermediate_size = cut.intermediate_size.unwrap_or(width);
        let mut backbone =
            CausalLm::from_tensors(config, tensors, policy.dtype(), policy.device())?;
        backbone.set_compute_dtype(policy.compute_dtype())?;
        backbone.set_attention_scores_budget(policy.attention_scores_budget());
        Self::with_zero_head(backbone, layout)
    }

    /// `backbone` under a zero head in `layout`.
    fn with_zero_head(backbone: CausalLm, layout: HeadLayout) -> Result<Self> {
        let func = "ValueModel::with_zero_head";
        let h = backbone.config().hidden_size;
        let zeros = |shape: &[usize]| Var::zeros(shape, DType::F32, backbone.device()).ctx(func);
        Ok(Self {
            weight: zeros(&[1, h])?,
            bias: zeros(&[1])?,
            backbone,
            layout,
            pad_token_id: None,
            shared: false,
        })
    }

    /// A critic whose transformer *is* `policy`'s (the same variables, not a copy) with a head
    /// of zeros: TRL's former `AutoModelForCausalLMWithValueHead`. Its trainable parameters
    /// are the head's alone ([`ValueModel::trainable_vars`]); the transformer learns from the
    /// value loss only where a caller adds that loss to the policy's, in one backward pass.
    /// Saved, it is a complete token-classification model (the policy's transformer and the
    /// head).
    ///
    /// # Errors
    /// Allocation failures.
    ///
    /// ```
    /// use atomrl_model::{Architecture, CausalLm, ModelConfig, ValueModel};
    /// use candle_core::{DType, Device};
    /// let policy = CausalLm::from_config_random(ModelConfig::new(Architecture::Qwen2, 16, 8, 8, 1, 2, 1)?, 1, DType::F32, &Device::Cpu)?;
    /// let critic = ValueModel::sharing_backbone(&policy)?;
    /// assert!(critic.shares_backbone());
    /// let names: Vec<String> = critic.trainable_vars().into_iter().map(|(n, _)| n).collect();
    /// assert_eq!(names, ["score.weight", "score.bias"]);
    /// # Ok::<(), atomrl_core::Error>(())
    /// ```
    pub fn sharing_backbone(policy: &CausalLm) -> Result<Self> {
        let mut critic = Self::with_zero_head(policy.clone(), HeadLayout::Token)?;
        critic.shared = true;
        Ok(critic)
    }

    /// Whether the transformer is the policy's own ([`ValueModel::sharing_backbone`]).
    pub fn shares_backbone(&self) -> bool {
        self.shared
    }

    /// A view with the same variables whose transformer builds no graph (its
    /// [`CausalLm::detached`] view): gradients of its values reach the head alone. For values
    /// that only feed advantages and returns, or a head trained on fixed features.
    ///
    /// ```
    /// use atomrl_model::{Architecture, CausalLm, ForwardInput, ModelConfig, ValueModel};
    /// use candle_core::{DType, Device, Tensor};
    /// let policy = CausalLm::from_config_random(ModelConfig::new(Architecture::Qwen2, 16, 8, 8, 1, 2, 1)?, 1, DType::F32, &Device::Cpu)?;
    /// let critic = ValueModel::from_policy(&policy)?;
    /// let input = ForwardInput::new(Tensor::new(&[[1u32, 2, 3]], &Device::Cpu)?);
    /// let v = critic.detached().values(&input)?;
    /// assert_eq!(v.to_vec2::<f32>()?, critic.values(&input)?.to_vec2::<f32>()?);
    /// let grads = v.sum_all()?.backward()?;
    /// let reached = critic.named_vars().iter().filter(|(_, x)| grads.get(x.as_tensor()).is_some()).count();
    /// assert_eq!(reached, 2); // score.weight and score.bias
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn detached(&self) -> Self {
        Self {
            backbone: self.backbone.detached(),
            weight: self.weight.clone(),
            bias: self.bias.clone(),
            layout: self.layout,
            pad_token_id: self.pad_token_id,
            shared: self.shared,
        }
    }

    /// The layout this model is saved in.
    pub fn layout(&self) -> HeadLayout {
        self.layout
    }

    /// Sets the `pad_token_id` [`ValueModel::save_hf`] writes into `config.json` (the
    /// tokenizer's: transformers' sequence classifier pools at the last token that is not it).
    pub fn set_pad_token_id(&mut self, id: u32) {
        self.pad_token_id = Some(id);
    }

    /// Loads a model saved by [`ValueModel::save_hf`] (or any `transformers` token- or
    /// sequence-classification checkpoint with one label; the `architectures` entry of its
    /// `config.json` gives the layout).
    ///
    /// # Errors
    /// [`Error::File`] for a missing folder, weight or head; a head of another shape.
    pub fn from_hf_dir(dir: impl AsRef<Path>, device: &Device) -> Result<Self> {
        let func = "ValueModel::from_hf_dir";
        let dir = dir.as_ref();
        let (config, layout) = critic_config(dir)?;
        let mut tensors: HashMap<String, Tensor> = load_safetensors_dir(dir, DType::F32, device)?;
        config
            .check_checkpoint_layers(tensors.keys().map(String::as_str))
            .map_err(|e| crate::model::in_weights_file(e, dir))?;
        let head = |t: &mut HashMap<String, Tensor>, name: &str, shape: &[usize]| {
            let x = t.remove(name).ok_or_else(|| {
                Error::file(
                    dir.join(WEIGHTS_FILE).display(),
                    format!("missing tensor `{name}`"),
                )
            })?;
            if x.dims() != shape {
                return Err(Error::file(
                    dir.join(WEIGHTS_FILE).display(),
                    format!(
                        "tensor `{name}` has shape {:?}, but a one-label head over the critic's \
                         hidden_size = {} is {shape:?}",
                        x.dims(),
                        config.hidden_size
                    ),
                ));
            }
            Var::from_tensor(&x).ctx(func)
        };
        let weight = head(&mut tensors, SCORE_WEIGHT, &[1, config.hidden_size])?;
        let bias = match layout {
            HeadLayout::Token => head(&mut tensors, SCORE_BIAS, &[1])?,
            HeadLayout::Sequence => Var::zeros(1, DType::F32, device).ctx(func)?,
        };
        if !config.tie_word_embeddings && !tensors.contains_key("lm_head.weight") {
            // A critic has no LM head; the backbone's is never used, so zeros stand in.
            let lm = Tensor::zeros((config.vocab_size, config.hidden_size), DType::F32, device)
                .ctx(func)?;
            tensors.insert("lm_head.weight".into(), lm);
        }
        let backbone = CausalLm::from_tensors(config, tensors, DType::F32, device)?;
        Ok(Self {
            backbone,
            weight,
            bias,
            layout,
            pad_token_id: None,
            shared: false,
        })
    }

    /// The value of every position, `[N, L]` f32 (the head on the final hidden states).
    ///
    /// # Errors
    /// As [`CausalLm::forward`].
    pub fn values(&self, input: &ForwardInput) -> Result<Tensor> {
        let hidden = self.backbone.forward_hidden(input, None)?;
        self.head(&hidden)
    }

    /// The head on final hidden states of the transformer: `[N, L, H] → [N, L]` (in f32).
    ///
    /// # Errors
    /// Hidden states that are not `[N, L, H]` with this critic's `H`.
    ///
    /// ```
    /// use atomrl_model::{Architecture, CausalLm, ModelConfig, ValueModel};
    /// use candle_core::{DType, Device, Tensor};
    /// let policy = CausalLm::from_config_random(ModelConfig::new(Architecture::Qwen2, 16, 8, 8, 1, 2, 1)?, 1, DType::F32, &Device::Cpu)?;
    /// let critic = ValueModel::from_policy(&policy)?;
    /// let v = critic.head(&Tensor::ones((2, 3, 8), DType::F32, &Device::Cpu)?)?;
    /// assert_eq!(v.dims(), [2, 3]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn head(&self, hidden: &Tensor) -> Result<Tensor> {
        let func = "ValueModel::head";
        let h = self.weight.as_tensor().dim(1).ctx(func)?;
        if hidden.rank() != 3 || hidden.dim(2).ctx(func)? != h {
            return Err(Error::shape(
                func,
                "hidden",
                format!("[N, L, {h}]"),
                hidden.dims(),
            ));
        }
        let hidden = hidden.to_dtype(DType::F32).ctx(func)?;
        let w = self.weight.as_tensor().t().ctx(func)?;
        hidden
            .broadcast_matmul(&w)
            .and_then(|v| v.squeeze(2))
            .and_then(|v| v.broadcast_add(self.bias.as_tensor()))
            .ctx(func)
    }

    /// The values of the states before each of the last `completion_len` tokens, `[N, T]`:
    /// position `l − 1` scores the state in which token `l` was chosen (verl's
    /// `values[:, -T - 1 : -1]`). `input_ids [N, P + T]` with `P ≥ 1`, `attention_mask` as in
    /// an [`Experience`](https://docs.rs/atomrl-rollout) (left-padded prompts).
    ///
    /// # Errors
    /// `completion_len` of 0 or not below the sequence length; as [`CausalLm::forward`].
    ///
    /// See [`ValueModel`] for an example.
    pub fn completion_values(
        &self,
        input_ids: &Tensor,
        attention_mask: &Tensor,
        completion_len: usize,
    ) -> Result<Tensor> {
        let func = "ValueModel::completion_values";
        let len = input_ids.dim(1).ctx(func)?;
        if completion_len == 0 || completion_len >= len {
            return Err(Error::value(
                func,
                "completion_len",
                format!("in 1..{len} (at least one prompt token before the completion)"),
                completion_len,
            ));
        }
        let input =
            ForwardInput::new(input_ids.clone()).with_attention_mask(attention_mask.clone());
        let all = self.values(&input)?;
        all.narrow(1, len - completion_len - 1, completion_len)
            .ctx(func)
    }

    /// Each sequence's score `[N]`: the head at its last real token (the last position whose
    /// `attention_mask` is 1), as transformers' `ForSequenceClassification` pools at the last
    /// non-pad token. `input_ids [N, L]` may be padded on both sides.
    ///
    /// # Errors
    /// A row with no real token; as [`CausalLm::forward`].
    ///
    /// ```
    /// use atomrl_model::{Architecture, CausalLm, ModelConfig, ValueModel};
    /// use candle_core::{DType, Device, Tensor};
    /// let d = Device::Cpu;
    /// let policy = CausalLm::from_config_random(ModelConfig::new(Architecture::Qwen2, 16, 8, 8, 1, 2, 1)?, 1, DType::F32, &d)?;
    /// let rm = ValueModel::reward_model_from_policy(&policy)?;
    /// let ids = Tensor::new(&[[0u32, 2, 3, 4], [5, 6, 0, 0]], &d)?;
    /// let mask = Tensor::new(&[[0f32, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0]], &d)?;
    /// assert_eq!(rm.sequence_scores(&ids, &mask)?.to_vec1::<f32>()?, [0.0, 0.0]); // a fresh head
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn sequence_scores(&self, input_ids: &Tensor, attention_mask: &Tensor) -> Result<Tensor> {
        let func = "ValueModel::sequence_scores";
        let mask: Vec<Vec<f32>> = attention_mask
            .to_dtype(DType::F32)
            .and_then(|m| m.to_vec2())
            .ctx(func)?;
        let mut last = Vec::with_capacity(mask.len());
        for (i, row) in mask.iter().enumerate() {
            let Some(l) = row.iter().rposition(|&m| m != 0.0) else {
                return Err(Error::value(
                    func,
                    format!("attention_mask[{i}]"),
                    "at least one real token",
                    "a row of padding",
                ));
            };
            last.push(l as u32);
        }
        let input =
            ForwardInput::new(input_ids.clone()).with_attention_mask(attention_mask.clone());
        let values = self.values(&input)?;
        let index = Tensor::new(last, values.device())
            .and_then(|t| t.unsqueeze(1))
            .ctx(func)?;
        values
            .gather(&index, 1)
            .and_then(|v| v.squeeze(1))
            .ctx(func)
    }

    /// Every parameter: the transformer's (without the unused LM head) and the head's
    /// (`score.weight`, and `score.bias` in the token layout), by their saved names.
    pub fn named_vars(&self) -> Vec<(String, Var)> {
        let mut vars: Vec<(String, Var)> = self
            .backbone
            .named_vars()
            .into_iter()
            .filter(|(name, _)| name != LM_HEAD)
            .collect();
        self.push_head(&mut vars);
        vars
    }

    /// The head's parameters, by their saved names.
    fn push_head(&self, vars: &mut Vec<(String, Var)>) {
        vars.push((SCORE_WEIGHT.into(), self.weight.clone()));
        if self.layout == HeadLayout::Token {
            vars.push((SCORE_BIAS.into(), self.bias.clone()));
        }
    }

    /// What the critic's optimizer trains: the head alone when the transformer is the
    /// policy's ([`ValueModel::sharing_backbone`]); with LoRA the transformer's adapters and
    /// the head; else every parameter ([`ValueModel::named_vars`]).
    ///
    /// ```
    /// use atomrl_model::{Architecture, CausalLm, LoraConfig, ModelConfig, ValueModel};
    /// use candle_core::{DType, Device};
    /// let policy = CausalLm::from_config_random(ModelConfig::new(Architecture::Qwen2, 16, 8, 8, 1, 2, 1)?, 1, DType::F32, &Device::Cpu)?;
    /// let mut critic = ValueModel::from_policy(&policy)?;
    /// let full = critic.trainable_vars().len();
    /// critic.add_lora(LoraConfig::new(2, 4.0), 0)?;
    /// // q, k, v, o adapters (A and B each) of the one layer, and the head's weight and bias.
    /// assert_eq!(critic.trainable_vars().len(), 4 * 2 + 2);
    /// assert!(full > 10);
    /// # Ok::<(), atomrl_core::Error>(())
    /// ```
    pub fn trainable_vars(&self) -> Vec<(String, Var)> {
        if self.shared {
            let mut vars = Vec::new();
            self.push_head(&mut vars);
            return vars;
        }
        if self.backbone.lora_config().is_none() {
            return self.named_vars();
        }
        let mut vars = self.backbone.lora_vars();
        self.push_head(&mut vars);
        vars
    }

    /// Attaches LoRA adapters (seeded by `seed`) to the transformer: only they and the head
    /// train from then on.
    ///
    /// # Errors
    /// As [`CausalLm::add_lora`] (adapters already attached, rank 0); a transformer shared
    /// with the policy (its adapters are the policy's).
    pub fn add_lora(&mut self, config: crate::LoraConfig, seed: u64) -> Result<()> {
        if self.shared {
            return Err(Error::value(
                "ValueModel::add_lora",
                "self",
                "a critic with a transformer of its own",
                "a head on the policy's transformer (ValueModel::sharing_backbone)",
            ));
        }
        self.backbone.add_lora(config, seed)
    }

    /// The transformer under the head.
    pub fn backbone(&self) -> &CausalLm {
        &self.backbone
    }

    /// Saves the model to `dir` in its `transformers` layout (see [`ValueModel`] and
    /// [`HeadLayout`]), in f32, with LoRA adapters merged; a critic with adapters also writes
    /// them unmerged to [`CRITIC_ADAPTERS_FILE`], which [`ValueModel::load_trainable`] reads
    /// back.
    ///
    /// # Errors
    /// I/O failures.
    pub fn save_hf(&self, dir: impl AsRef<Path>) -> Result<()> {
        let dir = dir.as_ref();
        let mut weights: BTreeMap<String, Tensor> = self.backbone.merged_weights()?;
        weights.remove(LM_HEAD);
        let mut head = Vec::new();
        self.push_head(&mut head);
        weights.extend(head.into_iter().map(|(n, v)| (n, v.as_detached_tensor())));
        self.backbone.save_hf_folder(dir, &weights, DType::F32)?;
        if self.backbone.lora_config().is_some() {
            let adapters: BTreeMap<String, Tensor> = self
                .backbone
                .lora_vars()
                .into_iter()
                .map(|(n, v)| (n, v.as_detached_tensor()))
                .collect();
            save_safetensors(&adapters, dir.join(CRITIC_ADAPTERS_FILE), DType::F32)?;
        }
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|e| Error::file(path.display(), e))?;
        let mut config: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| Error::file(path.display(), e))?;
        let arch = config["architectures"][0]
            .as_str()
            .unwrap_or("Qwen2ForCausalLM")
            .replace("ForCausalLM", self.layout.suffix());
        config["architectures"] = serde_json::json!([arch]);
        config["num_labels"] = 1.into();
        if let Some(pad) = self.pad_token_id {
            config["pad_token_id"] = pad.into();
        }
        config["id2label"] = serde_json::json!({"0": "LABEL_0"});
        config["label2id"] = serde_json::json!({"LABEL_0": 0});
        let text =
            serde_json::to_string_pretty(&config).map_err(|e| Error::file(path.display(), e))?;
        std::fs::write(&path, text).map_err(|e| Error::file(path.display(), e))
    }

    /// Sets the trainable parameters ([`ValueModel::trainable_vars`]), in place, to those
    /// [`ValueModel::save_hf`] wrote to `dir`: resuming a run, whose critic optimizer holds
    /// these very variables.
    ///
    /// # Errors
    /// [`Error::File`] for unreadable files or a parameter they lack; a shape that differs.
    ///
    /// ```
    /// use atomrl_model::{Architecture, CausalLm, ModelConfig, ValueModel};
    /// use candle_core::{DType, Device, Tensor};
    /// let policy = CausalLm::from_config_random(ModelConfig::new(Architecture::Qwen2, 16, 8, 8, 1, 2, 1)?, 1, DType::F32, &Device::Cpu)?;
    /// let saved = ValueModel::from_policy(&policy)?;
    /// let (_, bias) = saved.named_vars().pop().unwrap();
    /// bias.set(&Tensor::new(&[0.5f32], &Device::Cpu)?)?;
    /// let dir = std::env::temp_dir().join("atomrl_value_doctest_load_trainable");
    /// saved.save_hf(&dir)?;
    /// let critic = ValueModel::from_policy(&policy)?;
    /// critic.load_trainable(&dir)?;
    /// let (_, b) = critic.named_vars().pop().unwrap();
    /// assert_eq!(b.as_tensor().to_vec1::<f32>()?, [0.5]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn load_trainable(&self, dir: impl AsRef<Path>) -> Result<()> {
        let func = "ValueModel::load_trainable";
        let dir = dir.as_ref();
        let mut weights = load_safetensors_file(dir.join(WEIGHTS_FILE), DType::F32, self.device())?;
        if self.backbone.lora_config().is_some() {
            let path = dir.join(CRITIC_ADAPTERS_FILE);
            weights.extend(load_safetensors_file(&path, DType::F32, self.device())?);
        }
        for (name, var) in self.trainable_vars() {
            let t = weights.get(&name).ok_or_else(|| {
                Error::file(dir.display(), format!("the critic lacks weight `{name}`"))
            })?;
            let t = t.to_dtype(var.dtype()).ctx(func)?;
            var.set(&t).ctx(func)?;
        }
        Ok(())
    }

    /// Sets the compute dtype of the transformer's forward and backward (the head and the
    /// values stay f32), as [`CausalLm::set_compute_dtype`].
    ///
    /// # Errors
    /// As [`CausalLm::set_compute_dtype`].
    pub fn set_compute_dtype(&mut self, dtype: DType) -> Result<()> {
        self.backbone.set_compute_dtype(dtype)
    }

    /// Gradient checkpointing of the transformer, as [`CausalLm::set_gradient_checkpointing`].
    pub fn set_gradient_checkpointing(&mut self, on: bool) {
        self.backbone.set_gradient_checkpointing(on);
    }

    /// The transformer's attention-score budget, as
    /// [`CausalLm::set_attention_scores_budget`].
    ///
    /// ```
    /// # use atomrl_model::{Architecture, CausalLm, ModelConfig, ValueModel};
    /// # let c = ModelConfig::new(Architecture::Qwen2, 16, 8, 8, 1, 2, 1)?;
    /// # let policy = CausalLm::from_config_random(c, 0, candle_core::DType::F32, &candle_core::Device::Cpu)?;
    /// let mut critic = ValueModel::from_policy(&policy)?;
    /// critic.set_attention_scores_budget(1 << 20);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_attention_scores_budget(&mut self, elements: usize) {
        self.backbone.set_attention_scores_budget(elements);
    }

    /// The device the critic is on.
    pub fn device(&self) -> &Device {
        self.backbone.device()
    }
}

/// The query and key/value heads a cut to `heads` query heads keeps: `heads` must be a
/// multiple of the policy's query heads per key/value head, so that each kept query head
/// reads the key/value head it read in the policy.
fn attention_heads_kept(
    config: &crate::ModelConfig,
    heads: usize,
    func: &'static str,
) -> Result<(usize, usize)> {
    let (h, kv) = (config.num_attention_heads, config.num_key_value_heads);
    let group = (h / kv.max(1)).max(1);
    if heads == 0 || heads > h || heads % group != 0 {
        return Err(Error::value(
            func,
            "num_attention_heads",
            format!(
                "a multiple of {group} in 1..={h} (the policy's query heads, {group} per key/value head)"
            ),
            heads,
        ));
    }
    Ok((heads, heads / group))
}

/// The dimension of an attention projection's tensor that indexes heads, and how much of it
/// a cut to `(query, key/value)` heads keeps (`None`: not a projection with heads on an axis;
/// `o_proj`'s bias, per hidden unit, stays whole).
fn attention_head_dim(
    name: &str,
    config: &crate::ModelConfig,
    (q, kv): (usize, usize),
) -> Option<(usize, usize)> {
    let d = config.head_dim;
    match name.rsplit_once(".self_attn.")?.1 {
        "q_proj.weight" | "q_proj.bias" => Some((0, q * d)),
        "k_proj.weight" | "k_proj.bias" | "v_proj.weight" | "v_proj.bias" => Some((0, kv * d)),
        "o_proj.weight" => Some((1, q * d)),
        _ => None,
    }
}

/// The dimension that indexes an MLP's neurons in the weight `name`: the rows of `gate_proj`
/// and `up_proj`, the columns of `down_proj`; `None` for every other weight (LoRA adapters
/// are added after the cut, so none is among them).
fn mlp_neuron_dim(name: &str) -> Option<usize> {
    if name.ends_with(".mlp.gate_proj.weight") || name.ends_with(".mlp.up_proj.weight") {
        Some(0)
    } else if name.ends_with(".mlp.down_proj.weight") {
        Some(1)
    } else {
        None
    }
}

/// The backbone's configuration of the model in `dir` (its `config.json` read as the causal
/// LM of the same architecture: `Qwen2ForTokenClassification` → `Qwen2ForCausalLM`) and the
/// head layout its class names.
fn critic_config(dir: &Path) -> Result<(crate::ModelConfig, HeadLayout)> {
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path).map_err(|e| Error::file(path.display(), e))?;
    let mut json: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| Error::file(path.display(), e))?;
    let mut layout = HeadLayout::Token;
    if let Some(archs) = json["architectures"].as_array_mut() {
        for a in archs.iter_mut() {
            if let Some(name) = a.as_str() {
                if name.ends_with(HeadLayout::Sequence.suffix()) {
                    layout = HeadLayout::Sequence;
                }
                *a = name
                    .replace(HeadLayout::Token.suffix(), "ForCausalLM")
                    .replace(HeadLayout::Sequence.suffix(), "ForCausalLM")
                    .into();
            }
        }
    }
    let config = crate::ModelConfig::from_json(&json).map_err(|e| match e {
        Error::File { message, .. } => Error::file(path.display(), message),
        other => other,
    })?;
    Ok((config, layout))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Architecture, ModelConfig};

    fn policy() -> CausalLm {
        let c = ModelConfig::new(Architecture::Qwen2, 16, 8, 8, 1, 2, 1).unwrap();
        CausalLm::from_config_random(c, 3, DType::F32, &Device::Cpu).unwrap()
    }

    #[test]
    fn the_head_and_the_backbone_learn_and_the_policy_does_not_move() {
        let p = policy();
        let critic = ValueModel::from_policy(&p).unwrap();
        critic
            .weight
            .set(&Tensor::ones((1, 8), DType::F32, &Device::Cpu).unwrap())
            .unwrap();
        let ids = Tensor::new(&[[1u32, 2, 3]], &Device::Cpu).unwrap();
        let v = critic.values(&ForwardInput::new(ids)).unwrap();
        let loss = v.sqr().unwrap().sum_all().unwrap();
        let grads = loss.backward().unwrap();
        let named = critic.named_vars();
        let with_grad = named
            .iter()
            .filter(|(_, var)| grads.get(var.as_tensor()).is_some())
            .count();
        assert!(with_grad > 3, "only {with_grad} parameters have a gradient");
        // The copy is the critic's own: the policy's variables are not in the graph.
        assert!(p
            .named_vars()
            .iter()
            .all(|(_, var)| grads.get(var.as_tensor()).is_none()));
    }

    /// `m`'s values on `input` under the head weight `w` (bias 0), flattened.
    fn head_values(m: &ValueModel, w: &Tensor, input: &ForwardInput) -> Vec<f32> {
        m.weight.set(w).unwrap();
        m.values(input)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap()
    }

    /// A critic from the first `k` of 3 layers computes what the policy's first `k` layers
    /// and final norm compute (the head on those states), holds no weight of the later
    /// layers, and saves and loads back with `num_hidden_layers = k` and the same values;
    /// `k = 3` is the whole copy.
    #[test]
    fn a_critic_from_the_first_layers_is_the_policy_cut_there() {
        let c = ModelConfig::new(Architecture::Qwen2, 16, 8, 8, 3, 2, 1).unwrap();
        let p = CausalLm::from_config_random(c.clone(), 4, DType::F32, &Device::Cpu).unwrap();
        let ids = Tensor::new(&[[1u32, 2, 3, 4]], &Device::Cpu).unwrap();
        let input = ForwardInput::new(ids);
        let w: Vec<f32> = (0..8).map(|i| (i as f32 - 3.5) / 4.0).collect();
        let w = Tensor::from_vec(w, (1, 8), &Device::Cpu).unwrap();
        let values = |m: &ValueModel| head_values(m, &w, &input);
        let whole = values(&ValueModel::from_policy(&p).unwrap());
        assert_eq!(
            values(&ValueModel::from_policy_layers(&p, 3).unwrap()),
            whole
        );

        let cut = ValueModel::from_policy_layers(&p, 1).unwrap();
        let names: Vec<String> = cut.named_vars().into_iter().map(|(n, _)| n).collect();
        assert!(names.iter().any(|n| n.starts_with("model.layers.0.")));
        assert!(!names.iter().any(|n| n.starts_with("model.layers.1.")));
        // The same states by hand: the policy's weights with two layers dropped.
        let mut one = c.clone();
        one.num_hidden_layers = 1;
        let tensors = p
            .named_vars()
            .into_iter()
            .filter(|(n, _)| !n.starts_with("model.layers.1.") && !n.starts_with("model.layers.2."))
            .map(|(n, v)| (n, v.as_tensor().clone()))
            .collect();
        let by_hand = CausalLm::from_tensors(one, tensors, DType::F32, &Device::Cpu).unwrap();
        let hidden = by_hand.forward_hidden(&input, None).unwrap();
        let want: Vec<f32> = hidden
            .broadcast_matmul(&w.t().unwrap())
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let got = values(&cut);
        assert_ne!(got, whole);
        assert!(got.iter().zip(&want).all(|(a, b)| (a - b).abs() < 1e-6));

        let dir = std::env::temp_dir().join(format!("atomrl-cut-critic-{}", std::process::id()));
        cut.save_hf(&dir).unwrap();
        let back = ValueModel::from_hf_dir(&dir, &Device::Cpu).unwrap();
        assert_eq!(back.backbone().config().num_hidden_layers, 1);
        assert_eq!(values(&back), got);
        let _ = std::fs::remove_dir_all(&dir);
        for bad in [0, 4] {
            let e = ValueModel::from_policy_layers(&p, bad)
                .err()
                .unwrap()
                .to_string();
            assert!(e.contains("`layers`") && e.contains("1..=3"), "{e}");
        }
    }

    /// `p` with every tensor whose name `zeroed` maps to `(dim, keep)` zero past its first
    /// `keep` entries along `dim`: the policy with those neurons or heads silenced.
    fn silenced(p: &CausalLm, zeroed: impl Fn(&str) -> Option<(usize, usize)>) -> CausalLm {
        let tensors = p
            .named_vars()
            .into_iter()
            .map(|(n, v)| {
                let t = v.as_tensor();
                let t = match zeroed(&n) {
                    Some((dim, keep)) => {
                        let kept = t.narrow(dim, 0, keep).unwrap();
                        let rest = t.narrow(dim, keep, t.dim(dim).unwrap() - keep).unwrap();
                        Tensor::cat(&[&kept, &rest.zeros_like().unwrap()], dim).unwrap()
                    }
                    None => t.copy().unwrap(),
                };
                (n, t)
            })
            .collect();
        CausalLm::from_tensors(p.config().clone(), tensors, DType::F32, &Device::Cpu).unwrap()
    }

    /// `m` saved in transformers' layout and loaded back (a temporary folder named `name`).
    fn saved_and_loaded(m: &ValueModel, name: &str) -> ValueModel {
        let dir = std::env::temp_dir().join(format!("atomrl-{name}-{}", std::process::id()));
        m.save_hf(&dir).unwrap();
        let back = ValueModel::from_hf_dir(&dir, &Device::Cpu).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        back
    }

    /// The error of a cut of `p` that must fail.
    fn cut_error(p: &CausalLm, cut: PolicyCut) -> String {
        ValueModel::from_policy_cut(p, cut)
            .err()
            .unwrap()
            .to_string()
    }

    /// A critic whose MLPs keep the first `m` neurons computes what the policy computes with
    /// its other neurons silenced (their gate and up rows zero: SwiGLU gives 0 there, so
    /// `down_proj` adds nothing from them); it saves and loads back with `intermediate_size =
    /// m`, and a width of 0 or past the policy's is an error naming it.
    #[test]
    fn a_narrowed_critic_is_the_policy_with_its_later_neurons_silenced() {
        let c = ModelConfig::new(Architecture::Qwen2, 16, 8, 12, 3, 2, 1).unwrap();
        let p = CausalLm::from_config_random(c.clone(), 5, DType::F32, &Device::Cpu).unwrap();
        let ids = Tensor::new(&[[1u32, 2, 3, 4, 5]], &Device::Cpu).unwrap();
        let input = ForwardInput::new(ids);
        let w: Vec<f32> = (0..8).map(|i| (i as f32 - 3.5) / 4.0).collect();
        let w = Tensor::from_vec(w, (1, 8), &Device::Cpu).unwrap();
        let values = |m: &ValueModel| head_values(m, &w, &input);
        let (m, layers) = (5, 2);
        let silenced = silenced(&p, |n| {
            (n.ends_with("mlp.gate_proj.weight") || n.ends_with("mlp.up_proj.weight"))
                .then_some((0, m))
        });
        let want = values(&ValueModel::from_policy_layers(&silenced, layers).unwrap());
        let narrow =
            ValueModel::from_policy_cut(&p, PolicyCut::new(Some(layers), Some(m), None)).unwrap();
        let got = values(&narrow);
        assert!(
            got.iter().zip(&want).all(|(a, b)| (a - b).abs() < 1e-6),
            "{got:?} against {want:?}"
        );
        // The cut is real: the whole policy's first layers give other values.
        let whole = values(&ValueModel::from_policy_layers(&p, layers).unwrap());
        assert!(got.iter().zip(&whole).any(|(a, b)| (a - b).abs() > 1e-4));
        let shapes: Vec<Vec<usize>> = narrow
            .named_vars()
            .into_iter()
            .filter(|(n, _)| n.starts_with("model.layers.1.mlp."))
            .map(|(_, v)| v.as_tensor().dims().to_vec())
            .collect();
        assert_eq!(shapes.len(), 3);
        assert!(shapes.iter().all(|s| s.contains(&m) && !s.contains(&12)));

        let back = saved_and_loaded(&narrow, "narrow-critic");
        let bc = back.backbone().config();
        assert_eq!((bc.num_hidden_layers, bc.intermediate_size), (layers, m));
        assert_eq!(values(&back), got);
        for bad in [0, 13] {
            let e = cut_error(&p, PolicyCut::new(Some(1), Some(bad), None));
            assert!(
                e.contains("`intermediate_size`") && e.contains("1..=12"),
                "{e}"
            );
        }
    }

    /// A critic whose attentions keep the first query heads (and the key/value heads they
    /// read) computes what the policy computes with its later heads silenced (their columns
    /// of `o_proj` zero); it saves and loads back with the cut head counts, and a count that
    /// splits a key/value group is an error naming it.
    #[test]
    fn a_critic_with_fewer_heads_is_the_policy_with_its_later_heads_silenced() {
        // Qwen2 (q/k/v biases), 4 query heads of width 2 over 2 key/value heads.
        let c = ModelConfig::new(Architecture::Qwen2, 16, 8, 12, 3, 4, 2).unwrap();
        let p = CausalLm::from_config_random(c.clone(), 9, DType::F32, &Device::Cpu).unwrap();
        let ids = Tensor::new(&[[1u32, 2, 3, 4, 5, 6]], &Device::Cpu).unwrap();
        let input = ForwardInput::new(ids);
        let w: Vec<f32> = (0..8).map(|i| (i as f32 - 3.5) / 4.0).collect();
        let w = Tensor::from_vec(w, (1, 8), &Device::Cpu).unwrap();
        let values = |m: &ValueModel| head_values(m, &w, &input);
        let (heads, layers) = (2, 2);
        let silenced = silenced(&p, |n| {
            n.ends_with("self_attn.o_proj.weight")
                .then_some((1, heads * 2))
        });
        let want = values(&ValueModel::from_policy_layers(&silenced, layers).unwrap());
        let cut = |h| PolicyCut::new(Some(layers), None, Some(h));
        let narrow = ValueModel::from_policy_cut(&p, cut(heads)).unwrap();
        let got = values(&narrow);
        assert!(
            got.iter().zip(&want).all(|(a, b)| (a - b).abs() < 1e-6),
            "{got:?} against {want:?}"
        );
        let whole = values(&ValueModel::from_policy_layers(&p, layers).unwrap());
        assert!(got.iter().zip(&whole).any(|(a, b)| (a - b).abs() > 1e-4));
        let shapes: BTreeMap<String, Vec<usize>> = narrow
            .named_vars()
            .into_iter()
            .filter_map(|(n, v)| {
                let rest = n.strip_prefix("model.layers.1.self_attn.")?.to_string();
                Some((rest, v.as_tensor().dims().to_vec()))
            })
            .collect();
        let want_shapes = [
            ("k_proj.bias", vec![2]),
            ("k_proj.weight", vec![2, 8]),
            ("o_proj.weight", vec![8, 4]),
            ("q_proj.bias", vec![4]),
            ("q_proj.weight", vec![4, 8]),
            ("v_proj.bias", vec![2]),
            ("v_proj.weight", vec![2, 8]),
        ];
        let want_shapes: BTreeMap<String, Vec<usize>> = want_shapes
            .into_iter()
            .map(|(n, s)| (n.to_string(), s))
            .collect();
        assert_eq!(shapes, want_shapes);

        let back = saved_and_loaded(&narrow, "head-cut-critic");
        let bc = back.backbone().config();
        assert_eq!(
            (bc.num_attention_heads, bc.num_key_value_heads, bc.head_dim),
            (2, 1, 2)
        );
        assert_eq!(values(&back), got);
        for bad in [0, 1, 3, 6] {
            let e = cut_error(&p, cut(bad));
            assert!(
                e.contains("`num_attention_heads`") && e.contains("a multiple of 2 in 1..=4"),
                "{e}"
            );
        }
    }

    /// Writes a reward model and its scores for
    /// `xtask/fixtures/check_reward_model_transformers.py` (ignored: run by hand where
    /// transformers is installed).
    #[test]
    #[ignore]
    fn write_reward_model_for_transformers() {
        let dir = std::path::PathBuf::from("/tmp/atomrl-reward-model-check");
        let model_dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/fixtures/reference/models/tiny-qwen2"
        );
        let p = CausalLm::from_hf_dir(model_dir, DType::F32, &Device::Cpu).unwrap();
        let mut rm = ValueModel::reward_model_from_policy(&p).unwrap();
        rm.set_pad_token_id(0);
        let h = p.config().hidden_size;
        let w: Vec<f32> = (0..h).map(|i| ((i * 5 % 13) as f32 - 6.0) / 10.0).collect();
        rm.weight
            .set(&Tensor::from_vec(w, (1, h), &Device::Cpu).unwrap())
            .unwrap();
        rm.save_hf(&dir).unwrap();
        // Right-padded rows (transformers pools at the last token that is not the pad id).
        let ids = vec![vec![5u32, 9, 17, 33, 0, 0], vec![4, 8, 15, 16, 23, 42]];
        let mask = vec![vec![1f32, 1.0, 1.0, 1.0, 0.0, 0.0], vec![1.0; 6]];
        let scores: Vec<f32> = rm
            .sequence_scores(
                &Tensor::new(ids.clone(), &Device::Cpu).unwrap(),
                &Tensor::new(mask.clone(), &Device::Cpu).unwrap(),
            )
            .unwrap()
            .to_vec1()
            .unwrap();
        let case = serde_json::json!({"input_ids": ids, "attention_mask": mask, "scores": scores});
        std::fs::write(dir.join("scores.json"), case.to_string()).unwrap();
    }

    /// A reward model saved in the sequence-classification layout (no bias, the pad id in its
    /// config) loads back with the same scores, which read each row's last real token.
    #[test]
    fn reward_models_save_as_sequence_classifiers_and_score_the_last_token() {
        let p = policy();
        let mut rm = ValueModel::reward_model_from_policy(&p).unwrap();
        rm.set_pad_token_id(7);
        let h = p.config().hidden_size;
        let w: Vec<f32> = (0..h).map(|i| (i as f32 - 3.0) / 7.0).collect();
        rm.weight
            .set(&Tensor::from_vec(w, (1, h), &Device::Cpu).unwrap())
            .unwrap();
        assert_eq!(rm.trainable_vars().last().unwrap().0, SCORE_WEIGHT);
        assert!(rm.named_vars().iter().all(|(n, _)| n != SCORE_BIAS));
        let d = Device::Cpu;
        let ids = Tensor::new(&[[0u32, 2, 3, 4], [5, 6, 7, 7]], &d).unwrap();
        let mask = Tensor::new(&[[0f32, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0]], &d).unwrap();
        let scores: Vec<f32> = rm.sequence_scores(&ids, &mask).unwrap().to_vec1().unwrap();
        let all: Vec<Vec<f32>> = rm
            .values(&ForwardInput::new(ids.clone()).with_attention_mask(mask.clone()))
            .unwrap()
            .to_vec2()
            .unwrap();
        assert_eq!(scores, [all[0][3], all[1][1]]);
        let dir = std::env::temp_dir().join(format!("atomrl-rm-{}", std::process::id()));
        rm.save_hf(&dir).unwrap();
        let config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap())
                .unwrap();
        assert_eq!(config["architectures"][0], "Qwen2ForSequenceClassification");
        assert_eq!(
            (
                config["num_labels"].as_u64(),
                config["pad_token_id"].as_u64()
            ),
            (Some(1), Some(7))
        );
        let back = ValueModel::from_hf_dir(&dir, &d).unwrap();
        assert_eq!(back.layout(), HeadLayout::Sequence);
        let again: Vec<f32> = back
            .sequence_scores(&ids, &mask)
            .unwrap()
            .to_vec1()
            .unwrap();
        assert_eq!(again, scores);
        let _ = std::fs::remove_dir_all(&dir);
        let err = rm
            .sequence_scores(&ids, &Tensor::zeros((2, 4), DType::F32, &d).unwrap())
            .unwrap_err()
            .to_string();
        assert!(err.contains("attention_mask[0]"), "{err}");
    }

    /// Writes a critic and its values for `xtask/fixtures/check_critic_transformers.py`
    /// (ignored: run by hand where transformers is installed).
    #[test]
    #[ignore]
    fn write_critic_for_transformers() {
        let dir = std::path::PathBuf::from("/tmp/atomrl-critic-check");
        let model_dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/fixtures/reference/models/tiny-qwen2"
        );
        let p = CausalLm::from_hf_dir(model_dir, DType::F32, &Device::Cpu).unwrap();
        let critic = ValueModel::from_policy(&p).unwrap();
        let h = p.config().hidden_size;
        let w: Vec<f32> = (0..h).map(|i| ((i * 7 % 11) as f32 - 5.0) / 10.0).collect();
        critic
            .weight
            .set(&Tensor::from_vec(w, (1, h), &Device::Cpu).unwrap())
            .unwrap();
        critic
            .bias
            .set(&Tensor::new(&[0.3f32], &Device::Cpu).unwrap())
            .unwrap();
        critic.save_hf(&dir).unwrap();
        let ids = vec![vec![0u32, 0, 5, 9, 17, 33], vec![4, 8, 15, 16, 23, 42]];
        let mask = vec![vec![0f32, 0.0, 1.0, 1.0, 1.0, 1.0], vec![1.0; 6]];
        let input = ForwardInput::new(Tensor::new(ids.clone(), &Device::Cpu).unwrap())
            .with_attention_mask(Tensor::new(mask.clone(), &Device::Cpu).unwrap());
        let values: Vec<Vec<f32>> = critic.values(&input).unwrap().to_vec2().unwrap();
        let case = serde_json::json!({"input_ids": ids, "attention_mask": mask, "values": values});
        std::fs::write(dir.join("values.json"), case.to_string()).unwrap();
    }

    #[test]
    fn saved_critics_load_back_with_the_same_values() {
        let critic = ValueModel::from_policy(&policy()).unwrap();
        critic
            .weight
            .set(
                &Tensor::new(
                    &[[0.5f32, -0.25, 1.0, 0.0, 0.1, 0.2, -0.3, 0.4]],
                    &Device::Cpu,
                )
                .unwrap(),
            )
            .unwrap();
        critic
            .bias
            .set(&Tensor::new(&[0.7f32], &Device::Cpu).unwrap())
            .unwrap();
        let dir = std::env::temp_dir().join(format!("atomrl-critic-{}", std::process::id()));
        critic.save_hf(&dir).unwrap();
        let config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap())
                .unwrap();
        assert_eq!(config["architectures"][0], "Qwen2ForTokenClassification");
        assert_eq!(config["num_labels"], 1);
        let names = crate::weights::load_safetensors_dir(&dir, DType::F32, &Device::Cpu).unwrap();
        assert!(names.contains_key(SCORE_WEIGHT) && !names.contains_key("lm_head.weight"));
        let back = ValueModel::from_hf_dir(&dir, &Device::Cpu).unwrap();
        let ids = Tensor::new(&[[0u32, 4, 5, 6]], &Device::Cpu).unwrap();
        let mask = Tensor::new(&[[0f32, 1.0, 1.0, 1.0]], &Device::Cpu).unwrap();
        let a = critic.completion_values(&ids, &mask, 2).unwrap();
        let b = back.completion_values(&ids, &mask, 2).unwrap();
        assert_eq!(a.to_vec2::<f32>().unwrap(), b.to_vec2::<f32>().unwrap());
        assert!(critic.completion_values(&ids, &mask, 4).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
