//! RLHF on GSM8K-style maths: a reward model learned from the policy's own answers, then RL
//! against that reward model alone.
//!
//! 1. **Pairs**: the policy samples `--generations` answers to each of `--pair-prompts`
//!    training problems; where some are right and some wrong (the rule checker), a right one is
//!    preferred to a wrong one. The same on held-out problems gives held-out pairs.
//! 2. **Reward model** (`--recipe reward`): the policy's transformer with a scalar head,
//!    trained on the pairs by the Bradley-Terry loss; its held-out pair accuracy is printed.
//! 3. **RL** (`--rl-recipe grpo` or `ppo`): the policy trained against the reward model's
//!    scores alone, no rule reward, weighted so that they spread as much on the held-out pairs
//!    whatever the reward model; the held-out accuracy, measured by the rule checker, is
//!    printed before and after.
//!
//! With no arguments it runs on the small model shipped in `examples/grpo_gsm8k/model/` and
//! synthetic word problems, offline, on two CPU cores. See docs/reward-models.md.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, Result};
use atomrl_examples::{main_with, MathsData, RunOptions};
use atomrl_trainer::config::{load_args, Recipe};
use atomrl_trainer::data::write_jsonl;
use atomrl_trainer::run::{print_summary, run_recipe, sample_own_pairs};
use clap::{Parser, ValueEnum};

/// The folder of the embedded model (built by `cargo xtask tiny-model`).
const EMBEDDED_MODEL: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/grpo_gsm8k/model");

#[derive(Clone, Copy, ValueEnum)]
enum RlRecipe {
    Grpo,
    Ppo,
}

/// Train a reward model on the policy's own right and wrong answers, then the policy against
/// it (RLHF), on grade-school maths.
#[derive(Parser)]
#[command(
    name = "rlhf_gsm8k",
    after_help = "Examples:\n  cargo run --release --example rlhf_gsm8k\n  cargo run --release --example rlhf_gsm8k -- --rl-recipe ppo\n  cargo run --release --example rlhf_gsm8k -- --pair-prompts 6000 --pairs-per-prompt 1 \\\n      --reward-batch-size 16 --reward-lr 1e-4 --reward-steps 600"
)]
struct Cli {
    #[command(flatten)]
    data: MathsData,
    /// Training problems whose sampled answers make the reward model's pairs.
    #[arg(long, default_value_t = 12000)]
    pair_prompts: usize,
    /// Held-out problems whose sampled answers make the held-out pairs.
    #[arg(long, default_value_t = 500)]
    eval_pair_prompts: usize,
    /// Answers sampled per problem.
    #[arg(long, default_value_t = 8)]
    generations: usize,
    /// Training pairs per problem at most (a right answer against a wrong one; every pair of
    /// the two sides is a pair). Held-out problems give one each.
    #[arg(long, default_value_t = 8)]
    pairs_per_prompt: usize,
    /// The reward model's transformer: the policy's first this many decoder layers (with its
    /// embeddings and final norm) under a scalar head.
    #[arg(long, default_value_t = 1)]
    reward_layers: usize,
    /// Optimizer steps of the reward model.
    #[arg(long, default_value_t = 1400)]
    reward_steps: usize,
    /// Pairs per optimizer step of the reward model.
    #[arg(long, default_value_t = 64)]
    reward_batch_size: usize,
    /// The reward model's learning rate.
    #[arg(long, default_value_t = 6e-4)]
    reward_lr: f64,
    /// Weight of the reward model's score in stage 3 (default: `TARGET_SCORE_STD` over the
    /// reward model's held-out score spread). A reward model whose scores spread wider gives
    /// larger advantages, which the policy games faster.
    #[arg(long)]
    reward_weight: Option<f64>,
    /// The RL recipe of stage 3.
    #[arg(long, value_enum, default_value = "grpo")]
    rl_recipe: RlRecipe,
    /// Where the pairs, the reward model and the RL run go (each in its own folder).
    #[arg(long, default_value = "runs/rlhf_gsm8k")]
    output_dir: PathBuf,
    #[command(flatten)]
    run: RunOptions,
}

fn main() -> ExitCode {
    main_with(|| run(Cli::parse()))
}

