//! [`compute_reward_model_loss`]: the Bradley–Terry loss of a reward model on preference pairs
//! (TRL 1.16's `RewardTrainer.compute_loss`).

use atomrl_core::{CandleContext, Error, Result};
use candle_core::Tensor;

use crate::pairwise::{checked_vector, host_mean, log_sigmoid, share_greater};

const FUNC: &str = "compute_reward_model_loss";

/// Output of [`compute_reward_model_loss`].
#[derive(Debug, Clone)]
pub struct RewardModelLossOutput {
    /// The loss (scalar, differentiable w.r.t. both rewards).
    pub loss: Tensor,
    /// Share of pairs whose chosen reward is the larger.
    pub accuracy: f64,
    /// Mean of `chosen − rejected`.
    pub margin: f64,
}

/// The reward model's pairwise loss (TRL 1.16 `RewardTrainer.compute_loss`):
///
/// ```text
/// loss = −mean(log σ(r_c − r_r − m))            m = margin (0 when absent)
///        + c · mean((r_c + r_r)²)               c = center_rewards_coefficient (when given)
/// accuracy = mean(r_c > r_r),  margin = mean(r_c − r_r)
/// ```
///
/// # Shapes
/// `chosen_rewards`, `rejected_rewards` and the optional `margin`: `[N]`.
///
/// # Errors
/// Shapes that are not `[N]` alike, non-finite values, a `center_rewards_coefficient` below 0
/// or not finite.
///
/// ```
/// use atomrl_loss::compute_reward_model_loss;
/// use candle_core::{Device, Tensor};
/// let d = Device::Cpu;
/// let out = compute_reward_model_loss(&Tensor::new(&[1.0f32, 0.0], &d)?, &Tensor::new(&[0.0f32, 0.5], &d)?, None, None)?;
/// // −(log σ(1) + log σ(−0.5)) / 2
/// assert!((out.loss.to_scalar::<f32>()? - 0.643_670).abs() < 1e-5);
/// assert_eq!((out.accuracy, out.margin), (0.5, 0.25));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn compute_reward_model_loss(
    chosen_rewards: &Tensor,
    rejected_rewards: &Tensor,
    margin: Option<&Tensor>,
    center_rewards_coefficient: Option<f64>,
) -> Result<RewardModelLossOutput> {
    let c = checked_vector(FUNC, "chosen_rewards", chosen_rewards, None)?;
    let n = Some(c.dim(0).ctx(FUNC)?);
    let r = checked_vector(FUNC, "rejected_rewards", rejected_rewards, n)?;
    let mut diff = (&c - &r).ctx(FUNC)?;
    let host_diff = diff.clone();
    if let Some(m) = margin {
        diff = (diff - checked_vector(FUNC, "margin", m, n)?).ctx(FUNC)?;
    }
    let mut loss = log_sigmoid(FUNC, &diff)?
        .mean_all()
        .and_then(|x| x.neg())
        .ctx(FUNC)?;
    if let Some(coef) = center_rewards_coefficient {
        if !(coef >= 0.0 && coef.is_finite()) {
            return Err(Error::value(
                FUNC,
                "center_rewards_coefficient",
                ">= 0 and finite",
                coef,
            ));
        }
        let centre = (&c + &r)
            .and_then(|s| s.sqr())
            .and_then(|s| s.mean_all())
            .ctx(FUNC)?;
        loss = (loss + (centre * coef).ctx(FUNC)?).ctx(FUNC)?;
    }
    Ok(RewardModelLossOutput {
        loss,
        accuracy: share_greater(FUNC, &c, &r)?,
        margin: host_mean(FUNC, &host_diff.detach())?,
    })
}
