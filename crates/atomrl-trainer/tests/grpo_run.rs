//! End-to-end runs of the GRPO / DAPO trainer on the tiny random Qwen2 fixture: metrics keys,
//! TensorBoard events, charts, checkpoints; exact resume; the NaN guard;
//! gradient accumulation equal to one big batch; DAPO dynamic-sampling refill.

#![allow(clippy::unwrap_used)]

mod common;

use common::{model_dir, temp_dir, write_dataset};
use std::path::Path;

use atomrl_model::CausalLm;
use atomrl_reward::{FnReward, WeightedRewards};
use atomrl_sample::ChatTokenizer;
use atomrl_trainer::config::{load_args, GRPOArgs, Recipe};
use atomrl_trainer::data::{Example, Prompt};
use atomrl_trainer::logging::read_metrics;
use atomrl_trainer::Trainer;
use candle_core::{DType, Device};

fn args(dir: &Path, extra: &[&str]) -> GRPOArgs {
    let data = write_dataset(dir);
    let mut o: Vec<String> = vec![
        format!("model={:?}", model_dir()),
        format!("dataset={:?}", data.display().to_string()),
        format!("output_dir={:?}", dir.join("run").display().to_string()),
        "max_steps=4".into(),
        "batch_size=2".into(),
        "num_generations=4".into(),
        "max_completion_length=12".into(),
        "eval_size=4".into(),
        "lr=1e-3".into(),
        "save_steps=2".into(),
        "logging_steps=2".into(),
        "progress=false".into(),
    ];
    o.extend(extra.iter().map(|s| s.to_string()));
    load_args(None, None, &o).unwrap()
}

/// A reward with spread on a random model: the share of vowels in the completion.
fn vowel_rewards() -> WeightedRewards {
    let vowels = FnReward::new("vowels", |c: &str, _ctx, _row| {
        let n = c.chars().count().max(1) as f32;
        c.chars().filter(|ch| "aeiou".contains(*ch)).count() as f32 / n
    });
    WeightedRewards::new().with(vowels, 1.0).unwrap()
}

fn trainer(a: GRPOArgs, rewards: WeightedRewards) -> Trainer {
    let model = CausalLm::from_hf_dir(model_dir(), DType::F32, &Device::Cpu).unwrap();
    let tok = ChatTokenizer::from_hf_dir(model_dir()).unwrap();
    Trainer::new(a, model, tok, rewards).unwrap()
}

#[test]
fn a_tiny_run_writes_metrics_events_charts_and_checkpoints() {
    let dir = temp_dir("grpo-run");
    let summary = trainer(args(&dir, &[]), vowel_rewards()).train().unwrap();
    assert_eq!(summary.steps, 4);
    let run = dir.join("run");
    let rows = read_metrics(run.join("metrics.jsonl")).unwrap();
    assert_eq!(
        rows.iter().map(|r| r.step).collect::<Vec<_>>(),
        vec![0, 1, 2, 3, 4]
    );
    for key in [
        "reward/mean",
        "reward/std",
        "reward/vowels/mean",
        "accuracy",
        "completion_length/mean",
        "completion_length/max",
        "truncated_frac",
        "zero_std_groups_frac",
        "dropped_groups",
        "kl",
        "entropy",
        "clip_frac/low",
        "clip_frac/high",
        "ppo_kl",
        "loss",
        "grad_norm",
        "lr",
        "skipped_step",
        "time/step_s",
        "time/generate_s",
        "time/train_s",
        "throughput/completions_per_s",
        "throughput/tokens_per_s",
    ] {
        assert!(
            rows[1].values.iter().any(|(k, _)| k == key),
            "missing {key}"
        );
    }
    assert!(rows[0].get("eval/accuracy").is_some() && rows[4].get("eval/accuracy").is_some());
    let rewards: Vec<f64> = rows[1..]
        .iter()
        .map(|r| r.get("reward/mean").unwrap())
        .collect();
    assert!(
        rewards.iter().all(|r| r.is_finite()) && rewards.iter().any(|r| *r != rewards[0]),
        "{rewards:?}"
    );
    assert!(
        rows[1..].iter().all(|r| r.get("grad_norm").unwrap() > 0.0),
        "vowel reward has spread: gradients flow"
    );
    assert!(std::fs::read_dir(run.join("tensorboard")).unwrap().count() >= 1);
    assert!(run.join("charts/reward.png").is_file());
    for ckpt in ["checkpoint-2", "checkpoint-4"] {
        for f in [
            "config.json",
            "model.safetensors",
            "tokenizer.json",
            "optimizer.safetensors",
            "trainer_state.json",
        ] {
            assert!(run.join(ckpt).join(f).is_file(), "{ckpt}/{f}");
        }
    }
    // The checkpoint is a model folder again.
    CausalLm::from_hf_dir(run.join("checkpoint-4"), DType::F32, &Device::Cpu).unwrap();
}

