//! [`ToolOutcome`]: what happened when one `<tool_call>` block was handled.

use crate::ToolError;

/// What happened when one `<tool_call>` block was handled by
/// [`ToolSet::execute`](crate::ToolSet::execute) or [`ToolSet::run_calls`](crate::ToolSet::run_calls).
///
/// # Example
///
/// ```
/// use atomrl_tools::ToolSet;
///
/// let tools = ToolSet::from_names(&["calculator"])?;
/// let outcomes = tools.run_calls(
///     "<tool_call>{\"name\": \"calculator\", \"arguments\": {\"expression\": \"1/0\"}}</tool_call>",
/// );
/// let outcome = &outcomes[0];
/// assert!(outcome.is_error());
/// assert_eq!(outcome.name.as_deref(), Some("calculator"));
/// assert_eq!(outcome.output, "error: calculator: division by zero");
/// # Ok::<(), atomrl_tools::ToolError>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct ToolOutcome {
    /// The text between `<tool_call>` and `</tool_call>`, trimmed.
    pub raw: String,
    /// The tool name, when the call's JSON had one.
    pub name: Option<String>,
    /// What the tool turn shows: the tool's result, or `error: {ToolError}`; truncated to
    /// [`ToolLimits::max_output_chars`](crate::ToolLimits::max_output_chars).
    pub output: String,
    /// `None` when the call succeeded.
    pub error: Option<ToolError>,
}

impl ToolOutcome {
    /// Whether the call failed.
    ///
    /// ```
    /// use atomrl_tools::ToolOutcome;
    ///
    /// let ok = ToolOutcome { raw: String::new(), name: None, output: "2".into(), error: None };
    /// assert!(!ok.is_error());
    /// ```
    pub fn is_error(&self) -> bool {
        self.error.is_some()
    }
}
