//! `atomrl-compare`: runs side by side — the configuration keys that differ, each metric's
//! final and best value (markdown on stdout), and the curves overlaid in a PNG.
//!
//! ```text
//! atomrl-compare runs/a runs/b                      # two runs
//! atomrl-compare runs/sweep_gsm8k --metric eval/accuracy --png compare.png   # a sweep's trials
//! ```

use std::path::PathBuf;
use std::process::ExitCode;

use atomrl_cli::compare::{load_runs, markdown, metrics_to_compare, write_overlay};
use clap::Parser;

/// Compare AtomRL runs: differing configuration keys, final and best metrics, overlaid curves.
#[derive(Parser)]
#[command(
    name = "atomrl-compare",
    version,
    after_help = "Example: atomrl-compare runs/a runs/b --png compare.png"
)]
struct Cli {
    /// Run folders (with metrics.jsonl), or sweep folders (their trials).
    #[arg(required = true, value_name = "RUN")]
    runs: Vec<PathBuf>,
    /// A metric to compare (repeatable); default: eval/accuracy, reward/mean, loss, kl where logged.
    #[arg(long = "metric", value_name = "KEY")]
    metrics: Vec<String>,
    /// Where the overlaid curves go.
    #[arg(long, default_value = "compare.png", value_name = "FILE.png")]
    png: PathBuf,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let run = || -> anyhow::Result<()> {
        let runs = load_runs(&cli.runs)?;
        let metrics = metrics_to_compare(&runs, &cli.metrics);
        print!("{}", markdown(&runs, &metrics));
        write_overlay(&runs, &metrics, &cli.png)?;
        println!("\ncurves: {}", cli.png.display());
        Ok(())
    };
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}
