//! The built-in rewards as [`RewardFn`] implementors, and their construction by name.

use atomrl_core::{Error, Result};
use candle_core::Tensor;
use serde_json::{Map, Value};

use crate::batch::{check_len, rewards_tensor};
use crate::correctness::{correctness_reward, digit_reward, CorrectnessOptions};
use crate::extract::{AnswerSource, ExtractOptions};
use crate::format::{hard_format_reward, mark_reward, soft_format_reward, MarkOptions};
use crate::overlong::{overlong_penalty_one, OverlongOptions, OverlongVariant};
use crate::reward_fn::{RewardContext, RewardFn};
use crate::steps::step_reward;
use crate::tags::Tags;

/// The names [`reward_fn_by_name`] accepts (each also under its `atomrl-fn` name, e.g.
/// `correctness_reward`, `overlong_penalty`).
pub const REWARD_NAMES: [&str; 7] = [
    "correctness",
    "digit",
    "hard_format",
    "soft_format",
    "mark",
    "overlong",
    "steps",
];

/// [`correctness_reward`] as a [`RewardFn`] named `correctness`; needs `ground_truth`.
///
/// # Example
/// ```
/// use atomrl_reward::{Correctness, RewardContext, RewardFn};
/// let ctx = RewardContext::new().with_ground_truth(["12"]);
/// let r = Correctness::default().score(&["#### 12".into()], &ctx)?;
/// assert_eq!(r.to_vec1::<f32>()?, vec![1.0]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Correctness {
    /// Options.
    pub opts: CorrectnessOptions,
}

impl RewardFn for Correctness {
    fn name(&self) -> &str {
        "correctness"
    }

    fn score(&self, completions: &[String], ctx: &RewardContext) -> Result<Tensor> {
        let gt = ctx.require_ground_truth(self.name())?;
        correctness_reward(completions, gt, &self.opts)
    }
}

/// [`digit_reward`] as a [`RewardFn`] named `digit`.
///
/// # Example
/// ```
/// use atomrl_reward::{Digit, RewardContext, RewardFn};
/// let r = Digit::default().score(&["<answer>5</answer>".into()], &RewardContext::new())?;
/// assert_eq!(r.to_vec1::<f32>()?, vec![1.0]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Digit {
    /// Extraction options.
    pub opts: ExtractOptions,
}

impl RewardFn for Digit {
    fn name(&self) -> &str {
        "digit"
    }

    fn score(&self, completions: &[String], _ctx: &RewardContext) -> Result<Tensor> {
        digit_reward(completions, &self.opts)
    }
}

/// [`hard_format_reward`] as a [`RewardFn`] named `hard_format`.
///
/// # Example
/// ```
/// use atomrl_reward::{HardFormat, RewardContext, RewardFn};
/// let r = HardFormat::default().score(&["<think>\na\n</think>\n<answer>\n1\n</answer>".into()], &RewardContext::new())?;
/// assert_eq!(r.to_vec1::<f32>()?, vec![1.0]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HardFormat {
    /// Tag names.
    pub tags: Tags,
}

impl RewardFn for HardFormat {
    fn name(&self) -> &str {
        "hard_format"
    }

    fn score(&self, completions: &[String], _ctx: &RewardContext) -> Result<Tensor> {
        hard_format_reward(completions, &self.tags)
    }
}

/// [`step_reward`] as a [`RewardFn`] named `steps`: partial credit for correct arithmetic steps
/// built from the prompt's numbers (`grounded = false`: arithmetic only, prompts not needed).
///
/// # Example
/// ```
/// use atomrl_reward::{RewardContext, RewardFn, Steps};
/// let ctx = RewardContext::new().with_prompts(["3 boxes of 4"]);
/// let r = Steps::default().score(&["<think>\n3*4=12\n</think>".into()], &ctx)?;
/// assert_eq!(r.to_vec1::<f32>()?, vec![1.0]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Steps {
    /// Whether operands must come from the prompt or earlier steps (needs prompts).
    pub grounded: bool,
}

impl Default for Steps {
    fn default() -> Self {
        Self { grounded: true }
    }
}

impl RewardFn for Steps {
    fn name(&self) -> &str {
        "steps"
    }

    fn score(&self, completions: &[String], ctx: &RewardContext) -> Result<Tensor> {
        let prompts = if self.grounded {
            Some(ctx.require_prompts(self.name())?)
        } else {
            None
        };
        step_reward(completions, prompts)
    }
}

