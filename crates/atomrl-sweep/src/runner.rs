//! The scheduler: starts trials in order, at most `parallel` at a time (per MPI rank), watches
//! their metrics for the early-stopping rungs, records each end, and resumes a killed sweep.
//!
//! Determinism: trial `i` is sampled once every trial `j ≤ i − P` has ended (`P` = trials
//! running at once over all ranks), from the results of exactly those trials, so the same seed
//! gives the same parameters however long each trial takes.

use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

use crate::config::SweepConfig;
use crate::error::{Result, SweepError};
use crate::objective::run_rows;
use crate::sampler::Observation;
use crate::trial::{toml_to_json, trial_dir, Launcher, Status, TrialPlan, TrialRecord};

/// This process's share of the trials under `mpirun` (Open MPI's or PMI's variables):
/// `(rank, ranks)`; `(0, 1)` otherwise.
pub fn mpi_share() -> (usize, usize) {
    let var = |names: [&str; 2]| {
        names
            .iter()
            .find_map(|n| std::env::var(n).ok()?.parse::<usize>().ok())
    };
    let size = var(["OMPI_COMM_WORLD_SIZE", "PMI_SIZE"])
        .unwrap_or(1)
        .max(1);
    let rank = var(["OMPI_COMM_WORLD_RANK", "PMI_RANK"]).unwrap_or(0);
    (rank.min(size - 1), size)
}

/// A running trial.
struct Running {
    record: TrialRecord,
    child: Child,
    started: Instant,
    /// Seconds of earlier attempts (a resumed trial).
    earlier: f64,
}

/// Every record on disk, by trial number (`None`: not started).
pub fn read_records(cfg: &SweepConfig) -> Result<Vec<Option<TrialRecord>>> {
    (0..cfg.trials)
        .map(|i| TrialRecord::read(&trial_dir(&cfg.output_dir, i)))
        .collect()
}

/// The sampler's view of ended trials `0..end`: finished ones with their objective, stopped
/// ones with their last rung's value.
fn history(records: &[Option<TrialRecord>], end: usize) -> Vec<Observation> {
    records[..end]
        .iter()
        .flatten()
        .filter(|r| matches!(r.status, Status::Finished | Status::Pruned))
        .filter_map(|r| {
            let objective = r.objective.filter(|v| v.is_finite())?;
            Some(Observation {
                units: r.units.clone(),
                objective,
            })
        })
        .collect()
}

