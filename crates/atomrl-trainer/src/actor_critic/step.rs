//! The step of `ppo`, `a2c` and `trpo`: the GRPO experience (rollouts, rewards, old and
//! reference log-probs) plus the critic's values and GAE, then the actor's update (clipped
//! epochs, the vanilla gradient, or a trust-region step) and the critic's.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use atomrl_core::{Error, Result};
use atomrl_loss::{apply_kl_penalty, AdaptiveKlController, KlEstimator};
use atomrl_model::CausalLm;
use atomrl_reward::{Accuracy, WeightedRewards};
use atomrl_rollout::parallel::Parallel;
use atomrl_rollout::{
    attach_values_and_gae_keeping_graphs, attach_values_and_gae_with, outcome_token_rewards,
    values_statistics, GaeConfig,
};
use candle_core::{Tensor, TensorId};
use serde::{Deserialize, Serialize};

use super::critic::{Critic, CriticStats};
use super::trpo::{trpo_update, TrpoStats};
use crate::config::{GRPOArgs, Recipe, TrpoArgs, UpdateConfig};
use crate::data::EpochSampler;
use crate::grpo::{policy_and_value_update, policy_update, step_report, GrpoStep, UpdateStats};
use crate::logging::keys;
use crate::recipe::{RecipeStep, RunData, StepExperience, StepReport};
use crate::state::TrainState;

/// The file of the recipe's own state in a checkpoint (the KL coefficient).
const STATE_FILE: &str = "actor_critic_state.json";

/// The coefficient of the KL in the token rewards: fixed, or adaptive.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
enum KlCoef {
    Fixed(f64),
    Adaptive(AdaptiveKlController),
}

impl KlCoef {
    fn value(&self) -> f64 {
        match self {
            Self::Fixed(b) => *b,
            Self::Adaptive(c) => c.value(),
        }
    }
}

/// The actor-critic recipes' step.
pub(crate) struct ActorCriticStep {
    /// Makes the experience as GRPO does (the critic replaces its advantages).
    rollouts: GrpoStep,
    critic: Critic,
    recipe: Recipe,
    gae: GaeConfig,
    /// The KL in the token rewards (`None`: β = 0 or the KL is in the loss).
    kl: Option<KlCoef>,
    kl_estimator: KlEstimator,
    /// The batch KL of the last experience, for the adaptive controller.
    last_kl: Option<f64>,
    /// Seconds of the last experience's value pass.
    values_s: f64,
    warmup_steps: usize,
    /// `critic.actor_skip_flat_groups`.
    skip_flat_groups: bool,
    update: UpdateConfig,
    trpo: TrpoArgs,
    /// The value pass's values with their graph, by micro-batch, for the critic's first epoch
    /// on the same experience (its `input_ids`, to know it is the same).
    value_graphs: Option<(TensorId, Vec<Option<Tensor>>)>,
}

impl ActorCriticStep {
    pub(crate) fn new(
        args: &GRPOArgs,
        model: &CausalLm,
        rewards: WeightedRewards,
        accuracy: Arc<Accuracy>,
    ) -> Result<Self> {
        let c = args.critic();
        let kl = (args.kl_in_reward() && args.beta > 0.0)
            .then(|| match c.kl_target {
                Some(t) => {
                    AdaptiveKlController::new(args.beta, t, c.kl_horizon).map(KlCoef::Adaptive)
                }
                None => Ok(KlCoef::Fixed(args.beta)),
            })
            .transpose()?;
        Ok(Self {
            rollouts: GrpoStep::new(args, model, rewards, accuracy)?,
            critic: Critic::new(args, model)?,
            recipe: args.recipe,
            gae: GaeConfig {
                gamma: c.gamma,
                lam: c.lam,
                actor_lam: c.actor_lam,
                whiten: c.whiten_advantages,
                micro_batches: args.gradient_accumulation_steps,
            },
            kl,
            kl_estimator: args.kl_estimator,
            last_kl: None,
            values_s: 0.0,
            warmup_steps: c.warmup_steps,
            skip_flat_groups: c.actor_skip_flat_groups,
            update: args.update(),
            trpo: args.trpo.clone().unwrap_or_default(),
            value_graphs: None,
        })
    }

