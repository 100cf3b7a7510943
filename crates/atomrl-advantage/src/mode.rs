//! The advantage estimators.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

use atomrl_core::Error;

/// How rewards are turned into advantages. Groups are consecutive rows of `G` completions of
/// the same prompt; `mean_g` and `std_g` are that group's mean and unbiased standard deviation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AdvantageMode {
    /// `A = r` (no baseline).
    Raw,
    /// `A = (r − mean_g) / (std_g + eps)` — GRPO (DeepSeekMath), verl's `grpo`, TRL's default.
    Grpo,
    /// `A = r − mean_g` — Dr. GRPO (no std normalisation), TRL `scale_rewards="none"`.
    #[serde(alias = "dr_grpo")]
    GrpoNoStd,
    /// `A = (r − mean_g) / (std_batch + eps)` — TRL `scale_rewards="batch"`.
    Batch,
    /// `A = r_i − mean of the other G−1 rewards of the group` — RLOO.
    Rloo,
    /// `x = r − mean_g`, then `A = x / sqrt(var_batch(x) + 1e-8)` — REINFORCE++ with baseline.
    #[serde(alias = "reinforce_plus_plus_baseline")]
    ReinforcePp,
}

impl AdvantageMode {
    /// Every mode's canonical name, in declaration order.
    pub const NAMES: [&'static str; 6] = [
        "raw",
        "grpo",
        "grpo_no_std",
        "batch",
        "rloo",
        "reinforce_pp",
    ];

    /// Canonical name (as accepted by [`FromStr`] and `atomrl-fn`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Raw => "raw",
            Self::Grpo => "grpo",
            Self::GrpoNoStd => "grpo_no_std",
            Self::Batch => "batch",
            Self::Rloo => "rloo",
            Self::ReinforcePp => "reinforce_pp",
        }
    }

    /// Whether the mode subtracts the group mean (every mode but `raw`).
    pub fn is_centring(self) -> bool {
        self != Self::Raw
    }
}

impl fmt::Display for AdvantageMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for AdvantageMode {
    type Err = Error;

    /// Parses a canonical name, or an alias: `dr_grpo` (= `grpo_no_std`),
    /// `reinforce_plus_plus_baseline` (= `reinforce_pp`).
    fn from_str(s: &str) -> Result<Self, Error> {
        Ok(match s {
            "raw" => Self::Raw,
            "grpo" => Self::Grpo,
            "grpo_no_std" | "dr_grpo" => Self::GrpoNoStd,
            "batch" => Self::Batch,
            "rloo" => Self::Rloo,
            "reinforce_pp" | "reinforce_plus_plus_baseline" => Self::ReinforcePp,
            other => {
                return Err(Error::unknown_choice(
                    "compute_advantages",
                    "mode",
                    &Self::NAMES,
                    other,
                ))
            }
        })
    }
}
