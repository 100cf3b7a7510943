//! What AtomRL's examples share (they live beside this file: `grpo_gsm8k/`, `grpo_tools/`; run
//! them with `cargo run --release --example NAME`): the run options every example takes and
//! the process wrapper.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Counts allocations for `ATOMRL_PROFILE=1` runs (one atomic load per allocation otherwise).
#[global_allocator]
static ALLOCATOR: atomrl_core::profile::CountingAllocator = atomrl_core::profile::CountingAllocator;

/// The options of a run that every example takes besides its own: device, length, extra
/// configuration, resuming.
#[derive(clap::Args, Debug, Clone)]
pub struct RunOptions {
    /// `cpu`, `cuda` or `cuda:N`.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Optimizer steps (default: the example's, ended early by its time budget on a slower
    /// machine; the recipe's for a real model).
    #[arg(long)]
    pub max_steps: Option<usize>,
    /// Stop training after this many seconds (0 = no limit).
    #[arg(long)]
    pub time_budget_s: Option<f64>,
    /// A TOML file of further options (any key of atomrl-train's configuration).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Override one option: `--set lr=2e-4 --set num_generations=16`.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Continue from the latest checkpoint in the output folder.
    #[arg(long)]
    pub resume: bool,
}

impl RunOptions {
    /// The `key=value` overrides these options make, to put after an example's own defaults:
    /// the device (one data-parallel worker off the CPU), the output folder, the steps (an
    /// explicit `--max-steps` lifts the time budget unless one is given too), resuming, and
    /// last every `--set`, so that the user's word wins.
    ///
    /// ```
    /// use atomrl_examples::RunOptions;
    /// use clap::Parser;
    /// #[derive(Parser)]
    /// struct Cli {
    ///     #[command(flatten)]
    ///     run: RunOptions,
    /// }
    /// let cli = Cli::parse_from(["x", "--max-steps", "5", "--set", "lr=1e-4"]);
    /// let o = cli.run.overrides("runs/x".as_ref());
    /// assert_eq!(o, ["device=\"cpu\"", "output_dir=\"runs/x\"", "max_steps=5", "time_budget_s=0", "lr=1e-4"]);
    /// ```
    pub fn overrides(&self, output_dir: &Path) -> Vec<String> {
        let mut o = Vec::new();
        if !self.device.starts_with("cpu") {
            // Data-parallel workers are a CPU feature (the default plan uses one per core).
            o.push("workers=1".into());
        }
        o.push(quoted("device", &self.device));
        o.push(quoted("output_dir", &output_dir.display().to_string()));
        if let Some(n) = self.max_steps {
            o.push(format!("max_steps={n}"));
            if self.time_budget_s.is_none() {
                o.push("time_budget_s=0".into());
            }
        }
        if let Some(t) = self.time_budget_s {
            o.push(format!("time_budget_s={t}"));
        }
        if self.resume {
            o.push("resume=\"auto\"".into());
        }
        o.extend(self.set.iter().cloned());
        o
    }
}

/// The model and data options of the GSM8K-style examples (`grpo_gsm8k`, `ppo_gsm8k`,
/// `dpo_gsm8k`).
#[derive(clap::Args, Debug, Clone)]
pub struct MathsData {
    /// Model: a local Hugging Face folder or a hub id (default: the embedded tiny model).
    #[arg(long)]
    pub model: Option<String>,
    /// Training data: a JSONL/parquet file, a hub dataset id (`openai/gsm8k`) or `synthetic`.
    #[arg(long)]
    pub dataset: Option<String>,
    /// Held-out data (default: the dataset's test split; synthetic: its own held-out problems).
    #[arg(long)]
    pub eval_dataset: Option<String>,
}

impl MathsData {
    /// The run's model and data ([`choose_model`] with the embedded model of `embedded_dir`,
    /// built by `cargo xtask tiny-model`) and their overrides ([`data_overrides`]).
    ///
    /// # Errors
    /// The embedded model is missing.
    ///
    /// ```
    /// use atomrl_examples::MathsData;
    /// let d = MathsData { model: Some("m".into()), dataset: None, eval_dataset: None };
    /// let (choice, o) = d.choose("no/such/dir")?;
    /// assert!(!choice.embedded && o[1] == "dataset=\"openai/gsm8k\"");
    /// # Ok::<(), anyhow::Error>(())
    /// ```
    pub fn choose(&self, embedded_dir: &str) -> anyhow::Result<(ModelChoice, Vec<String>)> {
        let choice = choose_model(
            self.model.as_deref(),
            self.dataset.as_deref(),
            embedded_dir,
            "cargo xtask tiny-model",
        )?;
        let overrides = data_overrides(&choice, self.eval_dataset.as_deref());
        Ok((choice, overrides))
    }
}

