//! One trial: its record (`trial-NNN/trial.json`, the sweep's source of truth, also read by
//! other MPI ranks), its plan (`trial.toml`: the run configuration as overrides), and the
//! child process that trains it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::rc::Rc;

use serde::{Deserialize, Serialize};

use crate::error::{Result, SweepError};

/// Where a trial stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Started and not ended (after a killed sweep: to be resumed).
    Running,
    /// Trained to its budget.
    Finished,
    /// Stopped early at a rung (its checkpoint kept).
    Pruned,
    /// Ended with an error, or without a finite objective.
    Failed,
}

impl Status {
    /// Whether the trial has ended.
    pub fn ended(self) -> bool {
        self != Status::Running
    }
}

/// A trial's record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrialRecord {
    /// The trial's number, from 0.
    pub index: usize,
    /// The searched keys and their values (TOML values as JSON).
    pub params: Vec<(String, serde_json::Value)>,
    /// The same in the samplers' unit coordinates.
    pub units: Vec<f64>,
    /// Where it stands.
    pub status: Status,
    /// The objective (at the end, or at the rung where it was stopped).
    pub objective: Option<f64>,
    /// The objective at each rung it reached: `(step, value)`.
    pub rungs: Vec<(usize, f64)>,
    /// Why it failed.
    pub error: Option<String>,
    /// Wall-clock seconds it ran (over all its attempts).
    pub seconds: f64,
}

/// The folder of trial `index`.
pub fn trial_dir(sweep_dir: &Path, index: usize) -> PathBuf {
    sweep_dir.join(format!("trial-{index:03}"))
}

impl TrialRecord {
    /// Reads `dir/trial.json` (`None` when absent).
    ///
    /// # Errors
    /// A corrupt record.
    pub fn read(dir: &Path) -> Result<Option<Self>> {
        let path = dir.join("trial.json");
        match std::fs::read_to_string(&path) {
            Ok(text) => serde_json::from_str(&text)
                .map(Some)
                .map_err(|e| SweepError::file(&path, e)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(SweepError::file(&path, e)),
        }
    }

    /// Writes `dir/trial.json` atomically (a temporary file renamed over it), so a reader never
    /// sees half a record.
    ///
    /// # Errors
    /// An unwritable folder.
    pub fn write(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|e| SweepError::file(dir, e))?;
        let path = dir.join("trial.json");
        let tmp = dir.join("trial.json.tmp");
        let text = serde_json::to_string_pretty(self).map_err(|e| SweepError::file(&path, e))?;
        std::fs::write(&tmp, text).map_err(|e| SweepError::file(&tmp, e))?;
        std::fs::rename(&tmp, &path).map_err(|e| SweepError::file(&path, e))
    }

    /// The parameters as TOML values.
    pub fn toml_params(&self) -> Vec<(String, toml::Value)> {
        self.params
            .iter()
            .map(|(k, v)| (k.clone(), json_to_toml(v)))
            .collect()
    }

    /// `key=value, ...` for messages.
    pub fn params_text(&self) -> String {
        self.toml_params()
            .iter()
            .map(|(k, v)| format!("{k}={}", short(v)))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// A value for a table cell or a message: floats with 4 significant digits.
pub fn short(v: &toml::Value) -> String {
    match v {
        toml::Value::Float(f) => format!("{f:.4e}")
            .parse::<f64>()
            .map_or_else(|_| f.to_string(), |x| format!("{x}")),
        other => other.to_string(),
    }
}

/// A TOML value as JSON.
pub fn toml_to_json(v: &toml::Value) -> serde_json::Value {
    serde_json::to_value(v).unwrap_or(serde_json::Value::Null)
}

fn json_to_toml(v: &serde_json::Value) -> toml::Value {
    match v {
        serde_json::Value::Bool(b) => toml::Value::Boolean(*b),
        serde_json::Value::Number(n) => match n.as_i64() {
            Some(i) => toml::Value::Integer(i),
            None => toml::Value::Float(n.as_f64().unwrap_or(f64::NAN)),
        },
        serde_json::Value::String(s) => toml::Value::String(s.clone()),
        serde_json::Value::Array(a) => toml::Value::Array(a.iter().map(json_to_toml).collect()),
        serde_json::Value::Object(o) => toml::Value::Table(
            o.iter()
                .map(|(k, v)| (k.clone(), json_to_toml(v)))
                .collect(),
        ),
        serde_json::Value::Null => toml::Value::String(String::new()),
    }
}

/// A trial's plan: what its process loads (`trial.toml`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrialPlan {
    /// The base run file, if any.
    pub base: Option<PathBuf>,
    /// The preset's name, if given.
    pub recipe: Option<String>,
    /// `key=value` overrides, in order.
    pub overrides: Vec<String>,
}

impl TrialPlan {
    /// Writes `dir/trial.toml`.
    ///
    /// # Errors
    /// An unwritable folder.
    pub fn write(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|e| SweepError::file(dir, e))?;
        let path = dir.join("trial.toml");
        let text = toml::to_string(self).map_err(|e| SweepError::file(&path, e))?;
        std::fs::write(&path, text).map_err(|e| SweepError::file(&path, e))
    }
}

