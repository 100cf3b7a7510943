//! Where a decode step's time goes, kernel by kernel: each op of a decoder layer at the decode
//! shapes, timed alone. On CUDA each op is captured `reps` times into one CUDA graph and the
//! graph replayed, as a static decode step replays it, so the figure is the op's GPU time in a
//! graph (its launch included), not candle's host cost; elsewhere the op runs `reps` times in a
//! loop. The sum over a layer's ops against `xtask bench`'s per-layer cost of a step says
//! whether the time is in the kernels or between them.

use std::time::Instant;

use atomrl_core::{CandleContext, Result};
use candle_core::{DType, Device, Tensor};

use crate::input::MASK_VALUE;
use crate::kernels::KeyMask;
use crate::ModelConfig;

/// One op's time: its name (with its shape) and microseconds per call.
pub type OpTime = (String, f64);

/// Times each op of one decoder layer of `config` decoding `rows` rows over a cache of `cap`
/// columns, in `dtype` on `device` (random values: the time does not depend on them), plus the
/// LM head; `reps` calls per op (at least 1).
///
/// # Errors
/// A tensor failure on the device, or a failed capture on CUDA.
///
/// ```
/// use atomrl_model::{static_decode_op_times, Architecture, ModelConfig};
/// use candle_core::{DType, Device};
/// let c = ModelConfig::new(Architecture::Qwen2, 64, 32, 64, 1, 4, 2)?;
/// let times = static_decode_op_times(&c, 2, 16, DType::F32, &Device::Cpu, 3)?;
/// assert!(times.iter().any(|(name, us)| name.starts_with("rms_norm") && *us > 0.0));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn static_decode_op_times(
    config: &ModelConfig,
    rows: usize,
    cap: usize,
    dtype: DType,
    device: &Device,
    reps: usize,
) -> Result<Vec<OpTime>> {
    let func = "static_decode_op_times";
    let c = config;
    let (h, kv, d) = (c.num_attention_heads, c.num_key_value_heads, c.head_dim);
    let (hid, inter) = (c.hidden_size, c.intermediate_size);
    let rand = |dims: &[usize]| -> Result<Tensor> {
        Tensor::randn(0f32, 0.05, dims, device)
            .and_then(|t| t.to_dtype(dtype))
            .ctx(func)
    };
    let x = rand(&[rows, hid])?;
    let norm_w = rand(&[hid])?;
    let wq = rand(&[h * d, hid])?;
    let wk = rand(&[kv * d, hid])?;
    let wo = rand(&[hid, h * d])?;
    let wg = rand(&[inter, hid])?;
    let wqkv = rand(&[(h + 2 * kv) * d, hid])?;
    let wgu = rand(&[2 * inter, hid])?;
    let wg_in_out = rand(&[hid, inter])?;
    let one = rand(&[1, 1])?;
    let wd = rand(&[hid, inter])?;
    let head = rand(&[c.vocab_size, hid])?;
    let attn_out = rand(&[rows, h * d])?;
    let g = rand(&[rows, inter])?;
    let u = rand(&[rows, inter])?;
    let gu = rand(&[rows, 2 * inter])?;
    let q = rand(&[rows, kv, h / kv, d])?;
    let kc = rand(&[rows, kv, cap, d])?;
    let vc = rand(&[rows, kv, cap, d])?;
    let scores = rand(&[rows, h, 1, cap])?;
    let probs = rand(&[rows, kv, h / kv, cap])?;
    let mask = KeyMask {
        causal: false,
        past: 0,
        pad: device
            .is_cpu()
            .then(|| std::sync::Arc::new(vec![false; rows * cap])),
        mask_value: MASK_VALUE,
        pad_bias: (!device.is_cpu())
            .then(|| Tensor::zeros((rows, 1, 1, cap), dtype, device))
            .transpose()
            .ctx(func)?,
    };
    let eps = c.rms_norm_eps;
    type Op<'a> = Box<dyn Fn() -> candle_core::Result<Tensor> + 'a>;
    let mut ops: Vec<(String, Op<'_>)> = vec![
        (
            format!("rms_norm [{rows}, {hid}]"),
            Box::new(|| crate::ops::rms_norm(&x, &norm_w, eps, true)),
        ),
        (
            format!("rms_norm, candle's kernel [{rows}, {hid}]"),
            Box::new(|| candle_nn::ops::rms_norm(&x, &norm_w, eps as f32)),
        ),
        (
            format!("residual add + rms_norm [{rows}, {hid}]"),
            Box::new(|| Ok(crate::kernels::add_rms_norm(&x, &x, &norm_w, eps, true)?.1)),
        ),
        (
            format!("swiglu of merged gate+up [{rows}, {}]", 2 * inter),
            Box::new(|| crate::kernels::swiglu_packed(&gu)),
        ),
        (
            format!("matmul q/o [{rows}, {hid}] x [{hid}, {}]", h * d),
            Box::new(|| x.matmul(&wq.t()?)),
        ),
        (
            format!("matmul k/v [{rows}, {hid}] x [{hid}, {}]", kv * d),
            Box::new(|| x.matmul(&wk.t()?)),
        ),
        (
            format!("matmul o [{rows}, {}] x [{}, {hid}]", h * d, h * d),
            Box::new(|| attn_out.matmul(&wo.t()?)),
        ),
        (
            format!("matmul gate/up [{rows}, {hid}] x [{hid}, {inter}]"),
            Box::new(|| x.matmul(&wg.t()?)),
        ),
        (
            format!(
                "matmul q+k+v merged [{rows}, {hid}] x [{hid}, {}]",
                (h + 2 * kv) * d
            ),
            Box::new(|| x.matmul(&wqkv.t()?)),
        ),
        (
            format!(
                "matmul gate+up merged [{rows}, {hid}] x [{hid}, {}]",
                2 * inter
            ),
            Box::new(|| x.matmul(&wgu.t()?)),
        ),
        (
            format!("matmul gate/up, weight stored [in, out] [{rows}, {hid}] x [{hid}, {inter}]"),
            Box::new(|| x.matmul(&wg_in_out)),
        ),
        (
            // The floor of one node in a graph: what any kernel costs, however small.
            "add [1, 1] (a graph node's floor)".to_string(),
            Box::new(|| &one + &one),
        ),
        (
            format!("matmul down [{rows}, {inter}] x [{inter}, {hid}]"),
            Box::new(|| g.matmul(&wd.t()?)),
        ),
        (
            format!("swiglu [{rows}, {inter}]"),
            Box::new(|| {
                if crate::kernels::fused_on(&g) {
                    crate::kernels::swiglu(&g, &u)
                } else {
                    g.silu()? * &u
                }
            }),
        ),
        (
            format!("residual add [{rows}, {hid}]"),
            Box::new(|| &x + &x),
        ),
        (
            format!(
                "attention scores [{rows}, {kv}, {}, {d}] x kᵀ (cap {cap})",
                h / kv
            ),
            Box::new(|| q.matmul(&kc.t()?)),
        ),
        (
            format!("attention softmax [{rows}, {h}, 1, {cap}]"),
            Box::new(|| {
                if crate::kernels::fused_on(&scores) {
                    crate::kernels::attention_softmax(&scores, 1.0, &mask)
                } else {
                    crate::ops::softmax_last(&scores, true)
                }
            }),
        ),
        (
            format!("attention values [{rows}, {kv}, {}, {cap}] x v", h / kv),
            Box::new(|| probs.matmul(&vc)),
        ),
        (
            format!("lm head [{rows}, {hid}] x [{hid}, {}]", c.vocab_size),
            Box::new(|| x.matmul(&head.t()?)),
        ),
        (
            format!("matmul gate/up as (W · xᵀ)ᵀ [{inter}, {hid}] x [{hid}, {rows}]"),
            Box::new(|| crate::linear::transposed_copy(&wg.matmul(&x.t()?)?)),
        ),
        (
            format!("matmul down as (W · gᵀ)ᵀ [{hid}, {inter}] x [{inter}, {rows}]"),
            Box::new(|| crate::linear::transposed_copy(&wd.matmul(&g.t()?)?)),
        ),
        (
            format!(
                "lm head as (W · xᵀ)ᵀ [{}, {hid}] x [{hid}, {rows}]",
                c.vocab_size
            ),
            Box::new(|| crate::linear::transposed_copy(&head.matmul(&x.t()?)?)),
        ),
    ];
    if crate::kernels::splits_rows(&x, &head) {
        ops.push((
            format!("matmul gate/up, rows split over threads [1, {hid}] x [{hid}, {inter}]"),
            Box::new(|| split_product(&x, &wg)),
        ));
        ops.push((
            format!("matmul down, rows split over threads [1, {inter}] x [{inter}, {hid}]"),
            Box::new(|| split_product(&g, &wd)),
        ));
        ops.push((
            format!(
                "lm head, rows split over threads [1, {hid}] x [{hid}, {}]",
                c.vocab_size
            ),
            Box::new(|| split_product(&x, &head)),
        ));
    }
    let reps = reps.max(1);
    let mut out = Vec::with_capacity(ops.len());
    for (name, op) in ops {
        let us = time_op(device, reps, &op).ctx(func)?;
        out.push((name, us));
    }
    Ok(out)
}

