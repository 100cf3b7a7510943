//! `compute_pg_loss`: the vanilla policy-gradient loss of A2C (no ratio, no clipping).

use atomrl_core::{CandleContext, Result};
use candle_core::Tensor;

use crate::agg::{aggregate_masked, AggOptions};
use crate::check::{check_mask, checked_tokens};
use crate::policy::checked_advantages;

const FUNC: &str = "compute_pg_loss";

/// The vanilla policy-gradient loss of A2C (Mnih et al., 2016) and REINFORCE:
///
/// ```text
/// l_t  = −A_t · logp_t                    per token (A per row [N] or per token [N, T])
/// loss = aggregate(l, mask)               by opts.mode
/// ```
///
/// Its gradient is `−A·∇log π`, the on-policy gradient without PPO's ratio and clip: one
/// update per experience (`num_iterations = 1`), where the ratio would be 1 anyway.
///
/// # Shapes
/// `log_probs [N, T]` (with gradient), `advantages [N]` or `[N, T]`, `mask [N, T]`; returns a
/// scalar loss.
///
/// # Errors
/// As [`compute_policy_loss`](crate::compute_policy_loss): shapes, the mask, non-finite values
/// where used, bad aggregation options.
///
/// ```
/// use atomrl_loss::{compute_pg_loss, AggOptions, LossAgg};
/// use candle_core::{Device, Tensor};
/// let d = Device::Cpu;
/// let logp = Tensor::new(&[[-1.0f32, -2.0], [-0.5, -3.0]], &d)?;
/// let adv = Tensor::new(&[1.0f32, -2.0], &d)?;
/// let m = Tensor::new(&[[1f32, 1.0], [1.0, 0.0]], &d)?;
/// let loss = compute_pg_loss(&logp, &adv, &m, &AggOptions::new(LossAgg::TokenMean))?;
/// // (1 + 2 − 1) / 3 valid tokens
/// assert!((loss.to_scalar::<f32>()? - 2.0 / 3.0).abs() < 1e-6);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn compute_pg_loss(
    log_probs: &Tensor,
    advantages: &Tensor,
    mask: &Tensor,
    opts: &AggOptions,
) -> Result<Tensor> {
    opts.validate(FUNC)?;
    let m = check_mask(FUNC, "log_probs", log_probs, mask)?;
    let logp = checked_tokens(FUNC, "log_probs", log_probs, "log_probs", &m)?;
    let adv = checked_advantages(FUNC, advantages, &m)?;
    let per_token = (adv * logp).and_then(|x| x.neg()).ctx(FUNC)?;
    let per_token = m.select(FUNC, &per_token)?;
    aggregate_masked(FUNC, &per_token, &m, opts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{compute_policy_loss, LossAgg, PolicyLossOptions};
    use candle_core::{Device, Var};

    /// At ratio 1 (old = new log-probs) the PPO clipped loss and its gradient equal the vanilla
    /// policy gradient's.
    #[test]
    fn equals_the_clipped_loss_at_ratio_one() {
        let d = Device::Cpu;
        let logp = Var::new(&[[-1.0f32, -2.0, -0.3], [-0.5, -3.0, -1.0]], &d).unwrap();
        let adv = Tensor::new(&[[0.5f32, -1.0, 2.0], [1.5, 0.2, -0.7]], &d).unwrap();
        let m = Tensor::new(&[[1f32, 1.0, 0.0], [1.0, 1.0, 1.0]], &d).unwrap();
        for mode in [LossAgg::TokenMean, LossAgg::SeqMeanTokenMean] {
            let opts = AggOptions::new(mode);
            let pg = compute_pg_loss(logp.as_tensor(), &adv, &m, &opts).unwrap();
            let ppo_opts = PolicyLossOptions {
                agg: opts,
                ..Default::default()
            };
            let old = logp.as_tensor().detach();
            let ppo = compute_policy_loss(logp.as_tensor(), &old, &adv, &m, &ppo_opts).unwrap();
            let (a, b) = (
                pg.to_scalar::<f32>().unwrap(),
                ppo.loss.to_scalar::<f32>().unwrap(),
            );
            // ratio·A vs A·logp: equal gradients, and the values differ by Σ A·(1 + logp)·m.
            let ga: Vec<Vec<f32>> = pg
                .backward()
                .unwrap()
                .get(logp.as_tensor())
                .unwrap()
                .to_vec2()
                .unwrap();
            let gb: Vec<Vec<f32>> = ppo
                .loss
                .backward()
                .unwrap()
                .get(logp.as_tensor())
                .unwrap()
                .to_vec2()
                .unwrap();
            for (ra, rb) in ga.iter().zip(&gb) {
                for (x, y) in ra.iter().zip(rb) {
                    assert!((x - y).abs() < 1e-6, "{mode:?}: {ga:?} vs {gb:?}");
                }
            }
            assert!(a.is_finite() && b.is_finite());
        }
    }

    #[test]
    fn errors_name_this_function() {
        let d = Device::Cpu;
        let logp = Tensor::new(&[[-1.0f32, -2.0]], &d).unwrap();
        let m = Tensor::new(&[[1f32, 1.0]], &d).unwrap();
        let bad = Tensor::new(&[1.0f32, 2.0, 3.0], &d).unwrap();
        let opts = AggOptions::new(LossAgg::TokenMean);
        let err = compute_pg_loss(&logp, &bad, &m, &opts)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("compute_pg_loss") && err.contains("advantages"),
            "{err}"
        );
    }
}
