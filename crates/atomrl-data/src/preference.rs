//! Preference rows (DPO, reward models) in TRL's formats: `prompt` with `chosen` / `rejected`
//! completions, as text or as chat messages, or conversations whose shared messages are the
//! implicit prompt.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::example::{ChatMessage, Example, Prompt};

/// Two completions of an example's prompt, the first preferred (a DPO pair, a reward model's
/// training pair), with an optional margin (how strongly, for `compute_reward_model_loss`).
///
/// ```
/// use atomrl_data::{parse_jsonl, Prompt};
/// let rows = parse_jsonl(r#"{"prompt": "2+2?", "chosen": "4", "rejected": "5", "margin": 1.5}"#, "inline")?;
/// let p = rows[0].preference.as_ref().unwrap();
/// assert_eq!((p.chosen.as_str(), p.rejected.as_str(), p.margin), ("4", "5", Some(1.5)));
/// // The conversational form with an implicit prompt (TRL's `trl-lib/ultrafeedback_binarized`).
/// let line = concat!(
///     r#"{"chosen": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}], "#,
///     r#""rejected": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Go away."}]}"#,
/// );
/// let rows = parse_jsonl(line, "inline")?;
/// assert_eq!(rows[0].prompt, Prompt::Messages(vec![atomrl_data::ChatMessage::new("user", "Hi")]));
/// assert_eq!(rows[0].preference.as_ref().unwrap().rejected, "Go away.");
/// # Ok::<(), atomrl_core::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Preference {
    /// The preferred completion.
    pub chosen: String,
    /// The other completion.
    pub rejected: String,
    /// How much better `chosen` is (optional; the reward model's margin).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub margin: Option<f64>,
}

/// Checks that `examples` are preference pairs, which `recipe` trains on: an error naming the
/// `dataset` key otherwise (its rows mixed, or plain prompts).
///
/// ```
/// use atomrl_data::{require_preference_dataset, Example};
/// let prompts = [Example::new("2+2?", "4")];
/// let err = require_preference_dataset(&prompts, "--recipe reward").unwrap_err().to_string();
/// assert!(err.contains("`dataset` must be preference pairs"), "{err}");
/// ```
pub fn require_preference_dataset(examples: &[Example], recipe: &str) -> atomrl_core::Result<()> {
    if is_preference_dataset(examples)? {
        return Ok(());
    }
    let expected = format!("preference pairs (`chosen` / `rejected`), which `{recipe}` trains on");
    Err(atomrl_core::Error::value(
        "config",
        "dataset",
        expected,
        "prompts without pairs",
    ))
}

/// Whether a dataset is made of preference pairs (`true`: every example has one) or of
/// prompts (`false`: none has); a mix is refused, naming the first odd example by its prompt
/// (examples are shuffled when split: their index would not find them in the file).
///
/// # Errors
/// [`atomrl_core::Error::Value`] naming `dataset` for a mix.
///
/// ```
/// use atomrl_data::{is_preference_dataset, parse_jsonl};
/// let pairs = parse_jsonl(r#"{"prompt": "q", "chosen": "a", "rejected": "b"}"#, "x")?;
/// assert!(is_preference_dataset(&pairs)?);
/// let mut mixed = pairs.clone();
/// mixed.extend(parse_jsonl(r#"{"prompt": "2+2?", "ground_truth": 4}"#, "y")?);
/// let err = is_preference_dataset(&mixed).unwrap_err().to_string();
/// assert!(err.contains("dataset") && err.contains("2+2?"), "{err}");
/// # Ok::<(), atomrl_core::Error>(())
/// ```
pub fn is_preference_dataset(examples: &[Example]) -> atomrl_core::Result<bool> {
    let pairs = examples.first().is_some_and(|e| e.preference.is_some());
    match examples.iter().find(|e| e.preference.is_some() != pairs) {
        None => Ok(pairs),
        Some(odd) => {
            let (first, has) = if pairs {
                ("a preference pair", "no `chosen` / `rejected`")
            } else {
                ("a prompt", "`chosen` / `rejected`")
            };
            Err(atomrl_core::Error::value(
                "dataset",
                "dataset",
                format!("every row a preference pair or every row a prompt (the first is {first})"),
                format!(
                    "a row with {has}, prompt {:?}",
                    crate::example::short(&odd.prompt.to_string())
                ),
            ))
        }
    }
}

