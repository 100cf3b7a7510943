//! `GRPOArgs`: every option of the GRPO, DAPO and SFT recipes, with their defaults.

use serde::{Deserialize, Serialize};

pub use atomrl_optim::LrSchedule;

use super::actor_critic::{CriticArgs, TrpoArgs};
use super::preference::{DpoArgs, RewardModelArgs};
use super::resume::Resume;
use atomrl_advantage::AdvantageMode;
use atomrl_core::{ComputeDtype, DeviceSpec};
use atomrl_loss::{KlEstimator, LossAgg, RatioLevel};

/// Which recipe a run follows; each one is a preset of [`GRPOArgs`] defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Recipe {
    /// GRPO (DeepSeekMath): group-normalised advantages, clip 0.2, sequence-mean token-mean.
    #[default]
    Grpo,
    /// DAPO: clip-higher 0.28, token-level loss, dynamic sampling, overlong shaping, β = 0.
    Dapo,
    /// Supervised fine-tuning on prompt/completion pairs (completion-only cross-entropy).
    Sft,
    /// PPO with a learned critic and GAE (`[critic]`), μ clipped epochs per experience.
    Ppo,
    /// Advantage actor-critic: the critic's GAE advantages, the vanilla policy gradient.
    A2c,
    /// TRPO: the critic's GAE advantages, a natural-gradient step in a KL trust region
    /// (`[trpo]`).
    Trpo,
    /// DPO on preference pairs (`[dpo]`): from the dataset, or online, the best and worst of
    /// each prompt's `num_generations` scored completions.
    Dpo,
    /// A reward model (`[reward_model]`): the policy's transformer with a scalar head, trained
    /// on preference pairs by the Bradley-Terry loss, saved as a sequence classifier.
    Reward,
}

impl Recipe {
    /// The names, as written in a configuration or on the command line.
    pub const NAMES: [&'static str; 8] =
        ["grpo", "dapo", "sft", "ppo", "a2c", "trpo", "dpo", "reward"];

    /// The name of this recipe.
    pub fn name(self) -> &'static str {
        Self::NAMES[self as usize]
    }

    /// Whether the recipe trains a critic (`ppo`, `a2c`, `trpo`).
    pub fn has_critic(self) -> bool {
        matches!(self, Self::Ppo | Self::A2c | Self::Trpo)
    }
}

impl std::fmt::Display for Recipe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// ```
/// use atomrl_config::Recipe;
/// assert_eq!("dapo".parse::<Recipe>()?, Recipe::Dapo);
/// assert!("ppo2".parse::<Recipe>().unwrap_err().to_string().contains("recipe"));
/// # Ok::<(), atomrl_core::Error>(())
/// ```
impl std::str::FromStr for Recipe {
    type Err = atomrl_core::Error;

    fn from_str(s: &str) -> atomrl_core::Result<Self> {
        Self::NAMES
            .iter()
            .zip([
                Self::Grpo,
                Self::Dapo,
                Self::Sft,
                Self::Ppo,
                Self::A2c,
                Self::Trpo,
                Self::Dpo,
                Self::Reward,
            ])
            .find_map(|(n, r)| (*n == s).then_some(r))
            .ok_or_else(|| atomrl_core::Error::unknown_choice("config", "recipe", &Self::NAMES, s))
    }
}

/// One reward function of the weighted total (`[[rewards]]` in the TOML file).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RewardSpec {
    /// A name known to `atomrl_reward::reward_fn_by_name` (`correctness`, `hard_format`, ...).
    pub name: String,
    /// Weight in the total reward.
    #[serde(default = "one")]
    pub weight: f32,
    /// Options of the function (e.g. `{ strict = true }`).
    #[serde(default)]
    pub options: toml::Table,
    /// The reward model of `name = "model"`: a folder (`--recipe reward`'s
    /// `checkpoint-N/reward_model`) or a hub id of a one-label sequence classifier.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
}

fn one() -> f32 {
    1.0
}

/// Which completions count as correct (`[accuracy]`): the training `accuracy` metric and the
/// held-out evaluation score with this reward and call a completion correct when it reaches
/// `threshold`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccuracySpec {
    /// A name known to `atomrl_reward::reward_fn_by_name` (default `correctness`).
    #[serde(default = "correctness")]
    pub reward: String,
    /// Options of the reward (e.g. `{ strict = true }`).
    #[serde(default)]
    pub options: toml::Table,
    /// The score at or above which a completion is correct (default 1).
    #[serde(default = "one")]
    pub threshold: f32,
}

