//! The selective log-softmax of one chunk as a single graph node (and, with the LM head, of
//! all the chunks of a micro-batch).
//!
//! Written from tensor ops, `log softmax(x / T)[token]` and the entropy keep every
//! intermediate of the `[R, V]` chunk alive until backward: the f32 cast of half-precision
//! logits, the temperature-scaled copy, the shifted logits, their exponentials and (for the
//! entropy) their product: two to five `[R, V]` f32 buffers beside the logits, for every chunk
//! of the micro-batch (at Qwen's 151,936-token vocabulary, 1.2 GB each per 2,048 completion
//! tokens). Here the values are computed without a graph, and a custom op whose forward returns
//! zeros carries the gradient. Its backward recomputes the softmax from the logits (which the
//! graph keeps anyway), one chunk at a time, so the f32 temporaries live only while that chunk
//! is backpropagated:
//!
//! `∂lp/∂x_j = (1[j = token] − p_j) / T`, `∂H/∂x_j = −p_j (log p_j + H) / T`,
//!
//! with `p = softmax(x / T)` and `H = −Σ p log p`.

use crate::selective::{chunks, rows_log_softmax};
use candle_core::{
    backend::{BackendDevice, BackendStorage},
    CpuStorage, CudaStorage, CustomOp1, CustomOp2, DType, Layout, Result, Shape, Tensor, D,
};

/// The dtype the log-softmax is computed in: f64 stays f64, everything else runs in f32.
fn compute_dtype(logits: DType) -> DType {
    if logits == DType::F64 {
        DType::F64
    } else {
        DType::F32
    }
}

/// `logits / T` in the compute dtype, shifted by the row max, with `log Σ exp` per row.
struct Shifted {
    shifted: Tensor,
    exp: Tensor,
    sum: Tensor,
    log_sum: Tensor,
}

impl Shifted {
    fn new(logits: &Tensor, temperature: f64) -> Result<Self> {
        let x = logits.to_dtype(compute_dtype(logits.dtype()))?;
        let x = if temperature == 1.0 {
            x
        } else {
            x.affine(1.0 / temperature, 0.0)?
        };
        let max = x.max_keepdim(D::Minus1)?;
        let shifted = x.broadcast_sub(&max)?;
        let exp = atomrl_model::exp_detached(&shifted)?;
        let sum = exp.sum_keepdim(D::Minus1)?;
        let log_sum = sum.log()?;
        Ok(Self {
            shifted,
            exp,
            sum,
            log_sum,
        })
    }

    /// `H = log Σe − Σ e·s / Σe` per row, `[R, 1]`.
    fn entropy(&self) -> Result<Tensor> {
        let weighted = (&self.exp * &self.shifted)?.sum_keepdim(D::Minus1)?;
        &self.log_sum - weighted.broadcast_div(&self.sum)?
    }
}

/// Log-probs `[R]` of `tokens [R]` and entropies `[R]` of one chunk `logits [R, V]`, without a
/// graph: AtomRL's CUDA kernel where it runs (one pass over the logits instead of f32 copies),
/// else the tensor-op form.
fn values(
    logits: &Tensor,
    tokens: &Tensor,
    temperature: f64,
    with_entropy: bool,
) -> Result<(Tensor, Option<Tensor>)> {
    #[cfg(feature = "cuda")]
    if crate::cuda::available(logits) {
        return crate::cuda::forward(&logits.detach(), tokens, temperature, with_entropy);
    }
    values_tensor_ops(logits, tokens, temperature, with_entropy)
}

/// [`values`] from tensor ops (every device and dtype).
pub(crate) fn values_tensor_ops(
    logits: &Tensor,
    tokens: &Tensor,
    temperature: f64,
    with_entropy: bool,
) -> Result<(Tensor, Option<Tensor>)> {
    let s = Shifted::new(&logits.detach(), temperature)?;
    let chosen = s.shifted.gather(&tokens.unsqueeze(1)?, 1)?;
    let lp = (chosen - &s.log_sum)?.squeeze(1)?;
    let ent = if with_entropy {
        Some(s.entropy()?.squeeze(1)?)
    } else {
        None
    };
    Ok((lp, ent))
}

