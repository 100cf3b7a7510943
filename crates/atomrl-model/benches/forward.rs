//! Forward and forward+backward time of [`atomrl_model::CausalLm`] at batch 8 × 128, for the
//! tiny fixture configuration and a ~4M-parameter one (full fine-tuning and LoRA), with 1 and
//! 2 CPU threads.
//!
//! `cargo bench -p atomrl-model --bench forward` (the thread count is set per child process
//! through `RAYON_NUM_THREADS`, which candle's CPU kernels read; `BENCH_THREADS=1,2,4`
//! overrides the list).
#![allow(clippy::unwrap_used)]

use std::time::Instant;

use atomrl_model::{Architecture, CausalLm, ForwardInput, LoraConfig, ModelConfig};
use candle_core::{DType, Device, Tensor};

const CHILD: &str = "ATOMRL_BENCH_CHILD";

fn main() {
    if std::env::var_os(CHILD).is_none() {
        let threads = std::env::var("BENCH_THREADS").unwrap_or_else(|_| "1,2".into());
        let exe = std::env::current_exe().unwrap();
        println!("batch 8 x 128, f32, CPU; ms per call (median)");
        println!(
            "{:<28} {:>7} {:>10} {:>14}",
            "model", "threads", "forward", "fwd+backward"
        );
        for t in threads.split(',') {
            let status = std::process::Command::new(&exe)
                .env(CHILD, "1")
                .env("RAYON_NUM_THREADS", t.trim())
                .status()
                .unwrap();
            assert!(status.success());
        }
        return;
    }
    let threads = std::env::var("RAYON_NUM_THREADS").unwrap_or_default();
    let d = Device::Cpu;
    let tiny = ModelConfig::new(Architecture::Qwen2, 512, 64, 128, 2, 4, 2).unwrap();
    let medium = ModelConfig::new(Architecture::Qwen2, 4096, 256, 688, 4, 4, 2).unwrap();
    let runs: [(&str, &ModelConfig, bool, usize); 3] = [
        ("tiny", &tiny, false, 10),
        ("4M", &medium, false, 3),
        ("4M + LoRA r=8 all-linear", &medium, true, 3),
    ];
    for (name, config, lora, iters) in runs {
        let mut model = CausalLm::from_config_random(config.clone(), 0, DType::F32, &d).unwrap();
        if lora {
            let cfg = LoraConfig::new(8, 16.0)
                .with_targets(&["all-linear"])
                .unwrap();
            model.add_lora(cfg, 0).unwrap();
        }
        let v = config.vocab_size as u32;
        let ids: Vec<u32> = (0..8 * 128u32).map(|i| (i * 7919 + 13) % v).collect();
        let ids = Tensor::from_vec(ids, (8, 128), &d).unwrap();
        let targets = ids.narrow(1, 1, 127).unwrap().flatten_all().unwrap();
        let input = ForwardInput::new(ids);
        let fwd = time(iters, || {
            let logits = model.forward(&input, None).unwrap();
            logits.sum_all().unwrap().to_scalar::<f32>().unwrap();
        });
        let fwd_bwd = time(iters, || {
            let logits = model.forward(&input, None).unwrap();
            let logits = logits
                .narrow(1, 0, 127)
                .unwrap()
                .reshape((8 * 127, config.vocab_size))
                .unwrap();
            let loss = candle_nn::loss::cross_entropy(&logits, &targets).unwrap();
            let grads = loss.backward().unwrap();
            assert!(grads.get(model.trainable_vars()[0].as_tensor()).is_some());
        });
        let label = format!("{name} ({:.2}M)", config.num_parameters() as f64 / 1e6);
        println!("{label:<28} {threads:>7} {fwd:>10.1} {fwd_bwd:>14.1}");
    }
}

/// Median milliseconds of `iters` calls after one warm-up call.
fn time(iters: usize, mut f: impl FnMut()) -> f64 {
    f();
    let mut ms: Vec<f64> = (0..iters)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    ms.sort_by(f64::total_cmp);
    ms[ms.len() / 2]
}
