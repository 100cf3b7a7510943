//! [`ChatTokenizer`]: a Hugging Face tokenizer with the model's own chat template.

use std::path::Path;

use atomrl_core::{Error, Result};
use minijinja::value::{from_args, Value, ValueKind};
use minijinja::{Environment, ErrorKind, State};
use serde_json::Value as Json;

use crate::rollout::{FinishReason, RolloutBatch};

pub use atomrl_core::ChatMessage;

const TEMPLATE_NAME: &str = "chat_template";

/// The assistant content [`ChatTokenizer::tool_turn_text`] renders and looks for: plain ASCII
/// letters and digits, no whitespace, markup or special token, so templates copy it unchanged.
const TOOL_TURN_SENTINEL: &str = "AtomrlToolTurnSentinel7f3a91c2";
/// The user message before it.
const TOOL_TURN_USER: &str = "AtomrlToolTurnUser";

/// A Hugging Face tokenizer folder: `tokenizer.json` (through the `tokenizers` crate), the
/// special tokens and `chat_template` of `tokenizer_config.json` (or `chat_template.jinja`),
/// and the EOS ids of `generation_config.json` / `config.json` when present.
///
/// Chat templates are rendered with minijinja configured as transformers configures jinja2
/// (`trim_blocks`, `lstrip_blocks`, loop controls), with `raise_exception`, `strftime_now`,
/// `tojson` (Python's `json.dumps` with `ensure_ascii=False`; `indent`, `separators`,
/// `sort_keys`, `ensure_ascii` as keyword arguments), and the Python string / dict methods HF
/// templates use (`startswith`, `strip`, `split`, `items`, `get`, ...); dicts keep their key
/// order. Tool-using conversations: [`ChatTokenizer::apply_chat_template_with_tools`] and
/// [`ChatTokenizer::tool_turn_text`]; [`ChatTokenizer::with_chat_template`] overrides the
/// template.
///
/// ```
/// use atomrl_sample::{ChatMessage, ChatTokenizer};
/// let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/reference/models/tiny-qwen2");
/// let tok = ChatTokenizer::from_hf_dir(dir)?;
/// let text = tok.apply_chat_template(&[ChatMessage::user("hi")], true)?;
/// assert_eq!(text, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
/// let ids = tok.encode_chat_prompt("hi")?;
/// assert_eq!(ids[0], 1); // <|im_start|>
/// assert_eq!(tok.decode(&ids, false)?, text);
/// assert_eq!((tok.eos_token_ids(), tok.pad_token_id()), (vec![2, 0], 0));
/// # Ok::<(), atomrl_core::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct ChatTokenizer {
    tokenizer: tokenizers::Tokenizer,
    env: Option<Environment<'static>>,
    bos_token: Option<String>,
    eos_token: Option<String>,
    pad_token: Option<String>,
    unk_token: Option<String>,
    eos_ids: Vec<u32>,
    pad_id: u32,
}

