//! `write_charts`: PNG line charts of a run's metrics, drawn with plotters and an embedded font.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use atomrl_core::{Error, Result};
use plotters::prelude::*;
use plotters::style::{register_font, FontStyle, RGBColor};

use crate::keys;
use crate::record::MetricRow;

/// Width and height of every chart, in pixels.
pub const CHART_SIZE: (u32, u32) = (800, 480);

/// DejaVu Sans (see `assets/DejaVuSans-LICENSE.txt`), embedded so that charts render on
/// machines without system fonts.
static FONT: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");
/// The family every text style below uses; the embedded font is registered under it.
const FAMILY: &str = "sans-serif";

/// Matplotlib's `tab10` colours, in order.
const PALETTE: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(23, 190, 207),
];

/// How one metric is drawn.
#[derive(Clone, Copy)]
enum Kind {
    /// A line through every finite value.
    Line,
    /// A line plus a ±`std` band around it (the band's key is the second field).
    LineWithBand(&'static str),
    /// Every metric `reward/<fn>/mean` except the aggregate `reward/mean`, as thin lines.
    PerFunctionRewards,
    /// Markers joined by a thin line: sparse series such as evaluation results.
    Markers,
    /// A noisy per-step metric: drawn faint, with its trailing moving average on top (the
    /// window is 1/50 of the run, at least 1 step), so a trend shows through the noise of
    /// small batches.
    Smoothed,
}

/// One series of a chart. `extra` series are drawn only beside a non-extra one with data.
struct Series {
    key: &'static str,
    kind: Kind,
    extra: bool,
}

const fn series(key: &'static str, kind: Kind, extra: bool) -> Series {
    Series { key, kind, extra }
}

/// One PNG file.
struct Chart {
    file: &'static str,
    title: &'static str,
    y_label: &'static str,
    series: &'static [Series],
}

const CHARTS: &[Chart] = &[
    Chart {
        file: "reward.png",
        title: "Reward",
        y_label: "reward",
        series: &[
            series(
                keys::REWARD_MEAN,
                Kind::LineWithBand(keys::REWARD_STD),
                false,
            ),
            series(keys::REWARD_PREFIX, Kind::PerFunctionRewards, false),
            series(keys::EVAL_ACCURACY, Kind::Markers, true),
        ],
    },
    Chart {
        file: "accuracy.png",
        title: "Accuracy",
        y_label: "accuracy",
        series: &[
            series(keys::ACCURACY, Kind::Smoothed, false),
            series(keys::EVAL_ACCURACY, Kind::Markers, false),
        ],
    },
    Chart {
        file: "completion_length.png",
        title: "Completion length",
        y_label: "tokens",
        series: &[
            series(keys::COMPLETION_LENGTH_MEAN, Kind::Line, false),
            series(keys::COMPLETION_LENGTH_MAX, Kind::Line, false),
        ],
    },
    Chart {
        file: "tools.png",
        title: "Tool use",
        y_label: "calls per completion / share",
        series: &[
            series(keys::TOOLS_CALLS_PER_COMPLETION, Kind::Smoothed, false),
            series(keys::TOOLS_ERROR_RATE, Kind::Smoothed, false),
            series(keys::TOOLS_MAX_TURNS_FRAC, Kind::Line, false),
            series(keys::EVAL_TOOLS_CALLS_PER_COMPLETION, Kind::Markers, false),
        ],
    },
    Chart {
        file: "kl.png",
        title: "KL divergence to the reference policy",
        y_label: "kl",
        series: &[series(keys::KL, Kind::Line, false)],
    },
    Chart {
        file: "entropy.png",
        title: "Policy entropy",
        y_label: "entropy (nats/token)",
        series: &[series(keys::ENTROPY, Kind::Line, false)],
    },
    Chart {
        file: "preference.png",
        title: "DPO implicit rewards (beta * log-ratio to the reference)",
        y_label: "reward / share",
        series: &[
            series(keys::DPO_REWARDS_CHOSEN, Kind::Smoothed, false),
            series(keys::DPO_REWARDS_REJECTED, Kind::Smoothed, false),
            series(keys::DPO_REWARDS_MARGINS, Kind::Smoothed, false),
            series(keys::DPO_REWARDS_ACCURACIES, Kind::Smoothed, false),
        ],
    },
    Chart {
        file: "loss.png",
        title: "Loss",
        y_label: "loss",
        series: &[series(keys::LOSS, Kind::Line, false)],
    },
];

/// The file names [`write_charts`] can write, in order.
///
/// # Example
/// ```
/// use atomrl_metrics::chart_files;
///
/// assert_eq!(chart_files()[0], "reward.png");
/// assert!(chart_files().contains(&"kl.png"));
/// ```
pub fn chart_files() -> Vec<&'static str> {
    CHARTS.iter().map(|c| c.file).collect()
}

