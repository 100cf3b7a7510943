//! Parsing tool calls in the Qwen2.5 / Qwen3 / Hermes format:
//! `<tool_call>\n{"name": "...", "arguments": {...}}\n</tool_call>`.

use serde_json::{Map, Value};

use crate::ToolError;

/// The tag that opens a tool call.
///
/// ```
/// assert_eq!(atomrl_tools::TOOL_CALL_START, "<tool_call>");
/// ```
pub const TOOL_CALL_START: &str = "<tool_call>";

/// The tag that closes a tool call.
///
/// ```
/// assert_eq!(atomrl_tools::TOOL_CALL_END, "</tool_call>");
/// ```
pub const TOOL_CALL_END: &str = "</tool_call>";

/// One parsed tool call: the tool's name and its arguments object.
///
/// # Example
///
/// ```
/// use atomrl_tools::{parse_tool_calls, ToolCall};
///
/// let call = ToolCall::new("calculator", serde_json::json!({"expression": "1+1"}).as_object().cloned().unwrap_or_default());
/// let parsed = parse_tool_calls(&call.render());
/// assert_eq!(parsed.len(), 1);
/// assert_eq!(parsed[0].1, Ok(call));
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    /// The tool's name.
    pub name: String,
    /// The arguments object.
    pub arguments: Map<String, Value>,
}

impl ToolCall {
    /// A call of `name` with `arguments`.
    ///
    /// ```
    /// use atomrl_tools::ToolCall;
    ///
    /// let call = ToolCall::new("calculator", serde_json::Map::new());
    /// assert_eq!(call.name, "calculator");
    /// assert!(call.arguments.is_empty());
    /// ```
    pub fn new(name: impl Into<String>, arguments: Map<String, Value>) -> Self {
        Self {
            name: name.into(),
            arguments,
        }
    }

    /// The call as a model writes it in the Qwen/Hermes format:
    /// `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>` (compact JSON, keys
    /// in insertion order). [`parse_tool_calls`] reads it back.
    ///
    /// ```
    /// use atomrl_tools::ToolCall;
    ///
    /// let mut args = serde_json::Map::new();
    /// args.insert("expression".into(), "2+2".into());
    /// assert_eq!(
    ///     ToolCall::new("calculator", args).render(),
    ///     "<tool_call>\n{\"name\":\"calculator\",\"arguments\":{\"expression\":\"2+2\"}}\n</tool_call>"
    /// );
    /// ```
    pub fn render(&self) -> String {
        let mut object = Map::new();
        object.insert("name".into(), Value::String(self.name.clone()));
        object.insert("arguments".into(), Value::Object(self.arguments.clone()));
        format!(
            "{TOOL_CALL_START}\n{}\n{TOOL_CALL_END}",
            Value::Object(object)
        )
    }
}

/// Every `<tool_call>…</tool_call>` block of `text`, in order, as (the trimmed text between
/// the tags, its parse).
///
/// The inner text must be a JSON object with a string `name` and an `arguments` object;
/// whitespace around the JSON is allowed, other keys (e.g. `id`) are ignored, `arguments`
/// may be missing or `null` (no arguments) or a JSON *string* holding an object (some models
/// emit that). A `<tool_call>` with no closing tag gives one final
/// [`ToolError::MalformedCall`] (`unterminated <tool_call>`) holding the rest of the text.
/// Text without any block gives an empty `Vec`.
///
/// # Example
///
/// ```
/// use atomrl_tools::parse_tool_calls;
///
/// let text = "Let me compute.\n<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"6*7\"}}\n</tool_call>";
/// let calls = parse_tool_calls(text);
/// assert_eq!(calls.len(), 1);
/// let (raw, call) = &calls[0];
/// assert!(raw.starts_with('{'));
/// let call = call.as_ref().map_err(|e| e.to_string())?;
/// assert_eq!(call.name, "calculator");
/// assert_eq!(call.arguments["expression"], "6*7");
///
/// assert!(parse_tool_calls("no tools here").is_empty());
/// let bad = parse_tool_calls("<tool_call>{\"name\": \"calculator\"");
/// assert_eq!(
///     bad[0].1.as_ref().unwrap_err().to_string(),
///     "malformed tool call: unterminated <tool_call>"
/// );
/// # Ok::<(), String>(())
/// ```
pub fn parse_tool_calls(text: &str) -> Vec<(String, Result<ToolCall, ToolError>)> {
    let mut calls = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find(TOOL_CALL_START) {
        let after = &rest[start + TOOL_CALL_START.len()..];
        match after.find(TOOL_CALL_END) {
            Some(end) => {
                let raw = after[..end].trim();
                calls.push((raw.to_string(), parse_call(raw)));
                rest = &after[end + TOOL_CALL_END.len()..];
            }
            None => {
                calls.push((
                    after.trim().to_string(),
                    Err(ToolError::malformed("unterminated <tool_call>")),
                ));
                break;
            }
        }
    }
    calls
}

