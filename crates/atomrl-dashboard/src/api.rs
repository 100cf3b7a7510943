//! The HTTP API (JSON, GET only) and the embedded page: [`router`].
//!
//! | route | answer |
//! |---|---|
//! | `GET /api/runs` | `{root, runs: [RunSummary], messages}` |
//! | `GET /api/run/NAME` | [`RunDetail`](crate::RunDetail) |
//! | `GET /api/run/NAME/metrics?x=step\|wall&points=N` | `{rows, version, x, series: {metric: {x, y}}, messages}`, downsampled, with an `ETag` |
//! | `GET /api/run/NAME/rollouts[?step=S]` | `{steps, messages}`, or `{step, records, messages}` |
//! | `GET /api/compare?runs=A,B&x=…&points=N` | `{runs, differing: [{key, values}], metrics: [{metric, values}], series, messages}` |
//!
//! Errors are `{"error": "…"}` with 400 (a bad argument or run name) or 404 (no such run).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use rayon::prelude::*;
use serde_json::{json, Value};

use atomrl_metrics::METRICS_FILE;

use crate::assets::asset;
use crate::downsample::min_max_downsample;
use crate::error::DashboardError;
use crate::metrics_store::RunMetrics;
use crate::rollouts::Rollouts;
use crate::run_info::{detail, read_config, summarize};
use crate::runs_dir::RunsDir;

/// Points per curve when the request does not say.
const DEFAULT_POINTS: usize = 1_000;
/// The most points per curve a request may ask for.
const MAX_POINTS: usize = 20_000;
/// The most runs one comparison may hold.
const MAX_COMPARED: usize = 64;
/// Runs whose metrics stay in memory between requests (the least recently used go first).
const CACHED_RUNS: usize = 64;

/// What every handler reads: the runs folder and the runs' metrics read so far.
#[derive(Clone)]
pub struct AppState {
    runs: RunsDir,
    cache: Arc<MetricsCache>,
}

impl AppState {
    /// The state over `runs`.
    pub fn new(runs: RunsDir) -> Self {
        Self {
            runs,
            cache: Arc::new(MetricsCache::default()),
        }
    }
}

/// One run's metrics, shared by the requests reading it.
type SharedMetrics = Arc<Mutex<RunMetrics>>;

/// Each run's [`RunMetrics`], read incrementally across requests (a live run's polling reads
/// only its new lines).
#[derive(Default)]
struct MetricsCache {
    /// Run folder → (last use, its metrics).
    runs: Mutex<HashMap<PathBuf, (u64, SharedMetrics)>>,
    clock: std::sync::atomic::AtomicU64,
}

impl MetricsCache {
    /// The run's metrics in folder `dir`, refreshed, passed to `f`.
    fn with<T>(&self, dir: &Path, f: impl FnOnce(&RunMetrics) -> T) -> T {
        let now = self
            .clock
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let entry = {
            let mut runs = self.runs.lock().unwrap_or_else(PoisonError::into_inner);
            if runs.len() >= CACHED_RUNS && !runs.contains_key(dir) {
                let oldest = runs
                    .iter()
                    .min_by_key(|(_, (t, _))| *t)
                    .map(|(k, _)| k.clone());
                if let Some(k) = oldest {
                    runs.remove(&k);
                }
            }
            let slot = runs.entry(dir.to_path_buf()).or_insert_with(|| {
                (
                    now,
                    Arc::new(Mutex::new(RunMetrics::new(&dir.join(METRICS_FILE)))),
                )
            });
            slot.0 = now;
            slot.1.clone()
        };
        let mut m = entry.lock().unwrap_or_else(PoisonError::into_inner);
        m.refresh();
        f(&m)
    }
}

/// The dashboard's routes over `state`: the API and the embedded page. Read-only: GET only.
///
/// ```
/// let root = std::env::temp_dir().join(format!("atomrl-doc-router-{}", std::process::id()));
/// std::fs::create_dir_all(&root)?;
/// let runs = atomrl_dashboard::RunsDir::open(&root)?;
/// let _app: axum::Router = atomrl_dashboard::router(atomrl_dashboard::AppState::new(runs));
/// # std::fs::remove_dir_all(&root)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/api/runs", get(list_runs))
        .route("/api/run/{*rest}", get(run_route))
        .route("/api/compare", get(compare))
        .route("/", get(|| async { asset("index.html") }))
        .route(
            "/{*path}",
            get(|axum::extract::Path(p): axum::extract::Path<String>| async move { asset(&p) }),
        )
        .with_state(state)
}

