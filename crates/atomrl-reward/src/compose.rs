//! Weighted composition of several reward functions into a [`RewardBatch`].

use atomrl_core::shape::flat_f64;
use atomrl_core::{CandleContext, Error, Result, RewardBatch};
use candle_core::{Device, Tensor};
use serde_json::Value;

use crate::builtin::reward_fn_by_name;
use crate::reward_fn::{RewardContext, RewardFn};

const FUNC: &str = "compose_rewards";

struct Entry {
    label: String,
    f: Box<dyn RewardFn>,
    weight: f32,
}

/// A weighted sum of reward functions: `total = Σ_f weight_f · reward_f`, with each function's
/// unweighted rewards kept (as `per_fn`) for logging.
///
/// # Example
/// ```
/// use atomrl_reward::{Correctness, HardFormat, RewardContext, WeightedRewards};
///
/// let rewards = WeightedRewards::new()
///     .with(Correctness::default(), 1.0)?
///     .with(HardFormat::default(), 0.5)?;
/// let completions = vec!["<think>\n5+7\n</think>\n<answer>\n12\n</answer>".to_string(), "13".to_string()];
/// let ctx = RewardContext::new().with_ground_truth(["12", "12"]);
/// let batch = rewards.score(&completions, &ctx)?;
/// assert_eq!(batch.names, vec!["correctness", "hard_format"]);
/// assert_eq!(batch.total.to_vec1::<f32>()?, vec![1.5, 0.0]);
/// assert_eq!(batch.per_fn.to_vec2::<f32>()?, vec![vec![1.0, 1.0], vec![0.0, 0.0]]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Default)]
pub struct WeightedRewards {
    entries: Vec<Entry>,
}

impl std::fmt::Debug for WeightedRewards {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let items: Vec<(&str, f32)> = self
            .entries
            .iter()
            .map(|e| (e.label.as_str(), e.weight))
            .collect();
        f.debug_struct("WeightedRewards")
            .field("functions", &items)
            .finish()
    }
}

impl WeightedRewards {
    /// No functions yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `f` with `weight` (builder form of [`WeightedRewards::push`]).
    ///
    /// # Errors
    /// As [`WeightedRewards::push`].
    pub fn with(mut self, f: impl RewardFn + 'static, weight: f32) -> Result<Self> {
        self.push(Box::new(f), weight)?;
        Ok(self)
    }

    /// Adds `f` with `weight`, logged under `f.name()`.
    ///
    /// # Errors
    /// [`Error::Value`] when `weight` is not finite or the name is already used.
    pub fn push(&mut self, f: Box<dyn RewardFn>, weight: f32) -> Result<()> {
        let label = f.name().to_string();
        self.push_labeled(label, f, weight)
    }

    /// Adds `f` with `weight`, logged under `label` (to use one function twice with different
    /// options).
    ///
    /// # Errors
    /// [`Error::Value`] when `weight` is not finite or `label` is empty or already used.
    pub fn push_labeled(
        &mut self,
        label: impl Into<String>,
        f: Box<dyn RewardFn>,
        weight: f32,
    ) -> Result<()> {
        let label = label.into();
        let earlier: Vec<&str> = self.entries.iter().map(|e| e.label.as_str()).collect();
        check_entry(&label, weight, &earlier)?;
        self.entries.push(Entry { label, f, weight });
        Ok(())
    }

    /// Builds the composition from a trainer config: an array of objects
    /// `{"name": ..., "weight": 1.0, "options": {...}, "label": ...}` where `name` is one of
    /// [`REWARD_NAMES`](crate::REWARD_NAMES) (see [`reward_fn_by_name`] for the options),
    /// `weight` defaults to 1.0, `options` to `{}` and `label` to the function's name.
    ///
    /// # Errors
    /// [`Error::Value`] for a malformed entry, and the errors of [`reward_fn_by_name`] and
    /// [`WeightedRewards::push_labeled`].
    ///
    /// # Example
    /// ```
    /// use atomrl_reward::WeightedRewards;
    /// let cfg = serde_json::json!([
    ///     {"name": "correctness", "weight": 1.0, "options": {"strict": false}},
    ///     {"name": "correctness", "label": "strict_acc", "weight": 0.0, "options": {"strict": true}},
    ///     {"name": "overlong", "options": {"max_len": 512, "buffer_len": 128}}
    /// ]);
    /// let r = WeightedRewards::from_config(&cfg)?;
    /// assert_eq!(r.names(), vec!["correctness", "strict_acc", "overlong"]);
    /// assert_eq!(r.weights(), vec![1.0, 0.0, 1.0]);
    /// # Ok::<(), atomrl_reward::Error>(())
    /// ```
    pub fn from_config(config: &Value) -> Result<Self> {
        let items = config.as_array().ok_or_else(|| {
            Error::value(
                FUNC,
                "config",
                "an array of {\"name\", \"weight\", \"options\"} objects",
                kind(config),
            )
        })?;
        let mut out = Self::new();
        for (i, item) in items.iter().enumerate() {
            let obj = item.as_object().ok_or_else(|| {
                Error::value(FUNC, format!("config[{i}]"), "an object", kind(item))
            })?;
            if let Some(key) = obj
                .keys()
                .find(|k| !["name", "weight", "options", "label"].contains(&k.as_str()))
            {
                return Err(Error::UnknownArgument {
                    func: FUNC.into(),
                    arg: format!("config[{i}].{key}"),
                    known: "name, weight, options, label".into(),
                });
            }
            let name = obj.get("name").and_then(Value::as_str).ok_or_else(|| {
                Error::missing(
                    FUNC,
                    &format!("config[{i}].name"),
                    "the reward function's name",
                )
            })?;
            let weight = match obj.get("weight") {
                None | Some(Value::Null) => 1.0,
                Some(w) => w.as_f64().ok_or_else(|| {
                    Error::value(FUNC, format!("config[{i}].weight"), "a number", kind(w))
                })? as f32,
            };
            let f = reward_fn_by_name(name, obj.get("options").unwrap_or(&Value::Null))?;
            let label = match obj.get("label") {
                None | Some(Value::Null) => f.name().to_string(),
                Some(l) => l
                    .as_str()
                    .ok_or_else(|| {
                        Error::value(FUNC, format!("config[{i}].label"), "a string", kind(l))
                    })?
                    .to_string(),
            };
            out.push_labeled(label, f, weight)?;
        }
        Ok(out)
    }

