//! End-to-end behaviour of the tool set, the calculator and tool-call parsing.

use std::time::{Duration, Instant};

use atomrl_tools::{
    parse_tool_calls, BigRational, Calculator, Tool, ToolCall, ToolError, ToolLimits, ToolSet,
};
use proptest::prelude::*;
use serde_json::{json, Map, Value};

fn call_text(name: &str, arguments: Value) -> String {
    format!(
        "<tool_call>\n{}\n</tool_call>",
        json!({"name": name, "arguments": arguments})
    )
}

fn calculator_set() -> ToolSet {
    match ToolSet::from_names(&["calculator"]) {
        Ok(set) => set,
        Err(e) => panic!("{e}"),
    }
}

/// A tool whose behaviour is chosen by its `mode`.
struct Custom {
    name: &'static str,
    mode: Mode,
}

#[derive(Clone, Copy)]
enum Mode {
    Sleep(Duration),
    Panic,
    Long(usize),
}

impl Tool for Custom {
    fn name(&self) -> &str {
        self.name
    }
    fn description(&self) -> &str {
        "A test tool."
    }
    fn parameters(&self) -> Value {
        json!({"type": "object", "properties": {}, "required": []})
    }
    fn call(&self, _arguments: &Map<String, Value>) -> Result<String, ToolError> {
        match self.mode {
            Mode::Sleep(d) => {
                std::thread::sleep(d);
                Ok("slept".into())
            }
            Mode::Panic => panic!("tool exploded"),
            Mode::Long(n) => Ok("é".repeat(n)),
        }
    }
}

#[test]
fn tool_set_is_shareable_across_threads() {
    fn assert_traits<T: Send + Sync + Clone + Default + std::fmt::Debug>() {}
    assert_traits::<ToolSet>();
    let tools = calculator_set();
    let handle = std::thread::spawn(move || {
        tools.run_calls(&call_text("calculator", json!({"expression": "6*7"})))
    });
    let out = handle.join().map_err(|_| "thread panicked");
    assert_eq!(out.map(|o| o[0].output.clone()), Ok("42".to_string()));
}

#[test]
fn successful_call() {
    let out = calculator_set().run_calls(&call_text("calculator", json!({"expression": "1/3*3"})));
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].output, "1");
    assert_eq!(out[0].name.as_deref(), Some("calculator"));
    assert_eq!(out[0].error, None);
    assert!(!out[0].is_error());
    assert_eq!(
        out[0].raw,
        "{\"name\":\"calculator\",\"arguments\":{\"expression\":\"1/3*3\"}}"
    );
}

#[test]
fn every_failure_is_an_error_outcome() {
    let tools = calculator_set();
    let text = [
        "<tool_call>{\"name\": \"calculator\", \"arguments\": {\"expression\": }</tool_call>"
            .to_string(),
        call_text("search", json!({"query": "x"})),
        call_text("calculator", json!({"expr": "1"})),
        call_text("calculator", json!({"expression": true})),
        call_text("calculator", json!({"expression": "1/0"})),
        "<tool_call>{\"name\": \"calculator\", \"arguments\": [1]}</tool_call>".to_string(),
        "<tool_call>{\"name\": \"calculator\"".to_string(),
    ]
    .join("\nthen\n");
    let outcomes = tools.run_calls(&text);
    assert_eq!(outcomes.len(), 7);
    for o in &outcomes {
        assert!(o.is_error(), "{o:?}");
        assert!(o.output.starts_with("error: "), "{o:?}");
        let error = o.error.as_ref().map(|e| format!("error: {e}"));
        assert_eq!(error.as_deref(), Some(o.output.as_str()));
    }
    assert!(matches!(
        outcomes[0].error,
        Some(ToolError::MalformedCall { .. })
    ));
    assert!(outcomes[0]
        .output
        .starts_with("error: malformed tool call: invalid JSON"));
    assert_eq!(
        outcomes[1].output,
        "error: unknown tool `search`; known tools: calculator"
    );
    assert_eq!(outcomes[1].name.as_deref(), Some("search"));
    assert_eq!(
        outcomes[2].output,
        "error: calculator: invalid arguments: unexpected argument `expr`; expected only `expression`"
    );
    assert_eq!(
        outcomes[3].output,
        "error: calculator: invalid arguments: `expression` must be a string"
    );
    assert_eq!(outcomes[4].output, "error: calculator: division by zero");
    assert_eq!(
        outcomes[4].error,
        Some(ToolError::Failed {
            tool: "calculator".into(),
            reason: "division by zero".into()
        })
    );
    // The JSON parsed, so the outcome still names the tool.
    assert_eq!(outcomes[5].name.as_deref(), Some("calculator"));
    assert_eq!(
        outcomes[6].output,
        "error: malformed tool call: unterminated <tool_call>"
    );
    assert_eq!(outcomes[6].raw, "{\"name\": \"calculator\"");
}

