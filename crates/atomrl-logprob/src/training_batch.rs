//! [`TrainingBatch`]: the padded tensors of a policy update (or an SFT step), built from
//! `(prompt, completion, loss mask)` token rows.

use std::collections::HashMap;

use atomrl_core::shape::scalar_f64;
use atomrl_core::{CandleContext, Error, Result};
use candle_core::{Device, Tensor};

use crate::shared_prompt::SharedPromptBatch;

/// Padded inputs of one update.
///
/// # Shapes
/// `input_ids [R, P + T]` (u32: left-padded prompt then right-padded completion),
/// `attention_mask [R, P + T]` (f32), `completion_mask [R, T]` (f32), `advantages [R]`,
/// `prompt_groups` (R entries).
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
    /// Per row, an id shared by the rows with the same prompt tokens (ids in order of first
    /// appearance in [`TrainingBatch::build`]'s rows).
    pub prompt_groups: Vec<u32>,
}

impl TrainingBatch {
    /// The number of completion tokens in the loss (the completion mask's sum).
    ///
    /// # Errors
    /// A tensor failure, reported as `func`'s.
    ///
    /// See [`TrainingBatch::build`] for an example.
    pub fn completion_tokens(&self, func: &str) -> Result<f64> {
        scalar_f64(func, &self.completion_mask.sum_all().ctx(func)?)
    }

