//! The `model_dir` argument of registered functions that load a model.

use std::path::PathBuf;

use atomrl_core::{Inputs, Result};

/// Resolves the `model_dir` input of an `atomrl-fn` function: as given, against the input
/// file's folder and its parents, and finally against the repository this crate was built from
/// (so that worked examples naming a fixture model are found from any working directory of a
/// source checkout); a value that is no folder but a hub id `org/name[@revision]` is taken
/// from the hub cache, or downloaded with the `hub` feature (`atomrl_hub::model_dir`).
///
/// # Errors
/// [`atomrl_core::Error::Value`] naming `model_dir` when no such folder exists and the value is
/// not a hub id; the hub resolver's errors for a hub id.
///
/// ```
/// use atomrl_core::{ArgSpec, FnSpec, Inputs};
/// const SPEC: FnSpec = FnSpec {
///     name: "f", crate_name: "doc", summary: "", formula: "",
///     inputs: &[ArgSpec::path("model_dir", "a model folder")], outputs: &[],
///     example_input: "{}", example_output: "{}",
/// };
/// let i = Inputs::from_json(&SPEC, serde_json::json!({"model_dir": "tests/fixtures/reference/models/tiny-qwen2"}))?;
/// assert!(atomrl_model::model_dir_arg(&i)?.join("config.json").is_file());
/// # Ok::<(), atomrl_core::Error>(())
/// ```
pub fn model_dir_arg(inputs: &Inputs) -> Result<PathBuf> {
    match inputs.path("model_dir") {
        Ok(p) => Ok(p),
        Err(e) => {
            let raw = inputs.opt_str("model_dir")?.unwrap_or_default();
            let repo = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")).join(raw);
            if !raw.is_empty() && PathBuf::from(raw).is_relative() && repo.is_dir() {
                Ok(repo)
            } else if atomrl_hub::RepoSpec::parse(raw).is_ok_and(|s| s.id.contains('/')) {
                atomrl_hub::model_dir(raw)
            } else {
                Err(e)
            }
        }
    }
}