impl ChatTokenizer {
    /// Reads `dir/tokenizer.json` (required), `dir/tokenizer_config.json`,
    /// `dir/chat_template.jinja`, `dir/generation_config.json` and `dir/config.json` (all
    /// optional).
    ///
    /// EOS ids: the tokenizer's `eos_token`, then `generation_config.json`'s `eos_token_id`
    /// (a number or a list; `config.json`'s when there is no generation config). Pad id: the
    /// tokenizer's `pad_token`, else the configs' `pad_token_id`, else the first EOS id, else 0.
    ///
    /// # Errors
    /// [`Error::File`] naming the file that is missing, unreadable or invalid (including a
    /// chat template with a syntax error).
    ///
    /// ```
    /// let err = atomrl_sample::ChatTokenizer::from_hf_dir("/no/such/dir").unwrap_err();
    /// assert!(err.to_string().contains("tokenizer.json"));
    /// ```
    pub fn from_hf_dir(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref();
        let tok_path = dir.join("tokenizer.json");
        if !tok_path.is_file() {
            return Err(Error::file(tok_path.display(), "tokenizer file not found"));
        }
        let tokenizer = tokenizers::Tokenizer::from_file(&tok_path)
            .map_err(|e| Error::file(tok_path.display(), e))?;
        let config = read_json_opt(&dir.join("tokenizer_config.json"))?.unwrap_or(Json::Null);
        let token = |key: &str| match config.get(key) {
            Some(Json::String(s)) => Some(s.clone()),
            Some(Json::Object(o)) => o.get("content").and_then(Json::as_str).map(str::to_owned),
            _ => None,
        };
        let env = match read_chat_template(dir, &config)? {
            Some(t) => Some(template_env(t).map_err(|e| {
                Error::file(
                    dir.join("tokenizer_config.json").display(),
                    format!("chat_template: {e:#}"),
                )
            })?),
            None => None,
        };
        let generation = read_json_opt(&dir.join("generation_config.json"))?;
        let model_config = read_json_opt(&dir.join("config.json"))?;
        let gen_or_model = generation.as_ref().or(model_config.as_ref());

        let (bos_token, eos_token, pad_token, unk_token) = (
            token("bos_token"),
            token("eos_token"),
            token("pad_token"),
            token("unk_token"),
        );
        let mut eos_ids = Vec::new();
        if let Some(id) = eos_token.as_deref().and_then(|t| tokenizer.token_to_id(t)) {
            eos_ids.push(id);
        }
        for id in gen_or_model
            .map(|c| ids_of(c.get("eos_token_id")))
            .unwrap_or_default()
        {
            if !eos_ids.contains(&id) {
                eos_ids.push(id);
            }
        }
        let pad_id = pad_token
            .as_deref()
            .and_then(|t| tokenizer.token_to_id(t))
            .or_else(|| gen_or_model.and_then(|c| ids_of(c.get("pad_token_id")).first().copied()))
            .or_else(|| {
                model_config
                    .as_ref()
                    .and_then(|c| ids_of(c.get("pad_token_id")).first().copied())
            })
            .or_else(|| eos_ids.first().copied())
            .unwrap_or(0);
        Ok(Self {
            tokenizer,
            env,
            bos_token,
            eos_token,
            pad_token,
            unk_token,
            eos_ids,
            pad_id,
        })
    }

