//! `atomrl-train --recipe dpo` end to end on the tiny random Qwen2 fixture: online pairs train
//! with TRL's metrics; a run killed with SIGKILL resumes and ends with the same rows and
//! weights as an uninterrupted one (also with LoRA, whose reference is the base model); DPO's
//! settings are checked with the key named.

#![allow(clippy::unwrap_used)]

mod common;

use common::{comparable, model_dir, temp_dir, train_bin, write_dataset, write_pairs};
use std::path::{Path, PathBuf};

use atomrl_trainer::logging::read_metrics;

fn write_config(dir: &Path, max_steps: usize, extra: &str) -> PathBuf {
    let data = write_dataset(dir);
    let path = dir.join("run.toml");
    let toml = format!(
        "recipe = \"dpo\"\nmodel = {:?}\ndataset = {:?}\noutput_dir = {:?}\nmax_steps = {max_steps}\n\
         batch_size = 4\nnum_generations = 4\nmax_completion_length = 12\neval_size = 4\n\
         lr = 1e-3\nsave_steps = 2\nprogress = false\nworkers = 2\ngradient_accumulation_steps = 2\n\
         [[rewards]]\nname = \"digit\"\n{extra}\n",
        model_dir(),
        data.display().to_string(),
        dir.join("run").display().to_string()
    );
    std::fs::write(&path, toml).unwrap();
    path
}