/// Zeros of `shape` in the compute dtype of `input` (the carriers' forward on the CPU).
fn cpu_zeros(shape: &Shape, input: DType) -> CpuStorage {
    let n = shape.elem_count();
    match compute_dtype(input) {
        DType::F64 => CpuStorage::F64(vec![0.0; n]),
        _ => CpuStorage::F32(vec![0.0; n]),
    }
}

/// The gradient carrier: forward zeros `[R, 2]` (log-prob and entropy columns), backward the
/// vector-Jacobian product with respect to the logits (module docs).
struct LogSoftmaxGrad {
    tokens: Tensor,
    temperature: f64,
    with_entropy: bool,
}

impl LogSoftmaxGrad {
    fn out_shape(layout: &Layout) -> Result<Shape> {
        Ok(Shape::from((layout.dims()[0], 2)))
    }
}

impl CustomOp1 for LogSoftmaxGrad {
    fn name(&self) -> &'static str {
        "atomrl-log-softmax-grad"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let shape = Self::out_shape(layout)?;
        Ok((cpu_zeros(&shape, storage.dtype()), shape))
    }

    fn cuda_fwd(&self, storage: &CudaStorage, layout: &Layout) -> Result<(CudaStorage, Shape)> {
        let shape = Self::out_shape(layout)?;
        let zeros = storage
            .device()
            .zeros_impl(&shape, compute_dtype(storage.dtype()))?;
        Ok((zeros, shape))
    }

    fn bwd(&self, arg: &Tensor, _res: &Tensor, grad_res: &Tensor) -> Result<Option<Tensor>> {
        let dx = logits_grad(
            &arg.detach(),
            &self.tokens,
            self.temperature,
            self.with_entropy,
            grad_res,
        )?;
        Ok(Some(dx.to_dtype(arg.dtype())?))
    }
}

/// The vector-Jacobian product of the log-prob and entropy columns `grad_res [R, 2]` with
/// respect to `logits [R, V]` (module docs): in the logits' dtype from AtomRL's CUDA kernel
/// where it runs, else in the compute dtype from tensor ops.
fn logits_grad(
    logits: &Tensor,
    tokens: &Tensor,
    temperature: f64,
    with_entropy: bool,
    grad_res: &Tensor,
) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if crate::cuda::available(logits) {
        return crate::cuda::backward(logits, tokens, temperature, with_entropy, grad_res);
    }
    logits_grad_tensor_ops(logits, tokens, temperature, with_entropy, grad_res)
}

/// [`logits_grad`] from tensor ops (every device and dtype).
pub(crate) fn logits_grad_tensor_ops(
    logits: &Tensor,
    tokens: &Tensor,
    temperature: f64,
    with_entropy: bool,
    grad_res: &Tensor,
) -> Result<Tensor> {
    let s = Shifted::new(logits, temperature)?;
    let g = grad_res.detach().to_dtype(s.shifted.dtype())?;
    let g_lp = g.narrow(1, 0, 1)?.contiguous()?;
    // coef = g_lp + g_H (log p + H): the softmax-weighted part of both gradients.
    let coef = if with_entropy {
        let g_h = g.narrow(1, 1, 1)?;
        let log_p = s.shifted.broadcast_sub(&s.log_sum)?;
        let h = s.entropy()?;
        log_p
            .broadcast_add(&h)?
            .broadcast_mul(&g_h)?
            .broadcast_add(&g_lp)?
    } else {
        g_lp.clone()
    };
    let p = s.exp.broadcast_div(&s.sum)?;
    let dx = p.broadcast_mul(&coef)?.neg()?;
    let dx = dx.scatter_add(&tokens.unsqueeze(1)?, &g_lp, 1)?;
    if temperature == 1.0 {
        Ok(dx)
    } else {
        dx.affine(1.0 / temperature, 0.0)
    }
}