    /// Token ids of `text`; `add_special_tokens` adds the tokenizer's post-processor tokens
    /// (BOS for some models; chat-templated text should use `false`).
    ///
    /// # Errors
    /// [`Error::Value`] if the tokenizer fails.
    ///
    /// ```
    /// # let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/reference/models/tiny-qwen2");
    /// let tok = atomrl_sample::ChatTokenizer::from_hf_dir(dir)?;
    /// let ids = tok.encode("hello world", false)?;
    /// assert_eq!(tok.decode(&ids, true)?, "hello world");
    /// # Ok::<(), atomrl_core::Error>(())
    /// ```
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        let enc = self
            .tokenizer
            .encode(text, add_special_tokens)
            .map_err(|e| {
                Error::value(
                    "ChatTokenizer::encode",
                    "text",
                    "text the tokenizer accepts",
                    e,
                )
            })?;
        Ok(enc.get_ids().to_vec())
    }

    /// The text of `ids`; `skip_special_tokens` drops special tokens (`<|im_end|>`, ...).
    ///
    /// # Errors
    /// [`Error::Value`] if the tokenizer fails (e.g. an id outside the vocabulary).
    ///
    /// ```
    /// # let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/reference/models/tiny-qwen2");
    /// let tok = atomrl_sample::ChatTokenizer::from_hf_dir(dir)?;
    /// assert_eq!(tok.decode(&[2], false)?, "<|im_end|>");
    /// assert_eq!(tok.decode(&[2], true)?, "");
    /// # Ok::<(), atomrl_core::Error>(())
    /// ```
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        self.tokenizer
            .decode(ids, skip_special_tokens)
            .map_err(|e| {
                Error::value(
                    "ChatTokenizer::decode",
                    "ids",
                    "token ids of the vocabulary",
                    e,
                )
            })
    }

    /// Whether the folder has a chat template.
    ///
    /// ```
    /// # let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/reference/models/tiny-qwen2");
    /// assert!(atomrl_sample::ChatTokenizer::from_hf_dir(dir)?.has_chat_template());
    /// # Ok::<(), atomrl_core::Error>(())
    /// ```
    pub fn has_chat_template(&self) -> bool {
        self.env.is_some()
    }

    /// Renders the chat template on `messages` (transformers' `apply_chat_template(messages,
    /// tokenize=False, add_generation_prompt=..)`). The template sees `messages`,
    /// `add_generation_prompt`, `tools` and `documents` (both none) and the special tokens
    /// `bos_token`, `eos_token`, `pad_token`, `unk_token`. This is
    /// [`ChatTokenizer::apply_chat_template_with_tools`] with no tools.
    ///
    /// # Errors
    /// [`Error::Missing`] when the folder has no chat template, [`Error::Value`] when rendering
    /// fails (including the template's own `raise_exception`).
    ///
    /// ```
    /// use atomrl_sample::{ChatMessage, ChatTokenizer};
    /// # let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/reference/models/tiny-qwen2");
    /// let tok = ChatTokenizer::from_hf_dir(dir)?;
    /// let text = tok.apply_chat_template(&[ChatMessage::new("system", "S"), ChatMessage::user("U")], false)?;
    /// assert_eq!(text, "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n");
    /// # Ok::<(), atomrl_core::Error>(())
    /// ```
    pub fn apply_chat_template(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String> {
        self.render(
            "ChatTokenizer::apply_chat_template",
            messages,
            &[],
            add_generation_prompt,
        )
    }

    /// Renders the chat template on `messages` with the tool schemas `tools` (transformers'
    /// `apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=..)`).
    ///
    /// Each tool is a JSON schema in the OpenAI / Hugging Face format
    /// `{"type": "function", "function": {"name", "description", "parameters"}}`; the template
    /// sees them, in order and with their keys in order, as `tools`. With an empty slice `tools`
    /// is none, as transformers passes `tools=None`, so the result is
    /// [`ChatTokenizer::apply_chat_template`]'s. The template also sees `messages`,
    /// `add_generation_prompt`, `documents` (none) and the special tokens `bos_token`,
    /// `eos_token`, `pad_token`, `unk_token`.
    ///
    /// # Errors
    /// [`Error::Missing`] when the folder has no chat template, [`Error::Value`] when rendering
    /// fails (including the template's own `raise_exception`).
    ///
    /// ```
    /// use atomrl_sample::{ChatMessage, ChatTokenizer};
    /// # let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/reference/models/tiny-qwen2");
    /// let tok = ChatTokenizer::from_hf_dir(dir)?.with_chat_template(
    ///     "{% if tools %}{% for t in tools %}{{ t.function.name }} {{ t | tojson }}\n{% endfor %}{% endif %}\
    ///      {% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}",
    /// )?;
    /// let calc = serde_json::json!({"type": "function", "function": {"name": "calc", "parameters": {}}});
    /// let text = tok.apply_chat_template_with_tools(&[ChatMessage::user("2*3?")], &[calc], true)?;
    /// assert_eq!(
    ///     text,
    ///     "calc {\"type\": \"function\", \"function\": {\"name\": \"calc\", \"parameters\": {}}}\nuser: 2*3?\n"
    /// );
    /// let plain = tok.apply_chat_template_with_tools(&[ChatMessage::user("2*3?")], &[], true)?;
    /// assert_eq!(plain, "user: 2*3?\n");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn apply_chat_template_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: &[Json],
        add_generation_prompt: bool,
    ) -> Result<String> {
        self.render(
            "ChatTokenizer::apply_chat_template_with_tools",
            messages,
            tools,
            add_generation_prompt,
        )
    }

    /// The text the chat template writes between the end of an assistant turn's content and
    /// the start of the next assistant turn's content, when that assistant turn is followed by
    /// one `tool` message per entry of `responses` (in order) and then the generation prompt.
    ///
    /// In a multi-turn tool rollout, the completion of a turn (the assistant content, e.g. a
    /// `<tool_call>`) is followed by these tokens, then the model generates again. For
    /// Qwen2.5-Instruct and Qwen3 it is
    /// `<|im_end|>\n<|im_start|>user\n<tool_response>\nR1\n</tool_response>\n<tool_response>\nR2\n</tool_response><|im_end|>\n<|im_start|>assistant\n`.
    ///
    /// It is computed from the template: the conversation `[user, assistant SENTINEL, tool
    /// R1, ...]` is rendered (with `tools`) with the generation prompt and the text after the
    /// sentinel is returned, after checking that the text before the sentinel is the rendering
    /// of `[user]` with the generation prompt (so that prompt + assistant content + this text
    /// is the rendering of the whole conversation).
    ///
    /// # Errors
    /// [`Error::Value`] naming `responses` when it is empty; [`Error::Value`] naming
    /// `chat_template` when the template drops or alters the assistant content, or renders the
    /// assistant turn differently from the generation prompt it follows; as
    /// [`ChatTokenizer::apply_chat_template_with_tools`] otherwise.
    ///
    /// ```
    /// use atomrl_sample::ChatTokenizer;
    /// # let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/reference/models/tiny-qwen2");
    /// let tok = ChatTokenizer::from_hf_dir(dir)?; // plain ChatML: tool messages are turns of role `tool`
    /// let text = tok.tool_turn_text(&["21".to_string()], &[])?;
    /// assert_eq!(text, "<|im_end|>\n<|im_start|>tool\n21<|im_end|>\n<|im_start|>assistant\n");
    /// assert!(tok.tool_turn_text(&[], &[]).is_err());
    /// # Ok::<(), atomrl_core::Error>(())
    /// ```
    pub fn tool_turn_text(&self, responses: &[String], tools: &[Json]) -> Result<String> {
        let func = "ChatTokenizer::tool_turn_text";
        if responses.is_empty() {
            return Err(Error::value(
                func,
                "responses",
                "at least one tool response",
                "an empty slice",
            ));
        }
        let user = ChatMessage::user(TOOL_TURN_USER);
        let mut messages = vec![user.clone(), ChatMessage::assistant(TOOL_TURN_SENTINEL)];
        messages.extend(responses.iter().map(|r| ChatMessage::tool(r.as_str())));
        let full = self.render(func, &messages, tools, true)?;
        let prompt = self.render(func, &[user], tools, true)?;
        let mut hits = full.match_indices(TOOL_TURN_SENTINEL);
        let at = match (hits.next(), hits.next()) {
            (Some((at, _)), None) => at,
            (first, _) => {
                return Err(Error::value(
                    func,
                    "chat_template",
                    "a template that writes an assistant message's content once, unchanged",
                    format!(
                        "the content {TOOL_TURN_SENTINEL:?} appears {} times in the rendering",
                        if first.is_none() { "0" } else { "several" }
                    ),
                ))
            }
        };
        if full[..at] != prompt {
            return Err(Error::value(
                func,
                "chat_template",
                "a template whose assistant turn starts with the generation prompt \
                 (rendering [user] with add_generation_prompt=true)",
                format!(
                    "{:?} before the assistant content, but the generation prompt gives {prompt:?}",
                    &full[..at]
                ),
            ));
        }
        Ok(full[at + TOOL_TURN_SENTINEL.len()..].to_owned())
    }

    /// Replaces the chat template (TRL's `chat_template` option; also for a tokenizer folder
    /// that has none). The template is compiled as [`ChatTokenizer::from_hf_dir`] compiles the
    /// folder's own.
    ///
    /// # Errors
    /// [`Error::Value`] naming `chat_template` when the template has a syntax error.
    ///
    /// ```
    /// use atomrl_sample::{ChatMessage, ChatTokenizer};
    /// # let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/reference/models/tiny-qwen2");
    /// let tok = ChatTokenizer::from_hf_dir(dir)?
    ///     .with_chat_template("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}")?;
    /// assert_eq!(tok.apply_chat_template(&[ChatMessage::user("hi")], true)?, "[user] hi\n");
    /// let err = ChatTokenizer::from_hf_dir(dir)?.with_chat_template("{% if %}").unwrap_err();
    /// assert!(err.to_string().contains("chat_template"));
    /// # Ok::<(), atomrl_core::Error>(())
    /// ```
    pub fn with_chat_template(mut self, template: impl Into<String>) -> Result<Self> {
        let env = template_env(template.into()).map_err(|e| {
            Error::value(
                "ChatTokenizer::with_chat_template",
                "chat_template",
                "a Jinja chat template",
                format!("{e:#}"),
            )
        })?;
        self.env = Some(env);
        Ok(self)
    }

    fn render(
        &self,
        func: &str,
        messages: &[ChatMessage],
        tools: &[Json],
        add_generation_prompt: bool,
    ) -> Result<String> {
        let env = self.env.as_ref().ok_or_else(|| {
            Error::missing(
                func,
                "chat_template",
                "a `chat_template` in tokenizer_config.json or chat_template.jinja",
            )
        })?;
        let template = env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| Error::value(func, "chat_template", "a template", format!("{e:#}")))?;
        let tools = if tools.is_empty() {
            Value::from(())
        } else {
            Value::from_serialize(tools)
        };
        let ctx = minijinja::context! {
            messages => Value::from_serialize(messages),
            tools => tools,
            documents => Value::from(()),
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.clone().unwrap_or_default(),
            eos_token => self.eos_token.clone().unwrap_or_default(),
            pad_token => self.pad_token.clone().unwrap_or_default(),
            unk_token => self.unk_token.clone().unwrap_or_default(),
        };
        template.render(ctx).map_err(|e| {
            Error::value(
                func,
                "messages",
                "messages the chat template accepts",
                format!("{e:#}"),
            )
        })
    }

    /// Token ids of one user message `prompt` with the generation prompt, through the chat
    /// template (no extra special tokens: the template writes them).
    ///
    /// # Errors
    /// As [`ChatTokenizer::apply_chat_template`] and [`ChatTokenizer::encode`].
    ///
    /// See [`ChatTokenizer`] for an example.
    pub fn encode_chat_prompt(&self, prompt: &str) -> Result<Vec<u32>> {
        let text = self.apply_chat_template(&[ChatMessage::user(prompt)], true)?;
        self.encode(&text, false)
    }

    /// The ids that end a completion (see [`ChatTokenizer::from_hf_dir`]); the usual
    /// [`SamplingParams::stop_token_ids`](crate::SamplingParams::stop_token_ids).
    ///
    /// See [`ChatTokenizer`] for an example.
    pub fn eos_token_ids(&self) -> Vec<u32> {
        self.eos_ids.clone()
    }

    /// The padding id (see [`ChatTokenizer::from_hf_dir`]).
    ///
    /// See [`ChatTokenizer`] for an example.
    pub fn pad_token_id(&self) -> u32 {
        self.pad_id
    }

    /// Vocabulary size, added tokens included.
    ///
    /// ```
    /// # let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/reference/models/tiny-qwen2");
    /// assert_eq!(atomrl_sample::ChatTokenizer::from_hf_dir(dir)?.vocab_size(), 512);
    /// # Ok::<(), atomrl_core::Error>(())
    /// ```
    pub fn vocab_size(&self) -> usize {
        self.tokenizer.get_vocab_size(true)
    }

    /// The underlying `tokenizers` tokenizer.
    ///
    /// ```
    /// # let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/reference/models/tiny-qwen2");
    /// let tok = atomrl_sample::ChatTokenizer::from_hf_dir(dir)?;
    /// assert_eq!(tok.inner().token_to_id("<|im_end|>"), Some(2));
    /// # Ok::<(), atomrl_core::Error>(())
    /// ```
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.tokenizer
    }

    /// The completions' text: each row's tokens decoded without special tokens; a row that
    /// ended on a stop string is cut before the first occurrence of a stop string (vLLM's
    /// `include_stop_str_in_output = False`; the tokens and the mask keep the token that
    /// completed it).
    ///
    /// # Errors
    /// As [`ChatTokenizer::decode`].
    ///
    /// ```
    /// use atomrl_model::CausalLm;
    /// use atomrl_sample::{generate_samples, ChatTokenizer, SamplingParams};
    /// use candle_core::{DType, Device};
    /// # let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/reference/models/tiny-qwen2");
    /// let tok = ChatTokenizer::from_hf_dir(dir)?;
    /// let model = CausalLm::from_hf_dir(dir, DType::F32, &Device::Cpu)?;
    /// let p = SamplingParams { max_new_tokens: 4, ..Default::default() };
    /// let out = generate_samples(&model, &[tok.encode_chat_prompt("hi")?], &p, Some(&tok))?;
    /// assert_eq!(tok.decode_completions(&out, &p.stop_strings)?.len(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn decode_completions(
        &self,
        batch: &RolloutBatch,
        stop_strings: &[String],
    ) -> Result<Vec<String>> {
        batch
            .completion_rows()?
            .iter()
            .zip(&batch.finish_reasons)
            .map(|(ids, reason)| self.decode_turn(ids, *reason, stop_strings))
            .collect()
    }

    /// One completion's text (special tokens skipped), cut before its first stop string when
    /// it ended on one.
    pub(crate) fn decode_turn(
        &self,
        ids: &[u32],
        reason: FinishReason,
        stop_strings: &[String],
    ) -> Result<String> {
        let mut text = self.decode(ids, true)?;
        if reason == FinishReason::Stop {
            if let Some(cut) = stop_strings
                .iter()
                .filter_map(|s| text.find(s.as_str()))
                .min()
            {
                text.truncate(cut);
            }
        }
        Ok(text)
    }
}