    /// The functions' names (labels), in column order.
    pub fn names(&self) -> Vec<String> {
        self.entries.iter().map(|e| e.label.clone()).collect()
    }

    /// The weights, in column order.
    pub fn weights(&self) -> Vec<f32> {
        self.entries.iter().map(|e| e.weight).collect()
    }

    /// Number of functions.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no function was added.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Scores `completions` with every function and sums them with their weights.
    ///
    /// # Shapes
    /// - `completions`: `N` strings; returns `total [N]`, `per_fn [N, F]` (f32, CPU), `names`
    ///   and `weights` (`F` each).
    ///
    /// # Errors
    /// - [`Error::Value`] when there is no function, or a context vector does not have `N`
    ///   entries;
    /// - any error of a function's `score`;
    /// - [`Error::Shape`] when a function returns something other than `[N]`;
    /// - [`Error::Value`] naming the function and row (`correctness[3]`) when a reward is NaN
    ///   or infinite.
    pub fn score(&self, completions: &[String], ctx: &RewardContext) -> Result<RewardBatch> {
        let items: Vec<(&str, &dyn RewardFn, f32)> = self
            .entries
            .iter()
            .map(|e| (e.label.as_str(), e.f.as_ref(), e.weight))
            .collect();
        score_all(&items, completions, ctx)
    }
}

fn check_entry(label: &str, weight: f32, earlier: &[&str]) -> Result<()> {
    if !weight.is_finite() {
        return Err(Error::value(
            FUNC,
            format!("weight of `{label}`"),
            "a finite number",
            weight,
        ));
    }
    if label.is_empty() || earlier.contains(&label) {
        return Err(Error::value(
            FUNC,
            "name",
            "a non-empty name not used by another reward function (set a label)",
            format!("`{label}`"),
        ));
    }
    Ok(())
}

fn score_all(
    items: &[(&str, &dyn RewardFn, f32)],
    completions: &[String],
    ctx: &RewardContext,
) -> Result<RewardBatch> {
    if items.is_empty() {
        return Err(Error::value(FUNC, "reward functions", "at least one", 0));
    }
    let n = completions.len();
    ctx.validate(n)?;
    let f_count = items.len();
    let mut per_fn = vec![0f32; n * f_count];
    let mut total = vec![0f64; n];
    for (col, &(label, f, weight)) in items.iter().enumerate() {
        let t = f.score(completions, ctx)?;
        if t.dims() != [n] {
            return Err(Error::shape(
                FUNC,
                &format!("rewards of `{label}`"),
                format!("[N] = [{n}]"),
                t.dims(),
            ));
        }
        let values = flat_f64(FUNC, &t)?;
        for (row, &v) in values.iter().enumerate() {
            if !v.is_finite() {
                return Err(Error::value(
                    FUNC,
                    format!("{label}[{row}]"),
                    "a finite reward",
                    v,
                ));
            }
            per_fn[row * f_count + col] = v as f32;
            total[row] += f64::from(weight) * v;
        }
    }
    let total: Vec<f32> = total.into_iter().map(|x| x as f32).collect();
    Ok(RewardBatch {
        total: Tensor::from_vec(total, n, &Device::Cpu).ctx(FUNC)?,
        per_fn: Tensor::from_vec(per_fn, (n, f_count), &Device::Cpu).ctx(FUNC)?,
        names: items.iter().map(|(l, _, _)| (*l).to_string()).collect(),
        weights: items.iter().map(|(_, _, w)| *w).collect(),
    })
}

