//! Scaled dot-product attention with the fused softmax, in chunks of queries when the scores
//! would be large.
//!
//! The plain form holds the scores and the probabilities of every query and key,
//! `[N, H, L, S]`, and a training forward keeps the probabilities for backward: at 8 rows of
//! 2,112 tokens and 4 heads that is 571 MB a layer in f32. Past a budget of score elements,
//! [`attend`] runs FlashAttention's plan at the granularity of tensor ops (Dao et al. 2022,
//! "FlashAttention: Fast and Memory-Efficient Exact Attention with IO-Awareness"):
//!
//! - forward: the queries in chunks of `c` rows, each chunk's output by the plain form from
//!   that chunk's scores, which are freed before the next chunk. Under a causal mask a
//!   chunk's scores stop at its last query's limit (FlashAttention's causal block skip), so
//!   the chunks together compute about half of the plain form's `[L, S]`;
//! - one graph node for the whole attention, whose backward recomputes each chunk's
//!   probabilities from `q` and `k` and takes the chunk's gradients from them:
//!   `dV += Pᵀ·dO`, `dP = dO·Vᵀ`, `dS = scale · P ⊙ (dP − Σ P ⊙ dP)`, `dQ = dS·K`,
//!   `dK += dSᵀ·Q`.
//!
//! So memory is one chunk's scores instead of `L / c` times as much, for one more `Q·Kᵀ` and
//! softmax per chunk in backward, which the causal skip pays for at long lengths
//! (docs/performance.md item 21). It is built from tensor ops (candle's matmuls, AtomRL's fused
//! softmax), so the CPU and CUDA run the same code; on a GPU each chunk is a handful of kernel
//! launches, not one fused kernel. Below the budget (every shape the benches' defaults train)
//! the plain form runs, unchanged.
//!
//! On CUDA, FlashAttention kernels (`crate::flash_attention`: one kernel forward, two backward,
//! nothing of `[L, S]` in memory) take an attention past the budget instead: by default in bf16
//! and f16 (whose kernels run on tensor cores), with `ATOMRL_FLASH_ATTENTION=long` in f32 too,
//! and every attention with `1` ([`crate::FlashPolicy`]; `0` turns them off).

use std::sync::Mutex;

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp3, Device, Layout, Result, Shape, Storage, Tensor};

use crate::kernels::{attention_softmax, attention_softmax_backward, KeyMask};

/// Score elements one chunk may hold by default on the CPU: 2²⁴ (64 MiB in f32). An attention
/// whose scores `[N, H, L, S]` fit runs unchunked.
pub const DEFAULT_SCORES_BUDGET: usize = 1 << 24;

/// The default on a GPU: 2²⁶ (256 MiB in f32, 128 MiB in bf16). A chunk there is a dozen
/// kernel launches whatever its size, so fewer, larger chunks; the memory is still one
/// chunk's scores, not the whole attention's.
pub const GPU_SCORES_BUDGET: usize = 1 << 26;

/// The default score budget for a model on `device`: [`DEFAULT_SCORES_BUDGET`] on the CPU,
/// [`GPU_SCORES_BUDGET`] elsewhere.
///
/// ```
/// use atomrl_model::{default_scores_budget, DEFAULT_SCORES_BUDGET};
/// assert_eq!(default_scores_budget(&candle_core::Device::Cpu), DEFAULT_SCORES_BUDGET);
/// ```
pub fn default_scores_budget(device: &Device) -> usize {
    if device.is_cpu() {
        DEFAULT_SCORES_BUDGET
    } else {
        GPU_SCORES_BUDGET
    }
}

