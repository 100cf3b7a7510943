//! Every reference case in `tests/fixtures/reference/cases/` (verl 0.9.1, TRL 1.16 and
//! transformers 5.23 outputs; see that folder's README) run through the same registry that the
//! `atomrl-fn` binary uses, so the command-line contract and the library agree with upstream.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::Path;

use atomrl_core::golden::{load_cases, run_case};

#[test]
fn all_reference_cases_pass_through_the_atomrl_fn_registry() {
    // With ATOMRL_CBLAS set, the model functions' matmuls run through that CBLAS library: this
    // test then checks the library against the references (docs/performance.md, item 16).
    atomrl_core::cblas::use_library_from_env().expect("ATOMRL_CBLAS");
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/reference/cases");
    let cases = load_cases(&dir).expect("reference index");
    let fns = atomrl_fn::catalog::all();
    let mut per_fn: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    let mut failures = Vec::new();
    for case in &cases {
        let Some(f) = atomrl_fn::catalog::find(&fns, &case.function) else {
            failures.push(format!(
                "{}: function `{}` is not registered",
                case.id, case.function
            ));
            continue;
        };
        let entry = per_fn.entry(f.spec.name).or_default();
        entry.0 += 1;
        match run_case(f, case) {
            Ok(()) => entry.1 += 1,
            Err(e) => failures.push(e),
        }
    }
    for (name, (total, passed)) in &per_fn {
        println!("{name}: {passed}/{total}");
    }
    assert!(
        failures.is_empty(),
        "{} of {} failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}
