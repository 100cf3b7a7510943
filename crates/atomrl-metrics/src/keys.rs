//! The metric keys: every name a trainer writes to `metrics.jsonl` (and TensorBoard), and the
//! charts, the progress bar and the readers look up. One constant each, so that no key is
//! spelt twice.
//!
//! ```
//! use atomrl_metrics::{keys, MetricRow};
//! let mut row = MetricRow::new(1);
//! row.push(keys::REWARD_MEAN, 0.5).push(keys::reward_fn_mean("correctness"), 1.0);
//! assert_eq!(row.get("reward/correctness/mean"), Some(1.0));
//! ```

pub use crate::record::STEP_KEY as STEP;

/// Mean total reward of the step's completions.
pub const REWARD_MEAN: &str = "reward/mean";
/// Standard deviation of the total reward.
pub const REWARD_STD: &str = "reward/std";
/// Prefix of the per-function reward means, `reward/<fn>/mean` ([`reward_fn_mean`]).
pub const REWARD_PREFIX: &str = "reward/";
/// Suffix of the per-function reward means.
pub const REWARD_FN_SUFFIX: &str = "/mean";
/// Share of completions whose answer is correct.
pub const ACCURACY: &str = "accuracy";
/// Mean completion length in tokens.
pub const COMPLETION_LENGTH_MEAN: &str = "completion_length/mean";
/// Longest completion in tokens.
pub const COMPLETION_LENGTH_MAX: &str = "completion_length/max";
/// Share of completions cut at the generation budget.
pub const TRUNCATED_FRAC: &str = "truncated_frac";
/// Share of generated groups whose rewards are all equal.
pub const ZERO_STD_GROUPS_FRAC: &str = "zero_std_groups_frac";
/// Groups dropped by dynamic sampling.
pub const DROPPED_GROUPS: &str = "dropped_groups";
/// Generation rounds the step took.
pub const GENERATION_ROUNDS: &str = "generation_rounds";
/// Tool rollouts: mean tool calls per completion.
pub const TOOLS_CALLS_PER_COMPLETION: &str = "tools/calls_per_completion";
/// Tool rollouts: share of tool calls that failed (bad JSON, unknown tool, bad arguments, a
/// tool error or timeout).
pub const TOOLS_ERROR_RATE: &str = "tools/error_rate";
/// Tool rollouts: share of completions that called again after the last allowed tool turn.
pub const TOOLS_MAX_TURNS_FRAC: &str = "tools/max_turns_frac";
/// Tool rollouts: share of completions that called a tool at least once.
pub const TOOLS_USE_FRAC: &str = "tools/use_frac";
/// KL to the reference policy (NaN when no reference is held).
pub const KL: &str = "kl";
/// Mean policy entropy per token.
pub const ENTROPY: &str = "entropy";
/// Share of tokens clipped below.
pub const CLIP_FRAC_LOW: &str = "clip_frac/low";
/// Share of tokens clipped above.
pub const CLIP_FRAC_HIGH: &str = "clip_frac/high";
/// Share of tokens clipped either way.
pub const CLIP_FRAC_TOTAL: &str = "clip_frac/total";
/// Approximate KL between the policy and the one that sampled.
pub const PPO_KL: &str = "ppo_kl";
/// The loss of the step.
pub const LOSS: &str = "loss";
/// Gradient norm before clipping.
pub const GRAD_NORM: &str = "grad_norm";
/// Learning rate of the step.
pub const LR: &str = "lr";
/// 1 when the update was skipped (non-finite loss or gradient), else 0.
pub const SKIPPED_STEP: &str = "skipped_step";
/// Seconds of the whole step.
pub const TIME_STEP_S: &str = "time/step_s";
/// Seconds spent generating.
pub const TIME_GENERATE_S: &str = "time/generate_s";
/// Seconds spent in the update.
pub const TIME_TRAIN_S: &str = "time/train_s";
/// Seconds of the critic's value pass (actor-critic recipes; part of `time/generate_s`).
pub const TIME_CRITIC_VALUES_S: &str = "time/critic_values_s";
/// Seconds of the critic's update (actor-critic recipes; part of `time/train_s`).
pub const TIME_CRITIC_TRAIN_S: &str = "time/critic_train_s";
/// Completions per second of the step.
pub const THROUGHPUT_COMPLETIONS_PER_S: &str = "throughput/completions_per_s";
/// Generated tokens per second of the step.
pub const THROUGHPUT_TOKENS_PER_S: &str = "throughput/tokens_per_s";
/// Trained tokens per second (SFT).
pub const TOKENS_PER_S: &str = "tokens_per_s";
/// Completion tokens in the step's loss (SFT).
pub const COMPLETION_TOKENS: &str = "completion_tokens";
/// The critic's value loss (actor-critic recipes), last epoch.
pub const CRITIC_VALUE_LOSS: &str = "critic/value_loss";
/// Share of completion tokens whose value clip was active, last epoch.
pub const CRITIC_CLIP_FRAC: &str = "critic/clip_frac";
/// `1 − Var(R − V) / Var(R)` over the completion tokens: how much of the returns the
/// critic's values (as the experience was made) explain.
pub const CRITIC_EXPLAINED_VARIANCE: &str = "critic/explained_variance";
/// Mean value of the completion tokens, as the experience was made.
pub const CRITIC_VALUES_MEAN: &str = "critic/values_mean";
/// Mean GAE return of the completion tokens.
pub const CRITIC_RETURNS_MEAN: &str = "critic/returns_mean";
/// The critic's gradient norm before clipping, last epoch.
pub const CRITIC_GRAD_NORM: &str = "critic/grad_norm";
/// The KL to the reference put into the token rewards (its batch mean).
pub const KL_REWARD_MEAN: &str = "kl_reward/mean";
/// The KL coefficient β of the token rewards (moves with the adaptive controller).
pub const KL_REWARD_COEF: &str = "kl_reward/coef";
/// TRPO: the accepted fraction of the full natural-gradient step (0: none).
pub const TRPO_STEP_FRACTION: &str = "trpo/step_fraction";
/// TRPO: the KL to the old policy after the step.
pub const TRPO_KL: &str = "trpo/kl";
/// TRPO: the surrogate's improvement.
pub const TRPO_IMPROVEMENT: &str = "trpo/improvement";
/// TRPO: conjugate-gradient iterations.
pub const TRPO_CG_ITERATIONS: &str = "trpo/cg_iterations";
/// DPO: preference pairs in the step.
pub const DPO_PAIRS: &str = "pairs";
/// DPO: mean implicit reward `β·(log π − log π_ref)` of the chosen completions (TRL's name).
pub const DPO_REWARDS_CHOSEN: &str = "rewards/chosen";
/// DPO: mean implicit reward of the rejected completions.
pub const DPO_REWARDS_REJECTED: &str = "rewards/rejected";
/// DPO: share of pairs whose chosen implicit reward is the larger.
pub const DPO_REWARDS_ACCURACIES: &str = "rewards/accuracies";
/// DPO: mean chosen − rejected implicit reward.
pub const DPO_REWARDS_MARGINS: &str = "rewards/margins";
/// DPO: mean summed log-prob of the chosen completions under the policy.
pub const DPO_LOGPS_CHOSEN: &str = "logps/chosen";
/// DPO: mean summed log-prob of the rejected completions under the policy.
pub const DPO_LOGPS_REJECTED: &str = "logps/rejected";
/// Wall-clock time the row was logged, Unix seconds (added to every `metrics.jsonl` row by
/// the logger; an axis, not a curve).
pub const WALL_TIME_S: &str = "time/wall_s";
/// Held-out accuracy.
pub const EVAL_ACCURACY: &str = "eval/accuracy";
/// Held-out share of completions in the hard format.
pub const EVAL_FORMAT_RATE: &str = "eval/format_rate";
/// Held-out mean completion length.
pub const EVAL_COMPLETION_LENGTH: &str = "eval/completion_length";
/// Held-out loss (SFT).
pub const EVAL_LOSS: &str = "eval/loss";
/// Share of held-out preference pairs ranked right (DPO, reward models).
pub const EVAL_PAIR_ACCURACY: &str = "eval/pair_accuracy";
/// Standard deviation of a reward model's scores over both sides of its held-out pairs (the
/// spread an RL recipe's advantages inherit from it).
pub const EVAL_SCORE_STD: &str = "eval/score_std";
/// Held-out mean tool calls per completion (runs with tools).
pub const EVAL_TOOLS_CALLS_PER_COMPLETION: &str = "eval/tools/calls_per_completion";
/// Held-out share of failed tool calls (runs with tools).
pub const EVAL_TOOLS_ERROR_RATE: &str = "eval/tools/error_rate";

/// The key of reward function `name`'s mean: `reward/<name>/mean`.
pub fn reward_fn_mean(name: &str) -> String {
    format!("{REWARD_PREFIX}{name}{REWARD_FN_SUFFIX}")
}