/// Attention of `q [N, H, L, d]` over `k, v [N, KV, S, d]` without repeating the key/value
/// heads: the `H / KV` query heads of a group are stacked into the rows of one matmul against
/// their shared keys (`[N, KV, (H/KV)·L, d]`, a view of `q`), so no `[N, H, S, d]` copies of
/// the keys and values are made (nor, in training, summed back in backward). `probs` turns the
/// raw scores `q·kᵀ`, viewed per head as `[N, H, L, S]`, into attention probabilities (scale,
/// mask and softmax) → `[N, H, L, d]`.
pub(crate) fn grouped_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    probs: impl Fn(&Tensor) -> Result<Tensor>,
) -> Result<Tensor> {
    let (n, h, l, d) = q.dims4()?;
    let (kv, s) = (k.dim(1)?, k.dim(2)?);
    let rows = (h / kv) * l;
    let scores = q.reshape((n, kv, rows, d))?.matmul(&k.t()?)?;
    let p = probs(&scores.reshape((n, h, l, s))?)?;
    p.reshape((n, kv, rows, s))?
        .matmul(v)?
        .reshape((n, h, l, d))
}

/// [`attend`] as FlashAttention wherever its kernels can run it (CUDA,
/// `crate::flash_attention::usable`), whatever [`crate::FlashPolicy`] says; elsewhere the
/// unchunked form with the fused softmax. The device check's `flash-attention` row.
pub(crate) fn attend_flash(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    scale: f64,
    mask: &KeyMask,
) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if crate::flash_attention::usable(q, k, mask) {
        return crate::flash_attention::flash_attention(q, k, v, scale, mask);
    }
    grouped_attention(q, k, v, |x| attention_softmax(x, scale, mask))
}

/// Query rows per chunk so that a chunk's scores `[N, H, rows, S]` hold at most `budget`
/// elements (at least one row).
fn query_chunk(n: usize, h: usize, s: usize, budget: usize) -> usize {
    (budget / (n * h * s).max(1)).max(1)
}

/// `softmax(scale · q·kᵀ + mask)·v` for `q [N, H, L, d]` and `k, v [N, KV, S, d]` with the
/// fused softmax ([`attention_softmax`]) → `[N, H, L, d]`, in chunks of queries whose scores
/// fit `budget` elements (see the module docs). Values and gradients equal the unchunked
/// form's up to rounding (the key and value gradients are sums over chunks).
pub(crate) fn attend(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    scale: f64,
    mask: &KeyMask,
    budget: usize,
) -> Result<Tensor> {
    attend_with(q, k, v, scale, mask, budget, q.device().is_cpu())
}

/// [`attend`], the keys and values transposed once for all chunks or not
/// ([`transposed_for_chunks`]; the tests run both forms on the CPU).
fn attend_with(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    scale: f64,
    mask: &KeyMask,
    budget: usize,
    transpose_once: bool,
) -> Result<Tensor> {
    let (n, h, _, _) = q.dims4()?;
    let chunk = query_chunk(n, h, k.dim(2)?, budget);
    #[cfg(feature = "cuda")]
    {
        // The policy first: `usable` asks the device's state.
        let past_budget = chunk < q.dim(2)?;
        let wanted = crate::FlashPolicy::current().takes(q.dtype(), past_budget);
        if wanted && crate::flash_attention::usable(q, k, mask) {
            return crate::flash_attention::flash_attention(q, k, v, scale, mask);
        }
    }
    attend_in_chunks(q, k, v, scale, mask, chunk, transpose_once)
}

/// The tensor-op attention in chunks of `chunk` queries: the plain form when one chunk holds
/// them all, else one [`ChunkedAttention`] node.
pub(crate) fn attend_in_chunks(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    scale: f64,
    mask: &KeyMask,
    chunk: usize,
    transpose_once: bool,
) -> Result<Tensor> {
    let (l, s) = (q.dim(2)?, k.dim(2)?);
    if chunk >= l {
        return grouped_attention(q, k, v, |x| attention_softmax(x, scale, mask));
    }
    let op = ChunkedAttention {
        scale,
        mask: mask.clone(),
        chunk,
        padded_until: padded_until(mask, s),
        transpose_once,
        out: Mutex::new(None),
    };
    let out = op.forward(&q.detach(), &k.detach(), &v.detach())?;
    if !(q.track_op() || k.track_op() || v.track_op()) {
        return Ok(out);
    }
    // The graph node: its forward hands over the output computed above, its backward
    // recomputes chunk by chunk.
    *op.out.lock().map_err(|_| poisoned())? = Some(out);
    q.apply_op3(k, v, op)
}