    /// The actor's update: none during the critic's warm-up; PPO's clipped epochs or A2C's
    /// gradient step (`policy_update`; with a head on the actor's transformer,
    /// `policy_and_value_update`, which trains the head too), or TRPO's trust-region step.
    fn actor_update(
        &mut self,
        state: &mut TrainState,
        made: &StepExperience,
        step: u64,
        lr: f64,
    ) -> Result<ActorOutcome> {
        let exp = &made.experience;
        if step as usize <= self.warmup_steps {
            return Ok(ActorOutcome::WarmingUp);
        }
        if exp.num_rows() == 0 || exp.normalizer.tokens == 0.0 {
            return Ok(ActorOutcome::Skipped(
                "no completion token in the loss".into(),
            ));
        }
        Ok(match self.recipe {
            Recipe::Trpo => ActorOutcome::Trpo(trpo_update(state, exp, &self.update, &self.trpo)?),
            _ if self.critic.shares_backbone() => {
                let value = self.critic.value_term();
                ActorOutcome::Gradient(policy_and_value_update(
                    state,
                    exp,
                    &self.update,
                    lr,
                    value,
                )?)
            }
            _ if self.skip_flat_groups => {
                let kept = exp.without_flat_groups()?;
                ActorOutcome::Gradient(policy_update(state, &kept, &self.update, lr)?)
            }
            _ => ActorOutcome::Gradient(policy_update(state, exp, &self.update, lr)?),
        })
    }
}

/// What the actor's part of a step did.
enum ActorOutcome {
    WarmingUp,
    Skipped(String),
    Gradient(UpdateStats),
    Trpo(TrpoStats),
}

impl RecipeStep for ActorCriticStep {
    /// GRPO's experience, then the token rewards (each row's reward on its last token, minus
    /// `β·KL(π_old ‖ π_ref)` per token when the KL is in the reward), the critic's values and
    /// GAE's per-token advantages and returns.
    fn experience(
        &mut self,
        run: &RunData,
        state: &TrainState,
        step: u64,
        sampler: &mut EpochSampler,
    ) -> Result<StepExperience> {
        let started = Instant::now();
        self.value_graphs = None;
        self.values_s = 0.0;
        let mut made = self.rollouts.experience(run, state, step, sampler)?;
        let exp = &mut made.experience;
        self.last_kl = None;
        if exp.num_rows() > 0 && exp.normalizer.tokens > 0.0 {
            let mut rewards = outcome_token_rewards(exp)?;
            if let Some(kl) = &self.kl {
                let (Some(old), Some(reference)) = (&exp.old_log_probs, &exp.ref_log_probs) else {
                    return Err(Error::missing(
                        "ppo",
                        "old_log_probs",
                        "the old and reference log-probs of a KL in the reward",
                    ));
                };
                let out = apply_kl_penalty(
                    &rewards,
                    old,
                    reference,
                    &exp.loss_mask,
                    kl.value(),
                    self.kl_estimator,
                )?;
                rewards = out.rewards;
                self.last_kl = Some(out.kl_mean);
            }
            // Whitening needs two tokens; a lone one keeps its raw advantage.
            let gae = GaeConfig {
                whiten: self.gae.whiten && exp.loss_tokens("ppo")? >= 2.0,
                ..self.gae
            };
            let par = Parallel {
                workers: run.args.workers,
                comm: state.comm.as_ref(),
            };
            let values_started = Instant::now();
            if self.critic.shares_backbone() || gae.micro_batches > 1 {
                // No graph: the values only feed the advantages and returns.
                let critic = self.critic.model.detached();
                attach_values_and_gae_with(exp, &critic, par, &gae, &rewards)?;
            } else {
                // One micro-batch per worker: its graph held until the critic's update costs
                // no more memory than that update's forward, which it saves.
                let critic = &self.critic.model;
                let kept = attach_values_and_gae_keeping_graphs(exp, critic, par, &gae, &rewards)?;
                self.value_graphs = Some((exp.input_ids.id(), kept));
            }
            self.values_s = values_started.elapsed().as_secs_f64();
        }
        made.seconds = started.elapsed().as_secs_f64();
        Ok(made)
    }

