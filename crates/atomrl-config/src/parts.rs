//! The typed parts of [`GRPOArgs`] each phase reads: sampling, experience, loss, optimizer.
//! The user-facing keys stay the flat fields of [`GRPOArgs`]; these are views of them.

use atomrl_loss::{AggOptions, KlEstimator, PolicyLossOptions};
use atomrl_optim::{AdamWConfig, StepSettings};
use atomrl_rollout::ExperienceConfig;
use atomrl_sample::SamplingParams;

use super::actor_critic::CriticArgs;
use super::args::{GRPOArgs, Recipe};
use super::preference::{DpoArgs, RewardModelArgs};

/// The policy term of the loss.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PolicyObjective {
    /// PPO's clipped surrogate (`compute_policy_loss`): GRPO, DAPO, PPO.
    ClippedSurrogate,
    /// The vanilla policy gradient `−A·log π` (`compute_pg_loss`): A2C.
    VanillaGradient,
}

/// The loss of the policy update: the policy term, `+ β·KL` to the reference and `−` the
/// entropy bonus.
#[derive(Debug, Clone)]
pub struct LossConfig {
    /// The policy term.
    pub objective: PolicyObjective,
    /// Clipping, ratio level and aggregation (the normaliser is set per step).
    pub policy: PolicyLossOptions,
    /// KL coefficient β (0: no reference model).
    pub beta: f64,
    /// The KL estimator.
    pub kl_estimator: KlEstimator,
    /// Entropy bonus coefficient.
    pub entropy_coef: f64,
    /// The temperature of the training log-probs (the sampling temperature, as TRL does).
    pub temperature: f64,
}

/// What the policy update reads: its loss, how many optimizer steps it takes on one
/// experience, and how each is accumulated and clipped.
#[derive(Debug, Clone)]
pub struct UpdateConfig {
    /// The loss.
    pub loss: LossConfig,
    /// Optimizer steps per experience (`num_iterations`).
    pub iterations: usize,
    /// Micro-batches, workers and clipping of each optimizer step (its `lr` is the step's).
    pub steps: StepSettings,
}

impl GRPOArgs {
    /// The sampling settings of the rollouts (`seed` is the run's; each round derives its own).
    ///
    /// ```
    /// use atomrl_config::{GRPOArgs, Recipe};
    /// let p = GRPOArgs::preset(Recipe::Grpo).sampling(vec![2]);
    /// assert_eq!((p.num_generations, p.stop_token_ids), (8, vec![2]));
    /// ```
    pub fn sampling(&self, stop_token_ids: Vec<u32>) -> SamplingParams {
        SamplingParams {
            num_generations: self.num_generations,
            max_new_tokens: self.max_completion_length,
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            min_p: self.min_p,
            repetition_penalty: self.repetition_penalty,
            stop_token_ids,
            seed: self.seed,
            ..Default::default()
        }
    }

    /// How each step's experience is made.
    ///
    /// ```
    /// use atomrl_config::{GRPOArgs, Recipe};
    /// let e = GRPOArgs::preset(Recipe::Dapo).experience(vec![2], 0);
    /// assert!(e.dynamic_sampling && e.drop_zero_advantage && !e.old_log_probs);
    /// ```
    pub fn experience(&self, stop_token_ids: Vec<u32>, pad_token_id: u32) -> ExperienceConfig {
        ExperienceConfig {
            sampling: self.sampling(stop_token_ids),
            batch_size: self.batch_size,
            dynamic_sampling: self.dynamic_sampling,
            max_rounds: self.max_num_gen_batches,
            group_advantages: !self.recipe.has_critic(),
            advantage_mode: self.advantage_mode,
            advantage_eps: self.advantage_eps,
            mask_truncated_completions: self.mask_truncated_completions,
            // A critic's per-token advantages replace the rows' after this phase.
            // DPO pairs rows by their rewards, whatever their advantages.
            drop_zero_advantage: self.beta == 0.0
                && self.entropy_coef == 0.0
                && !self.recipe.has_critic()
                && self.recipe != Recipe::Dpo,
            // DPO's loss compares with the reference, never with the old policy.
            old_log_probs: self.recipe != Recipe::Dpo && self.num_iterations > 1
                || self.recipe == Recipe::Trpo
                || (self.kl_in_reward() && self.beta > 0.0),
            micro_batches: self.gradient_accumulation_steps,
            pad_token_id,
            log_records: if self.logging_steps > 0 {
                self.log_completions_max
            } else {
                0
            },
        }
    }

