//! What a sweep leaves beside its trials: `trials.csv` and `trials.md` (every trial's
//! parameters, objective, status and time), `best.toml` (the best trial's run configuration,
//! ready for `atomrl-train --config`), `sweep.jsonl` (one JSON record per trial, for other
//! tools), `objective.png` (the objective against each parameter) and `curves.png` (each
//! trial's objective metric over its steps).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use plotters::prelude::*;

use crate::config::SweepConfig;
use crate::error::{Result, SweepError};
use crate::objective::run_rows;
use crate::space::Dist;
use crate::trial::{short, trial_dir, Status, TrialRecord};

/// The best ended trial with an objective (finished before stopped ones; the first of equals).
pub fn best(cfg: &SweepConfig, records: &[TrialRecord]) -> Option<TrialRecord> {
    let value = |r: &TrialRecord| r.objective.unwrap_or(f64::NAN);
    // `min_by` keeps the first of equal elements: order the better first.
    let order = |a: &&TrialRecord, b: &&TrialRecord| {
        let o = value(a).total_cmp(&value(b));
        if cfg.objective.maximize() {
            o.reverse()
        } else {
            o
        }
    };
    let pick = |status: Status| {
        records
            .iter()
            .filter(|r| r.status == status && value(r).is_finite())
            .min_by(order)
            .cloned()
    };
    pick(Status::Finished).or_else(|| pick(Status::Pruned))
}

/// Writes every report into the sweep folder; returns their paths.
///
/// # Errors
/// An unwritable folder.
pub fn write_reports(cfg: &SweepConfig, records: &[TrialRecord]) -> Result<Vec<PathBuf>> {
    let dir = &cfg.output_dir;
    let keys: Vec<&str> = cfg.search.iter().map(|p| p.key.as_str()).collect();
    let mut csv = format!("trial,{},objective,status,seconds,error\n", keys.join(","));
    let mut md = format!(
        "| trial | {} | {} | status | time |\n|---|{}---|---|---|\n",
        keys.join(" | "),
        cfg.objective.metric,
        "---|".repeat(keys.len())
    );
    let mut jsonl = String::new();
    for r in records {
        let values: Vec<String> = r.toml_params().iter().map(|(_, v)| short(v)).collect();
        let objective = r.objective.map_or(String::new(), |v| format!("{v}"));
        let status = format!("{:?}", r.status).to_lowercase();
        let error = r
            .error
            .clone()
            .unwrap_or_default()
            .replace(['"', '\n'], " ");
        let _ = writeln!(
            csv,
            "{},{},{},{},{:.1},\"{}\"",
            r.index,
            values.join(","),
            objective,
            status,
            r.seconds,
            error
        );
        let _ = writeln!(
            md,
            "| {} | {} | {} | {}{} | {:.0} s |",
            r.index,
            values.join(" | "),
            r.objective.map_or("-".into(), |v| format!("{v:.4}")),
            status,
            r.error
                .as_ref()
                .map_or(String::new(), |e| format!(": {}", e.replace('|', "/"))),
            r.seconds
        );
        let line =
            serde_json::to_string(r).map_err(|e| SweepError::file(dir.join("sweep.jsonl"), e))?;
        jsonl.push_str(&line);
        jsonl.push('\n');
    }
    let mut written = Vec::new();
    for (name, text) in [
        ("trials.csv", csv),
        ("trials.md", md),
        ("sweep.jsonl", jsonl),
    ] {
        let path = dir.join(name);
        std::fs::write(&path, text).map_err(|e| SweepError::file(&path, e))?;
        written.push(path);
    }
    if let Some(b) = best(cfg, records) {
        let path = dir.join("best.toml");
        std::fs::write(&path, best_toml(cfg, &b)?).map_err(|e| SweepError::file(&path, e))?;
        written.push(path);
    }
    written.push(objective_chart(cfg, records)?);
    written.push(curves_chart(cfg, records)?);
    Ok(written)
}

