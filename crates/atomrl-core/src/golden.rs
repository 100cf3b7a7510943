//! Golden reference cases: loading an `index.json` of cases and checking a registered
//! function against them.
//!
//! The layout is that of `tests/fixtures/reference/cases/` (computed by verl, TRL and
//! transformers): `index.json` lists cases with `function`, `input` and `expected` paths
//! relative to it, `expect_error` and a `tolerance` of `rtol` and `atol`.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

use crate::compare::json_close;
use crate::registry::AtomicFn;
use crate::value::Inputs;

/// One golden case.
#[derive(Debug, Clone)]
pub struct Case {
    /// Case id, e.g. `compute_advantages/0000_random`.
    pub id: String,
    /// The function it exercises.
    pub function: String,
    /// The input object.
    pub input: Value,
    /// The expected output object (or `{"error": ...}`).
    pub expected: Value,
    /// Whether the function must reject the input.
    pub expect_error: bool,
    /// Relative tolerance.
    pub rtol: f64,
    /// Absolute tolerance.
    pub atol: f64,
    /// Folder of the input file (relative paths in inputs resolve against it and its parents).
    pub base_dir: PathBuf,
}

#[derive(Deserialize)]
struct Index {
    cases: Vec<Entry>,
}

#[derive(Deserialize)]
struct Entry {
    id: String,
    function: String,
    input: String,
    expected: String,
    expect_error: bool,
    tolerance: Tolerance,
}

#[derive(Deserialize)]
struct Tolerance {
    rtol: f64,
    atol: f64,
}

/// Loads every case listed in `dir/index.json`.
pub fn load_cases(dir: &Path) -> Result<Vec<Case>, String> {
    let read = |p: &Path| -> Result<Value, String> {
        let text = std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?;
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", p.display()))
    };
    let index: Index = serde_json::from_value(read(&dir.join("index.json"))?)
        .map_err(|e| format!("{}: {e}", dir.join("index.json").display()))?;
    index
        .cases
        .into_iter()
        .map(|e| {
            let input_path = dir.join(&e.input);
            Ok(Case {
                id: e.id,
                function: e.function,
                input: read(&input_path)?,
                expected: read(&dir.join(&e.expected))?,
                expect_error: e.expect_error,
                rtol: e.tolerance.rtol,
                atol: e.tolerance.atol,
                base_dir: input_path
                    .parent()
                    .map(Path::to_path_buf)
                    .unwrap_or_default(),
            })
        })
        .collect()
}

/// Runs `case` through `f`: an error case must be rejected with an error; any other case must
/// give outputs within the case's tolerance. Returns a description of the failure.
pub fn run_case(f: &AtomicFn, case: &Case) -> Result<(), String> {
    let outcome = Inputs::from_json(&f.spec, case.input.clone())
        .map(|i| i.with_base_dir(&case.base_dir))
        .and_then(|i| (f.run)(&i))
        .and_then(|o| o.to_json());
    match (outcome, case.expect_error) {
        (Err(_), true) => Ok(()),
        (Ok(got), true) => Err(format!(
            "{}: expected an error ({}), got {got}",
            case.id, case.expected
        )),
        (Err(e), false) => Err(format!("{}: unexpected error: {e}", case.id)),
        (Ok(got), false) => json_close(&case.expected, &got, case.rtol, case.atol)
            .map_err(|e| format!("{}: {e}", case.id)),
    }
}
