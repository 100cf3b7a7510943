//! Differentiable building blocks: RMSNorm, softmax, rotary embeddings, grouped-query heads.
//!
//! Candle's fused `rms_norm` and `softmax_last_dim` kernels have no backward, so the model
//! uses forms written from tensor ops that all backpropagate. Generation views
//! ([`CausalLm::generation_view`](crate::CausalLm::generation_view)) ask for the fused kernels
//! (`fused = true`, on a GPU): one kernel instead of five to seven, where each op is a
//! launch. Scoring passes (old and reference
//! log-probs) keep the tensor-op forms, so that they compute exactly what the training forward
//! computes (an importance ratio of exactly 1 before an update, a KL of exactly 0 to an equal
//! reference), as verl and TRL recompute log-probs with the training engine rather than the
//! rollout engine.

use candle_core::{DType, Result, Tensor, D};

/// Whether no tensor of `ts` is on a backward graph (a forward-only kernel would cut it).
fn no_graph(ts: &[&Tensor]) -> bool {
    ts.iter().all(|t| !t.track_op())
}

/// `x / sqrt(mean(x², -1) + eps) * w`, computed in f32 for half-precision inputs (as
/// transformers does); candle's kernel when `fused` and nothing needs a gradient.
pub(crate) fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64, fused: bool) -> Result<Tensor> {
    let dtype = x.dtype();
    let kernel_dtype = matches!(dtype, DType::F32 | DType::BF16 | DType::F16);
    if fused && no_graph(&[x, weight]) && kernel_dtype {
        // On CUDA AtomRL's kernel, with candle's rounding: candle's own takes 11 µs for a
        // [64, 896] decode step where AtomRL's takes 3 (`xtask bench --decode-ops`,
        // docs/cuda.md).
        if x.device().is_cuda() && crate::kernels::fused_on(x) && weight.dtype() == dtype {
            return crate::kernels::rms_norm_rounding_once(x, weight, eps);
        }
        // The kernel sums the squares in f32 for every dtype, as below.
        return candle_nn::ops::rms_norm(&x.contiguous()?, &weight.contiguous()?, eps as f32);
    }
    if crate::kernels::fused_on(x)
        && weight.dtype() == dtype
        && weight.device().same_device(x.device())
    {
        return crate::kernels::rms_norm(x, weight, eps);
    }
    rms_norm_ops(x, weight, eps)
}

/// [`rms_norm`] from tensor ops (any device and dtype).
pub(crate) fn rms_norm_ops(x: &Tensor, weight: &Tensor, eps: f64) -> Result<Tensor> {
    let dtype = x.dtype();
    let xf = if matches!(dtype, DType::BF16 | DType::F16) {
        x.to_dtype(DType::F32)?
    } else {
        x.clone()
    };
    let ms = xf.sqr()?.mean_keepdim(D::Minus1)?;
    let y = xf.broadcast_div(&(ms + eps)?.sqrt()?)?;
    y.to_dtype(dtype)?.broadcast_mul(weight)
}

/// Softmax over the last dimension; the max is detached (softmax does not depend on the shift,
/// so the gradient is exact and the max's backward is skipped). Half precision runs in f32;
/// candle's kernel when `fused` and nothing needs a gradient.
pub(crate) fn softmax_last(x: &Tensor, fused: bool) -> Result<Tensor> {
    let dtype = x.dtype();
    let xf = if matches!(dtype, DType::BF16 | DType::F16) {
        x.to_dtype(DType::F32)?
    } else {
        x.clone()
    };
    if fused && no_graph(&[x]) {
        // In f32 for half precision: candle's CPU kernel would sum in the input dtype.
        return candle_nn::ops::softmax_last_dim(&xf.contiguous()?)?.to_dtype(dtype);
    }
    let max = xf.max_keepdim(D::Minus1)?.detach();
    let e = xf.broadcast_sub(&max)?.exp()?;
    let s = e.sum_keepdim(D::Minus1)?;
    e.broadcast_div(&s)?.to_dtype(dtype)
}

/// `cos` and `sin` tables `[N, 1, L, head_dim]` for positions `[N, L]` (u32), as transformers'
/// default RoPE computes them (`inv_freq = 1 / theta^(2i/d)`, frequencies in f32, duplicated
/// halves).
pub(crate) fn rope_tables(
    positions: &Tensor,
    head_dim: usize,
    theta: f64,
    dtype: DType,
) -> Result<(Tensor, Tensor)> {
    let (n, l) = positions.dims2()?;
    let compute = if dtype == DType::F64 {
        DType::F64
    } else {
        DType::F32
    };
    let half = head_dim / 2;
    let inv: Vec<f64> = (0..half)
        .map(|i| 1.0 / theta.powf((2 * i) as f64 / head_dim as f64))
        .collect();
    let inv = Tensor::from_vec(inv, (1, half), positions.device())?.to_dtype(compute)?;
    let pos = positions.to_dtype(compute)?.reshape((n * l, 1))?;
    let freqs = pos.broadcast_mul(&inv)?;
    let emb = Tensor::cat(&[&freqs, &freqs], 1)?;
    let shape = (n, 1, l, head_dim);
    let cos = emb.cos()?.reshape(shape)?.to_dtype(dtype)?;
    let sin = emb.sin()?.reshape(shape)?.to_dtype(dtype)?;
    Ok((cos, sin))
}

/// Applies rotary embeddings to `x [N, heads, L, head_dim]` (rotate-half layout).
pub(crate) fn apply_rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    if crate::kernels::fused_on(x) && crate::kernels::rope_fits(x, cos, sin) {
        return crate::kernels::rope(x, cos, sin);
    }
    apply_rope_ops(x, cos, sin)
}

/// [`apply_rope`] from tensor ops (any device and dtype).
pub(crate) fn apply_rope_ops(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let d = x.dim(D::Minus1)?;
    let x1 = x.narrow(D::Minus1, 0, d / 2)?;
    let x2 = x.narrow(D::Minus1, d / 2, d / 2)?;
    let rotated = Tensor::cat(&[&x2.neg()?, &x1], D::Minus1)?;
    x.broadcast_mul(cos)? + rotated.broadcast_mul(sin)?
}

/// Repeats each key/value head `n_rep` times: `[N, kv, S, d]` → `[N, kv·n_rep, S, d]`.
pub(crate) fn repeat_kv(x: &Tensor, n_rep: usize) -> Result<Tensor> {
    if n_rep == 1 {
        return Ok(x.clone());
    }
    let (n, kv, s, d) = x.dims4()?;
    x.unsqueeze(2)?
        .expand((n, kv, n_rep, s, d))?
        .reshape((n, kv * n_rep, s, d))
}
