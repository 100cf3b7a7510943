//! [`compute_dpo_loss`]: Direct Preference Optimization's loss on summed completion log-probs
//! (TRL 1.16's `DPOTrainer` with the reverse-KL divergence).

use atomrl_core::{CandleContext, Error, Result};
use candle_core::Tensor;
use serde::{Deserialize, Serialize};

use crate::pairwise::{checked_vector, host_mean, log_sigmoid, share_greater};

const FUNC: &str = "compute_dpo_loss";

/// The DPO loss variants of TRL's `loss_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DpoLossType {
    /// `−log σ(β·Δ)`: DPO (Rafailov et al., 2023).
    #[default]
    Sigmoid,
    /// `relu(1 − β·Δ)`: SLiC / RSO's hinge.
    Hinge,
    /// `(Δ̄ − 1/(2β))²` on per-token averaged log-ratios: IPO (Azar et al., 2023).
    Ipo,
    /// `((1−ε)·(−log σ(β·Δ)) − ε·(−log σ(−β·Δ))) / (1 − 2ε)`: robust DPO (Chowdhury et al., 2024).
    Robust,
}

impl DpoLossType {
    /// The names, as written in a configuration or JSON.
    pub const NAMES: [&'static str; 4] = ["sigmoid", "hinge", "ipo", "robust"];

    /// The name of this variant.
    ///
    /// ```
    /// assert_eq!(atomrl_loss::DpoLossType::Ipo.name(), "ipo");
    /// ```
    pub fn name(self) -> &'static str {
        Self::NAMES[self as usize]
    }
}

impl std::fmt::Display for DpoLossType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// ```
/// use atomrl_loss::DpoLossType;
/// assert_eq!("ipo".parse::<DpoLossType>()?, DpoLossType::Ipo);
/// assert!("kto".parse::<DpoLossType>().is_err());
/// # Ok::<(), atomrl_core::Error>(())
/// ```
impl std::str::FromStr for DpoLossType {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        Self::NAMES
            .iter()
            .zip([Self::Sigmoid, Self::Hinge, Self::Ipo, Self::Robust])
            .find_map(|(n, t)| (*n == s).then_some(t))
            .ok_or_else(|| Error::unknown_choice(FUNC, "loss_type", &Self::NAMES, s))
    }
}

/// The options of [`compute_dpo_loss`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DpoOptions {
    /// β, the strength of the implicit KL to the reference (TRL's default 0.1).
    pub beta: f64,
    /// The loss variant.
    pub loss_type: DpoLossType,
    /// ε, the assumed share of flipped labels: used by `robust` only, in `[0, 0.5)` (TRL 1.16's
    /// sigmoid, hinge and IPO losses do not read it).
    pub label_smoothing: f64,
}

impl Default for DpoOptions {
    fn default() -> Self {
        Self {
            beta: 0.1,
            loss_type: DpoLossType::Sigmoid,
            label_smoothing: 0.0,
        }
    }
}

/// Output of [`compute_dpo_loss`].
#[derive(Debug, Clone)]
pub struct DpoLossOutput {
    /// The loss of each pair `[N]` (differentiable).
    pub losses: Tensor,
    /// Their mean (scalar, differentiable): what is minimised.
    pub loss: Tensor,
    /// `β·(log π(y_c) − log π_ref(y_c))` per pair `[N]` (detached).
    pub chosen_rewards: Tensor,
    /// `β·(log π(y_r) − log π_ref(y_r))` per pair `[N]` (detached).
    pub rejected_rewards: Tensor,
    /// Share of pairs whose chosen reward is the larger.
    pub reward_accuracy: f64,
    /// Mean of `chosen_rewards − rejected_rewards`.
    pub reward_margin: f64,
}

