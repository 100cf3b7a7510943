//! Seconds per GRPO step and completions per second on the tiny random Qwen2 fixture
//! (~107k parameters): G = 4, 8 completions per step, at most 32 new tokens — the setting in
//! which TRL 1.16's GRPOTrainer does about 130 completions/s on an idle 2-core CPU.
//!
//! `cargo bench -p atomrl-trainer --bench grpo_step` (default settings: threads and workers as
//! `atomrl-train` chooses them; set RAYON_NUM_THREADS to compare). Configuration keys after
//! `--` override the bench's, e.g. the KL step of issue 30:
//! `cargo bench -p atomrl-trainer --bench grpo_step -- beta=0.04 workers=2`.
//! Prints the median over the measured steps after a warm-up.

#![allow(clippy::unwrap_used)]

use std::time::Instant;

use atomrl_model::CausalLm;
use atomrl_reward::{FnReward, WeightedRewards};
use atomrl_sample::ChatTokenizer;
use atomrl_trainer::config::{load_args, GRPOArgs};
use atomrl_trainer::data::{Example, Prompt};
use atomrl_trainer::logging::{keys, read_metrics};
use atomrl_trainer::Trainer;
use candle_core::{DType, Device};

fn main() {
    let model_dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/fixtures/reference/models/tiny-qwen2"
    );
    let out = std::env::temp_dir().join(format!("atomrl-bench-grpo-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let steps = 60;
    let overrides: Vec<String> = vec![
        format!("model={model_dir:?}"),
        "dataset=\"synthetic:512:0:1\"".into(),
        format!("output_dir={:?}", out.display().to_string()),
        format!("max_steps={steps}"),
        "batch_size=2".into(),
        "num_generations=4".into(),
        "max_completion_length=32".into(),
        "lr=1e-5".into(),
        "save_steps=0".into(),
        "logging_steps=0".into(),
        "progress=false".into(),
    ];
    // `key=value` arguments (cargo bench also passes `--bench`): the caller's settings.
    let extra: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a.contains('='))
        .collect();
    if !extra.is_empty() {
        println!("settings: {}", extra.join(" "));
    }
    let overrides = [overrides, extra].concat();
    let args: GRPOArgs = load_args(None, None, &overrides).unwrap();
    // The default settings, as atomrl-train applies them (threads and workers from the size).
    // The model of the settings (`model=` overrides the fixture).
    let model_dir = args.model.clone();
    let per_step = args.batch_size * args.num_generations;
    let label = format!(
        "{model_dir}: G={}, {per_step} completions/step, <={} new tokens",
        args.num_generations, args.max_completion_length
    );
    let config = atomrl_model::ModelConfig::from_file(format!("{model_dir}/config.json")).unwrap();
    let plan = atomrl_trainer::runtime::apply_cpu_plan(config.num_parameters(), 0, 0);
    println!(
        "CPU plan: {} worker(s) of {} thread(s)",
        plan.workers, plan.threads
    );
    let model = CausalLm::from_hf_dir(&model_dir, DType::F32, &Device::Cpu).unwrap();
    let tokenizer = ChatTokenizer::from_hf_dir(&model_dir).unwrap();
    // A reward with spread, so that every step runs the full update.
    let reward = FnReward::new("length", |c: &str, _ctx, _row| (c.len() % 5) as f32);
    let rewards = WeightedRewards::new().with(reward, 1.0).unwrap();
    let train: Vec<Example> = (0..512)
        .map(|i| {
            Example::new(
                Prompt::Text(format!("What is {} plus {}?", i % 13, i % 7)),
                "0",
            )
        })
        .collect();
    let started = Instant::now();
    let mut trainer =
        Trainer::with_data(args, model, tokenizer, rewards, train, Vec::new()).unwrap();
    trainer.train().unwrap();
    let total = started.elapsed().as_secs_f64();
    let rows = read_metrics(out.join("metrics.jsonl")).unwrap();
    let mut step_s: Vec<f64> = rows
        .iter()
        .skip(5)
        .filter_map(|r| r.get(keys::TIME_STEP_S))
        .collect();
    step_s.sort_by(f64::total_cmp);
    let median = step_s[step_s.len() / 2];
    let tokens: f64 = rows
        .iter()
        .skip(5)
        .filter_map(|r| {
            r.get(keys::THROUGHPUT_TOKENS_PER_S)
                .zip(r.get(keys::TIME_STEP_S))
                .map(|(t, s)| t * s)
        })
        .sum::<f64>()
        / step_s.iter().sum::<f64>();
    let gen: f64 = rows
        .iter()
        .skip(5)
        .filter_map(|r| r.get(keys::TIME_GENERATE_S))
        .sum::<f64>()
        / step_s.len() as f64;
    let train_s: f64 = rows
        .iter()
        .skip(5)
        .filter_map(|r| r.get(keys::TIME_TRAIN_S))
        .sum::<f64>()
        / step_s.len() as f64;
    println!(
        "grpo_step {label}, threads={}: \
         median {:.4} s/step, {:.0} completions/s, {:.0} completion tokens/s (generate {:.4} s, train {:.4} s per step; {} steps in {:.1} s)",
        std::env::var("RAYON_NUM_THREADS").unwrap_or_else(|_| "default".into()),
        median,
        per_step as f64 / median,
        tokens,
        gen,
        train_s,
        steps,
        total
    );
    let _ = std::fs::remove_dir_all(&out);
}
