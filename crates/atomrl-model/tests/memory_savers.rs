//! Mixed precision (bf16 compute over f32 master weights) and gradient checkpointing.
#![allow(clippy::unwrap_used)]

use atomrl_model::{Architecture, CausalLm, ForwardInput, LoraConfig, ModelConfig};
use candle_core::{backprop::GradStore, DType, Device, Tensor, Var};

fn config() -> ModelConfig {
    let mut c = ModelConfig::new(Architecture::Qwen2, 64, 32, 48, 2, 4, 2).unwrap();
    c.initializer_range = 0.2;
    c
}

fn model(seed: u64) -> CausalLm {
    CausalLm::from_config_random(config(), seed, DType::F32, &Device::Cpu).unwrap()
}

fn input() -> ForwardInput {
    let d = Device::Cpu;
    let ids = Tensor::new(&[[0u32, 5, 9, 13, 2, 40], [7, 8, 63, 1, 22, 0]], &d).unwrap();
    let mask = Tensor::new(&[[0u32, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0]], &d).unwrap();
    ForwardInput::new(ids).with_attention_mask(mask)
}

/// A masked log-likelihood loss in f32 (as the trainer computes it from half-precision logits).
fn loss(m: &CausalLm) -> Tensor {
    let input = input();
    let logits = m
        .forward(&input, None)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap();
    let lp = candle_nn::ops::log_softmax(&logits, 2).unwrap();
    let targets = input.input_ids.unsqueeze(2).unwrap();
    let picked = lp.gather(&targets, 2).unwrap().squeeze(2).unwrap();
    let mask = input.attention_mask.unwrap().to_dtype(DType::F32).unwrap();
    (picked * mask).unwrap().sum_all().unwrap().neg().unwrap()
}

fn max_abs(t: &Tensor) -> f32 {
    t.to_dtype(DType::F32)
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
}

fn rel_diff(a: &Tensor, b: &Tensor) -> f32 {
    let a = a.to_dtype(DType::F32).unwrap();
    let b = b.to_dtype(DType::F32).unwrap();
    max_abs(&(&a - &b).unwrap()) / max_abs(&b).max(1e-12)
}

/// The gradients of `vars` (all must have one).
fn grads_of(grads: &GradStore, vars: &[Var]) -> Vec<Tensor> {
    vars.iter()
        .map(|v| grads.get(v.as_tensor()).expect("missing gradient").clone())
        .collect()
}

#[test]
fn bf16_compute_matches_f32_within_bf16_tolerance() {
    let full = model(3);
    let mut half = model(3);
    half.set_compute_dtype(DType::BF16).unwrap();
    assert_eq!(
        (half.dtype(), half.compute_dtype()),
        (DType::F32, DType::BF16)
    );
    let a = full.forward(&input(), None).unwrap();
    let b = half.forward(&input(), None).unwrap();
    assert_eq!(b.dtype(), DType::BF16);
    let d = rel_diff(&b, &a);
    assert!(d < 0.05, "bf16 logits differ from f32 by {d} (relative)");
    // The detached view computes in bf16 too, with the same result.
    let v = half.detached().forward(&input(), None).unwrap();
    assert_eq!(v.dtype(), DType::BF16);
    assert!(rel_diff(&v, &b) < 1e-6);

    // Gradients land on the f32 master variables, finite and close to the f32 ones.
    let vars = half.trainable_vars();
    let gh = grads_of(&loss(&half).backward().unwrap(), &vars);
    let gf = grads_of(&loss(&full).backward().unwrap(), &full.trainable_vars());
    for ((g, f), v) in gh.iter().zip(&gf).zip(&vars) {
        assert_eq!((v.dtype(), g.dtype()), (DType::F32, DType::F32));
        assert!(max_abs(g).is_finite());
        let d = rel_diff(g, f);
        assert!(d < 0.1, "bf16 gradient differs from f32 by {d} (relative)");
    }
}