/// [`soft_format_reward`] as a [`RewardFn`] named `soft_format`.
///
/// # Example
/// ```
/// use atomrl_reward::{RewardContext, RewardFn, SoftFormat};
/// let r = SoftFormat::default().score(&["<think></think><answer></answer>".into()], &RewardContext::new())?;
/// assert_eq!(r.to_vec1::<f32>()?, vec![1.0]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SoftFormat {
    /// Tag names.
    pub tags: Tags,
}

impl RewardFn for SoftFormat {
    fn name(&self) -> &str {
        "soft_format"
    }

    fn score(&self, completions: &[String], _ctx: &RewardContext) -> Result<Tensor> {
        soft_format_reward(completions, &self.tags)
    }
}

/// [`mark_reward`] as a [`RewardFn`] named `mark`.
///
/// # Example
/// ```
/// use atomrl_reward::{Mark, RewardContext, RewardFn};
/// let r = Mark::default().score(&["<think>\n".into()], &RewardContext::new())?;
/// assert_eq!(r.to_vec1::<f32>()?, vec![0.125]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Mark {
    /// Options.
    pub opts: MarkOptions,
}

impl RewardFn for Mark {
    fn name(&self) -> &str {
        "mark"
    }

    fn score(&self, completions: &[String], _ctx: &RewardContext) -> Result<Tensor> {
        mark_reward(completions, &self.opts)
    }
}

/// [`overlong_penalty`](crate::overlong_penalty) as a [`RewardFn`] named `overlong`, on the
/// context's `completion_lengths`; `max_len` defaults to the context's
/// `max_completion_length`.
///
/// # Example
/// ```
/// use atomrl_reward::{OverlongPenalty, RewardContext, RewardFn};
/// let p = OverlongPenalty::new(4);
/// let ctx = RewardContext::new().with_completion_lengths(vec![10, 15]).with_max_completion_length(16);
/// assert_eq!(p.score(&["a".into(), "b".into()], &ctx)?.to_vec1::<f32>()?, vec![0.0, -0.75]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OverlongPenalty {
    /// Maximum completion length; `None` takes the context's `max_completion_length`.
    pub max_len: Option<usize>,
    /// Soft-punishment buffer length.
    pub buffer_len: usize,
    /// Penalty at `max_len` (default 1.0).
    pub penalty_factor: f64,
    /// Behaviour beyond `max_len`.
    pub variant: OverlongVariant,
}

impl OverlongPenalty {
    /// verl's formula with the given buffer, factor 1.0 and `max_len` from the context.
    pub fn new(buffer_len: usize) -> Self {
        Self {
            max_len: None,
            buffer_len,
            penalty_factor: 1.0,
            variant: OverlongVariant::Dapo,
        }
    }
}

impl RewardFn for OverlongPenalty {
    fn name(&self) -> &str {
        "overlong"
    }

    fn score(&self, completions: &[String], ctx: &RewardContext) -> Result<Tensor> {
        let lengths = ctx.require_completion_lengths(self.name())?;
        check_len(
            self.name(),
            "completion_lengths",
            lengths.len(),
            completions.len(),
        )?;
        let max_len = self.max_len.or(ctx.max_completion_length).ok_or_else(|| {
            Error::missing(
                self.name(),
                "max_len",
                "an option or the RewardContext's max_completion_length",
            )
        })?;
        let opts = OverlongOptions {
            max_len,
            buffer_len: self.buffer_len,
            penalty_factor: self.penalty_factor,
            variant: self.variant,
        };
        opts.validate()?;
        let values = lengths
            .iter()
            .enumerate()
            .map(|(i, &len)| {
                overlong_penalty_one(len, &opts)
                    .map(|p| p as f32)
                    .ok_or_else(|| {
                        Error::value(
                            self.name(),
                            format!("completion_lengths[{i}]"),
                            format!("<= max_len = {max_len}"),
                            len,
                        )
                    })
            })
            .collect::<Result<Vec<f32>>>()?;
        rewards_tensor(self.name(), values)
    }
}

/// Reads the options object of one reward and rejects keys it does not use.
pub(crate) struct Options<'a> {
    func: &'static str,
    map: Option<&'a Map<String, Value>>,
    used: Vec<&'static str>,
}

impl<'a> Options<'a> {
    pub(crate) fn new(func: &'static str, options: &'a Value) -> Result<Self> {
        let map = match options {
            Value::Null => None,
            Value::Object(m) => Some(m),
            other => return Err(Error::value(func, "options", "a JSON object", other)),
        };
        Ok(Self {
            func,
            map,
            used: Vec::new(),
        })
    }