/// The spread of the learned reward stage 3 trains against (the standard deviation of the
/// weighted scores over the held-out pairs' answers): a reward model's score is weighted by
/// this over its own held-out spread. docs/reward-models.md: unscaled, a reward model whose
/// scores spread 2.8x wider lost 4.4 points where scaled to this spread it gained 9.2.
const TARGET_SCORE_STD: f64 = 0.72;

/// The settings the three stages share: the GRPO example's sampling of the embedded model.
fn shared(embedded: bool) -> Vec<String> {
    let s: &[&str] = if embedded {
        &[
            "max_completion_length=48",
            "max_prompt_length=128",
            "temperature=1.0",
        ]
    } else {
        &[
            "max_completion_length=512",
            "max_prompt_length=256",
            "temperature=1.0",
        ]
    };
    s.iter().map(|x| x.to_string()).collect()
}

/// Stage 1: the policy's own pairs, written as JSON Lines; their paths.
fn make_pairs(cli: &Cli, base: &[String], dir: &Path) -> Result<(PathBuf, PathBuf)> {
    let mut o = base.to_vec();
    o.extend([
        format!("num_generations={}", cli.generations),
        "rewards=[{name=\"correctness\"}]".to_string(),
        format!("eval_size={}", cli.eval_pair_prompts),
    ]);
    let args = load_args(None, Some(Recipe::Grpo), &o)?;
    let (train, eval) = sample_own_pairs(
        args,
        cli.pair_prompts,
        cli.eval_pair_prompts,
        cli.pairs_per_prompt,
    )?;
    std::fs::create_dir_all(dir).with_context(|| dir.display().to_string())?;
    let (tp, ep) = (dir.join("train.jsonl"), dir.join("eval.jsonl"));
    write_jsonl(&tp, &train)?;
    write_jsonl(&ep, &eval)?;
    println!(
        "stage 1: {} training pairs from {} problems, {} held-out pairs from {} ({} answers each, right preferred to wrong) -> {}",
        train.len(),
        cli.pair_prompts,
        eval.len(),
        cli.eval_pair_prompts,
        cli.generations,
        dir.display()
    );
    Ok((tp, ep))
}

/// A trained reward model: its folder and its held-out score spread.
struct RewardModel {
    dir: PathBuf,
    score_std: f64,
}

/// Stage 2: the reward model on the pairs.
fn train_reward_model(
    cli: &Cli,
    base: &[String],
    pairs: &(PathBuf, PathBuf),
) -> Result<RewardModel> {
    let out = cli.output_dir.join("reward_model");
    let eval_pairs = std::fs::read_to_string(&pairs.1)?.lines().count();
    let mut o = base.to_vec();
    o.extend([
        format!("dataset={:?}", pairs.0.display().to_string()),
        format!("eval_dataset={:?}", pairs.1.display().to_string()),
        format!("eval_size={eval_pairs}"),
        format!("output_dir={:?}", out.display().to_string()),
        format!("batch_size={}", cli.reward_batch_size),
        format!("lr={:e}", cli.reward_lr),
        "lr_scheduler=\"linear\"".into(),
        format!("max_steps={}", cli.reward_steps),
        format!("eval_steps={}", (cli.reward_steps / 4).max(1)),
        format!("save_steps={}", cli.reward_steps),
        "logging_steps=50".into(),
        format!("reward_model.num_layers={}", cli.reward_layers),
    ]);
    o.extend(
        cli.run
            .set
            .iter()
            .filter(|s| s.starts_with("reward_model."))
            .cloned(),
    );
    let args = load_args(None, Some(Recipe::Reward), &o)?;
    let summary = run_recipe(args)?;
    print_summary(&summary);
    let accuracy = |r: &Option<atomrl_trainer::rollout::EvalResult>| {
        r.as_ref().and_then(|r| r.pair_accuracy).unwrap_or(f64::NAN)
    };
    let score_std = summary
        .eval_after
        .as_ref()
        .and_then(|r| r.score_std)
        .unwrap_or(f64::NAN);
    println!(
        "stage 2: reward model held-out pair accuracy {:.1}% -> {:.1}% ({eval_pairs} pairs), score spread {score_std:.3}",
        100.0 * accuracy(&summary.eval_before),
        100.0 * accuracy(&summary.eval_after)
    );
    let ckpt = summary
        .checkpoint
        .context("the reward model run saved no checkpoint")?;
    Ok(RewardModel {
        dir: ckpt.join("reward_model"),
        score_std,
    })
}

