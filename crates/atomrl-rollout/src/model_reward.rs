//! [`ModelReward`]: a trained reward model as a reward function, so that any RL recipe can
//! optimise a learned reward (RLHF), alone or mixed with rule rewards.

use std::path::Path;

use atomrl_core::{CandleContext, Error, Result};
use atomrl_model::{HeadLayout, ValueModel};
use atomrl_reward::{RewardContext, RewardFn};
use atomrl_sample::ChatTokenizer;
use candle_core::{Device, Tensor};

use crate::experience::{Experience, TokenRow};

/// Completions per forward of the reward model.
const BATCH: usize = 32;

/// A reward model (`--recipe reward`'s `reward_model/` folder, or any `transformers`
/// `AutoModelForSequenceClassification` with one label and the policy's vocabulary) scoring
/// each completion: the prompt as the rollout encoded it, then the completion's text and EOS —
/// the sequences the reward model was trained on — scored at their last token, in batches, on
/// the reward model's device.
pub struct ModelReward {
    name: String,
    model: ValueModel,
    tokenizer: ChatTokenizer,
}

impl ModelReward {
    /// Loads the reward model in `dir` onto `device`; `tokenizer` is the policy's (the reward
    /// model reads the policy's tokens).
    ///
    /// # Errors
    /// [`Error::File`] for a folder that is not a one-label sequence classifier; a vocabulary
    /// other than the tokenizer's.
    ///
    /// ```no_run
    /// use atomrl_reward::{RewardContext, RewardFn};
    /// let tok = atomrl_sample::ChatTokenizer::from_hf_dir("runs/policy")?;
    /// let rm = atomrl_rollout::ModelReward::load("runs/rm/checkpoint-100/reward_model", tok, &candle_core::Device::Cpu)?;
    /// let ctx = RewardContext::new().with_prompts(["<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"]);
    /// let scores = rm.score(&["4".to_string()], &ctx)?;
    /// # Ok::<(), atomrl_core::Error>(())
    /// ```
    pub fn load(dir: impl AsRef<Path>, tokenizer: ChatTokenizer, device: &Device) -> Result<Self> {
        let dir = dir.as_ref();
        let model = ValueModel::from_hf_dir(dir, device)?;
        if model.layout() != HeadLayout::Sequence {
            return Err(Error::file(
                dir.display(),
                "not a reward model: its config.json names a token classifier (a PPO critic), \
                 not a sequence classifier",
            ));
        }
        let vocab = model.backbone().config().vocab_size;
        if vocab < tokenizer.vocab_size() {
            return Err(Error::file(
                dir.display(),
                format!(
                    "a reward model over {vocab} tokens cannot read the policy's {}-token vocabulary",
                    tokenizer.vocab_size()
                ),
            ));
        }
        Ok(Self::new(model, tokenizer))
    }

    /// A reward function scoring with `model` (in the [`HeadLayout::Sequence`] layout).
    pub fn new(model: ValueModel, tokenizer: ChatTokenizer) -> Self {
        Self {
            name: "model".into(),
            model,
            tokenizer,
        }
    }
}

impl RewardFn for ModelReward {
    fn name(&self) -> &str {
        &self.name
    }

    /// The reward model's score of each `(prompt, completion)`; needs the context's prompts
    /// (the templated text the rollout encoded).
    fn score(&self, completions: &[String], ctx: &RewardContext) -> Result<Tensor> {
        let func = "ModelReward::score";
        let prompts = ctx.prompts.as_ref().ok_or_else(|| {
            Error::missing(
                func,
                "prompts",
                "the prompt of each completion (the reward model reads both)",
            )
        })?;
        if prompts.len() != completions.len() {
            return Err(Error::value(
                func,
                "prompts",
                format!("{} entries (one per completion)", completions.len()),
                prompts.len(),
            ));
        }
        let eos = self.tokenizer.eos_token_ids().first().copied();
        let mut rows = Vec::with_capacity(completions.len());
        for (p, c) in prompts.iter().zip(completions) {
            let mut ids = self.tokenizer.encode(c, false)?;
            ids.extend(eos);
            rows.push((self.tokenizer.encode(p, false)?, ids));
        }
        let model = &self.model;
        let mut scores = Vec::with_capacity(rows.len());
        for chunk in rows.chunks(BATCH) {
            let masks: Vec<Vec<bool>> = chunk.iter().map(|(_, c)| vec![true; c.len()]).collect();
            let token_rows: Vec<TokenRow<'_>> = chunk
                .iter()
                .zip(&masks)
                .map(|((p, c), m)| (p.as_slice(), c.as_slice(), m.as_slice()))
                .collect();
            let n = token_rows.len();
            let pad = self.tokenizer.pad_token_id();
            let exp = Experience::from_rows(
                &token_rows,
                &vec![0.0; n],
                &vec![true; n],
                pad,
                model.device(),
            )?;
            let s = crate::experience_scores(model, &exp)?;
            scores.extend(s.to_vec1::<f32>().ctx(func)?);
        }
        Tensor::new(scores, &Device::Cpu).ctx(func)
    }
}