/// Scores `completions` with each `(function, weight)` pair; the one-shot form of
/// [`WeightedRewards::score`].
///
/// # Shapes
/// As [`WeightedRewards::score`].
///
/// # Errors
/// As [`WeightedRewards::push`] and [`WeightedRewards::score`].
///
/// # Example
/// ```
/// use atomrl_reward::{compose_rewards, Correctness, RewardContext, RewardFn, SoftFormat};
/// let (c, s) = (Correctness::default(), SoftFormat::default());
/// let fns: [(&dyn RewardFn, f32); 2] = [(&c, 1.0), (&s, 0.25)];
/// let ctx = RewardContext::new().with_ground_truth(["3"]);
/// let b = compose_rewards(&fns, &["<think>1+2</think><answer>3</answer>".to_string()], &ctx)?;
/// assert_eq!(b.total.to_vec1::<f32>()?, vec![1.25]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn compose_rewards(
    fns: &[(&dyn RewardFn, f32)],
    completions: &[String],
    ctx: &RewardContext,
) -> Result<RewardBatch> {
    let mut items: Vec<(&str, &dyn RewardFn, f32)> = Vec::with_capacity(fns.len());
    for &(f, weight) in fns {
        let earlier: Vec<&str> = items.iter().map(|(l, _, _)| *l).collect();
        check_entry(f.name(), weight, &earlier)?;
        items.push((f.name(), f, weight));
    }
    score_all(&items, completions, ctx)
}

fn kind(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => format!("the string {s:?}"),
        Value::Array(a) => format!("an array of {} elements", a.len()),
        Value::Object(_) => "an object".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Correctness, FnReward, HardFormat};

    fn nan_at_row_1() -> FnReward<impl Fn(&str, &RewardContext, usize) -> f32 + Send + Sync> {
        FnReward::new(
            "mine",
            |_: &str, _: &RewardContext, i: usize| if i == 1 { f32::NAN } else { 0.5 },
        )
    }

    struct WrongShape;

    impl RewardFn for WrongShape {
        fn name(&self) -> &str {
            "wrong"
        }

        fn score(&self, _: &[String], _: &RewardContext) -> Result<Tensor> {
            Tensor::zeros((2, 2), candle_core::DType::F32, &Device::Cpu).ctx("wrong")
        }
    }

    fn completions() -> Vec<String> {
        vec!["12".into(), "13".into()]
    }

    #[test]
    fn nan_is_reported_with_function_and_row() {
        let w = WeightedRewards::new()
            .with(Correctness::default(), 1.0)
            .unwrap()
            .with(nan_at_row_1(), 1.0)
            .unwrap();
        let ctx = RewardContext::new().with_ground_truth(["12", "12"]);
        let e = w.score(&completions(), &ctx).unwrap_err().to_string();
        assert_eq!(
            e,
            "compose_rewards: `mine[1]` must be a finite reward, got NaN"
        );
    }

    #[test]
    fn wrong_shapes_lengths_names_and_weights_are_rejected() {
        let w = WeightedRewards::new().with(WrongShape, 1.0).unwrap();
        let e = w
            .score(&completions(), &RewardContext::new())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("rewards of `wrong`") && e.contains("[N] = [2]"),
            "{e}"
        );

        let w = WeightedRewards::new()
            .with(HardFormat::default(), 1.0)
            .unwrap();
        let ctx = RewardContext::new().with_prompts(["p"]);
        let e = w.score(&completions(), &ctx).unwrap_err().to_string();
        assert_eq!(
            e,
            "RewardContext: `prompts` must be N = 2 entries (one per completion), got 1 entries"
        );

        let w = WeightedRewards::new()
            .with(Correctness::default(), 1.0)
            .unwrap();
        let e = w
            .score(&completions(), &RewardContext::new())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("correctness: missing required argument `ground_truth`"),
            "{e}"
        );

        assert!(WeightedRewards::new()
            .with(HardFormat::default(), 1.0)
            .unwrap()
            .with(HardFormat::default(), 1.0)
            .is_err());
        assert!(WeightedRewards::new()
            .with(HardFormat::default(), f32::NAN)
            .is_err());
        assert!(WeightedRewards::new()
            .score(&completions(), &RewardContext::new())
            .is_err());
        assert!(
            WeightedRewards::from_config(&serde_json::json!([{"name": "mark", "wieght": 1}]))
                .is_err()
        );
        assert!(WeightedRewards::from_config(&serde_json::json!({"name": "mark"})).is_err());
    }

    #[test]
    fn compose_rewards_matches_weighted_rewards() {
        let (c, h) = (Correctness::default(), HardFormat::default());
        let ctx = RewardContext::new().with_ground_truth(["12", "12"]);
        let a = compose_rewards(&[(&c, 2.0), (&h, -1.0)], &completions(), &ctx).unwrap();
        assert_eq!(a.total.to_vec1::<f32>().unwrap(), vec![2.0, 0.0]);
        assert_eq!(a.weights, vec![2.0, -1.0]);
        assert_eq!(a.per_fn.dims(), &[2, 2]);
        // Zero completions give empty tensors, not an error.
        let empty = compose_rewards(&[(&h, 1.0)], &[], &RewardContext::new()).unwrap();
        assert_eq!(empty.per_fn.dims(), &[0, 1]);
    }
}
