//! [`ChatMessage`]: one message of a conversation, shared by the data sources and the chat
//! templates.

use serde::{Deserialize, Serialize};

/// One chat message, as in Hugging Face's `apply_chat_template(messages)`.
///
/// ```
/// let m = atomrl_core::ChatMessage::user("What is 2 + 2?");
/// assert_eq!((m.role.as_str(), m.content.as_str()), ("user", "What is 2 + 2?"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, ...
    pub role: String,
    /// The message text.
    pub content: String,
}

impl ChatMessage {
    /// A message with the given role.
    ///
    /// ```
    /// assert_eq!(atomrl_core::ChatMessage::new("system", "Be brief.").role, "system");
    /// ```
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
        }
    }

    /// A `user` message.
    ///
    /// ```
    /// assert_eq!(atomrl_core::ChatMessage::user("hi").role, "user");
    /// ```
    pub fn user(content: impl Into<String>) -> Self {
        Self::new("user", content)
    }

    /// An `assistant` message (a model turn; in a tool-using conversation its content carries
    /// the tool calls as the model wrote them, e.g. Qwen's `<tool_call>...</tool_call>`).
    ///
    /// ```
    /// let m = atomrl_core::ChatMessage::assistant("4");
    /// assert_eq!((m.role.as_str(), m.content.as_str()), ("assistant", "4"));
    /// ```
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new("assistant", content)
    }

    /// A `tool` message: the output of one tool call, answering the preceding assistant turn
    /// (the role Hugging Face chat templates render as a tool response).
    ///
    /// ```
    /// let m = atomrl_core::ChatMessage::tool("21");
    /// assert_eq!((m.role.as_str(), m.content.as_str()), ("tool", "21"));
    /// ```
    pub fn tool(content: impl Into<String>) -> Self {
        Self::new("tool", content)
    }
}