/// The first key position from which every row has an unpadded key at or before it: queries
/// before it (left padding) see no key. The plain form's softmax spreads such a query over
/// the whole row, later keys included, so its chunk keeps every key.
fn padded_until(mask: &KeyMask, s: usize) -> usize {
    match (&mask.pad, &mask.pad_bias) {
        (Some(pad), _) => pad
            .chunks(s.max(1))
            .map(|row| row.iter().position(|&padded| !padded).unwrap_or(s))
            .max()
            .unwrap_or(0),
        (None, Some(_)) => usize::MAX,
        (None, None) => 0,
    }
}

fn poisoned() -> candle_core::Error {
    candle_core::Error::Msg("atomrl-chunked-attention: a lock was poisoned".into())
}

/// The chunked attention as one graph node (see the module docs).
struct ChunkedAttention {
    scale: f64,
    mask: KeyMask,
    /// Query rows per chunk.
    chunk: usize,
    /// [`padded_until`] of the mask.
    padded_until: usize,
    /// Whether the keys and values are transposed once for all chunks
    /// ([`transposed_for_chunks`]).
    transpose_once: bool,
    /// The output, computed before the node is made and taken by its forward (so the node
    /// does not keep a second copy alive for backward).
    out: Mutex<Option<Tensor>>,
}

/// The queries `start..start + len` of one chunk, and the keys `0..keys` they attend over.
#[derive(Debug, Clone, Copy)]
struct Chunk {
    start: usize,
    len: usize,
    keys: usize,
}

impl ChunkedAttention {
    /// The chunks of `l` queries over `s` keys. Under a causal mask a chunk's last query sees
    /// keys `0..past + start + len` only, so the chunk's scores stop there (FlashAttention's
    /// causal block skip: about half the work of a full `[L, S]`); a chunk with a query that
    /// sees only padding keeps every key.
    fn chunks(&self, l: usize, s: usize) -> Vec<Chunk> {
        (0..l)
            .step_by(self.chunk)
            .map(|start| {
                let len = self.chunk.min(l - start);
                let first = self.mask.past + start;
                let keys = if self.mask.causal && first >= self.padded_until {
                    (first + len).min(s)
                } else {
                    s
                };
                Chunk { start, len, keys }
            })
            .collect()
    }

    /// The mask of one chunk: the causal limit moves with its queries, and the key padding
    /// is cut to its keys.
    fn chunk_mask(&self, c: Chunk, s: usize) -> Result<KeyMask> {
        let cut = c.keys < s;
        let pad = match &self.mask.pad {
            Some(p) if cut => Some(std::sync::Arc::new(
                p.chunks(s)
                    .flat_map(|row| row[..c.keys].iter().copied())
                    .collect(),
            )),
            p => p.clone(),
        };
        let pad_bias = match &self.mask.pad_bias {
            Some(b) if cut => Some(b.narrow(3, 0, c.keys)?.contiguous()?),
            b => b.clone(),
        };
        Ok(KeyMask {
            past: self.mask.past + c.start,
            pad,
            pad_bias,
            ..self.mask.clone()
        })
    }

    /// [`transposed_for_chunks`] of `x` when the keys and values are transposed once.
    fn transposed(&self, x: &Tensor) -> Result<Option<Tensor>> {
        if self.transpose_once {
            transposed_for_chunks(x).map(Some)
        } else {
            Ok(None)
        }
    }

    /// The probabilities `[N, H, len, keys]` of one chunk's queries `qc [N, H, len, d]`
    /// (contiguous) over the keys `k` (and their copy `kt` of [`transposed_for_chunks`]).
    fn probs(&self, qc: &Tensor, k: &Tensor, kt: Option<&Tensor>, c: Chunk) -> Result<Tensor> {
        let (n, h, _, d) = qc.dims4()?;
        let (kv, s) = (k.dim(1)?, k.dim(2)?);
        let scores = qc
            .reshape((n, kv, (h / kv) * c.len, d))?
            .matmul(&first_rows_t(k, kt, c.keys)?)?;
        attention_softmax(
            &scores.reshape((n, h, c.len, c.keys))?,
            self.scale,
            &self.chunk_mask(c, s)?,
        )
    }