/// Whether a JSON row is a preference row (it has `chosen` or `rejected`).
pub(crate) fn is_preference_row(row: &Map<String, Value>) -> bool {
    row.contains_key("chosen") || row.contains_key("rejected")
}

/// One completion side: a string, or chat messages (one assistant message when the row has a
/// `prompt`; a whole conversation ending with the assistant's when it does not).
enum Side {
    Text(String),
    Messages(Vec<ChatMessage>),
}

/// The prompt and the pair of a preference row; the error is the message of an
/// [`atomrl_core::Error::File`] naming the file and line.
pub(crate) fn preference_from_row(
    row: &Map<String, Value>,
    prompt: Option<Prompt>,
) -> Result<(Prompt, Preference), String> {
    let chosen = side(row, "chosen")?;
    let rejected = side(row, "rejected")?;
    let (prompt, chosen, rejected) = match prompt {
        Some(p) => (
            p,
            completion_text(chosen, "chosen")?,
            completion_text(rejected, "rejected")?,
        ),
        None => implicit_prompt(chosen, rejected)?,
    };
    for (key, text) in [("chosen", &chosen), ("rejected", &rejected)] {
        if text.trim().is_empty() {
            return Err(format!(
                "`{key}` is empty (a preference pair needs two completions)"
            ));
        }
    }
    if chosen == rejected {
        return Err(format!(
            "`chosen` and `rejected` are identical ({:?}): the pair prefers nothing",
            crate::example::short(&chosen)
        ));
    }
    let margin = match row.get("margin").filter(|v| !v.is_null()) {
        None => None,
        Some(Value::Number(n)) => n.as_f64().filter(|m| m.is_finite()),
        Some(v) => return Err(format!("`margin` must be a number, got {v}")),
    };
    Ok((
        prompt,
        Preference {
            chosen,
            rejected,
            margin,
        },
    ))
}

fn side(row: &Map<String, Value>, key: &str) -> Result<Side, String> {
    match row.get(key).filter(|v| !v.is_null()) {
        None => Err(format!(
            "missing field `{key}` (a preference row needs `chosen` and `rejected`)"
        )),
        Some(Value::String(s)) => Ok(Side::Text(s.clone())),
        Some(v @ Value::Array(_)) => Ok(Side::Messages(crate::jsonl::messages(v, key)?)),
        Some(v) => Err(format!(
            "`{key}` must be a string or a list of messages, got {v}"
        )),
    }
}

/// A side of a row with an explicit prompt: its text, or its one assistant message's.
fn completion_text(side: Side, key: &str) -> Result<String, String> {
    match side {
        Side::Text(t) => Ok(t),
        Side::Messages(mut m) => match (m.pop(), m.is_empty()) {
            (Some(last), true) if last.role == "assistant" => Ok(last.content),
            _ => Err(format!(
                "`{key}` must be one assistant message when the row has a `prompt` (the \
                 completion of that prompt)"
            )),
        },
    }
}

/// The prompt shared by two conversations (every message before the last, identical on both
/// sides) and the last (assistant) message of each.
fn implicit_prompt(chosen: Side, rejected: Side) -> Result<(Prompt, String, String), String> {
    let (Side::Messages(mut c), Side::Messages(mut r)) = (chosen, rejected) else {
        return Err(
            "missing field `prompt` (text `chosen` / `rejected` need a `prompt`; only \
             conversations carry their own)"
                .into(),
        );
    };
    let (Some(lc), Some(lr)) = (c.pop(), r.pop()) else {
        return Err("`chosen` and `rejected` must not be empty".into());
    };
    for (key, last) in [("chosen", &lc), ("rejected", &lr)] {
        if last.role != "assistant" {
            return Err(format!(
                "the last message of `{key}` must have role `assistant` (it is the \
                 completion), got role `{}`",
                last.role
            ));
        }
    }
    if c != r {
        return Err(
            "`chosen` and `rejected` must share every message before their last (the \
             implicit prompt)"
                .into(),
        );
    }
    if c.is_empty() {
        return Err("`chosen` has no message before the assistant's answer".into());
    }
    Ok((Prompt::Messages(c), lc.content, lr.content))
}