    /// Pads `(prompt, completion, model_token)` rows (prompts to the left, completions to the
    /// right, with `pad_id`). The completion mask is 1 where `model_token` is true (tool turns
    /// of multi-turn rollouts are false: attended to, but outside the loss); rows whose
    /// `loss_row` is false keep their tokens but get an all-zero completion mask.
    ///
    /// # Errors
    /// [`Error::Value`] when `advantages` or `loss_row` do not have one entry per row, or a
    /// row's `model_token` does not have one entry per completion token; tensor failures.
    ///
    /// ```
    /// use atomrl_logprob::TrainingBatch;
    /// use candle_core::Device;
    /// // Row 0: a model turn, a two-token tool turn, a model token. Row 1: left out of the loss.
    /// let rows: [(&[u32], &[u32], &[bool]); 2] = [
    ///     (&[1, 2], &[5, 6, 7, 8], &[true, false, false, true]),
    ///     (&[3], &[9], &[true]),
    /// ];
    /// let b = TrainingBatch::build(&rows, &[0.5, -0.5], &[true, false], 0, &Device::Cpu)?;
    /// assert_eq!(b.input_ids.to_vec2::<u32>()?, [[1, 2, 5, 6, 7, 8], [0, 3, 9, 0, 0, 0]]);
    /// assert_eq!(b.completion_mask.to_vec2::<f32>()?, [[1.0, 0.0, 0.0, 1.0], [0.0; 4]]);
    /// assert_eq!(b.completion_tokens("example")?, 2.0);
    /// assert_eq!((b.num_rows(), b.completion_len, b.prompt_groups.clone()), (2, 4, vec![0, 1]));
    /// assert_eq!(b.rows(1, 1)?.num_rows(), 1);
    /// assert_eq!(b.select(&[1, 0])?.prompt_groups, [1, 0]);
    /// assert_eq!(b.select(&[1])?.compact()?.input_ids.to_vec2::<u32>()?, [[3, 9]]);
    /// assert!(b.shared_prompts()?.is_none()); // no two rows share a prompt
    /// let bad: [(&[u32], &[u32], &[bool]); 1] = [(&[1], &[5, 6], &[true])];
    /// let err = TrainingBatch::build(&bad, &[0.0], &[true], 0, &Device::Cpu).unwrap_err();
    /// assert!(err.to_string().contains("rows[0].model_token"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn build(
        rows: &[(&[u32], &[u32], &[bool])],
        advantages: &[f32],
        loss_row: &[bool],
        pad_id: u32,
        device: &Device,
    ) -> Result<Self> {
        let func = "TrainingBatch";
        let n_rows = format!("{} entries (one per row)", rows.len());
        if advantages.len() != rows.len() {
            return Err(Error::value(func, "advantages", &n_rows, advantages.len()));
        }
        if loss_row.len() != rows.len() {
            return Err(Error::value(func, "loss_row", &n_rows, loss_row.len()));
        }
        for (i, (_, completion, model_token)) in rows.iter().enumerate() {
            if model_token.len() != completion.len() {
                return Err(Error::value(
                    func,
                    format!("rows[{i}].model_token"),
                    format!("{} entries (one per completion token)", completion.len()),
                    model_token.len(),
                ));
            }
        }
        let p = rows.iter().map(|r| r.0.len()).max().unwrap_or(0);
        let t = rows.iter().map(|r| r.1.len()).max().unwrap_or(0).max(1);
        let (n, width) = (rows.len(), p + t);
        let mut ids = Vec::with_capacity(n * width);
        let mut mask = Vec::with_capacity(n * width);
        let mut cmask = Vec::with_capacity(n * t);
        let mut groups: HashMap<&[u32], u32> = HashMap::new();
        let mut prompt_groups = Vec::with_capacity(n);
        for (&(prompt, completion, model_token), &counts) in rows.iter().zip(loss_row) {
            let lp = prompt.len();
            let lc = completion.len();
            ids.extend(std::iter::repeat_n(pad_id, p - lp));
            ids.extend(prompt);
            ids.extend(completion);
            ids.extend(std::iter::repeat_n(pad_id, t - lc));
            mask.extend(std::iter::repeat_n(0f32, p - lp));
            mask.extend(std::iter::repeat_n(1f32, lp + lc));
            mask.extend(std::iter::repeat_n(0f32, t - lc));
            cmask.extend(
                model_token
                    .iter()
                    .map(|&m| if counts && m { 1f32 } else { 0f32 }),
            );
            cmask.extend(std::iter::repeat_n(0f32, t - lc));
            let next = groups.len() as u32;
            prompt_groups.push(*groups.entry(prompt).or_insert(next));
        }
        Ok(Self {
            input_ids: Tensor::from_vec(ids, (n, width), device).ctx(func)?,
            attention_mask: Tensor::from_vec(mask, (n, width), device).ctx(func)?,
            completion_mask: Tensor::from_vec(cmask, (n, t), device).ctx(func)?,
            advantages: Tensor::new(advantages, device).ctx(func)?,
            completion_len: t,
            prompt_groups,
        })
    }

    /// Rows `start..start + len` of every tensor.
    ///
    /// # Errors
    /// An out-of-range slice.
    ///
    /// See [`TrainingBatch::build`] for an example.
    pub fn rows(&self, start: usize, len: usize) -> Result<Self> {
        let func = "TrainingBatch::rows";
        Ok(Self {
            input_ids: self.input_ids.narrow(0, start, len).ctx(func)?,
            attention_mask: self.attention_mask.narrow(0, start, len).ctx(func)?,
            completion_mask: self.completion_mask.narrow(0, start, len).ctx(func)?,
            advantages: self.advantages.narrow(0, start, len).ctx(func)?,
            completion_len: self.completion_len,
            prompt_groups: self.prompt_groups[start..start + len].to_vec(),
        })
    }

    /// The rows at `indices` (in that order) of every tensor.
    ///
    /// # Errors
    /// An index out of range.
    ///
    /// See [`TrainingBatch::build`] for an example.
    pub fn select(&self, indices: &[u32]) -> Result<Self> {
        let func = "TrainingBatch::select";
        let idx = Tensor::new(indices, self.input_ids.device()).ctx(func)?;
        Ok(Self {
            input_ids: self.input_ids.index_select(&idx, 0).ctx(func)?,
            attention_mask: self.attention_mask.index_select(&idx, 0).ctx(func)?,
            completion_mask: self.completion_mask.index_select(&idx, 0).ctx(func)?,
            advantages: self.advantages.index_select(&idx, 0).ctx(func)?,
            completion_len: self.completion_len,
            prompt_groups: indices
                .iter()
                .map(|&i| self.prompt_groups[i as usize])
                .collect(),
        })
    }

    /// The same rows without the columns that are padding in every row: leading prompt pads
    /// and trailing completion pads (after [`TrainingBatch::select`] keeps a few rows, the
    /// longest prompt or completion is often gone). Positions come from the attention mask, so
    /// log-probs of the real tokens are unchanged.
    ///
    /// # Errors
    /// Tensor failures.
    ///
    /// See [`TrainingBatch::build`] for an example.
    pub fn compact(&self) -> Result<Self> {
        let func = "TrainingBatch::compact";
        let mask: Vec<Vec<f32>> = self.attention_mask.to_vec2().ctx(func)?;
        let width = mask.first().map_or(0, Vec::len);
        let prompt_width = width - self.completion_len;
        let any_real = |c: usize| mask.iter().any(|row| row[c] != 0.0);
        let lead = (0..prompt_width).take_while(|&c| !any_real(c)).count();
        let tail = (prompt_width..width)
            .rev()
            .take_while(|&c| !any_real(c))
            .count()
            .min(self.completion_len.saturating_sub(1));
        if lead == 0 && tail == 0 {
            return Ok(self.clone());
        }
        let keep = width - lead - tail;
        let t = self.completion_len - tail;
        Ok(Self {
            input_ids: self.input_ids.narrow(1, lead, keep).ctx(func)?,
            attention_mask: self.attention_mask.narrow(1, lead, keep).ctx(func)?,
            completion_mask: self.completion_mask.narrow(1, 0, t).ctx(func)?,
            advantages: self.advantages.clone(),
            completion_len: t,
            prompt_groups: self.prompt_groups.clone(),
        })
    }

    /// The rows grouped by prompt, each distinct prompt once, for
    /// [`get_shared_prompt_log_probs`](crate::get_shared_prompt_log_probs); `None` when no two rows share a prompt
    /// (nothing to save).
    ///
    /// # Errors
    /// Tensor failures.
    ///
    /// See [`TrainingBatch::build`] for an example.
    pub fn shared_prompts(&self) -> Result<Option<SharedPromptBatch>> {
        let func = "TrainingBatch::shared_prompts";
        // Local prompt numbers in order of first appearance, and the first row of each.
        let mut local: HashMap<u32, u32> = HashMap::new();
        let mut first_rows = Vec::new();
        let mut prompt_index = Vec::with_capacity(self.prompt_groups.len());
        for (row, group) in self.prompt_groups.iter().enumerate() {
            let next = local.len() as u32;
            let id = *local.entry(*group).or_insert_with(|| {
                first_rows.push(row as u32);
                next
            });
            prompt_index.push(id);
        }
        if first_rows.len() == prompt_index.len() {
            return Ok(None);
        }
        let device = self.input_ids.device();
        let width = self.input_ids.dim(1).ctx(func)?;
        let p = width - self.completion_len;
        let firsts = Tensor::new(first_rows, device).ctx(func)?;
        let prompts = |x: &Tensor| x.narrow(1, 0, p)?.contiguous()?.index_select(&firsts, 0);
        let completions = |x: &Tensor| x.narrow(1, p, self.completion_len)?.contiguous();
        Ok(Some(SharedPromptBatch {
            prompt_ids: prompts(&self.input_ids).ctx(func)?,
            prompt_mask: prompts(&self.attention_mask).ctx(func)?,
            completion_ids: completions(&self.input_ids).ctx(func)?,
            completion_mask: completions(&self.attention_mask).ctx(func)?,
            prompt_index: Tensor::new(prompt_index, device).ctx(func)?,
        }))
    }

    /// Number of rows `R`.
    ///
    /// See [`TrainingBatch::build`] for an example.
    pub fn num_rows(&self) -> usize {
        self.advantages.dims().first().copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compact_drops_columns_that_are_padding_everywhere() {
        let d = Device::Cpu;
        let (long_p, long_c) = ([1u32, 2, 3, 4], [5u32, 6, 7, 8, 9]);
        let rows: [(&[u32], &[u32], &[bool]); 3] = [
            (&long_p, &[5, 6], &[true; 2]),
            (&[3, 4], &[7], &[true]),
            (&[4], &long_c, &[true; 5]),
        ];
        let b = TrainingBatch::build(&rows, &[1.0, -1.0, 0.5], &[true; 3], 0, &d).unwrap();
        let kept = b.select(&[1, 0]).unwrap().compact().unwrap();
        assert_eq!(kept.completion_len, 2);
        let ids: Vec<Vec<u32>> = kept.input_ids.to_vec2().unwrap();
        assert_eq!(ids, vec![vec![0, 0, 3, 4, 7, 0], vec![1, 2, 3, 4, 5, 6]]);
        let cmask: Vec<Vec<f32>> = kept.completion_mask.to_vec2().unwrap();
        assert_eq!(cmask, vec![vec![1.0, 0.0], vec![1.0, 1.0]]);
        let short = b.select(&[1]).unwrap().compact().unwrap();
        assert_eq!(
            short.input_ids.to_vec2::<u32>().unwrap(),
            vec![vec![3, 4, 7]]
        );
        // Nothing to drop: the same batch.
        let full = b.compact().unwrap();
        assert_eq!(full.input_ids.dims(), b.input_ids.dims());
    }

    #[test]
    fn tool_turns_are_attended_to_but_not_in_the_loss() {
        let d = Device::Cpu;
        // model, model, tool, tool, model | a truncated row left out of the loss
        let rows: [(&[u32], &[u32], &[bool]); 2] = [
            (&[1, 2], &[5, 6, 7, 8, 9], &[true, true, false, false, true]),
            (&[3], &[5, 6], &[true, false]),
        ];
        let b = TrainingBatch::build(&rows, &[1.0, 1.0], &[true, false], 0, &d).unwrap();
        let cmask: Vec<Vec<f32>> = b.completion_mask.to_vec2().unwrap();
        assert_eq!(
            cmask,
            vec![vec![1.0, 1.0, 0.0, 0.0, 1.0], vec![0.0, 0.0, 0.0, 0.0, 0.0]]
        );
        let att: Vec<Vec<f32>> = b.attention_mask.to_vec2().unwrap();
        assert_eq!(att[0], vec![1.0; 7]);
        assert_eq!(att[1], vec![0.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0]);
    }

    #[test]
    fn shared_prompts_keep_each_prompt_once() {
        let d = Device::Cpu;
        let (a, b) = ([1u32, 2, 3], [4u32]);
        let rows: [(&[u32], &[u32], &[bool]); 4] = [
            (&a, &[5, 6], &[true; 2]),
            (&b, &[7], &[true]),
            (&a, &[8], &[true]),
            (&b, &[9, 9], &[true; 2]),
        ];
        let batch = TrainingBatch::build(&rows, &[1.0; 4], &[true; 4], 0, &d).unwrap();
        assert_eq!(batch.prompt_groups, vec![0, 1, 0, 1]);
        // After dropping the first row, prompt `b` comes first.
        let shared = batch
            .select(&[1, 2, 3])
            .unwrap()
            .shared_prompts()
            .unwrap()
            .unwrap();
        let prompts: Vec<Vec<u32>> = shared.prompt_ids.to_vec2().unwrap();
        assert_eq!(prompts, vec![vec![0, 0, 4], vec![1, 2, 3]]);
        assert_eq!(shared.prompt_index.to_vec1::<u32>().unwrap(), vec![0, 1, 0]);
        let completions: Vec<Vec<u32>> = shared.completion_ids.to_vec2().unwrap();
        assert_eq!(completions, vec![vec![7, 0], vec![8, 0], vec![9, 9]]);
        let cmask: Vec<Vec<f32>> = shared.completion_mask.to_vec2().unwrap();
        assert_eq!(cmask, vec![vec![1.0, 0.0], vec![1.0, 0.0], vec![1.0, 1.0]]);
        // Distinct prompts only: nothing to share.
        assert!(batch
            .select(&[0, 1])
            .unwrap()
            .shared_prompts()
            .unwrap()
            .is_none());
    }
}
