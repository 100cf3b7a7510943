//! `ATOMRL_PROFILE=1`: a training run times and counts its phases and writes `profile.json`
//! beside its metrics (its own test binary: the variable and the profiler are process-wide).

#![allow(clippy::unwrap_used)]

mod common;

use common::{model_dir, temp_dir, write_dataset};

use atomrl_core::profile::CountingAllocator;
use atomrl_model::CausalLm;
use atomrl_reward::{FnReward, WeightedRewards};
use atomrl_sample::ChatTokenizer;
use atomrl_trainer::config::load_args;
use atomrl_trainer::Trainer;
use candle_core::{DType, Device};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

/// Two GRPO steps of 4 micro-batches each, in bf16 over f32 master weights.
#[test]
fn a_profiled_run_writes_its_phases() {
    let dir = temp_dir("profile-run");
    let data = write_dataset(&dir);
    let run = dir.join("run");
    let o: Vec<String> = vec![
        format!("model={:?}", model_dir()),
        format!("dataset={:?}", data.display().to_string()),
        format!("output_dir={:?}", run.display().to_string()),
        "max_steps=2".into(),
        "batch_size=2".into(),
        "num_generations=4".into(),
        "max_completion_length=8".into(),
        "eval_size=0".into(),
        "progress=false".into(),
        "gradient_accumulation_steps=4".into(),
    ];
    let args = load_args(None, None, &o).unwrap();
    let mut model = CausalLm::from_hf_dir(model_dir(), DType::F32, &Device::Cpu).unwrap();
    model.set_compute_dtype(DType::BF16).unwrap();
    let tok = ChatTokenizer::from_hf_dir(model_dir()).unwrap();
    let len = FnReward::new("length", |c: &str, _ctx, _row| c.len() as f32 / 10.0);
    let rewards = WeightedRewards::new().with(len, 1.0).unwrap();
    std::env::set_var("ATOMRL_PROFILE", "1");
    Trainer::new(args, model, tok, rewards)
        .unwrap()
        .train()
        .unwrap();
    let text = std::fs::read_to_string(run.join("profile.json")).unwrap();
    let phases: Vec<serde_json::Value> = serde_json::from_str(&text).unwrap();
    let get = |name: &str| {
        phases
            .iter()
            .find(|p| p["name"] == name)
            .unwrap_or_else(|| panic!("no phase {name} in {text}"))
    };
    assert_eq!(get("optimizer.step")["calls"], 2);
    assert!(get("train.forward")["calls"].as_u64().unwrap() >= 2);
    assert!(get("decode.step")["calls"].as_u64().unwrap() >= 2);
    // The counting allocator is installed: tensor buffers were counted.
    assert!(get("train.backward")["alloc"]["buffers"].as_u64().unwrap() > 0);
    assert!(get("forward.layer.mlp")["seconds"].as_f64().unwrap() > 0.0);
    // bf16 over f32 weights: the micro-batches of a step (at least four; with two workers,
    // each splits its share) share one cast of the weights (CausalLm::share_weight_casts),
    // where each of their two forwards (prompts, then completions) made its own.
    assert!(get("train.forward")["calls"].as_u64().unwrap() >= 8);
    assert_eq!(get("forward.cast_weights")["calls"], 2);
}
