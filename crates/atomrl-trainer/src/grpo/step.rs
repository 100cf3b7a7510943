//! The GRPO / DAPO step: rollouts (with DAPO refills), rewards, advantages, the policy
//! update, and the step's metrics.

use std::time::Instant;

use atomrl_advantage::compute_advantages;
use atomrl_core::{CandleContext, Result};
use atomrl_model::CausalLm;
use atomrl_reward::WeightedRewards;
use atomrl_sample::{FinishReason, SamplingParams};
use candle_core::{Device, Tensor};

use super::trainer::Trainer;
use super::update::{policy_update_hooked, UpdateContext, UpdateStats};
use crate::config::GRPOArgs;
use crate::data::{EpochSampler, Example, SplitMix64};
use crate::logging::{keys, MetricRow};
use crate::recipe::RecipeStep;
use atomrl_logprob::TrainingBatch;
use atomrl_rollout::{add_round, generate_group_rows_distributed, RolloutContext, Rollouts};

/// The GRPO / DAPO recipe's step and what only it holds: the reward functions and the frozen
/// reference model (β > 0).
pub(crate) struct GrpoStep {
    pub(crate) rewards: WeightedRewards,
    pub(crate) reference: Option<CausalLm>,
}

impl RecipeStep for GrpoStep {
    /// One GRPO step: rollouts (with DAPO refills), advantages, the policy update; returns the
    /// step's metrics.
    fn step(
        &mut self,
        t: &mut Trainer,
        step: u64,
        lr: f64,
        sampler: &mut EpochSampler,
    ) -> Result<MetricRow> {
        let t0 = Instant::now();
        let rollouts = self.rollouts(t, step, sampler)?;
        let generate_s = t0.elapsed().as_secs_f64();
        let t1 = Instant::now();
        let mut row = MetricRow::new(step);
        let stats = if rollouts.rows.is_empty() {
            None
        } else {
            Some(self.update(t, &rollouts, step, lr)?)
        };
        let train_s = t1.elapsed().as_secs_f64();
        let skipped = stats.as_ref().map_or(1, |s| s.skipped.min(1));
        if let Some(reason) = stats
            .as_ref()
            .and_then(|s| s.skip_reason.clone())
            .or_else(|| {
                rollouts
                    .rows
                    .is_empty()
                    .then(|| "no group with reward spread".to_string())
            })
        {
            t.warn(format!("step {step}: update skipped: {reason}"));
        }
        self.record_rollouts(&mut row, &rollouts);
        record_update(&mut row, stats.as_ref(), lr, skipped);
        record_timings(&mut row, &rollouts, generate_s, train_s);
        t.last_samples = rollouts
            .rows
            .iter()
            .take(2)
            .map(|r| {
                let text = r.trajectory.as_ref().map_or(&r.completion, |t| &t.text);
                (r.prompt.clone(), text.clone(), r.reward)
            })
            .collect();
        Ok(row)
    }
}

/// The sampling settings of a run's rollouts (the seed is set per generation round).
fn sampling_params(a: &GRPOArgs, stop_token_ids: Vec<u32>) -> SamplingParams {
    SamplingParams {
        num_generations: a.num_generations,
        max_new_tokens: a.max_completion_length,
        temperature: a.temperature,
        top_p: a.top_p,
        top_k: a.top_k,
        min_p: a.min_p,
        repetition_penalty: a.repetition_penalty,
        stop_token_ids,
        ..Default::default()
    }
}

