//! One step's rollouts: generate `G` completions per prompt, score them, and (DAPO dynamic
//! sampling) keep only groups whose rewards differ, generating more until the batch is full.

use atomrl_advantage::filter_groups;
use atomrl_core::{CandleContext, Error, Result};
use atomrl_dist::{Collective, SingleProcess};
use atomrl_model::CausalLm;
use atomrl_reward::{correctness_score, RewardContext, Trajectory, WeightedRewards};
use atomrl_sample::{generate_rows, ChatTokenizer, FinishReason, SamplingParams, ToolUse};
use candle_core::Tensor;

use crate::parallel::{dist_error, run_shards, split_even};
use crate::prompt::EncodedPrompt;
use atomrl_data::SplitMix64;

/// One completion with everything the update and the metrics need. Serialisable (floats as
/// their bits, so that they cross between data-parallel ranks exactly).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
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
    #[serde(with = "f64_bits")]
    pub reward: f64,
    /// Each reward function's unweighted score, in the order of `WeightedRewards::names`.
    #[serde(with = "f64_bits::vec")]
    pub rewards_per_fn: Vec<f64>,
    /// 1 when the answer is right (correctness reward, default options), else 0.
    #[serde(with = "f64_bits")]
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
    generate_group_rows_distributed(ctx, prompts, ground_truth, workers, &SingleProcess)
}

/// [`generate_group_rows_sharded`] over the ranks of `comm`: the prompts are split into
/// `workers × W` shards (the shard and seed rule of `workers × W` in-process workers); rank
/// `r` generates and scores shards `r·workers .. (r+1)·workers` on its workers, and every
/// rank gets every rank's rows, in prompt order (an all-gather of the serialised rows, small
/// next to the generation), so that the groups kept, the advantages and the metrics are
/// computed identically on every rank.
///
/// # Errors
/// As [`generate_group_rows`]; a failed collective.
pub fn generate_group_rows_distributed(
    ctx: &RolloutContext<'_>,
    prompts: &[EncodedPrompt],
    ground_truth: &[String],
    workers: usize,
    comm: &dyn Collective,
) -> Result<(Vec<RolloutRow>, usize)> {
    let workers = workers.max(1);
    let shards = split_even(prompts.len(), workers * comm.world_size());
    let mine: Vec<usize> = (0..shards.len())
        .filter(|s| s / workers == comm.rank())
        .collect();
    let parts = run_shards("rollout", mine.len(), |i| {
        let range = shards[mine[i]].clone();
        // A single shard keeps the step's seed: one worker samples what it always did.
        let seed = if shards.len() > 1 {
            SplitMix64::derive(ctx.params.seed, mine[i] as u64).next_u64()
        } else {
            ctx.params.seed
        };
        let params = SamplingParams {
            seed,
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
    if comm.world_size() > 1 {
        return exchange_rows(comm, &rows, tokens);
    }
    Ok((rows, tokens))
}

/// Every rank's rows and generated-token count, concatenated in rank order.
fn exchange_rows(
    comm: &dyn Collective,
    rows: &[RolloutRow],
    tokens: usize,
) -> Result<(Vec<RolloutRow>, usize)> {
    let func = "rollout";
    let local = serde_json::to_vec(&(rows, tokens))
        .map_err(|e| Error::value(func, "rows", "serialisable rollout rows", e))?;
    let gathered = comm
        .all_gather_bytes(&local)
        .map_err(|e| dist_error(func, e))?;
    let mut all = Vec::new();
    let mut total = 0;
    for (rank, bytes) in gathered.iter().enumerate() {
        let (r, t): (Vec<RolloutRow>, usize) = serde_json::from_slice(bytes)
            .map_err(|e| Error::value(func, "rows", format!("rank {rank}'s rollout rows"), e))?;
        all.extend(r);
        total += t;
    }
    Ok((all, total))
}

/// Serde of `f64` as its IEEE-754 bits: exact, and NaN/Inf survive (JSON has neither).
mod f64_bits {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
        v.to_bits().serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        u64::deserialize(d).map(f64::from_bits)
    }

    /// The same for a `Vec<f64>`.
    pub mod vec {
        use serde::{Deserialize, Deserializer, Serialize, Serializer};

        pub fn serialize<S: Serializer>(v: &[f64], s: S) -> Result<S::Ok, S::Error> {
            v.iter()
                .map(|x| x.to_bits())
                .collect::<Vec<_>>()
                .serialize(s)
        }

        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<f64>, D::Error> {
            Vec::<u64>::deserialize(d).map(|v| v.into_iter().map(f64::from_bits).collect())
        }
    }
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
