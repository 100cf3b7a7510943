//! Gradient accumulation with the global normaliser equals one big batch: the loss, the
//! gradient norm and the updated weights agree, for token- and sequence-level aggregations
//! (the bug TRL shipped as its issue #3021).

#![allow(clippy::unwrap_used)]

use atomrl_model::{Architecture, CausalLm, ModelConfig};
use atomrl_trainer::config::{GRPOArgs, Recipe};
use atomrl_trainer::grpo::{policy_update, TrainingBatch, UpdateContext};
use atomrl_trainer::optim::{AdamW, AdamWConfig};
use candle_core::{DType, Device};

fn model() -> CausalLm {
    let config = ModelConfig::new(Architecture::Qwen2, 32, 16, 32, 2, 4, 2).unwrap();
    CausalLm::from_config_random(config, 3, DType::F32, &Device::Cpu).unwrap()
}

fn batch() -> TrainingBatch {
    // Ragged prompts and completions of 6 rows.
    let prompts: Vec<Vec<u32>> = (0..6)
        .map(|i| {
            (0..(2 + i % 3))
                .map(|j| ((i * 7 + j * 3) % 31 + 1) as u32)
                .collect()
        })
        .collect();
    let completions: Vec<Vec<u32>> = (0..6)
        .map(|i| {
            (0..(1 + (i * 5) % 6))
                .map(|j| ((i * 11 + j * 5) % 31 + 1) as u32)
                .collect()
        })
        .collect();
    let rows: Vec<(&[u32], &[u32])> = prompts
        .iter()
        .zip(&completions)
        .map(|(p, c)| (p.as_slice(), c.as_slice()))
        .collect();
    let adv = [0.9f32, -0.4, 1.3, -1.1, 0.2, -0.9];
    TrainingBatch::build(&rows, &adv, &[true; 6], 0, &Device::Cpu).unwrap()
}

fn run(loss_agg: &str, accumulation: usize) -> (f64, f64, Vec<f32>) {
    let m = model();
    let args = GRPOArgs {
        loss_agg: loss_agg.into(),
        gradient_accumulation_steps: accumulation,
        max_grad_norm: 0.0,
        ..GRPOArgs::preset(Recipe::Grpo)
    };
    let params = m.named_vars();
    let mut opt = AdamW::new(params.clone(), AdamWConfig::default()).unwrap();
    let ctx = UpdateContext {
        model: &m,
        reference: None,
        params: &params,
        args: &args,
    };
    let stats = policy_update(&ctx, &mut opt, &batch(), 1e-2, false).unwrap();
    let w = m
        .tensor("model.layers.0.self_attn.q_proj.weight")
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    (stats.loss, stats.grad_norm, w)
}

#[test]
fn micro_batches_sum_to_the_full_batch() {
    for agg in [
        "token_mean",
        "seq_mean_token_mean",
        "seq_mean_token_sum",
        "seq_mean_token_sum_norm",
    ] {
        let (loss1, norm1, w1) = run(agg, 1);
        for k in [2, 3, 6] {
            let (loss_k, norm_k, w_k) = run(agg, k);
            assert!(
                (loss1 - loss_k).abs() <= 1e-5 * loss1.abs().max(1e-3),
                "{agg} x{k}: loss {loss1} vs {loss_k}"
            );
            assert!(
                (norm1 - norm_k).abs() <= 1e-4 * norm1,
                "{agg} x{k}: grad norm {norm1} vs {norm_k}"
            );
            let max_diff = w1
                .iter()
                .zip(&w_k)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(max_diff < 1e-5, "{agg} x{k}: weights differ by {max_diff}");
        }
        assert!(norm1 > 0.0);
    }
}
