//! [`SamplingParams`]: how completions are sampled.

use atomrl_core::{Error, Result};

/// Everything that decides how [`generate_samples`](crate::generate_samples) samples.
///
/// The per-step pipeline (the order of Hugging Face's logits processors and warpers) is:
/// repetition penalty → temperature → top-k → top-p → min-p → sample; `temperature = 0`
/// means greedy (argmax after the repetition penalty; the filters cannot change the argmax).
/// See [`process_logits`](crate::process_logits) for the exact rules.
///
/// ```
/// use atomrl_sample::SamplingParams;
/// let p = SamplingParams { num_generations: 4, temperature: 0.7, top_p: 0.95, ..Default::default() };
/// p.validate()?;
/// assert_eq!(p.max_new_tokens, 256);
/// let bad = SamplingParams { top_p: 0.0, ..Default::default() };
/// assert!(bad.validate().unwrap_err().to_string().contains("`top_p`"));
/// # Ok::<(), atomrl_core::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// `G`: completions sampled per prompt (≥ 1).
    pub num_generations: usize,
    /// Most tokens generated per completion (≥ 1); a row that reaches it ends with
    /// [`FinishReason::Length`](crate::FinishReason::Length).
    pub max_new_tokens: usize,
    /// Softmax temperature (finite, ≥ 0); 0 is greedy decoding.
    pub temperature: f64,
    /// Nucleus sampling: keep the smallest set of most likely tokens whose probability reaches
    /// `top_p` (in (0, 1]; 1 = off).
    pub top_p: f64,
    /// Keep the `top_k` most likely tokens (ties at the k-th value kept too); 0 = off.
    pub top_k: usize,
    /// Keep tokens whose probability is at least `min_p` × the top token's (in [0, 1]; 0 = off).
    pub min_p: f64,
    /// Hugging Face's repetition penalty on every token of the prompt and the completion so
    /// far: positive logits divided by it, negative ones multiplied (finite, > 0; 1 = off).
    pub repetition_penalty: f64,
    /// Token ids that end a completion (included in it and in its mask); the row's finish
    /// reason is [`FinishReason::Eos`](crate::FinishReason::Eos). Usually the tokenizer's and
    /// generation_config's EOS ids ([`ChatTokenizer::eos_token_ids`](crate::ChatTokenizer::eos_token_ids)).
    pub stop_token_ids: Vec<u32>,
    /// Strings that end a completion when its decoded text contains them (also across token
    /// boundaries); needs a tokenizer. Finish reason
    /// [`FinishReason::Stop`](crate::FinishReason::Stop).
    pub stop_strings: Vec<String>,
    /// Seed of the sampling generator: the same seed gives the same completions (on CPU).
    pub seed: u64,
}

impl Default for SamplingParams {
    /// G = 1, 256 new tokens, temperature 1, top-p 1, top-k 0, min-p 0, repetition penalty 1,
    /// no stop ids or strings, seed 0.
    fn default() -> Self {
        Self {
            num_generations: 1,
            max_new_tokens: 256,
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            stop_token_ids: Vec::new(),
            stop_strings: Vec::new(),
            seed: 0,
        }
    }
}

impl SamplingParams {
    /// Whether no filter or penalty applies (no repetition penalty, top-k, top-p or min-p): the
    /// draw is from `softmax(logits / T)` itself.
    ///
    /// ```
    /// use atomrl_sample::SamplingParams;
    /// assert!(SamplingParams::default().is_unfiltered());
    /// assert!(!SamplingParams { top_p: 0.9, ..Default::default() }.is_unfiltered());
    /// ```
    pub fn is_unfiltered(&self) -> bool {
        self.repetition_penalty == 1.0 && self.top_k == 0 && self.top_p >= 1.0 && self.min_p == 0.0
    }

    /// Whether decoding is greedy (`temperature == 0`).
    ///
    /// ```
    /// let p = atomrl_sample::SamplingParams { temperature: 0.0, ..Default::default() };
    /// assert!(p.is_greedy());
    /// ```
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }

    /// Checks every field's domain.
    ///
    /// # Errors
    /// [`Error::Value`] naming the field: `num_generations` or `max_new_tokens` of 0, a
    /// negative or non-finite `temperature`, `top_p` outside (0, 1], `min_p` outside [0, 1],
    /// a non-positive `repetition_penalty`, an empty stop string.
    ///
    /// ```
    /// use atomrl_sample::SamplingParams;
    /// let e = SamplingParams { temperature: -1.0, ..Default::default() }.validate().unwrap_err();
    /// assert!(e.to_string().contains("`temperature`"));
    /// ```
    pub fn validate(&self) -> Result<()> {
        let func = "SamplingParams::validate";
        if self.num_generations == 0 {
            return Err(Error::value(func, "num_generations", "at least 1", 0));
        }
        if self.max_new_tokens == 0 {
            return Err(Error::value(func, "max_new_tokens", "at least 1", 0));
        }
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(Error::value(
                func,
                "temperature",
                "a finite number >= 0 (0 = greedy)",
                self.temperature,
            ));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(Error::value(
                func,
                "top_p",
                "in (0, 1] (1 = off)",
                self.top_p,
            ));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(Error::value(
                func,
                "min_p",
                "in [0, 1] (0 = off)",
                self.min_p,
            ));
        }
        if !(self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0) {
            return Err(Error::value(
                func,
                "repetition_penalty",
                "a finite number > 0 (1 = off)",
                self.repetition_penalty,
            ));
        }
        if let Some(i) = self.stop_strings.iter().position(String::is_empty) {
            return Err(Error::value(
                func,
                format!("stop_strings[{i}]"),
                "a non-empty string",
                "\"\"",
            ));
        }
        Ok(())
    }
}