impl GrpoStep {
    /// The step's rollouts: `batch_size` prompts, `num_generations` completions each, scored;
    /// with dynamic sampling, further rounds until `batch_size` groups have reward spread (at
    /// most `max_num_gen_batches` rounds).
    fn rollouts(&self, t: &mut Trainer, step: u64, sampler: &mut EpochSampler) -> Result<Rollouts> {
        let a = &t.args;
        let g = a.num_generations;
        let params = sampling_params(a, t.tokenizer.eos_token_ids());
        let view = t.model.detached();
        let rounds = if a.dynamic_sampling {
            a.max_num_gen_batches
        } else {
            1
        };
        let mut rollouts = Rollouts::default();
        let mut truncated_prompts = 0;
        for round in 0..rounds {
            let picked: Vec<&Example> = sampler
                .next_batch(a.batch_size)
                .into_iter()
                .map(|i| &t.train_set[i])
                .collect();
            let prompts = picked
                .iter()
                .map(|e| t.encoder.encode(&t.tokenizer, e))
                .collect::<Result<Vec<_>>>()?;
            truncated_prompts += prompts.iter().filter(|p| p.truncated).count();
            let truth: Vec<String> = picked.iter().map(|e| e.ground_truth.clone()).collect();
            // Each round draws with its own seed, so a refill does not repeat the first draw.
            let round_params = SamplingParams {
                seed: sampling_seed(a.seed, step, round as u64),
                ..params.clone()
            };
            let ctx = RolloutContext {
                model: &view,
                tokenizer: &t.tokenizer,
                params: &round_params,
                rewards: &self.rewards,
                tools: t.tool_use(),
            };
            let (rows, tokens) = generate_group_rows_distributed(
                &ctx,
                &prompts,
                &truth,
                a.workers,
                t.comm.as_ref(),
            )?;
            rollouts.generated_tokens += tokens;
            add_round(&mut rollouts, rows, g, a.dynamic_sampling, a.batch_size)?;
            if rollouts.rows.len() >= a.batch_size * g {
                break;
            }
        }
        if truncated_prompts > 0 {
            let max = a.max_prompt_length;
            t.warnings.push(format!("step {step}: {truncated_prompts} prompt(s) longer than max_prompt_length = {max} were left-truncated"));
        }
        Ok(rollouts)
    }

    /// Advantages of `rollouts` and the policy update on them.
    fn update(
        &self,
        t: &mut Trainer,
        rollouts: &Rollouts,
        step: u64,
        lr: f64,
    ) -> Result<UpdateStats> {
        let a = &t.args;
        let g = a.num_generations;
        let rewards: Vec<f32> = rollouts.rows.iter().map(|r| r.reward as f32).collect();
        let adv = compute_advantages(
            &Tensor::new(rewards.as_slice(), &Device::Cpu).ctx("step")?,
            g,
            a.advantage_mode,
            a.advantage_eps,
        )?;
        let advantages: Vec<f32> = adv.advantages.to_vec1().ctx("step")?;
        let counts: Vec<bool> = rollouts
            .rows
            .iter()
            .map(|r| !(a.mask_truncated_completions && r.finish_reason == FinishReason::Length))
            .collect();
        let seqs: Vec<(&[u32], &[u32], &[bool])> = rollouts
            .rows
            .iter()
            .map(|r| {
                (
                    r.prompt_ids.as_slice(),
                    r.completion_ids.as_slice(),
                    r.model_token.as_slice(),
                )
            })
            .collect();
        let batch = TrainingBatch::build(
            &seqs,
            &advantages,
            &counts,
            t.tokenizer.pad_token_id(),
            t.model.device(),
        )?;
        let inject = t.nan_at(step);
        let uctx = UpdateContext {
            model: &t.model,
            reference: self.reference.as_ref(),
            params: &t.params,
            args: &t.args,
            comm: t.comm.as_ref(),
        };
        policy_update_hooked(&uctx, &mut t.optimizer, &batch, lr, inject)
    }

