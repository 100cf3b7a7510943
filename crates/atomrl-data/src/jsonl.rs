//! JSON Lines datasets: one example per line, in any of the common row shapes.

use std::io::Write;
use std::path::Path;

use atomrl_core::{Error, Result};
use serde_json::{Map, Value};

use crate::example::{short, ChatMessage, Example, Prompt};
use crate::preference::{is_preference_row, preference_from_row};

/// Loads a JSON Lines dataset (one JSON object per line; blank lines are skipped).
///
/// Each row is one of:
/// - `{"prompt": P, "ground_truth": G}` — GRPO. `P` is a string or a list of
///   `{"role", "content"}` messages; `G` a string or a number (`72` becomes `"72"`).
/// - `{"prompt": P, "completion": C}` — SFT; `ground_truth` is optional (empty if absent).
/// - `{"messages": [...]}` — SFT chat: the last message must have role `assistant` and is the
///   completion, the messages before it are the prompt; `ground_truth` is optional.
/// - `{"question": Q, "answer": "... #### 72"}` — GSM8K: the ground truth is what follows
///   `####` (unless a `ground_truth` field is given) and the answer text is the completion.
/// - `{"prompt": P, "chosen": C, "rejected": R, "margin": M}` — a preference pair (DPO, reward
///   models; TRL's format): `C` and `R` are strings, or one assistant message each when `P` is
///   a list of messages; without `prompt`, `C` and `R` are whole conversations whose shared
///   messages before the last are the prompt. `margin` and `ground_truth` are optional. A pair
///   with an empty side, or with identical sides, is refused.
///
/// Other fields are ignored. A file whose first non-blank character is `[` is read as one JSON
/// array of such rows instead.
///
/// # Errors
/// [`Error::File`] with `path` (and `path:LINE` for a bad line) when the file cannot be read,
/// is empty, or a line is not valid JSON (with serde's column), lacks a required field, has a
/// field of the wrong type, or is a `messages` row that does not end with the assistant.
///
/// ```
/// let dir = std::env::temp_dir().join("atomrl_doctest_load_jsonl");
/// std::fs::create_dir_all(&dir).unwrap();
/// let path = dir.join("train.jsonl");
/// std::fs::write(&path, "{\"prompt\": \"5+7?\", \"ground_truth\": 12}\n\n{\"prompt\": 3}\n").unwrap();
/// let err = atomrl_data::load_jsonl(&path).unwrap_err().to_string();
/// assert!(err.contains("train.jsonl:3:"), "{err}");
/// std::fs::write(&path, "{\"prompt\": \"5+7?\", \"ground_truth\": 12}\n").unwrap();
/// let rows = atomrl_data::load_jsonl(&path)?;
/// assert_eq!(rows[0].ground_truth, "12");
/// # Ok::<(), atomrl_core::Error>(())
/// ```
pub fn load_jsonl(path: &Path) -> Result<Vec<Example>> {
    let bytes = std::fs::read(path).map_err(|e| Error::file(path.display(), e))?;
    parse_jsonl_bytes(&bytes, &path.display().to_string())
}

/// Parses JSON Lines text as [`load_jsonl`] does; `name` stands for the file in errors.
///
/// # Errors
/// As [`load_jsonl`], with `name:LINE` in place of the path.
///
/// ```
/// use atomrl_data::parse_jsonl;
/// let text = r#"{"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]}
/// {"question": "How many?", "answer": "2+2=4\n#### 4"}"#;
/// let rows = parse_jsonl(text, "inline")?;
/// assert_eq!(rows[0].completion.as_deref(), Some("4"));
/// assert_eq!(rows[1].ground_truth, "4");
/// let err = parse_jsonl("{\"prompt\": \"x\"", "inline").unwrap_err().to_string();
/// assert!(err.starts_with("inline:1: invalid JSON"), "{err}");
/// # Ok::<(), atomrl_core::Error>(())
/// ```
pub fn parse_jsonl(text: &str, name: &str) -> Result<Vec<Example>> {
    parse_jsonl_bytes(text.as_bytes(), name)
}

fn parse_jsonl_bytes(bytes: &[u8], name: &str) -> Result<Vec<Example>> {
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[') {
        return parse_json_array(bytes, name);
    }
    let mut out = Vec::new();
    for (i, line) in bytes.split(|&b| b == b'\n').enumerate() {
        let at = format!("{name}:{}", i + 1);
        let line = std::str::from_utf8(line).map_err(|e| Error::file(&at, e))?;
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let value: Value = serde_json::from_str(line).map_err(|e| {
            Error::file(
                &at,
                format!(
                    "invalid JSON at column {}: {}",
                    e.column(),
                    serde_message(&e)
                ),
            )
        })?;
        out.push(example_from_value(&value).map_err(|m| Error::file(&at, m))?);
    }
    if out.is_empty() {
        return Err(Error::file(name, "no examples (the file is empty)"));
    }
    Ok(out)
}

