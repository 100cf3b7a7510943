//! Gradient accumulation with the global normaliser equals one big batch: the loss, the
//! gradient norm and the updated weights agree, for token- and sequence-level aggregations
//! (the bug TRL shipped as its issue #3021), whether the micro-batches run one after another
//! or at once on data-parallel workers.

#![allow(clippy::unwrap_used)]

mod batches;

use atomrl_model::{Architecture, CausalLm, ModelConfig};
use atomrl_trainer::config::{GRPOArgs, Recipe};
use atomrl_trainer::grpo::{policy_update, UpdateStats};
use atomrl_trainer::optim::AdamWConfig;
use atomrl_trainer::rollout::Experience;
use atomrl_trainer::TrainState;
use candle_core::{DType, Device};

fn model() -> CausalLm {
    let config = ModelConfig::new(Architecture::Qwen2, 32, 16, 32, 2, 4, 2).unwrap();
    CausalLm::from_config_random(config, 3, DType::F32, &Device::Cpu).unwrap()
}

/// Six rows of ragged prompts and completions (completion `i` has `completion_len(i)` tokens).
fn ragged_batch(adv: &[f32; 6], completion_len: fn(usize) -> usize) -> Experience {
    batches::ragged_experience(adv, |i| i, completion_len)
}

fn batch() -> Experience {
    ragged_batch(&[0.9, -0.4, 1.3, -1.1, 0.2, -0.9], |i| 1 + (i * 5) % 6)
}

/// One trainer update of a fresh model on `batch` (no gradient clipping), and the model after it.
fn update(
    batch: &Experience,
    loss_agg: &str,
    accumulation: usize,
    workers: usize,
) -> (UpdateStats, CausalLm) {
    let m = model();
    let args = GRPOArgs {
        loss_agg: loss_agg.parse().unwrap(),
        gradient_accumulation_steps: accumulation,
        workers,
        max_grad_norm: 0.0,
        ..GRPOArgs::preset(Recipe::Grpo)
    };
    let mut state = TrainState::new(m, AdamWConfig::default()).unwrap();
    let stats = policy_update(&mut state, batch, &args.update(), 1e-2).unwrap();
    (stats, state.model)
}

fn run(loss_agg: &str, accumulation: usize, workers: usize) -> (f64, f64, Vec<f32>) {
    let (stats, m) = update(&batch(), loss_agg, accumulation, workers);
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
        let (loss1, norm1, w1) = run(agg, 1, 1);
        // (accumulation, workers): micro-batches in sequence, on parallel workers, or both.
        for (acc, workers) in [(2, 1), (3, 1), (6, 1), (1, 2), (1, 3), (3, 2)] {
            let k = format!("accumulation {acc}, workers {workers}");
            let (loss_k, norm_k, w_k) = run(agg, acc, workers);
            assert!(
                (loss1 - loss_k).abs() <= 1e-5 * loss1.abs().max(1e-3),
                "{agg}, {k}: loss {loss1} vs {loss_k}"
            );
            assert!(
                (norm1 - norm_k).abs() <= 1e-4 * norm1,
                "{agg}, {k}: grad norm {norm1} vs {norm_k}"
            );
            let max_diff = w1
                .iter()
                .zip(&w_k)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(max_diff < 1e-5, "{agg}, {k}: weights differ by {max_diff}");
        }
        assert!(norm1 > 0.0);
    }
}

/// Rows with an advantage of exactly 0 are skipped (β = 0, no entropy bonus): the loss and the
/// gradient norm still equal those of the whole batch computed directly.
#[test]
fn skipping_zero_advantage_rows_is_exact() {
    use atomrl_logprob::get_action_log_probs;
    use atomrl_loss::{compute_policy_loss, AggOptions, LossAgg, PolicyLossOptions};
    use atomrl_trainer::optim::Gradients;

    let batch = ragged_batch(&[0.9, 0.0, 1.3, -1.1, 0.0, -0.9], |i| 2 + (i * 5) % 5);
    for agg in ["token_mean", "seq_mean_token_mean"] {
        // Direct: the whole batch through the loss, no skipping.
        let m = model();
        let lp = get_action_log_probs(
            &m,
            &batch.input_ids,
            &batch.attention_mask,
            batch.completion_len,
            1.0,
            false,
        )
        .unwrap()
        .log_probs;
        let opts = PolicyLossOptions {
            agg: AggOptions {
                mode: agg.parse::<LossAgg>().unwrap(),
                ..Default::default()
            },
            ..Default::default()
        };
        let out = compute_policy_loss(
            &lp,
            &lp.detach(),
            &batch.advantages,
            &batch.loss_mask,
            &opts,
        )
        .unwrap();
        let mut grads = Gradients::new();
        grads
            .accumulate(&out.loss.backward().unwrap(), &m.named_vars())
            .unwrap();
        let (loss, norm) = (
            out.loss.to_scalar::<f32>().unwrap() as f64,
            grads.global_norm().unwrap(),
        );
        // Trainer path: rows 1 and 4 leave the experience (its normaliser stays).
        let kept = batch.without_zero_advantage().unwrap();
        assert_eq!((kept.num_rows(), kept.normalizer), (4, batch.normalizer));
        let (stats, _) = update(&kept, agg, 1, 1);
        assert!(
            (stats.loss - loss).abs() <= 1e-5 * loss.abs().max(1e-3),
            "{agg}: loss {} vs {loss}",
            stats.loss
        );
        assert!(
            (stats.grad_norm - norm).abs() <= 1e-4 * norm,
            "{agg}: grad norm {} vs {norm}",
            stats.grad_norm
        );
    }
}