/// Parses the JSON between the tags.
fn parse_call(raw: &str) -> Result<ToolCall, ToolError> {
    let value: Value = serde_json::from_str(raw)
        .map_err(|e| ToolError::malformed(format!("invalid JSON: {e}")))?;
    let Value::Object(mut object) = value else {
        return Err(ToolError::malformed("expected a JSON object"));
    };
    let name = match object.remove("name") {
        Some(Value::String(name)) if !name.trim().is_empty() => name.trim().to_string(),
        Some(Value::String(_)) => return Err(ToolError::malformed("empty `name`")),
        Some(_) => return Err(ToolError::malformed("`name` must be a string")),
        None => return Err(ToolError::malformed("missing `name`")),
    };
    let arguments = match object.remove("arguments") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(arguments)) => arguments,
        Some(Value::String(text)) => match serde_json::from_str::<Value>(&text) {
            Ok(Value::Object(arguments)) => arguments,
            _ => {
                return Err(ToolError::malformed(
                    "`arguments` must be a JSON object (or a string holding one)",
                ))
            }
        },
        Some(_) => {
            return Err(ToolError::malformed(
                "`arguments` must be a JSON object (or a string holding one)",
            ))
        }
    };
    Ok(ToolCall { name, arguments })
}

/// The `name` of the JSON in `raw`, when it is an object with a string `name` (used to name
/// the tool in an outcome whose call did not parse).
pub(crate) fn name_of(raw: &str) -> Option<String> {
    match serde_json::from_str::<Value>(raw).ok()? {
        Value::Object(mut object) => match object.remove("name")? {
            Value::String(name) => Some(name),
            _ => None,
        },
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn args(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn parses_several_blocks_in_order() {
        let text = "a<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"1+1\"}}\n</tool_call> b \
                    <tool_call>{\"name\":\"other\",\"arguments\":\"{\\\"x\\\": 1}\"}</tool_call>";
        let calls = parse_tool_calls(text);
        assert_eq!(calls.len(), 2);
        assert_eq!(
            calls[0].0,
            "{\"name\": \"calculator\", \"arguments\": {\"expression\": \"1+1\"}}"
        );
        assert_eq!(
            calls[0].1,
            Ok(ToolCall::new(
                "calculator",
                args(json!({"expression": "1+1"}))
            ))
        );
        assert_eq!(
            calls[1].1,
            Ok(ToolCall::new("other", args(json!({"x": 1}))))
        );
    }

    #[test]
    fn malformed_blocks() {
        let reason = |text: &str| match &parse_tool_calls(text)[0].1 {
            Err(ToolError::MalformedCall { reason }) => reason.clone(),
            other => panic!("{text:?}: {other:?}"),
        };
        assert!(reason("<tool_call>{not json}</tool_call>").starts_with("invalid JSON"));
        assert_eq!(
            reason("<tool_call>[1]</tool_call>"),
            "expected a JSON object"
        );
        assert_eq!(
            reason("<tool_call>{\"arguments\": {}}</tool_call>"),
            "missing `name`"
        );
        assert_eq!(
            reason("<tool_call>{\"name\": 3}</tool_call>"),
            "`name` must be a string"
        );
        assert_eq!(
            reason("<tool_call>{\"name\": \"c\", \"arguments\": [1]}</tool_call>"),
            "`arguments` must be a JSON object (or a string holding one)"
        );
        assert_eq!(
            reason("<tool_call>{\"name\": \"c\", \"arguments\": \"[1]\"}</tool_call>"),
            "`arguments` must be a JSON object (or a string holding one)"
        );
        let calls = parse_tool_calls("<tool_call>{}</tool_call> x <tool_call> {\"name\": ");
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[1].0, "{\"name\":");
        assert_eq!(
            calls[1].1,
            Err(ToolError::malformed("unterminated <tool_call>"))
        );
    }

    #[test]
    fn missing_arguments_are_empty() {
        let calls = parse_tool_calls("<tool_call>{\"name\": \"now\"}</tool_call>");
        assert_eq!(calls[0].1, Ok(ToolCall::new("now", Map::new())));
        assert!(parse_tool_calls("").is_empty());
        assert!(parse_tool_calls("</tool_call>").is_empty());
    }

    #[test]
    fn name_of_raw() {
        assert_eq!(
            name_of("{\"name\": \"c\", \"arguments\": 1}"),
            Some("c".into())
        );
        assert_eq!(name_of("{"), None);
    }
}
