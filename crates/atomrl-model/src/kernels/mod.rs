//! Fused CPU kernels with hand-written backward passes, as candle custom ops.
//!
//! Candle records every tensor op of the training forward as a graph node, allocates its
//! output, and its backward adds a zero-filled gradient buffer per argument; an RMSNorm written
//! from tensor ops is six forward nodes and about fifteen backward ops, each a full pass over
//! memory. On a CPU those passes, not the matmuls, were half of a training step at the 4m shape
//! (`docs/performance.md`). Each kernel here is one node whose forward and backward are single
//! loops over rows:
//!
//! - [`rms_norm`]: `x / sqrt(mean(x²) + eps) * w`;
//! - [`attention_softmax`]: `softmax(scale · scores + causal and key-padding bias)`;
//! - [`rope`]: rotary embeddings (rotate-half layout);
//! - [`swiglu`]: `silu(gate) · up`.
//!
//! They run for f32 and f64 tensors on the CPU; other dtypes and devices take the tensor-op
//! forms of [`crate::ops`] (on CUDA those are graph nodes of cuBLAS/elementwise kernels that
//! the generation view already fuses). Each kernel is tested against its tensor-op form for
//! values and gradients.

mod attention_softmax;
mod rms_norm;
mod rope;
mod swiglu;

pub(crate) use attention_softmax::{attention_softmax, KeyMask};
pub(crate) use rms_norm::rms_norm;
pub(crate) use rope::{rope, rope_fits};
pub(crate) use swiglu::swiglu;

use candle_core::{CpuStorage, DType, Layout, Result, Storage, Tensor, WithDType};
use num_traits::Float;
use rayon::prelude::*;

/// The float types the kernels are written for.
pub(crate) trait Real:
    Float + WithDType + Send + Sync + std::ops::AddAssign + std::ops::DivAssign
{
}
impl Real for f32 {}
impl Real for f64 {}

/// Whether the fused kernels handle tensors like `t` (CPU, f32 or f64).
pub(crate) fn fused_on(t: &Tensor) -> bool {
    t.device().is_cpu() && matches!(t.dtype(), DType::F32 | DType::F64)
}

/// The contiguous elements of a CPU storage under `layout`.
fn slice<'a, T: Real>(s: &'a CpuStorage, layout: &Layout) -> Result<&'a [T]> {
    let data = T::cpu_storage_as_slice(s)?;
    match layout.contiguous_offsets() {
        Some((a, b)) => Ok(&data[a..b]),
        None => candle_core::bail!("atomrl kernel: non-contiguous input"),
    }
}

/// Runs `f` on the elements of a CPU tensor (made contiguous first if it is not), read in
/// place: backward passes read their saved inputs this way instead of copying them out.
fn with_elements<T: Real, R>(t: &Tensor, f: impl FnOnce(&[T]) -> Result<R>) -> Result<R> {
    let t = t.contiguous()?;
    let (storage, layout) = t.storage_and_layout();
    match &*storage {
        Storage::Cpu(s) => f(slice::<T>(s, layout)?),
        _ => candle_core::bail!("atomrl kernel: a CPU tensor was expected"),
    }
}

/// Runs `f` on each `width`-long row of `out` with its row index, on candle's threads when
/// there is more than one and the work is large enough to pay for them (as candle's own CPU
/// ops do: with one thread, no pool is touched, so data-parallel workers never contend).
fn for_rows<T: Real>(out: &mut [T], width: usize, f: impl Fn(usize, &mut [T]) + Sync + Send) {
    let width = width.max(1);
    if candle_core::utils::get_num_threads() > 1 && out.len() >= 1 << 15 {
        out.par_chunks_mut(width)
            .enumerate()
            .with_min_len(((1 << 13) / width).max(1))
            .for_each(|(r, row)| f(r, row));
    } else {
        out.chunks_mut(width)
            .enumerate()
            .for_each(|(r, row)| f(r, row));
    }
}

#[cfg(test)]
pub(crate) mod testing {
    //! Shared checks: a fused kernel against its tensor-op form, values and gradients.
    use candle_core::{DType, Device, Result, Tensor, Var};

    /// Random `[dims]` in `dtype` with values in about `[-2, 2]`.
    pub fn var(dims: &[usize], dtype: DType, seed: u64) -> Var {
        let n: usize = dims.iter().product();
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let v: Vec<f64> = (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s % 4001) as f64 / 1000.0 - 2.0
            })
            .collect();
        let t = Tensor::from_vec(v, dims, &Device::Cpu)
            .and_then(|t| t.to_dtype(dtype))
            .expect("tensor");
        Var::from_tensor(&t).expect("var")
    }

    /// Largest absolute difference.
    pub fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
        (a - b)
            .and_then(|d| d.abs())
            .and_then(|d| d.flatten_all())
            .and_then(|d| d.max(0))
            .and_then(|d| d.to_dtype(DType::F64))
            .and_then(|d| d.to_scalar::<f64>())
            .expect("diff")
    }

    /// Checks `fused(inputs)` against `reference(inputs)`: outputs, and the gradients of
    /// `sum(out · weights)` (random weights) for every input, to `tol`.
    pub fn agree(
        inputs: &[Var],
        fused: impl Fn(&[Tensor]) -> Result<Tensor>,
        reference: impl Fn(&[Tensor]) -> Result<Tensor>,
        tol: f64,
    ) {
        let ts: Vec<Tensor> = inputs.iter().map(|v| v.as_tensor().clone()).collect();
        let a = fused(&ts).expect("fused");
        let b = reference(&ts).expect("reference");
        assert_eq!(a.dims(), b.dims());
        let d = max_diff(&a, &b);
        assert!(d <= tol, "values differ by {d}");
        let w = var(a.dims(), a.dtype(), 99);
        let ga = (a * w.as_tensor())
            .and_then(|x| x.sum_all())
            .and_then(|x| x.backward());
        let gb = (b * w.as_tensor())
            .and_then(|x| x.sum_all())
            .and_then(|x| x.backward());
        let (ga, gb) = (ga.expect("fused backward"), gb.expect("reference backward"));
        for (i, v) in inputs.iter().enumerate() {
            let (x, y) = (ga.get(v.as_tensor()), gb.get(v.as_tensor()));
            match (x, y) {
                (Some(x), Some(y)) => {
                    let d = max_diff(x, y);
                    assert!(d <= tol, "gradient of input {i} differs by {d}");
                }
                (None, None) => {}
                (x, y) => panic!(
                    "input {i}: fused grad {:?}, reference {:?}",
                    x.is_some(),
                    y.is_some()
                ),
            }
        }
    }
}
