//! `GRPOTrainer`: the GRPO / DAPO loop with checkpoints, exact resume, metrics and evaluation.

use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Instant;

use atomrl_core::{Error, Result};
use atomrl_dist::Collective;
use atomrl_model::CausalLm;
use atomrl_reward::{Accuracy, WeightedRewards};
use atomrl_rollout::{evaluate, EvalData, EvalResult, Experience, PromptEncoder};
use atomrl_sample::ChatTokenizer;
use atomrl_tools::ToolSet;
use candle_core::Tensor;

use crate::actor_critic::ActorCriticStep;
use crate::checkpoint::{latest_checkpoint, load_trainer_state, save_checkpoint, TrainerState};
use crate::config::{build_accuracy, GRPOArgs, Recipe, Resume};
use crate::data::{EpochSampler, Example};
use crate::dpo::DpoStep;
use crate::grpo::GrpoStep;
use crate::logging::{keys, MetricRow, MetricsLogger, RunStatus, STATUS_FILE};
use crate::optim::{warmup_steps, LrHorizon, RunSchedule};
use crate::parallel::dist_error;
use crate::recipe::{RecipeStep, RunData};
use crate::reward_model::RewardModelStep;
use crate::sft::SftStep;
use crate::state::TrainState;

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
    /// What the run reads: settings, tokenizer, data, prompt encoding, tools.
    pub(crate) run: RunData,
    /// What the updates change: the policy, its parameters, the optimizer; and the ranks.
    pub(crate) state: TrainState,
    /// The recipe's step (GRPO/DAPO or SFT): the loop calls it, without branching on the
    /// recipe.
    recipe: Box<dyn RecipeStep>,
    /// Which completions count as correct in evaluation (and in the GRPO metrics).
    accuracy: std::sync::Arc<Accuracy>,
    /// Called on every step's experience before its update.
    experience_hook: Option<ExperienceHook>,
    /// The last step's completions, for the sample log.
    last_samples: Vec<atomrl_core::RolloutRecord>,
}

