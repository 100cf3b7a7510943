//! `entropy_from_logits`: per-token entropy of the policy's next-token distribution, in chunks.

use atomrl_core::shape::{expect_binary_mask, expect_dims, expect_float, expect_rank};
use atomrl_core::{CandleContext, Error, Result};
use candle_core::{DType, Tensor, D};

const FUNC: &str = "entropy_from_logits";

/// Default number of elements (`rows × V`) processed per chunk: 2²² (16 MiB in f32), i.e. 27
/// positions at a vocabulary of 151,936.
pub const DEFAULT_CHUNK_ELEMS: usize = 1 << 22;

/// Per-token entropy `H = −Σ_v p_v log p_v` of `softmax(logits)`, 0 where masked.
///
/// Computed as `H = −Σ_v exp(log_softmax(z))_v · log_softmax(z)_v` over chunks of the `N·T`
/// positions, so that at most a few `[chunk, V]` temporaries exist at once (never a second
/// full `[N, T, V]` buffer: a vocabulary of 151,936 fits). Half-precision logits are upcast to
/// f32 chunk by chunk. Differentiable with respect to `logits` (through candle's autograd;
/// backward then keeps each chunk's temporaries). Masked-out positions are not evaluated.
///
/// # Shapes
/// - `logits`: `[N, T, V]`, float.
/// - `mask`: `[N, T]`, 0/1.
/// - returns `entropy`: `[N, T]`, f32 for f16/bf16 logits, else the logits' dtype.
///
/// # Errors
/// `logits` not of rank 3 or not float, `V = 0`, `mask` not `[N, T]` or not 0/1.
///
/// # Example
/// ```
/// use atomrl_loss::entropy_from_logits;
/// use candle_core::{Device, Tensor};
///
/// let logits = Tensor::new(&[[[0f32, 0.0, 0.0, 0.0], [10.0, -10.0, -10.0, -10.0]]], &Device::Cpu)?;
/// let mask = Tensor::new(&[[1f32, 1.0]], &Device::Cpu)?;
/// let h = entropy_from_logits(&logits, &mask)?.to_vec2::<f32>()?;
/// assert!((h[0][0] - 4f32.ln()).abs() < 1e-6); // uniform over 4 tokens
/// assert!(h[0][1] < 1e-6);                     // nearly deterministic
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn entropy_from_logits(logits: &Tensor, mask: &Tensor) -> Result<Tensor> {
    let v = logits.dims().get(2).copied().unwrap_or(1).max(1);
    entropy_from_logits_chunked(logits, mask, (DEFAULT_CHUNK_ELEMS / v).max(1))
}

/// [`entropy_from_logits`] with an explicit chunk size: `chunk_rows` positions (of the `N·T`)
/// are processed at a time.
///
/// # Shapes
/// As [`entropy_from_logits`].
///
/// # Errors
/// As [`entropy_from_logits`], and `chunk_rows = 0`.
///
/// # Example
/// ```
/// use atomrl_loss::{entropy_from_logits, entropy_from_logits_chunked};
/// use candle_core::{Device, Tensor};
///
/// let logits = Tensor::arange(0f32, 24.0, &Device::Cpu)?.reshape((2, 3, 4))?.sin()?;
/// let mask = Tensor::ones((2, 3), candle_core::DType::F32, &Device::Cpu)?;
/// let a = entropy_from_logits_chunked(&logits, &mask, 1)?.to_vec2::<f32>()?;
/// let b = entropy_from_logits(&logits, &mask)?.to_vec2::<f32>()?;
/// assert_eq!(a, b);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn entropy_from_logits_chunked(
    logits: &Tensor,
    mask: &Tensor,
    chunk_rows: usize,
) -> Result<Tensor> {
    let dims = expect_rank(FUNC, "logits", logits, 3, "[N, T, V]")?;
    let (n, t, v) = (dims[0], dims[1], dims[2]);
    expect_float(FUNC, "logits", logits)?;
    if v == 0 {
        return Err(Error::shape(FUNC, "logits", "[N, T, V] with V >= 1", dims));
    }
    if chunk_rows == 0 {
        return Err(Error::value(FUNC, "chunk_rows", ">= 1", 0));
    }
    expect_dims(FUNC, "mask", mask, &[n, t], "[N, T] (as logits)")?;
    expect_binary_mask(FUNC, "mask", mask)?;
    let out_dtype = match logits.dtype() {
        DType::F16 | DType::BF16 => DType::F32,
        d => d,
    };
    let rows = n * t;
    if rows == 0 {
        return Tensor::zeros((n, t), out_dtype, logits.device()).ctx(FUNC);
    }
    let flat = logits.reshape((rows, v)).ctx(FUNC)?;
    let pred = mask.reshape(rows).and_then(|m| m.ne(0.0)).ctx(FUNC)?;
    let mut parts = Vec::with_capacity(rows.div_ceil(chunk_rows));
    let mut start = 0;
    while start < rows {
        let len = chunk_rows.min(rows - start);
        let z = flat
            .narrow(0, start, len)
            .and_then(|z| z.to_dtype(out_dtype))
            .ctx(FUNC)?;
        let keep = pred.narrow(0, start, len).ctx(FUNC)?;
        // Masked rows are replaced by zeros (entropy ln V, then zeroed) so NaN there stays out.
        let keep_v = keep
            .reshape((len, 1))
            .and_then(|k| k.broadcast_as((len, v)))
            .ctx(FUNC)?;
        let z = keep_v
            .where_cond(&z, &z.zeros_like().ctx(FUNC)?)
            .ctx(FUNC)?;
        let h = entropy_rows(&z)?;
        let h = keep.where_cond(&h, &h.zeros_like().ctx(FUNC)?).ctx(FUNC)?;
        parts.push(h);
        start += len;
    }
    Tensor::cat(&parts, 0)
        .and_then(|h| h.reshape((n, t)))
        .ctx(FUNC)
}

