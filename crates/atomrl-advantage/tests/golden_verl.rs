//! Golden tests against verl 0.9.1 (`verl/trainer/ppo/core_algos.py`:
//! `compute_grpo_outcome_advantage` with and without `norm_adv_by_std_in_grpo`,
//! `compute_rloo_outcome_advantage`) on the reference cases in
//! `tests/fixtures/reference/cases/compute_advantages/` (random rewards, flat groups, G = 2,
//! one group, large magnitudes, and the inputs verl rejects), plus the cases made by
//! `xtask/fixtures/gen_advantage_cases.py` for the `batch` (TRL 1.16) and `reinforce_pp`
//! (verl 0.9.1) modes.
//!
//! The reference in PyTorch (verl 0.9.1, outcome rewards):
//! ```python
//! scores = token_level_rewards.sum(dim=-1)
//! mean, std = torch.mean(group), torch.std(group)          # unbiased
//! scores = (scores - mean) / (std + epsilon)               # grpo
//! scores = scores * G / (G - 1) - mean * G / (G - 1)       # rloo
//! ```

#![allow(clippy::unwrap_used)]

use std::path::Path;

use atomrl_core::golden::{load_cases, run_case};

fn check_dir(dir: &Path, min_cases: usize) {
    let fns = atomrl_advantage::functions();
    let cases: Vec<_> = load_cases(dir)
        .unwrap()
        .into_iter()
        .filter(|c| c.function == "compute_advantages")
        .collect();
    assert!(
        cases.len() >= min_cases,
        "only {} cases in {}",
        cases.len(),
        dir.display()
    );
    let f = fns
        .iter()
        .find(|f| f.spec.name == "compute_advantages")
        .unwrap();
    let failures: Vec<String> = cases.iter().filter_map(|c| run_case(f, c).err()).collect();
    assert!(
        failures.is_empty(),
        "{} of {} failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn verl_reference_cases() {
    check_dir(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/reference/cases"),
        49,
    );
}

#[test]
fn generated_batch_and_reinforce_pp_cases() {
    check_dir(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures"),
        8,
    );
}

/// `compute_gae` against verl 0.9.1's `compute_gae_advantage_return` + `masked_whiten`
/// (mirrored by `xtask/fixtures/gen_gae_cases.py`): outcome and per-token rewards, tool
/// observations masked inside rows, γ and λ at their bounds, unwhitened, and the inputs
/// rejected.
#[test]
fn verl_gae_cases() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures_gae");
    let fns = atomrl_advantage::functions();
    let f = fns.iter().find(|f| f.spec.name == "compute_gae").unwrap();
    let cases = load_cases(&dir).unwrap();
    assert!(cases.len() >= 13, "only {} cases", cases.len());
    let failures: Vec<String> = cases.iter().filter_map(|c| run_case(f, c).err()).collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