/// The best trial's run configuration as one TOML file: the base file's keys with `[base]`,
/// the budget and the best values on top (the output folder is the trial's).
fn best_toml(cfg: &SweepConfig, b: &TrialRecord) -> Result<String> {
    let mut table = match &cfg.base_file {
        Some(p) => {
            let text = std::fs::read_to_string(p).map_err(|e| SweepError::file(p, e))?;
            toml::from_str::<toml::Table>(&text).map_err(|e| SweepError::file(p, e))?
        }
        None => toml::Table::new(),
    };
    if let Some(r) = cfg.recipe {
        table.insert("recipe".into(), r.name().into());
    }
    let run = trial_dir(&cfg.output_dir, b.index).join("run");
    for o in cfg.trial_overrides(&b.toml_params(), &run) {
        atomrl_config::apply_override(&mut table, &o)
            .map_err(|e| SweepError::file(cfg.output_dir.join("best.toml"), e))?;
    }
    // A parallel trial's thread share and GPU are no part of the configuration found, and a
    // run of it writes a folder of its own, not into the trial's.
    for k in ["threads", "workers", "resume"] {
        table.remove(k);
    }
    let out = cfg.output_dir.join("best");
    table.insert("output_dir".into(), out.display().to_string().into());
    let header = format!(
        "# The best of {} trials: trial {} ({} = {}).\n# atomrl-train --config {}\n",
        cfg.trials,
        b.index,
        cfg.objective.metric,
        b.objective.map_or("-".into(), |v| format!("{v:.4}")),
        cfg.output_dir.join("best.toml").display()
    );
    let body = toml::to_string(&table)
        .map_err(|e| SweepError::file(cfg.output_dir.join("best.toml"), e))?;
    Ok(header + &body)
}

const SIZE: (u32, u32) = (800, 480);

fn chart_err(path: &Path) -> impl Fn(String) -> SweepError + '_ {
    move |e| SweepError::file(path, e)
}

/// The objective of every trial with one against each parameter (one panel per parameter;
/// log axis for `log_uniform`, choice index for `choice`).
fn objective_chart(cfg: &SweepConfig, records: &[TrialRecord]) -> Result<PathBuf> {
    atomrl_metrics::register_chart_font().map_err(|e| SweepError::file("font", e))?;
    let path = cfg.output_dir.join("objective.png");
    let n = cfg.search.len().max(1);
    let root = BitMapBackend::new(&path, (SIZE.0, SIZE.1 * n as u32 / 2 + 120)).into_drawing_area();
    let err = chart_err(&path);
    root.fill(&WHITE).map_err(|e| err(e.to_string()))?;
    let panels = root.split_evenly((n, 1));
    for (panel, (k, p)) in panels.iter().zip(cfg.search.iter().enumerate()) {
        let points: Vec<(f64, f64, Status)> = records
            .iter()
            .filter_map(|r| {
                let v = r.objective.filter(|v| v.is_finite())?;
                let u = *r.units.get(k)?;
                let x = match &p.dist {
                    Dist::LogUniform(..) | Dist::Uniform(..) | Dist::Int(..) => {
                        let val = p.value_at(u);
                        let x = val
                            .as_float()
                            .or_else(|| val.as_integer().map(|i| i as f64))?;
                        if matches!(p.dist, Dist::LogUniform(..)) {
                            x.log10()
                        } else {
                            x
                        }
                    }
                    Dist::Choice(c) => ((u * c.len() as f64).floor()).min(c.len() as f64 - 1.0),
                };
                Some((x, v, r.status))
            })
            .collect();
        let (x0, x1) = atomrl_metrics::padded_range(points.iter().map(|p| p.0));
        let (y0, y1) = atomrl_metrics::padded_range(points.iter().map(|p| p.1));
        let label = match p.dist {
            Dist::LogUniform(..) => format!("log10 {}", p.key),
            Dist::Choice(_) => format!("{} (choice index)", p.key),
            _ => p.key.clone(),
        };
        let caption = format!("{} against {}", cfg.objective.metric, p.key);
        let axes = Axes {
            caption: &caption,
            x: (x0, x1),
            y: (y0, y1),
            x_desc: &label,
            y_desc: &cfg.objective.metric,
        };
        let mut chart = axes.draw(panel).map_err(&err)?;
        chart
            .draw_series(points.iter().map(|&(x, y, s)| {
                let colour = if s == Status::Pruned {
                    RGBColor(255, 127, 14)
                } else {
                    RGBColor(31, 119, 180)
                };
                Circle::new((x, y), 5, colour.filled())
            }))
            .map_err(|e| err(e.to_string()))?;
    }
    root.present().map_err(|e| err(e.to_string()))?;
    Ok(cfg.output_dir.join("objective.png"))
}

