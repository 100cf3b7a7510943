//! TRPO's policy step on an experience: the surrogate's gradient, the natural-gradient
//! direction by conjugate gradients over Fisher-vector products, the step scaled to the trust
//! region, and the backtracking line search (the pieces are `atomrl-optim`'s).
//!
//! Parameters travel as one flat `f64` vector on the host (`atomrl_optim::flatten_vars`):
//! simple and exact for the small models TRPO is practical on (each Fisher-vector product
//! costs two full backward passes).

use atomrl_core::shape::masked_sum;
use atomrl_core::{CandleContext, Result};
use atomrl_loss::{aggregate_loss, compute_kl_penalty, AggOptions, KlEstimator};
use atomrl_optim::{fisher_vector_product, flatten_vars, set_vars_from_flat, trust_region_update};
use atomrl_rollout::parallel::Parallel;
use atomrl_rollout::{experience_log_probs, sharded_log_probs, Experience, LossNormalizer};
use candle_core::{Tensor, Var};

use crate::accumulate::{accumulate_gradients, with_step_normalizer, Accumulated};
use crate::config::{TrpoArgs, UpdateConfig};
use crate::state::TrainState;

/// What a TRPO step measured.
#[derive(Debug, Clone, Default)]
pub(crate) struct TrpoStats {
    /// The surrogate loss before the step.
    pub loss: f64,
    /// The norm of its gradient.
    pub grad_norm: f64,
    /// The accepted fraction of the full step (0: none accepted, the policy is unchanged).
    pub fraction: f64,
    /// The KL to the old policy (k3, token mean) after the accepted step.
    pub kl: f64,
    /// The surrogate's improvement.
    pub improvement: f64,
    /// Conjugate-gradient iterations.
    pub cg_iterations: usize,
    /// Why the step was skipped, if it was.
    pub skipped: Option<String>,
}

/// The surrogate `L(θ) = −agg(A · exp(log π_θ − log π_old))` and the policy's flat
/// parameters, over one experience.
struct Problem<'a> {
    state: &'a TrainState,
    exp: &'a Experience,
    config: &'a UpdateConfig,
    agg: AggOptions,
    /// The rows of the Fisher-vector products (`trpo.fisher_fraction` of `exp`'s) and their
    /// normaliser.
    fisher: Experience,
    fisher_agg: AggOptions,
}

const FUNC: &str = "trpo_update";

/// One TRPO step of `state`'s policy on `exp` (which has `old_log_probs` and per-token
/// advantages): direction `x ≈ −F⁻¹g` by `trpo.cg_iters` conjugate-gradient iterations on
/// `F + damping·I`, where `F·v` is the central finite difference of the gradient of the k2
/// KL `½(log π_θ − log π_old)²` (its Hessian at the old policy is the empirical Fisher, and
/// its gradient there is exactly 0) on `trpo.fisher_fraction` of the rows, with a parameter
/// shift of norm `trpo.fvp_shift`; the full
/// step `sqrt(2δ / xᵀFx)·x`; then fractions 1, ½, … until the surrogate improves by at least
/// `accept_ratio` of the linear prediction and the k3 KL stays within δ. Nothing changes when
/// no fraction is accepted or the gradient is not finite.
pub(crate) fn trpo_update(
    state: &TrainState,
    exp: &Experience,
    config: &UpdateConfig,
    trpo: &TrpoArgs,
) -> Result<TrpoStats> {
    let agg = with_step_normalizer(config.loss.policy.agg, &exp.normalizer);
    let fisher = fisher_rows(exp, trpo.fisher_fraction)?;
    // The subsample's own tokens and rows: its KL is a mean over them.
    let fisher_rows_normalizer = LossNormalizer {
        tokens: fisher.loss_tokens(FUNC)?,
        rows: fisher.num_rows(),
    };
    let fisher_agg = with_step_normalizer(agg, &fisher_rows_normalizer);
    let p = Problem {
        state,
        exp,
        config,
        agg,
        fisher,
        fisher_agg,
    };
    let theta = p.flat_params()?;
    let mut stats = TrpoStats::default();
    let (loss, g) = match p.gradient(&theta, Objective::Surrogate)? {
        Ok(found) => found,
        Err(reason) => {
            stats.skipped = Some(reason);
            return Ok(stats);
        }
    };
    stats.loss = loss;
    stats.grad_norm = g.iter().map(|x| x * x).sum::<f64>().sqrt();
    if !(stats.grad_norm > 0.0 && stats.grad_norm.is_finite()) {
        stats.skipped = Some(format!("surrogate gradient norm {}", stats.grad_norm));
        return Ok(stats);
    }
    let out = trust_region_update(
        &theta,
        loss,
        &g,
        |v| p.fisher_product(&theta, v, trpo),
        |params| {
            p.set_params(params)?;
            p.evaluate()
        },
        &trpo.trust_region(),
    )?;
    p.set_params(&out.params)?;
    stats.fraction = out.fraction;
    stats.kl = out.kl;
    stats.improvement = out.improvement;
    stats.cg_iterations = out.cg_iterations;
    stats.skipped = out.skipped;
    Ok(stats)
}