/// An error as JSON with its status.
struct ApiError(DashboardError);

impl From<DashboardError> for ApiError {
    fn from(e: DashboardError) -> Self {
        Self(e)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = match self.0 {
            DashboardError::NoSuchRun(_) => StatusCode::NOT_FOUND,
            DashboardError::BadName { .. } | DashboardError::BadArgument { .. } => {
                StatusCode::BAD_REQUEST
            }
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        (status, Json(json!({ "error": self.0.to_string() }))).into_response()
    }
}

/// Runs blocking file work off the async threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f).await.unwrap_or_else(|e| {
        Err(ApiError(DashboardError::Serve {
            addr: "handler".into(),
            source: std::io::Error::other(e.to_string()),
        }))
    })
}

async fn list_runs(State(s): State<AppState>) -> Result<Json<Value>, ApiError> {
    blocking(move || {
        let runs: Vec<_> = s
            .runs
            .list()
            .into_iter()
            .filter_map(|name| {
                let dir = s.runs.resolve(&name).ok()?;
                Some(s.cache.with(&dir, |m| summarize(&name, &dir, m)))
            })
            .collect();
        Ok(Json(json!({
            "root": s.runs.root().display().to_string(),
            "runs": runs,
            "messages": [],
        })))
    })
    .await
}

/// `/api/run/NAME`, `/api/run/NAME/metrics`, `/api/run/NAME/rollouts`: the suffix decides,
/// as run names may hold `/`.
async fn run_route(
    State(s): State<AppState>,
    axum::extract::Path(rest): axum::extract::Path<String>,
    Query(q): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    if let Some(name) = rest.strip_suffix("/metrics") {
        let name = name.to_string();
        return metrics(s, name, q, headers).await;
    }
    if let Some(name) = rest.strip_suffix("/rollouts") {
        let name = name.to_string();
        return blocking(move || rollouts(&s, &name, &q)).await;
    }
    blocking(move || {
        let dir = s.runs.resolve(&rest)?;
        Ok(Json(s.cache.with(&dir, |m| detail(&rest, &dir, m))).into_response())
    })
    .await
}

/// The `x` and `points` arguments.
fn axis_args(
    q: &HashMap<String, String>,
    default_points: usize,
) -> Result<(bool, usize), ApiError> {
    let wall = match q.get("x").map(String::as_str) {
        None | Some("step") => false,
        Some("wall") => true,
        Some(other) => {
            return Err(DashboardError::BadArgument {
                name: "x",
                expected: "`step` or `wall`",
                got: other.to_string(),
            }
            .into())
        }
    };
    let points = match q.get("points") {
        None => default_points,
        Some(p) => p
            .parse::<usize>()
            .ok()
            .filter(|n| (4..=MAX_POINTS).contains(n))
            .ok_or_else(|| DashboardError::BadArgument {
                name: "points",
                expected: "an integer from 4 to 20000",
                got: p.clone(),
            })?,
    };
    Ok((wall, points))
}

/// A run's curves, downsampled, with an `ETag` so that polling an unchanged run costs a 304.
async fn metrics(
    s: AppState,
    name: String,
    q: HashMap<String, String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let (wall, points) = axis_args(&q, DEFAULT_POINTS)?;
    blocking(move || {
        let dir = s.runs.resolve(&name)?;
        let if_none_match = headers
            .get(header::IF_NONE_MATCH)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let response = s.cache.with(&dir, |m| {
            let etag = format!("\"{}-{}-{points}\"", m.version(), u8::from(wall));
            if if_none_match.as_deref() == Some(etag.as_str()) {
                return StatusCode::NOT_MODIFIED.into_response();
            }
            let body = metrics_body(m, wall, points);
            ([(header::ETAG, etag)], Json(body)).into_response()
        });
        Ok(response)
    })
    .await
}

/// The JSON of a run's curves (wall time falls back to steps for runs without it).
fn metrics_body(m: &RunMetrics, wall: bool, points: usize) -> Value {
    let mut messages = m.messages();
    let has_wall = m.wall_times().iter().any(|t| t.is_finite());
    let wall = if wall && !has_wall {
        messages.push(
            "this run's rows have no wall time (a run from before runs logged it): steps shown"
                .into(),
        );
        false
    } else {
        wall
    };
    json!({
        "rows": m.steps().len(),
        "version": m.version(),
        "x": if wall { "wall" } else { "step" },
        "series": series(m, wall, points),
        "messages": messages,
    })
}

