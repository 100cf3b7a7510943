//! [`Experience`]: one step's data, from the rollouts to the update (OpenRLHF's "make
//! experience" phase fills it; everything after it only reads it).

use std::collections::HashMap;

use atomrl_core::shape::scalar_f64;
use atomrl_core::{CandleContext, Error, Result};
use atomrl_logprob::SharedPromptBatch;
use candle_core::{Device, Tensor};

/// A row's place in a preference pair (DPO, reward models): rows of the same `pair` id are
/// compared, the `chosen` one preferred.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PairRole {
    /// The pair's id.
    pub pair: u32,
    /// This row is the preferred completion of its pair.
    pub chosen: bool,
    /// How much better the chosen completion is (the dataset's `margin`; 0 when none), the
    /// same on both rows of a pair: a reward model's loss asks for at least this gap.
    pub margin: f32,
}

/// The global normaliser of a step's loss: every micro-batch divides by the whole step's
/// scored tokens and rows, so that the micro-batch losses add up to the full-batch loss (TRL
/// issue #3021). Kept when rows that cannot change the loss are dropped from the experience.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LossNormalizer {
    /// Completion tokens in the loss, over the whole step.
    pub tokens: f64,
    /// Rows of the whole step.
    pub rows: usize,
}

/// One step's data: what the update trains on, one row per completion.
///
/// # Shapes
/// - `input_ids [R, P + T]` (u32: left-padded prompt, then the right-padded completion),
///   `attention_mask [R, P + T]` (f32), `loss_mask [R, T]` (f32: 1 on the completion tokens
///   the model generated and that count in the loss; tool turns and masked rows are 0);
/// - `advantages [R]`; `old_log_probs`, `ref_log_probs`, `values`, `returns`: `[R, T]` each
///   when the recipe needs them;
/// - host columns, `R` entries each: `rewards`, `rewards_per_fn` (`F` each), `groups`,
///   `prompt_groups`, `pairs`.
///
/// Micro-batches are experiences too ([`rows`](Self::rows), [`select`](Self::select)): every
/// column is sliced alike, and the [`LossNormalizer`] stays the step's.
#[derive(Debug, Clone)]
pub struct Experience {
    /// Prompt and completion ids.
    pub input_ids: Tensor,
    /// 1 on real tokens.
    pub attention_mask: Tensor,
    /// 1 on completion tokens that count in the loss.
    pub loss_mask: Tensor,
    /// Completion width `T`.
    pub completion_len: usize,
    /// One advantage per row `[R]` (0 where the recipe has none, e.g. SFT), or per token
    /// `[R, T]` (GAE, [`attach_values_and_gae`](crate::attach_values_and_gae)).
    pub advantages: Tensor,
    /// Log-probs of the completion tokens under the policy that generated them (when the
    /// update takes more than one optimizer step on the same rollouts).
    pub old_log_probs: Option<Tensor>,
    /// Log-probs of the completion tokens under the reference model (KL penalty, β > 0).
    pub ref_log_probs: Option<Tensor>,
    /// A critic's value of each completion token (PPO).
    pub values: Option<Tensor>,
    /// The return of each completion token (PPO).
    pub returns: Option<Tensor>,
    /// Weighted total reward of each row (empty for recipes without rewards).
    pub rewards: Vec<f32>,
    /// Each reward function's unweighted score, per row.
    pub rewards_per_fn: Vec<Vec<f32>>,
    /// The group (prompt draw) of each row: the rows of a group share a prompt and are
    /// compared with each other.
    pub groups: Vec<u32>,
    /// Per row, an id shared by the rows with the same prompt tokens (ids in order of first
    /// appearance), so that a prompt runs through the model once for all its completions.
    pub prompt_groups: Vec<u32>,
    /// Preference pairs (DPO), per row.
    pub pairs: Option<Vec<PairRole>>,
    /// The step's loss normaliser.
    pub normalizer: LossNormalizer,
}

/// A row of [`Experience::from_rows`]: prompt ids, completion ids, and which completion tokens
/// the model generated.
pub type TokenRow<'a> = (&'a [u32], &'a [u32], &'a [bool]);

