//! One dataset row: a prompt, the ground truth its completions are scored against, and an
//! optional SFT target.

use std::fmt;

use atomrl_core::{Error, Result};
use serde::{Deserialize, Serialize};

/// One chat message (the sampler's type, re-exported: datasets and chat templates share it).
pub use atomrl_core::ChatMessage;

/// A prompt: plain text (to be wrapped as one user message), or a list of chat messages.
///
/// Serialised untagged: a JSON string, or an array of `{"role", "content"}` objects.
///
/// ```
/// use atomrl_data::{ChatMessage, Prompt};
/// let p: Prompt = serde_json::from_str(r#""What is 5+7?""#)?;
/// assert_eq!(p, Prompt::Text("What is 5+7?".into()));
/// let p: Prompt = serde_json::from_str(r#"[{"role": "user", "content": "Hi"}]"#)?;
/// assert_eq!(p, Prompt::Messages(vec![ChatMessage::new("user", "Hi")]));
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    /// Plain text, sent as a single user message.
    Text(String),
    /// A conversation (for example a system message and a user message).
    Messages(Vec<ChatMessage>),
}

impl Prompt {
    /// The prompt as chat messages, ready for a chat template.
    ///
    /// `Text` becomes one `user` message. When `system` is given it is put first, unless the
    /// prompt's messages already start with a `system` message (the dataset's own system
    /// prompt wins).
    ///
    /// ```
    /// use atomrl_data::{ChatMessage, Prompt};
    /// let p = Prompt::Text("What is 5+7?".into());
    /// assert_eq!(
    ///     p.to_messages(Some("Think, then answer.")),
    ///     vec![
    ///         ChatMessage::new("system", "Think, then answer."),
    ///         ChatMessage::new("user", "What is 5+7?"),
    ///     ]
    /// );
    /// assert_eq!(p.to_messages(None), vec![ChatMessage::new("user", "What is 5+7?")]);
    /// ```
    pub fn to_messages(&self, system: Option<&str>) -> Vec<ChatMessage> {
        let mut out = Vec::new();
        let has_system = match self {
            Prompt::Text(_) => false,
            Prompt::Messages(m) => m.first().is_some_and(|m| m.role == "system"),
        };
        if let (Some(system), false) = (system, has_system) {
            out.push(ChatMessage::new("system", system));
        }
        match self {
            Prompt::Text(t) => out.push(ChatMessage::new("user", t.as_str())),
            Prompt::Messages(m) => out.extend(m.iter().cloned()),
        }
        out
    }

    /// The text of a `Text` prompt; `None` for messages.
    ///
    /// ```
    /// use atomrl_data::Prompt;
    /// assert_eq!(Prompt::from("2+2?").as_text(), Some("2+2?"));
    /// ```
    pub fn as_text(&self) -> Option<&str> {
        match self {
            Prompt::Text(t) => Some(t),
            Prompt::Messages(_) => None,
        }
    }
}

impl From<&str> for Prompt {
    fn from(s: &str) -> Self {
        Prompt::Text(s.to_string())
    }
}

impl From<String> for Prompt {
    fn from(s: String) -> Self {
        Prompt::Text(s)
    }
}

impl fmt::Display for Prompt {
    /// The text itself, or each message as `role: content` on its own line (for logs).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Prompt::Text(t) => f.write_str(t),
            Prompt::Messages(m) => {
                for (i, msg) in m.iter().enumerate() {
                    if i > 0 {
                        f.write_str("\n")?;
                    }
                    write!(f, "{}: {}", msg.role, msg.content)?;
                }
                Ok(())
            }
        }
    }
}