/// Every curve of `m`, downsampled to `points`.
fn series(m: &RunMetrics, wall: bool, points: usize) -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    m.for_each_curve(wall, |name, xs, ys| {
        let (x, y) = min_max_downsample(xs, ys, points);
        out.insert(name.to_string(), json!({ "x": x, "y": y }));
    });
    out
}

/// The steps with logged completions, or one step's records.
fn rollouts(s: &AppState, name: &str, q: &HashMap<String, String>) -> Result<Response, ApiError> {
    let dir = s.runs.resolve(name)?;
    let r = Rollouts::read(&dir);
    let body = match q.get("step") {
        None => json!({ "steps": r.steps(), "messages": r.messages }),
        Some(step) => {
            let step = step
                .parse::<u64>()
                .map_err(|_| DashboardError::BadArgument {
                    name: "step",
                    expected: "a step number",
                    got: step.clone(),
                })?;
            json!({ "step": step, "records": r.at(step), "messages": r.messages })
        }
    };
    Ok(Json(body).into_response())
}

/// Runs side by side: the configuration keys that differ, each metric's final and best value,
/// and their curves.
async fn compare(
    State(s): State<AppState>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
    let (wall, points) = axis_args(&q, 500)?;
    let names: Vec<String> = q
        .get("runs")
        .map(|r| {
            r.split(',')
                .filter(|n| !n.is_empty())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    if names.is_empty() || names.len() > MAX_COMPARED {
        return Err(DashboardError::BadArgument {
            name: "runs",
            expected: "1 to 64 run names, comma-separated",
            got: q.get("runs").cloned().unwrap_or_default(),
        }
        .into());
    }
    blocking(move || {
        let dirs = names
            .iter()
            .map(|n| s.runs.resolve(n))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Json(compare_body(&s, &names, &dirs, wall, points)))
    })
    .await
}

/// What one compared run contributes.
struct Compared {
    config: BTreeMap<String, String>,
    finals: BTreeMap<String, Value>,
    series: BTreeMap<String, Value>,
    messages: Vec<String>,
}

/// The comparison of the runs `names` in `dirs` (read in parallel).
fn compare_body(
    s: &AppState,
    names: &[String],
    dirs: &[PathBuf],
    wall: bool,
    points: usize,
) -> Value {
    let runs: Vec<Compared> = dirs
        .par_iter()
        .zip(names)
        .map(|(dir, name)| {
            let mut messages = Vec::new();
            let config = read_config(dir, &mut messages)
                .map(|c| c.keys)
                .unwrap_or_default();
            s.cache.with(dir, |m| {
                let finals = m
                    .columns()
                    .filter_map(|(metric, _)| {
                        let (last, (best, step)) =
                            atomrl_metrics::final_and_best(&m.finite_points(metric), metric)?;
                        Some((
                            metric.to_string(),
                            json!({ "final": last, "best": best, "best_step": step }),
                        ))
                    })
                    .collect();
                messages.extend(m.messages());
                Compared {
                    config,
                    finals,
                    series: series(m, wall, points),
                    messages: messages
                        .into_iter()
                        .map(|msg| format!("{name}: {msg}"))
                        .collect(),
                }
            })
        })
        .collect();
    let configs: Vec<&BTreeMap<String, String>> = runs.iter().map(|r| &r.config).collect();
    let differing: Vec<Value> = atomrl_config::differing_keys(&configs)
        .into_iter()
        .map(|k| {
            let values: Vec<Value> = runs.iter().map(|r| json!(r.config.get(&k))).collect();
            json!({ "key": k, "values": values })
        })
        .collect();
    let metric_names: std::collections::BTreeSet<&String> =
        runs.iter().flat_map(|r| r.series.keys()).collect();
    let metrics: Vec<Value> = metric_names
        .iter()
        .map(|m| {
            let values: Vec<Value> = runs.iter().map(|r| json!(r.finals.get(*m))).collect();
            json!({ "metric": m, "values": values })
        })
        .collect();
    let series: BTreeMap<&String, Vec<Value>> = metric_names
        .iter()
        .map(|m| (*m, runs.iter().map(|r| json!(r.series.get(*m))).collect()))
        .collect();
    json!({
        "runs": names,
        "differing": differing,
        "metrics": metrics,
        "series": series,
        "messages": runs.iter().flat_map(|r| r.messages.clone()).collect::<Vec<_>>(),
    })
}