fn parse_json_array(bytes: &[u8], name: &str) -> Result<Vec<Example>> {
    let rows: Vec<Value> = serde_json::from_slice(bytes).map_err(|e| {
        Error::file(
            format!("{name}:{}", e.line()),
            format!(
                "invalid JSON at column {}: {}",
                e.column(),
                serde_message(&e)
            ),
        )
    })?;
    if rows.is_empty() {
        return Err(Error::file(name, "no examples (the array is empty)"));
    }
    rows.iter()
        .enumerate()
        .map(|(i, v)| example_from_value(v).map_err(|m| Error::file(name, format!("row {i}: {m}"))))
        .collect()
}

/// serde_json's message without its trailing ` at line L column C`.
fn serde_message(e: &serde_json::Error) -> String {
    let s = e.to_string();
    match s.rfind(" at line ") {
        Some(p) => s[..p].to_string(),
        None => s,
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A field that is absent or null counts as missing.
fn field<'a>(row: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    row.get(key).filter(|v| !v.is_null())
}

fn string_field(row: &Map<String, Value>, key: &str) -> Result<Option<String>, String> {
    match field(row, key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(v) => Err(format!("`{key}` must be a string, got {}", type_name(v))),
    }
}

fn ground_truth_field(row: &Map<String, Value>) -> Result<Option<String>, String> {
    match field(row, "ground_truth") {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Number(n)) => Ok(Some(n.to_string())),
        Some(v) => Err(format!(
            "`ground_truth` must be a string or a number, got {}",
            type_name(v)
        )),
    }
}

pub(crate) fn messages(v: &Value, key: &str) -> Result<Vec<ChatMessage>, String> {
    let Value::Array(items) = v else {
        return Err(format!(
            "`{key}` must be a list of {{\"role\", \"content\"}} messages, got {}",
            type_name(v)
        ));
    };
    if items.is_empty() {
        return Err(format!("`{key}` is an empty list"));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let Value::Object(m) = m else {
                return Err(format!(
                    "`{key}[{i}]` must be an object with `role` and `content`, got {}",
                    type_name(m)
                ));
            };
            let get = |k: &str| match m.get(k) {
                Some(Value::String(s)) => Ok(s.clone()),
                Some(v) => Err(format!(
                    "`{key}[{i}].{k}` must be a string, got {}",
                    type_name(v)
                )),
                None => Err(format!("`{key}[{i}]` has no `{k}`")),
            };
            Ok(ChatMessage::new(get("role")?, get("content")?))
        })
        .collect()
}

fn prompt_field(v: &Value) -> Result<Prompt, String> {
    match v {
        Value::String(s) => Ok(Prompt::Text(s.clone())),
        Value::Array(_) => Ok(Prompt::Messages(messages(v, "prompt")?)),
        other => Err(format!(
            "`prompt` must be a string or a list of messages, got {}",
            type_name(other)
        )),
    }
}

/// One row in any accepted shape; the error is the message of an [`Error::File`].
pub(crate) fn example_from_value(value: &Value) -> Result<Example, String> {
    let Value::Object(row) = value else {
        return Err(format!("expected a JSON object, got {}", type_name(value)));
    };
    let ground_truth = ground_truth_field(row)?;
    if is_preference_row(row) {
        let prompt = field(row, "prompt").map(prompt_field).transpose()?;
        let (prompt, preference) = preference_from_row(row, prompt)?;
        return Ok(Example {
            prompt,
            ground_truth: ground_truth.unwrap_or_default(),
            completion: None,
            preference: Some(preference),
        });
    }
    if let Some(p) = field(row, "prompt") {
        let prompt = prompt_field(p)?;
        let completion = string_field(row, "completion")?;
        let ground_truth = match (ground_truth, &completion) {
            (Some(g), _) => g,
            (None, Some(_)) => String::new(),
            (None, None) => {
                return Err(
                    "missing field `ground_truth` (a `prompt` row needs `ground_truth` or \
                     `completion`)"
                        .into(),
                )
            }
        };
        return Ok(Example {
            prompt,
            ground_truth,
            completion,
            preference: None,
        });
    }
    if let Some(m) = field(row, "messages") {
        let mut msgs = messages(m, "messages")?;
        let last = msgs.pop().ok_or("`messages` is an empty list")?;
        if last.role != "assistant" {
            return Err(format!(
                "the last message of `messages` must have role `assistant` (it is the \
                 completion), got role `{}`",
                last.role
            ));
        }
        if msgs.is_empty() {
            return Err("`messages` has no message before the assistant's answer".into());
        }
        return Ok(Example {
            prompt: Prompt::Messages(msgs),
            ground_truth: ground_truth.unwrap_or_default(),
            completion: Some(last.content),
            preference: None,
        });
    }
    if let Some(q) = string_field(row, "question")? {
        let Some(answer) = string_field(row, "answer")? else {
            return Err("missing field `answer` (a `question` row is a GSM8K row)".into());
        };
        let ground_truth = match ground_truth {
            Some(g) => g,
            None => atomrl_reward::extract_gsm8k_ground_truth(&answer).ok_or_else(|| {
                format!("`answer` has no `#### <answer>` line: {:?}", short(&answer))
            })?,
        };
        return Ok(Example {
            prompt: Prompt::Text(q),
            ground_truth,
            completion: Some(answer),
            preference: None,
        });
    }
    let mut keys: Vec<&str> = row.keys().map(String::as_str).collect();
    keys.sort_unstable();
    Err(format!(
        "missing field `prompt` (a row needs `prompt`, `messages` or `question`; it has: {})",
        if keys.is_empty() {
            "no fields".to_string()
        } else {
            keys.join(", ")
        }
    ))
}

