//! One generation round: `G` completions per prompt, decoded and scored (rewards per function,
//! weighted total, accuracy), sharded over workers and ranks by one rule.

use atomrl_core::{CandleContext, Error, Result};
use atomrl_dist::Collective;
use atomrl_model::CausalLm;
use atomrl_reward::{Accuracy, RewardContext, WeightedRewards};
use atomrl_sample::{generate_rows, ChatTokenizer, Completion, SamplingParams, ToolUse};

use crate::parallel::{dist_error, run_shards, split_even, Parallel};
use crate::prompt::EncodedPrompt;
use atomrl_core::rng::SplitMix64;

/// What a generation round needs besides the prompts.
#[derive(Clone, Copy)]
pub struct RolloutContext<'a> {
    /// The generating model (a detached view of the policy).
    pub model: &'a CausalLm,
    /// Tokenizer for decoding and stop strings.
    pub tokenizer: &'a ChatTokenizer,
    /// The reward functions.
    pub rewards: &'a WeightedRewards,
    /// Which completions count as correct (the `accuracy` metric).
    pub accuracy: &'a Accuracy,
    /// The tools of multi-turn rollouts (`None`: single-turn).
    pub tools: Option<ToolUse<'a>>,
}

/// Scored completions, as columns (`G` consecutive rows per prompt). Rewards are f32 once, as
/// the reward functions give them; serialised as bits so they cross ranks exactly.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub(crate) struct Scored {
    pub prompt_ids: Vec<Vec<u32>>,
    pub prompts: Vec<String>,
    pub completions: Vec<Completion>,
    #[serde(with = "f32_bits")]
    pub rewards: Vec<f32>,
    #[serde(with = "f32_bits::nested")]
    pub rewards_per_fn: Vec<Vec<f32>>,
    #[serde(with = "f32_bits")]
    pub correct: Vec<f32>,
    pub generated_tokens: usize,
}

impl Scored {
    pub fn len(&self) -> usize {
        self.completions.len()
    }

    /// Appends rows `range` of `other`.
    pub fn extend_rows(&mut self, other: &Self, range: std::ops::Range<usize>) {
        self.prompt_ids
            .extend_from_slice(&other.prompt_ids[range.clone()]);
        self.prompts
            .extend_from_slice(&other.prompts[range.clone()]);
        self.completions
            .extend_from_slice(&other.completions[range.clone()]);
        self.rewards
            .extend_from_slice(&other.rewards[range.clone()]);
        self.rewards_per_fn
            .extend_from_slice(&other.rewards_per_fn[range.clone()]);
        self.correct.extend_from_slice(&other.correct[range]);
    }

    /// Appends all of `other`, and its generated tokens.
    fn append(&mut self, other: Self) {
        self.extend_rows(&other, 0..other.len());
        self.generated_tokens += other.generated_tokens;
    }
}

/// Generates `params.num_generations` completions for each prompt, decodes and scores them;
/// rows come back in groups of `G` (prompt-major). The prompts are split into
/// `workers × W` shards (`W` ranks of `comm`); rank `r` generates and scores shards
/// `r·workers ..` on its worker threads, and every rank gets every rank's rows, in prompt
/// order (an all-gather of the serialised rows, small next to the generation), so that the
/// groups kept, the advantages and the metrics are the same on every rank. With more than one
/// shard, shard `s` samples with a seed derived from `(params.seed, s)`: `N` ranks of one
/// worker sample exactly what one process of `N` workers does.
///
/// # Errors
/// Generation, decoding or reward failures; a failed collective.
pub(crate) fn generate_group_rows(
    ctx: &RolloutContext<'_>,
    par: Parallel<'_>,
    params: &SamplingParams,
    prompts: &[EncodedPrompt],
    ground_truth: &[String],
) -> Result<Scored> {
    let (workers, comm) = (par.workers.max(1), par.comm);
    let shards = split_even(prompts.len(), par.shards());
    let mine: Vec<usize> = (0..shards.len())
        .filter(|s| s / workers == comm.rank())
        .collect();
    let parts = run_shards("rollout", mine.len(), |i| {
        let range = shards[mine[i]].clone();
        // A single shard keeps the step's seed: one worker samples what it always did.
        let seed = if shards.len() > 1 {
            SplitMix64::derive(params.seed, mine[i] as u64).next_u64()
        } else {
            params.seed
        };
        let shard_params = SamplingParams {
            seed,
            ..params.clone()
        };
        score_shard(
            ctx,
            &shard_params,
            &prompts[range.clone()],
            &ground_truth[range],
        )
    })?;
    let mut local = Scored::default();
    for part in parts {
        local.append(part);
    }
    if comm.world_size() > 1 {
        return exchange(comm, &local);
    }
    Ok(local)
}

