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

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

use atomrl_core::golden::{load_cases, run_case};
use serde_json::Value;

fn cases_dir() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/fixtures/reference/cases"
    ))
}

fn generated_dir() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/generated"
    ))
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Runs every case of `function` in `dir`; returns how many ran.
fn run_cases(dir: &Path, function: &str) -> usize {
    let registry = atomrl_loss::functions();
    let f = registry
        .iter()
        .find(|f| f.spec.name == function)
        .unwrap_or_else(|| panic!("{function} is not registered"));
    let cases: Vec<_> = load_cases(dir)
        .unwrap_or_else(|e| panic!("{e}"))
        .into_iter()
        .filter(|c| c.function == function)
        .map(|mut c| {
            // The issue asks for 1e-5 relative; index.json allows 1e-4. Use the stricter.
            c.rtol = c.rtol.min(1e-5);
            c
        })
        .collect();
    let failures: Vec<String> = cases.iter().filter_map(|c| run_case(f, c).err()).collect();
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    cases.len()
}

#[test]
fn compute_policy_loss_matches_verl() {
    assert_eq!(run_cases(&cases_dir(), "compute_policy_loss"), 40);
}

#[test]
fn compute_kl_penalty_matches_verl() {
    assert_eq!(run_cases(&cases_dir(), "compute_kl_penalty"), 21);
}

/// Cases written by `xtask/fixtures/gen_loss_cases.py` (verl 0.9.1 called directly, TRL 1.16's
/// formulas and the float64 mirror agreeing within 1e-8): every aggregation mode with and
/// without clip-higher and dual clip, fully masked rows, log-ratios beyond ±20.
#[test]
fn generated_cases_match_verl_and_trl() {
    let policy = run_cases(&generated_dir(), "compute_policy_loss");
    let kl = run_cases(&generated_dir(), "compute_kl_penalty");
    assert!(policy >= 12 && kl >= 4, "{policy} policy and {kl} KL cases");
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

/// `compute_sft_loss` against PyTorch's `cross_entropy(..., ignore_index=-100)`, cases made by
/// `xtask/fixtures/gen_sft_cases.py`.
#[test]
fn compute_sft_loss_matches_torch_cross_entropy() {
    let dir = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/sft"));
    assert_eq!(run_cases(&dir, "compute_sft_loss"), 7);
}