/// Runs the sweep's trials (this rank's share) to their end, resuming those a killed sweep
/// left running, and returns every record once all ranks' trials have ended.
///
/// # Errors
/// Unwritable folders, a trial that cannot start, a sampler failure.
pub fn run_trials(cfg: &SweepConfig, launcher: &Launcher) -> Result<Vec<TrialRecord>> {
    std::fs::create_dir_all(&cfg.output_dir).map_err(|e| SweepError::file(&cfg.output_dir, e))?;
    let (rank, ranks) = mpi_share();
    let window = cfg.parallel * ranks;
    let mine: Vec<usize> = (0..cfg.trials).filter(|i| i % ranks == rank).collect();
    let mut next = 0;
    let mut running: Vec<Running> = Vec::new();
    let max_steps = cfg.max_steps();
    let rungs = cfg.asha.map(|a| a.rungs(max_steps)).unwrap_or_default();
    loop {
        let records = read_records(cfg)?;
        // Start what may start.
        while next < mine.len() && running.len() < cfg.parallel {
            let i = mine[next];
            match &records[i] {
                Some(r) if r.status.ended() => {
                    next += 1;
                    continue;
                }
                _ => {}
            }
            let ready = i < window
                || records[..=i - window]
                    .iter()
                    .all(|r| r.as_ref().is_some_and(|r| r.status.ended()));
            if !ready {
                break;
            }
            running.push(start(cfg, launcher, i, records[i].clone(), &records)?);
            next += 1;
        }
        // Watch what runs.
        let mut still = Vec::new();
        for mut r in running.drain(..) {
            if let Some(ended) = poll(cfg, &mut r, &rungs, &records)? {
                report(&ended);
            } else {
                still.push(r);
            }
        }
        running = still;
        if running.is_empty() && next >= mine.len() {
            let all = read_records(cfg)?;
            if all
                .iter()
                .all(|r| r.as_ref().is_some_and(|r| r.status.ended()))
            {
                return Ok(all.into_iter().flatten().collect());
            }
            // Other ranks' trials are still running.
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// Starts trial `i`: a new one is sampled from the ended trials below its window; one a killed
/// sweep left running keeps its parameters and resumes from its checkpoint.
fn start(
    cfg: &SweepConfig,
    launcher: &Launcher,
    i: usize,
    existing: Option<TrialRecord>,
    records: &[Option<TrialRecord>],
) -> Result<Running> {
    let dir = trial_dir(&cfg.output_dir, i);
    let record = match existing {
        Some(r) => {
            println!("trial {i}: resuming ({})", r.params_text());
            r
        }
        None => {
            let window = cfg.parallel * mpi_share().1;
            let seen = (i + 1).saturating_sub(window);
            let (units, values): (Vec<f64>, Vec<toml::Value>) = if cfg.baseline && i == 0 {
                cfg.base_values()?.into_iter().unzip()
            } else {
                let units = cfg.sampler.units(&cfg.search, i, &history(records, seen))?;
                let values = cfg
                    .search
                    .iter()
                    .zip(&units)
                    .map(|(p, &u)| p.value_at(u))
                    .collect();
                (units, values)
            };
            let params: Vec<(String, serde_json::Value)> = cfg
                .search
                .iter()
                .zip(&values)
                .map(|(p, v)| (p.key.clone(), toml_to_json(v)))
                .collect();
            let r = TrialRecord {
                index: i,
                params,
                units,
                status: Status::Running,
                objective: None,
                rungs: Vec::new(),
                error: None,
                seconds: 0.0,
            };
            println!("trial {i}: starting ({})", r.params_text());
            r
        }
    };
    let abs_dir = std::path::absolute(&dir).map_err(|e| SweepError::file(&dir, e))?;
    let plan = TrialPlan {
        base: cfg
            .base_file
            .as_ref()
            .map(|b| std::path::absolute(b).unwrap_or_else(|_| b.clone())),
        recipe: cfg.recipe.map(|r| r.name().to_string()),
        overrides: {
            let mut o = cfg.trial_overrides(&record.toml_params(), &abs_dir.join("run"));
            o.extend(cfg.placement(i, mpi_share().1));
            o
        },
    };
    plan.write(&dir)?;
    record.write(&dir)?;
    let child = launcher.spawn(i, &dir)?;
    let earlier = record.seconds;
    Ok(Running {
        record,
        child,
        started: Instant::now(),
        earlier,
    })
}

/// Checks a running trial: its end, or a rung that stops it. Returns its record once ended.
fn poll(
    cfg: &SweepConfig,
    r: &mut Running,
    rungs: &[usize],
    records: &[Option<TrialRecord>],
) -> Result<Option<TrialRecord>> {
    let i = r.record.index;
    let dir = trial_dir(&cfg.output_dir, i);
    let exited = r.child.try_wait().map_err(|e| SweepError::Trial {
        trial: i,
        detail: e.to_string(),
    })?;
    // The metrics are read only when something is decided from them: a rung not yet
    // reached, or the end.
    let rung_pending = cfg.asha.is_some() && r.record.rungs.len() < rungs.len();
    if exited.is_none() && !rung_pending {
        return Ok(None);
    }
    let rows = match run_rows(&dir.join("run")) {
        Ok(rows) => rows,
        Err(e) if exited.is_some() => {
            return end(r, &dir, Status::Failed, None, Some(e.to_string())).map(Some);
        }
        // A torn write while the run goes on: look again next time.
        Err(_) => Vec::new(),
    };
    // Rungs first, also for a trial that has just ended: later trials compare with them.
    if let Some(asha) = cfg.asha {
        for &step in rungs {
            if r.record.rungs.iter().any(|&(s, _)| s == step) {
                continue;
            }
            let Some(value) = cfg.objective.at_step(&rows, step as u64) else {
                break;
            };
            r.record.rungs.push((step, value));
            r.record.write(&dir)?;
            let others: Vec<f64> = records
                .iter()
                .flatten()
                .filter(|o| o.index != i)
                .filter_map(|o| o.rungs.iter().find(|&&(s, _)| s == step).map(|&(_, v)| v))
                .collect();
            if exited.is_none() && !asha.keep(value, &others, cfg.objective.maximize()) {
                // The checkpoint of this rung is kept; the process stops here.
                let _ = r.child.kill();
                let _ = r.child.wait();
                return end(r, &dir, Status::Pruned, Some(value), None).map(Some);
            }
        }
    }
    let Some(status) = exited else {
        return Ok(None);
    };
    if !status.success() {
        let error = last_error(&dir).unwrap_or_else(|| format!("exited with {status}"));
        return end(r, &dir, Status::Failed, None, Some(error)).map(Some);
    }
    match cfg.objective.of_rows(&rows) {
        Some(v) if v.is_finite() => end(r, &dir, Status::Finished, Some(v), None).map(Some),
        other => {
            let why = match other {
                Some(v) => format!("objective {} is {v}", cfg.objective.metric),
                None => format!("the run logged no {}", cfg.objective.metric),
            };
            end(r, &dir, Status::Failed, None, Some(why)).map(Some)
        }
    }
}

fn end(
    r: &mut Running,
    dir: &Path,
    status: Status,
    objective: Option<f64>,
    error: Option<String>,
) -> Result<TrialRecord> {
    r.record.status = status;
    r.record.objective = objective;
    r.record.error = error;
    r.record.seconds = r.earlier + r.started.elapsed().as_secs_f64();
    r.record.write(dir)?;
    Ok(r.record.clone())
}

/// The last `error:` line a trial printed.
fn last_error(dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(dir.join("log.txt")).ok()?;
    text.lines()
        .rev()
        .find(|l| l.starts_with("error"))
        .map(|l| l.trim_start_matches("error:").trim().to_string())
}

fn report(r: &TrialRecord) {
    match r.status {
        Status::Failed => println!(
            "trial {}: failed ({}): {}",
            r.index,
            r.params_text(),
            r.error.as_deref().unwrap_or("")
        ),
        status => println!(
            "trial {}: {} at {} ({}, {:.0} s)",
            r.index,
            if status == Status::Pruned {
                "stopped early"
            } else {
                "finished"
            },
            r.objective.map_or("-".into(), |v| format!("{v:.4}")),
            r.params_text(),
            r.seconds
        ),
    }
}
