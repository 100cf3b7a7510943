//! The sweep file: the base run, the search space, the objective, the trials and their budget.
//!
//! ```toml
//! [sweep]
//! base = "tiny.toml"        # a run configuration (relative to this file); optional
//! recipe = "grpo"           # the preset under it; optional (the base's, else GRPO)
//! output_dir = "runs/sweep"
//! trials = 12
//! parallel = 2              # trials at once on this machine (each gets cores / parallel)
//! sampler = "tpe"           # grid | random | tpe
//! seed = 0
//! budget_steps = 200        # per trial: max_steps; or budget_seconds = 60 (time_budget_s)
//!
//! [sweep.objective]         # default: the held-out accuracy at the end
//! metric = "eval/accuracy"
//! mode = "max"              # max | min
//! at = "end"                # end | best
//!
//! [sweep.asha]              # optional early stopping
//! min_steps = 50
//! reduction_factor = 3
//!
//! [base]                    # run keys on top of the base file
//! eval_size = 100
//!
//! [search]
//! lr = { log_uniform = [1e-5, 1e-3] }
//! ```

use std::path::{Path, PathBuf};

use atomrl_config::{load_args, GRPOArgs, Recipe};

use crate::asha::Asha;
use crate::error::{Result, SweepError};
use crate::objective::{At, Mode, Objective};
use crate::sampler::{Sampler, SamplerKind};
use crate::space::{parse_search, Param};

/// Keys of the `[sweep]` table.
const SWEEP_KEYS: [&str; 15] = [
    "base",
    "baseline",
    "recipe",
    "output_dir",
    "trials",
    "parallel",
    "sampler",
    "seed",
    "startup_trials",
    "grid_points",
    "budget_steps",
    "budget_seconds",
    "objective",
    "asha",
    "name",
];

/// A parsed sweep file.
#[derive(Debug, Clone)]
pub struct SweepConfig {
    /// The base run file (absolute), if any.
    pub base_file: Option<PathBuf>,
    /// The preset under the base.
    pub recipe: Option<Recipe>,
    /// Run keys on top of the base file (`[base]`), as `key=value` overrides.
    pub base_overrides: Vec<String>,
    /// Where the trials' folders and the reports go.
    pub output_dir: PathBuf,
    /// How many trials.
    pub trials: usize,
    /// Trials at once on this machine (per MPI rank).
    pub parallel: usize,
    /// The sampler.
    pub sampler: Sampler,
    /// A trial's budget in optimizer steps (`max_steps`).
    pub budget_steps: Option<usize>,
    /// A trial's budget in seconds (`time_budget_s`).
    pub budget_seconds: Option<f64>,
    /// What is optimised.
    pub objective: Objective,
    /// Early stopping, if any.
    pub asha: Option<Asha>,
    /// The searched keys.
    pub search: Vec<Param>,
    /// Whether trial 0 runs the base configuration's own values of the searched keys (the
    /// hand-tuned settings the sweep is measured against), as Optuna's `enqueue_trial`.
    pub baseline: bool,
}

fn get_usize(t: &toml::Table, key: &str, default: usize, min: usize) -> Result<usize> {
    get_usize_in(t, "sweep", key, Some(default), min)
}

/// `prefix.key` as an integer `>= min`; `default` when absent (`None`: required).
fn get_usize_in(
    t: &toml::Table,
    prefix: &str,
    key: &str,
    default: Option<usize>,
    min: usize,
) -> Result<usize> {
    let name = format!("{prefix}.{key}");
    match (t.get(key), default) {
        (None, Some(d)) => Ok(d),
        (None, None) => Err(SweepError::config(
            name,
            format!("an integer >= {min}"),
            "nothing",
        )),
        (Some(v), _) => v
            .as_integer()
            .filter(|&i| i >= min as i64)
            .map(|i| i as usize)
            .ok_or_else(|| SweepError::config(name, format!("an integer >= {min}"), v)),
    }
}

