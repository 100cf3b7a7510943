//! The static decode step against the cached decoding of `CausalLm::forward`.

use super::*;
use crate::kernels::testing::max_diff;
use crate::{ForwardInput, ModelConfig};
use candle_core::Device;

fn model(name: &str) -> CausalLm {
    let dir = format!(
        "{}/../../tests/fixtures/reference/models/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    CausalLm::from_hf_dir(dir, DType::F32, &Device::Cpu).unwrap()
}

/// Left-padded prompts → (eager cache, pads, width).
fn prefill(m: &CausalLm, prompts: &[Vec<u32>]) -> (KvCache, Vec<usize>, usize) {
    let w = prompts.iter().map(Vec::len).max().unwrap();
    let pads: Vec<usize> = prompts.iter().map(|p| w - p.len()).collect();
    let mut ids = Vec::new();
    let mut mask = Vec::new();
    for (p, &pad) in prompts.iter().zip(&pads) {
        ids.extend(std::iter::repeat_n(0u32, pad).chain(p.iter().copied()));
        mask.extend((0..w).map(|j| u32::from(j >= pad)));
    }
    let n = prompts.len();
    let ids = Tensor::from_vec(ids, (n, w), &Device::Cpu).unwrap();
    let mask = Tensor::from_vec(mask, (n, w), &Device::Cpu).unwrap();
    let mut cache = m.new_kv_cache();
    m.forward(
        &ForwardInput::new(ids).with_attention_mask(mask),
        Some(&mut cache),
    )
    .unwrap();
    (cache, pads, w)
}

/// One eager cached step of every row: tokens at positions `lens`, mask from `pads`.
fn eager_step(
    m: &CausalLm,
    cache: &mut KvCache,
    tokens: &[u32],
    lens: &[u32],
    pads: &[usize],
    width: usize,
) -> Tensor {
    let n = tokens.len();
    let ids = Tensor::from_vec(tokens.to_vec(), (n, 1), &Device::Cpu).unwrap();
    let pos = Tensor::from_vec(lens.to_vec(), (n, 1), &Device::Cpu).unwrap();
    let mask: Vec<u32> = pads
        .iter()
        .flat_map(|&p| (0..width + 1).map(move |j| u32::from(j >= p)))
        .collect();
    let mask = Tensor::from_vec(mask, (n, width + 1), &Device::Cpu).unwrap();
    let input = ForwardInput::new(ids)
        .with_position_ids(pos)
        .with_attention_mask(mask);
    m.forward(&input, Some(cache)).unwrap().squeeze(1).unwrap()
}

#[test]
fn steps_equal_cached_decoding_with_padding_growth_and_row_selection() {
    for name in ["tiny-qwen2", "tiny-qwen3"] {
        let m = model(name).generation_view();
        let prompts = vec![vec![1u32, 5, 6, 7], vec![2, 9], vec![3, 4, 8]];
        let (mut cache, pads, width) = prefill(&m, &prompts);
        let mut dec = StaticDecode::new(&m, &cache, &pads, width + 2).unwrap();
        let mut lens: Vec<u32> = prompts.iter().map(|p| p.len() as u32).collect();
        let mut w = width;
        for step in 0..5u32 {
            if dec.width() == dec.capacity() {
                dec = dec.with_capacity(&m, dec.capacity() + 3).unwrap();
            }
            let tokens: Vec<u32> = (0..3).map(|r| 10 + 7 * step + r).collect();
            let a = dec.step(&tokens, &lens).unwrap();
            let b = eager_step(&m, &mut cache, &tokens, &lens, &pads, w);
            let d = max_diff(&a, &b);
            assert!(d < 1e-4, "{name} step {step}: logits differ by {d}");
            lens.iter_mut().for_each(|l| *l += 1);
            w += 1;
        }
        // Rows 2 and 0 only, in that order: the same as the eager cache's rows.
        let roomy = dec.with_capacity(&m, dec.capacity() + 1).unwrap();
        let mut two = roomy.select_rows(&m, &[2, 0]).unwrap();
        let idx = Tensor::new(&[2u32, 0], &Device::Cpu).unwrap();
        let mut cache2 = cache.index_select(&idx).unwrap();
        let pads2 = [pads[2], pads[0]];
        let lens2 = [lens[2], lens[0]];
        let a = two.step(&[40, 41], &lens2).unwrap();
        let b = eager_step(&m, &mut cache2, &[40, 41], &lens2, &pads2, w);
        assert!(max_diff(&a, &b) < 1e-4, "{name}: selected rows differ");
    }
}

#[test]
fn biases_and_a_lora_adapter_give_the_same_logits() {
    // Qwen2 with q/k/v biases, and a LoRA adapter whose B is not zero: the biases are added
    // before the adapter's output, as in `Linear::forward`.
    let mut c = ModelConfig::new(crate::Architecture::Qwen2, 32, 16, 32, 2, 4, 2).unwrap();
    c.qkv_bias = true;
    let mut m = CausalLm::from_config_random(c, 3, DType::F32, &Device::Cpu).unwrap();
    m.add_lora(crate::LoraConfig::new(4, 8.0), 1).unwrap();
    for (i, v) in m.trainable_vars().iter().enumerate() {
        let t = Tensor::randn(0f32, 0.3, v.shape(), &Device::Cpu).unwrap();
        v.set(&t).unwrap();
        assert!(i < 1000);
    }
    let m = m.generation_view();
    let (mut cache, pads, width) = prefill(&m, &[vec![1, 2, 3], vec![4]]);
    let mut dec = StaticDecode::new(&m, &cache, &pads, 8).unwrap();
    let a = dec.step(&[5, 6], &[3, 1]).unwrap();
    let b = eager_step(&m, &mut cache, &[5, 6], &[3, 1], &pads, width);
    assert!(max_diff(&a, &b) < 1e-4);
}

#[test]
fn bad_input_is_named() {
    let m = model("tiny-qwen2").generation_view();
    let (cache, pads, width) = prefill(&m, &[vec![1, 2], vec![3]]);
    let err = |r: Result<StaticDecode>| r.unwrap_err().to_string();
    assert!(err(StaticDecode::new(&m, &cache, &pads, width)).contains("capacity"));
    assert!(err(StaticDecode::new(&m, &cache, &[0], 4)).contains("starts"));
    assert!(err(StaticDecode::new(&m, &m.new_kv_cache(), &pads, 4)).contains("cache"));
    let mut dec = StaticDecode::new(&m, &cache, &pads, width + 1).unwrap();
    let e = dec.step(&[1], &[2, 1]).unwrap_err().to_string();
    assert!(e.contains("tokens") && e.contains("2 entries"), "{e}");
    let e = dec.step(&[1, 512], &[2, 1]).unwrap_err().to_string();
    assert!(e.contains("tokens[1]"), "{e}");
    let e = dec.step(&[1, 2], &[2, 9]).unwrap_err().to_string();
    assert!(e.contains("positions[1]"), "{e}");
    dec.step(&[1, 2], &[2, 1]).unwrap();
    let e = dec.step(&[1, 2], &[2, 1]).unwrap_err().to_string();
    assert!(e.contains("capacity"), "{e}");
    assert!(err(dec.select_rows(&m, &[2])).contains("rows"));
    assert!(err(dec.with_capacity(&m, 2)).contains("capacity"));
}
