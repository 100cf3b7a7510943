//! The [`Tool`] trait, the [`ToolSet`] that runs calls, and its [`ToolLimits`].

use std::any::Any;
use std::fmt;
use std::panic::{self, AssertUnwindSafe};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use serde_json::{json, Map, Value};

use crate::parse::{name_of, parse_tool_calls};
use crate::{Calculator, ToolCall, ToolError, ToolOutcome};

/// A tool a model can call during a multi-turn rollout.
///
/// Implementations must be `Send + Sync`: [`ToolSet::execute`] runs each call on its own
/// thread so that it can bound the time it waits.
///
/// # Example
///
/// ```
/// use atomrl_tools::{Tool, ToolError, ToolSet};
/// use serde_json::{json, Map, Value};
///
/// struct Echo;
///
/// impl Tool for Echo {
///     fn name(&self) -> &str { "echo" }
///     fn description(&self) -> &str { "Repeats `text`." }
///     fn parameters(&self) -> Value {
///         json!({"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]})
///     }
///     fn call(&self, arguments: &Map<String, Value>) -> Result<String, ToolError> {
///         match arguments.get("text") {
///             Some(Value::String(text)) => Ok(text.clone()),
///             _ => Err(ToolError::invalid_arguments("echo", "missing `text`")),
///         }
///     }
/// }
///
/// let tools = ToolSet::new().with(Echo);
/// let out = tools.run_calls("<tool_call>{\"name\": \"echo\", \"arguments\": {\"text\": \"hi\"}}</tool_call>");
/// assert_eq!(out[0].output, "hi");
/// ```
pub trait Tool: Send + Sync {
    /// The name the model calls the tool by.
    fn name(&self) -> &str;

    /// What the tool does, for the model (goes into the chat template's tool list).
    fn description(&self) -> &str;

    /// JSON-schema object of the arguments:
    /// `{"type": "object", "properties": {...}, "required": [...]}`.
    fn parameters(&self) -> Value;

    /// Runs the tool on the call's arguments object.
    ///
    /// # Errors
    ///
    /// A [`ToolError`] (usually [`ToolError::InvalidArguments`] or [`ToolError::Failed`]);
    /// its `Display` text is what the model sees.
    fn call(&self, arguments: &Map<String, Value>) -> Result<String, ToolError>;
}

/// A boxed tool is a tool (e.g. to add `Box<dyn Tool>` values built at run time).
///
/// ```
/// use atomrl_tools::{Calculator, Tool, ToolSet};
///
/// let boxed: Box<dyn Tool> = Box::new(Calculator);
/// assert_eq!(ToolSet::new().with(boxed).names(), vec!["calculator".to_string()]);
/// ```
impl<T: Tool + ?Sized> Tool for Box<T> {
    fn name(&self) -> &str {
        (**self).name()
    }
    fn description(&self) -> &str {
        (**self).description()
    }
    fn parameters(&self) -> Value {
        (**self).parameters()
    }
    fn call(&self, arguments: &Map<String, Value>) -> Result<String, ToolError> {
        (**self).call(arguments)
    }
}

/// A shared tool is a tool (e.g. one tool instance in several sets).
///
/// ```
/// use std::sync::Arc;
/// use atomrl_tools::{Calculator, Tool, ToolSet};
///
/// let shared: Arc<dyn Tool> = Arc::new(Calculator);
/// let a = ToolSet::new().with(Arc::clone(&shared));
/// assert_eq!(a.len(), 1);
/// ```
impl<T: Tool + ?Sized> Tool for Arc<T> {
    fn name(&self) -> &str {
        (**self).name()
    }
    fn description(&self) -> &str {
        (**self).description()
    }
    fn parameters(&self) -> Value {
        (**self).parameters()
    }
    fn call(&self, arguments: &Map<String, Value>) -> Result<String, ToolError> {
        (**self).call(arguments)
    }
}

/// Limits applied to every call a [`ToolSet`] runs.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use atomrl_tools::ToolLimits;
///
/// let limits = ToolLimits::default();
/// assert_eq!(limits.timeout, Duration::from_secs(2));
/// assert_eq!(limits.max_output_chars, 1000);
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ToolLimits {
    /// How long to wait for one call (default 2 s).
    pub timeout: Duration,
    /// Most characters of output kept (default 1000); longer output is cut on a character
    /// boundary and [`TRUNCATION_MARKER`](ToolSet::TRUNCATION_MARKER) is appended.
    pub max_output_chars: usize,
}

impl Default for ToolLimits {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(2),
            max_output_chars: 1000,
        }
    }
}