/// `−Σ p log p` over the last dim of `[rows, V]` logits (stable log-softmax).
fn entropy_rows(z: &Tensor) -> Result<Tensor> {
    let max = z.max_keepdim(D::Minus1).ctx(FUNC)?.detach();
    let shifted = z.broadcast_sub(&max).ctx(FUNC)?;
    let lse = shifted
        .exp()
        .and_then(|e| e.sum_keepdim(D::Minus1))
        .and_then(|s| s.log())
        .ctx(FUNC)?;
    let log_p = shifted.broadcast_sub(&lse).ctx(FUNC)?;
    log_p
        .exp()
        .and_then(|p| p.mul(&log_p))
        .and_then(|x| x.sum(D::Minus1))
        .and_then(|s| s.neg())
        .ctx(FUNC)
}

#[cfg(test)]
mod tests {
    use super::*;
    use approx::assert_relative_eq;
    use candle_core::{Device, Var};

    #[test]
    fn chunking_does_not_change_the_result_and_masks_zero() {
        let logits = Tensor::arange(0f64, 60.0, &Device::Cpu)
            .unwrap()
            .reshape((3, 4, 5))
            .unwrap()
            .cos()
            .unwrap();
        let mask = Tensor::new(
            &[
                [1f64, 1.0, 0.0, 1.0],
                [0.0, 0.0, 0.0, 0.0],
                [1.0, 1.0, 1.0, 1.0],
            ],
            &Device::Cpu,
        )
        .unwrap();
        let full = entropy_from_logits_chunked(&logits, &mask, 12)
            .unwrap()
            .to_vec2::<f64>()
            .unwrap();
        for c in [1, 5, 7] {
            let h = entropy_from_logits_chunked(&logits, &mask, c)
                .unwrap()
                .to_vec2::<f64>()
                .unwrap();
            assert_eq!(h, full);
        }
        assert_eq!(full[0][2], 0.0);
        assert_eq!(full[1], vec![0.0; 4]);
        // Direct formula for one row.
        let z: Vec<f64> = (0..5).map(|k| ((5 + k) as f64).cos()).collect();
        let s: f64 = z.iter().map(|x| x.exp()).sum();
        let h: f64 = -z.iter().map(|x| (x.exp() / s) * (x - s.ln())).sum::<f64>();
        assert_relative_eq!(full[0][1], h, epsilon = 1e-12);
    }

    #[test]
    fn gradient_matches_the_analytic_one() {
        // dH/dz_k = −p_k (log p_k + H).
        let z = [0.3f64, -1.0, 2.0];
        let var = Var::new(&[[z]], &Device::Cpu).unwrap();
        let mask = Tensor::new(&[[1f64]], &Device::Cpu).unwrap();
        let h = entropy_from_logits(var.as_tensor(), &mask).unwrap();
        let hv = h.to_vec2::<f64>().unwrap()[0][0];
        let g = h.sum_all().unwrap().backward().unwrap();
        let g = g
            .get(var.as_tensor())
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f64>()
            .unwrap();
        let s: f64 = z.iter().map(|x| x.exp()).sum();
        for (k, gk) in g.iter().enumerate() {
            let p = z[k].exp() / s;
            assert_relative_eq!(*gk, -p * (p.ln() + hv), epsilon = 1e-12);
        }
    }

    #[test]
    fn bad_inputs_are_named() {
        let logits = Tensor::zeros((2, 3), DType::F32, &Device::Cpu).unwrap();
        let mask = Tensor::ones((2, 3), DType::F32, &Device::Cpu).unwrap();
        let e = entropy_from_logits(&logits, &mask).unwrap_err().to_string();
        assert_eq!(
            e,
            "entropy_from_logits: `logits` has shape [2, 3], expected [N, T, V]"
        );
        let logits = Tensor::zeros((2, 3, 4), DType::F32, &Device::Cpu).unwrap();
        let e = entropy_from_logits(&logits, &mask.narrow(1, 0, 2).unwrap())
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "entropy_from_logits: `mask` has shape [2, 2], expected [N, T] (as logits) = [2, 3]"
        );
    }
}
