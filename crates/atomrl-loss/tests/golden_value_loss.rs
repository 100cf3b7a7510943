//! `compute_value_loss` against verl 0.9.1's `compute_value_loss` + `agg_loss` (mirrored by
//! `xtask/fixtures/gen_value_loss_cases.py`): token and sequence aggregation, a fully masked
//! row, wide and tight clips, and the inputs rejected.

#![allow(clippy::unwrap_used)]

use std::path::Path;

use atomrl_core::golden::{load_cases, run_case};

#[test]
fn verl_value_loss_cases() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures_value");
    let fns = atomrl_loss::functions();
    let f = fns
        .iter()
        .find(|f| f.spec.name == "compute_value_loss")
        .unwrap();
    let cases = load_cases(&dir).unwrap();
    assert!(cases.len() >= 9, "only {} cases", cases.len());
    let failures: Vec<String> = cases.iter().filter_map(|c| run_case(f, c).err()).collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