fn get_str<'a>(t: &'a toml::Table, key: &str, prefix: &str) -> Result<Option<&'a str>> {
    match t.get(key) {
        None => Ok(None),
        Some(toml::Value::String(s)) => Ok(Some(s)),
        Some(v) => Err(SweepError::config(format!("{prefix}.{key}"), "a string", v)),
    }
}

impl SweepConfig {
    /// Reads and checks a sweep file: every key of `[sweep]`, the search space, and every
    /// searched value against the run configuration (an unknown key or a value of the wrong
    /// type for its key is an error naming `search.<key>`).
    ///
    /// # Errors
    /// An unreadable file, an unknown or bad key (named), a base configuration that does not
    /// load.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| SweepError::file(path, e))?;
        let table: toml::Table = toml::from_str(&text).map_err(|e| SweepError::file(path, e))?;
        let dir = path.parent().unwrap_or(Path::new("."));
        Self::from_table(&table, dir)
    }

    /// [`SweepConfig::load`] from a parsed table; relative paths are relative to `dir`.
    ///
    /// # Errors
    /// As [`SweepConfig::load`].
    pub fn from_table(table: &toml::Table, dir: &Path) -> Result<Self> {
        for key in table.keys() {
            if !["sweep", "base", "search"].contains(&key.as_str()) {
                return Err(SweepError::config(
                    key,
                    "one of the tables sweep, base, search",
                    key,
                ));
            }
        }
        let empty = toml::Table::new();
        let table_of = |key: &str| match table.get(key) {
            None => Ok(&empty),
            Some(toml::Value::Table(t)) => Ok(t),
            Some(v) => Err(SweepError::config(key, "a table", v)),
        };
        let s = table_of("sweep")?;
        if let Some(k) = s.keys().find(|k| !SWEEP_KEYS.contains(&k.as_str())) {
            return Err(SweepError::config(
                format!("sweep.{k}"),
                format!("one of {}", SWEEP_KEYS.join(", ")),
                k,
            ));
        }
        let base_file = get_str(s, "base", "sweep")?.map(|b| dir.join(b));
        let recipe = get_str(s, "recipe", "sweep")?
            .map(|r| r.parse::<Recipe>())
            .transpose()
            .map_err(|e| SweepError::config("sweep.recipe", "a recipe name", e))?;
        let base_overrides = atomrl_config::flatten_table(table_of("base")?)
            .into_iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let kind: SamplerKind = get_str(s, "sampler", "sweep")?.unwrap_or("tpe").parse()?;
        let seed = get_usize(s, "seed", 0, 0)? as u64;
        let trials = get_usize(s, "trials", 10, 1)?;
        if trials > MAX_TRIALS {
            return Err(SweepError::config(
                "sweep.trials",
                format!("at most {MAX_TRIALS}"),
                trials,
            ));
        }
        let objective = parse_objective(s.get("objective"))?;
        let sampler = Sampler {
            kind,
            seed,
            startup_trials: get_usize(s, "startup_trials", (trials / 3).clamp(2, 10), 1)?,
            grid_points: get_usize(s, "grid_points", 3, 1)?,
            maximize: objective.maximize(),
        };
        let (budget_steps, budget_seconds) = parse_budget(s)?;
        let asha = parse_asha(s.get("asha"))?;
        let output_dir = get_str(s, "output_dir", "sweep")?.unwrap_or("runs/sweep");
        if output_dir.trim().is_empty() {
            // The current folder: trial folders and reports among the user's files.
            return Err(SweepError::config(
                "sweep.output_dir",
                "a folder for the trials and reports",
                "an empty string",
            ));
        }
        let output_dir = PathBuf::from(output_dir);
        let config = Self {
            base_file,
            recipe,
            base_overrides,
            output_dir,
            trials,
            parallel: get_usize(s, "parallel", 1, 1)?,
            sampler,
            budget_steps,
            budget_seconds,
            objective,
            asha,
            search: parse_search(table_of("search")?)?,
            baseline: match s.get("baseline") {
                None => false,
                Some(toml::Value::Boolean(b)) => *b,
                Some(v) => return Err(SweepError::config("sweep.baseline", "true or false", v)),
            },
        };
        if let Some(n) = config.sampler.grid_size(&config.search) {
            if n < config.trials {
                return Err(SweepError::config(
                    "sweep.trials",
                    format!("at most the grid's {n} combinations"),
                    config.trials,
                ));
            }
        }
        config.check_search()?;
        Ok(config)
    }

    /// The run arguments of a trial with `params` (`key`, value) in `run_dir`.
    ///
    /// # Errors
    /// The configuration does not load with these values (the loader's error).
    pub fn trial_args(
        &self,
        params: &[(String, toml::Value)],
        run_dir: &Path,
    ) -> atomrl_core::Result<GRPOArgs> {
        load_args(
            self.base_file.as_deref(),
            self.recipe,
            &self.trial_overrides(params, run_dir),
        )
    }

    /// The `key=value` overrides of a trial: `[base]`, the budget, the early-stopping
    /// evaluation and checkpoint interval, the output folder, the threads of a parallel
    /// trial, then the searched values (which win).
    pub fn trial_overrides(&self, params: &[(String, toml::Value)], run_dir: &Path) -> Vec<String> {
        let mut o = self.base_overrides.clone();
        if let Some(steps) = self.budget_steps {
            o.push(format!("max_steps={steps}"));
        }
        if let Some(s) = self.budget_seconds {
            o.push(format!("time_budget_s={s}"));
        }
        if let Some(a) = self.asha {
            if self.objective.metric.starts_with("eval/") {
                o.push(format!("eval_steps={}", a.min_steps));
            }
            // A stopped trial keeps the checkpoint of its last rung.
            o.push(format!("save_steps={}", a.min_steps));
        }
        if self.parallel > 1 {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            o.push(format!("threads={}", (cores / self.parallel).max(1)));
            o.push("workers=1".into());
        }
        o.push(format!(
            "output_dir={}",
            toml::Value::String(run_dir.display().to_string())
        ));
        for (k, v) in params {
            o.push(format!("{k}={v}"));
        }
        o
    }

    /// Where trial `index` runs when the base runs on a GPU and `parallel > 1`: one GPU per
    /// concurrent trial, `cuda:(L·parallel + k mod parallel)` for this rank's `k`-th trial and
    /// its local rank `L` (trials running at once differ in `k` by less than `parallel`, so
    /// they get different GPUs). Empty on the CPU.
    pub fn placement(&self, index: usize, ranks: usize) -> Vec<String> {
        let on_gpu = self
            .trial_args(&[], &self.output_dir)
            .is_ok_and(|a| matches!(a.device, atomrl_core::DeviceSpec::Cuda(_)));
        if !on_gpu || self.parallel < 2 {
            return Vec::new();
        }
        let local = atomrl_dist::local_rank_from_env().unwrap_or(0);
        let gpu = local * self.parallel + (index / ranks.max(1)) % self.parallel;
        vec![format!("device=\"cuda:{gpu}\"")]
    }

    /// Loads the run configuration at each end of every range and with every choice, so that
    /// an unknown key or a value the key does not take fails before any trial.
    fn check_search(&self) -> Result<()> {
        let dir = self.output_dir.join("check");
        for p in &self.search {
            let probes = match p.cardinality() {
                Some(_) => p.grid(1),
                None => vec![p.value_at(0.0), p.value_at(1.0)],
            };
            for v in probes {
                self.trial_args(&[(p.key.clone(), v.clone())], &dir)
                    .map_err(|e| {
                        SweepError::config(
                            format!("search.{}", p.key),
                            "values the run configuration takes",
                            format!("{v}: {e}"),
                        )
                    })?;
            }
        }
        Ok(())
    }

    /// The base configuration's own values of the searched keys, with their unit coordinates
    /// (for the baseline trial).
    ///
    /// # Errors
    /// The base does not load, or a searched key's base value is outside its distribution's
    /// type (named).
    pub fn base_values(&self) -> Result<Vec<(f64, toml::Value)>> {
        let args = self
            .trial_args(&[], &self.output_dir)
            .map_err(|e| SweepError::config("sweep.base", "a run configuration that loads", e))?;
        let table = toml::Value::try_from(&args)
            .map_err(|e| SweepError::config("sweep.base", "a run configuration", e))?;
        self.search
            .iter()
            .map(|p| {
                let value = p.key.split('.').try_fold(&table, |t, k| t.get(k));
                value
                    .and_then(|v| Some((p.unit_of(v)?, v.clone())))
                    .ok_or_else(|| {
                        SweepError::config(
                            format!("search.{}", p.key),
                            "a distribution that holds the base value (sweep.baseline)",
                            value.map_or("no value".into(), |v| v.to_string()),
                        )
                    })
            })
            .collect()
    }

    /// The budget in steps a trial will run (for the rungs): `budget_steps`, else the base's
    /// `max_steps`.
    pub fn max_steps(&self) -> usize {
        self.budget_steps.unwrap_or_else(|| {
            self.trial_args(&[], &self.output_dir)
                .map_or(usize::MAX, |a| a.max_steps)
        })
    }
}

