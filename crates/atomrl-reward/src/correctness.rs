//! Answer rewards: is the extracted answer right (`correctness`), is it a number (`digit`)?

use atomrl_core::{Error, Result};
use candle_core::Tensor;

use crate::batch::{check_len, rewards_tensor};
use crate::extract::{boxed, extract_answer, ExtractOptions};
use crate::format::is_hard_format;
use crate::normalize::normalize_text;
use crate::number::{scan, Number, DEFAULT_TOLERANCE};

/// Options of [`correctness_reward`].
#[derive(Debug, Clone, PartialEq)]
pub struct CorrectnessOptions {
    /// How the answer is extracted (source order, tag names).
    pub extract: ExtractOptions,
    /// 1.0 only when the completion also passes [`is_hard_format`](crate::is_hard_format).
    pub strict: bool,
    /// Relative tolerance for non-integer answers (default `1e-6`; see [`Number::matches`]).
    pub tolerance: f64,
}

impl Default for CorrectnessOptions {
    fn default() -> Self {
        Self {
            extract: ExtractOptions::default(),
            strict: false,
            tolerance: DEFAULT_TOLERANCE,
        }
    }
}

impl CorrectnessOptions {
    /// The same options with `strict` set.
    pub fn with_strict(mut self, strict: bool) -> Self {
        self.strict = strict;
        self
    }

    /// Checks that `tolerance` is finite and non-negative.
    ///
    /// # Errors
    /// [`Error::Value`] naming `tolerance`.
    pub fn validate(&self) -> Result<()> {
        if !(self.tolerance.is_finite() && self.tolerance >= 0.0) {
            return Err(Error::value(
                "correctness_reward",
                "tolerance",
                "a finite number >= 0",
                self.tolerance,
            ));
        }
        Ok(())
    }
}

/// The number an extracted answer stands for: the content of a `\boxed{…}` in it if any, then
/// the last number of that text (thousands groups may use plain spaces). `None` when it holds
/// no number.
///
/// # Example
/// ```
/// use atomrl_reward::answer_number;
/// assert_eq!(answer_number("The total is $1,200.00.").unwrap().to_string(), "1200");
/// assert_eq!(answer_number("x = \\boxed{-3/4} (since 3/4 < 1)").unwrap().to_string(), "-3/4");
/// assert!(answer_number("none").is_none());
/// ```
pub fn answer_number(answer: &str) -> Option<Number> {
    let text = normalize_text(answer);
    let inner = boxed(&text).unwrap_or(&text);
    let chars: Vec<char> = inner.chars().collect();
    scan(&chars, true).pop().map(|t| t.number)
}

/// The number `answer` consists of, if it is exactly one number: after unwrapping `\boxed{…}`,
/// one number token and otherwise only whitespace, letters (unit words such as `dollars`,
/// `cm`), and the punctuation `$ % . , : ; ! ? ( ) [ ] { } \ ' "`. So `"12"`, `"$1,000"`,
/// `"12 apples."` and `"\frac{1}{2}"` are numbers; `"x = 5"`, `"2+3"` and `"5 or 6"` are not.
///
/// # Example
/// ```
/// use atomrl_reward::whole_number;
/// assert!(whole_number("$1,000 dollars").is_some());
/// assert!(whole_number("x = 5").is_none());
/// assert!(whole_number("5 or 6").is_none());
/// ```
pub fn whole_number(answer: &str) -> Option<Number> {
    let text = normalize_text(answer);
    let inner = boxed(&text).unwrap_or(&text);
    let chars: Vec<char> = inner.chars().collect();
    let mut tokens = scan(&chars, true);
    if tokens.len() != 1 {
        return None;
    }
    let t = tokens.pop()?;
    let residue_ok = chars[..t.start].iter().chain(&chars[t.end..]).all(|&c| {
        c.is_whitespace()
            || (c.is_alphabetic() && !c.is_numeric())
            || "$%.,:;!?()[]{}\\'\"".contains(c)
    });
    residue_ok.then_some(t.number)
}

/// Normalised text form for non-numeric answers: [`normalize_text`], `\boxed{…}` unwrapped,
/// whitespace and `$` removed, lower-cased, trailing `.` removed.
fn text_key(s: &str) -> String {
    let text = normalize_text(s);
    let inner = boxed(&text).unwrap_or(&text);
    let key: String = inner
        .chars()
        .filter(|c| !c.is_whitespace() && *c != '$')
        .flat_map(char::to_lowercase)
        .collect();
    key.trim_end_matches('.').to_string()
}

/// Whether an extracted `answer` matches `ground_truth`.
///
/// The ground truth is first reduced to the text after its last `####` when it has one (a GSM8K
/// solution). If it is a single number ([`whole_number`]), the answer's number
/// ([`answer_number`]) must match it ([`Number::matches`] with `tolerance`: exact for integers,
/// relative otherwise). Otherwise both are compared as text: whitespace and `$` removed,
/// lower-cased, trailing `.` removed; an empty ground truth matches nothing.
///
/// # Example
/// ```
/// use atomrl_reward::answers_match;
/// assert!(answers_match("$1,000.00", "1000", 1e-6));
/// assert!(answers_match("\\frac{1}{2}", "0.5", 1e-6));
/// assert!(answers_match("It is 72 clips", "He sold 48 + 24 clips\n#### 72", 1e-6));
/// assert!(answers_match("  B. ", "b", 1e-6));
/// assert!(!answers_match("13", "12", 1e-6));
/// ```
pub fn answers_match(answer: &str, ground_truth: &str, tolerance: f64) -> bool {
    let normalized_gt = normalize_text(ground_truth);
    let gt = match normalized_gt.rfind("####") {
        Some(p) => normalized_gt[p + 4..].lines().next().unwrap_or(""),
        None => normalized_gt.as_str(),
    };
    match whole_number(gt) {
        Some(reference) => answer_number(answer).is_some_and(|a| a.matches(&reference, tolerance)),
        None => {
            let key = text_key(gt);
            !key.is_empty() && text_key(answer) == key
        }
    }
}