/// Which function of the policy a gradient is of.
#[derive(Clone, Copy)]
enum Objective {
    /// The surrogate loss.
    Surrogate,
    /// The k2 KL to the old policy.
    Kl,
}

impl Problem<'_> {
    fn params(&self) -> &[(String, Var)] {
        &self.state.params
    }

    /// The policy's parameters, flat, in `params` order.
    fn flat_params(&self) -> Result<Vec<f64>> {
        flatten_vars(self.params())
    }

    /// Sets the policy's parameters from a flat vector.
    fn set_params(&self, flat: &[f64]) -> Result<()> {
        set_vars_from_flat(self.params(), flat)
    }

    /// `objective`'s value and flat gradient at `theta` (the parameters are left at
    /// `theta`); `Err(reason)` when a micro-batch was not finite.
    fn gradient(
        &self,
        theta: &[f64],
        objective: Objective,
    ) -> Result<std::result::Result<(f64, Vec<f64>), String>> {
        self.set_params(theta)?;
        let steps = self.config.steps;
        let temperature = self.config.loss.temperature;
        let (exp, agg) = match objective {
            Objective::Surrogate => (self.exp, &self.agg),
            Objective::Kl => (&self.fisher, &self.fisher_agg),
        };
        let model = &self.state.model;
        let Accumulated { grads, outcome, .. } = accumulate_gradients(
            self.params(),
            exp,
            steps,
            self.state.comm.as_ref(),
            |_, mb| {
                let lp = experience_log_probs(model, mb, temperature, false)?.log_probs;
                if !masked_sum(FUNC, &lp, &mb.loss_mask)?.is_finite() {
                    return Ok(None);
                }
                let Some(old) = &mb.old_log_probs else {
                    return Err(atomrl_core::Error::missing(
                        FUNC,
                        "old_log_probs",
                        "the experience's old log-probs",
                    ));
                };
                let loss = match objective {
                    Objective::Surrogate => {
                        surrogate(&lp, old, &mb.advantages, &mb.loss_mask, agg)?
                    }
                    Objective::Kl => {
                        let k2 = compute_kl_penalty(&lp, old, &mb.loss_mask, KlEstimator::K2)?.kl;
                        aggregate_loss(&k2, &mb.loss_mask, agg)?
                    }
                };
                Ok(Some((loss, ())))
            },
        )?;
        if let Some(reason) = outcome.skipped {
            return Ok(Err(reason));
        }
        Ok(Ok((outcome.loss, grads.flat(self.params())?)))
    }

    /// `(F + damping·I)·v` by [`fisher_vector_product`] with a shift of norm
    /// `trpo.fvp_shift`; the parameters are restored to `theta`. `None` when a shifted
    /// policy's log-probs were not finite.
    fn fisher_product(
        &self,
        theta: &[f64],
        v: &[f64],
        trpo: &TrpoArgs,
    ) -> Result<Option<Vec<f64>>> {
        let norm = v.iter().map(|x| x * x).sum::<f64>().sqrt();
        if norm == 0.0 {
            return Ok(Some(vec![0.0; v.len()]));
        }
        // A skipped gradient is NaN here, so that the product is, and says so below.
        let grad_kl = |at: &[f64]| -> Result<Vec<f64>> {
            Ok(match self.gradient(at, Objective::Kl)? {
                Ok((_, g)) => g,
                Err(_) => vec![f64::NAN; at.len()],
            })
        };
        let fv = fisher_vector_product(grad_kl, theta, v, trpo.fvp_shift / norm)?;
        self.set_params(theta)?;
        if !fv.iter().all(|x| x.is_finite()) {
            return Ok(None);
        }
        Ok(Some(
            fv.iter()
                .zip(v)
                .map(|(f, x)| f + trpo.damping * x)
                .collect(),
        ))
    }

    /// The surrogate loss and the k3 KL to the old policy (token mean) at the current
    /// parameters, without a graph, micro-batch by micro-batch on the update's shards.
    fn evaluate(&self) -> Result<(f64, f64)> {
        let par = Parallel {
            workers: self.config.steps.workers,
            comm: self.state.comm.as_ref(),
        };
        let (steps, temperature) = (self.config.steps, self.config.loss.temperature);
        let lp = sharded_log_probs(
            &self.state.model,
            self.exp,
            par,
            steps.accumulation,
            temperature,
        )?;
        let exp = self.exp;
        if !masked_sum(FUNC, &lp, &exp.loss_mask)?.is_finite() {
            // A fraction of the step that breaks the policy: the line search rejects NaN.
            return Ok((f64::NAN, f64::NAN));
        }
        let Some(old) = &exp.old_log_probs else {
            return Err(atomrl_core::Error::missing(
                FUNC,
                "old_log_probs",
                "the experience's old log-probs",
            ));
        };
        let loss = surrogate(&lp, old, &exp.advantages, &exp.loss_mask, &self.agg)?;
        let loss = atomrl_core::shape::scalar_f64(FUNC, &loss)?;
        // `r − 1 − log r` with `r = π/π_old` on tokens sampled from π_old: unbiased for
        // KL(π_old ‖ π), the trust region's divergence.
        let k3 = compute_kl_penalty(old, &lp, &exp.loss_mask, KlEstimator::K3)?.kl;
        let tokens = exp.loss_tokens(FUNC)?;
        let kl = masked_sum(FUNC, &k3, &exp.loss_mask)? / tokens.max(1.0);
        Ok((loss, kl))
    }
}

