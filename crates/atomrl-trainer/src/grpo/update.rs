//! The policy update of one step: log-probs, loss (+ β·KL − entropy bonus), gradient
//! accumulation with the global normaliser, clipping, the NaN/Inf guard, AdamW.

use atomrl_core::shape::masked_sum;
use atomrl_core::Error;
use atomrl_core::{CandleContext, Result};
use atomrl_loss::{
    aggregate_loss, compute_kl_penalty, compute_pg_loss, compute_policy_loss, compute_value_loss,
    PolicyLossOptions,
};
use atomrl_model::ValueModel;
use atomrl_rollout::{experience_log_probs, experience_log_probs_and_hidden, Experience};
use candle_core::{Tensor, Var};

use crate::accumulate::{
    accumulate_gradients, clip_and_step, with_step_normalizer, zero_gradient_step, MicroStatistics,
    StepSettings,
};
use crate::config::{LossConfig, PolicyObjective, UpdateConfig};
use crate::optim::AdamW;
use crate::state::TrainState;

/// What an update measured.
#[derive(Debug, Clone, Default)]
pub struct UpdateStats {
    /// The loss (sum over micro-batches = the full-batch loss), last iteration.
    pub loss: f64,
    /// Gradient norm before clipping, last iteration.
    pub grad_norm: f64,
    /// Token-weighted clip fractions and approximate KL to the old policy.
    pub clip_frac: f64,
    /// Share of tokens clipped at `1 − ε_low`.
    pub clip_frac_low: f64,
    /// Share of tokens clipped at `1 + ε_high`.
    pub clip_frac_high: f64,
    /// Masked mean of `old − new` log-probs.
    pub ppo_kl: f64,
    /// Masked mean KL to the reference (NaN when β = 0: no reference is held).
    pub kl: f64,
    /// Masked mean entropy of the policy on the completions.
    pub entropy: f64,
    /// Optimizer updates skipped because the loss or gradient norm was not finite.
    pub skipped: usize,
    /// Why the last skip happened.
    pub skip_reason: Option<String>,
    /// With a [`ValueTerm`]: its loss (times `vf_coef`, part of `loss`) and the token share
    /// with the value clip active, last iteration (NaN without one).
    pub value_loss: f64,
    /// See `value_loss`.
    pub value_clip_frac: f64,
}

/// A value head on the policy's own hidden states, trained in the policy's forward and
/// backward pass (PPO with a shared backbone): `vf_coef ·` the clipped value loss joins each
/// micro-batch's loss, the transformer's gradient carries both, and the head's parameters
/// step with their own optimizer at their own learning rate (after one global-norm clip over
/// all of them).
pub struct ValueTerm<'a> {
    /// The head, over the policy's transformer ([`ValueModel::sharing_backbone`]).
    pub critic: &'a ValueModel,
    /// The head's optimizer (over [`ValueModel::trainable_vars`]).
    pub optimizer: &'a mut AdamW,
    /// The head's learning rate.
    pub lr: f64,
    /// Scale of the value loss.
    pub vf_coef: f64,
    /// The value clip around the experience's values.
    pub clip_range_value: f64,
}

/// Token-weighted sums of one micro-batch's statistics (each metric times its scored tokens).
#[derive(Debug, Clone, Copy, Default)]
struct MicroStats {
    clip: f64,
    low: f64,
    high: f64,
    ppo_kl: f64,
    kl: f64,
    entropy: f64,
    weight: f64,
    /// The value term's loss (a sum over micro-batches is the full-batch term).
    value_loss: f64,
    /// Tokens with the value clip active.
    value_clip: f64,
}

impl MicroStats {
    /// Writes the token-weighted means into `stats` (the KL only when a reference was used).
    fn write_means(self, stats: &mut UpdateStats, with_kl: bool) {
        if self.weight > 0.0 {
            stats.clip_frac = self.clip / self.weight;
            stats.clip_frac_low = self.low / self.weight;
            stats.clip_frac_high = self.high / self.weight;
            stats.ppo_kl = self.ppo_kl / self.weight;
            stats.entropy = self.entropy / self.weight;
            if with_kl {
                stats.kl = self.kl / self.weight;
            }
        }
    }

    fn add(self, o: Self) -> Self {
        Self {
            clip: self.clip + o.clip,
            low: self.low + o.low,
            high: self.high + o.high,
            ppo_kl: self.ppo_kl + o.ppo_kl,
            kl: self.kl + o.kl,
            entropy: self.entropy + o.entropy,
            weight: self.weight + o.weight,
            value_loss: self.value_loss + o.value_loss,
            value_clip: self.value_clip + o.value_clip,
        }
    }
}

impl MicroStatistics for MicroStats {
    fn to_f64s(&self) -> Vec<f64> {
        let s = self;
        vec![
            s.clip,
            s.low,
            s.high,
            s.ppo_kl,
            s.kl,
            s.entropy,
            s.weight,
            s.value_loss,
            s.value_clip,
        ]
    }

