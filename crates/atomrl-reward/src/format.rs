//! Format rewards: does the completion follow `<think>…</think><answer>…</answer>`?

use atomrl_core::{Error, Result};
use candle_core::Tensor;

use crate::batch::rewards_tensor;
use crate::tags::Tags;

/// Whether `completion` is exactly `<think>\n…\n</think>\n<answer>\n…\n</answer>`: nothing
/// before `<think>`, nothing (not even a newline) after `</answer>`, each of the four tags
/// exactly once, and the newlines exactly where shown (the contents `…` may be empty or span
/// lines).
///
/// # Example
/// ```
/// use atomrl_reward::{is_hard_format, Tags};
/// let t = Tags::default();
/// assert!(is_hard_format("<think>\n5+7\n</think>\n<answer>\n12\n</answer>", &t));
/// assert!(!is_hard_format("<think>5+7</think><answer>12</answer>", &t));
/// assert!(!is_hard_format("<think>\n5+7\n</think>\n<answer>\n12\n</answer>\n", &t));
/// ```
pub fn is_hard_format(completion: &str, tags: &Tags) -> bool {
    let (ot, ct, oa, ca) = (
        tags.open_think(),
        tags.close_think(),
        tags.open_answer(),
        tags.close_answer(),
    );
    if [&ot, &ct, &oa, &ca]
        .iter()
        .any(|t| completion.matches(t.as_str()).count() != 1)
    {
        return false;
    }
    let Some(rest) = completion.strip_prefix(&format!("{ot}\n")) else {
        return false;
    };
    let middle = format!("\n{ct}\n{oa}\n");
    let Some(pos) = rest.find(&middle) else {
        return false;
    };
    let answer = &rest[pos + middle.len()..];
    let end = format!("\n{ca}");
    answer.len() >= end.len() && answer.ends_with(&end)
}

/// Whether the four tags `<think>`, `</think>`, `<answer>`, `</answer>` appear in this order
/// (each searched after the previous one; anything may come before, between and after).
///
/// # Example
/// ```
/// use atomrl_reward::{is_soft_format, Tags};
/// let t = Tags::default();
/// assert!(is_soft_format("Sure! <think>5+7</think> so <answer>12</answer> done", &t));
/// assert!(!is_soft_format("<answer>12</answer><think>5+7</think>", &t));
/// ```
pub fn is_soft_format(completion: &str, tags: &Tags) -> bool {
    let mut at = 0;
    for tag in [
        tags.open_think(),
        tags.close_think(),
        tags.open_answer(),
        tags.close_answer(),
    ] {
        match completion[at..].find(&tag) {
            Some(p) => at += p + tag.len(),
            None => return false,
        }
    }
    true
}

/// Options of [`mark_reward`].
#[derive(Debug, Clone, PartialEq)]
pub struct MarkOptions {
    /// Tag names.
    pub tags: Tags,
    /// Credit per correctly placed tag (default 0.125, so at most 0.5).
    pub per_tag: f32,
    /// Penalty per character after `</answer>` (default 0.001), capped at `per_tag`.
    pub per_char: f32,
}

impl Default for MarkOptions {
    fn default() -> Self {
        Self {
            tags: Tags::default(),
            per_tag: 0.125,
            per_char: 0.001,
        }
    }
}

impl MarkOptions {
    /// Checks that `per_tag` and `per_char` are finite and non-negative.
    ///
    /// # Errors
    /// [`Error::Value`] naming the option.
    pub fn validate(&self) -> Result<()> {
        for (arg, v) in [("per_tag", self.per_tag), ("per_char", self.per_char)] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(Error::value("mark_reward", arg, "a finite number >= 0", v));
            }
        }
        Ok(())
    }
}

/// Partial format credit for one completion, in `[0, 4 · per_tag]`.
///
/// The four markers are `<think>\n`, `\n</think>\n`, `\n<answer>\n` and `\n</answer>`. Each
/// earns `per_tag` when it occurs exactly once and after every earlier marker that also occurs
/// exactly once. When `\n</answer>` earns its credit, `per_char` is subtracted for every
/// character after it (surrounding whitespace ignored), at most `per_tag` in all.
///
/// # Example
/// ```
/// use atomrl_reward::{mark_score, MarkOptions};
/// let o = MarkOptions::default();
/// assert_eq!(mark_score("<think>\na\n</think>\n<answer>\n1\n</answer>", &o), 0.5);
/// let trailing = mark_score("<think>\na\n</think>\n<answer>\n1\n</answer>\nbye", &o);
/// assert!((trailing - 0.497).abs() < 1e-6);
/// assert_eq!(mark_score("<think>\na", &o), 0.125);
/// assert_eq!(mark_score("", &o), 0.0);
/// ```
pub fn mark_score(completion: &str, opts: &MarkOptions) -> f32 {
    let t = &opts.tags;
    let markers = [
        format!("{}\n", t.open_think()),
        format!("\n{}\n", t.close_think()),
        format!("\n{}\n", t.open_answer()),
        format!("\n{}", t.close_answer()),
    ];
    let positions: Vec<Option<usize>> = markers
        .iter()
        .map(|m| {
            if completion.matches(m.as_str()).count() == 1 {
                completion.find(m.as_str())
            } else {
                None
            }
        })
        .collect();
    let mut credited = 0u32;
    let mut close_ok = false;
    for (k, pos) in positions.iter().enumerate() {
        let Some(p) = pos else { continue };
        if positions[..k].iter().flatten().all(|q| q < p) {
            credited += 1;
            close_ok = k == 3;
        }
    }
    let mut score = opts.per_tag * credited as f32;
    if close_ok {
        if let Some(p) = positions[3] {
            let trailing = completion[p + markers[3].len()..].trim().chars().count();
            score -= (opts.per_char * trailing as f32).min(opts.per_tag);
        }
    }
    score
}

