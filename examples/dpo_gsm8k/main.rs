//! Online DPO on GSM8K-style maths: each prompt's sampled completions are graded by the rule
//! rewards, and the best one is preferred to the worst.
//!
//! With no arguments it trains the small model shipped in `examples/grpo_gsm8k/model/` on
//! synthetic grade-school word problems, offline, on two CPU cores in under ten minutes with
//! the compile, and shows held-out accuracy before and after. With `--model` / `--dataset` /
//! `--device` it runs the real recipe (e.g. Qwen2.5-0.5B-Instruct on openai/gsm8k on a GPU).
//! See docs/dpo.md.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use atomrl_examples::{main_with, MathsData, RunOptions};
use atomrl_trainer::config::{load_args, Recipe};
use atomrl_trainer::run::{print_summary, run_recipe};
use clap::Parser;

/// The folder of the embedded model (built by `cargo xtask tiny-model`).
const EMBEDDED_MODEL: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/grpo_gsm8k/model");

/// Train a model to solve grade-school maths with online DPO (best against worst of each
/// prompt's sampled completions).
///
/// Without arguments: the embedded ~1M-parameter model on synthetic word problems, offline.
#[derive(Parser)]
#[command(
    name = "dpo_gsm8k",
    after_help = "Examples:\n  cargo run --release --example dpo_gsm8k\n  cargo run --release --example dpo_gsm8k -- --set dpo.loss_type=\\\"ipo\\\"\n  cargo run --release --features cuda --example dpo_gsm8k -- --model Qwen/Qwen2.5-0.5B-Instruct --dataset openai/gsm8k --device cuda"
)]
struct Cli {
    #[command(flatten)]
    data: MathsData,
    /// Where checkpoints, metrics, TensorBoard events and charts go.
    #[arg(long, default_value = "runs/dpo_gsm8k")]
    output_dir: PathBuf,
    #[command(flatten)]
    run: RunOptions,
}

fn main() -> ExitCode {
    main_with(|| run(Cli::parse()))
}

/// Settings of the embedded run, the GRPO example's where they apply (8 prompts x 8
/// completions per step, two data-parallel workers on a 2-core machine) with a 180 s training
/// budget that the linear decay follows, so that a clean clone builds and runs it in under
/// ten minutes on two cores. Measured figures: docs/dpo.md.
fn embedded_defaults() -> Vec<String> {
    [
        "eval_size=500",
        "batch_size=8",
        "num_generations=8",
        "max_completion_length=48",
        "max_prompt_length=128",
        "temperature=1.0",
        "lr=2e-4",
        "lr_scheduler=\"linear\"",
        "max_grad_norm=1.0",
        "dpo.beta=0.1",
        "max_steps=100000",
        "time_budget_s=180",
        "lr_schedule_on_budget=true",
        "eval_steps=0",
        "save_steps=50",
        "logging_steps=10",
        "rewards=[{name=\"correctness\", weight=1.0}, {name=\"hard_format\", weight=0.1}]",
    ]
    .map(String::from)
    .to_vec()
}

/// Settings of the real recipe (online DPO for a 0.5B instruct model: TRL's DPO learning rate
/// and β, 8 completions per prompt).
fn real_defaults() -> Vec<String> {
    [
        "eval_size=1319",
        "batch_size=16",
        "num_generations=8",
        "max_completion_length=512",
        "max_prompt_length=256",
        "temperature=1.0",
        "lr=1e-6",
        "dpo.beta=0.1",
        "max_grad_norm=1.0",
        "max_steps=500",
        "save_steps=50",
        "eval_steps=50",
        "logging_steps=10",
        "lr_scheduler=\"cosine\"",
        "warmup_ratio=0.03",
        "rewards=[{name=\"correctness\", weight=1.0}, {name=\"hard_format\", weight=0.1}]",
    ]
    .map(String::from)
    .to_vec()
}

fn run(cli: Cli) -> Result<()> {
    let (choice, data) = cli.data.choose(EMBEDDED_MODEL)?;
    let embedded = choice.embedded;
    let mut overrides = if embedded {
        embedded_defaults()
    } else {
        real_defaults()
    };
    overrides.extend(data);
    overrides.extend(cli.run.overrides(&cli.output_dir));
    let args = load_args(cli.run.config.as_deref(), Some(Recipe::Dpo), &overrides)?;
    let dpo = args.dpo();
    println!(
        "AtomRL online DPO on {} ({}), data {}, {} prompts x {} completions per step (best vs worst), up to {} new tokens, lr {}, beta {}, loss {}",
        if embedded { "the embedded tiny model" } else { &args.model },
        args.device,
        args.dataset,
        args.batch_size,
        args.num_generations,
        args.max_completion_length,
        args.lr,
        dpo.beta,
        dpo.loss_type,
    );
    let summary = run_recipe(args)?;
    print_summary(&summary);
    Ok(())
}
