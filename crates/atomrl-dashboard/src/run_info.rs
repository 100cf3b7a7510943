//! What the dashboard says of one run, read from its files: [`RunSummary`] (the runs list)
//! and [`RunDetail`] (the run page: configuration, evaluations, checkpoints).

use std::collections::BTreeMap;
use std::path::Path;

use atomrl_metrics::keys::{EVAL_ACCURACY, REWARD_MEAN};
use atomrl_metrics::{RunState, RunStatus};

use crate::metrics_store::RunMetrics;

/// A run's line in the runs list.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct RunSummary {
    /// The run's name (its path under the runs folder).
    pub name: String,
    /// `running`, `finished`, `failed`, `killed` (its process is gone without an end) or
    /// `unknown` (a run from before runs wrote `status.json`).
    pub status: &'static str,
    /// A killed or failed run with a checkpoint to resume from.
    pub resumable: bool,
    /// From `config.toml`.
    pub recipe: Option<String>,
    /// From `config.toml`.
    pub model: Option<String>,
    /// From `config.toml`.
    pub dataset: Option<String>,
    /// The last logged step.
    pub steps_done: Option<u64>,
    /// The steps the run plans.
    pub steps_planned: Option<u64>,
    /// The run's time budget in seconds, when it has one (it stops at whichever of the steps
    /// and the budget comes first).
    pub time_budget_s: Option<f64>,
    /// The last finite `reward/mean`.
    pub reward: Option<f64>,
    /// The last finite `eval/accuracy`.
    pub eval_accuracy: Option<f64>,
    /// Unix seconds.
    pub started_at: Option<f64>,
    /// From the start to the end, or to the last logged row.
    pub duration_s: Option<f64>,
    /// The error of a failed run.
    pub error: Option<String>,
    /// What could not be read.
    pub messages: Vec<String>,
}

/// A checkpoint of a run, with the command that answers questions with it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct CheckpointInfo {
    /// `checkpoint-N`.
    pub name: String,
    /// `N`.
    pub step: u64,
    /// Its folder.
    pub path: String,
    /// `atomrl-infer --checkpoint …` with the run's tools and system prompt.
    pub command: String,
}

/// One held-out evaluation: the `eval/*` metrics of a row.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct EvalRow {
    /// The step it was logged at (0: before training).
    pub step: u64,
    /// `eval/*` metric → value (`null` when not finite).
    pub metrics: BTreeMap<String, Option<f64>>,
}

/// A run's configuration as it resolved it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ConfigInfo {
    /// `config.toml` as written.
    pub text: String,
    /// Dotted key → value.
    pub keys: BTreeMap<String, String>,
}

/// Everything the run page shows but the charts and rollouts.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct RunDetail {
    /// As in the list.
    pub summary: RunSummary,
    /// `None` for a run without `config.toml`.
    pub config: Option<ConfigInfo>,
    /// The held-out evaluations.
    pub evals: Vec<EvalRow>,
    /// The complete checkpoints, oldest first.
    pub checkpoints: Vec<CheckpointInfo>,
    /// What could not be read.
    pub messages: Vec<String>,
}

/// The configuration of the run in `dir` (messages for what could not be read).
pub fn read_config(dir: &Path, messages: &mut Vec<String>) -> Option<ConfigInfo> {
    let path = dir.join("config.toml");
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            messages.push("no config.toml (a run from before runs wrote it)".into());
            return None;
        }
        Err(e) => {
            messages.push(format!("{}: {e}", path.display()));
            return None;
        }
    };
    let keys = match toml::from_str::<toml::Table>(&text) {
        Ok(t) => atomrl_config::flatten_table(&t)
            .into_iter()
            .map(|(k, v)| (k, display_value(&v)))
            .collect(),
        Err(e) => {
            messages.push(format!("{}: not valid TOML: {e}", path.display()));
            BTreeMap::new()
        }
    };
    Some(ConfigInfo { text, keys })
}