impl Experience {
    /// Pads `(prompt, completion, model_token)` rows (prompts to the left, completions to the
    /// right, with `pad_id`). The loss mask is 1 where `model_token` is true (tool turns of
    /// multi-turn rollouts are false: attended to, but outside the loss); rows whose `loss_row`
    /// is false keep their tokens but get an all-zero loss mask. Each row is its own group and
    /// the normaliser counts every row; other columns start empty.
    ///
    /// # Errors
    /// [`Error::Value`] when `advantages` or `loss_row` do not have one entry per row, or a
    /// row's `model_token` does not have one entry per completion token; tensor failures.
    ///
    /// ```
    /// use atomrl_rollout::Experience;
    /// use candle_core::Device;
    /// // Row 0: a model turn, a two-token tool turn, a model token. Row 1: left out of the loss.
    /// let rows: [(&[u32], &[u32], &[bool]); 2] = [
    ///     (&[1, 2], &[5, 6, 7, 8], &[true, false, false, true]),
    ///     (&[3], &[9], &[true]),
    /// ];
    /// let e = Experience::from_rows(&rows, &[0.5, -0.5], &[true, false], 0, &Device::Cpu)?;
    /// assert_eq!(e.input_ids.to_vec2::<u32>()?, [[1, 2, 5, 6, 7, 8], [0, 3, 9, 0, 0, 0]]);
    /// assert_eq!(e.loss_mask.to_vec2::<f32>()?, [[1.0, 0.0, 0.0, 1.0], [0.0; 4]]);
    /// assert_eq!((e.loss_tokens("example")?, e.normalizer.tokens), (2.0, 2.0));
    /// assert_eq!((e.num_rows(), e.completion_len, e.prompt_groups.clone()), (2, 4, vec![0, 1]));
    /// assert_eq!(e.rows(1, 1)?.num_rows(), 1);
    /// assert_eq!(e.select(&[1, 0])?.prompt_groups, [1, 0]);
    /// assert_eq!(e.select(&[1])?.compact()?.input_ids.to_vec2::<u32>()?, [[3, 9]]);
    /// assert!(e.shared_prompts()?.is_none()); // no two rows share a prompt
    /// let bad: [(&[u32], &[u32], &[bool]); 1] = [(&[1], &[5, 6], &[true])];
    /// let err = Experience::from_rows(&bad, &[0.0], &[true], 0, &Device::Cpu).unwrap_err();
    /// assert!(err.to_string().contains("rows[0].model_token"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn from_rows(
        rows: &[TokenRow<'_>],
        advantages: &[f32],
        loss_row: &[bool],
        pad_id: u32,
        device: &Device,
    ) -> Result<Self> {
        let func = "Experience::from_rows";
        check_rows(func, rows, advantages, loss_row)?;
        let p = rows.iter().map(|r| r.0.len()).max().unwrap_or(0);
        let t = rows.iter().map(|r| r.1.len()).max().unwrap_or(0).max(1);
        let (n, width) = (rows.len(), p + t);
        let mut ids = Vec::with_capacity(n * width);
        let mut mask = Vec::with_capacity(n * width);
        let mut cmask = Vec::with_capacity(n * t);
        let mut groups: HashMap<&[u32], u32> = HashMap::new();
        let mut prompt_groups = Vec::with_capacity(n);
        for (&(prompt, completion, model_token), &counts) in rows.iter().zip(loss_row) {
            let (lp, lc) = (prompt.len(), completion.len());
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
                    .map(|&m| f32::from(u8::from(counts && m))),
            );
            cmask.extend(std::iter::repeat_n(0f32, t - lc));
            let next = groups.len() as u32;
            prompt_groups.push(*groups.entry(prompt).or_insert(next));
        }
        let loss_tokens = cmask.iter().map(|&x| f64::from(x)).sum();
        Ok(Self {
            input_ids: Tensor::from_vec(ids, (n, width), device).ctx(func)?,
            attention_mask: Tensor::from_vec(mask, (n, width), device).ctx(func)?,
            loss_mask: Tensor::from_vec(cmask, (n, t), device).ctx(func)?,
            completion_len: t,
            advantages: Tensor::new(advantages, device).ctx(func)?,
            old_log_probs: None,
            ref_log_probs: None,
            values: None,
            returns: None,
            rewards: Vec::new(),
            rewards_per_fn: Vec::new(),
            groups: (0..n as u32).collect(),
            prompt_groups,
            pairs: None,
            normalizer: LossNormalizer {
                tokens: loss_tokens,
                rows: n,
            },
        })
    }

    /// Number of rows `R`.
    ///
    /// See [`Experience::from_rows`] for an example.
    pub fn num_rows(&self) -> usize {
        self.prompt_groups.len()
    }

    /// The number of completion tokens in the loss of these rows (the loss mask's sum).
    ///
    /// # Errors
    /// A tensor failure, reported as `func`'s.
    ///
    /// See [`Experience::from_rows`] for an example.
    pub fn loss_tokens(&self, func: &str) -> Result<f64> {
        scalar_f64(func, &self.loss_mask.sum_all().ctx(func)?)
    }

    /// Rows `start..start + len` of every column.
    ///
    /// # Errors
    /// An out-of-range slice.
    ///
    /// See [`Experience::from_rows`] for an example.
    pub fn rows(&self, start: usize, len: usize) -> Result<Self> {
        let func = "Experience::rows";
        if start + len > self.num_rows() {
            return Err(Error::value(
                func,
                "start + len",
                format!("<= {} rows", self.num_rows()),
                start + len,
            ));
        }
        let indices: Vec<usize> = (start..start + len).collect();
        self.map_rows(func, &indices, |t| t.narrow(0, start, len))
    }

    /// The rows at `indices` (in that order) of every column.
    ///
    /// # Errors
    /// An index out of range.
    ///
    /// See [`Experience::from_rows`] for an example.
    pub fn select(&self, indices: &[u32]) -> Result<Self> {
        let func = "Experience::select";
        if let Some(&bad) = indices.iter().find(|&&i| i as usize >= self.num_rows()) {
            return Err(Error::value(
                func,
                "indices",
                format!("row indices < {}", self.num_rows()),
                bad,
            ));
        }
        let idx = Tensor::new(indices, self.input_ids.device()).ctx(func)?;
        let host: Vec<usize> = indices.iter().map(|&i| i as usize).collect();
        // After `compact` the token columns are narrowed views; index_select needs contiguous
        // data (a no-op for the rest).
        self.map_rows(func, &host, |t| t.contiguous()?.index_select(&idx, 0))
    }

    /// The rows whose advantage is not exactly 0, without the columns that are then padding
    /// everywhere ([`compact`](Self::compact)); the normaliser stays the step's. With no KL
    /// and no entropy term a row of advantage 0 has a per-token loss of exactly 0 and no
    /// gradient: leaving it out changes nothing but the compute of every flat group.
    ///
    /// # Errors
    /// Tensor failures.
    ///
    /// ```
    /// use atomrl_rollout::Experience;
    /// use candle_core::Device;
    /// let rows: [(&[u32], &[u32], &[bool]); 3] = [(&[1], &[2, 3], &[true; 2]), (&[1], &[4], &[true]), (&[5], &[6], &[true])];
    /// let e = Experience::from_rows(&rows, &[0.0, 0.5, 0.0], &[true; 3], 0, &Device::Cpu)?;
    /// let kept = e.without_zero_advantage()?;
    /// assert_eq!((kept.num_rows(), kept.completion_len, kept.normalizer.tokens), (1, 1, 4.0));
    /// assert_eq!(e.select(&[0, 2])?.without_zero_advantage()?.num_rows(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn without_zero_advantage(&self) -> Result<Self> {
        let func = "Experience::without_zero_advantage";
        let adv: Vec<f32> = self
            .advantages
            .to_dtype(candle_core::DType::F32)
            .and_then(|a| a.to_vec1())
            .ctx(func)?;
        let keep: Vec<u32> = (0..adv.len() as u32)
            .filter(|&i| adv[i as usize] != 0.0)
            .collect();
        if keep.is_empty() {
            return self.rows(0, 0);
        }
        self.select(&keep)?.compact()
    }

    /// `f` applied to every row-major tensor, and the host columns taken at `rows`.
    fn map_rows(
        &self,
        func: &str,
        rows: &[usize],
        f: impl Fn(&Tensor) -> candle_core::Result<Tensor>,
    ) -> Result<Self> {
        let opt = |t: &Option<Tensor>| t.as_ref().map(&f).transpose().ctx(func);
        let pick = |v: &[f32]| (!v.is_empty()).then(|| rows.iter().map(|&r| v[r]).collect());
        Ok(Self {
            input_ids: f(&self.input_ids).ctx(func)?,
            attention_mask: f(&self.attention_mask).ctx(func)?,
            loss_mask: f(&self.loss_mask).ctx(func)?,
            completion_len: self.completion_len,
            advantages: f(&self.advantages).ctx(func)?,
            old_log_probs: opt(&self.old_log_probs)?,
            ref_log_probs: opt(&self.ref_log_probs)?,
            values: opt(&self.values)?,
            returns: opt(&self.returns)?,
            rewards: pick(&self.rewards).unwrap_or_default(),
            rewards_per_fn: if self.rewards_per_fn.is_empty() {
                Vec::new()
            } else {
                rows.iter()
                    .map(|&r| self.rewards_per_fn[r].clone())
                    .collect()
            },
            groups: rows.iter().map(|&r| self.groups[r]).collect(),
            prompt_groups: rows.iter().map(|&r| self.prompt_groups[r]).collect(),
            pairs: self
                .pairs
                .as_ref()
                .map(|p| rows.iter().map(|&r| p[r]).collect()),
            normalizer: self.normalizer,
        })
    }

    /// The same rows without the columns that are padding in every row: leading prompt pads
    /// and trailing completion pads (after [`Experience::select`] keeps a few rows, the
    /// longest prompt or completion is often gone). Positions come from the attention mask, so
    /// log-probs of the real tokens are unchanged.
    ///
    /// # Errors
    /// Tensor failures.
    ///
    /// See [`Experience::from_rows`] for an example.
    pub fn compact(&self) -> Result<Self> {
        let func = "Experience::compact";
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
        let (keep, t) = (width - lead - tail, self.completion_len - tail);
        let tokens = |x: &Option<Tensor>| x.as_ref().map(|x| x.narrow(1, 0, t)).transpose();
        // Per-token advantages (GAE) are token columns too.
        let advantages = if self.advantages.rank() == 2 {
            self.advantages.narrow(1, 0, t).ctx(func)?
        } else {
            self.advantages.clone()
        };
        Ok(Self {
            advantages,
            input_ids: self.input_ids.narrow(1, lead, keep).ctx(func)?,
            attention_mask: self.attention_mask.narrow(1, lead, keep).ctx(func)?,
            loss_mask: self.loss_mask.narrow(1, 0, t).ctx(func)?,
            completion_len: t,
            old_log_probs: tokens(&self.old_log_probs).ctx(func)?,
            ref_log_probs: tokens(&self.ref_log_probs).ctx(func)?,
            values: tokens(&self.values).ctx(func)?,
            returns: tokens(&self.returns).ctx(func)?,
            ..self.clone()
        })
    }

    /// The rows grouped by prompt, each distinct prompt once, for
    /// [`get_shared_prompt_log_probs`](atomrl_logprob::get_shared_prompt_log_probs); `None`
    /// when no two rows share a prompt (nothing to save).
    ///
    /// # Errors
    /// Tensor failures.
    ///
    /// See [`Experience::from_rows`] for an example.
    pub fn shared_prompts(&self) -> Result<Option<SharedPromptBatch>> {
        let func = "Experience::shared_prompts";
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
}