/// An ordered set of tools with the [`ToolLimits`] applied to their calls.
///
/// Cloning is cheap (the tools are shared behind `Arc`).
///
/// # Example
///
/// ```
/// use atomrl_tools::ToolSet;
///
/// let tools = ToolSet::from_names(&["calculator"])?;
/// assert_eq!(tools.names(), vec!["calculator".to_string()]);
/// let schemas = tools.schemas();
/// assert_eq!(schemas[0]["function"]["name"], "calculator");
///
/// let text = "<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"3×4\"}}\n</tool_call>";
/// let outcomes = tools.run_calls(text);
/// assert_eq!(outcomes.len(), 1);
/// assert_eq!(outcomes[0].output, "12");
/// assert!(!outcomes[0].is_error());
/// # Ok::<(), atomrl_tools::ToolError>(())
/// ```
#[derive(Clone, Default)]
pub struct ToolSet {
    tools: Vec<Arc<dyn Tool>>,
    limits: ToolLimits,
}

impl fmt::Debug for ToolSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ToolSet")
            .field("tools", &self.names())
            .field("limits", &self.limits)
            .finish()
    }
}

const BUILTIN_NAMES: &[&str] = &[Calculator::NAME];

impl ToolSet {
    /// Appended to output cut at [`ToolLimits::max_output_chars`].
    pub const TRUNCATION_MARKER: &'static str = "…[truncated]";

    /// An empty set with the default limits.
    ///
    /// ```
    /// use atomrl_tools::ToolSet;
    ///
    /// assert!(ToolSet::new().is_empty());
    /// ```
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `tool`. A tool with the same name as one already in the set *replaces* it, in
    /// its position.
    ///
    /// ```
    /// use atomrl_tools::{Calculator, ToolSet};
    ///
    /// let tools = ToolSet::new().with(Calculator).with(Calculator);
    /// assert_eq!(tools.len(), 1);
    /// ```
    pub fn with(mut self, tool: impl Tool + 'static) -> Self {
        let tool: Arc<dyn Tool> = Arc::new(tool);
        match self.tools.iter_mut().find(|t| t.name() == tool.name()) {
            Some(slot) => *slot = tool,
            None => self.tools.push(tool),
        }
        self
    }

    /// Sets the limits applied to every call.
    ///
    /// ```
    /// use std::time::Duration;
    /// use atomrl_tools::{ToolLimits, ToolSet};
    ///
    /// let limits = ToolLimits { timeout: Duration::from_millis(500), max_output_chars: 200 };
    /// assert_eq!(ToolSet::new().with_limits(limits).limits(), limits);
    /// ```
    pub fn with_limits(mut self, limits: ToolLimits) -> Self {
        self.limits = limits;
        self
    }

    /// The limits applied to every call.
    ///
    /// ```
    /// use atomrl_tools::{ToolLimits, ToolSet};
    ///
    /// assert_eq!(ToolSet::new().limits(), ToolLimits::default());
    /// ```
    pub fn limits(&self) -> ToolLimits {
        self.limits
    }

    /// A set of built-in tools by name (see [`builtin_names`](Self::builtin_names)), in the
    /// given order; a repeated name is kept once.
    ///
    /// # Errors
    ///
    /// [`ToolError::UnknownTool`] for a name that is not built in (`known` lists the
    /// built-in names).
    ///
    /// ```
    /// use atomrl_tools::ToolSet;
    ///
    /// assert_eq!(ToolSet::from_names(&["calculator"])?.len(), 1);
    /// assert_eq!(
    ///     ToolSet::from_names(&["search"]).unwrap_err().to_string(),
    ///     "unknown tool `search`; known tools: calculator"
    /// );
    /// # Ok::<(), atomrl_tools::ToolError>(())
    /// ```
    pub fn from_names<S: AsRef<str>>(names: &[S]) -> Result<Self, ToolError> {
        let mut set = Self::new();
        for name in names {
            set = match name.as_ref() {
                Calculator::NAME => set.with(Calculator),
                other => {
                    return Err(ToolError::UnknownTool {
                        name: other.to_string(),
                        known: BUILTIN_NAMES.join(", "),
                    })
                }
            };
        }
        Ok(set)
    }

