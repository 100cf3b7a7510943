//! Every parameter receives a finite gradient, and backward agrees with f64 central finite
//! differences.
#![allow(clippy::unwrap_used)]

mod common;

use atomrl_model::{Architecture, CausalLm, ForwardInput, ModelConfig};
use candle_core::{DType, Device, Tensor, Var};

/// Deterministic pseudo-random values in [-1, 1].
fn noise(shape: &[usize], seed: u64, dtype: DType) -> Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<f64> = (0..n)
        .map(|i| ((i as f64 + 1.0) * 12.9898 + seed as f64 * 78.233).sin())
        .collect();
    Tensor::from_vec(v, shape, &Device::Cpu)
        .unwrap()
        .to_dtype(dtype)
        .unwrap()
}

/// Loss weights `[2, 5, 11]`, zero at the pad positions of the batch in [`loss`] (as a masked
/// training loss would be).
fn loss_weights(dtype: DType) -> Tensor {
    let real = Tensor::new(
        &[[0f64, 1., 1., 1., 1.], [1., 1., 1., 1., 0.]],
        &Device::Cpu,
    )
    .unwrap();
    let real = real.unsqueeze(2).unwrap().to_dtype(dtype).unwrap();
    noise(&[2, 5, 11], 9, dtype).broadcast_mul(&real).unwrap()
}

/// A scalar loss touching every real logit: weighted sum of log-softmax over a left-padded
/// batch. (Pad query rows are left out: every key is masked there, and the finite mask value
/// makes their scores too coarse for finite differences, though not for backward.)
fn loss(model: &CausalLm, weights: &Tensor) -> Tensor {
    let d = Device::Cpu;
    let ids = Tensor::new(&[[0u32, 3, 7, 1, 9], [4, 2, 8, 5, 0]], &d).unwrap();
    let mask = Tensor::new(&[[0u32, 1, 1, 1, 1], [1, 1, 1, 1, 0]], &d).unwrap();
    let logits = model
        .forward(&ForwardInput::new(ids).with_attention_mask(mask), None)
        .unwrap();
    let lp = candle_nn::ops::log_softmax(&logits, 2).unwrap();
    (lp * weights).unwrap().sum_all().unwrap()
}

fn tiny(arch: Architecture, tie: bool) -> ModelConfig {
    let mut c = ModelConfig::new(arch, 11, 8, 12, 1, 2, 1).unwrap();
    c.tie_word_embeddings = tie;
    c.initializer_range = 0.5;
    c.qkv_bias = true;
    c.o_bias = arch != Architecture::Qwen2;
    c
}

/// Perturbs norms and biases so that they are not at the 1 / 0 of initialisation.
fn perturb(model: &CausalLm) {
    for (i, (_, v)) in model.named_vars().into_iter().enumerate() {
        let eps = (noise(v.dims(), i as u64, v.dtype()) * 0.2).unwrap();
        v.set(&(v.as_tensor() + eps).unwrap()).unwrap();
    }
}

#[test]
fn every_parameter_gets_a_finite_nonzero_gradient() {
    for arch in Architecture::ALL {
        for tie in [true, false] {
            let model =
                CausalLm::from_config_random(tiny(arch, tie), 3, DType::F32, &Device::Cpu).unwrap();
            let w = loss_weights(DType::F32);
            let grads = loss(&model, &w).backward().unwrap();
            for (name, var) in model.named_vars() {
                let g = grads
                    .get(var.as_tensor())
                    .unwrap_or_else(|| panic!("{arch:?} tie={tie}: no gradient for {name}"));
                let v: Vec<f32> = g.flatten_all().unwrap().to_vec1().unwrap();
                assert!(
                    v.iter().all(|x| x.is_finite()),
                    "{name}: non-finite gradient"
                );
                assert!(
                    v.iter().any(|x| *x != 0.0),
                    "{arch:?} {name}: zero gradient"
                );
            }
        }
    }
}

#[test]
fn gradients_match_f64_finite_differences() {
    let h = 1e-6;
    for arch in Architecture::ALL {
        let model =
            CausalLm::from_config_random(tiny(arch, false), 5, DType::F64, &Device::Cpu).unwrap();
        perturb(&model);
        let w = loss_weights(DType::F64);
        let grads = loss(&model, &w).backward().unwrap();
        let mut checked = 0;
        for (k, (name, var)) in model.named_vars().into_iter().enumerate() {
            let g: Vec<f64> = grads
                .get(var.as_tensor())
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            let n = var.elem_count();
            // Three entries per parameter, spread over the tensor.
            for j in 0..3 {
                let idx = (k * 7 + j * (n / 3 + 1)) % n;
                let fd = finite_difference(&model, &var, idx, h, &w);
                let tol = 1e-6 * fd.abs().max(g[idx].abs()) + 1e-8;
                assert!(
                    (fd - g[idx]).abs() <= tol,
                    "{arch:?} {name}[{idx}]: backward {} vs finite difference {fd}",
                    g[idx]
                );
                checked += 1;
            }
        }
        assert!(checked > 30);
    }
}

fn finite_difference(model: &CausalLm, var: &Var, idx: usize, h: f64, w: &Tensor) -> f64 {
    let base: Vec<f64> = var.as_tensor().flatten_all().unwrap().to_vec1().unwrap();
    let eval = |delta: f64| {
        let mut v = base.clone();
        v[idx] += delta;
        var.set(&Tensor::from_vec(v, var.shape(), &Device::Cpu).unwrap())
            .unwrap();
        loss(model, w).to_scalar::<f64>().unwrap()
    };
    let (plus, minus) = (eval(h), eval(-h));
    var.set(&Tensor::from_vec(base, var.shape(), &Device::Cpu).unwrap())
        .unwrap();
    (plus - minus) / (2.0 * h)
}
