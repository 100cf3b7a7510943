//! Incremental decoding with the caller-owned KV cache equals a full forward, for left-padded
//! batches, and rows can be dropped from the running batch.
#![allow(clippy::unwrap_used)]

mod common;

use atomrl_model::{CausalLm, ForwardInput};
use candle_core::{DType, Device, Tensor};
use common::{max_diff, model_dir};

#[test]
fn cached_decode_equals_full_forward_with_left_padding() {
    let d = Device::Cpu;
    for name in ["tiny-qwen2", "tiny-qwen3", "tiny-llama"] {
        let m = CausalLm::from_hf_dir(model_dir(name), DType::F32, &d)
            .unwrap()
            .detached();
        let full_ids =
            Tensor::new(&[[0u32, 0, 5, 6, 7, 8, 9], [3, 4, 5, 6, 10, 11, 12]], &d).unwrap();
        let full_mask =
            Tensor::new(&[[0u32, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]], &d).unwrap();
        let full = m.forward_logits(&full_ids, Some(&full_mask)).unwrap();
        let mut cache = m.new_kv_cache();
        let prompt = ForwardInput::new(full_ids.narrow(1, 0, 4).unwrap())
            .with_attention_mask(full_mask.narrow(1, 0, 4).unwrap());
        let first = m.forward(&prompt, Some(&mut cache)).unwrap();
        assert!(
            max_diff(
                &first.narrow(1, 2, 2).unwrap().get(0).unwrap(),
                &full.narrow(1, 2, 2).unwrap().get(0).unwrap()
            ) < 5e-5
        );
        for t in 4..7 {
            let step = ForwardInput::new(full_ids.narrow(1, t, 1).unwrap())
                .with_attention_mask(full_mask.narrow(1, 0, t + 1).unwrap());
            let logits = m.forward(&step, Some(&mut cache)).unwrap();
            let diff = max_diff(&logits, &full.narrow(1, t, 1).unwrap());
            assert!(diff < 5e-5, "{name} step {t}: {diff}"); // f32 noise on logits of magnitude ~10
            assert!(!logits.track_op(), "the detached view keeps no graph");
        }
        assert_eq!(cache.seq_len(), 7);
        // Drop row 0; row 1 continues alone with explicit positions.
        let mut kept = cache
            .index_select(&Tensor::new(&[1u32], &d).unwrap())
            .unwrap();
        let step = ForwardInput::new(Tensor::new(&[[13u32]], &d).unwrap())
            .with_position_ids(Tensor::new(&[[7u32]], &d).unwrap());
        let logits = m.forward(&step, Some(&mut kept)).unwrap();
        let ids8 = Tensor::cat(
            &[full_ids.get(1).unwrap(), Tensor::new(&[13u32], &d).unwrap()],
            0,
        )
        .unwrap()
        .unsqueeze(0)
        .unwrap();
        let reference = m
            .forward_logits(&ids8, None)
            .unwrap()
            .narrow(1, 7, 1)
            .unwrap();
        assert!(max_diff(&logits, &reference) < 5e-5);
        let e = m.forward(&step, Some(&mut cache)).unwrap_err().to_string();
        assert!(e.contains("cache"), "{e}");
    }
}
