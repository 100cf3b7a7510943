//! The configurations shipped in `examples/configs/` load and validate with the configuration
//! loader, point at the model shipped in the repository (paths relative to the repository
//! root), and each runs a step with `atomrl-train` started from the repository root.

#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};

use atomrl_trainer::config::{build_rewards, load_args, Recipe};
use common::{temp_dir, train_bin};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

const CONFIGS: [(&str, Recipe, bool); 6] = [
    ("tiny.toml", Recipe::Grpo, false),
    ("ppo.toml", Recipe::Ppo, false),
    ("dpo.toml", Recipe::Dpo, false),
    ("dapo.toml", Recipe::Dapo, false),
    ("sft.toml", Recipe::Sft, false),
    ("lora.toml", Recipe::Grpo, true),
];

#[test]
fn every_shipped_configuration_loads_and_validates() {
    let dir = repo_root().join("examples/configs");
    let mut shipped: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".toml"))
        // Sweep files are not run configurations: atomrl-sweep's tests load them.
        .filter(|n| !n.starts_with("sweep"))
        .collect();
    shipped.sort();
    let mut tested: Vec<String> = CONFIGS.iter().map(|(n, _, _)| n.to_string()).collect();
    tested.sort();
    assert_eq!(shipped, tested, "every shipped configuration is tested");
    for (name, recipe, lora) in CONFIGS {
        let args =
            load_args(Some(&dir.join(name)), None, &[]).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(args.recipe, recipe, "{name}");
        assert_eq!(args.lora.is_some(), lora, "{name}");
        assert!(
            repo_root().join(&args.model).join("config.json").is_file(),
            "{name}: model `{}` relative to the repository root",
            args.model
        );
        if recipe != Recipe::Sft {
            build_rewards(&args).unwrap_or_else(|e| panic!("{name}: rewards: {e}"));
        }
    }
}

#[test]
fn every_shipped_configuration_runs_a_step() {
    let tmp = temp_dir("example-configs");
    for (name, _, _) in CONFIGS {
        let out = tmp.join(name.trim_end_matches(".toml"));
        let run = train_bin()
            .current_dir(repo_root())
            .args(["--config", &format!("examples/configs/{name}")])
            .args(["--set", "max_steps=1", "--set", "eval_size=2"])
            .args(["--set", "progress=false"])
            .args([
                "--set",
                &format!("output_dir={:?}", out.display().to_string()),
            ])
            .output()
            .unwrap();
        assert!(
            run.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&run.stderr)
        );
        assert!(out.join("metrics.jsonl").is_file(), "{name}");
        assert!(out.join("checkpoint-1").is_dir(), "{name}");
    }
}
