//! `GRPOTrainer`: the GRPO / DAPO loop with checkpoints, exact resume, metrics and evaluation.

use std::path::{Path, PathBuf};
use std::time::Instant;

use atomrl_advantage::compute_advantages;
use atomrl_core::{CandleContext, Error, Result};
use atomrl_model::CausalLm;
use atomrl_reward::WeightedRewards;
use atomrl_sample::{ChatTokenizer, FinishReason, SamplingParams};
use candle_core::{Device, Tensor, Var};

use super::batch::TrainingBatch;
use super::eval::{evaluate_sharded, EvalResult};
use super::prompt::PromptEncoder;
use super::rollout::{add_round, generate_group_rows_sharded, RolloutContext, Rollouts};
use super::update::{policy_update_hooked, UpdateContext};
use crate::checkpoint::{latest_checkpoint, load_trainer_state, save_checkpoint, TrainerState};
use crate::config::{GRPOArgs, Resume};
use crate::data::{DataSource, EpochSampler, Example, SplitMix64};
use crate::logging::{keys, MetricRow, MetricsLogger};
use crate::optim::{budget_schedule_step, learning_rate, warmup_steps, AdamW, AdamWConfig};

/// What a finished run reports.
#[derive(Debug, Clone)]
pub struct TrainSummary {
    /// Steps completed (including earlier, resumed ones).
    pub steps: u64,
    /// Steps skipped by the NaN/Inf guard.
    pub skipped_steps: u64,
    /// Held-out accuracy before the first update of this run (if evaluated).
    pub eval_before: Option<EvalResult>,
    /// Held-out accuracy at the end (if evaluated).
    pub eval_after: Option<EvalResult>,
    /// The last checkpoint written.
    pub checkpoint: Option<PathBuf>,
    /// PNG charts written.
    pub charts: Vec<PathBuf>,
    /// Wall-clock seconds of this run.
    pub seconds: f64,
    /// Where everything was written.
    pub output_dir: PathBuf,
}

/// The trainer of every recipe: GRPO and DAPO (`GRPOTrainer::new(args, model, tokenizer,
/// rewards)?.train()?`) and SFT (the same loop with the cross-entropy step, see
/// [`crate::sft`]). Checkpoints, exact resume, metrics and evaluation are shared.
pub struct Trainer {
    pub(crate) args: GRPOArgs,
    pub(crate) model: CausalLm,
    pub(crate) tokenizer: ChatTokenizer,
    reference: Option<CausalLm>,
    rewards: WeightedRewards,
    pub(crate) train_set: Vec<Example>,
    pub(crate) eval_set: Vec<Example>,
    pub(crate) encoder: PromptEncoder,
    pub(crate) params: Vec<(String, Var)>,
    pub(crate) optimizer: AdamW,
    /// Steps at which the loss is replaced by NaN (tests of the guard).
    #[cfg(feature = "test-hooks")]
    nan_steps: Vec<u64>,
    /// A few (prompt, completion, reward) of the last step, for the sample log.
    pub(crate) last_samples: Vec<(String, String, f64)>,
    /// Warnings of the current step, printed through the logger after it (above the progress
    /// bar, which a bare `eprintln!` would tear).
    warnings: Vec<String>,
}

/// The GRPO / DAPO trainer of the seeds' usage example (the same type as [`Trainer`]).
pub type GRPOTrainer = Trainer;

impl Trainer {
    /// A trainer on `model` (the policy; LoRA already attached if wanted), scoring with
    /// `rewards`; the data comes from `args.dataset` / `args.eval_dataset` (see
    /// [`GRPOTrainer::with_data`] to pass examples directly).
    ///
    /// # Errors
    /// Data loading failures, an empty training set, optimizer allocation.
    pub fn new(
        args: GRPOArgs,
        model: CausalLm,
        tokenizer: ChatTokenizer,
        rewards: WeightedRewards,
    ) -> Result<Self> {
        let (train_set, eval_set) = load_splits(&args)?;
        Self::with_data(args, model, tokenizer, rewards, train_set, eval_set)
    }

