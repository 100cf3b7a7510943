//! The settings of the preference recipe `dpo` (`[dpo]`): the loss on each pair.

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