/// `a [1, in] · Wᵀ` as [`crate::linear::Linear`] computes one row on several CPU threads.
fn split_product(a: &Tensor, w: &Tensor) -> candle_core::Result<Tensor> {
    match crate::kernels::row_split_gemv(a, w)? {
        Some(y) => Ok(y),
        None => a.matmul(&w.t()?),
    }
}

/// Microseconds per call of `op`: on CUDA, a graph of `reps` calls replayed (after one warm
/// replay); elsewhere `reps` calls in a loop (after one warm call).
fn time_op(
    device: &Device,
    reps: usize,
    op: &dyn Fn() -> candle_core::Result<Tensor>,
) -> candle_core::Result<f64> {
    op()?;
    device.synchronize()?;
    #[cfg(feature = "cuda")]
    if device.is_cuda() {
        let graph = super::with_htod_cache(device, || {
            op()?;
            super::cuda::Graph::capture(device, || {
                for _ in 0..reps {
                    drop(op()?);
                }
                Ok(())
            })
        })?;
        graph.replay()?;
        device.synchronize()?;
        let t = Instant::now();
        graph.replay()?;
        device.synchronize()?;
        return Ok(t.elapsed().as_secs_f64() * 1e6 / reps as f64);
    }
    let t = Instant::now();
    for _ in 0..reps {
        drop(op()?);
    }
    device.synchronize()?;
    Ok(t.elapsed().as_secs_f64() * 1e6 / reps as f64)
}