    /// A trainer on explicit training and held-out examples.
    ///
    /// # Errors
    /// An empty training set, optimizer allocation, a reference copy that cannot be allocated.
    pub fn with_data(
        mut args: GRPOArgs,
        mut model: CausalLm,
        tokenizer: ChatTokenizer,
        rewards: WeightedRewards,
        train_set: Vec<Example>,
        eval_set: Vec<Example>,
    ) -> Result<Self> {
        if train_set.is_empty() {
            return Err(Error::value(
                "Trainer",
                "dataset",
                "at least one training example",
                0,
            ));
        }
        if args.workers == 0 {
            // The thread pools exist by now: fill the cores they leave (see `cpu_plan`).
            args.workers = if model.device().is_cpu() {
                let threads = candle_core::utils::get_num_threads();
                crate::runtime::cpu_plan(model.config().num_parameters(), threads, 0).workers
            } else {
                1
            };
        }
        model.set_gradient_checkpointing(args.gradient_checkpointing);
        let params = if model.lora_config().is_some() {
            model.lora_vars()
        } else {
            model.named_vars()
        };
        let optimizer = AdamW::new(
            params.clone(),
            AdamWConfig {
                beta1: args.adam_beta1,
                beta2: args.adam_beta2,
                eps: args.adam_eps,
                weight_decay: args.weight_decay,
            },
        )?;
        // β = 0 holds no reference model at all; otherwise a frozen copy of the given policy.
        let reference = if args.beta > 0.0 {
            Some(frozen_copy(&model)?)
        } else {
            None
        };
        let encoder = PromptEncoder {
            chat_template: args.chat_template,
            system_prompt: args.system_prompt.clone(),
            max_prompt_length: args.max_prompt_length,
        };
        Ok(Self {
            args,
            model,
            tokenizer,
            reference,
            rewards,
            train_set,
            eval_set,
            encoder,
            params,
            optimizer,
            #[cfg(feature = "test-hooks")]
            nan_steps: Vec::new(),
            last_samples: Vec::new(),
            warnings: Vec::new(),
        })
    }

    /// Makes the loss NaN at these steps (1-based), to exercise the skip guard. A test hook:
    /// only with the `test-hooks` feature.
    #[cfg(feature = "test-hooks")]
    pub fn inject_nan_at(mut self, steps: &[u64]) -> Self {
        self.nan_steps = steps.to_vec();
        self
    }

    /// Whether the test hook asks for a NaN loss at `step`.
    #[cfg(feature = "test-hooks")]
    pub(crate) fn nan_at(&self, step: u64) -> bool {
        self.nan_steps.contains(&step)
    }

    /// Whether the test hook asks for a NaN loss at `step`: never without `test-hooks`.
    #[cfg(not(feature = "test-hooks"))]
    pub(crate) fn nan_at(&self, _step: u64) -> bool {
        false
    }

    /// Queues a warning of the current step (printed by the loop through the logger).
    pub(crate) fn warn(&mut self, msg: String) {
        self.warnings.push(msg);
    }

    /// The policy model.
    pub fn model(&self) -> &CausalLm {
        &self.model
    }

    /// Total optimizer steps of the run (`max_steps`, or `epochs` over the training set).
    pub fn total_steps(&self) -> usize {
        if self.args.max_steps > 0 {
            self.args.max_steps
        } else {
            (self.args.epochs * self.train_set.len())
                .div_ceil(self.args.batch_size)
                .max(1)
        }
    }

