//! `atomrl-train --recipe reward` end to end on the tiny random Qwen2 fixture: a reward model
//! learns to rank held-out pairs, is saved as a sequence classifier that loads back with the
//! same scores, resumes exactly after SIGKILL, and refuses data without pairs.

#![allow(clippy::unwrap_used)]

mod common;

use common::{comparable, model_dir, temp_dir, train_bin, write_dataset, write_pairs};
use std::path::{Path, PathBuf};

use atomrl_model::{HeadLayout, ValueModel};
use atomrl_trainer::logging::read_metrics;

fn write_config(dir: &Path, max_steps: usize, extra: &str) -> PathBuf {
    let data = write_pairs(dir);
    let path = dir.join("run.toml");
    let toml = format!(
        "recipe = \"reward\"\nmodel = {:?}\ndataset = {:?}\noutput_dir = {:?}\nmax_steps = {max_steps}\n\
         batch_size = 4\nmax_completion_length = 12\neval_size = 8\neval_steps = 4\n\
         lr = 1e-3\nsave_steps = 4\nprogress = false\nworkers = 2\ngradient_accumulation_steps = 2\n{extra}\n",
        model_dir(),
        data.display().to_string(),
        dir.join("run").display().to_string()
    );
    std::fs::write(&path, toml).unwrap();
    path
}

fn run(cfg: &Path, extra: &[&str]) -> std::process::Output {
    train_bin()
        .args(["--config", cfg.to_str().unwrap()])
        .args(extra)
        .output()
        .unwrap()
}

