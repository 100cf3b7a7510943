//! LoRA: frozen base weights without gradients, trainable adapters, merge, PEFT layout.
#![allow(clippy::unwrap_used)]

mod common;

use atomrl_model::{CausalLm, LoraConfig};
use candle_core::{DType, Device, Tensor};
use candle_nn::{AdamW, Optimizer, ParamsAdamW};
use common::{max_diff, model_dir, temp_dir};

fn batch() -> (Tensor, Tensor) {
    let d = Device::Cpu;
    (
        Tensor::new(&[[1u32, 40, 41, 42, 2], [0, 1, 50, 51, 52]], &d).unwrap(),
        Tensor::new(&[[1u32, 1, 1, 1, 1], [0, 1, 1, 1, 1]], &d).unwrap(),
    )
}

fn loss(m: &CausalLm) -> Tensor {
    let (ids, mask) = batch();
    let logits = m.forward_logits(&ids, Some(&mask)).unwrap();
    let lp = candle_nn::ops::log_softmax(&logits, 2)
        .unwrap()
        .get_on_dim(2, 7)
        .unwrap();
    // Masked like a training loss (pad query rows left out).
    let mask = mask.to_dtype(lp.dtype()).unwrap();
    (lp * mask).unwrap().sum_all().unwrap().neg().unwrap()
}

fn lora_model(targets: &[&str]) -> CausalLm {
    let mut m = CausalLm::from_hf_dir(model_dir("tiny-qwen3"), DType::F32, &Device::Cpu).unwrap();
    let cfg = LoraConfig::new(4, 8.0).with_targets(targets).unwrap();
    m.add_lora(cfg, 1).unwrap();
    m
}

#[test]
fn base_weights_get_no_gradient_and_adapters_do() {
    let m = lora_model(&["all-linear"]);
    let (ids, mask) = batch();
    let base = CausalLm::from_hf_dir(model_dir("tiny-qwen3"), DType::F32, &Device::Cpu).unwrap();
    // B = 0 at initialisation: the model is unchanged.
    let diff = max_diff(
        &m.forward_logits(&ids, Some(&mask)).unwrap(),
        &base.forward_logits(&ids, Some(&mask)).unwrap(),
    );
    assert!(diff < 1e-6);
    let grads = loss(&m).backward().unwrap();
    for (name, v) in m.named_vars() {
        assert!(
            grads.get(v.as_tensor()).is_none(),
            "frozen base weight {name} got a gradient"
        );
    }
    let adapters = m.lora_vars();
    assert_eq!(adapters.len(), 2 * 7 * 2);
    for (name, v) in &adapters {
        let g = grads
            .get(v.as_tensor())
            .unwrap_or_else(|| panic!("no gradient for {name}"));
        let vals: Vec<f32> = g.flatten_all().unwrap().to_vec1().unwrap();
        assert!(vals.iter().all(|x| x.is_finite()));
        if name.contains("lora_B") {
            assert!(vals.iter().any(|x| *x != 0.0), "{name}: zero gradient");
        }
    }
    assert_eq!(m.trainable_vars().len(), adapters.len());
}

#[test]
fn gradients_through_frozen_layers_match_f64_finite_differences() {
    // The frozen layers' custom backward (input gradient only) must be exact: check adapter
    // gradients of an f64 model, whose paths cross frozen q/o/gate/up/down layers and the
    // frozen LM head, against central differences.
    let mut m = CausalLm::from_hf_dir(model_dir("tiny-qwen3"), DType::F64, &Device::Cpu).unwrap();
    m.add_lora(
        LoraConfig::new(2, 4.0)
            .with_targets(&["q_proj", "down_proj"])
            .unwrap(),
        3,
    )
    .unwrap();
    for (i, (_, v)) in m.lora_vars().into_iter().enumerate() {
        let n = v.elem_count();
        let vals: Vec<f64> = (0..n)
            .map(|j| ((j + 31 * i) as f64 * 0.7).sin() * 0.3)
            .collect();
        v.set(&Tensor::from_vec(vals, v.shape(), &Device::Cpu).unwrap())
            .unwrap();
    }
    let grads = loss(&m).backward().unwrap();
    for (name, var) in m.lora_vars() {
        let g: Vec<f64> = grads
            .get(var.as_tensor())
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let base: Vec<f64> = var.as_tensor().flatten_all().unwrap().to_vec1().unwrap();
        let idx = base.len() / 2;
        let h = 1e-5;
        let eval = |delta: f64| {
            let mut v = base.clone();
            v[idx] += delta;
            var.set(&Tensor::from_vec(v, var.shape(), &Device::Cpu).unwrap())
                .unwrap();
            loss(&m).to_scalar::<f64>().unwrap()
        };
        let fd = (eval(h) - eval(-h)) / (2.0 * h);
        var.set(&Tensor::from_vec(base, var.shape(), &Device::Cpu).unwrap())
            .unwrap();
        assert!(
            (fd - g[idx]).abs() <= 1e-6 * fd.abs().max(g[idx].abs()) + 1e-9,
            "{name}: backward {} vs finite difference {fd}",
            g[idx]
        );
    }
}