/// The most trials a sweep runs. Each is a training run and has a record in memory and on
/// disk; far past this is a typo (99999999999 was killed for its memory before any trial).
pub const MAX_TRIALS: usize = 100_000;

/// The longest `budget_seconds`, a year: a trial's time budget is also written into its run
/// configuration, and past this the number is not a duration anyone means.
pub const MAX_BUDGET_SECONDS: f64 = 365.0 * 24.0 * 3600.0;

/// `budget_steps` and `budget_seconds` of `[sweep]`.
fn parse_budget(s: &toml::Table) -> Result<(Option<usize>, Option<f64>)> {
    let seconds = match s.get("budget_seconds") {
        None => None,
        Some(v) => Some(
            v.as_float()
                .or_else(|| v.as_integer().map(|i| i as f64))
                .filter(|x| x.is_finite() && *x > 0.0 && *x <= MAX_BUDGET_SECONDS)
                .ok_or_else(|| {
                    let expected =
                        format!("a number > 0 and at most {MAX_BUDGET_SECONDS} (a year)");
                    SweepError::config("sweep.budget_seconds", expected, v)
                })?,
        ),
    };
    let steps = s
        .get("budget_steps")
        .map(|_| get_usize(s, "budget_steps", 0, 1))
        .transpose()?;
    Ok((steps, seconds))
}

