//! Differentiable building blocks: RMSNorm, softmax, rotary embeddings, grouped-query heads.
//!
//! Candle's fused `rms_norm`, `softmax_last_dim` and `rope` kernels have no backward; these are
//! written from tensor ops that all backpropagate.

use candle_core::{DType, Result, Tensor, D};

/// `x / sqrt(mean(x², -1) + eps) * w`, computed in f32 for half-precision inputs (as
/// transformers does).
pub(crate) fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> Result<Tensor> {
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
/// so the gradient is exact and the max's backward is skipped). Half precision runs in f32.
pub(crate) fn softmax_last(x: &Tensor) -> Result<Tensor> {
    let dtype = x.dtype();
    let xf = if matches!(dtype, DType::BF16 | DType::F16) {
        x.to_dtype(DType::F32)?
    } else {
        x.clone()
    };
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
