//! [`ToolError`]: why a tool call failed.

/// Why a tool call failed; its `Display` text is what the model sees in the tool turn
/// (as `error: {text}`, see [`ToolOutcome`](crate::ToolOutcome)).
///
/// # Example
///
/// ```
/// use atomrl_tools::ToolError;
///
/// let e = ToolError::Failed { tool: "calculator".into(), reason: "division by zero".into() };
/// assert_eq!(e.to_string(), "calculator: division by zero");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ToolError {
    /// The `<tool_call>` block could not be read as a call: bad JSON, no `name`, `arguments`
    /// not an object, or no closing `</tool_call>`.
    #[error("malformed tool call: {reason}")]
    MalformedCall {
        /// What was wrong with the block.
        reason: String,
    },
    /// The call names a tool that is not in the [`ToolSet`](crate::ToolSet).
    #[error("unknown tool `{name}`; known tools: {known}")]
    UnknownTool {
        /// The name the call used.
        name: String,
        /// The known tool names, comma-separated (`(none)` when there are none).
        known: String,
    },
    /// The tool exists but its arguments do not match its parameters (missing or extra keys,
    /// wrong types).
    #[error("{tool}: invalid arguments: {reason}")]
    InvalidArguments {
        /// The tool's name.
        tool: String,
        /// What was wrong with the arguments.
        reason: String,
    },
    /// The tool ran and failed (e.g. `calculator: division by zero`), or panicked.
    #[error("{tool}: {reason}")]
    Failed {
        /// The tool's name.
        tool: String,
        /// Why it failed.
        reason: String,
    },
    /// The tool did not answer within [`ToolLimits::timeout`](crate::ToolLimits::timeout).
    #[error("{tool}: timed out after {limit_ms} ms")]
    Timeout {
        /// The tool's name.
        tool: String,
        /// The time limit, in milliseconds.
        limit_ms: u64,
    },
}

impl ToolError {
    /// A [`ToolError::MalformedCall`] with the given reason.
    ///
    /// ```
    /// use atomrl_tools::ToolError;
    ///
    /// let e = ToolError::malformed("unterminated <tool_call>");
    /// assert_eq!(e.to_string(), "malformed tool call: unterminated <tool_call>");
    /// ```
    pub fn malformed(reason: impl Into<String>) -> Self {
        Self::MalformedCall {
            reason: reason.into(),
        }
    }

    /// A [`ToolError::InvalidArguments`] for `tool`.
    ///
    /// ```
    /// use atomrl_tools::ToolError;
    ///
    /// let e = ToolError::invalid_arguments("calculator", "missing `expression`");
    /// assert_eq!(e.to_string(), "calculator: invalid arguments: missing `expression`");
    /// ```
    pub fn invalid_arguments(tool: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::InvalidArguments {
            tool: tool.into(),
            reason: reason.into(),
        }
    }

    /// A [`ToolError::Failed`] for `tool`.
    ///
    /// ```
    /// use atomrl_tools::ToolError;
    ///
    /// let e = ToolError::failed("calculator", "division by zero");
    /// assert_eq!(e.to_string(), "calculator: division by zero");
    /// ```
    pub fn failed(tool: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::Failed {
            tool: tool.into(),
            reason: reason.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_texts() {
        assert_eq!(
            ToolError::UnknownTool {
                name: "search".into(),
                known: "calculator".into()
            }
            .to_string(),
            "unknown tool `search`; known tools: calculator"
        );
        assert_eq!(
            ToolError::Timeout {
                tool: "slow".into(),
                limit_ms: 100
            }
            .to_string(),
            "slow: timed out after 100 ms"
        );
        assert_eq!(
            ToolError::malformed("x").to_string(),
            "malformed tool call: x"
        );
    }
}
