//! The settings of the actor-critic recipes (`ppo`, `a2c`, `trpo`): the critic and GAE
//! (`[critic]`), where the KL goes, and TRPO's trust region (`[trpo]`).

use serde::{Deserialize, Serialize};

/// The critic of `ppo`, `a2c` and `trpo` (`[critic]`), with TRL's `PPOConfig` defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CriticArgs {
    /// The critic's learning rate (its own AdamW; required: verl's `critic.optim.lr` has no
    /// sensible default shared with the actor's).
    pub lr: Option<f64>,
    /// The critic's starting weights: a folder `ValueModel::save_hf` (or transformers'
    /// `AutoModelForTokenClassification`, `num_labels = 1`) wrote. Absent: a copy of the
    /// policy's transformer with a zero head.
    #[serde(default)]
    pub model: Option<String>,
    /// Start the critic from the policy's first `num_layers` decoder layers (its embeddings
    /// and final norm, a zero head): a smaller critic, about `num_layers / L` of the policy's
    /// cost per forward and backward. Absent: every layer.
    #[serde(default)]
    pub num_layers: Option<usize>,
    /// Start each of the critic's MLPs from the policy's first `intermediate_size` neurons
    /// (the first rows of `gate_proj` and `up_proj`, the first columns of `down_proj`): a
    /// narrower critic whose MLPs cost about `intermediate_size / I` of the policy's, saved
    /// with that `intermediate_size`. With `num_layers` or alone. Absent: the policy's width.
    #[serde(default)]
    pub intermediate_size: Option<usize>,
    /// Start each of the critic's attentions from the policy's first `num_attention_heads`
    /// query heads and the key/value heads they read (a multiple of the policy's query heads
    /// per key/value head): a critic whose attention costs about `num_attention_heads / H` of
    /// the policy's, saved with those head counts. With the other cuts or alone. Absent: every
    /// head.
    #[serde(default)]
    pub num_attention_heads: Option<usize>,
    /// The value head reads the policy's own final hidden states (one transformer, TRL's
    /// former `AutoModelForCausalLMWithValueHead`, trlx): the value loss, times `vf_coef`,
    /// joins the policy loss in one forward and backward, and only the head (at `lr`) has an
    /// optimizer of its own. False: a separate critic transformer (verl, TRL's `PPOTrainer`).
    /// `ppo` and `a2c` only.
    #[serde(default)]
    pub share_backbone: bool,
    /// The actor trains only on the groups whose rewards differ (GRPO's update leaves the
    /// others out: their advantages are 0 there); the critic still trains on every row.
    /// `ppo` and `a2c` with a critic of their own (docs/ppo.md).
    #[serde(default)]
    pub actor_skip_flat_groups: bool,
    /// Scale of the value loss (TRL `vf_coef`).
    #[serde(default = "default_vf_coef")]
    pub vf_coef: f64,
    /// The value clip `c`: new values are clipped to `old ± c` (TRL `cliprange_value`).
    #[serde(default = "default_clip_range_value")]
    pub clip_range_value: f64,
    /// Discount γ of GAE.
    #[serde(default = "one")]
    pub gamma: f64,
    /// λ of GAE.
    #[serde(default = "default_lam")]
    pub lam: f64,
    /// λ of the actor's advantages alone (VC-PPO's decoupled GAE, Yuan et al. 2025): the
    /// critic's returns keep `lam` (1: unbiased Monte Carlo targets) while the actor's
    /// advantages use this λ, trading the young critic's bias for lower variance and credit
    /// nearer each token. Absent: `lam` for both.
    #[serde(default)]
    pub actor_lam: Option<f64>,
    /// Standardise the advantages over the batch's completion tokens.
    #[serde(default = "yes")]
    pub whiten_advantages: bool,
    /// Steps that train only the critic before the actor starts (verl `critic_warmup`).
    #[serde(default)]
    pub warmup_steps: usize,
    /// Where `β·KL` to the reference goes: the token rewards (true, TRL's PPO and verl's
    /// `use_kl_in_reward`) or the policy loss (false, as GRPO).
    #[serde(default = "yes")]
    pub kl_in_reward: bool,
    /// With `kl_in_reward`: the adaptive controller's target KL (absent: β stays fixed).
    #[serde(default)]
    pub kl_target: Option<f64>,
    /// The adaptive controller's horizon (rollouts).
    #[serde(default = "default_kl_horizon")]
    pub kl_horizon: f64,
}