    /// The output `[N, H, L, d]`, chunk by chunk.
    fn forward(&self, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor> {
        let (n, h, l, d) = q.dims4()?;
        let (kv, s) = (k.dim(1)?, k.dim(2)?);
        let kt = self.transposed(k)?;
        let parts = self
            .chunks(l, s)
            .into_iter()
            .map(|c| {
                let qc = q.narrow(2, c.start, c.len)?.contiguous()?;
                let p = self.probs(&qc, k, kt.as_ref(), c)?;
                p.reshape((n, kv, (h / kv) * c.len, c.keys))?
                    .matmul(&v.narrow(2, 0, c.keys)?)?
                    .reshape((n, h, c.len, d))
            })
            .collect::<Result<Vec<_>>>()?;
        Tensor::cat(&parts, 2)
    }

    /// The output handed to the graph, as a storage of its own.
    fn take_out(&self) -> Result<(Storage, Layout)> {
        let out = self
            .out
            .lock()
            .map_err(|_| poisoned())?
            .take()
            .ok_or_else(|| {
                candle_core::Error::Msg(
                    "atomrl-chunked-attention: the output was already taken".into(),
                )
            })?;
        let (storage, layout) = out.storage_and_layout();
        let owned = match &*storage {
            Storage::Cpu(s) => Storage::Cpu(s.try_clone(layout)?),
            #[cfg(feature = "cuda")]
            Storage::Cuda(s) => Storage::Cuda(s.try_clone(layout)?),
            _ => candle_core::bail!("atomrl-chunked-attention: unsupported device"),
        };
        Ok((owned, layout.clone()))
    }
}

/// `x [N, KV, S, d]` transposed once for all chunks, `[N, KV, d, S]`, as the CPU takes it:
/// gemm writes a chunk's `[rows, keys]` scores ~20% faster from this row-major right operand
/// than from `xᵀ` as a view. Not on CUDA: candle's cuBLAS call needs a matrix's rows at a
/// stride equal to their length, which this copy narrowed to a chunk's keys does not have,
/// while it takes the transposed view as it is.
fn transposed_for_chunks(x: &Tensor) -> Result<Tensor> {
    x.t()?.contiguous()
}

/// The first `keys` rows of `x [N, KV, S, d]`, transposed: `[N, KV, d, keys]`, from `xt`
/// ([`transposed_for_chunks`]) where there is one.
fn first_rows_t(x: &Tensor, xt: Option<&Tensor>, keys: usize) -> Result<Tensor> {
    match xt {
        Some(xt) => xt.narrow(3, 0, keys),
        None => x.narrow(2, 0, keys)?.t(),
    }
}

/// The contiguous part of a storage that a layout describes, from offset 0.
fn starts_at_zero(layout: &Layout) -> Result<()> {
    match layout.contiguous_offsets() {
        Some((0, _)) => Ok(()),
        _ => candle_core::bail!("atomrl-chunked-attention: the output is not contiguous"),
    }
}

impl CustomOp3 for ChunkedAttention {
    fn name(&self) -> &'static str {
        "atomrl-chunked-attention"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        match self.take_out()? {
            (Storage::Cpu(s), layout) => {
                starts_at_zero(&layout)?;
                Ok((s, layout.shape().clone()))
            }
            _ => candle_core::bail!("atomrl-chunked-attention: a CPU output was expected"),
        }
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        _: &candle_core::CudaStorage,
        _: &Layout,
        _: &candle_core::CudaStorage,
        _: &Layout,
        _: &candle_core::CudaStorage,
        _: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        match self.take_out()? {
            (Storage::Cuda(s), layout) => {
                starts_at_zero(&layout)?;
                Ok((s, layout.shape().clone()))
            }
            _ => candle_core::bail!("atomrl-chunked-attention: a CUDA output was expected"),
        }
    }

    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let (q, k) = (q.detach(), k.detach());
        let (n, h, l, d) = q.dims4()?;
        let (kv, s) = (k.dim(1)?, k.dim(2)?);
        let v = v.detach();
        let (kt, vt) = (self.transposed(&k)?, self.transposed(&v)?);
        let mut dq = Vec::new();
        // The key and value gradients are summed transposed, `[N, KV, d, S]`: gemm makes
        // `Xᵀ·Y` of two row-major operands ~1.6× faster as `(Yᵀ·X)ᵀ` here (~7 against ~11 ms
        // a chunk at 8 × 2,112 tokens). A chunk's sums cover its keys; later keys get none.
        let (mut dkt, mut dvt): (Option<Tensor>, Option<Tensor>) = (None, None);
        let add = |acc: Option<Tensor>, t: Tensor| -> Result<Tensor> {
            let t = match s - t.dim(3)? {
                0 => t,
                rest => t.pad_with_zeros(3, 0, rest)?,
            };
            match acc {
                Some(a) => a + t,
                None => Ok(t),
            }
        };
        for c in self.chunks(l, s) {
            let rows = (h / kv) * c.len;
            let qc = q.narrow(2, c.start, c.len)?.contiguous()?;
            let p = self.probs(&qc, &k, kt.as_ref(), c)?;
            let g = grad.narrow(2, c.start, c.len)?.contiguous()?;
            let g = g.reshape((n, kv, rows, d))?;
            let pg = p.reshape((n, kv, rows, c.keys))?;
            dvt = Some(add(dvt, g.t()?.matmul(&pg)?)?);
            let dp = g
                .matmul(&first_rows_t(&v, vt.as_ref(), c.keys)?)?
                .reshape((n, h, c.len, c.keys))?;
            let ds =
                attention_softmax_backward(&p, &dp, self.scale)?.reshape((n, kv, rows, c.keys))?;
            dq.push(
                ds.matmul(&k.narrow(2, 0, c.keys)?)?
                    .reshape((n, h, c.len, d))?,
            );
            let qg = qc.reshape((n, kv, rows, d))?;
            dkt = Some(add(dkt, qg.t()?.matmul(&ds)?)?);
        }
        let untranspose = |t: Option<Tensor>| t.map(|t| t.t()?.contiguous()).transpose();
        Ok((
            Some(Tensor::cat(&dq, 2)?),
            untranspose(dkt)?,
            untranspose(dvt)?,
        ))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::kernels::testing::var;
    use candle_core::{DType, Var};
    use proptest::prelude::*;