    /// The names [`from_names`](Self::from_names) accepts.
    ///
    /// ```
    /// assert_eq!(atomrl_tools::ToolSet::builtin_names(), &["calculator"]);
    /// ```
    pub fn builtin_names() -> &'static [&'static str] {
        BUILTIN_NAMES
    }

    /// Whether the set has no tools.
    ///
    /// ```
    /// assert!(atomrl_tools::ToolSet::new().is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }

    /// How many tools the set has.
    ///
    /// ```
    /// use atomrl_tools::{Calculator, ToolSet};
    ///
    /// assert_eq!(ToolSet::new().with(Calculator).len(), 1);
    /// ```
    pub fn len(&self) -> usize {
        self.tools.len()
    }

    /// The tools' names, in insertion order.
    ///
    /// ```
    /// use atomrl_tools::{Calculator, ToolSet};
    ///
    /// assert_eq!(ToolSet::new().with(Calculator).names(), vec!["calculator".to_string()]);
    /// ```
    pub fn names(&self) -> Vec<String> {
        self.tools.iter().map(|t| t.name().to_string()).collect()
    }

    /// The tool called `name`.
    ///
    /// ```
    /// use atomrl_tools::{Calculator, ToolSet};
    ///
    /// let tools = ToolSet::new().with(Calculator);
    /// assert!(tools.get("calculator").is_some());
    /// assert!(tools.get("search").is_none());
    /// ```
    pub fn get(&self, name: &str) -> Option<&dyn Tool> {
        self.tools
            .iter()
            .find(|t| t.name() == name)
            .map(|t| t.as_ref())
    }

    /// The `tools` list for a chat template, in the OpenAI / Hugging Face format
    /// `[{"type": "function", "function": {"name", "description", "parameters"}}]`, in
    /// insertion order.
    ///
    /// ```
    /// use atomrl_tools::{Calculator, ToolSet};
    ///
    /// let schemas = ToolSet::new().with(Calculator).schemas();
    /// assert_eq!(schemas[0]["type"], "function");
    /// assert_eq!(schemas[0]["function"]["parameters"]["required"][0], "expression");
    /// ```
    pub fn schemas(&self) -> Vec<Value> {
        self.tools
            .iter()
            .map(|t| {
                json!({
                    "type": "function",
                    "function": {
                        "name": t.name(),
                        "description": t.description(),
                        "parameters": t.parameters(),
                    }
                })
            })
            .collect()
    }

    /// Runs one parsed call (or reports its parse error) and returns what the tool turn
    /// shows. `raw` is the text of the block (kept in [`ToolOutcome::raw`]).
    ///
    /// Never panics: a tool that panics gives [`ToolError::Failed`] with reason
    /// `panicked: {message}` (the panic hook still prints the panic as usual). Bounded in
    /// time: the call runs on a spawned thread and is waited for at most
    /// [`ToolLimits::timeout`]; past it the outcome is [`ToolError::Timeout`] and the thread
    /// is left detached to finish on its own, since a Rust thread cannot be killed (tools
    /// should bound their own work, as [`Calculator`] does; a leaked thread's result is
    /// dropped). The output (or `error: {ToolError}`) is cut to
    /// [`ToolLimits::max_output_chars`] characters on a character boundary, followed by
    /// [`TRUNCATION_MARKER`](Self::TRUNCATION_MARKER).
    ///
    /// ```
    /// use atomrl_tools::{ToolCall, ToolError, ToolSet};
    ///
    /// let tools = ToolSet::from_names(&["calculator"])?;
    /// let out = tools.execute("{}", Err(ToolError::malformed("missing `name`")));
    /// assert_eq!(out.output, "error: malformed tool call: missing `name`");
    ///
    /// let out = tools.execute("", Ok(ToolCall::new("search", Default::default())));
    /// assert_eq!(out.output, "error: unknown tool `search`; known tools: calculator");
    /// assert_eq!(out.name.as_deref(), Some("search"));
    /// # Ok::<(), ToolError>(())
    /// ```
    pub fn execute(&self, raw: &str, parsed: Result<ToolCall, ToolError>) -> ToolOutcome {
        let (name, result) = match parsed {
            Err(error) => (name_of(raw), Err(error)),
            Ok(call) => {
                let result = self.run(&call);
                (Some(call.name), result)
            }
        };
        let (output, error) = match result {
            Ok(output) => (output, None),
            Err(error) => (format!("error: {error}"), Some(error)),
        };
        ToolOutcome {
            raw: raw.to_string(),
            name,
            output: truncate(output, self.limits.max_output_chars),
            error,
        }
    }

    /// Parses every `<tool_call>` block of an assistant turn's text (see
    /// [`parse_tool_calls`](crate::parse_tool_calls)) and [executes](Self::execute) each, in
    /// order. Text without any block gives an empty `Vec`.
    ///
    /// ```
    /// use atomrl_tools::ToolSet;
    ///
    /// let tools = ToolSet::from_names(&["calculator"])?;
    /// let text = "<tool_call>{\"name\": \"calculator\", \"arguments\": {\"expression\": \"2^10\"}}</tool_call>\
    ///             <tool_call>{\"name\": \"calculator\", \"arguments\": {\"expression\": \"7/3\"}}</tool_call>";
    /// let outputs: Vec<String> = tools.run_calls(text).into_iter().map(|o| o.output).collect();
    /// assert_eq!(outputs, ["1024", "7/3"]);
    /// # Ok::<(), atomrl_tools::ToolError>(())
    /// ```
    pub fn run_calls(&self, assistant_text: &str) -> Vec<ToolOutcome> {
        parse_tool_calls(assistant_text)
            .into_iter()
            .map(|(raw, parsed)| self.execute(&raw, parsed))
            .collect()
    }

    /// Runs `call` on its tool, on a spawned thread, waiting at most the timeout.
    fn run(&self, call: &ToolCall) -> Result<String, ToolError> {
        let Some(tool) = self.tools.iter().find(|t| t.name() == call.name) else {
            let known = if self.tools.is_empty() {
                "(none)".to_string()
            } else {
                self.names().join(", ")
            };
            return Err(ToolError::UnknownTool {
                name: call.name.clone(),
                known,
            });
        };
        let name = call.name.clone();
        let tool = Arc::clone(tool);
        let arguments = call.arguments.clone();
        let (sender, receiver) = mpsc::sync_channel(1);
        let spawned = std::thread::Builder::new()
            .name("atomrl-tool".to_string())
            .spawn(move || {
                let result = panic::catch_unwind(AssertUnwindSafe(|| tool.call(&arguments)));
                // The receiver is gone after a timeout: nobody wants the result then.
                let _ = sender.send(result);
            });
        if let Err(e) = spawned {
            return Err(ToolError::failed(name, format!("could not start: {e}")));
        }
        match receiver.recv_timeout(self.limits.timeout) {
            Ok(Ok(result)) => result,
            Ok(Err(payload)) => Err(ToolError::failed(
                name,
                format!("panicked: {}", panic_message(payload.as_ref())),
            )),
            Err(mpsc::RecvTimeoutError::Timeout) => Err(ToolError::Timeout {
                tool: name,
                limit_ms: u64::try_from(self.limits.timeout.as_millis()).unwrap_or(u64::MAX),
            }),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                Err(ToolError::failed(name, "panicked: (no message)"))
            }
        }
    }
}

