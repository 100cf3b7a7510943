//! One step's rollouts: generate `G` completions per prompt, score them, and (DAPO dynamic
//! sampling) keep only groups whose rewards differ, generating more until the batch is full.

use atomrl_advantage::filter_groups;
use atomrl_core::{CandleContext, Result};
use atomrl_model::CausalLm;
use atomrl_reward::{correctness_score, RewardContext, Trajectory, WeightedRewards};
use atomrl_sample::{generate_rows, ChatTokenizer, FinishReason, SamplingParams, ToolUse};
use candle_core::Tensor;

use super::prompt::EncodedPrompt;
use crate::data::SplitMix64;
use crate::parallel::{run_shards, split_even};

/// One completion with everything the update and the metrics need.
#[derive(Debug, Clone)]
pub struct RolloutRow {
    /// Prompt token ids (unpadded).
    pub prompt_ids: Vec<u32>,
    /// Completion token ids (unpadded; EOS included when generated; with tools, the tool
    /// turns too).
    pub completion_ids: Vec<u32>,
    /// `true` on the completion tokens the model generated (false on tool turns).
    pub model_token: Vec<bool>,
    /// The decoded completion the rewards scored (with tools: the final model turn).
    pub completion: String,
    /// With tools: the whole trajectory (text with tool turns, the calls and their results).
    pub trajectory: Option<Trajectory>,
    /// With tools: the model called again after the last allowed tool turn.
    pub stopped_at_max_turns: bool,
    /// The prompt text.
    pub prompt: String,
    /// Why generation stopped.
    pub finish_reason: FinishReason,
    /// Weighted total reward.
    pub reward: f64,
    /// Each reward function's unweighted score, in the order of `WeightedRewards::names`.
    pub rewards_per_fn: Vec<f64>,
    /// 1 when the answer is right (correctness reward, default options), else 0.
    pub correct: f64,
}

/// Rollouts of one step: groups of `G` consecutive rows.
#[derive(Debug, Clone, Default)]
pub struct Rollouts {
    /// Kept rows (whole groups).
    pub rows: Vec<RolloutRow>,
    /// Every generated row's reward, correctness and length, kept or not (for metrics).
    pub all_rewards: Vec<f64>,
    /// Correctness of every generated row.
    pub all_correct: Vec<f64>,
    /// Groups generated in total.
    pub groups_generated: usize,
    /// Groups whose rewards were all equal.
    pub zero_std_groups: usize,
    /// Groups dropped by dynamic sampling.
    pub dropped_groups: usize,
    /// Generation rounds used.
    pub rounds: usize,
    /// Tokens generated.
    pub generated_tokens: usize,
}

/// What [`generate_group_rows`] needs besides the prompts.
pub struct RolloutContext<'a> {
    /// The generating model (a detached view of the policy).
    pub model: &'a CausalLm,
    /// Tokenizer for decoding and stop strings.
    pub tokenizer: &'a ChatTokenizer,
    /// Sampling settings (the seed is set per round by the caller).
    pub params: &'a SamplingParams,
    /// The reward functions.
    pub rewards: &'a WeightedRewards,
    /// The tools of multi-turn rollouts (`None`: single-turn).
    pub tools: Option<ToolUse<'a>>,
}