/// A NaN in one step's experience (its loss mask poisoned through the experience hook, so that
/// the step's log-prob sums are not finite, as a numerical blow-up makes them) skips that
/// step's update, says so, and the run goes on.
#[test]
fn injected_nan_skips_the_step_and_the_run_goes_on() {
    let dir = temp_dir("grpo-nan");
    let t = trainer(
        args(&dir, &["save_steps=0", "eval_size=0"]),
        vowel_rewards(),
    )
    .with_experience_hook(Box::new(|step, exp| {
        if step == 2 {
            exp.loss_mask = (&exp.loss_mask * f64::NAN).unwrap();
        }
        Ok(())
    }));
    let mut t = t;
    let summary = t.train().unwrap();
    assert_eq!((summary.steps, summary.skipped_steps), (4, 1));
    let rows = read_metrics(dir.join("run/metrics.jsonl")).unwrap();
    let skipped: Vec<f64> = rows
        .iter()
        .map(|r| r.get("skipped_step").unwrap())
        .collect();
    assert_eq!(skipped, vec![0.0, 1.0, 0.0, 0.0]);
}

#[test]
fn dynamic_sampling_drops_flat_groups_and_refills() {
    let dir = temp_dir("grpo-dapo");
    // Prompts with an even first number get a flat reward (no signal); the rest get spread.
    let picky = FnReward::new(
        "picky",
        |c: &str, ctx: &atomrl_reward::RewardContext, row| {
            let prompt = &ctx.prompts.as_ref().unwrap()[row];
            let first: u32 = prompt
                .split("What is ")
                .nth(1)
                .and_then(|s| s.split(' ').next())
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            if first % 2 == 0 {
                0.5
            } else {
                (c.len() % 3) as f32
            }
        },
    );
    let a = args(&dir, &["max_steps=3", "save_steps=0", "eval_size=0"]);
    let mut a = GRPOArgs {
        dynamic_sampling: true,
        max_num_gen_batches: 4,
        ..a
    };
    a.recipe = Recipe::Dapo;
    trainer(a, WeightedRewards::new().with(picky, 1.0).unwrap())
        .train()
        .unwrap();
    let rows = read_metrics(dir.join("run/metrics.jsonl")).unwrap();
    let dropped: f64 = rows.iter().map(|r| r.get("dropped_groups").unwrap()).sum();
    let rounds: f64 = rows
        .iter()
        .map(|r| r.get("generation_rounds").unwrap())
        .sum();
    assert!(
        dropped > 0.0 && rounds > 3.0,
        "dropped {dropped}, rounds {rounds}"
    );
}

