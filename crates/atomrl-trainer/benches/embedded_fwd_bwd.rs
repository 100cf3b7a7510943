//! Forward and forward+backward of `get_action_log_probs` for the embedded example's model shape
//! (Qwen2, hidden 128, 4 layers, 4 heads / 2 KV heads, intermediate 512, vocab 512: ~1M
//! parameters) at batch 64 x 72 tokens, the size of an SFT or GRPO micro-batch.
//!
//! The last line runs the same forward+backward split over two data-parallel workers (32 rows
//! each on its own thread, see `atomrl_trainer::parallel`): compare it with the line above
//! under `RAYON_NUM_THREADS=1` and `=2`.
//!
//! `cargo bench -p atomrl-trainer --bench embedded_fwd_bwd` (`ITERS`, `RAYON_NUM_THREADS`).
//! Run it through cargo (or call `runtime::tune_allocator`): the allocator settings in
//! `.cargo/config.toml` change its speed by ~1.7x.

#![allow(clippy::unwrap_used)]
use atomrl_model::{Architecture, CausalLm, ModelConfig};
use candle_core::{DType, Device, Tensor};
use std::time::Instant;
fn main() {
    atomrl_trainer::runtime::tune_allocator();
    let d = Device::Cpu;
    let cfg = ModelConfig::new(Architecture::Qwen2, 512, 128, 512, 4, 4, 2).unwrap();
    let model = CausalLm::from_config_random(cfg, 0, DType::F32, &d).unwrap();
    let (n, l) = (64usize, 72usize);
    let ids: Vec<u32> = (0..(n * l) as u32).map(|i| (i * 7919 + 13) % 512).collect();
    let ids = Tensor::from_vec(ids, (n, l), &d).unwrap();
    let mask = Tensor::ones((n, l), DType::F32, &d).unwrap();
    let iters: usize = std::env::var("ITERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let fwd_bwd = |rows: std::ops::Range<usize>| {
        let ids = ids.narrow(0, rows.start, rows.len()).unwrap();
        let mask = mask.narrow(0, rows.start, rows.len()).unwrap();
        let lp = atomrl_logprob::get_action_log_probs(&model, &ids, &mask, 36, 1.0, false)
            .unwrap()
            .log_probs;
        lp.sum_all().unwrap().backward().unwrap()
    };
    for mode in ["fwd", "fwd+bwd"] {
        let t = Instant::now();
        for _ in 0..iters {
            let lp = atomrl_logprob::get_action_log_probs(&model, &ids, &mask, 36, 1.0, false)
                .unwrap()
                .log_probs;
            let loss = lp.sum_all().unwrap();
            if mode == "fwd+bwd" {
                let _ = loss.backward().unwrap();
            } else {
                loss.to_scalar::<f32>().unwrap();
            }
        }
        println!(
            "{mode}: {:.1} ms",
            t.elapsed().as_secs_f64() * 1000.0 / iters as f64
        );
    }
    let t = Instant::now();
    for _ in 0..iters {
        let shards = atomrl_trainer::parallel::split_even(n, 2);
        atomrl_trainer::parallel::run_shards("bench", 2, |i| Ok(fwd_bwd(shards[i].clone())))
            .unwrap();
    }
    println!(
        "fwd+bwd, 2 workers: {:.1} ms",
        t.elapsed().as_secs_f64() * 1000.0 / iters as f64
    );
}
