//! PPO's value head on the policy's own transformer (`critic.share_backbone`): the value term
//! of the shared update is the clipped value loss of the head's values; its gradient reaches
//! the transformer and the head; and micro-batches and workers sum to the full batch, as the
//! policy's loss does.

#![allow(clippy::unwrap_used)]

mod batches;

use atomrl_loss::{compute_value_loss, AggOptions};
use atomrl_model::{Architecture, CausalLm, ModelConfig, ValueModel};
use atomrl_trainer::config::{GRPOArgs, Recipe};
use atomrl_trainer::grpo::{policy_and_value_update, policy_update, UpdateStats, ValueTerm};
use atomrl_trainer::optim::{AdamW, AdamWConfig};
use atomrl_trainer::rollout::Experience;
use atomrl_trainer::TrainState;
use candle_core::{DType, Device, Tensor};

const VF_COEF: f64 = 0.5;
const CLIP: f64 = 0.2;

fn model() -> CausalLm {
    let config = ModelConfig::new(Architecture::Qwen2, 32, 16, 32, 2, 4, 2).unwrap();
    CausalLm::from_config_random(config, 5, DType::F32, &Device::Cpu).unwrap()
}

/// Six rows with ragged completions; with `shared`, rows come in pairs on one prompt (the
/// shared-prompt forward), else each has its own. Per-token advantages (all 0 with
/// `zero_advantages`), values and returns are set as GAE would.
fn batch(shared: bool, zero_advantages: bool) -> Experience {
    let prompt_of: fn(usize) -> usize = if shared { |i| i / 2 } else { |i| i };
    let mut exp = batches::ragged_experience(&[0.0; 6], prompt_of, |i| 1 + (i * 5) % 6);
    let t = exp.completion_len;
    let grid = |f: &dyn Fn(usize, usize) -> f32| {
        let v: Vec<f32> = (0..6 * t).map(|k| f(k / t, k % t)).collect();
        let x = Tensor::from_vec(v, (6, t), &Device::Cpu).unwrap();
        (x * exp.loss_mask.to_dtype(DType::F32).unwrap()).unwrap()
    };
    let adv = if zero_advantages {
        grid(&|_, _| 0.0)
    } else {
        grid(&|r, c| ((r * 3 + c) % 5) as f32 * 0.4 - 0.8)
    };
    exp.advantages = adv;
    exp.values = Some(grid(&|r, c| 0.1 * ((r + c) % 3) as f32));
    exp.returns = Some(grid(&|r, _| if r % 2 == 0 { 1.0 } else { -0.3 }));
    exp
}

fn args(accumulation: usize, workers: usize, iterations: usize) -> GRPOArgs {
    GRPOArgs {
        loss_agg: "token_mean".parse().unwrap(),
        gradient_accumulation_steps: accumulation,
        workers,
        max_grad_norm: 0.0,
        beta: 0.0,
        entropy_coef: 0.0,
        num_iterations: iterations,
        ..GRPOArgs::preset(Recipe::Ppo)
    }
}

/// One shared update (`iterations` epochs) of a fresh policy and head on `exp`: its
/// statistics, the policy and the critic after it.
fn shared_update(
    exp: &Experience,
    accumulation: usize,
    workers: usize,
    iterations: usize,
) -> (UpdateStats, CausalLm, ValueModel) {
    let mut state = TrainState::new(model(), AdamWConfig::default()).unwrap();
    let critic = ValueModel::sharing_backbone(&state.model).unwrap();
    let mut head_opt = AdamW::new(critic.trainable_vars(), AdamWConfig::default()).unwrap();
    let value = ValueTerm {
        critic: &critic,
        optimizer: &mut head_opt,
        lr: 1e-2,
        vf_coef: VF_COEF,
        clip_range_value: CLIP,
    };
    let stats = policy_and_value_update(
        &mut state,
        exp,
        &args(accumulation, workers, iterations).update(),
        1e-2,
        value,
    )
    .unwrap();
    (stats, state.model, critic)
}