/// `[sweep.asha]`, if present.
fn parse_asha(v: Option<&toml::Value>) -> Result<Option<Asha>> {
    match v {
        None => Ok(None),
        Some(toml::Value::Table(a)) => {
            if let Some(k) = a
                .keys()
                .find(|k| !["min_steps", "reduction_factor"].contains(&k.as_str()))
            {
                return Err(SweepError::config(
                    format!("sweep.asha.{k}"),
                    "min_steps or reduction_factor",
                    k,
                ));
            }
            Ok(Some(Asha {
                min_steps: get_usize_in(a, "sweep.asha", "min_steps", None, 1)?,
                reduction_factor: get_usize_in(a, "sweep.asha", "reduction_factor", Some(3), 2)?,
            }))
        }
        Some(v) => Err(SweepError::config("sweep.asha", "a table", v)),
    }
}

fn parse_objective(v: Option<&toml::Value>) -> Result<Objective> {
    let mut o = Objective::default();
    let Some(v) = v else { return Ok(o) };
    let t = v
        .as_table()
        .ok_or_else(|| SweepError::config("sweep.objective", "a table", v))?;
    for (k, v) in t {
        let text = v
            .as_str()
            .ok_or_else(|| SweepError::config(format!("sweep.objective.{k}"), "a string", v))?;
        match k.as_str() {
            "metric" if text.trim().is_empty() => {
                return Err(SweepError::config(
                    "sweep.objective.metric",
                    "a metrics.jsonl key (e.g. eval/accuracy)",
                    "an empty string",
                ))
            }
            "metric" => o.metric = text.to_string(),
            "mode" => {
                o.mode = match text {
                    "max" => Mode::Max,
                    "min" => Mode::Min,
                    _ => {
                        return Err(SweepError::config(
                            "sweep.objective.mode",
                            "max or min",
                            text,
                        ))
                    }
                }
            }
            "at" => {
                o.at = match text {
                    "end" => At::End,
                    "best" => At::Best,
                    _ => {
                        return Err(SweepError::config(
                            "sweep.objective.at",
                            "end or best",
                            text,
                        ))
                    }
                }
            }
            _ => {
                return Err(SweepError::config(
                    format!("sweep.objective.{k}"),
                    "metric, mode or at",
                    k,
                ))
            }
        }
    }
    Ok(o)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sweep(text: &str) -> Result<SweepConfig> {
        SweepConfig::from_table(&toml::from_str(text).unwrap(), Path::new("."))
    }

    const BASE: &str = "[base]\nmodel = \"m\"\ndataset = \"d.jsonl\"\n";

    #[test]
    fn concurrent_gpu_trials_get_different_gpus() {
        let cfg = sweep(&format!(
            "[sweep]\nparallel = 2\n{BASE}device = \"cuda\"\n[search]\nlr = {{ log_uniform = [1e-5, 1e-3] }}\n"
        ))
        .unwrap();
        let gpus: Vec<Vec<String>> = (0..4).map(|i| cfg.placement(i, 1)).collect();
        assert_eq!(gpus[0], ["device=\"cuda:0\""]);
        assert_eq!(gpus[1], ["device=\"cuda:1\""]);
        assert_eq!(gpus[2], gpus[0]);
        // Two ranks: rank r runs trials r, r + 2, ...; its consecutive trials alternate GPUs.
        assert_ne!(cfg.placement(0, 2), cfg.placement(2, 2));
        let cpu = sweep(&format!(
            "[sweep]\nparallel = 2\n{BASE}[search]\nlr = {{ uniform = [0.1, 0.2] }}\n"
        ))
        .unwrap();
        assert!(cpu.placement(1, 1).is_empty());
    }

    #[test]
    fn bad_sweep_keys_are_named() {
        for (text, key) in [
            ("[sweep]\ntrialz = 3\n", "sweep.trialz"),
            ("[sweep]\ntrials = 0\n", "sweep.trials"),
            ("[sweep]\ntrials = 99999999999\n", "sweep.trials"),
            ("[sweep]\nbudget_seconds = 1e300\n", "sweep.budget_seconds"),
            ("[sweep]\noutput_dir = \"\"\n", "sweep.output_dir"),
            (
                "[sweep.objective]\nmetric = \"\"\n",
                "sweep.objective.metric",
            ),
            ("[sweep]\nsampler = \"bayes\"\n", "sweep.sampler"),
            ("[sweep]\nbudget_seconds = -1\n", "sweep.budget_seconds"),
            (
                "[sweep.asha]\nreduction_factor = 3\n",
                "sweep.asha.min_steps",
            ),
            ("[sweep.objective]\nmode = \"up\"\n", "sweep.objective.mode"),
            ("[sweep]\nsampler = \"grid\"\ntrials = 5\n", "sweep.trials"),
        ] {
            let err = sweep(&format!(
                "{text}{BASE}[search]\nlr = {{ choice = [1e-3, 2e-3] }}\n"
            ))
            .unwrap_err()
            .to_string();
            assert!(err.starts_with(key), "{text}: {err}");
        }
    }
}
