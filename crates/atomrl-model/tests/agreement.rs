//! Numerical agreement with Hugging Face transformers 5.23 (float32, eager attention): logits
//! within 1e-4 at every real position, right-padded (training) and left-padded (generation)
//! batches, on every fixture model.
#![allow(clippy::unwrap_used)]

mod common;

use atomrl_model::{CausalLm, ForwardInput};
use candle_core::{DType, Device, Tensor};
use common::{expected, max_diff_masked, model_dir};

const MODELS: [&str; 5] = [
    "tiny-qwen2",
    "tiny-qwen3",
    "tiny-qwen2-untied",
    "tiny-llama",
    "tiny-qwen3-bf16",
];

fn logits(model: &CausalLm, ids: &Tensor, mask: &Tensor) -> Tensor {
    let input =
        ForwardInput::new(ids.to_dtype(DType::U32).unwrap()).with_attention_mask(mask.clone());
    model.forward(&input, None).unwrap()
}

#[test]
fn logits_match_transformers_on_padded_batches() {
    for name in MODELS {
        let model = CausalLm::from_hf_dir(model_dir(name), DType::F32, &Device::Cpu).unwrap();
        let exp = expected(name);
        for side in ["right", "left"] {
            let ids = &exp[&format!("{side}_input_ids")];
            let mask = &exp[&format!("{side}_attention_mask")];
            let want = &exp[&format!("{side}_logits")];
            let got = logits(&model, ids, mask);
            assert_eq!(got.dims(), want.dims(), "{name} {side}");
            let diff = max_diff_masked(&got, want, mask);
            assert!(diff < 1e-4, "{name} {side}: max |diff| = {diff}");
        }
    }
}

#[test]
fn log_probs_match_transformers() {
    for name in ["tiny-qwen2", "tiny-qwen3"] {
        let model = CausalLm::from_hf_dir(model_dir(name), DType::F32, &Device::Cpu).unwrap();
        let exp = expected(name);
        let (ids, mask) = (&exp["right_input_ids"], &exp["right_attention_mask"]);
        let got = candle_nn::ops::log_softmax(&logits(&model, ids, mask), 2).unwrap();
        let want = candle_nn::ops::log_softmax(&exp["right_logits"], 2).unwrap();
        let diff = max_diff_masked(&got, &want, mask);
        assert!(diff < 1e-4, "{name}: max |log-prob diff| = {diff}");
    }
}

#[test]
fn f64_and_bf16_forwards_agree_with_f32() {
    let name = "tiny-qwen3";
    let exp = expected(name);
    let (ids, mask) = (&exp["left_input_ids"], &exp["left_attention_mask"]);
    let f64_model = CausalLm::from_hf_dir(model_dir(name), DType::F64, &Device::Cpu).unwrap();
    let diff = max_diff_masked(&logits(&f64_model, ids, mask), &exp["left_logits"], mask);
    assert!(diff < 1e-4, "f64: {diff}");
    let bf16_model = CausalLm::from_hf_dir(model_dir(name), DType::BF16, &Device::Cpu).unwrap();
    let diff = max_diff_masked(&logits(&bf16_model, ids, mask), &exp["left_logits"], mask);
    assert!(diff < 0.5, "bf16: {diff}"); // logits reach ~15 in magnitude; bf16 keeps ~3 digits
}

#[test]
fn padding_does_not_change_real_tokens() {
    // The same sequence alone, right-padded and left-padded gives the same logits.
    let d = Device::Cpu;
    let model = CausalLm::from_hf_dir(model_dir("tiny-qwen2"), DType::F32, &d).unwrap();
    let seq = [5u32, 17, 200, 33];
    let alone = model
        .forward(&ForwardInput::new(Tensor::new(&[seq], &d).unwrap()), None)
        .unwrap();
    let right = model
        .forward_logits(
            &Tensor::new(&[[5u32, 17, 200, 33, 0, 0]], &d).unwrap(),
            Some(&Tensor::new(&[[1u32, 1, 1, 1, 0, 0]], &d).unwrap()),
        )
        .unwrap();
    let left = model
        .forward_logits(
            &Tensor::new(&[[0u32, 0, 5, 17, 200, 33]], &d).unwrap(),
            Some(&Tensor::new(&[[0u32, 0, 1, 1, 1, 1]], &d).unwrap()),
        )
        .unwrap();
    assert!(common::max_diff(&alone, &right.narrow(1, 0, 4).unwrap()) < 1e-5);
    assert!(common::max_diff(&alone, &left.narrow(1, 2, 4).unwrap()) < 1e-5);
    let all: Vec<f32> = left.flatten_all().unwrap().to_vec1().unwrap();
    assert!(
        all.iter().all(|x| x.is_finite()),
        "pad rows must stay finite"
    );
}