impl Default for CriticArgs {
    fn default() -> Self {
        Self {
            lr: None,
            model: None,
            num_layers: None,
            intermediate_size: None,
            num_attention_heads: None,
            share_backbone: false,
            actor_skip_flat_groups: false,
            vf_coef: default_vf_coef(),
            clip_range_value: default_clip_range_value(),
            gamma: 1.0,
            lam: default_lam(),
            actor_lam: None,
            whiten_advantages: true,
            warmup_steps: 0,
            kl_in_reward: true,
            kl_target: None,
            kl_horizon: default_kl_horizon(),
        }
    }
}

/// TRPO's natural-gradient step (`[trpo]`): the trust region, the conjugate-gradient solve
/// and the line search (Schulman et al. 2015; Spinning Up's defaults).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrpoArgs {
    /// The KL bound δ of the trust region.
    #[serde(default = "default_max_kl")]
    pub max_kl: f64,
    /// Conjugate-gradient iterations.
    #[serde(default = "default_cg_iters")]
    pub cg_iters: usize,
    /// Damping added to the Fisher matrix (`F + damping·I`).
    #[serde(default = "default_damping")]
    pub damping: f64,
    /// Step fractions tried by the line search (1, ½, ¼, …).
    #[serde(default = "default_cg_iters")]
    pub max_backtracks: usize,
    /// Share of the linearly expected improvement a step must reach.
    #[serde(default = "default_accept_ratio")]
    pub accept_ratio: f64,
    /// Norm of the parameter shift of the finite-difference Fisher-vector products.
    #[serde(default = "default_fvp_shift")]
    pub fvp_shift: f64,
    /// Share of the batch's rows (evenly spaced) the Fisher-vector products run on, in (0, 1]
    /// (rllab's `subsample_factor`): each product costs that share of a full pass.
    #[serde(default = "one")]
    pub fisher_fraction: f64,
}

impl TrpoArgs {
    /// The settings `atomrl_optim::trust_region_update` takes from these.
    ///
    /// ```
    /// let t = atomrl_config::TrpoArgs::default().trust_region();
    /// assert!(t.max_kl > 0.0 && t.cg_iters > 0);
    /// ```
    pub fn trust_region(&self) -> atomrl_optim::TrustRegion {
        atomrl_optim::TrustRegion {
            max_kl: self.max_kl,
            cg_iters: self.cg_iters,
            max_backtracks: self.max_backtracks,
            accept_ratio: self.accept_ratio,
        }
    }
}

impl Default for TrpoArgs {
    fn default() -> Self {
        Self {
            max_kl: default_max_kl(),
            cg_iters: default_cg_iters(),
            damping: default_damping(),
            max_backtracks: default_cg_iters(),
            accept_ratio: default_accept_ratio(),
            fvp_shift: default_fvp_shift(),
            fisher_fraction: 1.0,
        }
    }
}

fn default_vf_coef() -> f64 {
    0.1
}
fn default_clip_range_value() -> f64 {
    0.2
}
fn one() -> f64 {
    1.0
}
fn default_lam() -> f64 {
    0.95
}
fn yes() -> bool {
    true
}
fn default_kl_horizon() -> f64 {
    10_000.0
}
fn default_max_kl() -> f64 {
    0.01
}
fn default_cg_iters() -> usize {
    10
}
fn default_damping() -> f64 {
    0.1
}
fn default_accept_ratio() -> f64 {
    0.1
}
fn default_fvp_shift() -> f64 {
    1e-3
}