fn run_ok(cfg: &Path, extra: &[&str]) -> String {
    let out = run(cfg, extra);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_reward_model_learns_the_pairs_and_saves_as_a_sequence_classifier() {
    let dir = temp_dir("reward");
    let stdout = run_ok(&write_config(&dir, 12, ""), &[]);
    assert!(stdout.contains("held-out pair accuracy"), "{stdout}");
    assert!(
        stdout.contains("rewards = [{ name = \"model\", path = "),
        "{stdout}"
    );
    let rows = read_metrics(dir.join("run/metrics.jsonl")).unwrap();
    let eval: Vec<f64> = rows
        .iter()
        .filter_map(|r| r.get("eval/pair_accuracy"))
        .collect();
    let losses: Vec<f64> = rows.iter().filter_map(|r| r.get("eval/loss")).collect();
    // A zero head scores every completion 0: no pair is ranked right, the loss is log 2.
    assert_eq!(eval[0], 0.0);
    assert!(
        (losses[0] - std::f64::consts::LN_2).abs() < 1e-6,
        "{losses:?}"
    );
    assert!(*eval.last().unwrap() >= 0.75, "{eval:?}");
    assert!(losses.last().unwrap() < &losses[0], "{losses:?}");
    // The zero head's scores do not spread; the trained head's do.
    let spread: Vec<f64> = rows
        .iter()
        .filter_map(|r| r.get("eval/score_std"))
        .collect();
    assert_eq!(spread.len(), eval.len(), "{spread:?}");
    assert_eq!(spread[0], 0.0);
    assert!(*spread.last().unwrap() > 0.0, "{spread:?}");
    for r in rows
        .iter()
        .filter(|r| r.step > 0 && r.get("pairs").is_some())
    {
        for key in [
            "rewards/chosen",
            "rewards/rejected",
            "rewards/accuracies",
            "rewards/margins",
            "loss",
            "grad_norm",
        ] {
            assert!(
                r.get(key).is_some_and(f64::is_finite),
                "{key} at {}",
                r.step
            );
        }
    }
    // The folder transformers loads as AutoModelForSequenceClassification.
    let rm = dir.join("run/checkpoint-12/reward_model");
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(rm.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["architectures"][0], "Qwen2ForSequenceClassification");
    assert_eq!(config["num_labels"], 1);
    assert!(config["pad_token_id"].is_u64());
    let model = ValueModel::from_hf_dir(&rm, &candle_core::Device::Cpu).unwrap();
    assert_eq!(model.layout(), HeadLayout::Sequence);
}

#[test]
fn a_killed_reward_model_run_resumes_exactly() {
    let straight = temp_dir("reward-straight");
    run_ok(&write_config(&straight, 8, ""), &[]);
    let killed = temp_dir("reward-killed");
    let cfg = write_config(&killed, 8, "");
    let status = train_bin()
        .args(["--config", cfg.to_str().unwrap()])
        .env("ATOMRL_TEST_KILL_AFTER_STEP", "6")
        .status()
        .unwrap();
    assert!(!status.success());
    run_ok(&cfg, &["--resume"]);
    assert_eq!(
        comparable(&straight.join("run/metrics.jsonl")),
        comparable(&killed.join("run/metrics.jsonl"))
    );
    for file in ["model.safetensors", "optimizer.safetensors"] {
        let path = |root: &Path| root.join(format!("run/checkpoint-8/reward_model/{file}"));
        assert!(
            std::fs::read(path(&straight)).unwrap() == std::fs::read(path(&killed)).unwrap(),
            "{file} differs after resuming"
        );
    }
}

#[test]
fn reward_model_settings_and_data_are_checked() {
    let dir = temp_dir("reward-errors");
    let prompts = write_dataset(&dir);
    let cfg = write_config(&dir, 2, "");
    // Refused before any work: no opening evaluation of a reward model on plain prompts.
    let out = run(
        &cfg,
        &[
            "--set",
            &format!("dataset={:?}", prompts.display().to_string()),
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("`dataset`") && err.contains("preference pairs"),
        "{err}"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!stdout.contains("step 0"), "{stdout}");
    let out = run(
        &cfg,
        &["--set", "reward_model.center_rewards_coefficient=-1"],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("`reward_model.center_rewards_coefficient`"),
        "{err}"
    );
    for (n, want) in [("0", ">= 1"), ("99", "in 1..=")] {
        let out = run(&cfg, &["--set", &format!("reward_model.num_layers={n}")]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success()
                && err.contains("`reward_model.num_layers`")
                && err.contains(want),
            "{n}: {err}"
        );
    }
    // A reward model of the policy's first layer trains and saves with one layer.
    run_ok(&cfg, &["--set", "reward_model.num_layers=1"]);
    let rm = dir.join("run/checkpoint-2/reward_model");
    let model = ValueModel::from_hf_dir(&rm, &candle_core::Device::Cpu).unwrap();
    assert_eq!(
        (model.backbone().config().num_hidden_layers, model.layout()),
        (1, HeadLayout::Sequence)
    );
    std::fs::remove_dir_all(dir.join("run")).unwrap();
    // With the centring term and LoRA, it trains.
    run_ok(
        &cfg,
        &[
            "--set",
            "reward_model.center_rewards_coefficient=0.01",
            "--set",
            "lora={r=4, alpha=8.0}",
        ],
    );
}

/// The trained reward model as a reward function (`rewards = [{name = "model", path = …}]`):
/// it scores a completion as the reward recipe scored the same pair row, ranks the held-out
/// pairs' sides as training taught it, and a GRPO run optimises it alone.
#[test]
fn a_trained_reward_model_is_a_reward_function_for_rl() {
    use atomrl_reward::{RewardContext, RewardFn};
    let dir = temp_dir("reward-rl");
    run_ok(&write_config(&dir, 12, ""), &[]);
    let rm_dir = dir.join("run/checkpoint-12/reward_model");
    let tok = atomrl_sample::ChatTokenizer::from_hf_dir(model_dir()).unwrap();
    let device = candle_core::Device::Cpu;
    let reward = atomrl_trainer::rollout::ModelReward::load(&rm_dir, tok.clone(), &device).unwrap();
    let encoder = atomrl_trainer::rollout::PromptEncoder {
        chat_template: true,
        system_prompt: None,
        max_prompt_length: 512,
        tool_schemas: Vec::new(),
    };
    let rows = atomrl_trainer::data::parse_jsonl(
        r#"{"prompt": "What is 9 plus 9?", "chosen": "18", "rejected": "I do not know."}"#,
        "inline",
    )
    .unwrap();
    let prompt = encoder.encode(&tok, &rows[0]).unwrap();
    let ctx = RewardContext::new().with_prompts([prompt.text.clone(), prompt.text]);
    let scores: Vec<f32> = reward
        .score(&["18".into(), "I do not know.".into()], &ctx)
        .unwrap()
        .to_vec1()
        .unwrap();
    let model = ValueModel::from_hf_dir(&rm_dir, &device).unwrap();
    let exp = encoder
        .encode_pairs(&tok, &[&rows[0]], 12, &device)
        .unwrap();
    let want: Vec<f32> = model
        .sequence_scores(&exp.input_ids, &exp.attention_mask)
        .unwrap()
        .to_vec1()
        .unwrap();
    for (a, b) in scores.iter().zip(&want) {
        assert!((a - b).abs() < 1e-5, "{scores:?} vs {want:?}");
    }
    assert!(scores[0] > scores[1], "{scores:?}");

    // GRPO against the reward model alone.
    let rl = dir.join("rl");
    std::fs::create_dir_all(&rl).unwrap();
    let data = write_dataset(&rl);
    let cfg = rl.join("run.toml");
    std::fs::write(
        &cfg,
        format!(
            "model = {:?}\ndataset = {:?}\noutput_dir = {:?}\nmax_steps = 2\nbatch_size = 2\n\
             num_generations = 4\nmax_completion_length = 8\neval_size = 0\nprogress = false\n\
             rewards = [{{ name = \"model\", path = {:?} }}]\n",
            model_dir(),
            data.display().to_string(),
            rl.join("run").display().to_string(),
            rm_dir.display().to_string()
        ),
    )
    .unwrap();
    run_ok(&cfg, &[]);
    let rows = read_metrics(rl.join("run/metrics.jsonl")).unwrap();
    let means: Vec<f64> = rows
        .iter()
        .filter_map(|r| r.get("reward/model/mean"))
        .collect();
    assert_eq!(means.len(), 2);
    assert!(
        means.iter().all(|m| m.is_finite() && *m != 0.0),
        "{means:?}"
    );
    // A `model` entry needs its `path`.
    let err = run(&cfg, &["--set", "rewards=[{name=\"model\"}]"]);
    assert!(String::from_utf8_lossy(&err.stderr).contains("rewards[0].path"));
}