    fn from_f64s(v: &[f64]) -> Self {
        let at = |i: usize| v.get(i).copied().unwrap_or(0.0);
        Self {
            clip: at(0),
            low: at(1),
            high: at(2),
            ppo_kl: at(3),
            kl: at(4),
            entropy: at(5),
            weight: at(6),
            value_loss: at(7),
            value_clip: at(8),
        }
    }
}

/// Runs `config.iterations` optimizer updates of `state` on `exp` at learning rate `lr`: the
/// clipped policy loss (with the old log-probs of the experience when it has them, else the
/// current ones detached), `+ β·KL` to the experience's reference log-probs, `−` the entropy
/// bonus, each aggregated with the step's normaliser; gradient accumulation over the
/// micro-batches of every worker and rank, clipping, the NaN/Inf guard, AdamW.
///
/// An experience with no rows but a normaliser (every group flat: its rows were dropped) takes
/// one zero-gradient optimizer step per iteration, as TRL and verl do.
///
/// # Errors
/// Tensor or shape failures (a non-finite loss is not an error: the step is skipped).
pub fn policy_update(
    state: &mut TrainState,
    exp: &Experience,
    config: &UpdateConfig,
    lr: f64,
) -> Result<UpdateStats> {
    update_with(state, exp, config, lr, None)
}

/// [`policy_update`] with a value head on the policy's hidden states ([`ValueTerm`]): the
/// experience's `values` and `returns` (`atomrl_rollout::attach_values_and_gae`) give the
/// clipped value loss, added to each micro-batch's loss; one global-norm clip covers the
/// policy's and the head's gradients; each optimizer then steps at its own learning rate.
///
/// # Errors
/// An experience without values or returns; as [`policy_update`].
pub fn policy_and_value_update(
    state: &mut TrainState,
    exp: &Experience,
    config: &UpdateConfig,
    lr: f64,
    value: ValueTerm<'_>,
) -> Result<UpdateStats> {
    if exp.num_rows() > 0 && (exp.values.is_none() || exp.returns.is_none()) {
        return Err(Error::missing(
            "policy_and_value_update",
            "values",
            "the experience's values and returns (attach_values_and_gae)",
        ));
    }
    update_with(state, exp, config, lr, Some(value))
}

/// The update of [`policy_update`] and [`policy_and_value_update`].
fn update_with(
    state: &mut TrainState,
    exp: &Experience,
    config: &UpdateConfig,
    lr: f64,
    mut value: Option<ValueTerm<'_>>,
) -> Result<UpdateStats> {
    let mut stats = UpdateStats {
        kl: f64::NAN,
        value_loss: f64::NAN,
        value_clip_frac: f64::NAN,
        ..Default::default()
    };
    if exp.normalizer.tokens == 0.0 {
        stats.skipped = 1;
        stats.skip_reason = Some("no completion token counts in the loss".into());
        return Ok(stats);
    }
    if exp.num_rows() == 0 {
        // Every group is flat: the loss and its gradient are exactly 0. Like TRL and verl, the
        // optimizer still steps (zero gradient: the moments decay, weight decay applies, the
        // step count advances), once per iteration.
        for _ in 0..config.iterations {
            zero_gradient_step(&mut state.optimizer, lr)?;
            if let Some(v) = value.as_mut() {
                zero_gradient_step(v.optimizer, v.lr)?;
            }
        }
        return Ok(stats);
    }
    let opts = loss_options(&config.loss.policy, exp);
    let mut params: Vec<(String, Var)> = state.params.clone();
    if let Some(v) = &value {
        params.extend(v.optimizer.params().iter().cloned());
    }
    let settings = StepSettings { lr, ..config.steps };
    for _ in 0..config.iterations {
        let loss = MicroLoss {
            model: &state.model,
            config: &config.loss,
            opts: &opts,
            value: value.as_ref().map(|v| ValueSettings {
                critic: v.critic,
                vf_coef: v.vf_coef,
                clip_range_value: v.clip_range_value,
            }),
        };
        let casts = state.model.share_weight_casts();
        let acc = accumulate_gradients(&params, exp, settings, state.comm.as_ref(), |_, mb| {
            loss.of(mb)
        })?;
        drop(casts);
        let mut optimizers = vec![(&mut state.optimizer, lr)];
        if let Some(v) = value.as_mut() {
            optimizers.push((&mut *v.optimizer, v.lr));
        }
        let (outcome, parts) = clip_and_step(acc, settings.max_grad_norm, &mut optimizers)?;
        let m = parts
            .into_iter()
            .fold(MicroStats::default(), MicroStats::add);
        stats.loss = outcome.loss;
        stats.grad_norm = outcome.grad_norm;
        m.write_means(&mut stats, exp.ref_log_probs.is_some());
        if value.is_some() {
            stats.value_loss = m.value_loss;
            stats.value_clip_frac = if m.weight > 0.0 {
                m.value_clip / m.weight
            } else {
                0.0
            };
        }
        if let Some(reason) = outcome.skipped {
            stats.skipped += 1;
            stats.skip_reason = Some(reason);
        }
    }
    Ok(stats)
}