#[test]
fn an_update_of_the_f32_masters_reaches_the_next_bf16_forward() {
    let mut m = model(5);
    m.set_compute_dtype(DType::BF16).unwrap();
    let before = loss(&m).to_scalar::<f32>().unwrap();
    let view_before = m.detached().forward(&input(), None).unwrap();
    // A few plain gradient-descent steps in f32 on the master weights.
    for _ in 0..3 {
        let grads = loss(&m).backward().unwrap();
        for v in m.trainable_vars() {
            let g = grads.get(v.as_tensor()).unwrap();
            v.set(&(v.as_tensor() - (g * 0.05).unwrap()).unwrap())
                .unwrap();
            assert_eq!(v.dtype(), DType::F32);
        }
    }
    let after = loss(&m).to_scalar::<f32>().unwrap();
    assert!(after < before, "loss {before} -> {after}");
    // A new view sees the update.
    let view_after = m.detached().forward(&input(), None).unwrap();
    assert!(rel_diff(&view_after, &view_before) > 1e-3);
}

#[test]
fn bf16_lora_trains_f32_adapters_only() {
    let mut m = model(7);
    m.add_lora(
        LoraConfig::new(4, 8.0)
            .with_targets(&["all-linear"])
            .unwrap(),
        1,
    )
    .unwrap();
    m.set_compute_dtype(DType::BF16).unwrap();
    let grads = loss(&m).backward().unwrap();
    for (name, v) in m.named_vars() {
        assert!(grads.get(v.as_tensor()).is_none(), "{name} got a gradient");
    }
    for g in grads_of(&grads, &m.trainable_vars()) {
        assert_eq!(g.dtype(), DType::F32);
        assert!(max_abs(&g).is_finite());
    }
}

fn checkpointed_grads_match(mut m: CausalLm, tol: f32) {
    let vars = m.trainable_vars();
    let plain = grads_of(&loss(&m).backward().unwrap(), &vars);
    let l_plain = loss(&m).to_scalar::<f32>().unwrap();
    m.set_gradient_checkpointing(true);
    let l_ckpt = loss(&m);
    assert!((l_ckpt.to_scalar::<f32>().unwrap() - l_plain).abs() < 1e-5);
    let ckpt = grads_of(&l_ckpt.backward().unwrap(), &vars);
    for (a, b) in ckpt.iter().zip(&plain) {
        let d = max_abs(&(a - b).unwrap());
        assert!(d < tol, "checkpointed gradient differs by {d}");
    }
}

#[test]
fn gradient_checkpointing_gives_the_same_gradients() {
    checkpointed_grads_match(model(11), 1e-5);
}

#[test]
fn gradient_checkpointing_with_lora_and_qwen3_norms() {
    let mut c = config();
    c.architecture = Architecture::Qwen3;
    c.tie_word_embeddings = false;
    let mut m = CausalLm::from_config_random(c, 13, DType::F32, &Device::Cpu).unwrap();
    m.add_lora(
        LoraConfig::new(2, 4.0)
            .with_targets(&["q_proj", "down_proj"])
            .unwrap(),
        2,
    )
    .unwrap();
    // Non-zero B so that the adapters change the output.
    for v in m.trainable_vars() {
        v.set(&(v.as_tensor() + 0.1).unwrap()).unwrap();
    }
    checkpointed_grads_match(m, 1e-5);
}

#[test]
fn gradient_checkpointing_refuses_lora_dropout_in_training() {
    let mut m = model(17);
    let cfg = LoraConfig::new(2, 4.0).with_dropout(0.1).unwrap();
    m.add_lora(cfg, 3).unwrap();
    m.set_gradient_checkpointing(true);
    m.set_train(true);
    let err = m.forward(&input(), None).unwrap_err().to_string();
    assert!(err.contains("checkpointing"), "{err}");
    // Inference views never checkpoint.
    assert!(m.detached().forward(&input(), None).is_ok());
}