/// The chat template of the model folder `dir`: `tokenizer_config.json`'s `chat_template` (a
/// string, or the `default` of a list of named templates), else `chat_template.jinja`.
fn read_chat_template(dir: &Path, config: &Json) -> Result<Option<String>> {
    let template = match config.get("chat_template") {
        Some(Json::String(s)) => Some(s.clone()),
        Some(Json::Array(items)) => items
            .iter()
            .find(|t| t.get("name").and_then(Json::as_str) == Some("default"))
            .or_else(|| items.first())
            .and_then(|t| t.get("template"))
            .and_then(Json::as_str)
            .map(str::to_owned),
        _ => None,
    };
    let jinja_path = dir.join("chat_template.jinja");
    match template {
        Some(t) => Ok(Some(t)),
        None if jinja_path.is_file() => std::fs::read_to_string(&jinja_path)
            .map(Some)
            .map_err(|e| Error::file(jinja_path.display(), e)),
        None => Ok(None),
    }
}

fn read_json_opt(path: &Path) -> Result<Option<Json>> {
    if !path.is_file() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(path).map_err(|e| Error::file(path.display(), e))?;
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| Error::file(path.display(), e))
}

fn ids_of(v: Option<&Json>) -> Vec<u32> {
    match v {
        Some(Json::Number(n)) => n
            .as_u64()
            .and_then(|x| u32::try_from(x).ok())
            .into_iter()
            .collect(),
        Some(Json::Array(items)) => items
            .iter()
            .filter_map(|x| x.as_u64().and_then(|x| u32::try_from(x).ok()))
            .collect(),
        _ => Vec::new(),
    }
}