/// Writes one 800×480 PNG line chart per metric group into `dir` (created if needed), x = step:
///
/// | file | series |
/// |---|---|
/// | `reward.png` | `reward/mean` with a ±`reward/std` band, each `reward/<fn>/mean`, `eval/accuracy` markers |
/// | `accuracy.png` | `accuracy`, `eval/accuracy` markers |
/// | `completion_length.png` | `completion_length/mean`, `completion_length/max` |
/// | `tools.png` | `tools/calls_per_completion`, `tools/error_rate`, `tools/max_turns_frac`, `eval/tools/calls_per_completion` markers |
/// | `kl.png` | `kl` |
/// | `entropy.png` | `entropy` |
/// | `preference.png` | `rewards/chosen`, `rewards/rejected`, `rewards/margins`, `rewards/accuracies` (DPO) |
/// | `loss.png` | `loss` |
///
/// Non-finite values are skipped; a chart none of whose metrics has a finite value is not
/// written. Returns the paths written, in the table's order. Text uses the embedded DejaVu
/// Sans font, so no system font is needed.
///
/// # Errors
/// [`Error::File`] when the folder or a PNG cannot be written.
///
/// # Example
/// ```
/// use atomrl_metrics::{write_charts, MetricRow};
///
/// let rows: Vec<MetricRow> = (1..=20)
///     .map(|s| MetricRow::new(s).with("loss", 1.0 / s as f64).with("kl", 0.001 * s as f64))
///     .collect();
/// let dir = std::env::temp_dir().join(format!("atomrl-doc-charts-{}", std::process::id()));
/// let written = write_charts(&rows, &dir)?;
/// let names: Vec<_> = written.iter().filter_map(|p| p.file_name()?.to_str()).collect();
/// assert_eq!(names, ["kl.png", "loss.png"]);
/// # std::fs::remove_dir_all(&dir)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn write_charts(rows: &[MetricRow], dir: &Path) -> Result<Vec<PathBuf>> {
    register_embedded_font()?;
    let mut written = Vec::new();
    for chart in CHARTS {
        let lines = collect(chart, rows);
        if lines.iter().all(|l| l.extra) {
            continue;
        }
        if written.is_empty() {
            fs::create_dir_all(dir).map_err(|e| Error::file(dir.display(), e))?;
        }
        let path = dir.join(chart.file);
        draw(chart, &lines, &path).map_err(|e| Error::file(path.display(), e))?;
        written.push(path);
    }
    Ok(written)
}

/// Registers the embedded DejaVu Sans with plotters once per process, as the `sans-serif`,
/// `serif` and `monospace` families, so that other crates' plotters charts render text on a
/// machine without system fonts.
///
/// # Errors
/// The embedded font does not load.
///
/// ```
/// atomrl_metrics::register_chart_font()?;
/// atomrl_metrics::register_chart_font()?; // once is enough; again is a no-op
/// # Ok::<(), atomrl_core::Error>(())
/// ```
pub fn register_chart_font() -> Result<()> {
    register_embedded_font()
}

/// Registers [`FONT`] with plotters once per process.
fn register_embedded_font() -> Result<()> {
    static REGISTERED: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    REGISTERED
        .get_or_init(|| {
            for family in [FAMILY, "serif", "monospace"] {
                register_font(family, FontStyle::Normal, FONT)
                    .map_err(|_| "embedded DejaVuSans.ttf is not a valid font".to_string())?;
            }
            Ok(())
        })
        .clone()
        .map_err(|e| Error::file("assets/DejaVuSans.ttf", e))
}

/// A drawable series: finite `(step, value)` points sorted by step.
struct Line {
    label: String,
    points: Vec<(u64, f64)>,
    /// `(step, low, high)` of a band drawn under the line.
    band: Vec<(u64, f64, f64)>,
    kind: Kind,
    extra: bool,
}