    /// The actor's update (after the critic's warm-up), then `num_iterations` epochs of the
    /// critic, the KL controller, and the metrics (`critic/*`, `kl_reward/*`, `trpo/*`).
    fn update(
        &mut self,
        run: &RunData,
        state: &mut TrainState,
        made: &StepExperience,
        step: u64,
        lr: f64,
    ) -> Result<StepReport> {
        let started = Instant::now();
        let exp = &made.experience;
        let value_graphs = self
            .value_graphs
            .take()
            .filter(|(id, _)| *id == exp.input_ids.id())
            .map(|(_, kept)| kept);
        let actor = self.actor_update(state, made, step, lr)?;
        let mut critic_started = None;
        let critic =
            if let (true, ActorOutcome::Gradient(s)) = (self.critic.shares_backbone(), &actor) {
                // The head trained in the actor's pass.
                Some(CriticStats {
                    value_loss: s.value_loss,
                    clip_frac: s.value_clip_frac,
                    grad_norm: s.grad_norm,
                    skipped: s.skip_reason.clone(),
                })
            } else if exp.num_rows() > 0 && exp.normalizer.tokens > 0.0 {
                let agg = self.update.loss.policy.agg;
                critic_started = Some(Instant::now());
                Some(self.critic.update(
                    exp,
                    self.update.steps,
                    agg,
                    self.update.iterations,
                    state.comm.as_ref(),
                    value_graphs.as_deref(),
                )?)
            } else {
                None
            };
        let critic_s = critic_started.map_or(0.0, |t| t.elapsed().as_secs_f64());
        if let (Some(KlCoef::Adaptive(c)), Some(kl)) = (&mut self.kl, self.last_kl) {
            c.update(kl, exp.num_rows());
        }
        let train_s = started.elapsed().as_secs_f64();
        let (stats, reason) = match &actor {
            ActorOutcome::WarmingUp => (None, None),
            ActorOutcome::Skipped(r) => (None, Some(r.clone())),
            ActorOutcome::Gradient(s) => (Some(s.clone()), s.skip_reason.clone()),
            ActorOutcome::Trpo(t) => (Some(trpo_as_update(t)), t.skipped.clone()),
        };
        let mut report = step_report(run, made, stats.as_ref(), reason, step, lr, train_s);
        report.row.push(keys::TIME_CRITIC_VALUES_S, self.values_s);
        report.row.push(keys::TIME_CRITIC_TRAIN_S, critic_s);
        self.record(&mut report, made, critic.as_ref(), &actor)?;
        Ok(report)
    }

    fn save(&self, dir: &Path) -> Result<()> {
        self.critic.save(dir)?;
        let path = dir.join(STATE_FILE);
        let text =
            serde_json::to_string_pretty(&self.kl).map_err(|e| Error::file(path.display(), e))?;
        std::fs::write(&path, text).map_err(|e| Error::file(path.display(), e))
    }

    fn load(&mut self, dir: &Path) -> Result<()> {
        self.critic.load(dir)?;
        let path = dir.join(STATE_FILE);
        let text = std::fs::read_to_string(&path).map_err(|e| Error::file(path.display(), e))?;
        self.kl = serde_json::from_str(&text).map_err(|e| Error::file(path.display(), e))?;
        Ok(())
    }
}

impl ActorCriticStep {
    /// The critic's, the KL reward's and TRPO's metrics of a step.
    fn record(
        &self,
        report: &mut StepReport,
        made: &StepExperience,
        critic: Option<&CriticStats>,
        actor: &ActorOutcome,
    ) -> Result<()> {
        let row = &mut report.row;
        let v = values_statistics(&made.experience)?;
        let c = critic.cloned().unwrap_or(CriticStats {
            value_loss: f64::NAN,
            clip_frac: f64::NAN,
            grad_norm: f64::NAN,
            skipped: None,
        });
        row.push(keys::CRITIC_VALUE_LOSS, c.value_loss);
        row.push(keys::CRITIC_CLIP_FRAC, c.clip_frac);
        row.push(keys::CRITIC_GRAD_NORM, c.grad_norm);
        row.push(keys::CRITIC_EXPLAINED_VARIANCE, v.explained_variance);
        row.push(keys::CRITIC_VALUES_MEAN, v.values_mean);
        row.push(keys::CRITIC_RETURNS_MEAN, v.returns_mean);
        if let Some(reason) = c.skipped {
            report.warnings.push(format!(
                "step {}: critic update skipped: {reason}",
                row.step
            ));
        }
        if let Some(kl) = &self.kl {
            row.push(keys::KL_REWARD_MEAN, self.last_kl.unwrap_or(f64::NAN));
            row.push(keys::KL_REWARD_COEF, kl.value());
        }
        if let ActorOutcome::Trpo(t) = actor {
            row.push(keys::TRPO_STEP_FRACTION, t.fraction);
            row.push(keys::TRPO_KL, t.kl);
            row.push(keys::TRPO_IMPROVEMENT, t.improvement);
            row.push(keys::TRPO_CG_ITERATIONS, t.cg_iterations as f64);
        }
        Ok(())
    }
}

/// A TRPO step's figures in the policy update's metrics (loss, gradient norm, KL to the old
/// policy as `ppo_kl`).
fn trpo_as_update(t: &TrpoStats) -> UpdateStats {
    UpdateStats {
        loss: t.loss,
        grad_norm: t.grad_norm,
        ppo_kl: t.kl,
        kl: f64::NAN,
        entropy: f64::NAN,
        skipped: usize::from(t.skipped.is_some()),
        skip_reason: t.skipped.clone(),
        ..Default::default()
    }
}