/// A TOML value as shown: strings without their quotes.
fn display_value(v: &toml::Value) -> String {
    match v {
        toml::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The summary of run `name` in `dir`, its metrics already refreshed.
pub fn summarize(name: &str, dir: &Path, metrics: &RunMetrics) -> RunSummary {
    let mut messages = metrics.messages();
    let config = read_config(dir, &mut messages);
    let has_checkpoint = !checkpoints(dir, config.as_ref()).is_empty();
    summary_of(
        name,
        dir,
        metrics,
        config.as_ref(),
        has_checkpoint,
        messages,
    )
}

/// The summary of run `name` in `dir` from its metrics, its configuration (read once by the
/// caller), whether it has a checkpoint, and the messages so far.
fn summary_of(
    name: &str,
    dir: &Path,
    metrics: &RunMetrics,
    config: Option<&ConfigInfo>,
    has_checkpoint: bool,
    mut messages: Vec<String>,
) -> RunSummary {
    let key = |k: &str| config.and_then(|c| c.keys.get(k).cloned());
    let status = match RunStatus::read(dir) {
        Ok(s) => s,
        Err(e) => {
            messages.push(e.to_string());
            None
        }
    };
    let last = |metric: &str| metrics.finite_points(metric).last().map(|p| p.1);
    let steps_done = metrics.steps().last().copied();
    let last_wall = metrics
        .wall_times()
        .iter()
        .rev()
        .find(|t| t.is_finite())
        .copied();
    let state = run_state(status.as_ref());
    // A live run's last line may be half written; anywhere else it was torn (a kill).
    if metrics.has_partial_line() {
        let why = if state == "running" {
            "is being written; it is shown once complete"
        } else {
            "is incomplete (torn when the run was killed?) and is left out"
        };
        messages.push(format!(
            "{}: the last line {why}",
            dir.join(atomrl_metrics::METRICS_FILE).display()
        ));
    }
    let steps_planned = status
        .as_ref()
        .map(|s| s.steps_planned)
        .filter(|&n| n > 0)
        .or_else(|| {
            key("max_steps")
                .and_then(|s| s.parse().ok())
                .filter(|&n| n > 0)
        });
    let started_at = status
        .as_ref()
        .map(|s| s.started_at)
        .or_else(|| metrics.wall_times().iter().find(|t| t.is_finite()).copied());
    let ended_at = match (state, &status) {
        ("finished" | "failed", Some(s)) => Some(s.updated_at),
        ("running", _) => Some(atomrl_metrics::unix_now()),
        _ => last_wall,
    };
    RunSummary {
        name: name.to_string(),
        status: state,
        resumable: matches!(state, "killed" | "failed") && has_checkpoint,
        recipe: key("recipe"),
        model: key("model"),
        dataset: key("dataset"),
        steps_done,
        steps_planned,
        time_budget_s: key("time_budget_s")
            .and_then(|s| s.parse().ok())
            .filter(|&b: &f64| b > 0.0),
        reward: last(REWARD_MEAN),
        eval_accuracy: last(EVAL_ACCURACY),
        started_at,
        duration_s: started_at.zip(ended_at).map(|(a, b)| (b - a).max(0.0)),
        error: status.and_then(|s| s.error),
        messages,
    }
}

/// The list's status word for a run's `status.json`.
fn run_state(status: Option<&RunStatus>) -> &'static str {
    match status {
        None => "unknown",
        Some(s) => match s.state {
            RunState::Finished => "finished",
            RunState::Failed => "failed",
            RunState::Running if s.process_alive() == Some(false) => "killed",
            RunState::Running => "running",
        },
    }
}

/// The run page's detail of run `name` in `dir`, its metrics already refreshed.
pub fn detail(name: &str, dir: &Path, metrics: &RunMetrics) -> RunDetail {
    let mut messages = metrics.messages();
    let config = read_config(dir, &mut messages);
    let checkpoints = checkpoints(dir, config.as_ref());
    let summary = summary_of(
        name,
        dir,
        metrics,
        config.as_ref(),
        !checkpoints.is_empty(),
        messages,
    );
    RunDetail {
        messages: summary.messages.clone(),
        checkpoints,
        evals: evals(metrics),
        config,
        summary,
    }
}

/// The rows with held-out metrics.
fn evals(metrics: &RunMetrics) -> Vec<EvalRow> {
    let mut by_row: BTreeMap<u32, BTreeMap<String, Option<f64>>> = BTreeMap::new();
    for (name, col) in metrics.columns().filter(|(n, _)| n.starts_with("eval/")) {
        for (r, v) in col.points() {
            by_row
                .entry(r)
                .or_default()
                .insert(name.to_string(), v.is_finite().then_some(v));
        }
    }
    by_row
        .into_iter()
        .map(|(r, metrics_at)| EvalRow {
            step: metrics.steps()[r as usize],
            metrics: metrics_at,
        })
        .collect()
}

/// The complete checkpoints (`checkpoint-N` with its `trainer_state.json`) of the run in
/// `dir`, oldest first.
fn checkpoints(dir: &Path, config: Option<&ConfigInfo>) -> Vec<CheckpointInfo> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found: Vec<CheckpointInfo> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_str()?.to_string();
            let step = name.strip_prefix("checkpoint-")?.parse().ok()?;
            let path = e.path();
            path.join("trainer_state.json")
                .is_file()
                .then(|| CheckpointInfo {
                    command: infer_command(&path, config),
                    path: path.display().to_string(),
                    name,
                    step,
                })
        })
        .collect();
    found.sort_by_key(|c| c.step);
    found
}

/// The `atomrl-infer` command for checkpoint `path`: the run's tools and system prompt, and a
/// question to replace.
fn infer_command(path: &Path, config: Option<&ConfigInfo>) -> String {
    let mut cmd = format!(
        "atomrl-infer --checkpoint {}",
        shell_quote(&path.display().to_string())
    );
    if let Some(c) = config {
        if let Some(tools) = c.keys.get("tools").filter(|t| t.as_str() != "[]") {
            let names: Vec<String> = tools
                .trim_matches(['[', ']'])
                .split(',')
                .map(|t| t.trim().trim_matches('"').to_string())
                .filter(|t| !t.is_empty())
                .collect();
            cmd += &format!(" --tools {}", names.join(","));
        }
        if let Some(sp) = c.keys.get("system_prompt") {
            cmd += &format!(" --system-prompt {}", shell_quote(sp));
        }
    }
    cmd + " 'What is 12 * 7?'"
}

/// `s` quoted for a POSIX shell where it needs it.
fn shell_quote(s: &str) -> String {
    let plain = s
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "-_./:=@%+,".contains(c));
    if plain && !s.is_empty() {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}