/// How the sweep starts a trial's process: `program args... <trial dir>` (the sweep's own
/// binary with its hidden `--trial` flag, which calls [`trial_main`]).
#[derive(Debug, Clone)]
pub struct Launcher {
    /// The program.
    pub program: PathBuf,
    /// Its arguments before the trial folder.
    pub args: Vec<String>,
}

impl Launcher {
    /// This process's own binary with `--trial`.
    ///
    /// # Errors
    /// The binary's path is unknown.
    pub fn current_exe() -> Result<Self> {
        let program =
            std::env::current_exe().map_err(|e| SweepError::file("current executable", e))?;
        Ok(Self {
            program,
            args: vec!["--trial".into()],
        })
    }

    /// Starts trial `index` in `dir`, its output into `dir/log.txt`.
    ///
    /// # Errors
    /// The process cannot start.
    pub fn spawn(&self, index: usize, dir: &Path) -> Result<Child> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("log.txt"))
            .map_err(|e| SweepError::file(dir.join("log.txt"), e))?;
        let err = log
            .try_clone()
            .map_err(|e| SweepError::file(dir.join("log.txt"), e))?;
        Command::new(&self.program)
            .args(&self.args)
            .arg(dir)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .spawn()
            .map_err(|e| SweepError::Trial {
                trial: index,
                detail: format!("cannot start {}: {e}", self.program.display()),
            })
    }
}

/// The trial process: loads `dir/trial.toml` and trains the run in `dir` (resuming from its
/// last checkpoint when there is one). It ends when its parent, the sweep, ends, so a killed
/// sweep leaves no trial running behind it.
///
/// # Errors
/// The plan does not load or the run fails.
pub fn trial_main(dir: &Path) -> anyhow::Result<()> {
    atomrl_trainer::runtime::tune_allocator();
    atomrl_trainer::runtime::cblas_from_env()?;
    watch_parent();
    let path = dir.join("trial.toml");
    let text = std::fs::read_to_string(&path).map_err(|e| SweepError::file(&path, e))?;
    let plan: TrialPlan = toml::from_str(&text).map_err(|e| SweepError::file(&path, e))?;
    let recipe = plan
        .recipe
        .as_deref()
        .map(str::parse::<atomrl_config::Recipe>)
        .transpose()?;
    let mut overrides = plan.overrides;
    overrides.push("resume=\"auto\"".into());
    let args = atomrl_config::load_args(plan.base.as_deref(), recipe, &overrides)?;
    let comm: Rc<dyn atomrl_dist::Collective> = Rc::new(atomrl_dist::SingleProcess);
    let mut trainer = atomrl_trainer::run::build_trainer(args, comm)?;
    let summary = trainer.train()?;
    atomrl_trainer::run::print_summary(&summary);
    Ok(())
}

/// Exits this process when its parent does (it is then re-parented).
fn watch_parent() {
    let parent = std::os::unix::process::parent_id();
    std::thread::spawn(move || loop {
        std::thread::sleep(std::time::Duration::from_millis(500));
        if std::os::unix::process::parent_id() != parent {
            eprintln!("the sweep ended: stopping this trial (it resumes with the sweep)");
            std::process::exit(3);
        }
    });
}
