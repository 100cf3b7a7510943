//! The weighted reward functions of a run, built from `[[rewards]]` and the overlong options.

use atomrl_core::{Error, Result};
use atomrl_reward::{Accuracy, WeightedRewards};

use super::args::GRPOArgs;

/// The reward functions of `args`: each `[[rewards]]` entry by name, plus DAPO's soft overlong
/// penalty when `overlong_buffer_len` is set (> 0) and not already listed.
///
/// # Errors
/// An unknown reward name or option, a bad weight, or an overlong buffer longer than
/// `max_completion_length`.
pub fn build_rewards(args: &GRPOArgs) -> Result<WeightedRewards> {
    let mut config: Vec<serde_json::Value> = args
        .rewards
        .iter()
        .map(|r| {
            let options = serde_json::to_value(&r.options).map_err(|e| {
                Error::value(
                    "config",
                    format!("rewards.{}.options", r.name),
                    "a table",
                    e,
                )
            })?;
            Ok(serde_json::json!({"name": r.name, "weight": r.weight, "options": options}))
        })
        .collect::<Result<_>>()?;
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
            config.push(serde_json::json!({
                "name": "overlong",
                "weight": 1.0,
                "options": {
                    "max_len": args.max_completion_length,
                    "buffer_len": buffer,
                    "penalty_factor": args.overlong_penalty_factor,
                }
            }));
        }
    }
    WeightedRewards::from_config(&serde_json::Value::Array(config))
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
