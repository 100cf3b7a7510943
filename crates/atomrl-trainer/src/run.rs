//! Running a configured recipe end to end (what `atomrl-train` and the examples call).

use std::rc::Rc;

use atomrl_core::{DeviceSpec, Result};
use atomrl_dist::{Collective, SingleProcess};

use crate::config::{build_rewards_with, GRPOArgs, Recipe};
use crate::rollout::EvalResult;
use crate::runtime::{load_policy, set_threads};
use crate::trainer::{GRPOTrainer, TrainSummary};

/// Loads the model, tokenizer, rewards and data of `args` and trains.
///
/// # Errors
/// Anything the run can fail on: files, devices, data, tensor operations.
pub fn run_recipe(args: GRPOArgs) -> Result<TrainSummary> {
    run_recipe_with(args, Rc::new(SingleProcess))
}

/// [`run_recipe`] as one rank of a data-parallel run over `comm` (see
/// [`crate::Trainer::with_collective`]): the CPU plan shares this node's cores between its
/// ranks ([`atomrl_dist::local_size_from_env`]), and `device = "cuda"` (no index) becomes
/// `cuda:LOCAL_RANK` ([`atomrl_dist::local_rank_from_env`]).
///
/// # Errors
/// As [`run_recipe`], and a failed collective.
pub fn run_recipe_with(args: GRPOArgs, comm: Rc<dyn Collective>) -> Result<TrainSummary> {
    build_trainer(args, comm)?.train()
}

/// The trainer [`run_recipe_with`] runs, before it trains: the CPU plan applied, the policy
/// loaded on its device, the recipe's rewards built, the collective attached. For callers that
/// add to it first (a [`Trainer::with_experience_hook`](crate::Trainer::with_experience_hook),
/// tools of their own).
///
/// # Errors
/// As [`run_recipe_with`], before training.
pub fn build_trainer(mut args: GRPOArgs, comm: Rc<dyn Collective>) -> Result<crate::Trainer> {
    let ranks_here = if comm.world_size() > 1 {
        atomrl_dist::local_size_from_env().unwrap_or(1)
    } else {
        1
    };
    if args.device == DeviceSpec::Cuda(None) && comm.world_size() > 1 {
        args.device = DeviceSpec::Cuda(atomrl_dist::local_rank_from_env());
    }
    plan_cpu(&mut args, ranks_here);
    set_threads(args.threads);
    let device = args.device.open()?;
    let (model, tokenizer) = load_policy(&args, &device)?;
    let trainer = match args.recipe {
        Recipe::Sft | Recipe::Reward => crate::Trainer::sft(args, model, tokenizer)?,
        Recipe::Grpo | Recipe::Dapo | Recipe::Ppo | Recipe::A2c | Recipe::Trpo | Recipe::Dpo => {
            let load = |path: &str| -> Result<Box<dyn atomrl_reward::RewardFn>> {
                let dir = crate::runtime::resolve_model_dir(path)?;
                let rm = crate::rollout::ModelReward::load(dir, tokenizer.clone(), &device)?;
                Ok(Box::new(rm))
            };
            let rewards = build_rewards_with(&args, Some(&load))?;
            GRPOTrainer::new(args, model, tokenizer, rewards)?
        }
    };
    Ok(trainer.with_collective(comm))
}