    /// Runs the training loop (resuming from the latest checkpoint when `resume` says so).
    ///
    /// # Errors
    /// I/O, generation or tensor failures. A non-finite loss or gradient is not an error: the
    /// step is skipped, logged (`skipped_step = 1`) and counted.
    pub fn train(&mut self) -> Result<TrainSummary> {
        let started = Instant::now();
        let output_dir = PathBuf::from(&self.args.output_dir);
        std::fs::create_dir_all(&output_dir).map_err(|e| Error::file(output_dir.display(), e))?;
        let total = self.total_steps();
        let mut sampler = EpochSampler::new(self.train_set.len(), self.args.seed);
        let mut state = TrainerState {
            step: 0,
            sampler: sampler.state(),
            skipped_steps: 0,
            seed: self.args.seed,
            eval_accuracy: None,
            recipe: self.args.recipe,
        };
        if let Some(ckpt) = self.resume_point(&output_dir)? {
            state = self.restore(&ckpt)?;
            sampler =
                EpochSampler::from_state(self.train_set.len(), self.args.seed, &state.sampler)?;
        }
        let resumed = state.step > 0;
        let mut logger = MetricsLogger::create(
            &output_dir,
            resumed.then_some(state.step),
            total as u64,
            self.args.progress,
        )?;
        if resumed {
            logger.println(format!(
                "resumed from step {} in {}",
                state.step,
                output_dir.display()
            ));
        }
        let eval_before = if !resumed && !self.eval_set.is_empty() {
            let r = self.evaluate()?;
            let mut row = MetricRow::new(0);
            push_eval(&mut row, &r);
            logger.log(&row)?;
            logger.println(format!(
                "step 0: held-out greedy accuracy {:.1}% ({} examples)",
                100.0 * r.accuracy,
                r.count
            ));
            Some(r)
        } else {
            None
        };
        let warmup = warmup_steps(self.args.warmup_steps, self.args.warmup_ratio, total);
        let start_step = state.step as usize;
        // The schedule's clock starts with the first step: the budget left after the opening
        // evaluation is what the steps share, and a machine fast enough for them stays on the
        // step schedule from the start.
        let steps_started = Instant::now();
        // No budget (0) leaves the schedule on the steps.
        let steps_budget = if self.args.time_budget_s > 0.0 {
            (self.args.time_budget_s - started.elapsed().as_secs_f64()).max(1e-3)
        } else {
            0.0
        };
        let mut last_checkpoint = None;
        let mut eval_after = None;
        while (state.step as usize) < total {
            let step = state.step + 1;
            let schedule_step = if self.args.lr_schedule_on_budget {
                budget_schedule_step(
                    state.step as usize,
                    start_step,
                    total,
                    warmup,
                    steps_started.elapsed().as_secs_f64(),
                    steps_budget,
                )
            } else {
                state.step as usize
            };
            let lr = learning_rate(
                self.args.lr_scheduler,
                self.args.lr,
                warmup,
                total,
                self.args.min_lr_ratio,
                schedule_step,
            );
            let mut row = match self.args.recipe {
                crate::config::Recipe::Sft => self.sft_step(step, lr, &mut sampler)?,
                _ => self.step(step, lr, &mut sampler)?,
            };
            for w in self.warnings.drain(..) {
                logger.warn(format!("warning: {w}"));
            }
            state.step = step;
            state.sampler = sampler.state();
            state.skipped_steps += row.get(keys::SKIPPED_STEP).unwrap_or(0.0) as u64;
            let out_of_time = self.args.time_budget_s > 0.0
                && started.elapsed().as_secs_f64() >= self.args.time_budget_s;
            if out_of_time && (step as usize) < total {
                logger.println(format!(
                    "time budget of {} s reached after step {step}",
                    self.args.time_budget_s
                ));
            }
            let last = step as usize == total || out_of_time;
            if !self.eval_set.is_empty()
                && (last || (self.args.eval_steps > 0 && step as usize % self.args.eval_steps == 0))
            {
                let r = self.evaluate()?;
                push_eval(&mut row, &r);
                state.eval_accuracy = Some(r.accuracy);
                if last {
                    eval_after = Some(r);
                }
            }
            logger.log(&row)?;
            if self.args.logging_steps > 0 && step as usize % self.args.logging_steps == 0 {
                logger.log_samples(step, &self.last_samples)?;
            }
            if last || (self.args.save_steps > 0 && step as usize % self.args.save_steps == 0) {
                last_checkpoint = Some(save_checkpoint(
                    &output_dir,
                    &self.model,
                    &self.optimizer,
                    &state,
                    self.args.save_total_limit,
                )?);
            }
            kill_if_asked(step);
            if last {
                break;
            }
        }
        logger.flush()?;
        let charts = logger.finish()?;
        Ok(TrainSummary {
            steps: state.step,
            skipped_steps: state.skipped_steps,
            eval_before,
            eval_after,
            checkpoint: last_checkpoint,
            charts,
            seconds: started.elapsed().as_secs_f64(),
            output_dir,
        })
    }

