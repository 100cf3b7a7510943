//! Golden cases computed by upstream reference implementations, run through this crate's
//! `atomrl-fn` registry (`functions()` → `run_json`).
//!
//! The cases live in `tests/fixtures/reference/cases` (see its README and `index.json`) and were
//! computed with verl 0.9.1, `verl/trainer/ppo/core_algos.py`:
//! - `compute_policy_loss` ← `compute_policy_loss_vanilla(old_log_prob, log_prob, advantages,
//!   response_mask, loss_agg_mode, config)` followed by `agg_loss` (log-ratio clamped to ±20,
//!   dual clip only with `clip_ratio_c`, `seq-mean-*` dividing by N), outputs `pg_loss`,
//!   `pg_clipfrac`, `ppo_kl`, `pg_clipfrac_lower`;
//! - `compute_kl_penalty` ← `kl_penalty(logprob, ref_logprob, kl_penalty)` with
//!   `kl`/`mse`/`low_var_kl` for k1/k2/k3, masked, and its masked token mean;
//!
//! with TRL 1.16's `GRPOTrainer._compute_loss` formulas cross-checked against verl. The
//! generator for cases of this kind is `xtask/fixtures/gen_loss_cases.py`.
//! `expect_error` cases must be rejected with an error.

use std::path::PathBuf;

use atomrl_core::compare::json_close;
use serde_json::Value;

fn cases_dir() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/fixtures/reference/cases"
    ))
}

fn read_json(path: &PathBuf) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Runs every case of `function`; returns how many ran.
fn run_cases(function: &str) -> usize {
    let dir = cases_dir();
    let index = read_json(&dir.join("index.json"));
    let registry = atomrl_loss::functions();
    let f = registry
        .iter()
        .find(|f| f.spec.name == function)
        .unwrap_or_else(|| panic!("{function} is not registered"));
    let mut failures = Vec::new();
    let mut count = 0;
    for case in index["cases"].as_array().expect("cases array") {
        if case["function"] != function {
            continue;
        }
        count += 1;
        let id = case["id"].as_str().expect("id");
        let input = read_json(&dir.join(case["input"].as_str().expect("input path")));
        let result = f.run_json(input);
        if case["expect_error"].as_bool().unwrap_or(false) {
            if let Ok(out) = result {
                failures.push(format!(
                    "{id}: expected an error, got {:?}",
                    out.to_json().ok()
                ));
            }
            continue;
        }
        let expected = read_json(&dir.join(case["expected"].as_str().expect("expected path")));
        // The issue asks for 1e-5 relative; index.json allows 1e-4. Use the stricter of the two.
        let rtol = case["tolerance"]["rtol"].as_f64().unwrap_or(1e-5).min(1e-5);
        let atol = case["tolerance"]["atol"].as_f64().unwrap_or(1e-5);
        match result.and_then(|o| o.to_json()) {
            Err(e) => failures.push(format!("{id}: {e}")),
            Ok(got) => {
                if let Err(e) = json_close(&expected, &got, rtol, atol) {
                    failures.push(format!("{id}: {e}"));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {count} cases failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
    count
}

#[test]
fn compute_policy_loss_matches_verl() {
    assert_eq!(run_cases("compute_policy_loss"), 40);
}

#[test]
fn compute_kl_penalty_matches_verl() {
    assert_eq!(run_cases("compute_kl_penalty"), 21);
}

#[test]
fn rejections_name_the_argument() {
    let dir = cases_dir();
    let registry = atomrl_loss::functions();
    let policy = registry
        .iter()
        .find(|f| f.spec.name == "compute_policy_loss")
        .expect("registered");
    let input = read_json(&dir.join("compute_policy_loss/0039_error-unknown_loss_agg.input.json"));
    let e = policy.run_json(input).unwrap_err().to_string();
    assert!(
        e.starts_with("compute_policy_loss: `loss_agg` must be one of"),
        "{e}"
    );
    let input = read_json(&dir.join("compute_policy_loss/0012_error-all_tokens_masked.input.json"));
    let e = policy.run_json(input).unwrap_err().to_string();
    assert!(e.contains("`mask` must be at least one 1"), "{e}");
    let kl = registry
        .iter()
        .find(|f| f.spec.name == "compute_kl_penalty")
        .expect("registered");
    let input = read_json(&dir.join("compute_kl_penalty/0020_error-unknown_estimator.input.json"));
    let e = kl.run_json(input).unwrap_err().to_string();
    assert!(
        e.contains("`estimator` must be one of k1, k2, k3, abs"),
        "{e}"
    );
}