fn correctness() -> String {
    "correctness".into()
}

impl Default for AccuracySpec {
    fn default() -> Self {
        Self {
            reward: correctness(),
            options: toml::Table::new(),
            threshold: 1.0,
        }
    }
}

/// LoRA settings (`[lora]`); absent means full fine-tuning.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoraArgs {
    /// Rank `r`.
    pub r: usize,
    /// Scale numerator: the update is `alpha / r · B·A`.
    pub alpha: f64,
    /// Dropout on the adapter input during training.
    #[serde(default)]
    pub dropout: f64,
    /// Linear layers that get adapters (`q_proj`, `k_proj`, `v_proj`, `o_proj`, `gate_proj`,
    /// `up_proj`, `down_proj`).
    #[serde(default = "default_lora_targets")]
    pub target_modules: Vec<String>,
}

fn default_lora_targets() -> Vec<String> {
    ["q_proj", "k_proj", "v_proj", "o_proj"]
        .map(String::from)
        .to_vec()
}

/// Every option of a training run. Load with [`crate::load_args`] (TOML file, preset,
/// `--set key=value` overrides); unknown keys and bad values are rejected with the key named.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GRPOArgs {
    /// The preset this run started from.
    pub recipe: Recipe,
    /// Model: a local Hugging Face folder or a hub id (`Qwen/Qwen2.5-0.5B-Instruct`).
    pub model: String,
    /// Training data: a JSONL file, a parquet file, or a hub dataset id (`openai/gsm8k`).
    pub dataset: String,
    /// Held-out data; when absent, `eval_size` examples are split off the training data.
    pub eval_dataset: Option<String>,
    /// Number of held-out examples (split off when `eval_dataset` is absent; 0 = no eval).
    pub eval_size: usize,
    /// Where checkpoints, metrics, events and charts go.
    pub output_dir: String,
    /// Number of optimizer steps; 0 = as many as `epochs` over the training data.
    pub max_steps: usize,
    /// Stop training after this many seconds (then evaluate and save as at the last step);
    /// 0 = no limit. The number of steps then depends on the machine's speed.
    pub time_budget_s: f64,
    /// With a time budget, let the learning-rate schedule run on whichever ends first, the
    /// steps or the budget: after warm-up it is at `max(step / max_steps, elapsed /
    /// time_budget_s)` of its course, so a machine too slow for `max_steps` still ends its run
    /// with the decayed rate. A machine fast enough for the steps follows the step schedule
    /// exactly. Time counts from this invocation's first step, over the budget the opening
    /// evaluation left (a resumed run compresses the rest of its schedule into its own budget).
    pub lr_schedule_on_budget: bool,
    /// Passes over the training data (used when `max_steps` is 0).
    pub epochs: usize,
    /// Prompts per step (GRPO) or examples per step (SFT).
    pub batch_size: usize,
    /// Completions per prompt, `G`.
    pub num_generations: usize,
    /// Micro-batches per optimizer step (the global normaliser keeps the loss exact).
    pub gradient_accumulation_steps: usize,
    /// Prompts longer than this are left-truncated (with a warning).
    pub max_prompt_length: usize,
    /// Generation budget in tokens.
    pub max_completion_length: usize,
    /// Sampling temperature (also used for the training log-probs, as TRL does).
    pub temperature: f64,
    /// Nucleus sampling mass (1 = off).
    pub top_p: f64,
    /// Top-k sampling (0 = off).
    pub top_k: usize,
    /// Min-p sampling (0 = off).
    pub min_p: f64,
    /// Repetition penalty (1 = off).
    pub repetition_penalty: f64,
    /// KL coefficient; 0 means no reference model is held at all.
    pub beta: f64,
    /// KL estimator: `k1`, `k2`, `k3` or `abs` (verl's `kl`, `mse`, `low_var_kl` accepted).
    pub kl_estimator: KlEstimator,
    /// Lower clip `ε_low`.
    pub clip_low: f64,
    /// Upper clip `ε_high` (DAPO clip-higher: 0.28).
    pub clip_high: f64,
    /// Dual-clip constant (> 1), off when absent.
    pub clip_ratio_c: Option<f64>,
    /// Loss aggregation: `token_mean`, `seq_mean_token_mean`, `seq_mean_token_sum`,
    /// `seq_mean_token_sum_norm` (or TRL's `grpo`, `bnpo`, `dr_grpo`, `dapo`).
    pub loss_agg: LossAgg,
    /// Importance ratio per `token` (PPO/GRPO) or per `sequence` (GSPO; `gspo` accepted).
    pub ratio_level: RatioLevel,
    /// Policy updates per generation batch (μ); > 1 computes old log-probs before updating.
    pub num_iterations: usize,
    /// Advantage estimator: `grpo`, `grpo_no_std`, `batch`, `rloo`, `reinforce_pp`, `raw`.
    pub advantage_mode: AdvantageMode,
    /// `eps` added to the group std.
    pub advantage_eps: f64,
    /// DAPO dynamic sampling: drop groups with zero reward spread and generate more.
    pub dynamic_sampling: bool,
    /// Generation rounds per step at most when refilling (dynamic sampling).
    pub max_num_gen_batches: usize,
    /// DAPO overlong shaping: buffer length in tokens (absent = off).
    pub overlong_buffer_len: Option<usize>,
    /// DAPO overlong shaping: penalty factor.
    pub overlong_penalty_factor: f64,
    /// Exclude truncated completions (no EOS) from the loss.
    pub mask_truncated_completions: bool,
    /// Entropy bonus coefficient (subtracted from the loss).
    pub entropy_coef: f64,
    /// Reward functions and weights.
    pub rewards: Vec<RewardSpec>,
    /// What counts as a correct completion in metrics and evaluation.
    pub accuracy: AccuracySpec,
    /// Peak learning rate.
    pub lr: f64,
    /// AdamW decoupled weight decay.
    pub weight_decay: f64,
    /// AdamW β₁.
    pub adam_beta1: f64,
    /// AdamW β₂.
    pub adam_beta2: f64,
    /// AdamW ε.
    pub adam_eps: f64,
    /// Gradient-norm clipping threshold (0 = off).
    pub max_grad_norm: f64,
    /// Schedule after warm-up.
    pub lr_scheduler: LrSchedule,
    /// Warm-up as a share of the steps (used when `warmup_steps` is 0).
    pub warmup_ratio: f64,
    /// Warm-up steps.
    pub warmup_steps: usize,
    /// Final learning rate as a share of `lr` (linear and cosine).
    pub min_lr_ratio: f64,
    /// The number of optimizer steps `lr` was tuned for (0 = off). A longer run takes a lower
    /// peak, `lr · (lr_horizon_steps / steps)^lr_horizon_exponent` (the horizon scaling law of
    /// Bjorck et al., ICLR 2025); a shorter one keeps `lr`. `steps` is `max_steps`, or with
    /// `lr_schedule_on_budget` and a time budget the steps the run's pace will fit in the
    /// budget, measured from the first 5% of it on (the rate then depends on the machine's
    /// pace, as the number of steps does). The critic's rate is not scaled.
    #[serde(default)]
    pub lr_horizon_steps: usize,
    /// The exponent of `lr_horizon_steps`' rule, in (0, 1] when that is set (ignored when it
    /// is 0).
    #[serde(default)]
    pub lr_horizon_exponent: f64,
    /// Seed of data order, sampling and initialisation.
    pub seed: u64,
    /// Save a checkpoint every this many steps (0 = only at the end).
    pub save_steps: usize,
    /// Keep at most this many checkpoints (0 = all).
    pub save_total_limit: usize,
    /// Evaluate every this many steps (0 = only before and after training).
    pub eval_steps: usize,
    /// Log sample completions every this many steps.
    pub logging_steps: usize,
    /// Completions logged per logged step in `samples.jsonl` (whole groups where it holds
    /// one; 0: none): with their rewards, advantage, length, finish reason and tool calls, for
    /// the dashboard's rollout browser. Bounds the file: each text is also cut to 8,000
    /// characters.
    #[serde(default = "default_log_completions_max")]
    pub log_completions_max: usize,
    /// Resume: `"auto"` (latest complete checkpoint in `output_dir`, if any), `"never"`, or a
    /// checkpoint folder.
    pub resume: Resume,
    /// LoRA adapters instead of full fine-tuning.
    pub lora: Option<LoraArgs>,
    /// Compute dtype of the forward and backward: `f32`, `bf16` or `f16`. The master weights,
    /// their gradients and the optimizer state stay f32 whatever this says (mixed precision:
    /// weights are cast to this dtype for each forward, see docs/cuda.md). `bf16` is the usual
    /// choice on CUDA; on the CPU it saves memory but is not faster.
    pub dtype: ComputeDtype,
    /// `cpu`, `cuda` (GPU 0) or `cuda:N`. CUDA needs a build with `--features cuda`; without it,
    /// or without a usable GPU, the run stops with an error saying so.
    pub device: DeviceSpec,
    /// Gradient checkpointing: recompute each decoder layer's activations in backward instead
    /// of keeping them (about a third more compute for much less activation memory). Not
    /// supported together with LoRA dropout.
    #[serde(default)]
    pub gradient_checkpointing: bool,
    /// Attention-score elements (`rows × heads × queries × keys`) one attention may hold at
    /// once; past it, attention runs in chunks of queries and its backward recomputes each
    /// chunk's probabilities (FlashAttention's plan in tensor ops: memory of one chunk's
    /// scores instead of `[N, H, L, L]`; `atomrl_model::CausalLm::set_attention_scores_budget`).
    /// Unset: the device's default (`atomrl_model::default_scores_budget`: 2^24 on the CPU,
    /// 64 MiB of f32 scores; 2^26 on a GPU).
    #[serde(default)]
    pub attention_scores_budget: Option<usize>,
    /// Compute threads of each tensor op (0 = chosen from the model size and the cores: see
    /// `atomrl_trainer::runtime::cpu_plan`).
    pub threads: usize,
    /// CPU data-parallel workers: the rollouts, the evaluation and each update's micro-batches
    /// are split into this many shards that run at once on their own threads (gradients summed
    /// in shard order, so a run is deterministic for a given count). 0 (the default) chooses:
    /// one worker per core of one thread each for models up to 100 M parameters, two workers
    /// sharing the cores up to 1 B, one worker using every core above
    /// (`atomrl_trainer::runtime::cpu_plan`); a GPU run keeps a single worker. The sampling seed
    /// of a shard depends on the count, so runs with different counts draw different
    /// completions.
    #[serde(default)]
    pub workers: usize,
    /// Tools the model may call during rollouts and evaluation (`["calculator"]`): their
    /// schemas go to the chat template's `tools`, and each `<tool_call>` the model writes is
    /// run and answered in a tool turn (see `atomrl_sample::generate_with_tools`). Empty (the
    /// default): single-turn rollouts.
    #[serde(default)]
    pub tools: Vec<String>,
    /// With `tools`: tool turns per completion at most (a completion that calls once more
    /// ends there). `max_completion_length` covers the whole multi-turn completion.
    #[serde(default = "default_max_tool_turns")]
    pub max_tool_turns: usize,
    /// Apply the tokenizer's chat template to prompts (false: prompts are already templated).
    pub chat_template: bool,
    /// Optional system prompt put before each prompt.
    pub system_prompt: Option<String>,
    /// Show a progress bar.
    pub progress: bool,
    /// The critic of the actor-critic recipes (`ppo`, `a2c`, `trpo`).
    #[serde(default)]
    pub critic: Option<CriticArgs>,
    /// TRPO's trust region and solver.
    #[serde(default)]
    pub trpo: Option<TrpoArgs>,
    /// DPO's loss (`dpo` recipe).
    #[serde(default)]
    pub dpo: Option<DpoArgs>,
    /// The reward model's loss (`reward` recipe).
    #[serde(default)]
    pub reward_model: Option<RewardModelArgs>,
}