/// The policy-loss options with the step's normaliser ([`with_step_normalizer`]).
fn loss_options(policy: &PolicyLossOptions, exp: &Experience) -> PolicyLossOptions {
    PolicyLossOptions {
        agg: with_step_normalizer(policy.agg, &exp.normalizer),
        ..*policy
    }
}

/// The loss of one micro-batch: the clipped policy loss, `+ β·KL` to the reference, `−` the
/// entropy bonus, each aggregated with the step's normaliser.
struct MicroLoss<'a> {
    model: &'a atomrl_model::CausalLm,
    config: &'a LossConfig,
    opts: &'a PolicyLossOptions,
    value: Option<ValueSettings<'a>>,
}

/// What the micro-batch loss needs of a [`ValueTerm`].
struct ValueSettings<'a> {
    critic: &'a ValueModel,
    vf_coef: f64,
    clip_range_value: f64,
}

impl ValueSettings<'_> {
    /// `vf_coef ·` the clipped value loss of micro-batch `mb` from the policy's `hidden`
    /// states (`[R, T, H]`), its value, and its clip fraction.
    fn term(
        &self,
        mb: &Experience,
        hidden: &Tensor,
        agg: &atomrl_loss::AggOptions,
    ) -> Result<(Tensor, f64, f64)> {
        let func = "update";
        let (Some(old), Some(returns)) = (&mb.values, &mb.returns) else {
            return Err(Error::missing(
                func,
                "values",
                "the experience's values and returns (attach_values_and_gae)",
            ));
        };
        let values = self.critic.head(hidden)?;
        let out = compute_value_loss(
            &values,
            old,
            returns,
            &mb.loss_mask,
            self.clip_range_value,
            agg,
        )?;
        let term = (out.loss * self.vf_coef).ctx(func)?;
        let value = atomrl_core::shape::scalar_f64(func, &term)?;
        Ok((term, value, out.clip_frac))
    }
}

impl MicroLoss<'_> {
    /// The loss of micro-batch `mb` and its token-weighted statistics; `None` when its
    /// log-probs are not finite.
    fn of(&self, mb: &Experience) -> Result<Option<(Tensor, MicroStats)>> {
        let func = "update";
        let c = self.config;
        let agg = &self.opts.agg;
        let mask = &mb.loss_mask;
        let tokens = mb.loss_tokens(func)?;
        let (out, hidden) = match &self.value {
            Some(_) => {
                let (out, hidden) =
                    experience_log_probs_and_hidden(self.model, mb, c.temperature, true)?;
                (out, Some(hidden))
            }
            None => (
                experience_log_probs(self.model, mb, c.temperature, true)?,
                None,
            ),
        };
        let lp = out.log_probs;
        let lp_sum = masked_sum(func, &lp, mask)?;
        if !lp_sum.is_finite() {
            return Ok(None);
        }
        let (mut loss, mut m) = self.policy_term(&lp, mb, tokens)?;
        if let (Some(v), Some(hidden)) = (&self.value, &hidden) {
            let (term, value_loss, clip) = v.term(mb, hidden, agg)?;
            loss = (loss + term).ctx(func)?;
            m.value_loss = value_loss;
            m.value_clip = clip * tokens;
        }
        if let Some(r) = &mb.ref_log_probs {
            let k = compute_kl_penalty(&lp, r, mask, c.kl_estimator)?;
            let term = aggregate_loss(&k.kl, mask, agg)?;
            loss = (loss + (term * c.beta).ctx(func)?).ctx(func)?;
            m.kl = masked_sum(func, &k.kl, mask)?;
        }
        if let Some(entropy) = &out.entropy {
            if c.entropy_coef > 0.0 {
                let term = aggregate_loss(entropy, mask, agg)?;
                loss = (loss - (term * c.entropy_coef).ctx(func)?).ctx(func)?;
            }
            m.entropy = masked_sum(func, entropy, mask)?;
        }
        Ok(Some((loss, m)))
    }

    /// The policy term of micro-batch `mb` (log-probs `lp`, `tokens` scored) and its
    /// token-weighted clip statistics (none for the vanilla gradient, which does not clip).
    fn policy_term(
        &self,
        lp: &Tensor,
        mb: &Experience,
        tokens: f64,
    ) -> Result<(Tensor, MicroStats)> {
        let mask = &mb.loss_mask;
        if self.config.objective == PolicyObjective::VanillaGradient {
            let loss = compute_pg_loss(lp, &mb.advantages, mask, &self.opts.agg)?;
            let m = MicroStats {
                weight: tokens,
                ..Default::default()
            };
            return Ok((loss, m));
        }
        let old = mb.old_log_probs.clone().unwrap_or_else(|| lp.detach());
        let pl = compute_policy_loss(lp, &old, &mb.advantages, mask, self.opts)?;
        let m = MicroStats {
            clip: pl.clip_frac * tokens,
            low: pl.clip_frac_low * tokens,
            high: pl.clip_frac_high * tokens,
            ppo_kl: pl.ppo_kl * tokens,
            weight: tokens,
            ..Default::default()
        };
        Ok((pl.loss, m))
    }
}