/// The series of `chart` that have at least one finite value.
fn collect(chart: &Chart, rows: &[MetricRow]) -> Vec<Line> {
    let mut lines = Vec::new();
    for s in chart.series {
        let keys: Vec<String> = match s.kind {
            Kind::PerFunctionRewards => per_function_reward_keys(rows),
            _ => vec![s.key.to_string()],
        };
        for key in keys {
            let points = finite_points(rows, &key);
            if points.is_empty() {
                continue;
            }
            let band = match s.kind {
                Kind::LineWithBand(std_key) => rows
                    .iter()
                    .filter_map(|r| {
                        let (m, sd) = (r.get(&key)?, r.get(std_key)?);
                        (m.is_finite() && sd.is_finite()).then_some((r.step, m - sd, m + sd))
                    })
                    .collect(),
                _ => Vec::new(),
            };
            let label = match s.kind {
                Kind::LineWithBand(std_key) if !band.is_empty() => format!("{key} ± {std_key}"),
                _ => key.clone(),
            };
            let mut band: Vec<(u64, f64, f64)> = band;
            band.sort_by_key(|b| b.0);
            if matches!(s.kind, Kind::Smoothed) {
                let window = (points.len() / 50).max(1);
                lines.push(Line {
                    label: key.clone(),
                    points: points.clone(),
                    band: Vec::new(),
                    kind: Kind::Smoothed,
                    extra: s.extra,
                });
                lines.push(Line {
                    label: format!("{key}, mean of {window} steps"),
                    points: moving_average(&points, window),
                    band: Vec::new(),
                    kind: Kind::Line,
                    extra: s.extra,
                });
                continue;
            }
            lines.push(Line {
                label,
                points,
                band,
                kind: s.kind,
                extra: s.extra,
            });
        }
    }
    lines
}

/// Trailing mean of the last `window` values at each point (fewer at the start).
fn moving_average(points: &[(u64, f64)], window: usize) -> Vec<(u64, f64)> {
    let mut sum = 0.0;
    points
        .iter()
        .enumerate()
        .map(|(i, &(step, v))| {
            sum += v;
            if i >= window {
                sum -= points[i - window].1;
            }
            (step, sum / (i + 1).min(window) as f64)
        })
        .collect()
}

/// Every `reward/<fn>/mean` key, in order of first appearance.
fn per_function_reward_keys(rows: &[MetricRow]) -> Vec<String> {
    let mut keys: Vec<String> = Vec::new();
    for row in rows {
        for (name, _) in &row.values {
            let is_fn = name
                .strip_prefix(keys::REWARD_PREFIX)
                .and_then(|rest| rest.strip_suffix(keys::REWARD_FN_SUFFIX))
                .is_some_and(|f| !f.is_empty());
            if is_fn && !keys.contains(name) {
                keys.push(name.clone());
            }
        }
    }
    keys
}

fn finite_points(rows: &[MetricRow], key: &str) -> Vec<(u64, f64)> {
    let mut points: Vec<(u64, f64)> = rows
        .iter()
        .filter_map(|r| r.get(key).filter(|v| v.is_finite()).map(|v| (r.step, v)))
        .collect();
    points.sort_by_key(|p| p.0);
    points
}

/// An axis range over the finite `values` with room around them (5% of their span, or 10%
/// of the value when they are all equal); `0..1` when there is none. For other crates' charts.
///
/// ```
/// assert_eq!(atomrl_metrics::padded_range([f64::NAN]), (0.0, 1.0));
/// let (lo, hi) = atomrl_metrics::padded_range([0.0, 10.0, f64::INFINITY]);
/// assert!(lo < 0.0 && hi > 10.0 && hi < 11.0);
/// ```
pub fn padded_range(values: impl IntoIterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = values
        .into_iter()
        .filter(|v| v.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| {
            (a.min(v), b.max(v))
        });
    if lo.is_finite() {
        padded(lo, hi)
    } else {
        (0.0, 1.0)
    }
}

/// `[lo, hi)` with room around the data; never empty.
fn padded(lo: f64, hi: f64) -> (f64, f64) {
    let span = hi - lo;
    if span > 0.0 {
        (lo - 0.05 * span, hi + 0.05 * span)
    } else {
        let pad = if lo == 0.0 { 1.0 } else { 0.1 * lo.abs() };
        (lo - pad, hi + pad)
    }
}