fn flat(m: &CausalLm, name: &str) -> Vec<f32> {
    m.tensor(name)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap()
}

fn head(c: &ValueModel) -> Vec<f32> {
    c.trainable_vars()
        .iter()
        .flat_map(|(_, v)| {
            v.as_tensor()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()
        })
        .collect()
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn the_value_term_is_the_clipped_value_loss_of_the_heads_values() {
    for shared in [false, true] {
        let exp = batch(shared, false);
        let (stats, _, _) = shared_update(&exp, 1, 1, 1);
        // Independently: a fresh head (zeros) on the same fresh policy, by the full forward.
        let critic = ValueModel::sharing_backbone(&model()).unwrap();
        let values = critic
            .completion_values(&exp.input_ids, &exp.attention_mask, exp.completion_len)
            .unwrap();
        let out = compute_value_loss(
            &values,
            exp.values.as_ref().unwrap(),
            exp.returns.as_ref().unwrap(),
            &exp.loss_mask,
            CLIP,
            &AggOptions::default(),
        )
        .unwrap();
        let want = out.loss.to_scalar::<f32>().unwrap() as f64 * VF_COEF;
        assert!(
            (stats.value_loss - want).abs() <= 1e-5 * want,
            "shared prompts {shared}: {} vs {want}",
            stats.value_loss
        );
        assert!((stats.value_clip_frac - out.clip_frac).abs() < 1e-9);
        assert!(stats.loss.is_finite() && stats.grad_norm > 0.0);
    }
}

/// With every advantage 0 the policy term has no gradient: `policy_update` leaves the weights
/// where they were (no weight decay), while the shared update moves the head and, from its
/// second epoch (a zero head passes no gradient back), the transformer.
#[test]
fn the_value_gradient_reaches_the_transformer_and_the_head() {
    let exp = batch(true, true);
    let name = "model.layers.0.mlp.up_proj.weight";
    let before = flat(&model(), name);
    let mut state = TrainState::new(model(), AdamWConfig::default()).unwrap();
    policy_update(&mut state, &exp, &args(1, 1, 2).update(), 1e-2).unwrap();
    assert_eq!(flat(&state.model, name), before);

    let (_, policy, critic) = shared_update(&exp, 1, 1, 1);
    assert_eq!(flat(&policy, name), before);
    assert!(head(&critic).iter().any(|&x| x.abs() > 1e-4));
    let (stats, policy, critic) = shared_update(&exp, 1, 1, 2);
    assert!(stats.value_loss > 0.0);
    assert!(max_diff(&flat(&policy, name), &before) > 1e-4);
    assert!(head(&critic).iter().any(|&x| x.abs() > 1e-4));
}

#[test]
fn micro_batches_and_workers_sum_to_the_full_batch() {
    let exp = batch(true, false);
    let name = "model.layers.1.self_attn.q_proj.weight";
    let (s1, p1, c1) = shared_update(&exp, 1, 1, 2);
    for (acc, workers) in [(3, 1), (1, 2), (3, 2)] {
        let (s, p, c) = shared_update(&exp, acc, workers, 2);
        let k = format!("accumulation {acc}, workers {workers}");
        assert!(
            (s.loss - s1.loss).abs() <= 1e-5 * s1.loss.abs().max(1e-3),
            "{k}"
        );
        assert!(
            (s.value_loss - s1.value_loss).abs() <= 1e-5 * s1.value_loss,
            "{k}"
        );
        assert!(
            (s.grad_norm - s1.grad_norm).abs() <= 1e-4 * s1.grad_norm,
            "{k}"
        );
        assert!(max_diff(&flat(&p, name), &flat(&p1, name)) < 1e-5, "{k}");
        assert!(max_diff(&head(&c), &head(&c1)) < 1e-5, "{k}");
    }
}