    /// The policy update's settings.
    ///
    /// ```
    /// use atomrl_config::{GRPOArgs, Recipe};
    /// let u = GRPOArgs::preset(Recipe::Grpo).update();
    /// assert_eq!((u.iterations, u.loss.beta), (1, 0.0));
    /// ```
    pub fn update(&self) -> UpdateConfig {
        UpdateConfig {
            loss: LossConfig {
                objective: if self.recipe == Recipe::A2c {
                    PolicyObjective::VanillaGradient
                } else {
                    PolicyObjective::ClippedSurrogate
                },
                policy: PolicyLossOptions {
                    clip_low: self.clip_low,
                    clip_high: self.clip_high,
                    clip_ratio_c: self.clip_ratio_c,
                    ratio_level: self.ratio_level,
                    agg: AggOptions {
                        mode: self.loss_agg,
                        max_len: Some(self.max_completion_length),
                        global_tokens: None,
                        global_seqs: None,
                    },
                },
                beta: if self.kl_in_reward() { 0.0 } else { self.beta },
                kl_estimator: self.kl_estimator,
                entropy_coef: self.entropy_coef,
                temperature: self.temperature,
            },
            iterations: self.num_iterations,
            steps: self.step_settings(),
        }
    }

    /// Micro-batches, workers and clipping of an optimizer step (`lr` 0: set per step).
    ///
    /// ```
    /// use atomrl_config::{GRPOArgs, Recipe};
    /// assert_eq!(GRPOArgs::preset(Recipe::Grpo).step_settings().accumulation, 1);
    /// ```
    pub fn step_settings(&self) -> StepSettings {
        StepSettings {
            accumulation: self.gradient_accumulation_steps,
            workers: self.workers,
            max_grad_norm: self.max_grad_norm,
            lr: 0.0,
        }
    }

    /// The critic's settings (`[critic]`, its defaults when absent).
    ///
    /// ```
    /// use atomrl_config::{GRPOArgs, Recipe};
    /// let c = GRPOArgs::preset(Recipe::Ppo).critic();
    /// assert_eq!((c.gamma, c.lam, c.lr), (1.0, 0.95, None));
    /// ```
    pub fn critic(&self) -> CriticArgs {
        self.critic.clone().unwrap_or_default()
    }

    /// DPO's loss settings (`[dpo]`, its defaults when absent).
    ///
    /// ```
    /// use atomrl_config::{GRPOArgs, Recipe};
    /// assert_eq!(GRPOArgs::preset(Recipe::Grpo).dpo().beta, 0.1);
    /// ```
    pub fn dpo(&self) -> DpoArgs {
        self.dpo.clone().unwrap_or_default()
    }

    /// The reward model's settings (`[reward_model]`, its defaults when absent).
    ///
    /// ```
    /// use atomrl_config::{GRPOArgs, Recipe};
    /// assert_eq!(GRPOArgs::preset(Recipe::Grpo).reward_model().center_rewards_coefficient, None);
    /// ```
    pub fn reward_model(&self) -> RewardModelArgs {
        self.reward_model.clone().unwrap_or_default()
    }

    /// The options of [`atomrl_loss::compute_dpo_loss`] from `[dpo]`.
    ///
    /// ```
    /// use atomrl_config::{GRPOArgs, Recipe};
    /// assert_eq!(GRPOArgs::preset(Recipe::Dpo).dpo_options().beta, 0.1);
    /// ```
    pub fn dpo_options(&self) -> atomrl_loss::DpoOptions {
        let d = self.dpo();
        atomrl_loss::DpoOptions {
            beta: d.beta,
            loss_type: d.loss_type,
            label_smoothing: d.label_smoothing,
        }
    }

    /// Whether `β·KL` goes into the token rewards rather than the loss (actor-critic recipes
    /// with `critic.kl_in_reward`).
    ///
    /// ```
    /// use atomrl_config::{GRPOArgs, Recipe};
    /// assert!(GRPOArgs::preset(Recipe::Ppo).kl_in_reward());
    /// assert!(!GRPOArgs::preset(Recipe::Grpo).kl_in_reward());
    /// ```
    pub fn kl_in_reward(&self) -> bool {
        self.recipe.has_critic() && self.critic().kl_in_reward
    }

    /// AdamW's settings.
    ///
    /// ```
    /// use atomrl_config::{GRPOArgs, Recipe};
    /// assert_eq!(GRPOArgs::preset(Recipe::Grpo).adamw().beta1, 0.9);
    /// ```
    pub fn adamw(&self) -> AdamWConfig {
        AdamWConfig {
            beta1: self.adam_beta1,
            beta2: self.adam_beta2,
            eps: self.adam_eps,
            weight_decay: self.weight_decay,
        }
    }
}
