//! The KL penalty in the reward (PPO's classic form) and its adaptive coefficient.

use atomrl_core::shape::flat_f64;
use atomrl_core::{CandleContext, Error, Result};
use candle_core::Tensor;

use crate::check::{check_mask, checked_tokens};
use crate::kl::{compute_kl_penalty, KlEstimator};

const FUNC: &str = "apply_kl_penalty";

/// Output of [`apply_kl_penalty`].
#[derive(Debug, Clone)]
pub struct KlRewardOutput {
    /// `scores − β·kl` per token `[N, T]`, 0 where masked.
    pub rewards: Tensor,
    /// The per-token KL estimate `[N, T]`, 0 where masked.
    pub kl: Tensor,
    /// The batch's KL: the mean over rows of each row's masked token mean (a fully masked row
    /// counts 0), what verl logs as `actor/reward_kl_penalty` and feeds its KL controller.
    pub kl_mean: f64,
}

/// Subtracts `β·KL(π_old ‖ π_ref)` from the token-level rewards, token by token (verl's
/// `apply_kl_penalty`, the KL-in-reward form of PPO; the KL-as-loss form is
/// [`compute_kl_penalty`] in the loss):
///
/// ```text
/// kl_t      = estimator(logp_t, ref_t) · m_t
/// reward_t  = (score_t − β · kl_t) · m_t
/// kl_mean   = mean over rows of Σ_t kl_t / (Σ_t m_t + 1e-8)
/// ```
///
/// # Shapes
/// `scores`, `log_probs` (the policy that sampled), `ref_log_probs`, `mask`: `[N, T]`.
///
/// # Errors
/// As [`compute_kl_penalty`] (shapes, mask, non-finite values on valid tokens), a non-finite
/// score on a valid token, a `beta` below 0 or not finite.
///
/// ```
/// use atomrl_loss::{apply_kl_penalty, KlEstimator};
/// use candle_core::{Device, Tensor};
/// let d = Device::Cpu;
/// let scores = Tensor::new(&[[0f32, 1.0]], &d)?;
/// let logp = Tensor::new(&[[-1.0f32, -2.0]], &d)?;
/// let reference = Tensor::new(&[[-1.5f32, -2.0]], &d)?;
/// let m = Tensor::new(&[[1f32, 1.0]], &d)?;
/// let out = apply_kl_penalty(&scores, &logp, &reference, &m, 0.1, KlEstimator::K1)?;
/// assert_eq!(out.rewards.to_vec2::<f32>()?, [[-0.05, 1.0]]);
/// assert!((out.kl_mean - 0.25).abs() < 1e-7);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn apply_kl_penalty(
    scores: &Tensor,
    log_probs: &Tensor,
    ref_log_probs: &Tensor,
    mask: &Tensor,
    beta: f64,
    estimator: KlEstimator,
) -> Result<KlRewardOutput> {
    if !(beta >= 0.0 && beta.is_finite()) {
        return Err(Error::value(FUNC, "beta", ">= 0 and finite", beta));
    }
    let kl = compute_kl_penalty(log_probs, ref_log_probs, mask, estimator)?.kl;
    let m = check_mask(FUNC, "log_probs", log_probs, mask)?;
    let scores = checked_tokens(FUNC, "scores", scores, "log_probs", &m)?;
    let rewards = (&scores - (&kl * beta).ctx(FUNC)?).ctx(FUNC)?;
    let kl_host = flat_f64(FUNC, &kl)?;
    let kl_mean = (0..m.n)
        .map(|row| {
            let span = row * m.t..(row + 1) * m.t;
            let count: f64 = m.host[span.clone()].iter().sum();
            kl_host[span].iter().sum::<f64>() / (count + 1e-8)
        })
        .sum::<f64>()
        / m.n as f64;
    Ok(KlRewardOutput {
        rewards,
        kl,
        kl_mean,
    })
}

/// The adaptive KL coefficient of Ziegler et al. (2019), as verl's `AdaptiveKLController` and
/// TRL's: after each batch, `β ← β · (1 + clip(KL / target − 1, −0.2, 0.2) · n_steps /
/// horizon)`, so that the KL drifts toward `target`.
///
/// ```
/// use atomrl_loss::AdaptiveKlController;
/// let mut c = AdaptiveKlController::new(0.1, 6.0, 10_000.0)?;
/// c.update(12.0, 256); // KL twice the target: the error is clipped to +0.2
/// assert!((c.value() - 0.1 * (1.0 + 0.2 * 256.0 / 10_000.0)).abs() < 1e-12);
/// assert!(AdaptiveKlController::new(0.1, 0.0, 1.0).is_err());
/// # Ok::<(), atomrl_core::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AdaptiveKlController {
    value: f64,
    target: f64,
    horizon: f64,
}

