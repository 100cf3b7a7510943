//! The SFT recipe end to end on the tiny Qwen2 fixture and synthetic word problems: the
//! held-out loss falls, the checkpoint is a valid `model` for GRPO and for inference, and a
//! killed SFT run resumes exactly.

#![allow(clippy::unwrap_used)]

mod common;

use common::{infer_bin, model_dir, temp_dir, train_bin};
use std::path::{Path, PathBuf};

use atomrl_trainer::data::{synthetic_splits, write_jsonl};
use atomrl_trainer::logging::read_metrics;

fn sft_config(dir: &Path, steps: usize) -> PathBuf {
    let (train, eval) = synthetic_splits(256, 16, 7);
    write_jsonl(&dir.join("train.jsonl"), &train).unwrap();
    write_jsonl(&dir.join("eval.jsonl"), &eval).unwrap();
    let cfg = dir.join("sft.toml");
    std::fs::write(
        &cfg,
        format!(
            "recipe = \"sft\"\nmodel = {:?}\ndataset = {:?}\neval_dataset = {:?}\noutput_dir = {:?}\nmax_steps = {steps}\n\
             batch_size = 16\nlr = 3e-3\nmax_completion_length = 48\nsave_steps = 5\neval_steps = 0\nprogress = false\n",
            model_dir(),
            dir.join("train.jsonl").display().to_string(),
            dir.join("eval.jsonl").display().to_string(),
            dir.join("sft").display().to_string(),
        ),
    )
    .unwrap();
    cfg
}

#[test]
fn sft_lowers_the_held_out_loss_and_its_checkpoint_starts_grpo() {
    let dir = temp_dir("sft");
    let cfg = sft_config(&dir, 15);
    let out = train_bin()
        .args(["--config", cfg.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows = read_metrics(dir.join("sft/metrics.jsonl")).unwrap();
    let before = rows.first().and_then(|r| r.get("eval/loss")).unwrap();
    let after = rows.last().and_then(|r| r.get("eval/loss")).unwrap();
    assert!(after < before * 0.8, "held-out loss {before} -> {after}");
    for key in ["loss", "lr", "grad_norm", "tokens_per_s", "eval/accuracy"] {
        assert!(rows.iter().any(|r| r.get(key).is_some()), "missing {key}");
    }
    let ckpt = dir.join("sft/checkpoint-15");
    assert!(ckpt.join("model.safetensors").is_file());

    // The SFT checkpoint is the model of a GRPO run ...
    let grpo = train_bin()
        .args(["--config", cfg.to_str().unwrap(), "--recipe", "grpo"])
        .args(["--set", &format!("model={:?}", ckpt.display().to_string())])
        .args([
            "--set",
            &format!("output_dir={:?}", dir.join("grpo").display().to_string()),
        ])
        .args([
            "--set",
            "max_steps=2",
            "--set",
            "num_generations=4",
            "--set",
            "batch_size=2",
            "--set",
            "lr=1e-5",
        ])
        .output()
        .unwrap();
    assert!(
        grpo.status.success(),
        "{}",
        String::from_utf8_lossy(&grpo.stderr)
    );
    assert!(dir.join("grpo/checkpoint-2/model.safetensors").is_file());
    // ... and answers questions.
    let infer = infer_bin()
        .args([
            "--checkpoint",
            ckpt.to_str().unwrap(),
            "--max-new-tokens",
            "8",
            "Tom has 3 apples. How many?",
        ])
        .output()
        .unwrap();
    assert!(
        infer.status.success(),
        "{}",
        String::from_utf8_lossy(&infer.stderr)
    );
    let eval_file = dir.join("eval.jsonl");
    let batch = infer_bin()
        .args([
            "--checkpoint",
            ckpt.to_str().unwrap(),
            "--max-new-tokens",
            "8",
            "--file",
            eval_file.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(batch.status.success() && String::from_utf8_lossy(&batch.stderr).contains("accuracy"));
}

#[test]
fn a_killed_sft_run_resumes_exactly() {
    let straight = temp_dir("sft-straight");
    let cfg = sft_config(&straight, 8);
    assert!(train_bin()
        .args(["--config", cfg.to_str().unwrap()])
        .status()
        .unwrap()
        .success());
    let killed = temp_dir("sft-killed");
    let cfg = sft_config(&killed, 8);
    let status = train_bin()
        .args(["--config", cfg.to_str().unwrap()])
        .env("ATOMRL_TEST_KILL_AFTER_STEP", "7")
        .status()
        .unwrap();
    assert!(!status.success());
    assert!(train_bin()
        .args(["--config", cfg.to_str().unwrap(), "--resume"])
        .status()
        .unwrap()
        .success());
    let losses = |d: &Path| -> Vec<(u64, Option<f64>, Option<f64>)> {
        read_metrics(d.join("sft/metrics.jsonl"))
            .unwrap()
            .iter()
            .map(|r| (r.step, r.get("loss"), r.get("grad_norm")))
            .collect()
    };
    assert_eq!(losses(&straight), losses(&killed));
}