    fn get(&mut self, key: &'static str) -> Option<&'a Value> {
        self.used.push(key);
        self.map.and_then(|m| m.get(key)).filter(|v| !v.is_null())
    }

    fn bool(&mut self, key: &'static str, default: bool) -> Result<bool> {
        let func = self.func;
        self.get(key).map_or(Ok(default), |v| {
            v.as_bool()
                .ok_or_else(|| Error::value(func, key, "true or false", v))
        })
    }

    fn f64(&mut self, key: &'static str) -> Result<Option<f64>> {
        let func = self.func;
        self.get(key)
            .map(|v| {
                v.as_f64()
                    .ok_or_else(|| Error::value(func, key, "a number", v))
            })
            .transpose()
    }

    fn usize(&mut self, key: &'static str) -> Result<Option<usize>> {
        let func = self.func;
        self.get(key)
            .map(|v| {
                v.as_u64()
                    .map(|x| x as usize)
                    .ok_or_else(|| Error::value(func, key, "a non-negative integer", v))
            })
            .transpose()
    }

    fn str(&mut self, key: &'static str) -> Result<Option<&'a str>> {
        let func = self.func;
        self.get(key)
            .map(|v| {
                v.as_str()
                    .ok_or_else(|| Error::value(func, key, "a string", v))
            })
            .transpose()
    }

    pub(crate) fn tags(&mut self) -> Result<Tags> {
        let think = self.str("think_tag")?.unwrap_or("think");
        let answer = self.str("answer_tag")?.unwrap_or("answer");
        Tags::new(think, answer)
    }

    pub(crate) fn order(&mut self) -> Result<Vec<AnswerSource>> {
        let func = self.func;
        match self.get("order") {
            None => Ok(AnswerSource::DEFAULT_ORDER.to_vec()),
            Some(Value::String(s)) => AnswerSource::parse_order(s),
            Some(Value::Array(items)) => {
                let names = items
                    .iter()
                    .map(|x| {
                        x.as_str().ok_or_else(|| {
                            Error::value(func, "order", "an array of source names", x)
                        })
                    })
                    .collect::<Result<Vec<_>>>()?;
                AnswerSource::order_from_names(&names)
            }
            Some(other) => Err(Error::value(
                func,
                "order",
                "a comma-separated string or an array of source names",
                other,
            )),
        }
    }

    pub(crate) fn extract(&mut self) -> Result<ExtractOptions> {
        Ok(ExtractOptions {
            order: self.order()?,
            tags: self.tags()?,
        })
    }

    pub(crate) fn correctness(&mut self) -> Result<CorrectnessOptions> {
        let o = CorrectnessOptions {
            extract: self.extract()?,
            strict: self.bool("strict", false)?,
            tolerance: self.f64("tolerance")?.unwrap_or(crate::DEFAULT_TOLERANCE),
        };
        o.validate()?;
        Ok(o)
    }

    pub(crate) fn mark(&mut self) -> Result<MarkOptions> {
        let d = MarkOptions::default();
        let o = MarkOptions {
            tags: self.tags()?,
            per_tag: self.f64("per_tag")?.map_or(d.per_tag, |x| x as f32),
            per_char: self.f64("per_char")?.map_or(d.per_char, |x| x as f32),
        };
        o.validate()?;
        Ok(o)
    }

    fn overlong(&mut self) -> Result<OverlongPenalty> {
        let func = self.func;
        Ok(OverlongPenalty {
            max_len: self.usize("max_len")?,
            buffer_len: self.usize("buffer_len")?.ok_or_else(|| {
                Error::missing(
                    func,
                    "buffer_len",
                    "the soft-punishment buffer length in tokens",
                )
            })?,
            penalty_factor: self.f64("penalty_factor")?.unwrap_or(1.0),
            variant: self.str("variant")?.unwrap_or("dapo").parse()?,
        })
    }

    /// Rejects keys that were not read.
    pub(crate) fn finish(self) -> Result<()> {
        if let Some(m) = self.map {
            if let Some(k) = m.keys().find(|k| !self.used.contains(&k.as_str())) {
                return Err(Error::UnknownArgument {
                    func: self.func.into(),
                    arg: k.clone(),
                    known: self.used.join(", "),
                });
            }
        }
        Ok(())
    }
}

/// Builds a built-in reward from its name and a JSON options object (`null` or `{}` for the
/// defaults), as a trainer config selects them.
///
/// | name | options (defaults) |
/// |---|---|
/// | `correctness` | `strict` (false), `order` (`"answer_tag,boxed,gsm8k,last_number"`, string or array), `tolerance` (1e-6), `think_tag` (`think`), `answer_tag` (`answer`) |
/// | `digit` | `order`, `think_tag`, `answer_tag` |
/// | `hard_format`, `soft_format` | `think_tag`, `answer_tag` |
/// | `mark` | `per_tag` (0.125), `per_char` (0.001), `think_tag`, `answer_tag` |
/// | `overlong` | `buffer_len` (required), `max_len` (the context's `max_completion_length`), `penalty_factor` (1.0), `variant` (`dapo` or `trl`) |
///
/// Each name is also accepted in its `atomrl-fn` form (`correctness_reward`, `digit_reward`,
/// `hard_format_reward`, `soft_format_reward`, `mark_reward`, `overlong_penalty`).
///
/// # Errors
/// [`Error::UnknownChoice`] for an unknown name, [`Error::UnknownArgument`] for an unknown
/// option, [`Error::Value`] / [`Error::Missing`] for invalid or missing option values.
///
/// # Example
/// ```
/// use atomrl_reward::{reward_fn_by_name, RewardContext};
/// let f = reward_fn_by_name("correctness", &serde_json::json!({"strict": true}))?;
/// assert_eq!(f.name(), "correctness");
/// let ctx = RewardContext::new().with_ground_truth(["12"]);
/// assert_eq!(f.score(&["12".into()], &ctx)?.to_vec1::<f32>()?, vec![0.0]);
/// assert!(reward_fn_by_name("correctnes", &serde_json::Value::Null).is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn reward_fn_by_name(name: &str, options: &Value) -> Result<Box<dyn RewardFn>> {
    let canonical = match name {
        "correctness" | "correctness_reward" => "correctness",
        "digit" | "digit_reward" => "digit",
        "hard_format" | "hard_format_reward" => "hard_format",
        "soft_format" | "soft_format_reward" => "soft_format",
        "mark" | "mark_reward" => "mark",
        "overlong" | "overlong_penalty" => "overlong",
        "steps" | "step_reward" => "steps",
        other => {
            return Err(Error::unknown_choice(
                "reward_fn_by_name",
                "name",
                &REWARD_NAMES,
                other,
            ))
        }
    };
    let func = REWARD_NAMES
        .iter()
        .find(|n| **n == canonical)
        .copied()
        .unwrap_or("reward_fn_by_name");
    let mut o = Options::new(func, options)?;
    let f: Box<dyn RewardFn> = match canonical {
        "correctness" => Box::new(Correctness {
            opts: o.correctness()?,
        }),
        "digit" => Box::new(Digit { opts: o.extract()? }),
        "hard_format" => Box::new(HardFormat { tags: o.tags()? }),
        "soft_format" => Box::new(SoftFormat { tags: o.tags()? }),
        "mark" => Box::new(Mark { opts: o.mark()? }),
        "steps" => Box::new(Steps {
            grounded: o.bool("grounded", true)?,
        }),
        _ => Box::new(o.overlong()?),
    };
    o.finish()?;
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_name_builds_and_unknown_options_are_rejected() {
        for name in REWARD_NAMES {
            let opts = if name == "overlong" {
                json!({"buffer_len": 4})
            } else {
                json!({})
            };
            assert_eq!(reward_fn_by_name(name, &opts).unwrap().name(), name);
        }
        let e = reward_fn_by_name("mark", &json!({"per_tags": 1}))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("unknown argument `per_tags`") && e.contains("per_tag"),
            "{e}"
        );
        let e = reward_fn_by_name("overlong", &json!({}))
            .unwrap_err()
            .to_string();
        assert!(e.contains("buffer_len"), "{e}");
        assert!(reward_fn_by_name("correctness", &json!({"order": ["boxed", "nope"]})).is_err());
        assert!(reward_fn_by_name("correctness", &json!([1])).is_err());
    }

    #[test]
    fn overlong_needs_lengths_and_max_len() {
        let f = OverlongPenalty::new(4);
        let no_len = f
            .score(&["a".into()], &RewardContext::new())
            .unwrap_err()
            .to_string();
        assert!(no_len.contains("completion_lengths"), "{no_len}");
        let ctx = RewardContext::new().with_completion_lengths(vec![3]);
        assert!(f
            .score(&["a".into()], &ctx)
            .unwrap_err()
            .to_string()
            .contains("max_len"));
        let ctx = ctx.with_max_completion_length(2);
        assert!(f.score(&["a".into()], &ctx).is_err());
    }
}