    /// One GRPO step: rollouts (with DAPO refills), advantages, the policy update; returns the
    /// step's metrics.
    fn step(&mut self, step: u64, lr: f64, sampler: &mut EpochSampler) -> Result<MetricRow> {
        let a = &self.args;
        let g = a.num_generations;
        let t0 = Instant::now();
        let params = SamplingParams {
            num_generations: g,
            max_new_tokens: a.max_completion_length,
            temperature: a.temperature,
            top_p: a.top_p,
            top_k: a.top_k,
            min_p: a.min_p,
            repetition_penalty: a.repetition_penalty,
            stop_token_ids: self.tokenizer.eos_token_ids(),
            stop_strings: Vec::new(),
            seed: 0,
        };
        let view = self.model.detached();
        let ctx = RolloutContext {
            model: &view,
            tokenizer: &self.tokenizer,
            params: &params,
            rewards: &self.rewards,
        };
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
                .map(|i| &self.train_set[i])
                .collect();
            let prompts = picked
                .iter()
                .map(|e| self.encoder.encode(&self.tokenizer, e))
                .collect::<Result<Vec<_>>>()?;
            truncated_prompts += prompts.iter().filter(|p| p.truncated).count();
            let truth: Vec<String> = picked.iter().map(|e| e.ground_truth.clone()).collect();
            let round_params = SamplingParams {
                seed: sampling_seed(a.seed, step, round as u64),
                ..params.clone()
            };
            let round_ctx = RolloutContext {
                params: &round_params,
                ..ctx
            };
            let (rows, tokens) =
                generate_group_rows_sharded(&round_ctx, &prompts, &truth, a.workers)?;
            rollouts.generated_tokens += tokens;
            add_round(&mut rollouts, rows, g, a.dynamic_sampling, a.batch_size)?;
            if rollouts.rows.len() >= a.batch_size * g {
                break;
            }
        }
        if truncated_prompts > 0 {
            let max = a.max_prompt_length;
            self.warnings.push(format!("step {step}: {truncated_prompts} prompt(s) longer than max_prompt_length = {max} were left-truncated"));
        }
        let generate_s = t0.elapsed().as_secs_f64();
        let t1 = Instant::now();
        let mut row = MetricRow::new(step);
        let stats = if rollouts.rows.is_empty() {
            None
        } else {
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
            let seqs: Vec<(&[u32], &[u32])> = rollouts
                .rows
                .iter()
                .map(|r| (r.prompt_ids.as_slice(), r.completion_ids.as_slice()))
                .collect();
            let batch = TrainingBatch::build(
                &seqs,
                &advantages,
                &counts,
                self.tokenizer.pad_token_id(),
                self.model.device(),
            )?;
            let inject = self.nan_at(step);
            let uctx = UpdateContext {
                model: &self.model,
                reference: self.reference.as_ref(),
                params: &self.params,
                args: &self.args,
            };
            Some(policy_update_hooked(
                &uctx,
                &mut self.optimizer,
                &batch,
                lr,
                inject,
            )?)
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
            self.warn(format!("step {step}: update skipped: {reason}"));
        }
        self.record(
            &mut row,
            &rollouts,
            stats.as_ref(),
            lr,
            skipped,
            generate_s,
            train_s,
        );
        self.last_samples = rollouts
            .rows
            .iter()
            .take(2)
            .map(|r| (r.prompt.clone(), r.completion.clone(), r.reward))
            .collect();
        Ok(row)
    }

    #[allow(clippy::too_many_arguments)]
    fn record(
        &self,
        row: &mut MetricRow,
        r: &Rollouts,
        stats: Option<&super::update::UpdateStats>,
        lr: f64,
        skipped: usize,
        generate_s: f64,
        train_s: f64,
    ) {
        let mean = |v: &[f64]| {
            if v.is_empty() {
                f64::NAN
            } else {
                v.iter().sum::<f64>() / v.len() as f64
            }
        };
        let std = |v: &[f64]| {
            let m = mean(v);
            if v.len() < 2 {
                0.0
            } else {
                (v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (v.len() - 1) as f64).sqrt()
            }
        };
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
        row.push(keys::REWARD_STD, std(&r.all_rewards));
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
        let s = stats.cloned().unwrap_or_default();
        let or_nan = |present: bool, v: f64| if present { v } else { f64::NAN };
        let has = stats.is_some();
        row.push(keys::KL, if has { s.kl } else { f64::NAN });
        row.push(keys::ENTROPY, or_nan(has, s.entropy));
        row.push(keys::CLIP_FRAC_LOW, or_nan(has, s.clip_frac_low));
        row.push(keys::CLIP_FRAC_HIGH, or_nan(has, s.clip_frac_high));
        row.push(keys::CLIP_FRAC_TOTAL, or_nan(has, s.clip_frac));
        row.push(keys::PPO_KL, or_nan(has, s.ppo_kl));
        row.push(keys::LOSS, or_nan(has, s.loss));
        row.push(keys::GRAD_NORM, or_nan(has, s.grad_norm));
        row.push(keys::LR, lr);
        row.push(keys::SKIPPED_STEP, skipped as f64);
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

    /// Greedy held-out accuracy of the current policy.
    ///
    /// # Errors
    /// Generation failures.
    pub fn evaluate(&self) -> Result<EvalResult> {
        let mut r = evaluate_sharded(
            &self.model,
            &self.tokenizer,
            &self.encoder,
            &self.eval_set,
            self.args.max_completion_length,
            self.args.workers,
        )?;
        if self.args.recipe == crate::config::Recipe::Sft {
            r.loss = Some(self.sft_eval_loss()?);
        }
        Ok(r)
    }

    fn resume_point(&self, output_dir: &Path) -> Result<Option<PathBuf>> {
        match &self.args.resume {
            Resume::Never => Ok(None),
            Resume::Auto => latest_checkpoint(output_dir),
            Resume::From(path) => Ok(Some(path.clone())),
        }
    }

    /// Loads weights (or adapters), optimizer moments and trainer state from `checkpoint`.
    fn restore(&mut self, checkpoint: &Path) -> Result<TrainerState> {
        let state = load_trainer_state(checkpoint)?;
        if self.model.lora_config().is_some() {
            self.model.load_lora(checkpoint)?;
        } else {
            let weights = atomrl_model::load_safetensors_dir(
                checkpoint,
                self.model.dtype(),
                self.model.device(),
            )?;
            for (name, var) in self.model.named_vars() {
                let t = weights.get(&name).ok_or_else(|| {
                    Error::file(
                        checkpoint.display(),
                        format!("checkpoint lacks weight `{name}`"),
                    )
                })?;
                var.set(t).ctx("restore")?;
            }
        }
        self.optimizer
            .load(&checkpoint.join(crate::checkpoint::OPTIMIZER_FILE))?;
        Ok(state)
    }
}

