//! Answering questions with a checkpoint (what `atomrl-infer` runs).

use std::path::{Path, PathBuf};

use atomrl_core::{Error, Result};
use atomrl_model::{CausalLm, ADAPTER_CONFIG_FILE};
use atomrl_reward::{correctness_score, ToolCallRecord};
use atomrl_sample::{generate_rows, ToolUse};
use atomrl_sample::{ChatTokenizer, SamplingParams};
use atomrl_tools::ToolSet;
use atomrl_trainer::data::{Example, Prompt};
use atomrl_trainer::rollout::PromptEncoder;
use candle_core::{DType, Device};

/// A model ready to answer: a full HF checkpoint, or a LoRA adapter on its base model.
///
/// ```
/// use atomrl_cli::infer::Answerer;
/// use atomrl_trainer::data::Example;
/// let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/reference/models/tiny-qwen2");
/// let answerer = Answerer::load(dir.as_ref(), &candle_core::Device::Cpu, 4, 0.0, None)?;
/// let question = Example::new("What is 3+4?".to_string(), "7");
/// let answers = answerer.answer(&[question])?;
/// assert_eq!((answers.len(), answers[0].question.as_str()), (1, "What is 3+4?"));
/// assert!(answers[0].correct.is_some()); // scored: a ground truth was given
/// # Ok::<(), atomrl_core::Error>(())
/// ```
pub struct Answerer {
    model: CausalLm,
    tokenizer: ChatTokenizer,
    encoder: PromptEncoder,
    params: SamplingParams,
    tools: ToolSet,
    max_tool_turns: usize,
}

/// One answer (see [`Answerer`] for an example).
#[derive(Debug, Clone)]
pub struct Answer {
    /// The question.
    pub question: String,
    /// The generated completion (with tools: every turn, tool responses included).
    pub completion: String,
    /// 1/0 correctness of the final answer when a ground truth was given.
    pub correct: Option<f64>,
    /// The tool calls made, in order (empty without tools).
    pub tool_calls: Vec<ToolCallRecord>,
}

impl Answerer {
    /// Loads `checkpoint` (a folder with `config.json` and weights, or with
    /// `adapter_config.json`, whose `base_model_name_or_path` names the base model).
    ///
    /// # Errors
    /// Missing files or an unresolvable base model.
    ///
    /// ```
    /// let e = atomrl_cli::infer::Answerer::load("no/such/dir".as_ref(), &candle_core::Device::Cpu, 8, 0.0, None);
    /// assert!(e.is_err());
    /// ```
    pub fn load(
        checkpoint: &Path,
        device: &Device,
        max_new_tokens: usize,
        temperature: f64,
        system_prompt: Option<String>,
    ) -> Result<Self> {
        let adapter = checkpoint.join(ADAPTER_CONFIG_FILE);
        let (model, tokenizer_dir) = if adapter.is_file() {
            let text =
                std::fs::read_to_string(&adapter).map_err(|e| Error::file(adapter.display(), e))?;
            let cfg: serde_json::Value =
                serde_json::from_str(&text).map_err(|e| Error::file(adapter.display(), e))?;
            let base = cfg["base_model_name_or_path"].as_str().ok_or_else(|| {
                Error::file(
                    adapter.display(),
                    "no `base_model_name_or_path`: cannot find the base model",
                )
            })?;
            let base_dir = atomrl_trainer::runtime::resolve_model_dir(base)?;
            let mut model = CausalLm::from_hf_dir(&base_dir, DType::F32, device)?;
            model.load_lora(checkpoint)?;
            (model, tokenizer_source(checkpoint, &base_dir))
        } else {
            (
                CausalLm::from_hf_dir(checkpoint, DType::F32, device)?,
                checkpoint.to_path_buf(),
            )
        };
        let tokenizer = ChatTokenizer::from_hf_dir(&tokenizer_dir)?;
        let params = SamplingParams {
            num_generations: 1,
            max_new_tokens,
            temperature,
            stop_token_ids: tokenizer.eos_token_ids(),
            ..Default::default()
        };
        let encoder = PromptEncoder {
            chat_template: true,
            system_prompt,
            max_prompt_length: usize::MAX,
            tool_schemas: Vec::new(),
        };
        Ok(Self {
            model,
            tokenizer,
            encoder,
            params,
            tools: ToolSet::new(),
            max_tool_turns: 0,
        })
    }

    /// Lets the model call `tools`, up to `max_tool_turns` tool turns per answer (the
    /// rollouts' multi-turn loop: see `atomrl_sample::generate_with_tools`); the tools'
    /// schemas go to the chat template.
    ///
    /// ```
    /// use atomrl_cli::infer::Answerer;
    /// use atomrl_tools::ToolSet;
    /// use atomrl_trainer::data::Example;
    /// let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/reference/models/tiny-qwen2");
    /// let answerer = Answerer::load(dir.as_ref(), &candle_core::Device::Cpu, 4, 0.0, None)?
    ///     .with_tools(ToolSet::from_names(&["calculator"])?, 2);
    /// let answers = answerer.answer(&[Example::new("What is 3+4?".to_string(), "7")])?;
    /// assert!(answers[0].tool_calls.is_empty()); // a random model calls nothing
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with_tools(mut self, tools: ToolSet, max_tool_turns: usize) -> Self {
        self.encoder.tool_schemas = tools.schemas();
        self.tools = tools;
        self.max_tool_turns = max_tool_turns;
        self
    }

    /// Answers every example (in batches of 64); scores correctness when `ground_truth` is set.
    /// See [`Answerer`] for an example.
    ///
    /// # Errors
    /// Generation or tokenizer failures.
    pub fn answer(&self, examples: &[Example]) -> Result<Vec<Answer>> {
        let mut answers = Vec::with_capacity(examples.len());
        for chunk in examples.chunks(64) {
            let prompts = chunk
                .iter()
                .map(|e| self.encoder.encode(&self.tokenizer, e))
                .collect::<Result<Vec<_>>>()?;
            let ids: Vec<Vec<u32>> = prompts.iter().map(|p| p.ids.clone()).collect();
            let tools = (!self.tools.is_empty()).then_some(ToolUse {
                tools: &self.tools,
                max_tool_turns: self.max_tool_turns,
            });
            let (rows, _) = generate_rows(&self.model, &self.tokenizer, &ids, &self.params, tools)?;
            for (e, row) in chunk.iter().zip(rows) {
                let question = match &e.prompt {
                    Prompt::Text(t) => t.clone(),
                    Prompt::Messages(m) => m.last().map(|m| m.content.clone()).unwrap_or_default(),
                };
                let correct = (!e.ground_truth.is_empty()).then(|| {
                    correctness_score(&row.answer, &e.ground_truth, &Default::default()) as f64
                });
                answers.push(Answer {
                    question,
                    completion: row.text,
                    correct,
                    tool_calls: row.trajectory.map(|t| t.tool_calls).unwrap_or_default(),
                });
            }
        }
        Ok(answers)
    }
}

fn tokenizer_source(checkpoint: &Path, base: &Path) -> PathBuf {
    if checkpoint.join("tokenizer.json").is_file() {
        checkpoint.to_path_buf()
    } else {
        base.to_path_buf()
    }
}
