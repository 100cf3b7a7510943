//! Step reward: are the worked equations in a completion right, and built from the problem's
//! numbers?
//!
//! A verifiable *process* reward: where the answer reward is 1/0 for the final number, this one
//! gives partial credit for each arithmetic step (`a op b = c` on a line of its own) that is
//! correct and whose operands come from the prompt or from earlier steps. On small models it
//! gives a gradient to groups whose answers are all wrong (and so all equal under the answer
//! reward), which is most groups early in training.

use std::sync::LazyLock;

use atomrl_core::Result;
use candle_core::Tensor;
use regex::Regex;

use crate::batch::{check_len, rewards_tensor};

/// One arithmetic step on a line of its own: `a op b = c`, `op` one of `+ - * / x × ÷`.
// A regex, not a parser: the step format is one binary operation per line, as in GSM8K
// calculator annotations (`<<48/2=24>>` is matched too, without the brackets).
static STEP: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?m)^\s*(?:<<)?\s*(-?\d+(?:\.\d+)?)\s*([-+*/x×÷])\s*(-?\d+(?:\.\d+)?)\s*=\s*(-?\d+(?:\.\d+)?)\s*(?:>>)?\s*$",
    )
    .expect("valid step regex")
});

static NUMBER: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"\d+(?:\.\d+)?").expect("valid number regex"));

/// Relative tolerance of a step's result (`|c − a op b| ≤ 1e-6 · max(1, |a op b|)`).
const STEP_TOLERANCE: f64 = 1e-6;

/// An arithmetic step found in a completion.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Step {
    /// Left operand.
    pub lhs: f64,
    /// The operator, normalised to one of `+ - * /`.
    pub op: char,
    /// Right operand.
    pub rhs: f64,
    /// The result written after `=`.
    pub result: f64,
}

impl Step {
    /// Whether `result` equals `lhs op rhs` (division by zero is never right).
    pub fn is_correct(&self) -> bool {
        let value = match self.op {
            '+' => self.lhs + self.rhs,
            '-' => self.lhs - self.rhs,
            '*' => self.lhs * self.rhs,
            _ if self.rhs == 0.0 => return false,
            _ => self.lhs / self.rhs,
        };
        (self.result - value).abs() <= STEP_TOLERANCE * value.abs().max(1.0)
    }
}

/// The `a op b = c` steps of `completion`, in order (lines with anything else are skipped).
///
/// # Example
/// ```
/// use atomrl_reward::parse_steps;
/// let steps = parse_steps("<think>\n9*4=36\nso\n36 - 20 = 16\n</think>");
/// assert_eq!(steps.len(), 2);
/// assert_eq!((steps[1].lhs, steps[1].op, steps[1].rhs, steps[1].result), (36.0, '-', 20.0, 16.0));
/// ```
pub fn parse_steps(completion: &str) -> Vec<Step> {
    STEP.captures_iter(completion)
        .filter_map(|c| {
            let op = match &c[2] {
                "x" | "×" => '*',
                "÷" => '/',
                o => o.chars().next()?,
            };
            Some(Step {
                lhs: c[1].parse().ok()?,
                op,
                rhs: c[3].parse().ok()?,
                result: c[4].parse().ok()?,
            })
        })
        .collect()
}

/// Score in [0, 1] of one completion: the fraction of its steps that are correct and, when a
/// prompt is given, *grounded* (each operand is a number of the prompt or the result of an
/// earlier step); 0 when it has no step.
///
/// # Example
/// ```
/// use atomrl_reward::step_score;
/// let prompt = "Uma plants 9 rows with 4 in each row, and 20 do not grow. How many grow?";
/// assert_eq!(step_score("9*4=36\n36-20=16", Some(prompt)), 1.0);
/// assert_eq!(step_score("9*4=36\n36-20=15", Some(prompt)), 0.5); // wrong result
/// assert_eq!(step_score("9*6=54\n54-20=34", Some(prompt)), 0.5); // 6 is not in the problem
/// assert_eq!(step_score("9*6=54", None), 1.0); // no prompt: arithmetic only
/// assert_eq!(step_score("the answer is 16", Some(prompt)), 0.0);
/// ```
pub fn step_score(completion: &str, prompt: Option<&str>) -> f32 {
    let steps = parse_steps(completion);
    if steps.is_empty() {
        return 0.0;
    }
    let mut known: Option<Vec<f64>> = prompt.map(|p| {
        NUMBER
            .find_iter(p)
            .filter_map(|m| m.as_str().parse().ok())
            .collect()
    });
    let mut good = 0usize;
    for step in &steps {
        let grounded = known
            .as_ref()
            .is_none_or(|k| [step.lhs, step.rhs].iter().all(|x| k.contains(x)));
        if grounded && step.is_correct() {
            good += 1;
        }
        if let Some(k) = known.as_mut() {
            k.push(step.result);
        }
    }
    good as f32 / steps.len() as f32
}

/// [`step_score`] of each completion, `[N]` f32; `prompts` (`[N]`, optional) turns on the
/// grounding check.
///
/// # Errors
/// `prompts` with a length other than `N`, naming the argument.
///
/// # Example
/// ```
/// use atomrl_reward::step_reward;
/// let r = step_reward(&["2+3=5\n5*2=10".into(), "2+3=6".into()], Some(&["2 and 3, twice".into(), "2 and 3".into()]))?;
/// assert_eq!(r.to_vec1::<f32>()?, vec![1.0, 0.0]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn step_reward(completions: &[String], prompts: Option<&[String]>) -> Result<Tensor> {
    const FUNC: &str = "step_reward";
    if let Some(p) = prompts {
        check_len(FUNC, "prompts", p.len(), completions.len())?;
    }
    let scores = completions
        .iter()
        .enumerate()
        .map(|(i, c)| step_score(c, prompts.map(|p| p[i].as_str())))
        .collect();
    rewards_tensor(FUNC, scores)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn operators_and_calculator_annotations_parse() {
        let s = parse_steps("3 x 4 = 12\n12 ÷ 4 = 3\n<<48/2=24>>\n7 × 2 = 14\n2+2=4 and more");
        let ops: Vec<char> = s.iter().map(|s| s.op).collect();
        assert_eq!(ops, vec!['*', '/', '/', '*']);
        assert!(s.iter().all(Step::is_correct));
    }

    #[test]
    fn division_by_zero_and_decimals() {
        assert!(!parse_steps("5/0=0")[0].is_correct());
        assert!(parse_steps("7/2=3.5")[0].is_correct());
        assert!(!parse_steps("7/2=3")[0].is_correct());
        assert!(parse_steps("-3+5=2")[0].is_correct());
    }

    #[test]
    fn later_steps_may_use_earlier_results() {
        let prompt = "36 beads, keeps 6, shares among 3 friends";
        assert_eq!(step_score("36-6=30\n30/3=10", Some(prompt)), 1.0);
        // 10 is neither in the prompt nor an earlier result.
        assert_eq!(step_score("36-6=54\n10/3=4", Some(prompt)), 0.0);
    }

    #[test]
    fn prompts_of_the_wrong_length_are_named() {
        let e = step_reward(&["1+1=2".into()], Some(&[]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("prompts") && e.contains("1 entries"), "{e}");
    }

    proptest! {
        #[test]
        fn score_is_a_fraction_of_the_steps(a in 0u32..50, b in 1u32..50, wrong in 0u32..3) {
            let text = format!("{a}+{b}={}\n{a}*{b}={}", a + b + wrong, a * b);
            let s = step_score(&text, None);
            prop_assert_eq!(s, if wrong == 0 { 1.0 } else { 0.5 });
        }
    }
}