/// The reference model: a deep copy of `model`'s base weights in new storage (later updates
/// of the policy do not reach it), with the same master and compute dtypes, so the KL at step
/// 1 is exactly 0 — whether the policy was loaded from disk or built or changed in memory.
/// With LoRA the copy has no adapter: the reference is the base model, what TRL's reference
/// is (the policy with its adapter disabled).
fn frozen_copy(model: &CausalLm) -> Result<CausalLm> {
    let tensors = model
        .named_vars()
        .into_iter()
        .map(|(name, var)| var.as_tensor().copy().map(|t| (name, t)))
        .collect::<candle_core::Result<std::collections::HashMap<_, _>>>()
        .ctx("reference")?;
    let mut reference = CausalLm::from_tensors(
        model.config().clone(),
        tensors,
        model.dtype(),
        model.device(),
    )?;
    reference.set_compute_dtype(model.compute_dtype())?;
    Ok(reference)
}

/// Test hook for the resume tests (feature `test-hooks` only): `ATOMRL_TEST_KILL_AFTER_STEP=N`
/// sends this process a real SIGKILL right after step `N` is logged (and saved, if it is a
/// save step), exactly like an operator's `kill -9`.
#[cfg(feature = "test-hooks")]
fn kill_if_asked(step: u64) {
    let asked = std::env::var("ATOMRL_TEST_KILL_AFTER_STEP")
        .ok()
        .and_then(|s| s.parse::<u64>().ok());
    if asked == Some(step) {
        let _ = std::process::Command::new("kill")
            .args(["-9", &std::process::id().to_string()])
            .status();
        std::thread::sleep(std::time::Duration::from_secs(10));
    }
}

/// Without the `test-hooks` feature the environment is not read.
#[cfg(not(feature = "test-hooks"))]
fn kill_if_asked(_step: u64) {}

/// The sampling seed of generation round `round` of step `step`: derived, not stored, so a
/// resumed run samples exactly what the uninterrupted run would have.
fn sampling_seed(seed: u64, step: u64, round: u64) -> u64 {
    SplitMix64::derive(seed, step.wrapping_mul(1_000_003).wrapping_add(round)).next_u64()
}

fn push_eval(row: &mut MetricRow, r: &EvalResult) {
    row.push(keys::EVAL_ACCURACY, r.accuracy);
    row.push(keys::EVAL_FORMAT_RATE, r.format_rate);
    row.push(keys::EVAL_COMPLETION_LENGTH, r.mean_length);
    if let Some(loss) = r.loss {
        row.push(keys::EVAL_LOSS, loss);
    }
}

/// Training and held-out examples of `args`: `eval_dataset` when given (its `test` split for
/// hub datasets), else `eval_size` examples split off the training data.
///
/// # Errors
/// Data loading failures.
pub fn load_splits(args: &GRPOArgs) -> Result<(Vec<Example>, Vec<Example>)> {
    let train = DataSource::parse(&args.dataset)?.load("train")?;
    match &args.eval_dataset {
        Some(eval) => {
            let mut eval = DataSource::parse(eval)?.load("test")?;
            eval.truncate(if args.eval_size > 0 {
                args.eval_size
            } else {
                eval.len()
            });
            Ok((train, eval))
        }
        None if args.eval_size > 0 => {
            crate::data::train_eval_split(train, args.eval_size, args.seed)
        }
        None => Ok((train, Vec::new())),
    }
}
