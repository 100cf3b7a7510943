//! A short version of `cargo run --release --example grpo_gsm8k` for CI: 20 GRPO steps of the
//! embedded model on synthetic problems; metrics and a checkpoint are written and the reward
//! is finite and moves.

#![allow(clippy::unwrap_used)]

use atomrl_trainer::config::load_args;
use atomrl_trainer::logging::{keys, read_metrics};
use atomrl_trainer::run::run_recipe;

#[test]
fn twenty_steps_of_the_embedded_run() {
    let out = std::env::temp_dir().join(format!("atomrl-embedded-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let model = concat!(env!("CARGO_MANIFEST_DIR"), "/grpo_gsm8k/model");
    let overrides: Vec<String> = vec![
        format!("model={model:?}"),
        "dataset=\"synthetic\"".into(),
        "eval_dataset=\"synthetic\"".into(),
        "eval_size=32".into(),
        format!("output_dir={:?}", out.display().to_string()),
        "max_steps=20".into(),
        "batch_size=4".into(),
        "num_generations=8".into(),
        "max_completion_length=48".into(),
        "lr=1e-4".into(),
        "save_steps=10".into(),
        "progress=false".into(),
        "threads=1".into(),
        // The example's default: rollouts, evaluation and micro-batches on two workers.
        "workers=2".into(),
    ];
    let summary = run_recipe(load_args(None, None, &overrides).unwrap()).unwrap();
    assert_eq!(summary.steps, 20);
    let rows = read_metrics(out.join("metrics.jsonl")).unwrap();
    let rewards: Vec<f64> = rows
        .iter()
        .filter_map(|r| r.get(keys::REWARD_MEAN))
        .collect();
    assert_eq!(rewards.len(), 20);
    assert!(rewards.iter().all(|r| r.is_finite()), "{rewards:?}");
    assert!(
        rewards.iter().any(|r| *r != rewards[0]),
        "reward never moved: {rewards:?}"
    );
    assert!(
        rows.iter()
            .any(|r| r.get(keys::GRAD_NORM).is_some_and(|g| g > 0.0)),
        "no update had a gradient"
    );
    assert!(out.join("checkpoint-20/model.safetensors").is_file());
    assert!(summary.eval_before.is_some() && summary.eval_after.is_some());
    let _ = std::fs::remove_dir_all(&out);
}

/// A short `cargo run --release --example ppo_gsm8k`: 10 PPO steps with the critic; its
/// values move toward the returns and it is checkpointed.
#[test]
fn ten_ppo_steps_of_the_embedded_run() {
    let out = std::env::temp_dir().join(format!("atomrl-embedded-ppo-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let model = concat!(env!("CARGO_MANIFEST_DIR"), "/grpo_gsm8k/model");
    let overrides: Vec<String> = vec![
        "recipe=\"ppo\"".into(),
        format!("model={model:?}"),
        "dataset=\"synthetic\"".into(),
        "eval_size=0".into(),
        format!("output_dir={:?}", out.display().to_string()),
        "max_steps=10".into(),
        "batch_size=4".into(),
        "num_generations=8".into(),
        "num_iterations=1".into(),
        "max_completion_length=48".into(),
        "lr=1e-4".into(),
        "critic.lr=1e-4".into(),
        "critic.lam=1.0".into(),
        "progress=false".into(),
        "threads=1".into(),
        "workers=2".into(),
    ];
    let summary = run_recipe(load_args(None, None, &overrides).unwrap()).unwrap();
    assert_eq!(summary.steps, 10);
    let rows = read_metrics(out.join("metrics.jsonl")).unwrap();
    let losses: Vec<f64> = rows
        .iter()
        .filter_map(|r| r.get(keys::CRITIC_VALUE_LOSS))
        .collect();
    assert_eq!(losses.len(), 10);
    assert!(losses.iter().all(|l| l.is_finite()), "{losses:?}");
    // A fresh head predicts 0; trained, the values come closer to the returns.
    let gap: Vec<(f64, f64)> = rows
        .iter()
        .filter_map(|r| {
            Some((
                r.get(keys::CRITIC_VALUES_MEAN)?,
                r.get(keys::CRITIC_RETURNS_MEAN)?,
            ))
        })
        .collect();
    assert_eq!(gap[0].0, 0.0, "{gap:?}");
    let late = gap[7..].iter().map(|(v, r)| (v - r).abs()).sum::<f64>() / 3.0;
    assert!(
        late < (gap[0].1).abs(),
        "the values did not move toward the returns: {gap:?}"
    );
    assert!(out.join("checkpoint-10/critic/model.safetensors").is_file());
    let _ = std::fs::remove_dir_all(&out);
}

/// A short `cargo run --release --example dpo_gsm8k`: 40 online DPO steps of 4 optimizer
/// steps each on the step's pairs, every DPO metric finite. The metrics are those of the last
/// pass: at step 1, after 3 updates on its pairs, the policy ranks every chosen completion above
/// its rejected one (TRL's `rewards/accuracies` and `rewards/margins`, 0 for the reference
/// itself, which step 1 starts from).
#[test]
fn forty_dpo_steps_of_the_embedded_run() {
    let out = std::env::temp_dir().join(format!("atomrl-embedded-dpo-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let model = concat!(env!("CARGO_MANIFEST_DIR"), "/grpo_gsm8k/model");
    let overrides: Vec<String> = vec![
        "recipe=\"dpo\"".into(),
        format!("model={model:?}"),
        "dataset=\"synthetic\"".into(),
        "eval_size=0".into(),
        format!("output_dir={:?}", out.display().to_string()),
        "max_steps=40".into(),
        "batch_size=8".into(),
        "num_generations=8".into(),
        "max_completion_length=48".into(),
        "lr=2e-4".into(),
        "num_iterations=4".into(),
        "progress=false".into(),
        "threads=1".into(),
        "workers=2".into(),
        "save_steps=40".into(),
    ];
    let summary = run_recipe(load_args(None, None, &overrides).unwrap()).unwrap();
    assert_eq!(summary.steps, 40);
    let rows = read_metrics(out.join("metrics.jsonl")).unwrap();
    let trained: Vec<_> = rows
        .iter()
        .filter(|r| r.get(keys::DPO_PAIRS).is_some_and(|p| p > 0.0))
        .collect();
    assert!(trained.len() >= 30, "{} steps with pairs", trained.len());
    for r in &trained {
        for key in [
            keys::DPO_REWARDS_CHOSEN,
            keys::DPO_REWARDS_REJECTED,
            keys::DPO_REWARDS_ACCURACIES,
            keys::DPO_REWARDS_MARGINS,
            keys::DPO_LOGPS_CHOSEN,
            keys::DPO_LOGPS_REJECTED,
            keys::LOSS,
        ] {
            assert!(
                r.get(key).is_some_and(f64::is_finite),
                "{key} at step {}",
                r.step
            );
        }
    }
    let first = trained.iter().find(|r| r.step == 1).unwrap();
    assert_eq!(first.get(keys::DPO_REWARDS_ACCURACIES), Some(1.0));
    assert!(first.get(keys::DPO_REWARDS_MARGINS).unwrap() > 0.0);
    assert!(first.get(keys::LOSS).unwrap() < std::f64::consts::LN_2);
    assert!(out.join("checkpoint-40/model.safetensors").is_file());
    let _ = std::fs::remove_dir_all(&out);
}

/// A short `cargo run --release --example rlhf_gsm8k`: the embedded model's own pairs (right
/// answers preferred to wrong ones), a reward model trained on them that ranks its training
/// pairs better than chance, and GRPO steps against that reward model alone.
#[test]
fn a_short_rlhf_pipeline_on_the_embedded_model() {
    let out = std::env::temp_dir().join(format!("atomrl-embedded-rlhf-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let model = concat!(env!("CARGO_MANIFEST_DIR"), "/grpo_gsm8k/model");
    let base: Vec<String> = vec![
        format!("model={model:?}"),
        "dataset=\"synthetic\"".into(),
        "max_completion_length=48".into(),
        "progress=false".into(),
        "threads=1".into(),
        "workers=2".into(),
    ];
    let mut o = base.clone();
    o.extend([
        "rewards=[{name=\"correctness\"}]".into(),
        "eval_size=40".into(),
    ]);
    let args = load_args(None, Some(atomrl_trainer::Recipe::Grpo), &o).unwrap();
    let (train, eval) = atomrl_trainer::run::sample_own_pairs(args, 200, 40, 2).unwrap();
    assert!(
        train.len() >= 30 && !eval.is_empty(),
        "{} / {}",
        train.len(),
        eval.len()
    );
    assert!(train.iter().all(|e| e
        .preference
        .as_ref()
        .is_some_and(|p| p.chosen != p.rejected)));
    std::fs::create_dir_all(&out).unwrap();
    let pairs = out.join("pairs.jsonl");
    atomrl_trainer::data::write_jsonl(&pairs, &train).unwrap();

    let mut o = base.clone();
    o.extend([
        format!("dataset={:?}", pairs.display().to_string()),
        format!("eval_dataset={:?}", pairs.display().to_string()),
        "eval_size=32".into(),
        format!("output_dir={:?}", out.join("rm").display().to_string()),
        "batch_size=16".into(),
        "lr=1e-4".into(),
        "max_steps=40".into(),
        "save_steps=40".into(),
    ]);
    let rm =
        run_recipe(load_args(None, Some(atomrl_trainer::Recipe::Reward), &o).unwrap()).unwrap();
    let accuracy = rm
        .eval_after
        .as_ref()
        .and_then(|r| r.pair_accuracy)
        .unwrap();
    assert!(accuracy > 0.5, "pair accuracy {accuracy}");
    let rm_dir = rm.checkpoint.unwrap().join("reward_model");

    let mut o = base;
    o.extend([
        "eval_size=0".into(),
        format!("output_dir={:?}", out.join("grpo").display().to_string()),
        "max_steps=3".into(),
        "batch_size=4".into(),
        "beta=0.1".into(),
        format!(
            "rewards=[{{name=\"model\", path={:?}}}]",
            rm_dir.display().to_string()
        ),
    ]);
    let rl = run_recipe(load_args(None, Some(atomrl_trainer::Recipe::Grpo), &o).unwrap()).unwrap();
    assert_eq!(rl.steps, 3);
    let rows = read_metrics(out.join("grpo/metrics.jsonl")).unwrap();
    assert!(rows
        .iter()
        .filter_map(|r| r.get("reward/model/mean"))
        .all(f64::is_finite));
    let _ = std::fs::remove_dir_all(&out);
}