fn run_ok(cfg: &Path, extra: &[&str]) {
    let out = train_bin()
        .args(["--config", cfg.to_str().unwrap()])
        .args(extra)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn a_killed_dpo_run_resumes_exactly(extra: &str, name: &str, weights: &str) {
    let straight = temp_dir(&format!("{name}-straight"));
    run_ok(&write_config(&straight, 6, extra), &[]);

    let killed = temp_dir(&format!("{name}-killed"));
    let cfg = write_config(&killed, 6, extra);
    let status = train_bin()
        .args(["--config", cfg.to_str().unwrap()])
        .env("ATOMRL_TEST_KILL_AFTER_STEP", "3")
        .status()
        .unwrap();
    assert!(!status.success());
    run_ok(&cfg, &["--resume"]);

    let rows = read_metrics(straight.join("run/metrics.jsonl")).unwrap();
    assert_eq!(
        comparable(&straight.join("run/metrics.jsonl")),
        comparable(&killed.join("run/metrics.jsonl"))
    );
    let trained: Vec<_> = rows
        .iter()
        .filter(|r| r.get("pairs").is_some_and(|p| p > 0.0))
        .collect();
    assert!(trained.len() >= 4, "only {} steps had pairs", trained.len());
    for r in &trained {
        for key in [
            "rewards/chosen",
            "rewards/rejected",
            "rewards/accuracies",
            "rewards/margins",
            "logps/chosen",
            "logps/rejected",
            "loss",
            "grad_norm",
        ] {
            assert!(
                r.get(key).is_some_and(f64::is_finite),
                "{key} at {}",
                r.step
            );
        }
        let margin = r.get("rewards/chosen").unwrap() - r.get("rewards/rejected").unwrap();
        assert!((margin - r.get("rewards/margins").unwrap()).abs() < 1e-6);
    }
    // Step 1's policy is the reference: every implicit reward is 0 and the sigmoid loss is
    // log 2.
    let first = trained.iter().find(|r| r.step == 1).unwrap();
    assert!(first.get("rewards/chosen").unwrap().abs() < 1e-6);
    assert!((first.get("loss").unwrap() - std::f64::consts::LN_2).abs() < 1e-6);
    // Later steps have moved away from it, towards the chosen completions.
    assert!(trained
        .iter()
        .any(|r| r.get("rewards/margins").unwrap() > 0.0));
    let path = |root: &Path| root.join(format!("run/checkpoint-6/{weights}"));
    assert!(
        std::fs::read(path(&straight)).unwrap() == std::fs::read(path(&killed)).unwrap(),
        "{weights} differs after resuming"
    );
}

#[test]
fn a_killed_dpo_run_resumes_with_the_same_rows_and_weights() {
    a_killed_dpo_run_resumes_exactly("", "dpo", "model.safetensors");
}

#[test]
fn a_killed_dpo_run_with_lora_resumes_with_the_same_adapters() {
    a_killed_dpo_run_resumes_exactly(
        "[lora]\nr = 4\nalpha = 8.0",
        "dpo-lora",
        "adapter_model.safetensors",
    );
}

#[test]
fn dpo_losses_train_and_settings_are_checked_with_the_key_named() {
    let dir = temp_dir("dpo-config");
    for loss in ["hinge", "ipo", "robust"] {
        let cfg = write_config(
            &dir,
            2,
            &format!("[dpo]\nloss_type = {loss:?}\nlabel_smoothing = 0.1"),
        );
        run_ok(&cfg, &[]);
        let rows = read_metrics(dir.join("run/metrics.jsonl")).unwrap();
        assert!(
            rows.iter()
                .any(|r| r.get("loss").is_some_and(f64::is_finite)),
            "{loss}"
        );
        std::fs::remove_dir_all(dir.join("run")).unwrap();
    }
    for (extra, needle) in [
        ("[dpo]\nbeta = 0.0", "`dpo.beta`"),
        (
            "[dpo]\nloss_type = \"robust\"\nlabel_smoothing = 0.5",
            "`dpo.label_smoothing`",
        ),
        ("[dpo]\nloss_type = \"kto\"", "kto"),
        ("[dpo]\nbogus = 1", "bogus"),
        ("num_generations = 1", "`num_generations`"),
    ] {
        let cfg = write_config(&dir, 2, "");
        let text = std::fs::read_to_string(&cfg).unwrap();
        // Top-level keys go before the first table.
        let text = match extra.strip_prefix('[') {
            Some(_) => format!("{text}{extra}\n"),
            None => format!("{extra}\n{}", text.replace("num_generations = 4\n", "")),
        };
        std::fs::write(&cfg, text).unwrap();
        let out = train_bin()
            .args(["--config", cfg.to_str().unwrap()])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{extra}: {err}");
        assert!(err.contains(needle), "{extra}: {err}");
    }
}

#[test]
fn offline_pairs_from_a_file_train_with_a_held_out_loss() {
    let dir = temp_dir("dpo-offline");
    let pairs = write_pairs(&dir);
    let cfg = write_config(&dir, 6, "");
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace(
            &format!("{:?}", dir.join("train.jsonl").display().to_string()),
            &format!("{:?}", pairs.display().to_string()),
        )
        .replace(
            "eval_size = 4",
            "eval_size = 8\neval_steps = 3\nnum_iterations = 2",
        );
    std::fs::write(&cfg, text).unwrap();
    run_ok(&cfg, &[]);
    let rows = read_metrics(dir.join("run/metrics.jsonl")).unwrap();
    let trained: Vec<_> = rows
        .iter()
        .filter(|r| r.step > 0 && r.get("pairs").is_some())
        .collect();
    assert_eq!(trained.len(), 6);
    assert!(trained.iter().all(|r| r.get("pairs") == Some(4.0)));
    assert!(trained
        .iter()
        .all(|r| r.get("loss").is_some_and(f64::is_finite)));
    // The loss of the 8 held-out pairs starts at log 2 (the policy is the reference) and falls.
    let eval: Vec<f64> = rows.iter().filter_map(|r| r.get("eval/loss")).collect();
    assert!(eval.len() >= 2, "{eval:?}");
    assert!((eval[0] - std::f64::consts::LN_2).abs() < 1e-6, "{eval:?}");
    let steps: Vec<_> = trained
        .iter()
        .map(|r| (r.get("loss").unwrap(), r.get("rewards/accuracies").unwrap()))
        .collect();
    assert!(eval.last().unwrap() < &eval[0], "{eval:?} {steps:?}");

    // A dataset of pairs and prompts together is refused, naming the odd row by its prompt.
    let mixed = dir.join("mixed.jsonl");
    let mut text = std::fs::read_to_string(&pairs).unwrap();
    text.push_str("\n{\"prompt\": \"What is 1 plus 1?\", \"ground_truth\": \"2\"}\n");
    std::fs::write(&mixed, text).unwrap();
    let out = train_bin()
        .args(["--config", cfg.to_str().unwrap()])
        .args([
            "--set",
            &format!("dataset={:?}", mixed.display().to_string()),
        ])
        .args(["--set", "eval_size=0"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("What is 1 plus 1?") && err.contains("`dataset`"),
        "{err}"
    );

    // A bad pair names the file and line.
    let bad = dir.join("bad.jsonl");
    std::fs::write(&bad, "{\"prompt\": \"q\", \"chosen\": \"a\", \"rejected\": \"b\"}\n{\"prompt\": \"q\", \"chosen\": \"a\", \"rejected\": \"a\"}\n").unwrap();
    let out = train_bin()
        .args(["--config", cfg.to_str().unwrap()])
        .args(["--set", &format!("dataset={:?}", bad.display().to_string())])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("bad.jsonl:2") && err.contains("identical"),
        "{err}"
    );
}