/// One training or evaluation example.
///
/// GRPO scores sampled completions of `prompt` against `ground_truth`; SFT trains on
/// `completion`. An empty `ground_truth` means "unknown" (SFT-only rows).
///
/// ```
/// use atomrl_data::{Example, Prompt};
/// let ex = Example::new("What is 5+7?", "12").with_completion("<answer>12</answer>");
/// assert_eq!(ex.prompt, Prompt::Text("What is 5+7?".into()));
/// assert_eq!(ex.completion.as_deref(), Some("<answer>12</answer>"));
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Example {
    /// The prompt (before any chat template).
    pub prompt: Prompt,
    /// The reference answer, e.g. `"72"`.
    #[serde(default)]
    pub ground_truth: String,
    /// The target completion for supervised fine-tuning, if the dataset has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion: Option<String>,
    /// A preference pair of completions (DPO, reward models), if the dataset has one; written
    /// as top-level `chosen`, `rejected` and `margin` fields.
    #[serde(default, flatten, skip_serializing_if = "Option::is_none")]
    pub preference: Option<crate::preference::Preference>,
}

impl Example {
    /// An example without a completion.
    pub fn new(prompt: impl Into<Prompt>, ground_truth: impl Into<String>) -> Self {
        Self {
            prompt: prompt.into(),
            ground_truth: ground_truth.into(),
            completion: None,
            preference: None,
        }
    }

    /// The same example with an SFT target.
    pub fn with_completion(mut self, completion: impl Into<String>) -> Self {
        self.completion = Some(completion.into());
        self
    }

    /// A GSM8K row: the question is the prompt, the ground truth is what follows `####` in
    /// the answer ([`atomrl_reward::extract_gsm8k_ground_truth`]), and the whole answer text
    /// is the completion.
    ///
    /// # Errors
    /// [`Error::Value`] when the answer has no `#### <answer>` line.
    ///
    /// ```
    /// use atomrl_data::Example;
    /// let ex = Example::from_gsm8k("How many?", "48+24 = <<48+24=72>>72\n#### 72")?;
    /// assert_eq!(ex.ground_truth, "72");
    /// assert!(Example::from_gsm8k("How many?", "72").is_err());
    /// # Ok::<(), atomrl_core::Error>(())
    /// ```
    pub fn from_gsm8k(question: impl Into<String>, answer: impl Into<String>) -> Result<Self> {
        let answer = answer.into();
        let Some(ground_truth) = atomrl_reward::extract_gsm8k_ground_truth(&answer) else {
            return Err(Error::value(
                "Example::from_gsm8k",
                "answer",
                "a GSM8K solution ending in `#### <answer>`",
                format!("{:?}", short(&answer)),
            ));
        };
        Ok(Self {
            prompt: Prompt::Text(question.into()),
            ground_truth,
            completion: Some(answer),
            preference: None,
        })
    }
}

/// At most 60 characters of `s`, with `…` when cut (for error messages).
pub(crate) fn short(s: &str) -> String {
    const MAX: usize = 60;
    if s.chars().count() <= MAX {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(MAX).collect();
        t.push('…');
        t
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn system_prompt_not_duplicated() {
        let p = Prompt::Messages(vec![
            ChatMessage::new("system", "own"),
            ChatMessage::new("user", "q"),
        ]);
        let m = p.to_messages(Some("default"));
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].content, "own");
        let p = Prompt::Messages(vec![ChatMessage::new("user", "q")]);
        assert_eq!(p.to_messages(Some("s"))[0], ChatMessage::new("system", "s"));
    }

    #[test]
    fn serde_round_trip() {
        let ex = Example::new(Prompt::Messages(vec![ChatMessage::new("user", "q")]), "3");
        let s = serde_json::to_string(&ex).unwrap();
        assert_eq!(
            s,
            r#"{"prompt":[{"role":"user","content":"q"}],"ground_truth":"3"}"#
        );
        assert_eq!(serde_json::from_str::<Example>(&s).unwrap(), ex);
        let ex = ex.with_completion("c");
        let s = serde_json::to_string(&ex).unwrap();
        assert_eq!(serde_json::from_str::<Example>(&s).unwrap(), ex);
    }

    #[test]
    fn display_and_short() {
        let p = Prompt::Messages(vec![
            ChatMessage::new("system", "s"),
            ChatMessage::new("user", "u"),
        ]);
        assert_eq!(p.to_string(), "system: s\nuser: u");
        assert_eq!(short(&"x".repeat(100)).chars().count(), 61);
        assert_eq!(short("abc"), "abc");
    }
}
