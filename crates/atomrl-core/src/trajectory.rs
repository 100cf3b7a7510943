//! [`Trajectory`]: what a multi-turn completion did besides its final answer, for rewards that
//! look at tool use.

/// One tool call of a trajectory, as the rollout ran it.
///
/// ```
/// use atomrl_core::ToolCallRecord;
/// let c = ToolCallRecord::new(Some("calculator"), r#"{"name": "calculator", "arguments": {"expression": "6*7"}}"#, "42", false);
/// assert_eq!((c.name.as_deref(), c.output.as_str(), c.failed), (Some("calculator"), "42", false));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ToolCallRecord {
    /// The tool's name, when the call named one.
    pub name: Option<String>,
    /// The call as the model wrote it (the text inside `<tool_call>…</tool_call>`).
    pub call: String,
    /// What the tool turn showed: the result, or `error: …`.
    pub output: String,
    /// Whether the call failed (bad JSON, unknown tool, bad arguments, a tool error).
    pub failed: bool,
}

impl ToolCallRecord {
    /// A record.
    ///
    /// See [`ToolCallRecord`] for an example.
    pub fn new(
        name: Option<&str>,
        call: impl Into<String>,
        output: impl Into<String>,
        failed: bool,
    ) -> Self {
        Self {
            name: name.map(str::to_string),
            call: call.into(),
            output: output.into(),
            failed,
        }
    }
}

/// A whole multi-turn completion: its text with the tool turns, and the calls it made. With
/// tool rollouts, reward functions get the final model turn as the completion (where the
/// answer is) and the trajectory in `atomrl_reward::RewardContext::trajectories`.
///
/// ```
/// use atomrl_core::{ToolCallRecord, Trajectory};
/// let t = Trajectory {
///     text: "<tool_call>…</tool_call>\n<tool_response>\n42\n</tool_response>\n<answer>\n42\n</answer>".into(),
///     tool_calls: vec![ToolCallRecord::new(Some("calculator"), "…", "42", false)],
/// };
/// assert_eq!(t.num_failed_calls(), 0);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Trajectory {
    /// Every model turn and tool turn after the prompt, decoded (special tokens skipped).
    pub text: String,
    /// The tool calls, in order.
    pub tool_calls: Vec<ToolCallRecord>,
}

impl Trajectory {
    /// The number of calls that failed.
    ///
    /// See [`Trajectory`] for an example.
    pub fn num_failed_calls(&self) -> usize {
        self.tool_calls.iter().filter(|c| c.failed).count()
    }
}
