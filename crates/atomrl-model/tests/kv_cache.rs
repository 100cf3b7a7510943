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

/// Logits of a left-padded prefill of three rows, then decode steps in which rows finish and
/// the padding column all remaining rows share is dropped, as `BatchDecoder` runs them. With
/// `fresh`, each step gets a clone of the cache, which has no spare room (every append copies
/// the cache into a new buffer).
fn decode_with_retain(m: &CausalLm, fresh: bool) -> Vec<Tensor> {
    let d = Device::Cpu;
    let ids = Tensor::new(&[[0u32, 5, 6, 7], [3, 4, 5, 6], [0, 9, 10, 11]], &d).unwrap();
    let mask = Tensor::new(&[[0u32, 1, 1, 1], [1, 1, 1, 1], [0, 1, 1, 1]], &d).unwrap();
    let mut cache = m.new_kv_cache();
    let mut out = vec![m
        .forward(
            &ForwardInput::new(ids).with_attention_mask(mask.clone()),
            Some(&mut cache),
        )
        .unwrap()];
    // Each row's next position and attention mask.
    let mut rows: Vec<(u32, Vec<u32>)> = vec![
        (3, vec![0, 1, 1, 1]),
        (4, vec![1; 4]),
        (3, vec![0, 1, 1, 1]),
    ];
    for step in 0..40u32 {
        if step == 3 {
            // Row 1 (the only one without padding) finishes: the others share a pad column.
            cache = cache
                .index_select(&Tensor::new(&[0u32, 2], &d).unwrap())
                .unwrap();
            rows.remove(1);
            cache.drop_front(1).unwrap();
            rows.iter_mut().for_each(|(_, m)| {
                m.remove(0);
            });
        }
        if step == 20 {
            cache = cache
                .index_select(&Tensor::new(&[1u32], &d).unwrap())
                .unwrap();
            rows.remove(0);
        }
        let tokens: Vec<u32> = (0..rows.len() as u32)
            .map(|r| 12 + (step + r) % 20)
            .collect();
        let positions: Vec<u32> = rows.iter().map(|(p, _)| *p).collect();
        rows.iter_mut().for_each(|(p, m)| {
            *p += 1;
            m.push(1);
        });
        let mask: Vec<u32> = rows.iter().flat_map(|(_, m)| m.clone()).collect();
        let n = rows.len();
        let input = ForwardInput::new(Tensor::from_vec(tokens, (n, 1), &d).unwrap())
            .with_attention_mask(Tensor::from_vec(mask, (n, rows[0].1.len()), &d).unwrap())
            .with_position_ids(Tensor::from_vec(positions, (n, 1), &d).unwrap());
        if fresh {
            cache = cache.clone();
        }
        out.push(m.forward(&input, Some(&mut cache)).unwrap());
    }
    out
}

fn bits(t: &Tensor) -> Vec<u32> {
    let v: Vec<f32> = t.flatten_all().unwrap().to_vec1().unwrap();
    v.into_iter().map(f32::to_bits).collect()
}

#[test]
fn the_generation_view_decodes_as_the_detached_view() {
    // On the CPU the generation view multiplies by transposed copies of the weights: gemm
    // may sum in another order at these narrow widths, so the logits agree to float rounding.
    for name in ["tiny-qwen2", "tiny-qwen3", "tiny-llama"] {
        let m = CausalLm::from_hf_dir(model_dir(name), DType::F32, &Device::Cpu).unwrap();
        let plain = decode_with_retain(&m.detached(), false);
        let view = decode_with_retain(&m.generation_view(), false);
        assert_eq!(plain.len(), view.len());
        for (step, (a, b)) in plain.iter().zip(&view).enumerate() {
            let diff = max_diff(a, b);
            assert!(diff < 5e-5, "{name}, step {step}: {diff}"); // logits of magnitude ~10
        }
    }
}

#[test]
fn appends_after_dropped_rows_and_columns_equal_a_fresh_cache() {
    // In place (rows picked from the whole buffer, columns dropped from its front) against a
    // cache copied into a new buffer at every step.
    let m = CausalLm::from_hf_dir(model_dir("tiny-qwen2"), DType::F32, &Device::Cpu)
        .unwrap()
        .detached();
    let in_place = decode_with_retain(&m, false);
    let copied = decode_with_retain(&m, true);
    assert_eq!(in_place.len(), 41);
    assert_eq!(in_place[40].dims()[0], 1);
    for (step, (a, b)) in in_place.iter().zip(&copied).enumerate() {
        assert_eq!(bits(a), bits(b), "step {step}");
    }
    // The last row alone, from scratch: its prompt and the tokens it was fed (as row 2, 1
    // and 0 of the batch in turn).
    let mut ids = vec![9u32, 10, 11];
    ids.extend((0..40u32).map(|s| {
        let r = match s {
            0..3 => 2,
            3..20 => 1,
            _ => 0,
        };
        12 + (s + r) % 20
    }));
    let n = ids.len();
    let full = m
        .forward_logits(&Tensor::from_vec(ids, (1, n), &Device::Cpu).unwrap(), None)
        .unwrap();
    let last = full.narrow(1, n - 1, 1).unwrap();
    assert!(max_diff(&in_place[40], &last) < 5e-5);
}