/// The weight of the reward model's score in stage 3: `--reward-weight`, or the one that
/// gives its held-out scores [`TARGET_SCORE_STD`].
fn reward_weight(cli: &Cli, rm: &RewardModel) -> Result<f64> {
    if let Some(w) = cli.reward_weight {
        return Ok(w);
    }
    if !(rm.score_std.is_finite() && rm.score_std > 0.0) {
        anyhow::bail!(
            "the reward model's held-out scores do not spread (standard deviation {}): pass --reward-weight",
            rm.score_std
        );
    }
    let w = TARGET_SCORE_STD / rm.score_std;
    println!(
        "stage 3: reward-model score weight {w:.3} (target spread {TARGET_SCORE_STD} / held-out spread {:.3})",
        rm.score_std
    );
    Ok(w)
}

/// Stage 3: RL against the reward model alone, with the GRPO example's settings plus a KL to
/// the starting policy (β = 0.1) and Dr. GRPO's advantages.
fn rl(cli: &Cli, base: &[String], data: &[String], reward_model: &RewardModel) -> Result<()> {
    let recipe = match cli.rl_recipe {
        RlRecipe::Grpo => Recipe::Grpo,
        RlRecipe::Ppo => Recipe::Ppo,
    };
    let mut o = base.to_vec();
    o.extend(data.iter().cloned());
    o.extend(
        [
            "eval_size=500",
            "batch_size=8",
            "num_generations=8",
            "lr=2e-4",
            "lr_scheduler=\"linear\"",
            // A KL to the starting policy and unscaled group advantages (Dr. GRPO): the
            // reward model is right two times in three, and GRPO's division by the group's
            // standard deviation turns its small in-group differences into full-size
            // advantages the policy games (β = 0 with it: 14.4% -> 4.6%).
            "beta=0.1",
            "advantage_mode=\"grpo_no_std\"",
            "loss_agg=\"token_mean\"",
            // A shorter budget than the GRPO example's, so that the build and the three stages
            // fit in ten minutes (against the one-layer reward model: +13.6 to +17.2 points in
            // 80 s; docs/reward-models.md).
            "max_steps=1200",
            "time_budget_s=80",
            "lr_schedule_on_budget=true",
            "save_steps=200",
            "logging_steps=10",
            "critic.lr=1e-4",
            "critic.lam=1.0",
        ]
        .map(String::from),
    );
    o.push(format!(
        "rewards=[{{name=\"model\", path={:?}, weight={:e}}}]",
        reward_model.dir.display().to_string(),
        reward_weight(cli, reward_model)?
    ));
    o.extend(cli.run.overrides(&cli.output_dir.join(recipe.name())));
    if matches!(cli.rl_recipe, RlRecipe::Grpo) {
        o.retain(|s| !s.starts_with("critic."));
    }
    let args = load_args(cli.run.config.as_deref(), Some(recipe), &o)?;
    let summary = run_recipe(args)?;
    print_summary(&summary);
    if let (Some(b), Some(a)) = (&summary.eval_before, &summary.eval_after) {
        println!(
            "stage 3: {} against the reward model alone: held-out accuracy (rule checker) {:.1}% -> {:.1}% ({:+.1} points)",
            recipe.name().to_uppercase(),
            100.0 * b.accuracy,
            100.0 * a.accuracy,
            100.0 * (a.accuracy - b.accuracy)
        );
    }
    Ok(())
}

fn run(cli: Cli) -> Result<()> {
    let (choice, data) = cli.data.choose(EMBEDDED_MODEL)?;
    let mut base = shared(choice.embedded);
    base.push(format!("model={:?}", choice.model));
    base.push(format!("device={:?}", cli.run.device));
    base.push("progress=false".into());
    let mut pair_data = base.clone();
    pair_data.extend(data.iter().cloned());
    let started = Instant::now();
    let pairs = make_pairs(&cli, &pair_data, &cli.output_dir.join("pairs"))?;
    let paired = started.elapsed().as_secs_f64();
    let reward_model = train_reward_model(&cli, &base, &pairs)?;
    let trained = started.elapsed().as_secs_f64();
    rl(&cli, &base, &data, &reward_model)?;
    let total = started.elapsed().as_secs_f64();
    println!(
        "stage times: pairs {paired:.0} s, reward model {:.0} s, RL {:.0} s ({total:.0} s in all)",
        trained - paired,
        total - trained
    );
    Ok(())
}
