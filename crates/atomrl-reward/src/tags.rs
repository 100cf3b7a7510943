//! The names of the reasoning and answer tags.

use atomrl_core::{Error, Result};

/// Names of the two XML-like tags a completion is formatted with: `<think>…</think>` and
/// `<answer>…</answer>` by default (`reasoning` is a common alternative to `think`).
///
/// # Example
/// ```
/// use atomrl_reward::Tags;
/// let t = Tags::default();
/// assert_eq!((t.open_think(), t.close_answer()), ("<think>".to_string(), "</answer>".to_string()));
/// let r = Tags::new("reasoning", "answer")?;
/// assert_eq!(r.open_think(), "<reasoning>");
/// # Ok::<(), atomrl_reward::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tags {
    think: String,
    answer: String,
}

impl Default for Tags {
    fn default() -> Self {
        Self {
            think: "think".into(),
            answer: "answer".into(),
        }
    }
}

impl Tags {
    /// Tags with the given names (without angle brackets).
    ///
    /// # Errors
    /// [`Error::Value`] when a name is empty, equal to the other, or contains `<`, `>`, `/` or
    /// whitespace.
    pub fn new(think: &str, answer: &str) -> Result<Self> {
        for (arg, name) in [("think_tag", think), ("answer_tag", answer)] {
            if name.is_empty()
                || name
                    .chars()
                    .any(|c| c.is_whitespace() || matches!(c, '<' | '>' | '/'))
            {
                return Err(Error::value(
                    "Tags::new",
                    arg,
                    "a non-empty tag name without <, >, / or spaces",
                    format!("{name:?}"),
                ));
            }
        }
        if think == answer {
            return Err(Error::value(
                "Tags::new",
                "answer_tag",
                "a name different from think_tag",
                answer,
            ));
        }
        Ok(Self {
            think: think.into(),
            answer: answer.into(),
        })
    }

    /// The reasoning tag's name (`think`).
    pub fn think(&self) -> &str {
        &self.think
    }

    /// The answer tag's name (`answer`).
    pub fn answer(&self) -> &str {
        &self.answer
    }

    /// `<think>`.
    pub fn open_think(&self) -> String {
        format!("<{}>", self.think)
    }

    /// `</think>`.
    pub fn close_think(&self) -> String {
        format!("</{}>", self.think)
    }

    /// `<answer>`.
    pub fn open_answer(&self) -> String {
        format!("<{}>", self.answer)
    }

    /// `</answer>`.
    pub fn close_answer(&self) -> String {
        format!("</{}>", self.answer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_names_are_rejected() {
        assert!(Tags::new("", "answer").is_err());
        assert!(Tags::new("a b", "answer").is_err());
        assert!(Tags::new("think", "<answer>").is_err());
        let e = Tags::new("x", "x").unwrap_err().to_string();
        assert!(e.contains("answer_tag"), "{e}");
    }
}
