//! Writes the folders that `xtask/fixtures/gen_model_fixtures.py --check-saved DIR` loads with
//! transformers and PEFT: the reference tiny Qwen3 trained one AdamW step (`DIR/full`), the
//! same with LoRA trained one step and merged on save (`DIR/merged`), the adapters in PEFT's
//! layout (`DIR/lora`), and atomrl-model's logits for each (`DIR/check.safetensors`).
//!
//! `cargo run -p atomrl-model --example roundtrip -- DIR`
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::path::PathBuf;

use atomrl_model::{CausalLm, LoraConfig};
use candle_core::{DType, Device, Tensor};
use candle_nn::{AdamW, Optimizer, ParamsAdamW};

fn main() {
    let out = PathBuf::from(std::env::args().nth(1).expect("usage: roundtrip DIR"));
    let src = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/fixtures/reference/models/tiny-qwen3"
    ));
    let d = Device::Cpu;
    let ids = Tensor::new(&[[1u32, 40, 41, 42, 2, 7], [1, 50, 51, 0, 0, 0]], &d).unwrap();
    let mask = Tensor::new(&[[1u32, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]], &d).unwrap();
    let step = |m: &CausalLm| {
        let logits = m.forward_logits(&ids, Some(&mask)).unwrap();
        let lp = candle_nn::ops::log_softmax(&logits, 2).unwrap();
        let loss = lp
            .get_on_dim(2, 9)
            .unwrap()
            .mean_all()
            .unwrap()
            .neg()
            .unwrap();
        let mut opt = AdamW::new(
            m.trainable_vars(),
            ParamsAdamW {
                lr: 1e-2,
                ..Default::default()
            },
        )
        .unwrap();
        opt.backward_step(&loss).unwrap();
        m.forward_logits(&ids, Some(&mask)).unwrap()
    };
    let full = CausalLm::from_hf_dir(&src, DType::F32, &d).unwrap();
    let full_logits = step(&full);
    full.save_hf(out.join("full")).unwrap();
    let mut lora = CausalLm::from_hf_dir(&src, DType::F32, &d).unwrap();
    lora.add_lora(
        LoraConfig::new(4, 8.0)
            .with_targets(&["all-linear"])
            .unwrap(),
        0,
    )
    .unwrap();
    let merged_logits = step(&lora);
    lora.save_hf(out.join("merged")).unwrap();
    lora.save_lora(out.join("lora")).unwrap();
    let check: HashMap<String, Tensor> = [
        ("input_ids".to_string(), ids.to_dtype(DType::I64).unwrap()),
        (
            "attention_mask".to_string(),
            mask.to_dtype(DType::I64).unwrap(),
        ),
        ("full_logits".to_string(), full_logits),
        ("merged_logits".to_string(), merged_logits),
    ]
    .into();
    candle_core::safetensors::save(&check, out.join("check.safetensors")).unwrap();
    println!("wrote {}", out.display());
}
