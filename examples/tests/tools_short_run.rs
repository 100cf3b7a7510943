//! A short version of `cargo run --release --example grpo_tools` for CI: a few GRPO steps of
//! the embedded tool model with the calculator; the tool metrics and held-out tool use are
//! written, and completions that call the calculator reach it.

#![allow(clippy::unwrap_used)]

use atomrl_trainer::config::load_args;
use atomrl_trainer::logging::{keys, read_metrics};
use atomrl_trainer::run::run_recipe;

#[test]
fn a_few_steps_of_the_embedded_tool_run() {
    let out = std::env::temp_dir().join(format!("atomrl-tools-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let model = concat!(env!("CARGO_MANIFEST_DIR"), "/grpo_tools/model");
    let overrides: Vec<String> = vec![
        format!("model={model:?}"),
        "dataset=\"synthetic\"".into(),
        "eval_dataset=\"synthetic\"".into(),
        "eval_size=16".into(),
        format!("output_dir={:?}", out.display().to_string()),
        "max_steps=6".into(),
        "batch_size=4".into(),
        "num_generations=8".into(),
        "max_completion_length=96".into(),
        "lr=1e-4".into(),
        "save_steps=3".into(),
        "progress=false".into(),
        "threads=1".into(),
        "workers=2".into(),
        "tools=[\"calculator\"]".into(),
        "max_tool_turns=2".into(),
    ];
    let summary = run_recipe(load_args(None, None, &overrides).unwrap()).unwrap();
    assert_eq!(summary.steps, 6);
    let rows = read_metrics(out.join("metrics.jsonl")).unwrap();
    let calls: Vec<f64> = rows
        .iter()
        .filter_map(|r| r.get(keys::TOOLS_CALLS_PER_COMPLETION))
        .collect();
    assert_eq!(calls.len(), 6, "one tools/calls_per_completion per step");
    assert!(
        calls.iter().any(|&c| c > 0.0),
        "the tool model never called the calculator: {calls:?}"
    );
    for key in [keys::TOOLS_ERROR_RATE, keys::TOOLS_MAX_TURNS_FRAC] {
        assert!(rows
            .iter()
            .filter_map(|r| r.get(key))
            .all(|v| (0.0..=1.0).contains(&v)));
    }
    let before = summary.eval_before.unwrap();
    assert!(before.tool_calls.is_some() && before.tool_error_rate.is_some());
    assert!(rows
        .iter()
        .any(|r| r.get(keys::EVAL_TOOLS_CALLS_PER_COMPLETION).is_some()));
    assert!(out.join("checkpoint-6/model.safetensors").is_file());
    let _ = std::fs::remove_dir_all(&out);
}
