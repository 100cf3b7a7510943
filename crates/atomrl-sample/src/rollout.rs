//! [`RolloutBatch`]: what [`generate_samples`](crate::generate_samples) returns.

use std::fmt;
use std::str::FromStr;

use atomrl_core::{Error, Result};
use candle_core::Tensor;

/// Why a completion ended.
///
/// ```
/// use atomrl_sample::FinishReason;
/// assert_eq!(FinishReason::Length.to_string(), "length");
/// assert_eq!("eos".parse::<FinishReason>()?, FinishReason::Eos);
/// # Ok::<(), atomrl_core::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum FinishReason {
    /// A token of [`SamplingParams::stop_token_ids`](crate::SamplingParams::stop_token_ids)
    /// was sampled (it is the last token of the completion, inside the mask).
    Eos,
    /// The decoded text came to contain a stop string; the completion ends with the token
    /// that completed it.
    Stop,
    /// `max_new_tokens` were generated without a stop: the completion is truncated.
    Length,
}

impl FinishReason {
    /// `"eos"`, `"stop"` or `"length"`.
    ///
    /// ```
    /// assert_eq!(atomrl_sample::FinishReason::Stop.as_str(), "stop");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Eos => "eos",
            Self::Stop => "stop",
            Self::Length => "length",
        }
    }
}

impl fmt::Display for FinishReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for FinishReason {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "eos" => Ok(Self::Eos),
            "stop" => Ok(Self::Stop),
            "length" => Ok(Self::Length),
            other => Err(Error::unknown_choice(
                "FinishReason::from_str",
                "finish_reason",
                &["eos", "stop", "length"],
                other,
            )),
        }
    }
}

/// The rollouts of one generation call: `R = B·G` rows, prompt-major (row `b·G + g` is the
/// `g`-th completion of prompt `b`). Tensors are on the model's device.
///
/// # Shapes
/// - `prompt_ids [R, P]` u32, left-padded with the pad id; `prompt_mask [R, P]` f32.
/// - `completion_ids [R, T]` u32, right-padded with the pad id, `T` = the longest completion;
///   `completion_mask [R, T]` f32: 1 on generated tokens up to and including the stop token
///   (TRL's convention), 0 after.
/// - `lengths [R]`: completion lengths (the mask's row sums).
/// - `sampling_log_probs [R, T]` f32: `log softmax(logits / T)[token]` of each sampled token
///   under the raw model logits (no repetition penalty, no top-k/top-p/min-p truncation;
///   temperature 1 when greedy): what `get_action_log_probs(.., temperature)` recomputes on
///   the same sequences. 0 where the mask is 0.
///
/// ```
/// use atomrl_model::CausalLm;
/// use atomrl_sample::{generate_samples, SamplingParams};
/// use candle_core::{DType, Device};
/// let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/reference/models/tiny-qwen2");
/// let model = CausalLm::from_hf_dir(dir, DType::F32, &Device::Cpu)?;
/// let p = SamplingParams { num_generations: 2, max_new_tokens: 3, ..Default::default() };
/// let out = generate_samples(&model, &[vec![1, 5, 6]], &p, None)?;
/// assert_eq!(out.num_rows(), 2);
/// assert_eq!(out.group_index, vec![0, 0]);
/// assert_eq!(out.completion_rows()?[0].len(), out.lengths[0]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct RolloutBatch {
    /// Prompts `[R, P]` (u32), left-padded.
    pub prompt_ids: Tensor,
    /// 1 on prompt tokens, 0 on padding, `[R, P]` (f32).
    pub prompt_mask: Tensor,
    /// Completions `[R, T]` (u32), right-padded.
    pub completion_ids: Tensor,
    /// 1 on completion tokens (stop token included), `[R, T]` (f32).
    pub completion_mask: Tensor,
    /// Completion lengths, one per row.
    pub lengths: Vec<usize>,
    /// Why each row ended.
    pub finish_reasons: Vec<FinishReason>,
    /// Log-probability of each sampled token under `softmax(logits / temperature)`, `[R, T]`
    /// (f32), 0 where masked.
    pub sampling_log_probs: Tensor,
    /// The prompt (group) of each row: `row / G`.
    pub group_index: Vec<usize>,
    /// Total tokens generated (the sum of `lengths`).
    pub num_generated_tokens: usize,
}

impl RolloutBatch {
    /// Number of rows `R`.
    ///
    /// See [`RolloutBatch`] for an example.
    pub fn num_rows(&self) -> usize {
        self.lengths.len()
    }

    /// The completions as token lists, each cut to its length.
    ///
    /// # Errors
    /// [`Error::Candle`] if the tensor cannot be read.
    ///
    /// See [`RolloutBatch`] for an example.
    pub fn completion_rows(&self) -> Result<Vec<Vec<u32>>> {
        use atomrl_core::CandleContext;
        let rows = self
            .completion_ids
            .to_vec2::<u32>()
            .ctx("RolloutBatch::completion_rows")?;
        Ok(rows
            .into_iter()
            .zip(&self.lengths)
            .map(|(mut r, &n)| {
                r.truncate(n);
                r
            })
            .collect())
    }

    /// `prompt_ids ++ completion_ids` `[R, P + T]` and the matching mask: the input of
    /// `get_action_log_probs(model, ids, mask, T, temperature, ..)`.
    ///
    /// # Errors
    /// [`Error::Candle`] if the tensors cannot be concatenated.
    ///
    /// ```
    /// # use atomrl_model::CausalLm;
    /// # use atomrl_sample::{generate_samples, SamplingParams};
    /// # use candle_core::{DType, Device};
    /// # let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/reference/models/tiny-qwen2");
    /// # let model = CausalLm::from_hf_dir(dir, DType::F32, &Device::Cpu)?;
    /// let p = SamplingParams { max_new_tokens: 2, ..Default::default() };
    /// let out = generate_samples(&model, &[vec![1, 5]], &p, None)?;
    /// let (ids, mask) = out.full_sequences()?;
    /// assert_eq!(ids.dims()[1], 2 + out.completion_ids.dims()[1]);
    /// assert_eq!(mask.dims(), ids.dims());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn full_sequences(&self) -> Result<(Tensor, Tensor)> {
        use atomrl_core::CandleContext;
        let func = "RolloutBatch::full_sequences";
        let ids = Tensor::cat(&[&self.prompt_ids, &self.completion_ids], 1).ctx(func)?;
        let mask = Tensor::cat(&[&self.prompt_mask, &self.completion_mask], 1).ctx(func)?;
        Ok((ids, mask))
    }
}