fn draw(chart: &Chart, lines: &[Line], path: &Path) -> std::result::Result<(), String> {
    let steps = lines
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.0))
        .chain(lines.iter().flat_map(|l| l.band.iter().map(|b| b.0)));
    let (x_min, x_max) = steps.fold((u64::MAX, 0), |(lo, hi), s| (lo.min(s), hi.max(s)));
    let (x_min, x_max) = if x_min >= x_max {
        (x_min.saturating_sub(1), x_max.saturating_add(1))
    } else {
        (x_min, x_max)
    };
    let values = lines
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.1))
        .chain(
            lines
                .iter()
                .flat_map(|l| l.band.iter().flat_map(|b| [b.1, b.2])),
        );
    let (y_lo, y_hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    });
    let (y_min, y_max) = padded(y_lo, y_hi);

    let root = BitMapBackend::new(path, CHART_SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let mut ctx = ChartBuilder::on(&root)
        .caption(chart.title, (FAMILY, 24))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d(x_min..x_max, y_min..y_max)
        .map_err(|e| e.to_string())?;
    ctx.configure_mesh()
        .x_desc("step")
        .y_desc(chart.y_label)
        .label_style((FAMILY, 14))
        .axis_desc_style((FAMILY, 16))
        .max_light_lines(2)
        .light_line_style(RGBColor(240, 240, 240))
        .bold_line_style(RGBColor(210, 210, 210))
        .y_label_formatter(&|v| format_tick(*v))
        .draw()
        .map_err(|e| e.to_string())?;

    for (i, line) in lines.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        if line.band.len() >= 2 {
            let outline: Vec<(u64, f64)> = line
                .band
                .iter()
                .map(|b| (b.0, b.2))
                .chain(line.band.iter().rev().map(|b| (b.0, b.1)))
                .collect();
            ctx.draw_series(std::iter::once(Polygon::new(outline, color.mix(0.18))))
                .map_err(|e| e.to_string())?;
        }
        let width = match line.kind {
            Kind::PerFunctionRewards | Kind::Markers | Kind::Smoothed => 1,
            Kind::Line | Kind::LineWithBand(_) => 2,
        };
        let markers = matches!(line.kind, Kind::Markers) || line.points.len() == 1;
        let style = if matches!(line.kind, Kind::Smoothed) {
            color.mix(0.3).stroke_width(width)
        } else {
            color.stroke_width(width)
        };
        let anno = ctx
            .draw_series(LineSeries::new(line.points.iter().copied(), style))
            .map_err(|e| e.to_string())?;
        anno.label(line.label.clone()).legend(move |(x, y)| {
            PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
        });
        if markers {
            ctx.draw_series(
                line.points
                    .iter()
                    .map(|&p| Circle::new(p, 4, color.filled())),
            )
            .map_err(|e| e.to_string())?;
        }
    }
    let legend = legend_corner(lines, (x_min, x_max), (y_min, y_max));
    ctx.configure_series_labels()
        .position(legend)
        .label_font((FAMILY, 14))
        .background_style(WHITE.mix(0.85))
        .border_style(RGBColor(180, 180, 180))
        .draw()
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())
}

/// The plot corner where the legend box hides the fewest data points (ties: upper right,
/// upper left, lower right, lower left).
fn legend_corner(lines: &[Line], x: (u64, u64), y: (f64, f64)) -> SeriesLabelPosition {
    // Legend size as a fraction of the plot area (about 700×390 px): 300 px wide, 22 px a row.
    let width = 0.45;
    let height = ((lines.len() as f64 * 22.0 + 20.0) / 390.0).min(1.0);
    let x_span = (x.1 - x.0) as f64;
    let y_span = y.1 - y.0;
    let hidden = |right: bool, top: bool| {
        let points = lines.iter().flat_map(|l| l.points.iter().copied());
        let band = lines
            .iter()
            .flat_map(|l| l.band.iter().flat_map(|b| [(b.0, b.1), (b.0, b.2)]));
        points
            .chain(band)
            .filter(|&(s, v)| {
                let fx = (s - x.0) as f64 / x_span;
                let fy = (v - y.0) / y_span;
                let in_x = if right {
                    fx >= 1.0 - width
                } else {
                    fx <= width
                };
                let in_y = if top {
                    fy >= 1.0 - height
                } else {
                    fy <= height
                };
                in_x && in_y
            })
            .count()
    };
    let corners = [
        (SeriesLabelPosition::UpperRight, true, true),
        (SeriesLabelPosition::UpperLeft, false, true),
        (SeriesLabelPosition::LowerRight, true, false),
        (SeriesLabelPosition::LowerLeft, false, false),
    ];
    let mut best = (SeriesLabelPosition::UpperRight, usize::MAX);
    for (corner, right, top) in corners {
        let n = hidden(right, top);
        if n < best.1 {
            best = (corner, n);
        }
    }
    best.0
}