/// Writes examples as JSON Lines in the `{"prompt", "ground_truth", "completion"}` form
/// (`completion` only when present), which [`load_jsonl`] reads back unchanged.
///
/// # Errors
/// [`Error::File`] naming `path` when it cannot be written.
///
/// ```
/// use atomrl_data::{load_jsonl, write_jsonl, Example};
/// let path = std::env::temp_dir().join("atomrl_doctest_write.jsonl");
/// let rows = vec![Example::new("5+7?", "12").with_completion("12")];
/// write_jsonl(&path, &rows)?;
/// assert_eq!(load_jsonl(&path)?, rows);
/// # Ok::<(), atomrl_core::Error>(())
/// ```
pub fn write_jsonl(path: &Path, examples: &[Example]) -> Result<()> {
    let err = |e: &dyn std::fmt::Display| Error::file(path.display(), e);
    let file = std::fs::File::create(path).map_err(|e| err(&e))?;
    let mut w = std::io::BufWriter::new(file);
    for ex in examples {
        serde_json::to_writer(&mut w, ex).map_err(|e| err(&e))?;
        w.write_all(b"\n").map_err(|e| err(&e))?;
    }
    w.flush().map_err(|e| err(&e))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn one(line: &str) -> Result<Example, String> {
        example_from_value(&serde_json::from_str(line).unwrap())
    }

    #[test]
    fn row_shapes() {
        let e = one(r#"{"prompt": "q", "ground_truth": 7.5}"#).unwrap();
        assert_eq!((e.ground_truth.as_str(), e.completion), ("7.5", None));
        let e = one(r#"{"prompt": "q", "completion": "c"}"#).unwrap();
        assert_eq!(
            (e.ground_truth.as_str(), e.completion.as_deref()),
            ("", Some("c"))
        );
        let e = one(r#"{"question": "q", "answer": "x\n#### 1,200", "id": 3}"#).unwrap();
        assert_eq!(e.ground_truth, "1200");
        let e = one(r#"{"question": "q", "answer": "no marker", "ground_truth": "5"}"#).unwrap();
        assert_eq!(e.ground_truth, "5");
    }

    #[test]
    fn row_errors() {
        let cases = [
            (r#"[1]"#, "expected a JSON object"),
            (r#"{"prompt": "q"}"#, "missing field `ground_truth`"),
            (
                r#"{"prompt": "q", "ground_truth": [1]}"#,
                "string or a number, got an array",
            ),
            (
                r#"{"prompt": {"a": 1}, "ground_truth": "1"}"#,
                "`prompt` must be",
            ),
            (
                r#"{"prompt": [{"role": "user"}], "ground_truth": "1"}"#,
                "`prompt[0]` has no `content`",
            ),
            (
                r#"{"messages": [{"role": "user", "content": "q"}]}"#,
                "must have role `assistant`",
            ),
            (
                r#"{"messages": [{"role": "assistant", "content": "a"}]}"#,
                "no message before",
            ),
            (r#"{"messages": []}"#, "empty list"),
            (r#"{"question": "q"}"#, "missing field `answer`"),
            (r#"{"question": "q", "answer": "72"}"#, "no `#### <answer>`"),
            (r#"{"text": "q"}"#, "it has: text"),
        ];
        for (line, want) in cases {
            let err = one(line).unwrap_err();
            assert!(err.contains(want), "{line}: {err}");
        }
    }

    #[test]
    fn json_array_and_bom() {
        let rows = parse_jsonl(
            "\u{feff}[{\"prompt\": \"a\", \"ground_truth\": \"1\"}]",
            "x",
        )
        .unwrap();
        assert_eq!(rows.len(), 1);
        let err = parse_jsonl("[{\"prompt\": \"a\"}]", "x")
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("x: row 0:"), "{err}");
        let rows = parse_jsonl(
            "\u{feff}{\"prompt\": \"a\", \"ground_truth\": \"1\"}\r\n",
            "x",
        )
        .unwrap();
        assert_eq!(rows.len(), 1);
    }
}
