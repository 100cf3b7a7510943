//! The GRPO / DAPO step: the experience (rollouts with DAPO refills, rewards, advantages, old
//! and reference log-probs; `atomrl-rollout`), the policy update, and the step's metrics.

use std::sync::Arc;
use std::time::Instant;

use atomrl_core::Result;
use atomrl_model::CausalLm;
use atomrl_reward::{Accuracy, WeightedRewards};
use atomrl_rollout::parallel::Parallel;
use atomrl_rollout::{make_experience, ExperienceConfig, RolloutContext, RolloutSummary};

use super::update::{policy_update, UpdateStats};
use crate::config::{GRPOArgs, UpdateConfig};
use crate::data::EpochSampler;
use crate::logging::{keys, MetricRow};
use crate::recipe::{RecipeStep, RunData, StepExperience, StepReport};
use crate::state::TrainState;

/// The GRPO / DAPO recipe's step and what only it holds: the reward functions, the accuracy,
/// the frozen reference model (β > 0) and its typed settings.
pub(crate) struct GrpoStep {
    rewards: WeightedRewards,
    accuracy: Arc<Accuracy>,
    reference: Option<CausalLm>,
    experience: ExperienceConfig,
    update: UpdateConfig,
}

impl GrpoStep {
    /// The step of `args` on `model`: for β > 0, a frozen copy of its base weights is the
    /// reference model (with LoRA, the base model is TRL's reference too); β = 0 holds none.
    pub(crate) fn new(
        args: &GRPOArgs,
        model: &CausalLm,
        rewards: WeightedRewards,
        accuracy: Arc<Accuracy>,
    ) -> Result<Self> {
        Ok(Self {
            rewards,
            accuracy,
            reference: (args.beta > 0.0).then(|| model.frozen_copy()).transpose()?,
            // The stop and pad ids are the tokenizer's, set at each step.
            experience: args.experience(Vec::new(), 0),
            update: args.update(),
        })
    }
}

impl RecipeStep for GrpoStep {
    /// `batch_size` prompts, `num_generations` completions each, scored; with dynamic
    /// sampling, further rounds until `batch_size` groups have reward spread.
    fn experience(
        &mut self,
        run: &RunData,
        state: &TrainState,
        step: u64,
        sampler: &mut EpochSampler,
    ) -> Result<StepExperience> {
        let started = Instant::now();
        self.experience.sampling.stop_token_ids = run.tokenizer.eos_token_ids();
        self.experience.pad_token_id = run.tokenizer.pad_token_id();
        let view = state.model.detached();
        let ctx = RolloutContext {
            model: &view,
            tokenizer: &run.tokenizer,
            rewards: &self.rewards,
            accuracy: &self.accuracy,
            tools: run.tool_use(),
        };
        let par = Parallel {
            workers: run.args.workers,
            comm: state.comm.as_ref(),
        };
        let mut next_prompts = || {
            let picked = run.next_examples(sampler);
            let prompts = picked
                .iter()
                .map(|e| run.encoder.encode(&run.tokenizer, e))
                .collect::<Result<Vec<_>>>()?;
            Ok((
                prompts,
                picked.iter().map(|e| e.ground_truth.clone()).collect(),
            ))
        };
        let (experience, summary) = make_experience(
            &ctx,
            par,
            self.reference.as_ref(),
            &self.experience,
            step,
            &mut next_prompts,
        )?;
        Ok(StepExperience {
            experience,
            rollouts: Some(summary),
            seconds: started.elapsed().as_secs_f64(),
        })
    }

    /// The policy update on the experience, and the step's metrics.
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
        let stats = if exp.normalizer.rows == 0 {
            None
        } else {
            Some(policy_update(state, exp, &self.update, lr)?)
        };
        let train_s = started.elapsed().as_secs_f64();
        let reason = match &stats {
            Some(s) => s.skip_reason.clone(),
            None => Some("no group with reward spread".to_string()),
        };
        Ok(step_report(
            run,
            made,
            stats.as_ref(),
            reason,
            step,
            lr,
            train_s,
        ))
    }
}

