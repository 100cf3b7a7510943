//! [`make_experience`]: generate, score, filter (DAPO), compute advantages, then the old and
//! reference log-probs, once per step, sharded by the rollouts' rule.

use atomrl_advantage::{advantages_from_group_stats, AdvantageMode, GroupStats};
use atomrl_core::rng::SplitMix64;
use atomrl_core::Result;
use atomrl_model::CausalLm;
use atomrl_sample::{FinishReason, SamplingParams};

use crate::experience::{Experience, LossNormalizer, TokenRow};
use crate::log_probs::attach_log_probs;
use crate::parallel::Parallel;
use crate::prompt::EncodedPrompt;
use crate::rollout::{generate_group_rows, RolloutContext, Scored};
use crate::summary::{rollout_records, RolloutCounts, RolloutSummary};

/// How a step's experience is made (the sampling, advantage and update settings it needs).
#[derive(Debug, Clone)]
pub struct ExperienceConfig {
    /// Sampling settings; `seed` is the run's seed, from which every round's is derived.
    pub sampling: SamplingParams,
    /// Prompts (groups) per step.
    pub batch_size: usize,
    /// DAPO dynamic sampling: keep only groups whose rewards differ, and generate further
    /// rounds until `batch_size` groups are kept.
    pub dynamic_sampling: bool,
    /// Generation rounds at most with dynamic sampling.
    pub max_rounds: usize,
    /// Compute each row's advantage from its group's rewards (false: 0, for a critic's GAE to
    /// replace; groups may then have one completion).
    pub group_advantages: bool,
    /// How rewards become advantages.
    pub advantage_mode: AdvantageMode,
    /// `eps` of the advantage's standard deviation.
    pub advantage_eps: f64,
    /// Truncated completions (finish reason `length`) are left out of the loss.
    pub mask_truncated_completions: bool,
    /// Rows whose advantage is exactly 0 cannot change the loss (no KL, no entropy term): the
    /// experience leaves them out (their tokens stay in the normaliser).
    pub drop_zero_advantage: bool,
    /// Compute the policy's log-probs before the update (more than one optimizer step per
    /// experience).
    pub old_log_probs: bool,
    /// Micro-batches per worker of the update: the log-prob passes use the update's
    /// micro-batches and shard rule.
    pub micro_batches: usize,
    /// The pad token id.
    pub pad_token_id: u32,
    /// Completions of the step kept as [`RolloutSummary::records`] for the sample log (whole
    /// groups where it holds one; 0: none).
    pub log_records: usize,
}

/// One round's prompts: the encoded prompts and their ground truths.
pub type PromptBatch = (Vec<EncodedPrompt>, Vec<String>);

/// Makes step `step`'s experience on the policy `ctx.model` (and the frozen `reference`, when
/// given: its log-probs for the KL penalty). `next_prompts` gives each generation round's
/// prompts. Everything after this phase only reads the experience: the advantages are
/// computed from one set of group statistics (the ones the DAPO filter uses), and the old and
/// reference log-probs are computed once, micro-batch by micro-batch, each on the worker and
/// rank that will train on it.
///
/// The experience is empty (no rows, a zero normaliser) when dynamic sampling kept no group.
///
/// # Errors
/// Generation, reward, advantage or tensor failures; a failed collective.
pub fn make_experience(
    ctx: &RolloutContext<'_>,
    par: Parallel<'_>,
    reference: Option<&CausalLm>,
    config: &ExperienceConfig,
    step: u64,
    next_prompts: &mut dyn FnMut() -> Result<PromptBatch>,
) -> Result<(Experience, RolloutSummary)> {
    let (kept, stats, counts) = collect_groups(ctx, par, config, step, next_prompts)?;
    let names = ctx.rewards.names();
    let advantages = row_advantages(&kept, &stats, config)?;
    let g = config.sampling.num_generations;
    // Without group advantages a critic's per-token ones replace the zeros: none to show.
    let shown = config.group_advantages.then_some(advantages.as_slice());
    let records = rollout_records(&kept, &names, shown, g, config.log_records);
    let mut summary = RolloutSummary::new(&kept, counts, names, ctx.tools.is_some());
    summary.records = records;
    let device = ctx.model.device();
    let mut exp = build(&kept, &advantages, config, device)?;
    if exp.normalizer.tokens > 0.0 && config.drop_zero_advantage {
        exp = exp.without_zero_advantage()?;
    }
    if exp.num_rows() > 0 && exp.normalizer.tokens > 0.0 {
        attach_log_probs(&mut exp, ctx.model, par, reference, config)?;
    }
    Ok((exp, summary))
}