/// Two data-parallel workers: the run trains (every step has a gradient), the same command
/// gives the same rows, and the sharded greedy evaluation scores what one worker scores.
#[test]
fn data_parallel_workers_train_deterministically() {
    use atomrl_trainer::rollout::{evaluate, EvalData, PromptEncoder};
    let rows_of = |name: &str| {
        let dir = temp_dir(name);
        let a = args(&dir, &["workers=2", "save_steps=0"]);
        let summary = trainer(a, vowel_rewards()).train().unwrap();
        assert_eq!(summary.steps, 4);
        let rows = read_metrics(dir.join("run/metrics.jsonl")).unwrap();
        assert!(rows[1..].iter().all(|r| r.get("grad_norm").unwrap() > 0.0));
        rows.iter()
            .map(|r| {
                ["reward/mean", "loss", "grad_norm", "eval/accuracy"]
                    .map(|k| r.get(k).map(f64::to_bits))
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(rows_of("grpo-workers-a"), rows_of("grpo-workers-b"));

    let model = CausalLm::from_hf_dir(model_dir(), DType::F32, &Device::Cpu).unwrap();
    let tok = ChatTokenizer::from_hf_dir(model_dir()).unwrap();
    let encoder = PromptEncoder {
        chat_template: true,
        system_prompt: None,
        max_prompt_length: 64,
        tool_schemas: Vec::new(),
    };
    let examples: Vec<Example> = (0..7)
        .map(|i| Example {
            prompt: Prompt::Text(format!("What is {i} plus 2?")),
            ground_truth: format!("{}", i + 2),
            completion: None,
            preference: None,
        })
        .collect();
    let accuracy = atomrl_reward::Accuracy::default();
    let data = EvalData {
        model: &model,
        tokenizer: &tok,
        encoder: &encoder,
        examples: &examples,
        max_new_tokens: 8,
        tools: None,
        accuracy: &accuracy,
    };
    let one = evaluate(&data, 1, &atomrl_dist::SingleProcess).unwrap();
    let three = evaluate(&data, 3, &atomrl_dist::SingleProcess).unwrap();
    assert_eq!(
        (one.accuracy, one.format_rate, one.mean_length, one.count),
        (
            three.accuracy,
            three.format_rate,
            three.mean_length,
            three.count
        )
    );
}

/// With β > 0 the reference is a frozen copy of the policy the caller passed, not a reload of
/// `args.model`: a policy changed in memory (one weight scaled) has a KL of exactly 0 to it at
/// step 1, and the KL grows once the policy moves.
#[test]
fn the_reference_is_the_given_policy_not_a_reload() {
    let dir = temp_dir("grpo-reference");
    let a = args(
        &dir,
        &["beta=0.1", "max_steps=2", "save_steps=0", "eval_size=0"],
    );
    let model = CausalLm::from_hf_dir(model_dir(), DType::F32, &Device::Cpu).unwrap();
    let name = "model.layers.0.mlp.down_proj.weight";
    let (_, var) = model
        .named_vars()
        .into_iter()
        .find(|(n, _)| n == name)
        .unwrap();
    var.set(&(var.as_tensor() * 3.0).unwrap()).unwrap();
    let tok = ChatTokenizer::from_hf_dir(model_dir()).unwrap();
    let mut t = Trainer::new(a, model, tok, vowel_rewards()).unwrap();
    t.train().unwrap();
    let rows = read_metrics(dir.join("run").join("metrics.jsonl")).unwrap();
    let kl = |step: u64| {
        rows.iter()
            .find(|r| r.step == step)
            .and_then(|r| r.get("kl"))
            .unwrap()
    };
    assert_eq!(
        kl(1),
        0.0,
        "the reference equals the policy before the first update"
    );
    assert!(kl(2) > 0.0, "the reference stays frozen: {}", kl(2));
}

/// What counts as correct comes from `[accuracy]`, for the training `accuracy` metric and the
/// held-out evaluation alike: every completion scores at least 0 on `mark`, none reaches 2 on
/// `correctness`.
#[test]
fn accuracy_comes_from_the_configuration() {
    let accuracy_of = |name: &str, spec: &str| {
        let dir = temp_dir(name);
        let a = args(&dir, &["max_steps=1", "save_steps=0", spec]);
        trainer(a, vowel_rewards()).train().unwrap();
        let rows = read_metrics(dir.join("run/metrics.jsonl")).unwrap();
        (
            rows[1].get("accuracy").unwrap(),
            rows[1].get("eval/accuracy").unwrap(),
        )
    };
    let everything = r#"accuracy={ reward = "mark", threshold = 0.0 }"#;
    assert_eq!(accuracy_of("grpo-acc-all", everything), (1.0, 1.0));
    let nothing = r#"accuracy={ reward = "correctness", threshold = 2.0 }"#;
    assert_eq!(accuracy_of("grpo-acc-none", nothing), (0.0, 0.0));
    // A bad accuracy reward is a configuration error naming it.
    let bad = atomrl_trainer::config::load_args(
        None,
        None,
        &[
            format!("model={:?}", model_dir()),
            "dataset=\"x.jsonl\"".into(),
            r#"accuracy={ reward = "corectness" }"#.into(),
        ],
    );
    let err = bad.unwrap_err().to_string();
    assert!(err.contains("corectness"), "{err}");
}

#[test]
fn the_attention_budget_reaches_the_policy() {
    let dir = temp_dir("attention-budget");
    let default = args(&dir, &[]);
    let (model, _) = atomrl_trainer::runtime::load_policy(&default, &Device::Cpu).unwrap();
    assert_eq!(
        model.attention_scores_budget(),
        atomrl_model::DEFAULT_SCORES_BUDGET
    );
    let set = args(&dir, &["attention_scores_budget=64"]);
    assert_eq!(set.attention_scores_budget, Some(64));
    let (model, _) = atomrl_trainer::runtime::load_policy(&set, &Device::Cpu).unwrap();
    assert_eq!(model.attention_scores_budget(), 64);
}

/// `lr_horizon_steps` reaches the run: 4 steps against a rate tuned for 2 take the peak
/// `lr · (2 / 4)^0.5` on every step of a constant schedule; a run no longer than 4 keeps `lr`.
#[test]
fn the_lr_horizon_lowers_a_longer_runs_peak() {
    let logged_lrs = |name: &str, horizon: &[&str]| -> Vec<f64> {
        let dir = temp_dir(name);
        trainer(args(&dir, horizon), vowel_rewards())
            .train()
            .unwrap();
        let rows = read_metrics(dir.join("run/metrics.jsonl")).unwrap();
        rows.iter().filter_map(|r| r.get("lr")).collect()
    };
    let scaled = logged_lrs(
        "lr-horizon",
        &["lr_horizon_steps=2", "lr_horizon_exponent=0.5"],
    );
    assert_eq!(scaled.len(), 4, "{scaled:?}");
    for lr in &scaled {
        approx::assert_relative_eq!(*lr, 1e-3 * 0.5f64.sqrt(), max_relative = 1e-12);
    }
    let kept = logged_lrs(
        "lr-horizon-short",
        &["lr_horizon_steps=4", "lr_horizon_exponent=0.5"],
    );
    assert_eq!(kept, vec![1e-3; 4]);
}