/// [`is_hard_format`] of each completion as 1.0 / 0.0.
///
/// # Shapes
/// - `completions`: `N` strings; returns `[N]` f32 (CPU).
///
/// # Errors
/// Only on a candle failure building the tensor.
///
/// # Example
/// ```
/// use atomrl_reward::{hard_format_reward, Tags};
/// let r = hard_format_reward(&["<think>\nx\n</think>\n<answer>\n1\n</answer>", "1"], &Tags::default())?;
/// assert_eq!(r.to_vec1::<f32>()?, vec![1.0, 0.0]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn hard_format_reward(completions: &[impl AsRef<str>], tags: &Tags) -> Result<Tensor> {
    let v = completions
        .iter()
        .map(|c| f32::from(u8::from(is_hard_format(c.as_ref(), tags))))
        .collect();
    rewards_tensor("hard_format_reward", v)
}

/// [`is_soft_format`] of each completion as 1.0 / 0.0.
///
/// # Shapes
/// - `completions`: `N` strings; returns `[N]` f32 (CPU).
///
/// # Errors
/// Only on a candle failure building the tensor.
///
/// # Example
/// ```
/// use atomrl_reward::{soft_format_reward, Tags};
/// let r = soft_format_reward(&["<think>x</think> <answer>1</answer>", "<answer>1</answer>"], &Tags::default())?;
/// assert_eq!(r.to_vec1::<f32>()?, vec![1.0, 0.0]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn soft_format_reward(completions: &[impl AsRef<str>], tags: &Tags) -> Result<Tensor> {
    let v = completions
        .iter()
        .map(|c| f32::from(u8::from(is_soft_format(c.as_ref(), tags))))
        .collect();
    rewards_tensor("soft_format_reward", v)
}

/// [`mark_score`] of each completion.
///
/// # Shapes
/// - `completions`: `N` strings; returns `[N]` f32 (CPU), each in `[0, 4 · per_tag]`.
///
/// # Errors
/// [`Error::Value`] when `per_tag` or `per_char` is negative or not finite.
///
/// # Example
/// ```
/// use atomrl_reward::{mark_reward, MarkOptions};
/// let r = mark_reward(&["<think>\nx\n</think>\n<answer>\n1\n</answer>", "<think>\nx"], &MarkOptions::default())?;
/// assert_eq!(r.to_vec1::<f32>()?, vec![0.5, 0.125]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn mark_reward(completions: &[impl AsRef<str>], opts: &MarkOptions) -> Result<Tensor> {
    opts.validate()?;
    let v = completions
        .iter()
        .map(|c| mark_score(c.as_ref(), opts))
        .collect();
    rewards_tensor("mark_reward", v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hard_format_edge_cases() {
        let t = Tags::default();
        assert!(is_hard_format(
            "<think>\n\n</think>\n<answer>\n\n</answer>",
            &t
        ));
        assert!(is_hard_format(
            "<think>\na\nb\n</think>\n<answer>\nx\ny\n</answer>",
            &t
        ));
        assert!(!is_hard_format(
            "<think>\n</think>\n<answer>\n1\n</answer>",
            &t
        ));
        assert!(!is_hard_format(
            " <think>\na\n</think>\n<answer>\n1\n</answer>",
            &t
        ));
        assert!(!is_hard_format(
            "<think>\na\n</think>\n<answer>\n1\n</answer>\n<answer>\n2\n</answer>",
            &t
        ));
        let r = Tags::new("reasoning", "answer").unwrap();
        assert!(is_hard_format(
            "<reasoning>\na\n</reasoning>\n<answer>\n1\n</answer>",
            &r
        ));
    }

    #[test]
    fn mark_penalty_is_capped_and_order_matters() {
        let o = MarkOptions::default();
        let long = format!(
            "<think>\na\n</think>\n<answer>\n1\n</answer>{}",
            "x".repeat(1000)
        );
        assert_eq!(mark_score(&long, &o), 0.375);
        // `</answer>` before `<think>`: only the markers in order earn credit.
        assert_eq!(mark_score("\n</answer><think>\n", &o), 0.125);
        assert!(MarkOptions {
            per_tag: -1.0,
            ..Default::default()
        }
        .validate()
        .is_err());
    }
}
