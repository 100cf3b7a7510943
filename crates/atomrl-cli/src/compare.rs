//! Runs side by side, for terminals and CI logs: the configuration keys that differ, each
//! metric's final and best value, and the curves overlaid in one PNG (`atomrl-compare`).
//!
//! A run is a folder with `metrics.jsonl` (and, since runs write it, `config.toml`, the
//! configuration as resolved); a sweep folder (`trial-NNN/run`) stands for its trials.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use atomrl_metrics::{read_metrics, MetricRow};
use plotters::prelude::*;

/// One run as compared.
#[derive(Debug, Clone)]
pub struct Run {
    /// Its name in the tables (the folder's path as given, or `sweep/trial-NNN`).
    pub name: String,
    /// Its folder.
    pub dir: PathBuf,
    /// `config.toml` flattened to dotted keys (empty when the run has none).
    pub config: BTreeMap<String, String>,
    /// Its metrics.
    pub rows: Vec<MetricRow>,
    /// What could not be read (a corrupt line, no config).
    pub notes: Vec<String>,
}

/// The runs of `paths`: each a run folder, or a sweep folder standing for its trials' runs.
///
/// # Errors
/// A path that does not exist, or holds neither a run nor a sweep's trials (named).
pub fn load_runs(paths: &[PathBuf]) -> anyhow::Result<Vec<Run>> {
    let mut runs = Vec::new();
    for p in paths {
        if !p.is_dir() {
            anyhow::bail!("{}: no such run folder", p.display());
        }
        if p.join("metrics.jsonl").is_file() {
            runs.push(load_run(p, p.display().to_string()));
            continue;
        }
        let mut trials: Vec<PathBuf> = std::fs::read_dir(p)?
            .flatten()
            .map(|e| e.path())
            .filter(|d| d.join("run/metrics.jsonl").is_file())
            .collect();
        trials.sort();
        if trials.is_empty() {
            anyhow::bail!(
                "{}: neither a run (metrics.jsonl) nor a sweep (trial-*/run)",
                p.display()
            );
        }
        for t in trials {
            let name = format!(
                "{}/{}",
                p.display(),
                t.file_name().unwrap_or_default().to_string_lossy()
            );
            runs.push(load_run(&t.join("run"), name));
        }
    }
    Ok(runs)
}

fn load_run(dir: &Path, name: String) -> Run {
    let mut notes = Vec::new();
    let rows = read_metrics(dir.join("metrics.jsonl")).unwrap_or_else(|e| {
        notes.push(format!("metrics unreadable: {e}"));
        Vec::new()
    });
    let mut config = BTreeMap::new();
    match std::fs::read_to_string(dir.join("config.toml")) {
        Ok(text) => match toml::from_str::<toml::Table>(&text) {
            Ok(t) => {
                config = atomrl_trainer::config::flatten_table(&t)
                    .into_iter()
                    .map(|(k, v)| (k, v.to_string()))
                    .collect();
            }
            Err(e) => notes.push(format!("config.toml unreadable: {e}")),
        },
        Err(_) => notes.push("no config.toml (a run from before runs wrote it)".into()),
    }
    Run {
        name,
        dir: dir.to_path_buf(),
        config,
        rows,
        notes,
    }
}

/// The metrics to compare: `wanted` where given, else those of [`DEFAULT_METRICS`] some run
/// logged.
pub fn metrics_to_compare(runs: &[Run], wanted: &[String]) -> Vec<String> {
    if !wanted.is_empty() {
        return wanted.to_vec();
    }
    DEFAULT_METRICS
        .iter()
        .filter(|m| {
            runs.iter()
                .any(|r| r.rows.iter().any(|row| row.get(m).is_some()))
        })
        .map(|m| m.to_string())
        .collect()
}

/// The metrics compared when none is named.
pub const DEFAULT_METRICS: [&str; 4] = ["eval/accuracy", "reward/mean", "loss", "kl"];

/// The last finite value of `metric` and the best one (largest, or smallest for losses and
/// KL), with its step ([`atomrl_metrics::final_and_best`] over the rows).
pub fn final_and_best(rows: &[MetricRow], metric: &str) -> Option<(f64, (f64, u64))> {
    let points: Vec<(u64, f64)> = rows
        .iter()
        .filter_map(|r| Some((r.step, r.get(metric)?)))
        .collect();
    atomrl_metrics::final_and_best(&points, metric)
}