    fn mask(past: usize, pad: Option<Vec<bool>>) -> KeyMask {
        KeyMask {
            causal: true,
            past,
            pad: pad.map(std::sync::Arc::new),
            mask_value: -1e9,
            pad_bias: None,
        }
    }

    /// Max |a − b| over the elements, and the largest |b|.
    fn diff(a: &Tensor, b: &Tensor) -> (f64, f64) {
        let a = a.to_dtype(DType::F64).unwrap().flatten_all().unwrap();
        let b = b.to_dtype(DType::F64).unwrap().flatten_all().unwrap();
        let d = (a - &b).unwrap().abs().unwrap().max(0).unwrap();
        let m = b.abs().unwrap().max(0).unwrap();
        (d.to_scalar().unwrap(), m.to_scalar().unwrap())
    }

    /// Outputs and q/k/v gradients of the chunked form (budget for `chunk` query rows) and of
    /// the plain form agree within `tol`, relative to each tensor's largest element.
    fn check(dims: (usize, usize, usize, usize, usize), past: usize, chunk: usize, dtype: DType) {
        let (n, h, kv, l, d) = dims;
        let s = past + l;
        let pad: Vec<bool> = (0..n * s).map(|i| i % s < (i / s)).collect();
        let mask = mask(past, Some(pad));
        let q = var(&[n, h, l, d], dtype, 1);
        let k = var(&[n, kv, s, d], dtype, 2);
        let v = var(&[n, kv, s, d], dtype, 3);
        let w = var(&[n, h, l, d], dtype, 4).as_tensor().detach();
        let run = |budget: usize, transpose_once: bool| {
            let (qt, kt, vt) = (q.as_tensor(), k.as_tensor(), v.as_tensor());
            let out = attend_with(qt, kt, vt, 0.3, &mask, budget, transpose_once).unwrap();
            let grads = (&out * &w).unwrap().sum_all().unwrap().backward().unwrap();
            let g = |x: &Var| grads.get(x.as_tensor()).unwrap().clone();
            (out, g(&q), g(&k), g(&v))
        };
        let plain = run(usize::MAX, true);
        let tol = if dtype == DType::F64 { 1e-12 } else { 2e-6 };
        // Both forms of the transposed keys: the CPU's copy, and the view CUDA takes.
        for transpose_once in [true, false] {
            let chunked = run(n * h * s * chunk, transpose_once);
            for (what, a, b) in [
                ("output", &chunked.0, &plain.0),
                ("dq", &chunked.1, &plain.1),
                ("dk", &chunked.2, &plain.2),
                ("dv", &chunked.3, &plain.3),
            ] {
                assert_eq!(a.dims(), b.dims(), "{what}");
                let (d, m) = diff(a, b);
                assert!(
                    d <= tol * m.max(1.0),
                    "{what}: {d} against {m} (chunk {chunk})"
                );
            }
        }
    }