/// Each trial's objective metric over its steps.
fn curves_chart(cfg: &SweepConfig, records: &[TrialRecord]) -> Result<PathBuf> {
    atomrl_metrics::register_chart_font().map_err(|e| SweepError::file("font", e))?;
    let path = cfg.output_dir.join("curves.png");
    let err = chart_err(&path);
    let mut lines = Vec::new();
    for r in records {
        let rows = run_rows(&trial_dir(&cfg.output_dir, r.index).join("run")).unwrap_or_default();
        let pts: Vec<(f64, f64)> = rows
            .iter()
            .filter_map(|row| {
                Some((
                    row.step as f64,
                    row.get(&cfg.objective.metric).filter(|v| v.is_finite())?,
                ))
            })
            .collect();
        if !pts.is_empty() {
            lines.push((r.index, pts));
        }
    }
    let (x0, x1) =
        atomrl_metrics::padded_range(lines.iter().flat_map(|(_, p)| p.iter().map(|q| q.0)));
    let (y0, y1) =
        atomrl_metrics::padded_range(lines.iter().flat_map(|(_, p)| p.iter().map(|q| q.1)));
    let root = BitMapBackend::new(&path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(e.to_string()))?;
    let caption = format!("{} of each trial", cfg.objective.metric);
    let axes = Axes {
        caption: &caption,
        x: (x0, x1),
        y: (y0, y1),
        x_desc: "step",
        y_desc: &cfg.objective.metric,
    };
    let mut chart = axes.draw(&root).map_err(&err)?;
    for (k, (index, pts)) in lines.iter().enumerate() {
        let colour = Palette99::pick(k).to_rgba();
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), colour.stroke_width(2)))
            .map_err(|e| err(e.to_string()))?
            .label(format!("trial {index}"))
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 15, y)], colour.stroke_width(2)));
        chart
            .draw_series(pts.iter().map(|&p| Circle::new(p, 3, colour.filled())))
            .map_err(|e| err(e.to_string()))?;
    }
    if lines.len() <= 12 && !lines.is_empty() {
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(|e| err(e.to_string()))?;
    }
    root.present().map_err(|e| err(e.to_string()))?;
    Ok(cfg.output_dir.join("curves.png"))
}

/// The frame of a chart: caption, ranges and axis names.
struct Axes<'a> {
    caption: &'a str,
    x: (f64, f64),
    y: (f64, f64),
    x_desc: &'a str,
    y_desc: &'a str,
}

type Chart<'a, 'b> = ChartContext<
    'a,
    BitMapBackend<'b>,
    Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
>;

impl Axes<'_> {
    /// The chart on `area` with its mesh drawn.
    fn draw<'a, 'b>(
        &self,
        area: &'a DrawingArea<BitMapBackend<'b>, plotters::coord::Shift>,
    ) -> std::result::Result<Chart<'a, 'b>, String> {
        let mut chart = ChartBuilder::on(area)
            .caption(self.caption, ("sans-serif", 18))
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(55)
            .build_cartesian_2d(self.x.0..self.x.1, self.y.0..self.y.1)
            .map_err(|e| e.to_string())?;
        chart
            .configure_mesh()
            .x_desc(self.x_desc)
            .y_desc(self.y_desc)
            .draw()
            .map_err(|e| e.to_string())?;
        Ok(chart)
    }
}
