//! `atomrl-train`: run a GRPO, DAPO or SFT recipe from a TOML configuration.
//!
//! ```text
//! atomrl-train --config run.toml
//! atomrl-train --config run.toml --recipe dapo --set lr=3e-6 --set num_generations=16
//! atomrl-train --config run.toml --resume          # continue from the latest checkpoint
//! mpirun -np 4 atomrl-train --config run.toml      # 4 data-parallel ranks (feature `mpi`)
//! ```

use std::path::PathBuf;
use std::process::ExitCode;
use std::rc::Rc;

use anyhow::Result;
use atomrl_dist::{Collective, SingleProcess};
use atomrl_trainer::config::{load_args, Recipe};
use atomrl_trainer::run::{print_summary, run_recipe_with};
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
    let comm = match collective() {
        Ok(comm) => comm,
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::from(2);
        }
    };
    match run(cli, Rc::clone(&comm)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if comm.world_size() > 1 => {
            // The other ranks wait for this one in their next collective: end them all.
            eprintln!("error on rank {}: {e:#}", comm.rank());
            comm.abort(2)
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// The ranks of the run: MPI's world when started by `mpirun` (feature `mpi`), else this
/// process alone.
fn collective() -> Result<Rc<dyn Collective>> {
    #[cfg(feature = "mpi")]
    if atomrl_dist::launched_by_mpi() {
        let comm = atomrl_dist::MpiCollective::init()?;
        comm.abort_on_panic(101);
        return Ok(Rc::new(comm));
    }
    #[cfg(not(feature = "mpi"))]
    if let Some(n) = ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE"]
        .iter()
        .find_map(|v| std::env::var(v).ok()?.parse::<usize>().ok())
        .filter(|&n| n > 1)
    {
        // Each process would train alone, all into the same output folder.
        anyhow::bail!("started as one of {n} MPI processes, but this atomrl-train was built without the `mpi` feature: cargo build --release --features mpi --bin atomrl-train");
    }
    Ok(Rc::new(SingleProcess))
}

fn run(cli: Cli, comm: Rc<dyn Collective>) -> Result<()> {
    let mut overrides = cli.set;
    if cli.resume {
        overrides.push("resume=\"auto\"".into());
    }
    let args = load_args(cli.config.as_deref(), cli.recipe, &overrides)?;
    let lead = comm.rank() == 0;
    let summary = run_recipe_with(args, comm)?;
    if lead {
        print_summary(&summary);
    }
    Ok(())
}
