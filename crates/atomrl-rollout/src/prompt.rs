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
}
