//! Generation throughput of `generate_samples`: tokens per second at batch 1, 16 and 64 on
//! the tiny-qwen2 fixture and on a random ~3.7M-parameter Qwen2, with the KV cache and with
//! the no-cache baseline (`CacheMode::Recompute`), under 1 and 2 rayon threads.
//!
//! Run with `cargo bench -p atomrl-sample` (each thread count runs in a child process, since
//! rayon's pool is sized once per process). Prompts are 16 random tokens, 32 new tokens per
//! row, temperature 1, no stop ids (every row generates all 32 tokens).
//! `xtask/fixtures/bench_hf_generate.py` measures transformers' `generate` on the same setup.

use std::time::Instant;

use atomrl_model::{Architecture, CausalLm, ModelConfig};
use atomrl_sample::{generate_samples_with, CacheMode, SamplingParams};
use candle_core::{DType, Device};

const PROMPT_LEN: usize = 16;
const NEW_TOKENS: usize = 32;
const BATCHES: [usize; 3] = [1, 16, 64];
const CHILD: &str = "ATOMRL_BENCH_CHILD";

fn main() {
    if std::env::var_os(CHILD).is_some() {
        run();
        return;
    }
    let exe = std::env::current_exe().expect("current exe");
    println!("model      params  batch  threads  kv-cache tok/s  no-cache tok/s  speed-up");
    for threads in [1, 2] {
        let status = std::process::Command::new(&exe)
            .env(CHILD, "1")
            .env("RAYON_NUM_THREADS", threads.to_string())
            .status()
            .expect("spawn bench child");
        assert!(status.success(), "bench child failed");
    }
}

/// The ~3.7M-parameter model: vocab 2048, hidden 256, MLP 768, 4 layers, 4 heads, 2 KV heads.
fn random_4m() -> CausalLm {
    let config = ModelConfig::new(Architecture::Qwen2, 2048, 256, 768, 4, 4, 2).expect("config");
    CausalLm::from_config_random(config, 0, DType::F32, &Device::Cpu).expect("model")
}

fn prompts(batch: usize, vocab: usize) -> Vec<Vec<u32>> {
    let mut x = 12345u64;
    (0..batch)
        .map(|_| {
            (0..PROMPT_LEN)
                .map(|_| {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    3 + ((x >> 33) as usize % (vocab - 3)) as u32
                })
                .collect()
        })
        .collect()
}

/// Tokens per second of one configuration (repeated until at least 0.5 s was measured).
fn tokens_per_second(model: &CausalLm, batch: usize, mode: CacheMode) -> f64 {
    let prompts = prompts(batch, model.config().vocab_size);
    let params = SamplingParams {
        max_new_tokens: NEW_TOKENS,
        seed: 1,
        ..Default::default()
    };
    generate_samples_with(
        model,
        &prompts[..1],
        &SamplingParams {
            max_new_tokens: 2,
            ..params.clone()
        },
        None,
        mode,
    )
    .expect("warm-up");
    let (mut tokens, mut seconds) = (0usize, 0f64);
    while seconds < 0.5 {
        let start = Instant::now();
        let out = generate_samples_with(model, &prompts, &params, None, mode).expect("generate");
        seconds += start.elapsed().as_secs_f64();
        tokens += out.num_generated_tokens;
    }
    tokens as f64 / seconds
}

fn run() {
    let threads = std::env::var("RAYON_NUM_THREADS").unwrap_or_default();
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/fixtures/reference/models/tiny-qwen2"
    );
    let tiny = CausalLm::from_hf_dir(dir, DType::F32, &Device::Cpu).expect("tiny-qwen2");
    for (name, model) in [("tiny-qwen2", tiny), ("random-4M", random_4m())] {
        for batch in BATCHES {
            let cached = tokens_per_second(&model, batch, CacheMode::KvCache);
            let baseline = tokens_per_second(&model, batch, CacheMode::Recompute);
            println!(
                "{name:<10} {:>6.2}M {batch:>6} {threads:>8} {cached:>15.0} {baseline:>15.0} {:>9.1}x",
                model.num_parameters() as f64 / 1e6,
                cached / baseline
            );
        }
    }
}