/// [`GRPOArgs::max_tool_turns`]'s default.
fn default_max_tool_turns() -> usize {
    3
}

impl GRPOArgs {
    /// The defaults of `recipe`, from its preset file (`presets/*.toml`, embedded in the
    /// crate).
    ///
    /// ```
    /// use atomrl_config::{GRPOArgs, Recipe};
    /// let dapo = GRPOArgs::preset(Recipe::Dapo);
    /// assert_eq!((dapo.clip_high, dapo.loss_agg.name(), dapo.dynamic_sampling, dapo.beta), (0.28, "token_mean", true, 0.0));
    /// ```
    pub fn preset(recipe: Recipe) -> Self {
        // The files are part of the crate, not user input, and a test loads every one of
        // them: a failure here is a bug in a preset file.
        toml::Value::Table(super::load::preset_table(recipe))
            .try_into()
            .unwrap_or_else(|e| panic!("presets/{recipe}.toml: {e}"))
    }
}

/// The default of [`GRPOArgs::log_completions_max`]: a few groups of a step.
fn default_log_completions_max() -> usize {
    64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The presets as they were written in Rust before they moved to `presets/*.toml`: the
    /// files must give exactly these values.
    fn old_preset(recipe: Recipe) -> GRPOArgs {
        let grpo = GRPOArgs {
            recipe,
            model: String::new(),
            dataset: String::new(),
            eval_dataset: None,
            eval_size: 0,
            output_dir: "runs/atomrl".into(),
            max_steps: 0,
            time_budget_s: 0.0,
            lr_schedule_on_budget: false,
            epochs: 1,
            batch_size: 8,
            num_generations: 8,
            gradient_accumulation_steps: 1,
            max_prompt_length: 512,
            max_completion_length: 256,
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            beta: 0.0,
            kl_estimator: KlEstimator::K3,
            clip_low: 0.2,
            clip_high: 0.2,
            clip_ratio_c: None,
            loss_agg: LossAgg::SeqMeanTokenMean,
            ratio_level: RatioLevel::Token,
            num_iterations: 1,
            advantage_mode: AdvantageMode::Grpo,
            advantage_eps: 1e-6,
            dynamic_sampling: false,
            max_num_gen_batches: 4,
            overlong_buffer_len: None,
            overlong_penalty_factor: 1.0,
            mask_truncated_completions: false,
            entropy_coef: 0.0,
            rewards: vec![
                RewardSpec {
                    name: "correctness".into(),
                    weight: 1.0,
                    options: toml::Table::new(),
                    path: None,
                },
                RewardSpec {
                    name: "hard_format".into(),
                    weight: 0.1,
                    options: toml::Table::new(),
                    path: None,
                },
            ],
            accuracy: AccuracySpec::default(),
            lr: 1e-6,
            weight_decay: 0.0,
            adam_beta1: 0.9,
            adam_beta2: 0.999,
            adam_eps: 1e-8,
            max_grad_norm: 1.0,
            lr_scheduler: LrSchedule::Constant,
            warmup_ratio: 0.0,
            warmup_steps: 0,
            min_lr_ratio: 0.0,
            lr_horizon_steps: 0,
            lr_horizon_exponent: 0.0,
            seed: 42,
            save_steps: 0,
            save_total_limit: 3,
            eval_steps: 0,
            logging_steps: 10,
            log_completions_max: default_log_completions_max(),
            resume: Resume::Never,
            lora: None,
            dtype: ComputeDtype::F32,
            device: DeviceSpec::Cpu,
            gradient_checkpointing: false,
            attention_scores_budget: None,
            threads: 0,
            workers: 0,
            tools: Vec::new(),
            max_tool_turns: 3,
            chat_template: true,
            system_prompt: None,
            progress: true,
            critic: None,
            trpo: None,
            dpo: None,
            reward_model: None,
        };
        match recipe {
            Recipe::Grpo => grpo,
            Recipe::Dapo => GRPOArgs {
                clip_low: 0.2,
                clip_high: 0.28,
                loss_agg: LossAgg::TokenMean,
                dynamic_sampling: true,
                overlong_buffer_len: Some(64),
                overlong_penalty_factor: 1.0,
                beta: 0.0,
                ..grpo
            },
            Recipe::Sft => GRPOArgs {
                num_generations: 1,
                lr: 2e-5,
                loss_agg: LossAgg::TokenMean,
                rewards: Vec::new(),
                ..grpo
            },
            Recipe::Ppo | Recipe::A2c | Recipe::Trpo => GRPOArgs {
                batch_size: 64,
                num_generations: 1,
                num_iterations: if recipe == Recipe::Ppo { 4 } else { 1 },
                loss_agg: LossAgg::TokenMean,
                critic: Some(CriticArgs::default()),
                trpo: (recipe == Recipe::Trpo).then(TrpoArgs::default),
                ..grpo
            },
            Recipe::Dpo => GRPOArgs {
                lr: 1e-6,
                dpo: Some(DpoArgs::default()),
                ..grpo
            },
            Recipe::Reward => GRPOArgs {
                lr: 1e-5,
                num_generations: 1,
                rewards: Vec::new(),
                reward_model: Some(RewardModelArgs::default()),
                ..grpo
            },
        }
    }

    #[test]
    fn every_preset_loads_with_its_former_values() {
        for recipe in [
            Recipe::Grpo,
            Recipe::Dapo,
            Recipe::Sft,
            Recipe::Ppo,
            Recipe::A2c,
            Recipe::Trpo,
            Recipe::Dpo,
            Recipe::Reward,
        ] {
            assert_eq!(GRPOArgs::preset(recipe), old_preset(recipe), "{recipe}");
        }
    }
}
