//! Golden tests of `overlong_penalty` against verl 0.9.1, `verl/workers/reward_manager/dapo.py`
//! (DAPO's soft overlong punishment), on the reference cases in
//! `tests/fixtures/reference/cases/overlong_penalty/` (random lengths, the buffer boundaries,
//! `buffer_len == max_len`, `penalty_factor = 0`, the DAPO paper's 20480/4096 setting, and the
//! inputs that must be rejected), plus TRL's variant (`get_soft_overlong_punishment`).
//!
//! The mirrored code (verl 0.9.1):
//! ```python
//! overlong_buffer_len = self.overlong_buffer_cfg.len
//! expected_len = self.max_resp_len - overlong_buffer_len
//! exceed_len = valid_response_length - expected_len
//! overlong_penalty_factor = self.overlong_buffer_cfg.penalty_factor
//! overlong_reward = min(-exceed_len / overlong_buffer_len * overlong_penalty_factor, 0)
//! ```
//! and TRL 1.16:
//! ```python
//! if completion_length <= max_completion_len - soft_punish_cache: reward = 0.0
//! elif completion_length <= max_completion_len:
//!     reward = (max_completion_len - soft_punish_cache - completion_length) / soft_punish_cache
//! else: reward = -1.0
//! ```

#![allow(clippy::unwrap_used)]

use std::path::Path;

use atomrl_core::compare::json_close;
use serde_json::{json, Value};

const CASES: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../tests/fixtures/reference/cases"
);

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn overlong_fn() -> atomrl_core::AtomicFn {
    atomrl_reward::functions()
        .into_iter()
        .find(|f| f.spec.name == "overlong_penalty")
        .unwrap()
}

#[test]
fn verl_reference_cases() {
    let dir = Path::new(CASES);
    let index = read_json(&dir.join("index.json"));
    let f = overlong_fn();
    let mut checked = 0;
    let mut failures = Vec::new();
    for case in index["cases"].as_array().unwrap() {
        if case["function"] != "overlong_penalty" {
            continue;
        }
        checked += 1;
        let id = case["id"].as_str().unwrap();
        let input = read_json(&dir.join(case["input"].as_str().unwrap()));
        let expected = read_json(&dir.join(case["expected"].as_str().unwrap()));
        let rtol = case["tolerance"]["rtol"].as_f64().unwrap();
        let atol = case["tolerance"]["atol"].as_f64().unwrap();
        let result = f.run_json(input);
        if case["expect_error"].as_bool().unwrap() {
            if let Ok(out) = result {
                failures.push(format!("{id}: expected an error, got {:?}", out.to_json()));
            }
            continue;
        }
        match result.map(|o| o.to_json().unwrap()) {
            Ok(got) => {
                if let Err(e) = json_close(&expected, &got, rtol, atol) {
                    failures.push(format!("{id}: {e}"));
                }
            }
            Err(e) => failures.push(format!("{id}: unexpected error: {e}")),
        }
    }
    assert_eq!(checked, 13, "expected the 13 overlong_penalty cases");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// verl's formula, written out in f64, on a grid of settings.
#[test]
fn matches_verl_formula_on_a_grid() {
    let f = overlong_fn();
    for (max_len, buffer_len, factor) in [
        (16usize, 4usize, 1.0f64),
        (100, 1, 0.5),
        (100, 100, 2.0),
        (4096, 1024, 1.0),
    ] {
        let lengths: Vec<usize> = (0..=max_len)
            .step_by((max_len / 37).max(1))
            .chain([max_len])
            .collect();
        let want: Vec<f64> = lengths
            .iter()
            .map(|&l| {
                let exceed = l as f64 - (max_len - buffer_len) as f64;
                (-exceed / buffer_len as f64 * factor).min(0.0)
            })
            .collect();
        let out = f
            .run_json(json!({"lengths": lengths, "max_len": max_len, "buffer_len": buffer_len, "penalty_factor": factor}))
            .unwrap()
            .to_json()
            .unwrap();
        let expected = json!({"penalty": {"shape": [lengths.len()], "data": want}});
        json_close(&expected, &out, 1e-6, 1e-6).unwrap();
    }
}

/// TRL's variant: identical inside the buffer, -1 beyond `max_len`.
#[test]
fn matches_trl_formula() {
    let f = overlong_fn();
    let (max_len, cache) = (20usize, 5usize);
    let lengths: Vec<usize> = (0..=30).collect();
    let want: Vec<f64> = lengths
        .iter()
        .map(|&l| {
            if l <= max_len - cache {
                0.0
            } else if l <= max_len {
                (max_len as f64 - cache as f64 - l as f64) / cache as f64
            } else {
                -1.0
            }
        })
        .collect();
    let out = f
        .run_json(
            json!({"lengths": lengths, "max_len": max_len, "buffer_len": cache, "variant": "trl"}),
        )
        .unwrap()
        .to_json()
        .unwrap();
    json_close(
        &json!({"penalty": {"shape": [31], "data": want}}),
        &out,
        1e-6,
        1e-6,
    )
    .unwrap();
    // verl rejects the same input.
    let e = f
        .run_json(json!({"lengths": [21], "max_len": 20, "buffer_len": 5}))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("lengths[0]") && e.contains("max_len = 20"),
        "{e}"
    );
}