/// A minijinja environment set up as transformers sets up jinja2 for chat templates.
fn template_env(template: String) -> std::result::Result<Environment<'static>, minijinja::Error> {
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.add_function(
        "raise_exception",
        |msg: String| -> std::result::Result<Value, minijinja::Error> {
            Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
        },
    );
    env.add_function("strftime_now", |fmt: String| strftime_now(&fmt));
    env.add_filter("tojson", tojson);
    env.set_unknown_method_callback(python_methods);
    env.add_template_owned(TEMPLATE_NAME, template)?;
    Ok(env)
}

/// transformers' `tojson`: `json.dumps(x, ensure_ascii=False, indent=indent,
/// separators=separators, sort_keys=sort_keys)`: Python's separators (`", "`, `": "`; `","`
/// between items when indented), `indent` spaces per level, keys in their order unless
/// `sort_keys`, non-ASCII kept unless `ensure_ascii`.
fn tojson(
    value: &Value,
    kwargs: minijinja::value::Kwargs,
) -> std::result::Result<Value, minijinja::Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let separators: Option<Value> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;
    let (item_sep, key_sep) = match separators.filter(|s| !s.is_none()) {
        None => (
            if indent.is_some() { "," } else { ", " }.to_owned(),
            ": ".to_owned(),
        ),
        Some(seps) => {
            let seps: Vec<String> = seps
                .try_iter()?
                .map(|s| s.as_str().map(str::to_owned))
                .collect::<Option<_>>()
                .filter(|v: &Vec<String>| v.len() == 2)
                .ok_or_else(|| {
                    minijinja::Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson: `separators` must be a pair of strings (item, key)",
                    )
                })?;
            (seps[0].clone(), seps[1].clone())
        }
    };
    let json = serde_json::to_value(value)
        .map_err(|e| minijinja::Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    let style = PyJson {
        indent,
        item_sep,
        key_sep,
        sort_keys: sort_keys.unwrap_or(false),
        ensure_ascii: ensure_ascii.unwrap_or(false),
    };
    let mut out = String::new();
    style.write(&json, 0, &mut out);
    Ok(Value::from_safe_string(out))
}