/// The report of a step that generated: the rollouts' metrics, the policy update's (`stats`;
/// NaN when none ran), the timings, the samples, and a warning for truncated prompts and for
/// an update skipped for `skip_reason` (which also sets `skipped_step`).
pub(crate) fn step_report(
    run: &RunData,
    made: &StepExperience,
    stats: Option<&UpdateStats>,
    skip_reason: Option<String>,
    step: u64,
    lr: f64,
    train_s: f64,
) -> StepReport {
    let mut report = StepReport {
        row: MetricRow::new(step),
        ..Default::default()
    };
    let skipped = usize::from(skip_reason.is_some());
    if let Some(summary) = &made.rollouts {
        if summary.truncated_prompts > 0 {
            let (n, max) = (summary.truncated_prompts, run.args.max_prompt_length);
            report.warnings.push(format!("step {step}: {n} prompt(s) longer than max_prompt_length = {max} were left-truncated"));
        }
        record_rollouts(&mut report.row, summary);
        record_update(&mut report.row, stats, lr, skipped);
        record_timings(&mut report.row, summary, made.seconds, train_s);
        report.records = summary.records.clone();
    }
    if let Some(reason) = skip_reason {
        report
            .warnings
            .push(format!("step {step}: update skipped: {reason}"));
    }
    report
}

/// The rollouts' metrics: rewards (in all and per function), accuracy, lengths, truncation,
/// zero-spread and dropped groups, generation rounds, tool use.
fn record_rollouts(row: &mut MetricRow, s: &RolloutSummary) {
    row.push(keys::REWARD_MEAN, s.reward_mean);
    row.push(keys::REWARD_STD, s.reward_std);
    for (name, mean) in &s.reward_fn_means {
        row.push(keys::reward_fn_mean(name), *mean);
    }
    row.push(keys::ACCURACY, s.accuracy);
    row.push(keys::COMPLETION_LENGTH_MEAN, s.completion_length_mean);
    row.push(keys::COMPLETION_LENGTH_MAX, s.completion_length_max);
    row.push(keys::TRUNCATED_FRAC, s.truncated_frac);
    row.push(keys::ZERO_STD_GROUPS_FRAC, s.zero_std_groups_frac);
    row.push(keys::DROPPED_GROUPS, s.dropped_groups as f64);
    row.push(keys::GENERATION_ROUNDS, s.rounds as f64);
    if let Some(t) = &s.tools {
        row.push(keys::TOOLS_CALLS_PER_COMPLETION, t.calls_per_completion);
        row.push(keys::TOOLS_ERROR_RATE, t.error_rate);
        row.push(keys::TOOLS_MAX_TURNS_FRAC, t.max_turns_frac);
        row.push(keys::TOOLS_USE_FRAC, t.use_frac);
    }
}

/// The update's metrics (NaN when no update ran), the learning rate and the skip flag.
fn record_update(row: &mut MetricRow, stats: Option<&UpdateStats>, lr: f64, skipped: usize) {
    let s = stats.cloned().unwrap_or_default();
    let or_nan = |v: f64| if stats.is_some() { v } else { f64::NAN };
    row.push(keys::KL, or_nan(s.kl));
    row.push(keys::ENTROPY, or_nan(s.entropy));
    row.push(keys::CLIP_FRAC_LOW, or_nan(s.clip_frac_low));
    row.push(keys::CLIP_FRAC_HIGH, or_nan(s.clip_frac_high));
    row.push(keys::CLIP_FRAC_TOTAL, or_nan(s.clip_frac));
    row.push(keys::PPO_KL, or_nan(s.ppo_kl));
    row.push(keys::LOSS, or_nan(s.loss));
    row.push(keys::GRAD_NORM, or_nan(s.grad_norm));
    row.push(keys::LR, lr);
    row.push(keys::SKIPPED_STEP, skipped as f64);
}

/// The step's timings and throughputs.
fn record_timings(row: &mut MetricRow, s: &RolloutSummary, generate_s: f64, train_s: f64) {
    let step_s = generate_s + train_s;
    row.push(keys::TIME_STEP_S, step_s);
    row.push(keys::TIME_GENERATE_S, generate_s);
    row.push(keys::TIME_TRAIN_S, train_s);
    row.push(
        keys::THROUGHPUT_COMPLETIONS_PER_S,
        s.completions as f64 / step_s.max(1e-9),
    );
    row.push(
        keys::THROUGHPUT_TOKENS_PER_S,
        s.generated_tokens as f64 / step_s.max(1e-9),
    );
}
