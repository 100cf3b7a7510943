//! The weighted reward functions of a run, built from `[[rewards]]` and the overlong options.

use atomrl_core::{Error, Result};
use atomrl_reward::{reward_fn_by_name, Accuracy, RewardFn, WeightedRewards};

use super::args::GRPOArgs;

/// The name of the reward function that scores with a trained reward model (`path`).
pub const MODEL_REWARD: &str = "model";

/// The reward functions of `args`: each `[[rewards]]` entry by name, plus DAPO's soft overlong
/// penalty when `overlong_buffer_len` is set (> 0) and not already listed. A `model` entry
/// (a learned reward, [`MODEL_REWARD`]) needs the policy's tokenizer and device: it is checked
/// here (its `path`) and left out; [`build_rewards_with`] builds it.
///
/// # Errors
/// An unknown reward name or option, a bad weight, a `model` entry without `path` (or a `path`
/// on another entry), or an overlong buffer longer than `max_completion_length`.
pub fn build_rewards(args: &GRPOArgs) -> Result<WeightedRewards> {
    build_rewards_with(args, None)
}

/// A loader of `model` reward entries: the reward model at `path` as a reward function.
pub type ModelRewardLoader<'a> = &'a dyn Fn(&str) -> Result<Box<dyn RewardFn>>;

/// [`build_rewards`] with the `model` entries built by `load_model` (in their place in the
/// list), when given.
///
/// # Errors
/// As [`build_rewards`]; `load_model`'s.
///
/// ```
/// use atomrl_config::{build_rewards, build_rewards_with, load_args};
/// let run = |r: &str| load_args(None, None, &["model=\"m\"".into(), "dataset=\"d\"".into(), format!("rewards={r}")]);
/// let args = run(r#"[{name="correctness"}, {name="model", path="rm", weight=0.5}]"#)?;
/// assert_eq!(build_rewards(&args)?.names(), ["correctness"]);
/// let stub = |_: &str| atomrl_reward::reward_fn_by_name("digit", &serde_json::Value::Null);
/// assert_eq!(build_rewards_with(&args, Some(&stub))?.names(), ["correctness", "digit"]);
/// let err = run(r#"[{name="model"}]"#).unwrap_err().to_string();
/// assert!(err.contains("rewards[0].path"), "{err}");
/// # Ok::<(), atomrl_core::Error>(())
/// ```
pub fn build_rewards_with(
    args: &GRPOArgs,
    load_model: Option<ModelRewardLoader<'_>>,
) -> Result<WeightedRewards> {
    let mut out = WeightedRewards::new();
    for (i, r) in args.rewards.iter().enumerate() {
        let is_model = r.name == MODEL_REWARD;
        match (&r.path, is_model) {
            (None, true) => {
                return Err(Error::missing(
                    "config",
                    &format!("rewards[{i}].path"),
                    "the reward model's folder or hub id (`--recipe reward` writes checkpoint-N/reward_model)",
                ))
            }
            (Some(_), false) => {
                return Err(Error::value(
                    "config",
                    format!("rewards[{i}].path"),
                    "no `path` (only `name = \"model\"` reads one)",
                    &r.name,
                ))
            }
            _ => {}
        }
        let f = match (&r.path, load_model) {
            (Some(path), Some(load)) => load(path)?,
            (Some(_), None) => continue,
            (None, _) => {
                let options = serde_json::to_value(&r.options).map_err(|e| {
                    Error::value(
                        "config",
                        format!("rewards.{}.options", r.name),
                        "a table",
                        e,
                    )
                })?;
                reward_fn_by_name(&r.name, &options)?
            }
        };
        out.push(f, r.weight)?;
    }
    if let Some(buffer) = args.overlong_buffer_len.filter(|b| *b > 0) {
        if buffer > args.max_completion_length {
            return Err(Error::value(
                "config",
                "overlong_buffer_len",
                format!("<= max_completion_length = {}", args.max_completion_length),
                buffer,
            ));
        }
        if !args.rewards.iter().any(|r| r.name.starts_with("overlong")) {
            let options = serde_json::json!({
                "max_len": args.max_completion_length,
                "buffer_len": buffer,
                "penalty_factor": args.overlong_penalty_factor,
            });
            out.push(reward_fn_by_name("overlong", &options)?, 1.0)?;
        }
    }
    Ok(out)
}

/// The configured [`Accuracy`] (`[accuracy]`: reward, options, threshold), which training
/// metrics and evaluation both use.
///
/// # Errors
/// An unknown reward or option, a threshold that is not finite.
///
/// ```
/// use atomrl_config::{build_accuracy, GRPOArgs, Recipe};
/// assert_eq!(build_accuracy(&GRPOArgs::preset(Recipe::Grpo))?.name(), "correctness");
/// # Ok::<(), atomrl_core::Error>(())
/// ```
pub fn build_accuracy(args: &GRPOArgs) -> Result<Accuracy> {
    let spec = &args.accuracy;
    let options = serde_json::to_value(&spec.options)
        .map_err(|e| Error::value("config", "accuracy.options", "a table", e))?;
    Accuracy::from_config(&spec.reward, &options, spec.threshold)
}
