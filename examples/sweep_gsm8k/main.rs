//! `cargo run --release --example sweep_gsm8k`: a hyperparameter sweep of the embedded GRPO
//! run (`examples/configs/sweep.toml`: TPE over the learning rate and the sampling temperature,
//! 10 trials of 90 s, two at a time, about 7.5 minutes on two cores), then the best trial against
//! the hand-tuned values (trial 0) at the same budget. `--config` runs another sweep file, as
//! `atomrl-sweep --config` does.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use atomrl_sweep::trial::{trial_main, Launcher, Status};
use atomrl_sweep::{run_sweep, SweepConfig};
use clap::Parser;

/// Tune the embedded GRPO run's learning rate and temperature.
#[derive(Parser)]
#[command(
    name = "sweep_gsm8k",
    after_help = "Example: cargo run --release --example sweep_gsm8k"
)]
struct Cli {
    /// The sweep file (docs/sweeps.md).
    #[arg(long, default_value = "examples/configs/sweep.toml")]
    config: PathBuf,
    /// Run one trial in this folder (how the sweep starts its trials).
    #[arg(long, hide = true, value_name = "DIR")]
    trial: Option<PathBuf>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match &cli.trial {
        Some(dir) => trial_main(dir),
        None => sweep(&cli.config),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn sweep(path: &std::path::Path) -> Result<()> {
    let cfg = SweepConfig::load(path)?;
    println!(
        "AtomRL sweep of the embedded GRPO run: {} trials ({:?}), {} at once, {} s each, objective {}",
        cfg.trials,
        cfg.sampler.kind,
        cfg.parallel,
        cfg.budget_seconds.map_or("-".into(), |s| s.to_string()),
        cfg.objective.metric
    );
    let started = std::time::Instant::now();
    let summary = run_sweep(&cfg, &Launcher::current_exe()?)?;
    println!(
        "== sweep finished in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    if let Some(base) = summary
        .records
        .first()
        .filter(|r| cfg.baseline && r.status == Status::Finished)
    {
        println!(
            "   hand-tuned values (trial 0: {}): {} = {:.4}",
            base.params_text(),
            summary.metric,
            base.objective.unwrap_or(f64::NAN)
        );
    }
    println!("   {}", summary.best_text());
    println!(
        "   the best run configuration: atomrl-train --config {}",
        cfg.output_dir.join("best.toml").display()
    );
    println!(
        "   every trial: {}",
        cfg.output_dir.join("trials.md").display()
    );
    Ok(())
}