#[test]
fn train_merge_and_peft_round_trip() {
    let m = lora_model(&["q_proj", "v_proj", "up_proj"]);
    let mut opt = AdamW::new(
        m.trainable_vars(),
        ParamsAdamW {
            lr: 1e-2,
            ..Default::default()
        },
    )
    .unwrap();
    opt.backward_step(&loss(&m)).unwrap();
    let (ids, mask) = batch();
    let trained = m.forward_logits(&ids, Some(&mask)).unwrap();
    // PEFT layout round trip.
    let dir_tmp = temp_dir("peft");
    let dir = dir_tmp.path();
    m.save_lora(dir).unwrap();
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("adapter_config.json")).unwrap())
            .unwrap();
    assert_eq!(
        (cfg["peft_type"].as_str(), cfg["r"].as_u64()),
        (Some("LORA"), Some(4))
    );
    let mut fresh =
        CausalLm::from_hf_dir(model_dir("tiny-qwen3"), DType::F32, &Device::Cpu).unwrap();
    fresh.load_lora(dir).unwrap();
    assert!(max_diff(&trained, &fresh.forward_logits(&ids, Some(&mask)).unwrap()) < 1e-6);
    // Export merged: a plain HF folder with the adapters folded in.
    let out_tmp = temp_dir("merged");
    let out = out_tmp.path();
    m.save_hf(out).unwrap();
    let merged = CausalLm::from_hf_dir(out, DType::F32, &Device::Cpu).unwrap();
    assert!(merged.lora_config().is_none());
    let diff = max_diff(&trained, &merged.forward_logits(&ids, Some(&mask)).unwrap());
    assert!(diff < 5e-5, "merged export: {diff}"); // f32 rounding of W + s·BA on logits ~10
                                                   // Merge in place.
    let mut m = m;
    m.merge_lora().unwrap();
    assert!(max_diff(&trained, &m.forward_logits(&ids, Some(&mask)).unwrap()) < 5e-5);
    assert_eq!(m.trainable_vars().len(), m.named_vars().len());
}

#[test]
fn dropout_only_in_training_mode() {
    let mut m = CausalLm::from_hf_dir(model_dir("tiny-qwen2"), DType::F32, &Device::Cpu).unwrap();
    m.add_lora(LoraConfig::new(4, 8.0).with_dropout(0.5).unwrap(), 0)
        .unwrap();
    for (name, v) in m.lora_vars() {
        if name.contains("lora_B") {
            v.set(&Tensor::ones(v.shape(), DType::F32, &Device::Cpu).unwrap())
                .unwrap();
        }
    }
    let (ids, mask) = batch();
    let a = m.forward_logits(&ids, Some(&mask)).unwrap();
    let b = m.forward_logits(&ids, Some(&mask)).unwrap();
    assert_eq!(max_diff(&a, &b), 0.0);
    m.set_train(true);
    let c = m.forward_logits(&ids, Some(&mask)).unwrap();
    assert!(max_diff(&a, &c) > 0.0);
}

#[test]
fn a_rank_past_every_adapted_weight_is_refused_naming_r() {
    let mut m = CausalLm::from_hf_dir(model_dir("tiny-qwen3"), DType::F32, &Device::Cpu).unwrap();
    let c = m.config().clone();
    // The default targets are q, k, v and o: the largest side is q's or o's.
    let largest = (c.num_attention_heads * c.head_dim).max(c.hidden_size);
    let e = m
        .add_lora(LoraConfig::new(largest + 1, 8.0), 1)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("`r`") && e.contains(&format!("at most {largest}")),
        "{e}"
    );
    assert!(m.lora_config().is_none());
    // Past k_proj's smaller side but within q's: allowed, as in PEFT.
    let kv = c.num_key_value_heads * c.head_dim;
    m.add_lora(LoraConfig::new(kv.min(c.hidden_size) + 1, 8.0), 1)
        .unwrap();
}