/// Compact y-axis tick text.
fn format_tick(v: f64) -> String {
    let a = v.abs();
    if a == 0.0 {
        "0".into()
    } else if !(1e-3..1e5).contains(&a) {
        format!("{v:.1e}")
    } else {
        let s = format!("{v:.4}");
        let s = s.trim_end_matches('0').trim_end_matches('.');
        s.to_string()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn moving_average_is_a_trailing_mean() {
        let pts: Vec<(u64, f64)> = (1..=5).map(|s| (s, s as f64)).collect();
        let avg = moving_average(&pts, 2);
        assert_eq!(avg, vec![(1, 1.0), (2, 1.5), (3, 2.5), (4, 3.5), (5, 4.5)]);
        assert_eq!(moving_average(&pts, 1), pts);
    }

    #[test]
    fn padding_never_yields_an_empty_range() {
        assert_eq!(padded(0.0, 0.0), (-1.0, 1.0));
        let (lo, hi) = padded(2.0, 2.0);
        assert!(lo < 2.0 && hi > 2.0);
        let (lo, hi) = padded(0.0, 10.0);
        assert!((lo + 0.5).abs() < 1e-12 && (hi - 10.5).abs() < 1e-12);
    }

    #[test]
    fn ticks_are_compact() {
        assert_eq!(format_tick(0.0), "0");
        assert_eq!(format_tick(0.25), "0.25");
        assert_eq!(format_tick(120.0), "120");
        assert_eq!(format_tick(2e-5), "2.0e-5");
    }

    #[test]
    fn per_function_keys_exclude_the_aggregate() {
        let rows = vec![MetricRow::new(1)
            .with("reward/mean", 1.0)
            .with("reward/std", 0.1)
            .with("reward/accuracy/mean", 1.0)
            .with("reward/format/mean", 0.5)
            .with("reward/format/std", 0.5)];
        assert_eq!(
            per_function_reward_keys(&rows),
            vec!["reward/accuracy/mean", "reward/format/mean"]
        );
    }

    #[test]
    fn non_finite_values_are_skipped_and_sorted_by_step() {
        let rows = vec![
            MetricRow::new(3).with("kl", 0.3),
            MetricRow::new(1).with("kl", f64::NAN),
            MetricRow::new(2).with("kl", 0.2),
        ];
        assert_eq!(finite_points(&rows, "kl"), vec![(2, 0.2), (3, 0.3)]);
    }

    #[test]
    fn legend_avoids_the_data() {
        let line = |points: Vec<(u64, f64)>| Line {
            label: String::new(),
            points,
            band: Vec::new(),
            kind: Kind::Line,
            extra: false,
        };
        let rising = [line((0..=100).map(|s| (s, s as f64)).collect())];
        assert_eq!(
            legend_corner(&rising, (0, 100), (0.0, 100.0)),
            SeriesLabelPosition::UpperLeft
        );
        let high_flat = [line((0..=100).map(|s| (s, 90.0)).collect())];
        assert_eq!(
            legend_corner(&high_flat, (0, 100), (0.0, 100.0)),
            SeriesLabelPosition::LowerRight
        );
        let low_flat = [line((0..=100).map(|s| (s, 5.0)).collect())];
        assert_eq!(
            legend_corner(&low_flat, (0, 100), (0.0, 100.0)),
            SeriesLabelPosition::UpperRight
        );
    }

    #[test]
    fn extra_series_alone_do_not_make_a_chart() {
        let rows = vec![MetricRow::new(5).with("eval/accuracy", 0.5)];
        let reward = collect(&CHARTS[0], &rows);
        assert!(reward.iter().all(|l| l.extra));
        let accuracy = collect(&CHARTS[1], &rows);
        assert!(accuracy.iter().any(|l| !l.extra));
    }
}
