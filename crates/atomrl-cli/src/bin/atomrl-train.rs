//! `atomrl-train`: run a GRPO, DAPO or SFT recipe from a TOML configuration.
//!
//! ```text
//! atomrl-train --config run.toml
//! atomrl-train --config run.toml --recipe dapo --set lr=3e-6 --set num_generations=16
//! atomrl-train --config run.toml --resume          # continue from the latest checkpoint
//! ```

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use atomrl_trainer::config::{load_args, Recipe};
use atomrl_trainer::run::{print_summary, run_recipe};
use clap::Parser;

/// Train a language model with GRPO, DAPO or SFT.
///
/// Every option of the run lives in the TOML file (see docs/recipes.md for all keys and their
/// defaults); `--set key=value` overrides one, `--recipe` picks the preset the file is applied
/// on top of.
#[derive(Parser)]
#[command(
    name = "atomrl-train",
    version,
    after_help = "Example: atomrl-train --config examples/configs/tiny.toml --set max_steps=20"
)]
struct Cli {
    /// The run's TOML configuration.
    #[arg(long, short, value_name = "FILE.toml")]
    config: Option<PathBuf>,
    /// Override one option (TOML value): `--set lr=1e-5 --set lora.r=8`.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// The preset the configuration is applied on: grpo, dapo or sft.
    #[arg(long, value_parser = parse_recipe)]
    recipe: Option<Recipe>,
    /// Continue from the latest complete checkpoint in output_dir (same as resume = "auto").
    #[arg(long)]
    resume: bool,
}

fn parse_recipe(s: &str) -> Result<Recipe, String> {
    s.parse().map_err(|e: atomrl_core::Error| e.to_string())
}

fn main() -> ExitCode {
    atomrl_trainer::runtime::tune_allocator();
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    let mut overrides = cli.set;
    if cli.resume {
        overrides.push("resume=\"auto\"".into());
    }
    let args = load_args(cli.config.as_deref(), cli.recipe, &overrides)?;
    let summary = run_recipe(args)?;
    print_summary(&summary);
    Ok(())
}