/// The comparison as markdown: the runs, the configuration keys that differ, and each
/// metric's final and best value per run.
///
/// ```
/// use atomrl_cli::compare::{markdown, Run};
/// use atomrl_metrics::MetricRow;
/// let mut row = MetricRow::new(5);
/// row.push("eval/accuracy", 0.5);
/// let run = |name: &str, lr: &str| Run {
///     name: name.into(),
///     dir: name.into(),
///     config: [("lr".to_string(), lr.to_string()), ("seed".to_string(), "0".to_string())].into(),
///     rows: vec![row.clone()],
///     notes: vec![],
/// };
/// let md = markdown(&[run("a", "1e-4"), run("b", "2e-4")], &["eval/accuracy".into()]);
/// assert!(md.contains("| lr | 1e-4 | 2e-4 |"));
/// assert!(!md.contains("| seed |"));
/// ```
pub fn markdown(runs: &[Run], metrics: &[String]) -> String {
    let names: Vec<&str> = runs.iter().map(|r| r.name.as_str()).collect();
    let header = |first: &str| {
        format!(
            "| {first} | {} |\n|---|{}\n",
            names.join(" | "),
            "---|".repeat(names.len())
        )
    };
    let mut md = String::from("## Runs\n\n");
    md += &header("");
    let steps: Vec<String> = runs
        .iter()
        .map(|r| r.rows.last().map_or("-".into(), |x| x.step.to_string()))
        .collect();
    let _ = writeln!(md, "| steps | {} |", steps.join(" | "));
    for r in runs.iter().filter(|r| !r.notes.is_empty()) {
        let _ = writeln!(md, "\n{}: {}", r.name, r.notes.join("; "));
    }
    md += "\n## Configuration keys that differ\n\n";
    let configs: Vec<&BTreeMap<String, String>> = runs.iter().map(|r| &r.config).collect();
    let differing = atomrl_trainer::config::differing_keys(&configs);
    if differing.is_empty() {
        md += "none\n";
    } else {
        md += &header("key");
        for k in differing {
            let vals: Vec<String> = runs
                .iter()
                .map(|r| r.config.get(&k).cloned().unwrap_or_else(|| "-".into()))
                .collect();
            let _ = writeln!(md, "| {k} | {} |", vals.join(" | "));
        }
    }
    md += "\n## Metrics: final (best, at step)\n\n";
    md += &header("metric");
    for m in metrics {
        let vals: Vec<String> = runs
            .iter()
            .map(|r| match final_and_best(&r.rows, m) {
                Some((last, (best, step))) => format!("{last:.4} ({best:.4} @ {step})"),
                None => "-".into(),
            })
            .collect();
        let _ = writeln!(md, "| {m} | {} |", vals.join(" | "));
    }
    md
}

/// The curves of `metrics` (one panel each), every run one colour, into a PNG at `path`.
///
/// # Errors
/// An unwritable file or a drawing failure.
pub fn write_overlay(runs: &[Run], metrics: &[String], path: &Path) -> anyhow::Result<()> {
    atomrl_metrics::register_chart_font()?;
    let panels = metrics.len().max(1);
    let root = BitMapBackend::new(path, (900, 320 * panels as u32)).into_drawing_area();
    root.fill(&WHITE)
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    for (area, m) in root.split_evenly((panels, 1)).iter().zip(metrics) {
        let lines: Vec<Vec<(f64, f64)>> = runs
            .iter()
            .map(|r| {
                r.rows
                    .iter()
                    .filter_map(|row| {
                        Some((row.step as f64, row.get(m).filter(|v| v.is_finite())?))
                    })
                    .collect()
            })
            .collect();
        let all = lines.iter().flatten();
        let (x0, x1) = atomrl_metrics::padded_range(all.clone().map(|p| p.0));
        let (y0, y1) = atomrl_metrics::padded_range(all.map(|p| p.1));
        let draw = || -> Result<(), String> {
            let mut chart = ChartBuilder::on(area)
                .caption(m, ("sans-serif", 18))
                .margin(10)
                .x_label_area_size(30)
                .y_label_area_size(55)
                .build_cartesian_2d(x0..x1, y0..y1)
                .map_err(|e| e.to_string())?;
            chart
                .configure_mesh()
                .x_desc("step")
                .draw()
                .map_err(|e| e.to_string())?;
            for (k, (pts, run)) in lines.iter().zip(runs).enumerate() {
                let colour = Palette99::pick(k).to_rgba();
                chart
                    .draw_series(LineSeries::new(pts.iter().copied(), colour.stroke_width(2)))
                    .map_err(|e| e.to_string())?
                    .label(run.name.clone())
                    .legend(move |(x, y)| {
                        PathElement::new([(x, y), (x + 15, y)], colour.stroke_width(2))
                    });
            }
            if runs.len() <= 12 {
                chart
                    .configure_series_labels()
                    .background_style(WHITE.mix(0.8))
                    .border_style(BLACK)
                    .draw()
                    .map_err(|e| e.to_string())?;
            }
            Ok(())
        };
        draw().map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    }
    root.present()
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    Ok(())
}
