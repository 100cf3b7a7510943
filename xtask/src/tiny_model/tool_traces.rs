//! Calculator traces for the SFT of the tool-calling tiny model: a worked solution turned into
//! one `calculator` call, its response and a bare answer.

use std::collections::HashMap;

use atomrl_trainer::data::{Example, SplitMix64};

/// Stream of [`SplitMix64::derive`] that picks the traced rows (the data streams use 1 to 3).
const TOOL_STREAM: u64 = 4;

/// The one expression that computes a worked solution `<think>\na op b=c\n…\n</think>…`: each
/// step's operands that equal an earlier step's result are replaced by that step's expression
/// (in parentheses), so the last step's expression evaluates to the answer. A constant that
/// happens to equal an earlier result is replaced too, which keeps the value. `None` when the
/// text has no step lines.
///
/// ```ignore
/// assert_eq!(expression("<think>\n4*12=48\n60-48=12\n</think>").as_deref(), Some("60-(4*12)"));
/// ```
pub fn expression(worked: &str) -> Option<String> {
    let mut exprs: HashMap<String, String> = HashMap::new();
    let mut last = None;
    for line in worked.lines() {
        let Some((lhs, result)) = line.split_once('=') else {
            continue;
        };
        let Some(pos) = lhs
            .char_indices()
            .skip(1)
            .find(|(_, c)| "+-*/".contains(*c))
            .map(|(i, _)| i)
        else {
            continue;
        };
        let (a, op, b) = (&lhs[..pos], &lhs[pos..=pos], &lhs[pos + 1..]);
        let operand = |x: &str| {
            exprs
                .get(x)
                .map_or_else(|| x.to_string(), |e| format!("({e})"))
        };
        let expr = format!("{}{op}{}", operand(a), operand(b));
        exprs.insert(result.trim().to_string(), expr.clone());
        last = Some(expr);
    }
    last
}

/// The call the model writes, in Qwen2.5's format.
pub fn tool_call(expression: &str) -> String {
    format!(
        "<tool_call>\n{{\"name\": \"calculator\", \"arguments\": {{\"expression\": \"{expression}\"}}}}\n</tool_call>"
    )
}

/// `train` with a seeded `fraction` of its worked completions replaced by a calculator trace:
/// the call, then `tool_turn(result)` (the chat template's tool turn, ending with the next
/// generation prompt), then a bare answer. Examples without steps keep their completion.
pub fn with_tool_traces(
    mut train: Vec<Example>,
    fraction: f64,
    seed: u64,
    mut tool_turn: impl FnMut(&str) -> String,
) -> Vec<Example> {
    let mut rng = SplitMix64::derive(seed, TOOL_STREAM);
    let threshold = (fraction.clamp(0.0, 1.0) * 1e6).round() as u64;
    for e in &mut train {
        if rng.below(1_000_000) >= threshold {
            continue;
        }
        let Some(expr) = e.completion.as_deref().and_then(expression) else {
            continue;
        };
        e.completion = Some(format!(
            "{}{}{}",
            tool_call(&expr),
            tool_turn(&e.ground_truth),
            super::sft_data::bare_completion(&e.ground_truth)
        ));
    }
    train
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use atomrl_tools::ToolSet;
    use atomrl_trainer::data::synthetic_splits;

    #[test]
    fn expressions_compute_the_answers() {
        assert_eq!(
            expression("<think>\n4*12=48\n60-48=12\n</think>").as_deref(),
            Some("60-(4*12)")
        );
        assert_eq!(expression("<think>\n\n</think>"), None);
        let (train, _) = synthetic_splits(500, 10, 9);
        let tools = ToolSet::from_names(&["calculator"]).unwrap();
        for e in &train {
            let expr = expression(e.completion.as_deref().unwrap_or("")).unwrap_or_default();
            let out = tools.run_calls(&tool_call(&expr));
            assert_eq!(out.len(), 1);
            assert_eq!(out[0].output, e.ground_truth, "{expr}");
        }
    }

    #[test]
    fn traces_hold_the_call_the_response_and_the_answer() {
        let (train, _) = synthetic_splits(200, 10, 9);
        let traced = with_tool_traces(train.clone(), 0.5, 9, |r| format!("[{r}]"));
        let n = traced
            .iter()
            .filter(|e| {
                e.completion
                    .as_deref()
                    .is_some_and(|c| c.starts_with("<tool_call>"))
            })
            .count();
        assert!((70..130).contains(&n), "{n}");
        for (t, e) in traced.iter().zip(&train) {
            let c = t.completion.as_deref().unwrap_or("");
            if c.starts_with("<tool_call>") {
                assert!(c.contains(&format!("[{}]", e.ground_truth)));
                assert!(c.ends_with(&super::super::sft_data::bare_completion(&e.ground_truth)));
            }
        }
    }
}