/// Checks that `advantages`, `loss_row` and every row's `model_token` have one entry per row
/// (per completion token).
fn check_rows(
    func: &str,
    rows: &[TokenRow<'_>],
    advantages: &[f32],
    loss_row: &[bool],
) -> Result<()> {
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
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Split into micro-batches (any split), the rows' loss tokens add up to the step's
        /// normaliser, which every micro-batch keeps; the loss mask counts exactly the model
        /// tokens of the rows in the loss.
        #[test]
        fn micro_batches_keep_the_step_normaliser(
            lens in proptest::collection::vec((1usize..5, 1usize..6, any::<u8>(), any::<bool>()), 1..8),
            parts in 1usize..5,
        ) {
            let prompts: Vec<Vec<u32>> = lens.iter().map(|&(p, ..)| (1..=p as u32).collect()).collect();
            let completions: Vec<Vec<u32>> = lens.iter().map(|&(_, c, ..)| vec![7; c]).collect();
            let marks: Vec<Vec<bool>> = lens
                .iter()
                .map(|&(_, c, bits, _)| (0..c).map(|i| bits >> (i % 8) & 1 == 1).collect())
                .collect();
            let loss_row: Vec<bool> = lens.iter().map(|&(.., counts)| counts).collect();
            let rows: Vec<TokenRow<'_>> = (0..lens.len())
                .map(|i| (prompts[i].as_slice(), completions[i].as_slice(), marks[i].as_slice()))
                .collect();
            let adv = vec![0.5f32; rows.len()];
            let e = Experience::from_rows(&rows, &adv, &loss_row, 0, &Device::Cpu).unwrap();
            let want: usize = marks
                .iter()
                .zip(&loss_row)
                .map(|(m, &c)| if c { m.iter().filter(|&&x| x).count() } else { 0 })
                .sum();
            prop_assert_eq!(e.normalizer.tokens, want as f64);
            let n = e.num_rows();
            let size = n.div_ceil(parts);
            let mut sum = 0.0;
            for start in (0..n).step_by(size) {
                let mb = e.rows(start, size.min(n - start)).unwrap();
                prop_assert_eq!(mb.normalizer, e.normalizer);
                sum += mb.loss_tokens("test").unwrap();
            }
            prop_assert_eq!(sum, e.normalizer.tokens);
        }
    }

    #[test]
    fn compact_drops_columns_that_are_padding_everywhere() {
        let d = Device::Cpu;
        let (long_p, long_c) = ([1u32, 2, 3, 4], [5u32, 6, 7, 8, 9]);
        let rows: [TokenRow<'_>; 3] = [
            (&long_p, &[5, 6], &[true; 2]),
            (&[3, 4], &[7], &[true]),
            (&[4], &long_c, &[true; 5]),
        ];
        let mut b = Experience::from_rows(&rows, &[1.0, -1.0, 0.5], &[true; 3], 0, &d).unwrap();
        b.old_log_probs = Some(Tensor::ones((3, 5), candle_core::DType::F32, &d).unwrap());
        let kept = b.select(&[1, 0]).unwrap().compact().unwrap();
        assert_eq!(kept.completion_len, 2);
        assert_eq!(kept.old_log_probs.unwrap().dims(), [2, 2]);
        let ids: Vec<Vec<u32>> = kept.input_ids.to_vec2().unwrap();
        assert_eq!(ids, vec![vec![0, 0, 3, 4, 7, 0], vec![1, 2, 3, 4, 5, 6]]);
        let cmask: Vec<Vec<f32>> = kept.loss_mask.to_vec2().unwrap();
        assert_eq!(cmask, vec![vec![1.0, 0.0], vec![1.0, 1.0]]);
        assert_eq!(kept.normalizer, b.normalizer);
        let short = b.select(&[1]).unwrap().compact().unwrap();
        assert_eq!(
            short.input_ids.to_vec2::<u32>().unwrap(),
            vec![vec![3, 4, 7]]
        );
        // Nothing to drop: the same rows.
        let full = b.compact().unwrap();
        assert_eq!(full.input_ids.dims(), b.input_ids.dims());
    }

    #[test]
    fn out_of_range_rows_are_errors_not_panics() {
        let d = Device::Cpu;
        let rows: [TokenRow<'_>; 1] = [(&[1], &[2], &[true])];
        let e = Experience::from_rows(&rows, &[0.0], &[true], 0, &d).unwrap();
        assert!(e
            .rows(0, 2)
            .unwrap_err()
            .to_string()
            .contains("start + len"));
        assert!(e.select(&[3]).unwrap_err().to_string().contains("indices"));
    }

    #[test]
    fn tool_turns_are_attended_to_but_not_in_the_loss() {
        let d = Device::Cpu;
        // model, model, tool, tool, model | a truncated row left out of the loss
        let rows: [TokenRow<'_>; 2] = [
            (&[1, 2], &[5, 6, 7, 8, 9], &[true, true, false, false, true]),
            (&[3], &[5, 6], &[true, false]),
        ];
        let b = Experience::from_rows(&rows, &[1.0, 1.0], &[true, false], 0, &d).unwrap();
        let cmask: Vec<Vec<f32>> = b.loss_mask.to_vec2().unwrap();
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
        let rows: [TokenRow<'_>; 4] = [
            (&a, &[5, 6], &[true; 2]),
            (&b, &[7], &[true]),
            (&a, &[8], &[true]),
            (&b, &[9, 9], &[true; 2]),
        ];
        let batch = Experience::from_rows(&rows, &[1.0; 4], &[true; 4], 0, &d).unwrap();
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