/// The DPO loss of `N` preference pairs from their completions' summed log-probs under the
/// policy and the reference (TRL 1.16 `DPOTrainer._compute_loss`, `f_divergence_type =
/// reverse_kl`):
///
/// ```text
/// Δ = (log π(y_c) − log π_ref(y_c)) − (log π(y_r) − log π_ref(y_r))
/// sigmoid: −log σ(β·Δ)
/// hinge:   relu(1 − β·Δ)
/// ipo:     (Δ̄ − 1/(2β))²   with Δ̄ = chosen log-ratio / chosen length − rejected log-ratio / rejected length
/// robust:  ((1 − ε)·(−log σ(β·Δ)) − ε·(−log σ(−β·Δ))) / (1 − 2ε)
/// loss = mean over pairs; rewards = β · each side's log-ratio; accuracy = share chosen > rejected
/// ```
///
/// # Shapes
/// `chosen_log_probs`, `rejected_log_probs`, `ref_chosen_log_probs`, `ref_rejected_log_probs`:
/// `[N]`, each a completion's log-prob summed over its tokens. `lengths`: the chosen and
/// rejected completions' token counts `[N]` each, required by `ipo` (counts below 1 count 1,
/// as TRL clamps them).
///
/// # Errors
/// Shapes that are not `[N]` alike, non-finite values, `beta` not > 0, `label_smoothing` outside
/// `[0, 0.5)` for `robust` (outside `[0, 1)` otherwise), `ipo` without lengths.
///
/// ```
/// use atomrl_loss::{compute_dpo_loss, DpoOptions};
/// use candle_core::{Device, Tensor};
/// let d = Device::Cpu;
/// let t = |v: &[f32]| Tensor::new(v, &d);
/// let out = compute_dpo_loss(&t(&[-5.0, -9.0])?, &t(&[-7.0, -6.0])?, &t(&[-6.0, -8.0])?, &t(&[-6.0, -7.0])?, None, &DpoOptions::default())?;
/// // Pair 0: Δ = 1 − (−1) = 2, loss −log σ(0.2) = 0.598; pair 1: Δ = −1 − 1 = −2, loss 0.798.
/// let l = out.losses.to_vec1::<f32>()?;
/// assert!((l[0] - 0.598_139_9).abs() < 1e-6 && (l[1] - 0.798_138_9).abs() < 1e-6);
/// assert_eq!(out.reward_accuracy, 0.5);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn compute_dpo_loss(
    chosen_log_probs: &Tensor,
    rejected_log_probs: &Tensor,
    ref_chosen_log_probs: &Tensor,
    ref_rejected_log_probs: &Tensor,
    lengths: Option<(&Tensor, &Tensor)>,
    opts: &DpoOptions,
) -> Result<DpoLossOutput> {
    check_options(opts)?;
    let c = checked_vector(FUNC, "chosen_log_probs", chosen_log_probs, None)?;
    let n = Some(c.dim(0).ctx(FUNC)?);
    let r = checked_vector(FUNC, "rejected_log_probs", rejected_log_probs, n)?;
    let rc = checked_vector(FUNC, "ref_chosen_log_probs", ref_chosen_log_probs, n)?;
    let rr = checked_vector(FUNC, "ref_rejected_log_probs", ref_rejected_log_probs, n)?;
    let chosen_ratio = (&c - &rc).ctx(FUNC)?;
    let rejected_ratio = (&r - &rr).ctx(FUNC)?;
    let beta = opts.beta;
    let losses = match opts.loss_type {
        DpoLossType::Ipo => {
            let Some((lc, lr)) = lengths else {
                return Err(Error::missing(
                    FUNC,
                    "chosen_lengths",
                    "the completion token counts [N] that ipo averages by",
                ));
            };
            let per_token = |ratio: &Tensor, len: &Tensor, name: &str| -> Result<Tensor> {
                let len = checked_vector(FUNC, name, len, n)?
                    .maximum(1f64)
                    .ctx(FUNC)?;
                (ratio / len).ctx(FUNC)
            };
            let delta = (per_token(&chosen_ratio, lc, "chosen_lengths")?
                - per_token(&rejected_ratio, lr, "rejected_lengths")?)
            .ctx(FUNC)?;
            (delta - 1.0 / (2.0 * beta))
                .and_then(|x| x.sqr())
                .ctx(FUNC)?
        }
        kind => {
            let scaled = ((&chosen_ratio - &rejected_ratio).ctx(FUNC)? * beta).ctx(FUNC)?;
            margin_loss(kind, &scaled, opts.label_smoothing)?
        }
    };
    let loss = losses.mean_all().ctx(FUNC)?;
    let chosen_rewards = (chosen_ratio.detach() * beta).ctx(FUNC)?;
    let rejected_rewards = (rejected_ratio.detach() * beta).ctx(FUNC)?;
    let margins = (&chosen_rewards - &rejected_rewards).ctx(FUNC)?;
    Ok(DpoLossOutput {
        reward_accuracy: share_greater(FUNC, &chosen_rewards, &rejected_rewards)?,
        reward_margin: host_mean(FUNC, &margins)?,
        losses,
        loss,
        chosen_rewards,
        rejected_rewards,
    })
}

/// The sigmoid, hinge or robust loss of `β·Δ`.
fn margin_loss(kind: DpoLossType, scaled: &Tensor, eps: f64) -> Result<Tensor> {
    match kind {
        DpoLossType::Hinge => scaled.affine(-1.0, 1.0).and_then(|x| x.relu()).ctx(FUNC),
        DpoLossType::Robust => {
            let clean = (log_sigmoid(FUNC, scaled)? * -(1.0 - eps)).ctx(FUNC)?;
            let flipped = (log_sigmoid(FUNC, &scaled.neg().ctx(FUNC)?)? * -eps).ctx(FUNC)?;
            ((clean - flipped).ctx(FUNC)? / (1.0 - 2.0 * eps)).ctx(FUNC)
        }
        _ => log_sigmoid(FUNC, scaled)?.neg().ctx(FUNC),
    }
}

fn check_options(opts: &DpoOptions) -> Result<()> {
    if !(opts.beta > 0.0 && opts.beta.is_finite()) {
        return Err(Error::value(FUNC, "beta", "> 0 and finite", opts.beta));
    }
    let eps = opts.label_smoothing;
    let (range, ok) = if opts.loss_type == DpoLossType::Robust {
        ("in [0, 0.5) for the robust loss", (0.0..0.5).contains(&eps))
    } else {
        ("in [0, 1)", (0.0..1.0).contains(&eps))
    };
    if !ok {
        return Err(Error::value(FUNC, "label_smoothing", range, eps));
    }
    Ok(())
}
