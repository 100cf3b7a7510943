//! Running a configured recipe end to end (what `atomrl-train` and the examples call).

use std::rc::Rc;

use atomrl_core::{DeviceSpec, Result};
use atomrl_dist::{Collective, SingleProcess};

use crate::config::{build_rewards, GRPOArgs, Recipe};
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
        Recipe::Sft => crate::Trainer::sft(args, model, tokenizer)?,
        Recipe::Grpo | Recipe::Dapo | Recipe::Ppo | Recipe::A2c | Recipe::Trpo | Recipe::Dpo => {
            let rewards = build_rewards(&args)?;
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
    if !args.device.is_cpu() || (args.threads > 0 && args.workers > 0) {
        return;
    }
    let params = crate::runtime::resolve_model_dir(&args.model)
        .ok()
        .and_then(|dir| atomrl_model::ModelConfig::from_file(dir.join("config.json")).ok())
        .map(|c| c.num_parameters());
    if let Some(params) = params {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let cores = (cores / ranks_here.max(1)).max(1);
        let plan = crate::runtime::cpu_plan_for(params, cores, args.threads, args.workers);
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
    match (&s.eval_before, &s.eval_after) {
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
        println!("   try it:      cargo run --release -p atomrl-cli --bin atomrl-infer -- --checkpoint {} \"What is 3+4?\"", ckpt.display());
    }
}
