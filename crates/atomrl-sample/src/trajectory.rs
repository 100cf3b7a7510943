//! [`ToolRolloutBatch`]: what [`generate_with_tools`](crate::generate_with_tools) returns.

use atomrl_core::ToolCallRecord;

use crate::rollout::FinishReason;

/// One multi-turn completion: the model's turns and the tool turns between them, as one token
/// sequence that follows the prompt.
///
/// `completion_ids`, `model_token` and `sampling_log_probs` have one entry per token.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolTrajectory {
    /// Every token after the prompt: model turns and tool turns, in order.
    pub completion_ids: Vec<u32>,
    /// `true` on the tokens the model generated (they count in the loss), `false` on the tool
    /// turns the rollout appended (context only: no loss, no KL, no entropy).
    pub model_token: Vec<bool>,
    /// `log softmax(logits / T)` of each generated token (as
    /// [`RolloutBatch::sampling_log_probs`](crate::RolloutBatch)); 0 on tool tokens.
    pub sampling_log_probs: Vec<f32>,
    /// Why the last model turn ended ([`FinishReason::Length`] also when the
    /// `max_new_tokens` budget left no room for a tool response).
    pub finish_reason: FinishReason,
    /// Every tool call the model made, in order, with its output or error.
    pub calls: Vec<ToolCallRecord>,
    /// Start of each model turn in `completion_ids` (the first is 0).
    pub turn_starts: Vec<usize>,
    /// The model asked for a tool once more after `max_tool_turns` tool turns: its last
    /// calls were not run.
    pub stopped_at_max_turns: bool,
}

impl ToolTrajectory {
    /// The tokens of the last model turn (where the final answer is).
    ///
    /// ```
    /// use atomrl_sample::{FinishReason, ToolTrajectory};
    /// let t = ToolTrajectory {
    ///     completion_ids: vec![5, 6, 7, 8, 9],
    ///     model_token: vec![true, true, false, true, true],
    ///     sampling_log_probs: vec![-0.1, -0.2, 0.0, -0.3, -0.4],
    ///     finish_reason: FinishReason::Eos,
    ///     calls: vec![],
    ///     turn_starts: vec![0, 3],
    ///     stopped_at_max_turns: false,
    /// };
    /// assert_eq!(t.final_turn(), &[8, 9]);
    /// assert_eq!(t.num_model_tokens(), 4);
    /// ```
    pub fn final_turn(&self) -> &[u32] {
        let start = self.turn_starts.last().copied().unwrap_or(0);
        &self.completion_ids[start.min(self.completion_ids.len())..]
    }

    /// The number of tokens the model generated (tool tokens excluded).
    ///
    /// See [`ToolTrajectory::final_turn`] for an example.
    pub fn num_model_tokens(&self) -> usize {
        self.model_token.iter().filter(|&&m| m).count()
    }

    /// The number of calls that failed (bad JSON, unknown tool, bad arguments, a tool error or
    /// a timeout).
    ///
    /// See [`generate_with_tools`](crate::generate_with_tools) for an example.
    pub fn num_failed_calls(&self) -> usize {
        self.calls.iter().filter(|c| c.failed).count()
    }
}

/// Multi-turn rollouts of `B` prompts, `G` each: row `b·G + g` is trajectory `g` of prompt
/// `b` (prompt-major, as [`RolloutBatch`](crate::RolloutBatch)).
#[derive(Debug, Clone)]
pub struct ToolRolloutBatch {
    /// The prompts (unpadded), one per group.
    pub prompts: Vec<Vec<u32>>,
    /// Completions per prompt `G`.
    pub num_generations: usize,
    /// One trajectory per row, `R = B·G`.
    pub trajectories: Vec<ToolTrajectory>,
    /// Tokens the model generated in all (tool tokens excluded).
    pub num_generated_tokens: usize,
}

impl ToolRolloutBatch {
    /// Number of rows `R`.
    ///
    /// See [`generate_with_tools`](crate::generate_with_tools) for an example.
    pub fn num_rows(&self) -> usize {
        self.trajectories.len()
    }

    /// The prompt of row `row`.
    ///
    /// See [`generate_with_tools`](crate::generate_with_tools) for an example.
    pub fn prompt_of(&self, row: usize) -> &[u32] {
        &self.prompts[row / self.num_generations.max(1)]
    }
}