/// Every `1/fraction`-th row of `exp`, evenly spaced (all rows at 1): the rows whose empirical
/// Fisher matrix stands for the batch's, as rllab's `subsample_factor` — the products cost
/// that fraction of a full pass.
fn fisher_rows(exp: &Experience, fraction: f64) -> Result<Experience> {
    let rows = exp.num_rows();
    let n = ((fraction * rows as f64).ceil() as usize).clamp(1, rows.max(1));
    if n >= rows {
        return Ok(exp.clone());
    }
    let picked: Vec<u32> = (0..n).map(|i| (i * rows / n) as u32).collect();
    exp.select(&picked)
}

/// `−agg(A · exp(log π − log π_old))`: the importance-weighted surrogate, whose gradient at
/// the old policy is the policy gradient.
fn surrogate(
    lp: &Tensor,
    old: &Tensor,
    advantages: &Tensor,
    mask: &Tensor,
    agg: &AggOptions,
) -> Result<Tensor> {
    let ratio = (lp - old).and_then(|d| d.exp()).ctx(FUNC)?;
    let weighted = if advantages.rank() == 1 {
        ratio.broadcast_mul(&advantages.unsqueeze(1).ctx(FUNC)?)
    } else {
        ratio.mul(advantages)
    };
    let per_token = weighted.and_then(|w| w.neg()).ctx(FUNC)?;
    aggregate_loss(&per_token, mask, agg)
}