/// One shard's completions, decoded and scored.
fn score_shard(
    ctx: &RolloutContext<'_>,
    params: &SamplingParams,
    prompts: &[EncodedPrompt],
    ground_truth: &[String],
) -> Result<Scored> {
    let func = "rollout";
    let g = params.num_generations;
    let ids: Vec<Vec<u32>> = prompts.iter().map(|p| p.ids.clone()).collect();
    let (completions, tokens) = generate_rows(ctx.model, ctx.tokenizer, &ids, params, ctx.tools)?;
    let n = completions.len();
    let gt: Vec<String> = (0..n).map(|r| ground_truth[r / g].clone()).collect();
    let prompt_texts: Vec<String> = (0..n).map(|r| prompts[r / g].text.clone()).collect();
    let answers: Vec<String> = completions.iter().map(|r| r.answer.clone()).collect();
    let reward_ctx = reward_context(&completions, gt, prompt_texts.clone(), params, ctx.tools);
    let scored = ctx.rewards.score(&answers, &reward_ctx)?;
    Ok(Scored {
        prompt_ids: (0..n).map(|r| ids[r / g].clone()).collect(),
        prompts: prompt_texts,
        rewards: scored.total.to_vec1().ctx(func)?,
        rewards_per_fn: scored.per_fn.to_vec2().ctx(func)?,
        correct: ctx.accuracy.correct(&answers, &reward_ctx)?,
        completions,
        generated_tokens: tokens,
    })
}

/// What the reward functions (and the accuracy) see besides the answers.
pub(crate) fn reward_context(
    completions: &[Completion],
    ground_truth: Vec<String>,
    prompts: Vec<String>,
    params: &SamplingParams,
    tools: Option<ToolUse<'_>>,
) -> RewardContext {
    let ctx = RewardContext::new()
        .with_ground_truth(ground_truth)
        .with_prompts(prompts)
        .with_completion_lengths(completions.iter().map(|r| r.completion_ids.len()).collect())
        .with_max_completion_length(params.max_new_tokens);
    if tools.is_none() {
        return ctx;
    }
    ctx.with_trajectories(
        completions
            .iter()
            .map(|r| r.trajectory.clone().unwrap_or_default())
            .collect(),
    )
}

/// Every rank's rows, concatenated in rank order.
fn exchange(comm: &dyn Collective, local: &Scored) -> Result<Scored> {
    let func = "rollout";
    let bytes = serde_json::to_vec(local)
        .map_err(|e| Error::value(func, "rows", "serialisable rollout rows", e))?;
    let gathered = comm
        .all_gather_bytes(&bytes)
        .map_err(|e| dist_error(func, e))?;
    let mut all = Scored::default();
    for (rank, bytes) in gathered.iter().enumerate() {
        let part: Scored = serde_json::from_slice(bytes)
            .map_err(|e| Error::value(func, "rows", format!("rank {rank}'s rollout rows"), e))?;
        all.append(part);
    }
    Ok(all)
}

/// Serde of `f32`s as their IEEE-754 bits: exact, and NaN/Inf survive (JSON has neither).
mod f32_bits {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(v: &[f32], s: S) -> Result<S::Ok, S::Error> {
        v.iter()
            .map(|x| x.to_bits())
            .collect::<Vec<_>>()
            .serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<f32>, D::Error> {
        Vec::<u32>::deserialize(d).map(|v| v.into_iter().map(f32::from_bits).collect())
    }

    /// The same for rows of `f32`s.
    pub mod nested {
        use serde::{Deserialize, Deserializer, Serialize, Serializer};

        pub fn serialize<S: Serializer>(v: &[Vec<f32>], s: S) -> Result<S::Ok, S::Error> {
            v.iter()
                .map(|r| r.iter().map(|x| x.to_bits()).collect::<Vec<_>>())
                .collect::<Vec<_>>()
                .serialize(s)
        }

        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Vec<f32>>, D::Error> {
            Vec::<Vec<u32>>::deserialize(d).map(|v| {
                v.into_iter()
                    .map(|r| r.into_iter().map(f32::from_bits).collect())
                    .collect()
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scored_rows_cross_ranks_bit_for_bit() {
        let s = Scored {
            rewards: vec![0.1, f32::NAN, -0.0],
            rewards_per_fn: vec![vec![f32::INFINITY], vec![1e-30], vec![0.3]],
            correct: vec![1.0, 0.0, 0.0],
            ..Default::default()
        };
        let back: Scored = serde_json::from_slice(&serde_json::to_vec(&s).unwrap()).unwrap();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&back.rewards), bits(&s.rewards));
        assert_eq!(back.rewards_per_fn[0][0], f32::INFINITY);
        assert_eq!(back.rewards_per_fn[1][0].to_bits(), 1e-30f32.to_bits());
    }
}