/// The message of a panic payload (`&str` or `String`), else a placeholder.
fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "(no message)".to_string()
    }
}

/// `text` cut to `max_chars` characters plus the marker, when it is longer.
fn truncate(text: String, max_chars: usize) -> String {
    match text.char_indices().nth(max_chars) {
        None => text,
        Some((cut, _)) => format!("{}{}", &text[..cut], ToolSet::TRUNCATION_MARKER),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncates_on_char_boundary() {
        assert_eq!(truncate("abc".into(), 3), "abc");
        assert_eq!(truncate("abcd".into(), 3), "abc…[truncated]");
        assert_eq!(truncate("ééé".into(), 2), "éé…[truncated]");
        assert_eq!(truncate("x".into(), 0), "…[truncated]");
        assert_eq!(truncate(String::new(), 0), "");
    }

    #[test]
    fn with_replaces_in_place() {
        struct Named(&'static str, &'static str);
        impl Tool for Named {
            fn name(&self) -> &str {
                self.0
            }
            fn description(&self) -> &str {
                self.1
            }
            fn parameters(&self) -> Value {
                json!({"type": "object", "properties": {}, "required": []})
            }
            fn call(&self, _: &Map<String, Value>) -> Result<String, ToolError> {
                Ok(self.1.to_string())
            }
        }
        let tools = ToolSet::new()
            .with(Named("a", "first"))
            .with(Named("b", "b"))
            .with(Named("a", "second"));
        assert_eq!(tools.names(), ["a", "b"]);
        assert_eq!(tools.get("a").map(|t| t.description()), Some("second"));
        assert!(format!("{tools:?}").contains("[\"a\", \"b\"]"));
    }

    #[test]
    fn unknown_tool_in_empty_set() {
        let out = ToolSet::new().execute("", Ok(ToolCall::new("x", Map::new())));
        assert_eq!(out.output, "error: unknown tool `x`; known tools: (none)");
    }
}