    /// The rollouts' metrics: rewards (in all and per function), accuracy, lengths, truncation,
    /// zero-spread and dropped groups, generation rounds.
    fn record_rollouts(&self, row: &mut MetricRow, r: &Rollouts) {
        let lengths: Vec<f64> = r
            .rows
            .iter()
            .map(|x| x.completion_ids.len() as f64)
            .collect();
        let truncated = r
            .rows
            .iter()
            .filter(|x| x.finish_reason == FinishReason::Length)
            .count();
        row.push(keys::REWARD_MEAN, mean(&r.all_rewards));
        row.push(keys::REWARD_STD, sample_std(&r.all_rewards));
        for (i, name) in self.rewards.names().iter().enumerate() {
            let v: Vec<f64> = r.rows.iter().map(|x| x.rewards_per_fn[i]).collect();
            row.push(keys::reward_fn_mean(name), mean(&v));
        }
        row.push(keys::ACCURACY, mean(&r.all_correct));
        row.push(keys::COMPLETION_LENGTH_MEAN, mean(&lengths));
        row.push(
            keys::COMPLETION_LENGTH_MAX,
            lengths.iter().copied().fold(0.0, f64::max),
        );
        row.push(
            keys::TRUNCATED_FRAC,
            if r.rows.is_empty() {
                0.0
            } else {
                truncated as f64 / r.rows.len() as f64
            },
        );
        row.push(
            keys::ZERO_STD_GROUPS_FRAC,
            if r.groups_generated == 0 {
                0.0
            } else {
                r.zero_std_groups as f64 / r.groups_generated as f64
            },
        );
        row.push(keys::DROPPED_GROUPS, r.dropped_groups as f64);
        row.push(keys::GENERATION_ROUNDS, r.rounds as f64);
        record_tool_use(row, r);
    }
}

/// Tool metrics of a run with tools (rows with a trajectory): calls per completion, the share
/// of failed calls, of completions stopped at the turn limit, and of completions that used a
/// tool.
fn record_tool_use(row: &mut MetricRow, r: &Rollouts) {
    let trajectories: Vec<_> = r
        .rows
        .iter()
        .filter_map(|x| x.trajectory.as_ref())
        .collect();
    if trajectories.is_empty() {
        return;
    }
    let n = trajectories.len() as f64;
    let calls: usize = trajectories.iter().map(|t| t.tool_calls.len()).sum();
    let failed: usize = trajectories.iter().map(|t| t.num_failed_calls()).sum();
    let used = trajectories
        .iter()
        .filter(|t| !t.tool_calls.is_empty())
        .count();
    let at_limit = r.rows.iter().filter(|x| x.stopped_at_max_turns).count();
    row.push(keys::TOOLS_CALLS_PER_COMPLETION, calls as f64 / n);
    row.push(
        keys::TOOLS_ERROR_RATE,
        if calls == 0 {
            0.0
        } else {
            failed as f64 / calls as f64
        },
    );
    row.push(keys::TOOLS_MAX_TURNS_FRAC, at_limit as f64 / n);
    row.push(keys::TOOLS_USE_FRAC, used as f64 / n);
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
fn record_timings(row: &mut MetricRow, r: &Rollouts, generate_s: f64, train_s: f64) {
    let step_s = generate_s + train_s;
    row.push(keys::TIME_STEP_S, step_s);
    row.push(keys::TIME_GENERATE_S, generate_s);
    row.push(keys::TIME_TRAIN_S, train_s);
    row.push(
        keys::THROUGHPUT_COMPLETIONS_PER_S,
        r.all_rewards.len() as f64 / step_s.max(1e-9),
    );
    row.push(
        keys::THROUGHPUT_TOKENS_PER_S,
        r.generated_tokens as f64 / step_s.max(1e-9),
    );
}

/// The mean of `v` (NaN when empty).
fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        f64::NAN
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

/// The sample standard deviation of `v` (0 for fewer than two values).
fn sample_std(v: &[f64]) -> f64 {
    let m = mean(v);
    if v.len() < 2 {
        0.0
    } else {
        (v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (v.len() - 1) as f64).sqrt()
    }
}

/// The sampling seed of generation round `round` of step `step`: derived, not stored, so a
/// resumed run samples exactly what the uninterrupted run would have.
fn sampling_seed(seed: u64, step: u64, round: u64) -> u64 {
    SplitMix64::derive(seed, step.wrapping_mul(1_000_003).wrapping_add(round)).next_u64()
}
