//! `cargo xtask bench --train-matmuls`: each matrix product of one decoder layer's training
//! step, timed alone at one micro-batch's rows, through the kernel candle's f32 CPU matmuls
//! use now (gemm, or the CBLAS library of `ATOMRL_CBLAS`: `atomrl_core::cblas`).
//!
//! Run it with and without `ATOMRL_CBLAS` to see whether a BLAS library serves a CPU better
//! than gemm, shape by shape (docs/performance.md, item 16). The layouts are the ones the
//! model's forward and the vendored backward produce: `x · Wᵀ` forward, `dY · W` for the
//! input's gradient, `dYᵀ · x` for the weight's, and grouped-query attention's batched
//! `q · kᵀ` and `p · v`.

use std::time::Instant;

use anyhow::Result;
use atomrl_model::ModelConfig;
use candle_core::{DType, Device, Tensor};

/// One product's best time over a few repetitions.
#[derive(Debug, Clone)]
pub struct MatmulTime {
    /// The product, e.g. `down x · Wᵀ`.
    pub name: String,
    /// `[b, m, k] · [b, k, n]` as `(b, m, k, n)`.
    pub dims: (usize, usize, usize, usize),
    /// Best milliseconds per call.
    pub ms: f64,
}

impl MatmulTime {
    /// Multiply-adds times two, per second, in billions.
    pub fn gflops(&self) -> f64 {
        let (b, m, k, n) = self.dims;
        2.0 * (b * m * k * n) as f64 / (self.ms * 1e6)
    }
}

/// Each product of one decoder layer of `config` in training, for a micro-batch of
/// `micro_batch` rows of `seq` tokens, in `dtype` on `device`. Products that a layer runs
/// more than once (q and o, k and v, gate and up) are listed once with `×2` in the name.
pub fn train_matmul_times(
    config: &ModelConfig,
    micro_batch: usize,
    seq: usize,
    dtype: DType,
    device: &Device,
) -> Result<Vec<MatmulTime>> {
    let rows = micro_batch * seq;
    let (h, d) = (config.hidden_size, config.head_dim);
    let q_out = config.num_attention_heads * d;
    let kv_out = config.num_key_value_heads * d;
    let projections = [
        ("q/o ×2", h, q_out),
        ("k/v ×2", h, kv_out),
        ("gate/up ×2", h, config.intermediate_size),
        ("down", config.intermediate_size, h),
    ];
    let randn = |dims: &[usize]| -> Result<Tensor> {
        Ok(Tensor::randn(0f32, 1.0, dims, device)?.to_dtype(dtype)?)
    };
    let mut times = Vec::new();
    for (name, input, output) in projections {
        let x = randn(&[rows, input])?;
        let w = randn(&[output, input])?;
        let dy = randn(&[rows, output])?;
        times.push(time(
            format!("{name} x · Wᵀ"),
            (1, rows, input, output),
            || x.matmul(&w.t()?),
        )?);
        times.push(time(
            format!("{name} dY · W"),
            (1, rows, output, input),
            || dy.matmul(&w),
        )?);
        times.push(time(
            format!("{name} dYᵀ · x"),
            (1, output, rows, input),
            || dy.t()?.matmul(&x),
        )?);
    }
    // Grouped-query attention as the model computes it: the query heads of a group stacked
    // into the rows of one product against their shared keys (`grouped_attention`).
    let kv = config.num_key_value_heads;
    let grouped = config.num_attention_heads / kv * seq;
    let q = randn(&[micro_batch, kv, grouped, d])?;
    let k = randn(&[micro_batch, kv, seq, d])?;
    let p = randn(&[micro_batch, kv, grouped, seq])?;
    let batch = micro_batch * kv;
    times.push(time(
        "attention q · kᵀ".into(),
        (batch, grouped, d, seq),
        || q.matmul(&k.t()?),
    )?);
    times.push(time(
        "attention p · v".into(),
        (batch, grouped, seq, d),
        || p.matmul(&k),
    )?);
    Ok(times)
}

/// The best time of `f` over five rounds of enough calls for ~0.2 s of work each, after one
/// warm-up call; the device is synchronised around each round.
fn time(
    name: String,
    dims: (usize, usize, usize, usize),
    f: impl Fn() -> candle_core::Result<Tensor>,
) -> Result<MatmulTime> {
    let (b, m, k, n) = dims;
    let first = f()?;
    let device = first.device().clone();
    device.synchronize()?;
    // ~0.2 s a round at 100 GFLOPS.
    let reps = ((2e10 / (2.0 * (b * m * k * n) as f64)) as usize).clamp(1, 200);
    let mut best = f64::MAX;
    for _ in 0..5 {
        let start = Instant::now();
        for _ in 0..reps {
            drop(f()?);
        }
        device.synchronize()?;
        best = best.min(start.elapsed().as_secs_f64() / reps as f64);
    }
    Ok(MatmulTime {
        name,
        dims,
        ms: best * 1e3,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_product_of_a_tiny_layer_is_timed() {
        let config = crate::bench::shape_config("tiny").expect("tiny");
        let times = train_matmul_times(&config, 1, 8, DType::F32, &Device::Cpu).expect("times");
        assert_eq!(times.len(), 14);
        assert!(times.iter().all(|t| t.ms > 0.0 && t.gflops().is_finite()));
        assert_eq!(times[0].dims, (1, 8, 64, 4 * 16));
    }
}