/// The model and data of an example's run (see [`choose_model`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelChoice {
    /// No `--model` was given: the embedded model runs, on the synthetic problems by default.
    pub embedded: bool,
    /// The model folder or hub id.
    pub model: String,
    /// The dataset spec.
    pub dataset: String,
}

/// The model and dataset of a run: without `model`, the embedded model in `embedded_dir`
/// (which must hold its weights) on the `synthetic` problems; with one, that model on
/// `openai/gsm8k`; a given `dataset` wins either way.
///
/// # Errors
/// The embedded model is missing: the error names its folder and `build_cmd`, the command
/// that builds it.
///
/// ```
/// use atomrl_examples::choose_model;
/// let real = choose_model(Some("Qwen/Qwen2.5-0.5B-Instruct"), None, "no/such/dir", "cargo xtask tiny-model")?;
/// assert_eq!((real.embedded, real.dataset.as_str()), (false, "openai/gsm8k"));
/// let err = choose_model(None, None, "no/such/dir", "cargo xtask tiny-model").unwrap_err();
/// assert!(err.to_string().contains("cargo xtask tiny-model"));
/// # Ok::<(), anyhow::Error>(())
/// ```
pub fn choose_model(
    model: Option<&str>,
    dataset: Option<&str>,
    embedded_dir: &str,
    build_cmd: &str,
) -> anyhow::Result<ModelChoice> {
    let embedded = model.is_none();
    if embedded && !Path::new(embedded_dir).join("model.safetensors").is_file() {
        anyhow::bail!(
            "the embedded model is missing from {embedded_dir}; build it with `{build_cmd}`"
        );
    }
    let default_dataset = if embedded {
        "synthetic"
    } else {
        "openai/gsm8k"
    };
    Ok(ModelChoice {
        embedded,
        model: model.unwrap_or(embedded_dir).to_string(),
        dataset: dataset.unwrap_or(default_dataset).to_string(),
    })
}

/// The system prompt of the real GSM8K recipes: asks for the answer format the rewards check.
pub const GSM8K_FORMAT_PROMPT: &str =
    "Solve the problem step by step. Write your reasoning inside <think>\n...\n</think> \
and then the final number only inside <answer>\n...\n</answer>.";

/// The overrides of a maths example's model and data: the model, the dataset, the held-out
/// data (`eval_dataset`, else the dataset's own held-out part), and for a real model the
/// system prompt asking for the answer format ([`GSM8K_FORMAT_PROMPT`]).
///
/// ```
/// use atomrl_examples::{data_overrides, ModelChoice};
/// let choice = ModelChoice { embedded: true, model: "m".into(), dataset: "synthetic".into() };
/// assert_eq!(data_overrides(&choice, None), ["model=\"m\"", "dataset=\"synthetic\"", "eval_dataset=\"synthetic\""]);
/// ```
pub fn data_overrides(choice: &ModelChoice, eval_dataset: Option<&str>) -> Vec<String> {
    let mut o = vec![
        quoted("model", &choice.model),
        quoted("dataset", &choice.dataset),
        quoted("eval_dataset", eval_dataset.unwrap_or(&choice.dataset)),
    ];
    if !choice.embedded {
        o.push(quoted("system_prompt", GSM8K_FORMAT_PROMPT));
    }
    o
}

/// `key="value"`, a TOML string override.
///
/// ```
/// assert_eq!(atomrl_examples::quoted("model", "a/b"), "model=\"a/b\"");
/// ```
pub fn quoted(key: &str, value: &str) -> String {
    format!("{key}={value:?}")
}

/// Runs an example's `run` the way every AtomRL binary does: the allocator tuned first, and an
/// error printed as one `error:` line with exit status 2.
///
/// ```
/// assert_eq!(atomrl_examples::main_with(|| Ok(())), std::process::ExitCode::SUCCESS);
/// ```
pub fn main_with(run: impl FnOnce() -> anyhow::Result<()>) -> ExitCode {
    atomrl_trainer::runtime::tune_allocator();
    match atomrl_trainer::runtime::cblas_from_env()
        .map_err(anyhow::Error::from)
        .and_then(|()| run())
    {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}