/// Python `json.dumps` options.
struct PyJson {
    indent: Option<usize>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
    ensure_ascii: bool,
}

impl PyJson {
    fn newline(&self, out: &mut String, depth: usize) {
        if let Some(n) = self.indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * depth));
        }
    }

    fn write(&self, v: &Json, depth: usize, out: &mut String) {
        match v {
            Json::Array(items) if !items.is_empty() => {
                out.push('[');
                for (i, x) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(&self.item_sep);
                    }
                    self.newline(out, depth + 1);
                    self.write(x, depth + 1, out);
                }
                self.newline(out, depth);
                out.push(']');
            }
            Json::Object(map) if !map.is_empty() => {
                let mut entries: Vec<(&String, &Json)> = map.iter().collect();
                if self.sort_keys {
                    entries.sort_by(|a, b| a.0.cmp(b.0));
                }
                out.push('{');
                for (i, (k, x)) in entries.into_iter().enumerate() {
                    if i > 0 {
                        out.push_str(&self.item_sep);
                    }
                    self.newline(out, depth + 1);
                    self.write_str(k, out);
                    out.push_str(&self.key_sep);
                    self.write(x, depth + 1, out);
                }
                self.newline(out, depth);
                out.push('}');
            }
            Json::String(s) => self.write_str(s, out),
            other => out.push_str(&other.to_string()),
        }
    }

    /// A JSON string as Python writes it (`\uXXXX`, with surrogate pairs, for non-ASCII
    /// characters when `ensure_ascii`).
    fn write_str(&self, s: &str, out: &mut String) {
        let quoted = Json::String(s.to_owned()).to_string();
        if !self.ensure_ascii || s.is_ascii() {
            out.push_str(&quoted);
            return;
        }
        for c in quoted.chars() {
            if c.is_ascii() {
                out.push(c);
            } else {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
        }
    }
}