/// A function the loop calls with each step's number and experience, between the making of
/// the experience and the update ([`Trainer::with_experience_hook`]); an error ends the run
/// with it.
pub type ExperienceHook = Box<dyn FnMut(u64, &mut Experience) -> Result<()>>;

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
        let (train_set, eval_set) = crate::data::load_splits_with(
            &args.dataset,
            args.eval_dataset.as_deref(),
            args.eval_size,
            args.seed,
            &crate::runtime::load_split,
        )?;
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
            args.workers = default_workers(&model);
        }
        if model.device().is_cpu() {
            let params = model.config().num_parameters();
            atomrl_core::allocator::arenas_for_workers(params, args.workers);
        }
        model.set_gradient_checkpointing(args.gradient_checkpointing);
        if let Some(budget) = args.attention_scores_budget {
            model.set_attention_scores_budget(budget);
        }
        let accuracy = std::sync::Arc::new(build_accuracy(&args)?);
        let recipe = recipe_step(&args, &model, rewards, accuracy.clone())?;
        let state = TrainState::new(model, args.adamw())?;
        let tools = crate::config::build_tools(&args)?;
        let encoder = PromptEncoder {
            chat_template: args.chat_template,
            system_prompt: args.system_prompt.clone(),
            max_prompt_length: args.max_prompt_length,
            tool_schemas: tools.schemas(),
        };
        let run = RunData {
            args,
            tokenizer,
            train_set,
            eval_set,
            encoder,
            tools,
        };
        Ok(Self {
            run,
            state,
            recipe,
            accuracy,
            experience_hook: None,
            last_samples: Vec::new(),
        })
    }

    /// Trains data-parallel with the other ranks of `comm` (e.g. an
    /// `atomrl_dist::MpiCollective` under `mpirun`; docs/distributed.md): every rank builds
    /// the same trainer and calls [`Trainer::train`]; each generates, scores and
    /// back-propagates its share of every step and evaluation, the gradients are summed over
    /// the ranks, and rank 0 alone writes metrics and checkpoints. `N` ranks of `workers = 1`
    /// compute exactly what one process of `workers = N` does. An error on one rank is not
    /// seen by the others, which wait in their next collective: end the job
    /// ([`Collective::abort`]) when `train` fails.
    ///
    /// ```
    /// use std::rc::Rc;
    /// use atomrl_dist::SingleProcess;
    /// use atomrl_trainer::config::{GRPOArgs, Recipe};
    /// use atomrl_trainer::data::Example;
    /// use atomrl_trainer::Trainer;
    /// let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/reference/models/tiny-qwen2");
    /// let model = atomrl_model::CausalLm::from_hf_dir(dir, candle_core::DType::F32, &candle_core::Device::Cpu)?;
    /// let tok = atomrl_sample::ChatTokenizer::from_hf_dir(dir)?;
    /// let train = vec![Example::new("What is 3+4?".to_string(), "7")];
    /// let args = GRPOArgs::preset(Recipe::Grpo);
    /// let trainer = Trainer::with_data(args, model, tok, atomrl_reward::WeightedRewards::new(), train, vec![])?
    ///     .with_collective(Rc::new(SingleProcess));
    /// assert_eq!(trainer.world_size(), 1);
    /// # Ok::<(), atomrl_core::Error>(())
    /// ```
    pub fn with_collective(mut self, comm: Rc<dyn Collective>) -> Self {
        self.state.comm = comm;
        self
    }

    /// The number of data-parallel processes (ranks) of the run.
    ///
    /// See [`Trainer::with_collective`] for an example.
    pub fn world_size(&self) -> usize {
        self.state.comm.world_size()
    }

    /// Calls `hook` with every step's number and experience, after the experience is made
    /// and before the update: to inspect or log what the update trains on, to change it, or to
    /// stop the run (its error ends [`Trainer::train`] on this rank). The tests inject their
    /// faults this way: a poisoned step for the NaN guard, a killed process for resume, a
    /// failing rank for the data-parallel abort.
    ///
    /// ```
    /// use atomrl_trainer::config::{GRPOArgs, Recipe};
    /// use atomrl_trainer::data::Example;
    /// use atomrl_trainer::Trainer;
    /// let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/reference/models/tiny-qwen2");
    /// let model = atomrl_model::CausalLm::from_hf_dir(dir, candle_core::DType::F32, &candle_core::Device::Cpu)?;
    /// let tok = atomrl_sample::ChatTokenizer::from_hf_dir(dir)?;
    /// let train = vec![Example::new("What is 3+4?".to_string(), "7")];
    /// let rewards = atomrl_reward::WeightedRewards::new();
    /// let trainer = Trainer::with_data(GRPOArgs::preset(Recipe::Grpo), model, tok, rewards, train, vec![])?
    ///     .with_experience_hook(Box::new(|step, exp| {
    ///         eprintln!("step {step}: {} rows", exp.num_rows());
    ///         Ok(())
    ///     }));
    /// # let _ = trainer;
    /// # Ok::<(), atomrl_core::Error>(())
    /// ```
    pub fn with_experience_hook(mut self, hook: ExperienceHook) -> Self {
        self.experience_hook = Some(hook);
        self
    }

    /// The policy model.
    pub fn model(&self) -> &CausalLm {
        &self.state.model
    }

    /// Total optimizer steps of the run (`max_steps`, or `epochs` over the training set).
    pub fn total_steps(&self) -> usize {
        if self.run.args.max_steps > 0 {
            self.run.args.max_steps
        } else {
            (self.run.args.epochs * self.run.train_set.len())
                .div_ceil(self.run.args.batch_size)
                .max(1)
        }
    }

    /// Runs the training loop (resuming from the latest checkpoint when `resume` says so).
    /// The run's `status.json` says `failed`, with the error, when it fails.
    ///
    /// # Errors
    /// I/O, generation or tensor failures. A non-finite loss or gradient is not an error: the
    /// step is skipped, logged (`skipped_step = 1`) and counted.
    pub fn train(&mut self) -> Result<TrainSummary> {
        let result = self.train_loop();
        let dir = Path::new(&self.run.args.output_dir);
        if let Err(e) = &result {
            if self.state.comm.rank() == 0 && dir.join(STATUS_FILE).exists() {
                let _ = RunStatus::end(dir, Err(&e.to_string()));
            }
        }
        result
    }

    /// [`Trainer::train`]'s loop.
    fn train_loop(&mut self) -> Result<TrainSummary> {
        let started = Instant::now();
        let output_dir = PathBuf::from(&self.run.args.output_dir);
        let lead = self.state.comm.rank() == 0;
        let profiling = crate::runtime::profile_from_env();
        let total = self.total_steps();
        let (mut state, mut sampler, mut logger, eval_before) =
            self.open_run(&output_dir, total)?;
        let schedule = self.schedule(total, state.step as usize, &started);
        let mut last_checkpoint = None;
        let mut eval_after = None;
        while (state.step as usize) < total {
            let step = state.step + 1;
            // Rank 0's clock decides the time-budget schedule and stop for every rank.
            let lr = self.agree(schedule.lr_at(state.step as usize))?;
            let mut row = self.recipe_step(step, lr, &mut sampler, &logger)?;
            state.step = step;
            state.sampler = sampler.state();
            state.skipped_steps += row.get(keys::SKIPPED_STEP).unwrap_or(0.0) as u64;
            let out_of_time = self.out_of_time(&started, step, total, &logger);
            let last =
                step as usize == total || self.agree(f64::from(u8::from(out_of_time)))? > 0.0;
            if !self.run.eval_set.is_empty() && (last || every(self.run.args.eval_steps, step)) {
                let r = self.evaluate()?;
                push_eval(&mut row, &r);
                state.eval_accuracy = Some(r.accuracy);
                if last {
                    eval_after = Some(r);
                }
            }
            logger.log(&row)?;
            if every(self.run.args.logging_steps, step) {
                logger.log_samples(step, &self.last_samples)?;
            }
            if lead && (last || every(self.run.args.save_steps, step)) {
                let recipe = &self.recipe;
                last_checkpoint = Some(save_checkpoint(
                    &output_dir,
                    &self.state.model,
                    &self.state.optimizer,
                    &state,
                    self.run.args.save_total_limit,
                    &|dir| recipe.save(dir),
                )?);
            }
            if last {
                break;
            }
        }
        if profiling && lead {
            logger.println(crate::runtime::write_profile(&output_dir)?);
        }
        logger.flush()?;
        let charts = logger.finish()?;
        self.state
            .comm
            .barrier()
            .map_err(|e| dist_error("Trainer", e))?;
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

    /// The start of a run: its state (fresh or resumed), the same weights on every rank, the
    /// logger, and the opening evaluation of a fresh run.
    fn open_run(
        &mut self,
        output_dir: &Path,
        total: usize,
    ) -> Result<(
        TrainerState,
        EpochSampler,
        MetricsLogger,
        Option<EvalResult>,
    )> {
        self.recipe.check_data(&self.run)?;
        let (state, sampler) = self.start_state(output_dir)?;
        self.broadcast_weights()?;
        let resumed = state.step > 0;
        let mut logger = self.open_logger(output_dir, resumed.then_some(state.step), total)?;
        if resumed {
            logger.println(format!(
                "resumed from step {} in {}",
                state.step,
                output_dir.display()
            ));
        }
        let eval_before = if !resumed && !self.run.eval_set.is_empty() {
            Some(self.opening_eval(&mut logger)?)
        } else {
            None
        };
        Ok((state, sampler, logger, eval_before))
    }

    /// The run's logger: rank 0's writes `output_dir` (created here), the other ranks' write
    /// nothing.
    fn open_logger(
        &self,
        output_dir: &Path,
        resumed_at: Option<u64>,
        total: usize,
    ) -> Result<MetricsLogger> {
        if self.state.comm.rank() != 0 {
            return Ok(MetricsLogger::disabled(output_dir));
        }
        std::fs::create_dir_all(output_dir).map_err(|e| Error::file(output_dir.display(), e))?;
        // The configuration as resolved (preset, file, overrides): what `atomrl-compare`
        // diffs, and a file that reruns the run.
        let path = output_dir.join("config.toml");
        let text = toml::to_string(&self.run.args).map_err(|e| Error::file(path.display(), e))?;
        std::fs::write(&path, text).map_err(|e| Error::file(path.display(), e))?;
        MetricsLogger::create(output_dir, resumed_at, total as u64, self.run.args.progress)
    }

    /// The state the run starts from: fresh, or restored from the checkpoint `resume` names.
    fn start_state(&mut self, output_dir: &Path) -> Result<(TrainerState, EpochSampler)> {
        if let Some(ckpt) = self.agreed_resume_point(output_dir)? {
            let state = self.restore(&ckpt)?;
            let world = self.state.comm.world_size();
            if state.world_size != world {
                return Err(Error::value(
                    "Trainer",
                    "resume",
                    format!(
                        "{} data-parallel process(es), as {} was written by",
                        state.world_size,
                        ckpt.display()
                    ),
                    format!("{world} process(es)"),
                ));
            }
            let sampler = EpochSampler::from_state(
                self.run.train_set.len(),
                self.run.args.seed,
                &state.sampler,
            )?;
            return Ok((state, sampler));
        }
        let sampler = EpochSampler::new(self.run.train_set.len(), self.run.args.seed);
        let state = TrainerState {
            step: 0,
            sampler: sampler.state(),
            skipped_steps: 0,
            seed: self.run.args.seed,
            eval_accuracy: None,
            recipe: self.run.args.recipe,
            world_size: self.state.comm.world_size(),
        };
        Ok((state, sampler))
    }

    /// The learning-rate schedule of this invocation, from step `start_step` of `total`. Its
    /// steps share the time budget the opening evaluation left.
    fn schedule(&self, total: usize, start_step: usize, run_started: &Instant) -> RunSchedule {
        let a = &self.run.args;
        let left = a.time_budget_s - run_started.elapsed().as_secs_f64();
        RunSchedule {
            schedule: a.lr_scheduler,
            peak_lr: a.lr,
            min_lr_ratio: a.min_lr_ratio,
            warmup: warmup_steps(a.warmup_steps, a.warmup_ratio, total),
            total,
            start_step,
            budget_s: if a.time_budget_s > 0.0 {
                left.max(1e-3)
            } else {
                0.0
            },
            on_budget: a.lr_schedule_on_budget,
            horizon: LrHorizon::new(a.lr_horizon_steps, a.lr_horizon_exponent),
            started: Instant::now(),
        }
    }

    /// The held-out evaluation before the first step, logged as step 0.
    fn opening_eval(&self, logger: &mut MetricsLogger) -> Result<EvalResult> {
        let r = self.evaluate()?;
        let mut row = MetricRow::new(0);
        push_eval(&mut row, &r);
        logger.log(&row)?;
        let (acc, n) = (100.0 * r.accuracy, r.count);
        logger.println(match n {
            0 => "step 0: no held-out examples to measure".to_string(),
            _ => format!("step 0: held-out greedy accuracy {acc:.1}% ({n} examples)"),
        });
        Ok(r)
    }

    /// The recipe's step `step`: its experience (shown to the hook), its update; its warnings
    /// go through the logger (above the bar).
    fn recipe_step(
        &mut self,
        step: u64,
        lr: f64,
        sampler: &mut EpochSampler,
        logger: &MetricsLogger,
    ) -> Result<MetricRow> {
        let mut made = self
            .recipe
            .experience(&self.run, &self.state, step, sampler)?;
        if let Some(hook) = &mut self.experience_hook {
            hook(step, &mut made.experience)?;
        }
        let report = self
            .recipe
            .update(&self.run, &mut self.state, &made, step, lr)?;
        for w in report.warnings {
            logger.warn(format!("warning: {w}"));
        }
        self.last_samples = report.records;
        Ok(report.row)
    }

    /// Whether the time budget is spent after `step` (said on the progress output when steps
    /// remain).
    fn out_of_time(
        &self,
        started: &Instant,
        step: u64,
        total: usize,
        logger: &MetricsLogger,
    ) -> bool {
        let budget = self.run.args.time_budget_s;
        let out = budget > 0.0 && started.elapsed().as_secs_f64() >= budget;
        if out && (step as usize) < total {
            logger.println(format!(
                "time budget of {budget} s reached after step {step}"
            ));
        }
        out
    }

    /// Replaces the run's tools (those `args.tools` named) with `tools`, e.g. a
    /// [`ToolSet`] with tools of your own: rollouts and evaluation let the model call them,
    /// and their schemas go to the chat template.
    ///
    /// ```
    /// use atomrl_tools::{Calculator, ToolSet};
    /// use atomrl_trainer::config::{GRPOArgs, Recipe};
    /// use atomrl_trainer::data::Example;
    /// use atomrl_trainer::Trainer;
    /// let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/reference/models/tiny-qwen2");
    /// let model = atomrl_model::CausalLm::from_hf_dir(dir, candle_core::DType::F32, &candle_core::Device::Cpu)?;
    /// let tok = atomrl_sample::ChatTokenizer::from_hf_dir(dir)?;
    /// let mut args = GRPOArgs::preset(Recipe::Grpo);
    /// args.max_tool_turns = 2;
    /// let train = vec![Example::new("What is 3+4?".to_string(), "7")];
    /// let trainer = Trainer::with_data(args, model, tok, atomrl_reward::WeightedRewards::new(), train, vec![])?
    ///     .with_tools(ToolSet::new().with(Calculator));
    /// assert_eq!(trainer.tools().names(), ["calculator"]);
    /// # Ok::<(), atomrl_core::Error>(())
    /// ```
    pub fn with_tools(mut self, tools: ToolSet) -> Self {
        self.run.encoder.tool_schemas = tools.schemas();
        self.run.tools = tools;
        self
    }

    /// The tools the model may call (empty for single-turn runs).
    ///
    /// See [`Trainer::with_tools`] for an example.
    pub fn tools(&self) -> &ToolSet {
        &self.run.tools
    }

    /// Greedy held-out accuracy of the current policy.
    ///
    /// # Errors
    /// Generation failures.
    pub fn evaluate(&self) -> Result<EvalResult> {
        let run = &self.run;
        let data = EvalData {
            model: &self.state.model,
            tokenizer: &run.tokenizer,
            encoder: &run.encoder,
            examples: &run.eval_set,
            max_new_tokens: run.args.max_completion_length,
            tools: run.tool_use(),
            accuracy: &self.accuracy,
        };
        let held = self.recipe.held_out(run, &self.state)?;
        let mut r = if held.generation {
            evaluate(&data, run.args.workers, self.state.comm.as_ref())?
        } else {
            EvalResult::without_generation()
        };
        r.loss = held.loss;
        r.pair_accuracy = held.pair_accuracy;
        r.score_std = held.score_std;
        Ok(r)
    }

    /// Rank 0's [`resume_point`](Self::resume_point), on every rank: all ranks must load the
    /// same checkpoint (from a folder every rank can read).
    fn agreed_resume_point(&self, output_dir: &Path) -> Result<Option<PathBuf>> {
        let point = if self.state.comm.rank() == 0 {
            self.resume_point(output_dir)?
        } else {
            None
        };
        if self.state.comm.world_size() == 1 {
            return Ok(point);
        }
        let mut bytes =
            point.map_or_else(Vec::new, |p| p.to_string_lossy().into_owned().into_bytes());
        self.state
            .comm
            .broadcast_bytes(&mut bytes, 0)
            .map_err(|e| dist_error("Trainer", e))?;
        Ok(
            (!bytes.is_empty())
                .then(|| PathBuf::from(String::from_utf8_lossy(&bytes).into_owned())),
        )
    }

    /// Copies rank 0's trainable weights to every rank (they load the same files, so this
    /// only guards against a rank that read different ones).
    fn broadcast_weights(&self) -> Result<()> {
        if self.state.comm.world_size() == 1 {
            return Ok(());
        }
        for (name, var) in &self.state.params {
            let t = var.as_tensor();
            let mut values: Vec<f32> = t
                .flatten_all()
                .and_then(|x| x.to_vec1())
                .map_err(|e| Error::value("Trainer", name, "f32 weights", e))?;
            self.state
                .comm
                .broadcast_f32(&mut values, 0)
                .map_err(|e| dist_error("Trainer", e))?;
            let back = Tensor::from_slice(&values, t.dims(), t.device());
            back.and_then(|b| var.set(&b))
                .map_err(|e| Error::value("Trainer", name, "f32 weights", e))?;
        }
        Ok(())
    }

    /// Rank 0's `value`, on every rank.
    fn agree(&self, value: f64) -> Result<f64> {
        if self.state.comm.world_size() == 1 {
            return Ok(value);
        }
        let all = self
            .state
            .comm
            .all_gather_f64(&[value])
            .map_err(|e| dist_error("Trainer", e))?;
        Ok(all
            .first()
            .and_then(|v| v.first())
            .copied()
            .unwrap_or(value))
    }

    fn resume_point(&self, output_dir: &Path) -> Result<Option<PathBuf>> {
        match &self.run.args.resume {
            Resume::Never => Ok(None),
            Resume::Auto => latest_checkpoint(output_dir),
            Resume::From(path) => Ok(Some(path.clone())),
        }
    }

    /// Loads weights (or adapters), optimizer moments and trainer state from `checkpoint`.
    fn restore(&mut self, checkpoint: &Path) -> Result<TrainerState> {
        let state = load_trainer_state(checkpoint)?;
        let model = &mut self.state.model;
        if model.lora_config().is_some() {
            model.restore_lora(checkpoint)?;
        } else {
            model.load_weights(checkpoint)?;
        }
        self.state
            .optimizer
            .load(&checkpoint.join(crate::checkpoint::OPTIMIZER_FILE))?;
        self.recipe.load(checkpoint)?;
        Ok(state)
    }
}