    #[test]
    fn chunks_equal_the_plain_form_with_groups_padding_and_a_past() {
        for dtype in [DType::F64, DType::F32] {
            for chunk in [1, 2, 3, 6] {
                check((2, 4, 2, 7, 8), 0, chunk, dtype);
                check((2, 4, 2, 7, 8), 3, chunk, dtype);
                check((1, 3, 3, 5, 4), 2, chunk, dtype);
            }
        }
    }

    #[test]
    fn a_budget_the_scores_fit_runs_the_plain_form() {
        assert_eq!(query_chunk(8, 4, 2112, DEFAULT_SCORES_BUDGET), 248);
        assert_eq!(query_chunk(2, 2, 10, 3), 1);
        let m = mask(0, None);
        let q = var(&[1, 2, 4, 4], DType::F32, 5);
        let k = var(&[1, 1, 4, 4], DType::F32, 6);
        let (q, k) = (q.as_tensor(), k.as_tensor());
        let out = attend(q, k, k, 0.5, &m, 2 * 4 * 4).unwrap();
        let plain = grouped_attention(q, k, k, |s| attention_softmax(s, 0.5, &m)).unwrap();
        assert_eq!(diff(&out, &plain).0, 0.0);
    }

    #[test]
    fn detached_inputs_give_the_output_without_a_graph() {
        let m = mask(1, None);
        let q = var(&[1, 2, 5, 4], DType::F64, 7).as_tensor().detach();
        let k = var(&[1, 2, 6, 4], DType::F64, 8).as_tensor().detach();
        let chunked = attend(&q, &k, &k, 0.5, &m, 2 * 6 * 2).unwrap();
        assert!(!chunked.track_op());
        let plain = attend(&q, &k, &k, 0.5, &m, usize::MAX).unwrap();
        assert!(diff(&chunked, &plain).0 < 1e-14);
    }

    #[test]
    fn both_forms_of_the_transposed_keys_agree() {
        // The CPU's copy and the view CUDA takes.
        let x = var(&[2, 2, 6, 4], DType::F32, 9).as_tensor().detach();
        let xt = transposed_for_chunks(&x).unwrap();
        for keys in [1, 4, 6] {
            let (a, b) = (
                first_rows_t(&x, Some(&xt), keys).unwrap(),
                first_rows_t(&x, None, keys).unwrap(),
            );
            assert_eq!(a.dims(), &[2, 2, 4, keys]);
            assert_eq!(diff(&a, &b).0, 0.0);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        #[test]
        fn the_result_does_not_depend_on_the_chunk(
            l in 1usize..9, past in 0usize..4, chunk in 1usize..9, groups in 1usize..3,
        ) {
            check((1, 2 * groups, 2, l, 4), past, chunk, DType::F64);
        }
    }
}
