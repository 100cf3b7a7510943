//! The settings of the preference recipes: `dpo`'s loss on each pair (`[dpo]`) and the
//! reward model's (`[reward_model]`).

use atomrl_loss::DpoLossType;
use serde::{Deserialize, Serialize};

/// DPO's loss (`[dpo]`), with TRL's `DPOConfig` defaults.
///
/// ```
/// use atomrl_config::{GRPOArgs, Recipe};
/// let d = GRPOArgs::preset(Recipe::Dpo).dpo();
/// assert_eq!((d.beta, d.loss_type.to_string(), d.label_smoothing), (0.1, "sigmoid".to_string(), 0.0));
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DpoArgs {
    /// β, the strength of the implicit KL to the reference model (TRL `beta`). The run's own
    /// `beta` (the KL penalty of the policy-gradient recipes) is not read by `dpo`.
    #[serde(default = "default_beta")]
    pub beta: f64,
    /// `sigmoid` (DPO), `hinge`, `ipo` or `robust` (TRL `loss_type`).
    #[serde(default)]
    pub loss_type: DpoLossType,
    /// The assumed share of flipped labels of the `robust` loss, in `[0, 0.5)`.
    #[serde(default)]
    pub label_smoothing: f64,
}

impl Default for DpoArgs {
    fn default() -> Self {
        Self {
            beta: default_beta(),
            loss_type: DpoLossType::Sigmoid,
            label_smoothing: 0.0,
        }
    }
}

fn default_beta() -> f64 {
    0.1
}

/// The reward model's loss (`[reward_model]`), with TRL's `RewardConfig` defaults.
///
/// ```
/// use atomrl_config::{GRPOArgs, Recipe};
/// let r = GRPOArgs::preset(Recipe::Reward);
/// assert_eq!((r.lr, r.reward_model().center_rewards_coefficient), (1e-5, None));
/// ```
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RewardModelArgs {
    /// `c` of the centring term `c · mean((r_c + r_r)²)`, which keeps the scores near 0
    /// (Eisenstein et al., 2023; TRL `center_rewards_coefficient`); absent: none.
    #[serde(default)]
    pub center_rewards_coefficient: Option<f64>,
    /// Start the reward model from the policy's first `num_layers` decoder layers (its
    /// embeddings and final norm, a zero head): a smaller reward model, about `num_layers / L`
    /// of a step's cost, saved with `num_hidden_layers = num_layers`; absent: all of them.
    #[serde(default)]
    pub num_layers: Option<usize>,
}