#[test]
fn string_arguments_are_accepted() {
    let text = "<tool_call>{\"name\": \"calculator\", \"arguments\": \"{\\\"expression\\\": \\\"2^10\\\"}\"}</tool_call>";
    let out = calculator_set().run_calls(text);
    assert_eq!(out[0].output, "1024");
}

#[test]
fn slow_tool_times_out_quickly() {
    let tools = ToolSet::new()
        .with(Custom {
            name: "slow",
            mode: Mode::Sleep(Duration::from_secs(5)),
        })
        .with_limits(ToolLimits {
            timeout: Duration::from_millis(100),
            ..ToolLimits::default()
        });
    let start = Instant::now();
    let out = tools.run_calls(&call_text("slow", json!({})));
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(
        out[0].error,
        Some(ToolError::Timeout {
            tool: "slow".into(),
            limit_ms: 100
        })
    );
    assert_eq!(out[0].output, "error: slow: timed out after 100 ms");
}

#[test]
fn panicking_tool_fails() {
    let tools = ToolSet::new().with(Custom {
        name: "boom",
        mode: Mode::Panic,
    });
    let out = tools.run_calls(&call_text("boom", json!({})));
    assert_eq!(
        out[0].error,
        Some(ToolError::Failed {
            tool: "boom".into(),
            reason: "panicked: tool exploded".into()
        })
    );
    assert_eq!(out[0].output, "error: boom: panicked: tool exploded");
}

#[test]
fn output_is_truncated() {
    let tools = ToolSet::new()
        .with(Custom {
            name: "long",
            mode: Mode::Long(5000),
        })
        .with(Calculator)
        .with_limits(ToolLimits {
            max_output_chars: 10,
            ..ToolLimits::default()
        });
    let out = tools.run_calls(&call_text("long", json!({})));
    assert_eq!(out[0].output, format!("{}…[truncated]", "é".repeat(10)));
    assert!(!out[0].is_error());
    let out = tools.run_calls(&call_text("calculator", json!({"expression": "2^64"})));
    assert_eq!(out[0].output, "1844674407…[truncated]");
    assert_eq!(tools.names(), ["long", "calculator"]);
    let out = ToolSet::new()
        .with(Custom {
            name: "long",
            mode: Mode::Long(1000),
        })
        .run_calls(&call_text("long", json!({})));
    assert_eq!(out[0].output.chars().count(), 1000);
}

#[test]
fn schemas_follow_the_openai_format() {
    let schemas = calculator_set().schemas();
    assert_eq!(schemas.len(), 1);
    assert_eq!(
        schemas[0],
        json!({
            "type": "function",
            "function": {
                "name": "calculator",
                "description": Calculator.description(),
                "parameters": Calculator.parameters(),
            }
        })
    );
}

#[test]
fn builtins() {
    assert_eq!(ToolSet::builtin_names(), ["calculator"]);
    assert_eq!(
        ToolSet::from_names(&["calculator", "calculator"]).map(|s| s.len()),
        Ok(1)
    );
    assert!(ToolSet::from_names::<&str>(&[]).map(|s| s.is_empty()) == Ok(true));
    assert_eq!(
        ToolSet::from_names(&[String::from("web")]).map(|s| s.len()),
        Err(ToolError::UnknownTool {
            name: "web".into(),
            known: "calculator".into()
        })
    );
}