/// Generates `G` completions for each prompt, decodes and scores them; rows come back in
/// groups of `G` (prompt-major).
///
/// # Errors
/// Generation, decoding or reward failures.
pub fn generate_group_rows(
    ctx: &RolloutContext<'_>,
    prompts: &[EncodedPrompt],
    ground_truth: &[String],
) -> Result<(Vec<RolloutRow>, usize)> {
    let func = "rollout";
    let g = ctx.params.num_generations;
    let ids: Vec<Vec<u32>> = prompts.iter().map(|p| p.ids.clone()).collect();
    let (generated, tokens) = generate_rows(ctx.model, ctx.tokenizer, &ids, ctx.params, ctx.tools)?;
    let n = generated.len();
    let gt: Vec<String> = (0..n).map(|r| ground_truth[r / g].clone()).collect();
    let prompt_texts: Vec<String> = (0..n).map(|r| prompts[r / g].text.clone()).collect();
    let answers: Vec<String> = generated.iter().map(|r| r.answer.clone()).collect();
    let mut reward_ctx = RewardContext::new()
        .with_ground_truth(gt.clone())
        .with_prompts(prompt_texts.clone())
        .with_completion_lengths(generated.iter().map(|r| r.completion_ids.len()).collect())
        .with_max_completion_length(ctx.params.max_new_tokens);
    if ctx.tools.is_some() {
        reward_ctx = reward_ctx.with_trajectories(
            generated
                .iter()
                .map(|r| r.trajectory.clone().unwrap_or_default())
                .collect(),
        );
    }
    let scored = ctx.rewards.score(&answers, &reward_ctx)?;
    let total: Vec<f32> = scored.total.to_vec1().ctx(func)?;
    let per_fn: Vec<Vec<f32>> = scored.per_fn.to_vec2().ctx(func)?;
    let rows = generated
        .into_iter()
        .enumerate()
        .map(|(r, row)| RolloutRow {
            prompt_ids: ids[r / g].clone(),
            correct: correctness_score(&row.answer, &gt[r], &Default::default()) as f64,
            completion_ids: row.completion_ids,
            model_token: row.model_token,
            completion: row.answer,
            trajectory: row.trajectory,
            stopped_at_max_turns: row.stopped_at_max_turns,
            prompt: prompt_texts[r].clone(),
            finish_reason: row.finish_reason,
            reward: total[r] as f64,
            rewards_per_fn: per_fn[r].iter().map(|&x| x as f64).collect(),
        })
        .collect();
    Ok((rows, tokens))
}

/// [`generate_group_rows`] with the prompts split into `workers` shards generated at once
/// (see [`crate::parallel`]); rows come back in prompt order. With more than one shard, shard
/// `s` samples with a seed derived from `(seed, s)`.
///
/// # Errors
/// As [`generate_group_rows`].
pub fn generate_group_rows_sharded(
    ctx: &RolloutContext<'_>,
    prompts: &[EncodedPrompt],
    ground_truth: &[String],
    workers: usize,
) -> Result<(Vec<RolloutRow>, usize)> {
    let shards = split_even(prompts.len(), workers);
    if shards.len() <= 1 {
        return generate_group_rows(ctx, prompts, ground_truth);
    }
    let parts = run_shards("rollout", shards.len(), |s| {
        let range = shards[s].clone();
        let params = SamplingParams {
            seed: SplitMix64::derive(ctx.params.seed, s as u64).next_u64(),
            ..ctx.params.clone()
        };
        let shard_ctx = RolloutContext {
            params: &params,
            ..*ctx
        };
        generate_group_rows(&shard_ctx, &prompts[range.clone()], &ground_truth[range])
    })?;
    let mut rows = Vec::new();
    let mut tokens = 0;
    for (r, t) in parts {
        rows.extend(r);
        tokens += t;
    }
    Ok((rows, tokens))
}

/// Adds one round's rows to `acc`: all groups, or (dynamic sampling) only groups whose rewards
/// differ, up to `max_groups` kept groups.
///
/// # Errors
/// Tensor failures in the group filter.
pub fn add_round(
    acc: &mut Rollouts,
    rows: Vec<RolloutRow>,
    g: usize,
    dynamic: bool,
    max_groups: usize,
) -> Result<()> {
    let func = "rollout";
    let rewards: Vec<f32> = rows.iter().map(|r| r.reward as f32).collect();
    let filter = filter_groups(
        &Tensor::new(rewards.as_slice(), &candle_core::Device::Cpu).ctx(func)?,
        g,
    )?;
    acc.groups_generated += rows.len() / g;
    acc.zero_std_groups += filter.num_dropped;
    acc.all_rewards.extend(rows.iter().map(|r| r.reward));
    acc.all_correct.extend(rows.iter().map(|r| r.correct));
    acc.rounds += 1;
    let kept: Vec<bool> = (0..rows.len() / g)
        .map(|i| !dynamic || filter.kept_groups.contains(&i))
        .collect();
    for (i, group) in rows.chunks(g).enumerate() {
        if kept[i] && acc.rows.len() / g < max_groups {
            acc.rows.extend_from_slice(group);
        } else {
            acc.dropped_groups += 1;
        }
    }
    Ok(())
}