/// The gradient carrier of the LM head fused with the log-softmax: arguments `hidden [R, H]`
/// and the head's `weight [V, H]`, forward zeros `[R, 2]`; backward takes the logits
/// `hidden · weightᵀ` a chunk of rows at a time (kept from the forward, or recomputed) and
/// returns `(dx · weight, dxᵀ · hidden)`, with `dx` the gradient with respect to the logits
/// (none for a frozen weight). The weight's gradient is summed over the chunks in one buffer
/// (`crate::accumulate`).
struct HeadLogSoftmaxGrad {
    tokens: Tensor,
    chunk_rows: usize,
    temperature: f64,
    with_entropy: bool,
    /// Each chunk's logits from the forward ([`KEEP_CHUNKS`]); empty: recomputed.
    kept: Vec<Tensor>,
}

/// The most chunks whose logits the forward keeps for the backward instead of the backward
/// recomputing them. Recomputing is one `[rows, H] × [H, V]` matmul a chunk, a quarter of the
/// head's work in a training step (forward, recomputation, and the two gradient products); a
/// micro-batch of a few chunks keeps them for a few chunk-sizes of memory (on the CPU at most
/// 8 × 2^24 logits, 512 MiB in f32; the Qwen2.5-0.5B bench's micro-batch of 4 × 96 rows is
/// four chunks, 233 MB). Larger micro-batches recompute, so memory stays bounded by the chunk.
pub(crate) const KEEP_CHUNKS: usize = 8;

impl CustomOp2 for HeadLogSoftmaxGrad {
    fn name(&self) -> &'static str {
        "atomrl-head-log-softmax-grad"
    }

    fn cpu_fwd(
        &self,
        _s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        _l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let shape = LogSoftmaxGrad::out_shape(l1)?;
        Ok((cpu_zeros(&shape, s2.dtype()), shape))
    }

    fn cuda_fwd(
        &self,
        _s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        _l2: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let shape = LogSoftmaxGrad::out_shape(l1)?;
        let zeros = s2.device().zeros_impl(&shape, compute_dtype(s2.dtype()))?;
        Ok((zeros, shape))
    }

    fn bwd(
        &self,
        hidden: &Tensor,
        weight: &Tensor,
        _res: &Tensor,
        grad_res: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let _p = atomrl_core::profile::phase("backward.lm_head_log_softmax", hidden.device());
        let w = weight.detach();
        let all = hidden.detach().to_dtype(w.dtype())?;
        let mut grad_hidden = Vec::new();
        let mut grad_weight: Option<Tensor> = None;
        for (i, (start, len)) in chunks(all.dim(0)?, self.chunk_rows).enumerate() {
            let h = all.narrow(0, start, len)?;
            let logits = match self.kept.get(i) {
                Some(logits) => logits.clone(),
                None => h.matmul(&w.t()?)?,
            };
            let dx = logits_grad(
                &logits,
                &self.tokens.narrow(0, start, len)?,
                self.temperature,
                self.with_entropy,
                &grad_res.narrow(0, start, len)?,
            )?
            .to_dtype(w.dtype())?;
            drop(logits);
            grad_hidden.push(dx.matmul(&w)?.to_dtype(hidden.dtype())?);
            if weight.track_op() {
                grad_weight = Some(match grad_weight {
                    None => dx.t()?.matmul(&h)?,
                    Some(acc) => crate::accumulate::add_transposed_product(acc, &dx, &h)?,
                });
            }
        }
        Ok((Some(Tensor::cat(&grad_hidden, 0)?), grad_weight))
    }
}

/// One chunk: `logits [R, V]`, `tokens [R]` (u32) → `log_probs [R]`, `entropy [R]` in the
/// compute dtype, differentiable with respect to `logits` through one graph node.
pub(crate) fn chunk_log_softmax(
    logits: &Tensor,
    tokens: &Tensor,
    temperature: f64,
    with_entropy: bool,
) -> Result<(Tensor, Option<Tensor>)> {
    let (lp, ent) = values(logits, tokens, temperature, with_entropy)?;
    if !logits.track_op() {
        return Ok((lp, ent));
    }
    let carrier = logits.apply_op1(LogSoftmaxGrad {
        tokens: tokens.clone(),
        temperature,
        with_entropy,
    })?;
    add_carrier(lp, ent, &carrier)
}