/// The data-parallel workers of a run that left `workers` at 0: on the CPU, the cores the
/// compute threads leave (see [`crate::runtime::cpu_plan`]; the thread pools exist by now);
/// one on a GPU.
fn default_workers(model: &CausalLm) -> usize {
    if model.device().is_cpu() {
        let threads = candle_core::utils::get_num_threads();
        crate::runtime::cpu_plan(model.config().num_parameters(), threads, 0).workers
    } else {
        1
    }
}

/// The step of `args.recipe`, with what it holds: GRPO and DAPO the reward functions and, for
/// β > 0, a frozen copy of the given policy's base weights as the reference model (with LoRA,
/// the base model is TRL's reference too); β = 0 holds no reference model at all.
fn recipe_step(
    args: &GRPOArgs,
    model: &CausalLm,
    rewards: WeightedRewards,
    accuracy: std::sync::Arc<Accuracy>,
) -> Result<Box<dyn RecipeStep>> {
    Ok(match args.recipe {
        Recipe::Sft => Box::new(SftStep::new(args)),
        Recipe::Grpo | Recipe::Dapo => Box::new(GrpoStep::new(args, model, rewards, accuracy)?),
        Recipe::Ppo | Recipe::A2c | Recipe::Trpo => {
            Box::new(ActorCriticStep::new(args, model, rewards, accuracy)?)
        }
        Recipe::Dpo => Box::new(DpoStep::new(args, model, rewards, accuracy)?),
        Recipe::Reward => Box::new(RewardModelStep::new(args, model)?),
    })
}

/// Whether `step` is one of every `n`th (never when `n` is 0).
fn every(n: usize, step: u64) -> bool {
    n > 0 && step as usize % n == 0
}

fn push_eval(row: &mut MetricRow, r: &EvalResult) {
    row.push(keys::EVAL_ACCURACY, r.accuracy);
    row.push(keys::EVAL_FORMAT_RATE, r.format_rate);
    row.push(keys::EVAL_COMPLETION_LENGTH, r.mean_length);
    if let Some(loss) = r.loss {
        row.push(keys::EVAL_LOSS, loss);
    }
    if let Some(accuracy) = r.pair_accuracy {
        row.push(keys::EVAL_PAIR_ACCURACY, accuracy);
    }
    if let Some(spread) = r.score_std {
        row.push(keys::EVAL_SCORE_STD, spread);
    }
    if let Some(calls) = r.tool_calls {
        row.push(keys::EVAL_TOOLS_CALLS_PER_COMPLETION, calls);
    }
    if let Some(rate) = r.tool_error_rate {
        row.push(keys::EVAL_TOOLS_ERROR_RATE, rate);
    }
}
