//! The sweep file of `cargo run --release --example sweep_gsm8k` loads and passes every check
//! (its base, `examples/configs/tiny.toml`, and every searched key), from the repository root
//! as the example runs.

#![allow(clippy::unwrap_used)]

use atomrl_sweep::sampler::SamplerKind;
use atomrl_sweep::SweepConfig;

#[test]
fn the_example_sweep_file_loads_and_checks() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    // The run keys' relative paths (model, output_dir) are relative to the repository root.
    std::env::set_current_dir(&root).unwrap();
    let cfg = SweepConfig::load(std::path::Path::new("examples/configs/sweep.toml")).unwrap();
    assert_eq!(cfg.sampler.kind, SamplerKind::Tpe);
    let keys: Vec<&str> = cfg.search.iter().map(|p| p.key.as_str()).collect();
    assert_eq!(keys, ["lr", "temperature"]);
    assert!(cfg.baseline);
    // The baseline trial runs the hand-tuned values of the embedded example.
    let base: Vec<toml::Value> = cfg
        .base_values()
        .unwrap()
        .into_iter()
        .map(|(_, v)| v)
        .collect();
    assert_eq!(base, [toml::Value::Float(2e-4), toml::Value::Float(1.0)]);
    let args = cfg.trial_args(&[], std::path::Path::new("runs/x")).unwrap();
    assert!(
        root.join(&args.model).join("config.json").is_file(),
        "{}",
        args.model
    );
}
