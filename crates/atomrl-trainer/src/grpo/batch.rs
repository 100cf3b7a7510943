//! The padded tensors of a policy update, built from rollout rows.

use atomrl_core::{CandleContext, Result};
use candle_core::{Device, Tensor};

/// Padded inputs of one update.
///
/// # Shapes
/// `input_ids [R, P + T]` (u32: left-padded prompt then right-padded completion),
/// `attention_mask [R, P + T]` (f32), `completion_mask [R, T]` (f32), `advantages [R]`.
#[derive(Debug, Clone)]
pub struct TrainingBatch {
    /// Prompt and completion ids.
    pub input_ids: Tensor,
    /// 1 on real tokens.
    pub attention_mask: Tensor,
    /// 1 on completion tokens that count in the loss.
    pub completion_mask: Tensor,
    /// One advantage per row.
    pub advantages: Tensor,
    /// Completion width `T`.
    pub completion_len: usize,
}

impl TrainingBatch {
    /// Pads `(prompt, completion)` token sequences (prompts to the left, completions to the
    /// right, with `pad_id`); rows whose `loss_row` is false keep their tokens but get an
    /// all-zero completion mask.
    ///
    /// # Errors
    /// Tensor construction failures.
    pub fn build(
        rows: &[(&[u32], &[u32])],
        advantages: &[f32],
        loss_row: &[bool],
        pad_id: u32,
        device: &Device,
    ) -> Result<Self> {
        let func = "TrainingBatch";
        let p = rows.iter().map(|r| r.0.len()).max().unwrap_or(0);
        let t = rows.iter().map(|r| r.1.len()).max().unwrap_or(0).max(1);
        let (n, width) = (rows.len(), p + t);
        let mut ids = Vec::with_capacity(n * width);
        let mut mask = Vec::with_capacity(n * width);
        let mut cmask = Vec::with_capacity(n * t);
        for (&(prompt, completion), &counts) in rows.iter().zip(loss_row) {
            let lp = prompt.len();
            let lc = completion.len();
            ids.extend(std::iter::repeat_n(pad_id, p - lp));
            ids.extend(prompt);
            ids.extend(completion);
            ids.extend(std::iter::repeat_n(pad_id, t - lc));
            mask.extend(std::iter::repeat_n(0f32, p - lp));
            mask.extend(std::iter::repeat_n(1f32, lp + lc));
            mask.extend(std::iter::repeat_n(0f32, t - lc));
            let on = if counts { 1f32 } else { 0f32 };
            cmask.extend(std::iter::repeat_n(on, lc));
            cmask.extend(std::iter::repeat_n(0f32, t - lc));
        }
        Ok(Self {
            input_ids: Tensor::from_vec(ids, (n, width), device).ctx(func)?,
            attention_mask: Tensor::from_vec(mask, (n, width), device).ctx(func)?,
            completion_mask: Tensor::from_vec(cmask, (n, t), device).ctx(func)?,
            advantages: Tensor::new(advantages, device).ctx(func)?,
            completion_len: t,
        })
    }

    /// Rows `start..start + len` of every tensor.
    ///
    /// # Errors
    /// An out-of-range slice.
    pub fn rows(&self, start: usize, len: usize) -> Result<Self> {
        let func = "TrainingBatch::rows";
        Ok(Self {
            input_ids: self.input_ids.narrow(0, start, len).ctx(func)?,
            attention_mask: self.attention_mask.narrow(0, start, len).ctx(func)?,
            completion_mask: self.completion_mask.narrow(0, start, len).ctx(func)?,
            advantages: self.advantages.narrow(0, start, len).ctx(func)?,
            completion_len: self.completion_len,
        })
    }

    /// The rows at `indices` (in that order) of every tensor.
    ///
    /// # Errors
    /// An index out of range.
    pub fn select(&self, indices: &[u32]) -> Result<Self> {
        let func = "TrainingBatch::select";
        let idx = Tensor::new(indices, self.input_ids.device()).ctx(func)?;
        Ok(Self {
            input_ids: self.input_ids.index_select(&idx, 0).ctx(func)?,
            attention_mask: self.attention_mask.index_select(&idx, 0).ctx(func)?,
            completion_mask: self.completion_mask.index_select(&idx, 0).ctx(func)?,
            advantages: self.advantages.index_select(&idx, 0).ctx(func)?,
            completion_len: self.completion_len,
        })
    }

    /// Number of rows `R`.
    pub fn num_rows(&self) -> usize {
        self.advantages.dims().first().copied().unwrap_or(0)
    }
}