/// A step whose groups are all flat (every advantage 0) skips the forward and backward but
/// still takes the optimizer step with a zero gradient, as TRL and verl do: the weights and
/// moments equal an explicit AdamW step with `g = 0` (from the nonzero moments a previous
/// step left), and the step count advances.
#[test]
fn a_flat_step_is_a_zero_gradient_adamw_step() {
    let m = model();
    let args = GRPOArgs {
        beta: 0.0,
        entropy_coef: 0.0,
        max_grad_norm: 0.0,
        ..GRPOArgs::preset(Recipe::Grpo)
    };
    let config = AdamWConfig {
        weight_decay: 0.1,
        ..AdamWConfig::default()
    };
    let mut state = TrainState::new(m, config).unwrap();
    let params = state.params.clone();
    let lr = 1e-2;
    policy_update(&mut state, &batch(), &args.update(), lr).unwrap();
    let opt = &state.optimizer;
    assert_eq!(opt.step_count(), 1);
    let dir = std::env::temp_dir().join(format!("atomrl-flat-step-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (before_file, after_file) = (
        dir.join("before.safetensors"),
        dir.join("after.safetensors"),
    );
    opt.save(&before_file).unwrap();
    let before_w: Vec<Vec<f32>> = params
        .iter()
        .map(|(_, v)| v.as_tensor().flatten_all().unwrap().to_vec1().unwrap())
        .collect();

    // The experience of a flat step has no rows left, only its normaliser.
    let flat = ragged_batch(&[0.0; 6], |i| 1 + (i * 5) % 6)
        .without_zero_advantage()
        .unwrap();
    assert_eq!((flat.num_rows(), flat.normalizer.rows), (0, 6));
    let stats = policy_update(&mut state, &flat, &args.update(), lr).unwrap();
    let opt = &state.optimizer;
    assert_eq!(stats.skipped, 0);
    assert_eq!(opt.step_count(), 2, "the flat step counts");
    opt.save(&after_file).unwrap();

    let read = |file: &std::path::Path, key: &str| -> Vec<f32> {
        candle_core::safetensors::load(file, &Device::Cpu).unwrap()[key]
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap()
    };
    let (b1, b2) = (config.beta1, config.beta2);
    let (bias1, bias2) = (1.0 - b1.powi(2), 1.0 - b2.powi(2));
    let mut moved = false;
    for ((name, var), theta0) in params.iter().zip(&before_w) {
        let (m0, v0) = (
            read(&before_file, &format!("m.{name}")),
            read(&before_file, &format!("v.{name}")),
        );
        let (m1, v1) = (
            read(&after_file, &format!("m.{name}")),
            read(&after_file, &format!("v.{name}")),
        );
        let theta1: Vec<f32> = var.as_tensor().flatten_all().unwrap().to_vec1().unwrap();
        for i in 0..theta0.len() {
            let m = b1 * m0[i] as f64;
            let v = b2 * v0[i] as f64;
            let update = (m / bias1) / ((v / bias2).sqrt() + config.eps);
            let want = theta0[i] as f64 * (1.0 - lr * config.weight_decay) - lr * update;
            assert!(
                (m1[i] as f64 - m).abs() <= 1e-6 * m.abs().max(1e-12),
                "{name}[{i}] m"
            );
            assert!(
                (v1[i] as f64 - v).abs() <= 1e-6 * v.abs().max(1e-20),
                "{name}[{i}] v"
            );
            assert!(
                (theta1[i] as f64 - want).abs() <= 1e-6 * (want.abs() + lr),
                "{name}[{i}]: {} vs {want}",
                theta1[i]
            );
            moved |= theta1[i] != theta0[i];
        }
    }
    assert!(
        moved,
        "a zero-gradient AdamW step with nonzero moments moves the weights"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