/// Hidden states `hidden [R, H]` through the LM head `weight [V, H]` (no bias) and the
/// log-softmax, `chunk_rows` rows at a time: `log_probs [R]`, `entropy [R]` of `tokens [R]`,
/// differentiable with respect to both through one graph node that keeps no intermediate of
/// the log-softmax. Up to [`KEEP_CHUNKS`] chunks it keeps the `[rows, V]` logits for the
/// backward; past that the backward recomputes the head chunk by chunk (one more
/// `[rows, H] × [H, V]` matmul each), so memory stays bounded by the chunk. Either way the
/// backward sums the weight's gradient in one buffer, and the numbers are the same.
pub(crate) fn head_log_softmax(
    hidden: &Tensor,
    weight: &Tensor,
    tokens: &Tensor,
    chunk_rows: usize,
    temperature: f64,
    with_entropy: bool,
) -> Result<(Tensor, Option<Tensor>)> {
    let head = Head {
        tokens,
        chunk_rows,
        temperature,
        with_entropy,
    };
    head.log_softmax(hidden, weight, KEEP_CHUNKS)
}

/// The settings of [`head_log_softmax`].
pub(crate) struct Head<'a> {
    pub(crate) tokens: &'a Tensor,
    pub(crate) chunk_rows: usize,
    pub(crate) temperature: f64,
    pub(crate) with_entropy: bool,
}

impl Head<'_> {
    /// [`head_log_softmax`], keeping the logits for the backward up to `keep_chunks` chunks.
    pub(crate) fn log_softmax(
        &self,
        hidden: &Tensor,
        weight: &Tensor,
        keep_chunks: usize,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let Head {
            tokens,
            chunk_rows,
            temperature,
            with_entropy,
        } = *self;
        let all = hidden.detach().to_dtype(weight.dtype())?;
        let w = weight.detach();
        let rows = all.dim(0)?;
        let track = hidden.track_op() || weight.track_op();
        let keep = track && chunks(rows, chunk_rows).count() <= keep_chunks;
        let kept = std::cell::RefCell::new(Vec::new());
        let (lp, ent) = rows_log_softmax(rows, chunk_rows, with_entropy, |start, len| {
            let logits = all.narrow(0, start, len)?.matmul(&w.t()?)?;
            let v = values(
                &logits,
                &tokens.narrow(0, start, len)?,
                temperature,
                with_entropy,
            )?;
            if keep {
                kept.borrow_mut().push(logits);
            }
            Ok(v)
        })?;
        if !track {
            return Ok((lp, ent));
        }
        let carrier = hidden.apply_op2(
            weight,
            HeadLogSoftmaxGrad {
                tokens: tokens.clone(),
                chunk_rows,
                temperature,
                with_entropy,
                kept: kept.into_inner(),
            },
        )?;
        add_carrier(lp, ent, &carrier)
    }
}

