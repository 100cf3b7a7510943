//! [`ToolRolloutBatch`]: what [`generate_with_tools`](crate::generate_with_tools) returns.

use atomrl_core::{CandleContext, Result};
use atomrl_tools::ToolOutcome;
use candle_core::{Device, Tensor};

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
    pub calls: Vec<ToolOutcome>,
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
        self.calls.iter().filter(|c| c.is_error()).count()
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

/// The padded tensors of a [`ToolRolloutBatch`] (see [`ToolRolloutBatch::to_tensors`]).
///
/// # Shapes
/// `input_ids [R, P + T]` u32 (prompt left-padded, completion right-padded),
/// `attention_mask [R, P + T]` f32 (1 on every real token, tool turns included),
/// `completion_mask [R, T]` f32 (1 on model tokens only), `sampling_log_probs [R, T]` f32.
#[derive(Debug, Clone)]
pub struct ToolRolloutTensors {
    /// Prompt and completion ids.
    pub input_ids: Tensor,
    /// 1 on prompt, model and tool tokens; 0 on padding.
    pub attention_mask: Tensor,
    /// 1 on the tokens the model generated.
    pub completion_mask: Tensor,
    /// Sampling log-probabilities, 0 off the completion mask.
    pub sampling_log_probs: Tensor,
    /// The completion width `T`.
    pub completion_len: usize,
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

    /// Pads the rows into the tensors of `get_action_log_probs(model, input_ids,
    /// attention_mask, T, ..)` and of a policy update: tool tokens stay in the attention mask
    /// (every later token sees them) but not in the completion mask.
    ///
    /// # Errors
    /// Tensor construction failures.
    ///
    /// See [`generate_with_tools`](crate::generate_with_tools) for an example.
    pub fn to_tensors(&self, pad_id: u32, device: &Device) -> Result<ToolRolloutTensors> {
        let func = "ToolRolloutBatch::to_tensors";
        let r = self.num_rows();
        let p = self.prompts.iter().map(Vec::len).max().unwrap_or(0);
        let t = self
            .trajectories
            .iter()
            .map(|x| x.completion_ids.len())
            .max()
            .unwrap_or(0);
        let mut ids = Vec::with_capacity(r * (p + t));
        let mut attention = Vec::with_capacity(r * (p + t));
        let mut loss = Vec::with_capacity(r * t);
        let mut lps = Vec::with_capacity(r * t);
        for (row, traj) in self.trajectories.iter().enumerate() {
            let prompt = self.prompt_of(row);
            let (lp, lc) = (prompt.len(), traj.completion_ids.len());
            ids.extend(std::iter::repeat_n(pad_id, p - lp));
            ids.extend_from_slice(prompt);
            ids.extend_from_slice(&traj.completion_ids);
            ids.extend(std::iter::repeat_n(pad_id, t - lc));
            attention.extend(std::iter::repeat_n(0f32, p - lp));
            attention.extend(std::iter::repeat_n(1f32, lp + lc));
            attention.extend(std::iter::repeat_n(0f32, t - lc));
            loss.extend(
                traj.model_token
                    .iter()
                    .map(|&m| if m { 1f32 } else { 0f32 }),
            );
            loss.extend(std::iter::repeat_n(0f32, t - lc));
            lps.extend_from_slice(&traj.sampling_log_probs);
            lps.extend(std::iter::repeat_n(0f32, t - lc));
        }
        Ok(ToolRolloutTensors {
            input_ids: Tensor::from_vec(ids, (r, p + t), device).ctx(func)?,
            attention_mask: Tensor::from_vec(attention, (r, p + t), device).ctx(func)?,
            completion_mask: Tensor::from_vec(loss, (r, t), device).ctx(func)?,
            sampling_log_probs: Tensor::from_vec(lps, (r, t), device).ctx(func)?,
            completion_len: t,
        })
    }
}