impl AdaptiveKlController {
    /// A controller starting at `init_coef`, aiming at `target_kl` over `horizon` samples.
    ///
    /// # Errors
    /// `init_coef` below 0, `target_kl` or `horizon` not above 0 (or not finite).
    ///
    /// See [`AdaptiveKlController`] for an example.
    pub fn new(init_coef: f64, target_kl: f64, horizon: f64) -> Result<Self> {
        let func = "AdaptiveKlController::new";
        if !(init_coef >= 0.0 && init_coef.is_finite()) {
            return Err(Error::value(
                func,
                "init_coef",
                ">= 0 and finite",
                init_coef,
            ));
        }
        for (name, x) in [("target_kl", target_kl), ("horizon", horizon)] {
            if !(x > 0.0 && x.is_finite()) {
                return Err(Error::value(func, name, "> 0 and finite", x));
            }
        }
        Ok(Self {
            value: init_coef,
            target: target_kl,
            horizon,
        })
    }

    /// The current coefficient β.
    ///
    /// See [`AdaptiveKlController`] for an example.
    pub fn value(&self) -> f64 {
        self.value
    }

    /// Moves β after a batch of `n_steps` samples whose KL was `current_kl` (a non-finite KL
    /// leaves it unchanged).
    ///
    /// See [`AdaptiveKlController`] for an example.
    pub fn update(&mut self, current_kl: f64, n_steps: usize) {
        if !current_kl.is_finite() {
            return;
        }
        let error = (current_kl / self.target - 1.0).clamp(-0.2, 0.2);
        self.value *= 1.0 + error * n_steps as f64 / self.horizon;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn masked_tokens_get_no_reward_and_a_masked_row_counts_zero() {
        let d = Device::Cpu;
        let t = |v: &[f32]| Tensor::from_slice(v, (2, 2), &d).unwrap();
        let out = apply_kl_penalty(
            &t(&[1.0, 5.0, 2.0, 2.0]),
            &t(&[-1.0, -1.0, -1.0, -1.0]),
            &t(&[-2.0, -2.0, -2.0, -2.0]),
            &t(&[1.0, 0.0, 0.0, 0.0]),
            0.5,
            KlEstimator::K1,
        )
        .unwrap();
        assert_eq!(
            out.rewards.to_vec2::<f32>().unwrap(),
            [[0.5, 0.0], [0.0, 0.0]]
        );
        // Row 0's KL is 1, row 1 has no valid token: the batch KL is 0.5.
        assert!((out.kl_mean - 0.5).abs() < 1e-7);
    }

    #[test]
    fn the_controller_moves_toward_the_target_and_rejects_bad_settings() {
        let mut c = AdaptiveKlController::new(0.2, 1.0, 100.0).unwrap();
        c.update(0.5, 10); // half the target: the error −0.5 is clipped to −0.2
        assert!((c.value() - 0.2 * (1.0 - 0.2 * 10.0 / 100.0)).abs() < 1e-12);
        c.update(f64::NAN, 10);
        assert!((c.value() - 0.196).abs() < 1e-12);
        c.update(1.05, 100); // 5% above: β grows by 5%
        assert!((c.value() - 0.196 * 1.05).abs() < 1e-12);
        assert!(AdaptiveKlController::new(-1.0, 1.0, 1.0).is_err());
        assert!(AdaptiveKlController::new(0.1, 1.0, 0.0).is_err());
        let err = apply_kl_penalty(
            &Tensor::new(&[[0f32]], &Device::Cpu).unwrap(),
            &Tensor::new(&[[0f32]], &Device::Cpu).unwrap(),
            &Tensor::new(&[[0f32]], &Device::Cpu).unwrap(),
            &Tensor::new(&[[1f32]], &Device::Cpu).unwrap(),
            -0.1,
            KlEstimator::K1,
        )
        .unwrap_err();
        assert!(err.to_string().contains("beta"));
    }
}