/// Adds the carrier's zero columns to the values, putting them on the graph.
fn add_carrier(
    lp: Tensor,
    ent: Option<Tensor>,
    carrier: &Tensor,
) -> Result<(Tensor, Option<Tensor>)> {
    let lp = (lp + carrier.narrow(1, 0, 1)?.squeeze(1)?)?;
    let ent = match ent {
        Some(e) => Some((e + carrier.narrow(1, 1, 1)?.squeeze(1)?)?),
        None => None,
    };
    Ok((lp, ent))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use candle_core::{Device, Var};

    /// The tensor-op form this replaces: every intermediate on the graph.
    fn reference(x: &Tensor, tokens: &Tensor, temperature: f64) -> Result<(Tensor, Tensor)> {
        let x = x
            .to_dtype(compute_dtype(x.dtype()))?
            .affine(1.0 / temperature, 0.0)?;
        let max = x.max_keepdim(D::Minus1)?.detach();
        let shifted = x.broadcast_sub(&max)?;
        let exp = shifted.exp()?;
        let sum = exp.sum_keepdim(D::Minus1)?;
        let log_sum = sum.log()?;
        let lp = (shifted.gather(&tokens.unsqueeze(1)?, 1)? - &log_sum)?.squeeze(1)?;
        let weighted = (exp * &shifted)?.sum_keepdim(D::Minus1)?;
        let h = (log_sum - weighted.broadcast_div(&sum)?)?.squeeze(1)?;
        Ok((lp, h))
    }

    fn max_abs_diff(a: &Tensor, b: &Tensor) -> f64 {
        (a.to_dtype(DType::F64).unwrap() - b.to_dtype(DType::F64).unwrap())
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar::<f64>()
            .unwrap()
    }

    /// Values and gradients (of `Σ a·lp + Σ b·H` with uneven weights) agree with the
    /// tensor-op form.
    fn agrees(dtype: DType, temperature: f64, with_entropy: bool, tol: f64) {
        let d = Device::Cpu;
        let (r, v) = (7, 11);
        let x = Var::from_tensor(
            &Tensor::randn(0f32, 3.0, (r, v), &d)
                .unwrap()
                .to_dtype(dtype)
                .unwrap(),
        )
        .unwrap();
        let tokens = Tensor::new(&[0u32, 10, 3, 3, 5, 9, 1], &d).unwrap();
        let cd = compute_dtype(dtype);
        let a = Tensor::arange(1f32, 1.0 + r as f32, &d)
            .unwrap()
            .to_dtype(cd)
            .unwrap();
        let b = Tensor::arange(0f32, r as f32, &d)
            .unwrap()
            .affine(-0.3, 2.0)
            .unwrap()
            .to_dtype(cd)
            .unwrap();

        let (lp, h) = chunk_log_softmax(x.as_tensor(), &tokens, temperature, with_entropy).unwrap();
        let (want_lp, want_h) = reference(x.as_tensor(), &tokens, temperature).unwrap();
        assert!(max_abs_diff(&lp, &want_lp) < tol);
        let mut loss = (&lp * &a).unwrap().sum_all().unwrap();
        let mut want_loss = (&want_lp * &a).unwrap().sum_all().unwrap();
        if with_entropy {
            let h = h.unwrap();
            assert!(max_abs_diff(&h, &want_h) < tol);
            loss = (loss + (&h * &b).unwrap().sum_all().unwrap()).unwrap();
            want_loss = (want_loss + (&want_h * &b).unwrap().sum_all().unwrap()).unwrap();
        } else {
            assert!(h.is_none());
        }
        let g = loss.backward().unwrap().get(x.as_tensor()).unwrap().clone();
        let want_g = want_loss
            .backward()
            .unwrap()
            .get(x.as_tensor())
            .unwrap()
            .clone();
        assert_eq!(g.dtype(), dtype);
        let diff = max_abs_diff(&g, &want_g);
        assert!(
            diff < tol,
            "{dtype:?} T={temperature} entropy={with_entropy}: {diff}"
        );
    }

    #[test]
    fn gradients_match_the_tensor_op_form() {
        for t in [1.0, 0.7, 1.6] {
            for e in [false, true] {
                agrees(DType::F32, t, e, 1e-5);
                agrees(DType::F64, t, e, 1e-12);
            }
        }
    }

    #[test]
    fn half_precision_logits_get_half_precision_gradients() {
        // Both forms compute in f32 and round the gradient to bf16 at the end.
        agrees(DType::BF16, 0.9, true, 2e-2);
    }

    /// The head fused with the log-softmax: values and the gradients of both the hidden
    /// states and the weight agree with `hidden · weightᵀ` followed by the tensor-op form,
    /// whatever the chunks (one, uneven, one row each: the weight's gradient summed over them
    /// in place); a frozen (detached) weight gets none and the hidden states still get theirs.
    #[test]
    fn the_fused_head_matches_a_matmul_then_log_softmax() {
        let d = Device::Cpu;
        let (r, h, v) = (6, 5, 13);
        for (t, with_entropy, chunk_rows) in [
            (1.0, true, 6),
            (0.7, false, 4),
            (1.3, true, 1),
            (1.0, true, 4),
        ] {
            for frozen in [false, true] {
                let hid = Var::from_tensor(&Tensor::randn(0f32, 1.0, (r, h), &d).unwrap()).unwrap();
                let w0 = Tensor::randn(0f32, 1.0, (v, h), &d).unwrap();
                let w = Var::from_tensor(&w0).unwrap();
                let weight = if frozen {
                    w0.clone()
                } else {
                    w.as_tensor().clone()
                };
                let tokens = Tensor::new(&[0u32, 12, 3, 3, 7, 1], &d).unwrap();
                let a = Tensor::arange(1f32, 1.0 + r as f32, &d).unwrap();
                let (lp, ent) = head_log_softmax(
                    hid.as_tensor(),
                    &weight,
                    &tokens,
                    chunk_rows,
                    t,
                    with_entropy,
                )
                .unwrap();
                let logits = hid.as_tensor().matmul(&weight.t().unwrap()).unwrap();
                let (want_lp, want_h) = reference(&logits, &tokens, t).unwrap();
                assert!(max_abs_diff(&lp, &want_lp) < 1e-5);
                let mut loss = (&lp * &a).unwrap().sum_all().unwrap();
                let mut want = (&want_lp * &a).unwrap().sum_all().unwrap();
                if let Some(e) = ent {
                    assert!(max_abs_diff(&e, &want_h) < 1e-5);
                    loss = (loss + (&e * 0.3).unwrap().sum_all().unwrap()).unwrap();
                    want = (want + (&want_h * 0.3).unwrap().sum_all().unwrap()).unwrap();
                }
                let (g, wg) = (loss.backward().unwrap(), want.backward().unwrap());
                let gh = g.get(hid.as_tensor()).unwrap();
                assert!(max_abs_diff(gh, wg.get(hid.as_tensor()).unwrap()) < 1e-5);
                match (frozen, g.get(w.as_tensor()), wg.get(w.as_tensor())) {
                    (true, None, None) => {}
                    (false, Some(a), Some(b)) => assert!(max_abs_diff(a, b) < 1e-5),
                    (f, a, b) => panic!("frozen={f}: weight gradient {a:?} vs {b:?}"),
                }
            }
        }
    }

    /// Kept logits and recomputed ones give the same values and gradients to the bit.
    #[test]
    fn kept_and_recomputed_logits_give_the_same_bits() {
        let d = Device::Cpu;
        let (r, h, v) = (9, 7, 23);
        let hid = Var::from_tensor(&Tensor::randn(0f32, 1.0, (r, h), &d).unwrap()).unwrap();
        let w = Var::from_tensor(&Tensor::randn(0f32, 1.0, (v, h), &d).unwrap()).unwrap();
        let tokens = Tensor::new(&[0u32, 22, 3, 3, 7, 1, 9, 9, 14], &d).unwrap();
        let head = Head {
            tokens: &tokens,
            chunk_rows: 2,
            temperature: 0.8,
            with_entropy: true,
        };
        let run = |keep_chunks| {
            let (lp, ent) = head
                .log_softmax(hid.as_tensor(), w.as_tensor(), keep_chunks)
                .unwrap();
            let loss =
                (lp.sum_all().unwrap() + (ent.unwrap() * 0.3).unwrap().sum_all().unwrap()).unwrap();
            let g = loss.backward().unwrap();
            let bits = |t: &Tensor| -> Vec<u32> {
                let v: Vec<f32> = t.flatten_all().unwrap().to_vec1().unwrap();
                v.iter().map(|x| x.to_bits()).collect()
            };
            (
                bits(&lp),
                bits(g.get(hid.as_tensor()).unwrap()),
                bits(g.get(w.as_tensor()).unwrap()),
            )
        };
        assert_eq!(run(0), run(usize::MAX));
    }

    #[test]
    fn untracked_logits_build_no_graph() {
        let x = Tensor::randn(0f32, 1.0, (3, 4), &Device::Cpu).unwrap();
        let t = Tensor::new(&[0u32, 1, 2], &Device::Cpu).unwrap();
        let (lp, h) = chunk_log_softmax(&x, &t, 1.0, true).unwrap();
        assert!(!lp.track_op() && !h.unwrap().track_op());
    }
}
