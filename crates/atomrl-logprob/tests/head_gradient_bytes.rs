//! From `FUSED_HEAD_MIN_VOCAB` tokens on, the LM head's weight gradient is summed over the
//! chunks of rows in one `[V, H]` buffer (docs/performance.md, item 15). Returned per chunk and
//! added by the graph, each chunk cost two such buffers; this test fails if that comes back.
#![allow(clippy::unwrap_used)]

use atomrl_core::profile::{self, CountingAllocator};
use atomrl_logprob::{get_action_log_probs_chunked, FUSED_HEAD_MIN_VOCAB};
use atomrl_model::{Architecture, CausalLm, ModelConfig};
use candle_core::{DType, Device, Tensor};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

#[test]
fn the_head_weight_gradient_is_one_buffer_whatever_the_chunks() {
    let (vocab, hidden) = (FUSED_HEAD_MIN_VOCAB + 1_000, 256);
    let mut c = ModelConfig::new(Architecture::Qwen2, vocab, hidden, 512, 1, 4, 2).unwrap();
    c.tie_word_embeddings = true;
    let m = CausalLm::from_config_random(c, 7, DType::F32, &Device::Cpu).unwrap();
    let ids: Vec<u32> = (0..48u32)
        .map(|i| 1 + (i * 7_919) % (vocab as u32 - 1))
        .collect();
    let ids = Tensor::from_vec(ids, (2, 24), &Device::Cpu).unwrap();
    let mask = Tensor::ones((2, 24), DType::F32, &Device::Cpu).unwrap();
    let head_bytes = (vocab * hidden * 4) as f64;
    // 2 × 12 scored rows in chunks of 2: twelve chunks.
    let out = get_action_log_probs_chunked(&m, &ids, &mask, 12, 1.0, true, 2 * vocab).unwrap();
    let loss =
        (out.log_probs.sum_all().unwrap() + out.entropy.unwrap().sum_all().unwrap()).unwrap();
    profile::enable(true);
    let before = profile::alloc_counts();
    let grads = loss.backward().unwrap();
    let used = profile::alloc_counts().since(before);
    profile::enable(false);
    let head = grads.get(&m.lm_head_weight().unwrap()).unwrap();
    assert_eq!(head.dims(), [vocab, hidden]);
    // The head's sum, the tied embedding's copy of it (candle's out-of-place `index_add`) and
    // the chunks' `[2, V]` temporaries (~1.4 heads here): 3.4 heads when recorded. Twelve
    // chunks' products and sums were 24 more.
    let heads = used.bytes as f64 / head_bytes;
    assert!(
        heads < 5.0,
        "backward allocated {} bytes, {heads:.2} × the [{vocab}, {hidden}] head",
        used.bytes
    );
}
