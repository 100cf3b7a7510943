//! Turning dataset prompts into token ids: chat template, then left truncation.

use atomrl_core::Result;
use atomrl_sample::{ChatMessage, ChatTokenizer};

use atomrl_data::{Example, Prompt};

/// Encodes prompts the way a run was configured to.
#[derive(Debug, Clone)]
pub struct PromptEncoder {
    /// Apply the tokenizer's chat template (`false`: prompts are already templated text).
    pub chat_template: bool,
    /// System prompt put first in every conversation.
    pub system_prompt: Option<String>,
    /// Prompts longer than this keep their last `max_prompt_length` tokens.
    pub max_prompt_length: usize,
    /// Schemas of the tools the model may call, for the chat template's `tools` (empty: none).
    pub tool_schemas: Vec<serde_json::Value>,
}

/// One encoded prompt.
#[derive(Debug, Clone, PartialEq)]
pub struct EncodedPrompt {
    /// Token ids, at most `max_prompt_length` of them.
    pub ids: Vec<u32>,
    /// The prompt as text (templated), for reward functions and logs.
    pub text: String,
    /// Whether tokens were cut from the left.
    pub truncated: bool,
}

impl PromptEncoder {
    /// Encodes `example.prompt`.
    ///
    /// # Errors
    /// Tokenizer or template failures.
    pub fn encode(&self, tokenizer: &ChatTokenizer, example: &Example) -> Result<EncodedPrompt> {
        let text = if self.chat_template && tokenizer.has_chat_template() {
            let messages: Vec<ChatMessage> =
                example.prompt.to_messages(self.system_prompt.as_deref());
            tokenizer.apply_chat_template_with_tools(&messages, &self.tool_schemas, true)?
        } else {
            match &example.prompt {
                Prompt::Text(t) => t.clone(),
                Prompt::Messages(m) => m
                    .iter()
                    .map(|m| m.content.as_str())
                    .collect::<Vec<_>>()
                    .join("\n"),
            }
        };
        let mut ids = tokenizer.encode(&text, false)?;
        let truncated = ids.len() > self.max_prompt_length;
        if truncated {
            ids.drain(..ids.len() - self.max_prompt_length);
        }
        Ok(EncodedPrompt {
            ids,
            text,
            truncated,
        })
    }

    /// The token ids of a target completion of a dataset (SFT's completion, DPO's chosen and
    /// rejected): its text followed by EOS (so the model learns to stop), cut to
    /// `max_completion_length`. The text is tokenized as is, after the encoded prompt.
    ///
    /// # Errors
    /// Tokenizer failures.
    ///
    /// ```
    /// use atomrl_rollout::PromptEncoder;
    /// let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/reference/models/tiny-qwen2");
    /// let tok = atomrl_sample::ChatTokenizer::from_hf_dir(dir)?;
    /// let enc = PromptEncoder { chat_template: true, system_prompt: None, max_prompt_length: 64, tool_schemas: vec![] };
    /// let ids = enc.encode_target(&tok, "The answer is 4.", 100)?;
    /// assert_eq!(ids.last(), tok.eos_token_ids().first());
    /// assert_eq!(enc.encode_target(&tok, "The answer is 4.", 2)?.len(), 2);
    /// # Ok::<(), atomrl_core::Error>(())
    /// ```
    pub fn encode_target(
        &self,
        tokenizer: &ChatTokenizer,
        text: &str,
        max_completion_length: usize,
    ) -> Result<Vec<u32>> {
        let mut ids = tokenizer.encode(text, false)?;
        if let Some(&eos) = tokenizer.eos_token_ids().first() {
            ids.push(eos);
        }
        ids.truncate(max_completion_length);
        Ok(ids)
    }

    /// The pair experience of preference `examples`
    /// ([`Experience::from_pairs`](crate::Experience::from_pairs)): each prompt encoded, each
    /// side [`encode_target`](Self::encode_target)ed, each pair's `margin` (0 when absent) on
    /// its rows.
    ///
    /// # Errors
    /// [`atomrl_core::Error::Value`] naming `examples` when one has no preference pair;
    /// tokenizer failures.
    ///
    /// ```
    /// use atomrl_rollout::PromptEncoder;
    /// let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/reference/models/tiny-qwen2");
    /// let tok = atomrl_sample::ChatTokenizer::from_hf_dir(dir)?;
    /// let enc = PromptEncoder { chat_template: true, system_prompt: None, max_prompt_length: 64, tool_schemas: vec![] };
    /// let rows = atomrl_data::parse_jsonl(r#"{"prompt": "2+2?", "chosen": "4", "rejected": "5"}"#, "x")?;
    /// let exp = enc.encode_pairs(&tok, &[&rows[0]], 16, &candle_core::Device::Cpu)?;
    /// assert_eq!((exp.num_rows(), exp.groups.clone()), (2, vec![0, 0]));
    /// let prompt_only = atomrl_data::Example::new("2+2?", "4");
    /// assert!(enc.encode_pairs(&tok, &[&prompt_only], 16, &candle_core::Device::Cpu).is_err());
    /// # Ok::<(), atomrl_core::Error>(())
    /// ```
    pub fn encode_pairs(
        &self,
        tokenizer: &ChatTokenizer,
        examples: &[&Example],
        max_completion_length: usize,
        device: &candle_core::Device,
    ) -> Result<crate::Experience> {
        let mut encoded = Vec::with_capacity(examples.len());
        for (i, e) in examples.iter().enumerate() {
            let Some(p) = &e.preference else {
                return Err(atomrl_core::Error::value(
                    "PromptEncoder::encode_pairs",
                    format!("examples[{i}]"),
                    "a preference pair (`chosen` and `rejected`)",
                    "a prompt alone",
                ));
            };
            let target = |t: &str| self.encode_target(tokenizer, t, max_completion_length);
            encoded.push((
                self.encode(tokenizer, e)?.ids,
                target(&p.chosen)?,
                target(&p.rejected)?,
            ));
        }
        let rows: Vec<crate::PairRow<'_>> = encoded
            .iter()
            .map(|(p, c, r)| (p.as_slice(), c.as_slice(), r.as_slice()))
            .collect();
        let mut exp = crate::Experience::from_pairs(&rows, tokenizer.pad_token_id(), device)?;
        if let Some(roles) = exp.pairs.as_mut() {
            for role in roles.iter_mut() {
                let e = examples[role.pair as usize];
                role.margin = e.preference.as_ref().and_then(|p| p.margin).unwrap_or(0.0) as f32;
            }
        }
        Ok(exp)
    }
}