/// Correctness of one completion: 1.0 when the answer extracted with `opts.extract`
/// ([`extract_answer`]) matches `ground_truth` ([`answers_match`]), and, in strict mode, the
/// completion passes [`is_hard_format`](crate::is_hard_format); else 0.0.
///
/// # Example
/// ```
/// use atomrl_reward::{correctness_score, CorrectnessOptions};
/// let o = CorrectnessOptions::default();
/// assert_eq!(correctness_score("the answer is 1,000", "1000", &o), 1.0);
/// assert_eq!(correctness_score("the answer is 1,000", "1000", &o.clone().with_strict(true)), 0.0);
/// ```
pub fn correctness_score(completion: &str, ground_truth: &str, opts: &CorrectnessOptions) -> f32 {
    if opts.strict && !is_hard_format(completion, &opts.extract.tags) {
        return 0.0;
    }
    let ok = extract_answer(completion, &opts.extract)
        .is_some_and(|a| answers_match(&a.text, ground_truth, opts.tolerance));
    f32::from(u8::from(ok))
}

/// [`correctness_score`] of each completion against its ground truth.
///
/// # Shapes
/// - `completions`: `N` strings; `ground_truth`: `N` strings; returns `[N]` f32 (CPU), each 0.0
///   or 1.0.
///
/// # Errors
/// [`Error::Value`] when `ground_truth` does not have `N` entries or `tolerance` is invalid.
///
/// # Example
/// ```
/// use atomrl_reward::{correctness_reward, CorrectnessOptions};
/// let c = ["<think>\n5+7\n</think>\n<answer>\n12\n</answer>", "the answer is 1,000"];
/// let r = correctness_reward(&c, &["12", "1000"], &CorrectnessOptions::default())?;
/// assert_eq!(r.to_vec1::<f32>()?, vec![1.0, 1.0]);
/// let strict = CorrectnessOptions::default().with_strict(true);
/// assert_eq!(correctness_reward(&c, &["12", "1000"], &strict)?.to_vec1::<f32>()?, vec![1.0, 0.0]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn correctness_reward(
    completions: &[impl AsRef<str>],
    ground_truth: &[impl AsRef<str>],
    opts: &CorrectnessOptions,
) -> Result<Tensor> {
    const FUNC: &str = "correctness_reward";
    check_len(FUNC, "ground_truth", ground_truth.len(), completions.len())?;
    opts.validate()?;
    let v = completions
        .iter()
        .zip(ground_truth)
        .map(|(c, g)| correctness_score(c.as_ref(), g.as_ref(), opts))
        .collect();
    rewards_tensor(FUNC, v)
}

/// 1.0 when the answer extracted from `completion` is a number ([`whole_number`]), else 0.0.
/// With the default order, whose last source is `last_number`, any completion with a number in
/// it has a numeric answer; drop `last_number` from the order to require an explicit answer.
///
/// # Example
/// ```
/// use atomrl_reward::{digit_score, ExtractOptions};
/// let o = ExtractOptions::default();
/// assert_eq!(digit_score("<answer>\n$12\n</answer>", &o), 1.0);
/// assert_eq!(digit_score("<answer>\ntwelve\n</answer>", &o), 0.0);
/// ```
pub fn digit_score(completion: &str, opts: &ExtractOptions) -> f32 {
    let ok = extract_answer(completion, opts).is_some_and(|a| whole_number(&a.text).is_some());
    f32::from(u8::from(ok))
}

/// [`digit_score`] of each completion.
///
/// # Shapes
/// - `completions`: `N` strings; returns `[N]` f32 (CPU), each 0.0 or 1.0.
///
/// # Errors
/// Only on a candle failure building the tensor.
///
/// # Example
/// ```
/// use atomrl_reward::{digit_reward, ExtractOptions};
/// let r = digit_reward(&["<answer>7</answer>", "<answer>x+1</answer>", ""], &ExtractOptions::default())?;
/// assert_eq!(r.to_vec1::<f32>()?, vec![1.0, 0.0, 0.0]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn digit_reward(completions: &[impl AsRef<str>], opts: &ExtractOptions) -> Result<Tensor> {
    let v = completions
        .iter()
        .map(|c| digit_score(c.as_ref(), opts))
        .collect();
    rewards_tensor("digit_reward", v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symbolic_ground_truth_is_compared_as_text() {
        assert!(answers_match("x^2 + 1", "x^2+1", 1e-6));
        assert!(!answers_match("y+1", "x^2+1", 1e-6));
        assert!(!answers_match("anything", "", 1e-6));
        assert!(!answers_match("", "", 1e-6));
    }

    #[test]
    fn lengths_and_tolerance_are_checked() {
        let e = correctness_reward(&["1", "2"], &["1"], &CorrectnessOptions::default())
            .unwrap_err()
            .to_string();
        assert_eq!(e, "correctness_reward: `ground_truth` must be N = 2 entries (one per completion), got 1 entries");
        let bad = CorrectnessOptions {
            tolerance: f64::NAN,
            ..Default::default()
        };
        assert!(correctness_reward(&["1"], &["1"], &bad).is_err());
    }
}
