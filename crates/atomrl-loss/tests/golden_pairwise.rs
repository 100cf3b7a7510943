//! `compute_dpo_loss` and `compute_reward_model_loss` against TRL 1.16's `DPOTrainer` and
//! `RewardTrainer` formulas (mirrored in torch by `xtask/fixtures/gen_pairwise_cases.py`):
//! every DPO loss type at two βs, label smoothing where TRL reads it and where it does not,
//! IPO's length normalisation (zero lengths clamped), large margins, margins and centring of
//! the reward model, and the inputs rejected.

#![allow(clippy::unwrap_used)]

use std::path::Path;

use atomrl_core::golden::{load_cases, run_case};

#[test]
fn trl_pairwise_cases() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures_pairwise");
    let cases = load_cases(&dir).unwrap();
    let fns = atomrl_loss::functions();
    let mut failures = Vec::new();
    for name in ["compute_dpo_loss", "compute_reward_model_loss"] {
        let f = fns.iter().find(|f| f.spec.name == name).unwrap();
        let mine: Vec<_> = cases.iter().filter(|c| c.id.starts_with(name)).collect();
        assert!(mine.len() >= 9, "{name}: only {} cases", mine.len());
        failures.extend(mine.iter().filter_map(|c| run_case(f, c).err()));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
