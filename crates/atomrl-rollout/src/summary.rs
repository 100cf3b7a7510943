//! [`RolloutSummary`]: what a step's rollouts measured, for its metrics row.

use atomrl_core::RolloutRecord;
use atomrl_sample::FinishReason;

use crate::rollout::Scored;

/// Counts over every generation round of a step, kept rows or not.
#[derive(Debug, Clone, Default)]
pub(crate) struct RolloutCounts {
    pub all_rewards: Vec<f64>,
    pub all_correct: Vec<f64>,
    pub groups_generated: usize,
    pub zero_std_groups: usize,
    pub dropped_groups: usize,
    pub rounds: usize,
    pub generated_tokens: usize,
    pub truncated_prompts: usize,
}

impl RolloutCounts {
    /// Counts one round's rows (groups of `g`).
    pub fn add_round(&mut self, round: &Scored, g: usize) {
        self.all_rewards
            .extend(round.rewards.iter().map(|&r| f64::from(r)));
        self.all_correct
            .extend(round.correct.iter().map(|&c| f64::from(c)));
        self.groups_generated += round.len() / g.max(1);
        self.rounds += 1;
        self.generated_tokens += round.generated_tokens;
    }
}

/// Tool use over the kept completions of a step with tools.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ToolSummary {
    /// Mean tool calls per completion.
    pub calls_per_completion: f64,
    /// Share of calls that failed.
    pub error_rate: f64,
    /// Share of completions that called again after the last allowed tool turn.
    pub max_turns_frac: f64,
    /// Share of completions that called a tool.
    pub use_frac: f64,
}

/// What a step's rollouts measured: rewards and accuracy over every generated completion;
/// lengths, truncation, per-function rewards and tool use over the kept ones.
#[derive(Debug, Clone)]
pub struct RolloutSummary {
    /// Mean weighted reward of every generated completion.
    pub reward_mean: f64,
    /// Its sample standard deviation.
    pub reward_std: f64,
    /// Each reward function's mean unweighted score over the kept completions.
    pub reward_fn_means: Vec<(String, f64)>,
    /// Share of generated completions that are correct (the configured accuracy).
    pub accuracy: f64,
    /// Mean completion length of the kept completions, in tokens.
    pub completion_length_mean: f64,
    /// Longest kept completion.
    pub completion_length_max: f64,
    /// Share of kept completions cut at the length limit.
    pub truncated_frac: f64,
    /// Share of generated groups whose rewards were all equal.
    pub zero_std_groups_frac: f64,
    /// Groups dropped (dynamic sampling, or beyond the batch).
    pub dropped_groups: usize,
    /// Generation rounds.
    pub rounds: usize,
    /// Completions generated in all rounds.
    pub completions: usize,
    /// Tokens generated.
    pub generated_tokens: usize,
    /// Prompts left-truncated to `max_prompt_length`.
    pub truncated_prompts: usize,
    /// Kept completions.
    pub kept: usize,
    /// Tool use (runs with tools).
    pub tools: Option<ToolSummary>,
    /// The first kept groups' completions, for the sample log (`samples.jsonl`): at most
    /// [`ExperienceConfig::log_records`](crate::ExperienceConfig::log_records), whole groups
    /// where it holds one; filled by [`make_experience`](crate::make_experience) once the
    /// advantages are known.
    pub records: Vec<RolloutRecord>,
}

impl RolloutSummary {
    /// The summary of `kept` rows and `counts`.
    pub(crate) fn new(
        kept: &Scored,
        counts: RolloutCounts,
        names: Vec<String>,
        tools: bool,
    ) -> Self {
        let lengths: Vec<f64> = kept
            .completions
            .iter()
            .map(|c| c.completion_ids.len() as f64)
            .collect();
        let truncated = kept
            .completions
            .iter()
            .filter(|c| c.finish_reason == FinishReason::Length)
            .count();
        let reward_fn_means = names
            .into_iter()
            .enumerate()
            .map(|(i, name)| {
                let v: Vec<f64> = kept
                    .rewards_per_fn
                    .iter()
                    .map(|r| f64::from(r[i]))
                    .collect();
                (name, mean(&v))
            })
            .collect();
        Self {
            reward_mean: mean(&counts.all_rewards),
            reward_std: sample_std(&counts.all_rewards),
            reward_fn_means,
            accuracy: mean(&counts.all_correct),
            completion_length_mean: mean(&lengths),
            completion_length_max: lengths.iter().copied().fold(0.0, f64::max),
            truncated_frac: ratio(truncated, kept.len()),
            zero_std_groups_frac: ratio(counts.zero_std_groups, counts.groups_generated),
            dropped_groups: counts.dropped_groups,
            rounds: counts.rounds,
            completions: counts.all_rewards.len(),
            generated_tokens: counts.generated_tokens,
            truncated_prompts: counts.truncated_prompts,
            kept: kept.len(),
            tools: tools.then(|| tool_summary(kept)).flatten(),
            records: Vec::new(),
        }
    }
}

/// Tool metrics of the kept rows with a trajectory (`None` when none has one).
fn tool_summary(kept: &Scored) -> Option<ToolSummary> {
    let with: Vec<_> = kept
        .completions
        .iter()
        .filter_map(|c| c.trajectory.as_ref().map(|t| (c, t)))
        .collect();
    if with.is_empty() {
        return None;
    }
    let n = with.len();
    let calls: usize = with.iter().map(|(_, t)| t.tool_calls.len()).sum();
    let failed: usize = with.iter().map(|(_, t)| t.num_failed_calls()).sum();
    let used = with
        .iter()
        .filter(|(_, t)| !t.tool_calls.is_empty())
        .count();
    let at_limit = kept
        .completions
        .iter()
        .filter(|c| c.stopped_at_max_turns)
        .count();
    Some(ToolSummary {
        calls_per_completion: calls as f64 / n as f64,
        error_rate: ratio(failed, calls),
        max_turns_frac: at_limit as f64 / n as f64,
        use_frac: used as f64 / n as f64,
    })
}

/// The records of the first kept rows: `max` at most, whole groups of `g` where `max` holds
/// one; each with its advantage (`advantages`, one per kept row, when the rows have one).
pub(crate) fn rollout_records(
    kept: &Scored,
    names: &[String],
    advantages: Option<&[f32]>,
    g: usize,
    max: usize,
) -> Vec<RolloutRecord> {
    let g = g.max(1);
    let n = if max >= g { max / g * g } else { max }.min(kept.len());
    (0..n)
        .map(|i| {
            let c = &kept.completions[i];
            RolloutRecord {
                group: i / g,
                prompt: kept.prompts[i].clone(),
                completion: c.trajectory.as_ref().map_or(&c.text, |t| &t.text).clone(),
                reward: f64::from(kept.rewards[i]),
                rewards: names
                    .iter()
                    .zip(&kept.rewards_per_fn[i])
                    .map(|(name, &r)| (name.clone(), f64::from(r)))
                    .collect(),
                advantage: advantages.and_then(|a| a.get(i)).map(|&a| f64::from(a)),
                correct: kept.correct.get(i).map(|&c| c >= 0.5),
                completion_tokens: c.completion_ids.len(),
                finish_reason: c.finish_reason.as_str().to_string(),
                tool_calls: c
                    .trajectory
                    .as_ref()
                    .map(|t| t.tool_calls.clone())
                    .unwrap_or_default(),
            }
            .bounded()
        })
        .collect()
}

/// `num / den`, 0 when `den` is 0.
fn ratio(num: usize, den: usize) -> f64 {
    if den == 0 {
        0.0
    } else {
        num as f64 / den as f64
    }
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
