//! [`RolloutRecord`]: one generated completion as the run logs it (`samples.jsonl`), for the
//! dashboard's rollout browser and for reading completions next to their rewards.

use std::collections::BTreeMap;

use crate::ToolCallRecord;

/// Characters of a prompt, completion or tool output kept in a record: a bound on the size of
/// `samples.jsonl` whatever the model generates (the rest is cut, and `…` marks the cut).
pub const RECORD_TEXT_MAX_CHARS: usize = 8_000;

/// One completion of a step: its prompt, text, rewards, advantage, length, finish reason and
/// tool calls. Serialises as one JSON object per line of `samples.jsonl` (with the step, see
/// `atomrl_metrics::MetricsLogger::log_samples`); non-finite numbers become `null`.
///
/// ```
/// use atomrl_core::RolloutRecord;
/// let r = RolloutRecord {
///     group: 0,
///     prompt: "What is 3+4?".into(),
///     completion: "<answer>7</answer>".into(),
///     reward: 1.5,
///     rewards: [("accuracy".to_string(), 1.0), ("format".to_string(), 0.5)].into(),
///     advantage: Some(0.8),
///     correct: Some(true),
///     completion_tokens: 6,
///     finish_reason: "eos".into(),
///     tool_calls: vec![],
/// };
/// let json = serde_json::to_value(&r)?;
/// assert_eq!(json["rewards"]["format"], 0.5);
/// assert_eq!(serde_json::from_value::<RolloutRecord>(json)?, r);
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RolloutRecord {
    /// The prompt's index in the step: the `G` completions of a prompt share it.
    pub group: usize,
    /// The prompt as the model read it (through the chat template, with the system prompt).
    pub prompt: String,
    /// The whole completion, tool turns included.
    pub completion: String,
    /// The total (weighted) reward.
    pub reward: f64,
    /// Each reward function's unweighted score, by name.
    #[serde(default)]
    pub rewards: BTreeMap<String, f64>,
    /// The advantage the update used (`None` where a critic gives per-token advantages).
    #[serde(default)]
    pub advantage: Option<f64>,
    /// Whether the configured accuracy counts the completion correct.
    #[serde(default)]
    pub correct: Option<bool>,
    /// Completion length in tokens (tool turns included).
    #[serde(default)]
    pub completion_tokens: usize,
    /// Why generation stopped: `eos`, `stop` or `length` (truncated).
    #[serde(default)]
    pub finish_reason: String,
    /// The tool calls of a multi-turn completion, in order.
    #[serde(default)]
    pub tool_calls: Vec<ToolCallRecord>,
}

impl RolloutRecord {
    /// The record with its texts (prompt, completion, tool calls and outputs) cut to
    /// [`RECORD_TEXT_MAX_CHARS`] characters each.
    ///
    /// ```
    /// use atomrl_core::rollout_record::{RolloutRecord, RECORD_TEXT_MAX_CHARS};
    /// let r = RolloutRecord {
    ///     group: 0, prompt: "p".into(), completion: "x".repeat(RECORD_TEXT_MAX_CHARS + 10),
    ///     reward: 0.0, rewards: Default::default(), advantage: None, correct: None,
    ///     completion_tokens: 0, finish_reason: "length".into(), tool_calls: vec![],
    /// };
    /// let cut = r.bounded();
    /// assert_eq!(cut.completion.chars().count(), RECORD_TEXT_MAX_CHARS + 1);
    /// assert!(cut.completion.ends_with('…'));
    /// ```
    pub fn bounded(mut self) -> Self {
        cut(&mut self.prompt);
        cut(&mut self.completion);
        for c in &mut self.tool_calls {
            cut(&mut c.call);
            cut(&mut c.output);
        }
        self
    }
}

/// Cuts `text` to [`RECORD_TEXT_MAX_CHARS`] characters, marking the cut with `…`.
fn cut(text: &mut String) {
    if let Some((at, _)) = text.char_indices().nth(RECORD_TEXT_MAX_CHARS) {
        text.truncate(at);
        text.push('…');
    }
}