/// The generation rounds of a step: whole groups, or (dynamic sampling) the groups with reward
/// spread, until `batch_size` are kept; with the statistics of each kept group.
fn collect_groups(
    ctx: &RolloutContext<'_>,
    par: Parallel<'_>,
    config: &ExperienceConfig,
    step: u64,
    next_prompts: &mut dyn FnMut() -> Result<PromptBatch>,
) -> Result<(Scored, Vec<GroupStats>, RolloutCounts)> {
    let g = config.sampling.num_generations;
    let rounds = if config.dynamic_sampling {
        config.max_rounds
    } else {
        1
    };
    let mut kept = Scored::default();
    let mut stats = Vec::new();
    let mut counts = RolloutCounts::default();
    for round in 0..rounds {
        let (prompts, truth) = next_prompts()?;
        counts.truncated_prompts += prompts.iter().filter(|p| p.truncated).count();
        // Each round draws with its own seed, so a refill does not repeat the first draw.
        let params = SamplingParams {
            seed: sampling_seed(config.sampling.seed, step, round as u64),
            ..config.sampling.clone()
        };
        let scored = generate_group_rows(ctx, par, &params, &prompts, &truth)?;
        counts.add_round(&scored, g);
        let rewards: Vec<f64> = scored.rewards.iter().map(|&r| f64::from(r)).collect();
        let round_stats = GroupStats::of_groups(&rewards, g);
        for (i, s) in round_stats.iter().enumerate() {
            counts.zero_std_groups += usize::from(s.flat);
            let wanted = !config.dynamic_sampling || !s.flat;
            if wanted && stats.len() < config.batch_size {
                kept.extend_rows(&scored, i * g..(i + 1) * g);
                stats.push(*s);
            } else {
                counts.dropped_groups += 1;
            }
        }
        if stats.len() >= config.batch_size {
            break;
        }
    }
    Ok((kept, stats, counts))
}

/// Each kept row's advantage from its group's statistics (0 without group advantages).
fn row_advantages(
    kept: &Scored,
    stats: &[GroupStats],
    config: &ExperienceConfig,
) -> Result<Vec<f32>> {
    if kept.len() == 0 {
        return Ok(Vec::new());
    }
    if !config.group_advantages {
        return Ok(vec![0.0; kept.len()]);
    }
    let rewards: Vec<f64> = kept.rewards.iter().map(|&r| f64::from(r)).collect();
    let adv =
        advantages_from_group_stats(&rewards, stats, config.advantage_mode, config.advantage_eps)?;
    Ok(adv.into_iter().map(|a| a as f32).collect())
}

/// The padded experience of the kept rows, with their advantages, rewards and groups.
fn build(
    kept: &Scored,
    advantages: &[f32],
    config: &ExperienceConfig,
    device: &candle_core::Device,
) -> Result<Experience> {
    let g = config.sampling.num_generations;
    let loss_row: Vec<bool> = kept
        .completions
        .iter()
        .map(|c| !(config.mask_truncated_completions && c.finish_reason == FinishReason::Length))
        .collect();
    let rows: Vec<TokenRow<'_>> = kept
        .prompt_ids
        .iter()
        .zip(&kept.completions)
        .map(|(p, c)| {
            (
                p.as_slice(),
                c.completion_ids.as_slice(),
                c.model_token.as_slice(),
            )
        })
        .collect();
    let mut inner =
        Experience::from_rows(&rows, advantages, &loss_row, config.pad_token_id, device)?;
    inner.rewards = kept.rewards.clone();
    inner.rewards_per_fn = kept.rewards_per_fn.clone();
    inner.groups = (0..kept.len()).map(|r| (r / g.max(1)) as u32).collect();
    if kept.len() == 0 {
        inner.normalizer = LossNormalizer::default();
    }
    Ok(inner)
}

/// The sampling seed of generation round `round` of step `step`: derived, not stored, so a
/// resumed run samples exactly what the uninterrupted run would have.
pub fn sampling_seed(seed: u64, step: u64, round: u64) -> u64 {
    SplitMix64::derive(seed, step.wrapping_mul(1_000_003).wrapping_add(round)).next_u64()
}