/// Fills in `threads` and `workers` left at 0 for a CPU run, from the model's size (read from
/// its `config.json`, before any tensor work: candle sizes its thread pools once) and this
/// process's share of the cores (`ranks_here` processes of the run on this node). A model
/// that cannot be read yet is left to [`load_policy`] to report.
fn plan_cpu(args: &mut GRPOArgs, ranks_here: usize) {
    if !args.device.is_cpu() {
        return;
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let cores = (cores / ranks_here.max(1)).max(1);
    let warn = |plan: crate::runtime::CpuPlan| {
        if let Some(w) = plan.oversubscription(cores) {
            eprintln!("warning: {w}");
        }
    };
    if args.threads > 0 && args.workers > 0 {
        return warn(crate::runtime::CpuPlan {
            threads: args.threads,
            workers: args.workers,
        });
    }
    let params = crate::runtime::resolve_model_dir(&args.model)
        .ok()
        .and_then(|dir| atomrl_model::ModelConfig::from_file(dir.join("config.json")).ok())
        .map(|c| c.num_parameters());
    if let Some(params) = params {
        let plan = crate::runtime::cpu_plan_for(params, cores, args.threads, args.workers);
        warn(plan);
        println!(
            "CPU plan: {} worker(s) of {} thread(s) for {:.1} M parameters",
            plan.workers,
            plan.threads,
            params as f64 / 1e6
        );
        args.threads = plan.threads;
        args.workers = plan.workers;
    }
}

/// Prints the end-of-run summary: accuracy before and after, steps, time, where things are.
pub fn print_summary(s: &TrainSummary) {
    println!();
    println!(
        "== AtomRL run finished: {} steps in {:.1} s ({} skipped)",
        s.steps, s.seconds, s.skipped_steps
    );
    if let (Some(b), Some(a)) = (&s.eval_before, &s.eval_after) {
        if let (Some(pb), Some(pa)) = (b.pair_accuracy, a.pair_accuracy) {
            println!(
                "   held-out pair accuracy: {:.1}% -> {:.1}% ({:+.1} points)",
                100.0 * pb,
                100.0 * pa,
                100.0 * (pa - pb)
            );
        }
    }
    let generated = |r: &&EvalResult| r.count > 0;
    match (
        s.eval_before.as_ref().filter(generated),
        s.eval_after.as_ref().filter(generated),
    ) {
        (Some(b), Some(a)) => println!(
            "   held-out greedy accuracy: {:.1}% -> {:.1}% ({:+.1} points, {} examples)",
            100.0 * b.accuracy,
            100.0 * a.accuracy,
            100.0 * (a.accuracy - b.accuracy),
            a.count
        ),
        (None, Some(a)) => println!(
            "   held-out greedy accuracy: {:.1}% ({} examples)",
            100.0 * a.accuracy,
            a.count
        ),
        _ => {}
    }
    println!(
        "   metrics:     {}",
        s.output_dir.join("metrics.jsonl").display()
    );
    println!(
        "   tensorboard: tensorboard --logdir {}",
        s.output_dir.display()
    );
    if !s.charts.is_empty() {
        println!("   charts:      {}", s.output_dir.join("charts").display());
    }
    if let Some(ckpt) = &s.checkpoint {
        println!("   checkpoint:  {}", ckpt.display());
        let reward_model = ckpt.join(crate::reward_model::REWARD_MODEL_DIR);
        if reward_model.is_dir() {
            println!(
                "   use it:      rewards = [{{ name = \"model\", path = {:?} }}]",
                reward_model.display().to_string()
            );
        } else {
            println!("   try it:      cargo run --release -p atomrl-cli --bin atomrl-infer -- --checkpoint {} \"What is 3+4?\"", ckpt.display());
        }
    }
    // The runs folder: this run beside the others, with its curves and rollouts.
    let folder = s
        .output_dir
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    println!(
        "   dashboard:   cargo run --release -p atomrl-dashboard -- {}   (then open http://127.0.0.1:6060/)",
        folder.display()
    );
}

/// Preference pairs from the policy's own samples, for a reward model or offline DPO to train
/// on: the policy, data, rewards and sampling of `args`; for the first `train_prompts` training
/// examples and the first `eval_prompts` held-out ones, `num_generations` completions each,
/// scored by the rewards, up to `pairs_per_prompt` pairs (held out: one) of a best answer
/// preferred to a worst ([`atomrl_rollout::sample_preference_pairs`]). Returns `(train pairs, held-out pairs)`.
///
/// # Errors
/// As [`run_recipe`] before training; generation and reward failures.
pub fn sample_own_pairs(
    mut args: GRPOArgs,
    train_prompts: usize,
    eval_prompts: usize,
    pairs_per_prompt: usize,
) -> Result<(Vec<crate::data::Example>, Vec<crate::data::Example>)> {
    plan_cpu(&mut args, 1);
    set_threads(args.threads);
    let device = args.device.open()?;
    let (model, tokenizer) = load_policy(&args, &device)?;
    let load =
        |source: &crate::data::DataSource, split: &str| crate::runtime::load_split(source, split);
    let (train, eval) = crate::data::load_splits_with(
        &args.dataset,
        args.eval_dataset.as_deref(),
        args.eval_size,
        args.seed,
        &load,
    )?;
    let rewards = crate::config::build_rewards(&args)?;
    let accuracy = crate::config::build_accuracy(&args)?;
    let ctx = crate::rollout::RolloutContext {
        model: &model,
        tokenizer: &tokenizer,
        rewards: &rewards,
        accuracy: &accuracy,
        tools: None,
    };
    let par = crate::parallel::Parallel {
        workers: args.workers.max(1),
        comm: &SingleProcess,
    };
    let encoder = crate::rollout::PromptEncoder {
        chat_template: args.chat_template,
        system_prompt: args.system_prompt.clone(),
        max_prompt_length: args.max_prompt_length,
        tool_schemas: Vec::new(),
    };
    let params = args.sampling(tokenizer.eos_token_ids());
    let sample = |examples: &[crate::data::Example], round: u64, per_prompt: usize| {
        let mut pairs = Vec::new();
        for (i, chunk) in examples.chunks(64).enumerate() {
            let seed = crate::rollout::sampling_seed(args.seed, round, i as u64);
            let p = atomrl_sample::SamplingParams {
                seed,
                ..params.clone()
            };
            let made = crate::rollout::sample_preference_pairs(
                &ctx, par, &p, &encoder, chunk, per_prompt,
            )?;
            pairs.extend(made);
        }
        Ok::<_, atomrl_core::Error>(pairs)
    };
    let train_pairs = sample(
        &train[..train_prompts.min(train.len())],
        0,
        pairs_per_prompt,
    )?;
    // One pair per held-out problem: its accuracy counts problems alike.
    let eval_pairs = sample(&eval[..eval_prompts.min(eval.len())], 1, 1)?;
    Ok((train_pairs, eval_pairs))
}