/// The Python `str` and `dict` methods HF chat templates call.
fn python_methods(
    _state: &State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> std::result::Result<Value, minijinja::Error> {
    if let Some(s) = value.as_str() {
        return str_method(s, method, args);
    }
    if value.kind() == ValueKind::Map {
        return dict_method(value, method, args);
    }
    Err(minijinja::Error::from(ErrorKind::UnknownMethod))
}

/// Python's `str` methods (`startswith`, `strip`, `split`, `replace`, `join`, ...) on `s`.
fn str_method(
    s: &str,
    method: &str,
    args: &[Value],
) -> std::result::Result<Value, minijinja::Error> {
    let unknown = || Err(minijinja::Error::from(ErrorKind::UnknownMethod));
    match method {
        "startswith" | "endswith" => {
            let (pat,): (Value,) = from_args(args)?;
            let pats: Vec<String> = match pat.as_str() {
                Some(p) => vec![p.to_owned()],
                None => pat
                    .try_iter()?
                    .filter_map(|p| p.as_str().map(str::to_owned))
                    .collect(),
            };
            let hit = pats.iter().any(|p| {
                if method == "startswith" {
                    s.starts_with(p.as_str())
                } else {
                    s.ends_with(p.as_str())
                }
            });
            Ok(Value::from(hit))
        }
        "strip" | "lstrip" | "rstrip" => {
            let (chars,): (Option<String>,) = from_args(args)?;
            let f = |c: char| {
                chars
                    .as_deref()
                    .map_or(c.is_whitespace(), |cs| cs.contains(c))
            };
            let out = match method {
                "strip" => s.trim_matches(f),
                "lstrip" => s.trim_start_matches(f),
                _ => s.trim_end_matches(f),
            };
            Ok(Value::from(out))
        }
        "split" | "rsplit" => split_method(s, method == "split", args),
        "upper" => Ok(Value::from(s.to_uppercase())),
        "lower" => Ok(Value::from(s.to_lowercase())),
        "replace" => {
            let (from, to): (String, String) = from_args(args)?;
            Ok(Value::from(s.replace(&from, &to)))
        }
        "find" => {
            let (pat,): (String,) = from_args(args)?;
            Ok(Value::from(
                s.find(&pat).map_or(-1, |i| s[..i].chars().count() as i64),
            ))
        }
        "count" => {
            let (pat,): (String,) = from_args(args)?;
            Ok(Value::from(s.matches(&pat).count()))
        }
        "isdigit" => Ok(Value::from(
            !s.is_empty() && s.chars().all(|c| c.is_ascii_digit()),
        )),
        "join" => {
            let (items,): (Value,) = from_args(args)?;
            let parts: Vec<String> = items.try_iter()?.map(|v| v.to_string()).collect();
            Ok(Value::from(parts.join(s)))
        }
        _ => unknown(),
    }
}

/// Python's `str.split` (`forward`) or `str.rsplit` on `s`: on whitespace without a
/// separator, at most `maxsplit` times when it is given.
fn split_method(
    s: &str,
    forward: bool,
    args: &[Value],
) -> std::result::Result<Value, minijinja::Error> {
    let (sep, maxsplit): (Option<String>, Option<i64>) = from_args(args)?;
    let max = maxsplit.filter(|&m| m >= 0).map(|m| m as usize);
    let parts: Vec<Value> = match (sep.as_deref(), max) {
        (None, _) => s.split_whitespace().map(Value::from).collect(),
        (Some(sep), None) => s.split(sep).map(Value::from).collect(),
        (Some(sep), Some(m)) if forward => s.splitn(m + 1, sep).map(Value::from).collect(),
        (Some(sep), Some(m)) => {
            let mut v: Vec<Value> = s.rsplitn(m + 1, sep).map(Value::from).collect();
            v.reverse();
            v
        }
    };
    Ok(Value::from(parts))
}

/// Python's `dict` methods (`items`, `keys`, `values`, `get`) on the map `value`.
fn dict_method(
    value: &Value,
    method: &str,
    args: &[Value],
) -> std::result::Result<Value, minijinja::Error> {
    let unknown = || Err(minijinja::Error::from(ErrorKind::UnknownMethod));
    match method {
        "items" => {
            let pairs: Vec<Value> = value
                .try_iter()?
                .map(|k| {
                    let v = value.get_item(&k).unwrap_or_default();
                    Value::from(vec![k, v])
                })
                .collect();
            Ok(Value::from(pairs))
        }
        "keys" => Ok(Value::from(value.try_iter()?.collect::<Vec<_>>())),
        "values" => Ok(Value::from(
            value
                .try_iter()?
                .map(|k| value.get_item(&k).unwrap_or_default())
                .collect::<Vec<_>>(),
        )),
        "get" => {
            let (key, default): (Value, Option<Value>) = from_args(args)?;
            let v = value.get_item(&key).unwrap_or_default();
            Ok(if v.is_undefined() || v.is_none() {
                default.unwrap_or(Value::from(()))
            } else {
                v
            })
        }
        _ => unknown(),
    }
}

/// The current UTC time formatted with the common `strftime` codes (`%Y %m %d %H %M %S %B %b
/// %A %a %j %%`), for templates that print today's date.
fn strftime_now(fmt: &str) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs()) as i64;
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
        "Monday",
        "Tuesday",
        "Wednesday",
    ];
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let cum = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = cum[(month - 1) as usize] + day + i64::from(leap && month > 2);
    let month_name = MONTHS[(month - 1) as usize];
    let day_name = DAYS[days.rem_euclid(7) as usize];
    let mut out = String::new();
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&year.to_string()),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('H') => out.push_str(&format!("{:02}", rem / 3600)),
            Some('M') => out.push_str(&format!("{:02}", rem % 3600 / 60)),
            Some('S') => out.push_str(&format!("{:02}", rem % 60)),
            Some('j') => out.push_str(&format!("{yday:03}")),
            Some('B') => out.push_str(month_name),
            Some('b') => out.push_str(&month_name[..3]),
            Some('A') => out.push_str(day_name),
            Some('a') => out.push_str(&day_name[..3]),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(template: &str, messages: &[ChatMessage], gen: bool) -> String {
        let env = template_env(template.to_owned()).unwrap();
        env.get_template(TEMPLATE_NAME)
            .unwrap()
            .render(minijinja::context! { messages => Value::from_serialize(messages), add_generation_prompt => gen })
            .unwrap()
    }

    #[test]
    fn python_string_methods_and_trim_blocks_work() {
        let t = "{% for m in messages %}\n  {% if m.content.startswith('<x>') %}\nX{{ m.content.strip('<>x ').upper() }}|\n  {% else %}\n{{ m['content'].split(',')[1].lstrip() }}|\n  {% endif %}\n{% endfor %}";
        let msgs = [ChatMessage::user("<x> ab "), ChatMessage::user("a, b")];
        assert_eq!(render(t, &msgs, false), "XAB|\nb|\n");
    }

    #[test]
    fn raise_exception_is_an_error_and_loop_controls_work() {
        let env = template_env("{{ raise_exception('no system') }}".into()).unwrap();
        let e = env
            .get_template(TEMPLATE_NAME)
            .unwrap()
            .render(minijinja::context! {})
            .unwrap_err();
        assert!(format!("{e:#}").contains("no system"));
        let t = "{% for m in messages %}{% if loop.index0 == 1 %}{% continue %}{% endif %}{{ m.content }}{% endfor %}{{ {'a': 1} | tojson }}";
        let msgs = [
            ChatMessage::user("a"),
            ChatMessage::user("b"),
            ChatMessage::user("c"),
        ];
        assert_eq!(render(t, &msgs, false), "ac{\"a\": 1}");
    }

    #[test]
    fn tojson_takes_python_json_dumps_options() {
        let msgs = [ChatMessage::user("é😀")];
        let t = "{{ {'b': [1, 2], 'a': messages[0].content} | tojson }}|\
                 {{ {'b': 1, 'a': 2} | tojson(sort_keys=true) }}|\
                 {{ {'b': [1], 'a': 'x'} | tojson(separators=(',', ':')) }}|\
                 {{ messages[0].content | tojson(ensure_ascii=true) }}|\
                 {{ {'a': [1]} | tojson(indent=2) }}";
        assert_eq!(
            render(t, &msgs, false),
            "{\"b\": [1, 2], \"a\": \"é😀\"}|{\"a\": 2, \"b\": 1}|{\"b\":[1],\"a\":\"x\"}|\
             \"\\u00e9\\ud83d\\ude00\"|{\n  \"a\": [\n    1\n  ]\n}"
        );
    }

    #[test]
    fn strftime_now_formats_a_date() {
        let s = strftime_now("%Y-%m-%d %b %%");
        assert_eq!(s.len(), "2025-01-01 Jan %".len(), "{s}");
        assert!(s.starts_with("20"), "{s}");
    }
}
