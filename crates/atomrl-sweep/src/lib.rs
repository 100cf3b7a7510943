//! Hyperparameter search for AtomRL runs: `atomrl-sweep --config sweep.toml`.
//!
//! A sweep file ([`config`]) names a base run (any recipe), a search space over any of its
//! keys ([`space`]: `uniform`, `log_uniform`, `int`, `choice`), an objective (held-out
//! accuracy by default, [`objective`]), a number of trials, how many run at once and a budget
//! per trial. The [`sampler`] draws each trial's values (a grid, uniform draws, or TPE through
//! the `tpe` crate); [`asha`] stops trials early whose objective at a rung falls out of the top
//! `1/η`. Each trial is an ordinary run folder (`trial-NNN/run`: checkpoints, `metrics.jsonl`,
//! TensorBoard events, charts) trained by a child process ([`trial::trial_main`]); a failed
//! trial is recorded with its error and the sweep goes on; a killed sweep resumes, keeping ended
//! trials and continuing running ones from their checkpoints. Under `mpirun` the trials spread
//! over the ranks (trial `i` on rank `i mod N`), which share the sweep folder. The [`report`]s:
//! `trials.csv`, `trials.md`, `best.toml`, `sweep.jsonl`, `objective.png`, `curves.png`.
//!
//! ```no_run
//! use atomrl_sweep::{run_sweep, trial::Launcher, SweepConfig};
//! let cfg = SweepConfig::load(std::path::Path::new("examples/configs/sweep.toml"))?;
//! let summary = run_sweep(&cfg, &Launcher::current_exe()?)?;
//! println!("{}", summary.best_text());
//! # Ok::<(), atomrl_sweep::SweepError>(())
//! ```

pub mod asha;
pub mod config;
mod error;
pub mod objective;
pub mod report;
pub mod runner;
pub mod sampler;
pub mod space;
pub mod trial;

use std::path::PathBuf;

pub use config::SweepConfig;

/// The README's example, run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
pub use error::{Result, SweepError};
use trial::{Launcher, TrialRecord};

/// What a sweep ended with.
#[derive(Debug, Clone)]
pub struct SweepSummary {
    /// Every trial's record, in order.
    pub records: Vec<TrialRecord>,
    /// The best trial, if any ended with an objective.
    pub best: Option<TrialRecord>,
    /// The objective's metric.
    pub metric: String,
    /// The report files (empty on MPI ranks other than 0).
    pub reports: Vec<PathBuf>,
}

impl SweepSummary {
    /// One line on the best trial.
    pub fn best_text(&self) -> String {
        match &self.best {
            Some(b) => format!(
                "best: trial {} with {} = {:.4} ({})",
                b.index,
                self.metric,
                b.objective.unwrap_or(f64::NAN),
                b.params_text()
            ),
            None => "no trial ended with an objective".into(),
        }
    }
}

/// Runs a sweep to its end (this MPI rank's share; rank 0 writes the reports once every
/// trial has ended).
///
/// # Errors
/// As [`runner::run_trials`] and [`report::write_reports`].
pub fn run_sweep(cfg: &SweepConfig, launcher: &Launcher) -> Result<SweepSummary> {
    let records = runner::run_trials(cfg, launcher)?;
    let reports = if runner::mpi_share().0 == 0 {
        report::write_reports(cfg, &records)?
    } else {
        Vec::new()
    };
    Ok(SweepSummary {
        best: report::best(cfg, &records),
        records,
        metric: cfg.objective.metric.clone(),
        reports,
    })
}

/// The command line of `atomrl-sweep` (and of examples that run a sweep).
#[derive(Debug, clap::Parser)]
#[command(
    name = "atomrl-sweep",
    version,
    about = "Search the hyperparameters of an AtomRL run: grid, random or TPE sampling, ASHA early stopping.",
    after_help = "Example: atomrl-sweep --config examples/configs/sweep.toml"
)]
pub struct Cli {
    /// The sweep file (docs/sweeps.md).
    #[arg(
        long,
        short,
        value_name = "SWEEP.toml",
        required_unless_present = "trial"
    )]
    pub config: Option<PathBuf>,
    /// Run one trial in this folder (how the sweep starts its trials).
    #[arg(long, hide = true, value_name = "DIR")]
    pub trial: Option<PathBuf>,
}

/// Runs [`Cli`]: a sweep, or one trial with `--trial`.
///
/// # Errors
/// A bad sweep file, a trial that cannot start, or the trial's own error with `--trial`.
pub fn run_cli(cli: Cli) -> anyhow::Result<()> {
    if let Some(dir) = cli.trial {
        return trial::trial_main(&dir);
    }
    let path = cli
        .config
        .ok_or_else(|| anyhow::anyhow!("--config is required"))?;
    let cfg = SweepConfig::load(&path)?;
    println!(
        "AtomRL sweep: {} trials ({:?} sampler, {} at once), objective {} ({:?}, {:?}), into {}",
        cfg.trials,
        cfg.sampler.kind,
        cfg.parallel,
        cfg.objective.metric,
        cfg.objective.mode,
        cfg.objective.at,
        cfg.output_dir.display()
    );
    let summary = run_sweep(&cfg, &Launcher::current_exe()?)?;
    println!("{}", summary.best_text());
    for p in &summary.reports {
        println!("wrote {}", p.display());
    }
    Ok(())
}
