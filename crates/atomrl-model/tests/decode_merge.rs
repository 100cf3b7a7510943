//! The static decode step with its merges (q/k/v and gate/up as one matmul each, each residual
//! add fused with the RMSNorm after it) against the same step with them off
//! (`ATOMRL_DECODE_MERGE=0`). Its own test binary: the switch is process-wide.
#![allow(clippy::unwrap_used)]

mod common;

use atomrl_core::device::set_decode_merge;
use atomrl_model::{CausalLm, ForwardInput, StaticDecode};
use candle_core::{DType, Device, Tensor};

/// Logits of a left-padded prefill continued by four static steps, every step's rows stacked.
fn static_logits(view: &CausalLm) -> Tensor {
    let ids = Tensor::new(&[[3u32, 5, 6], [0, 1, 7], [0, 0, 9]], &Device::Cpu).unwrap();
    let mask = Tensor::new(&[[1u32, 1, 1], [0, 1, 1], [0, 0, 1]], &Device::Cpu).unwrap();
    let mut cache = view.new_kv_cache();
    view.forward(
        &ForwardInput::new(ids).with_attention_mask(mask),
        Some(&mut cache),
    )
    .unwrap();
    let mut dec = StaticDecode::new(view, &cache, &[0, 1, 2], 8).unwrap();
    let steps: Vec<Tensor> = (0..4u32)
        .map(|s| {
            let tokens = [10 + s, 20 + s, 30 + s];
            let positions = [3 + s, 2 + s, 1 + s];
            dec.step(&tokens, &positions).unwrap()
        })
        .collect();
    Tensor::cat(&steps, 0).unwrap()
}

#[test]
fn merged_and_apart_steps_agree_on_every_reference_model() {
    // tiny-qwen2: q/k/v with biases merge; tiny-qwen3: per-head q/k norms keep q/k/v apart,
    // gate/up merge.
    for name in ["tiny-qwen2", "tiny-qwen3"] {
        let dir = common::reference_model(name);
        let m = CausalLm::from_hf_dir(dir, DType::F32, &Device::Cpu).unwrap();
        let view = m.generation_view();
        set_decode_merge(Some(true));
        let merged = static_logits(&view);
        set_decode_merge(Some(false));
        let apart = static_logits(&view);
        set_decode_merge(None);
        let diff = common::max_diff(&merged, &apart);
        let scale = common::max_diff(&apart, &apart.zeros_like().unwrap());
        assert!(
            diff <= 1e-5 * scale.max(1.0),
            "{name}: {diff} (scale {scale})"
        );
        assert_eq!(merged.dims(), &[12, m.config().vocab_size]);
    }
}