#[test]
fn calculator_refuses_huge_work_fast() {
    let start = Instant::now();
    for expression in [
        "2^100000",
        "9^9^9^9",
        "(99999999999999999999)^100",
        "1/3^100^100",
    ] {
        assert!(Calculator.evaluate(expression).is_err(), "{expression}");
    }
    assert!(start.elapsed() < Duration::from_secs(1));
}

fn rational(n: i128, d: i128) -> BigRational {
    BigRational::new(n.into(), d.into())
}

proptest! {
    #[test]
    fn calculator_matches_i128(a in -1_000_000i64..1_000_000, b in -1_000_000i64..1_000_000, op in 0usize..4) {
        let symbol = ["+", "-", "*", "/"][op];
        let expression = format!("({a}) {symbol} ({b})");
        let (a, b) = (i128::from(a), i128::from(b));
        let got = Calculator.evaluate(&expression);
        match op {
            0 => prop_assert_eq!(got, Ok(rational(a + b, 1))),
            1 => prop_assert_eq!(got, Ok(rational(a - b, 1))),
            2 => prop_assert_eq!(got, Ok(rational(a * b, 1))),
            _ if b == 0 => prop_assert_eq!(
                got.map_err(|e| e.to_string()),
                Err("calculator: division by zero".to_string())
            ),
            _ => prop_assert_eq!(got, Ok(rational(a, b))),
        }
    }

    #[test]
    fn calculator_powers_match_i128(a in -30i64..30, e in 0u32..12) {
        let got = Calculator.evaluate(&format!("({a})^{e}"));
        prop_assert_eq!(got, Ok(rational(i128::from(a).pow(e), 1)));
        let neg = Calculator.evaluate(&format!("-{}^{e}", a.abs()));
        prop_assert_eq!(neg, Ok(rational(-i128::from(a.abs()).pow(e), 1)));
    }

    #[test]
    fn formatted_values_evaluate_back(n in -10_000i64..10_000, d in 1i64..10_000) {
        let value = rational(i128::from(n), i128::from(d));
        let text = Calculator::format(&value);
        prop_assert!(!text.contains('e'));
        let back = Calculator.evaluate(&format!("({text})"));
        prop_assert_eq!(back, Ok(value));
    }

    #[test]
    fn random_text_never_panics(s in "[0-9+\\-*/^(). ×÷−a-z,]{0,260}") {
        let start = Instant::now();
        let _ = Calculator.evaluate(&s);
        prop_assert!(start.elapsed() < Duration::from_secs(1));
    }

    #[test]
    fn random_unicode_never_panics(s in "\\PC{0,300}") {
        let _ = Calculator.evaluate(&s);
        let _ = parse_tool_calls(&s);
        let _ = calculator_set().run_calls(&format!("<tool_call>{s}</tool_call>"));
    }

    #[test]
    fn operator_soup_is_bounded(s in "[0-9^*()\\-]{0,200}") {
        let start = Instant::now();
        let _ = Calculator.evaluate(&s);
        prop_assert!(start.elapsed() < Duration::from_secs(1));
    }

    #[test]
    fn tool_calls_round_trip(name in "[a-z_]{1,12}", key in "[a-z]{1,8}", value in "\\PC{0,40}", n in -1000i64..1000) {
        let mut arguments = Map::new();
        arguments.insert(key, Value::String(value));
        arguments.insert("n".into(), json!(n));
        let call = ToolCall::new(name, arguments);
        let text = format!("prefix {} middle {} suffix", call.render(), call.render());
        let parsed = parse_tool_calls(&text);
        prop_assert_eq!(parsed.len(), 2);
        for (_, p) in parsed {
            prop_assert_eq!(p, Ok(call.clone()));
        }
    }
}
