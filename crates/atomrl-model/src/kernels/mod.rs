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
//! They run for f32 and f64 tensors on the CPU, and (feature `cuda`) for f32, bf16 and f16
//! tensors on CUDA, where `cuda.rs` launches atomrl-core's `cuda/model.cu` (one block per row,
//! f32 arithmetic) in their forward and backward; `ATOMRL_CUDA_FUSED=0` sends CUDA back to the
//! tensor-op forms of [`crate::ops`]. Each kernel is tested against its tensor-op form for
//! values and gradients on the CPU; `xtask device-check` compares the CUDA forms with the CPU
//! and with the tensor-op forms on the device.

mod attention_softmax;
#[cfg(feature = "cuda")]
mod cuda;
mod decode;
mod exp;
mod gemv;
mod rms_norm;
mod rope;
#[cfg(test)]
mod sim_tests;
mod swiglu;

pub(crate) use attention_softmax::{attention_softmax, attention_softmax_backward, KeyMask};
pub(crate) use decode::{add_rms_norm, swiglu_packed};
pub use exp::exp_detached;
pub(crate) use gemv::{row_split_gemv, splits_rows};
pub(crate) use rms_norm::{rms_norm, rms_norm_rounding_once};
pub(crate) use rope::{rope, rope_fits};
pub(crate) use swiglu::swiglu;

use candle_core::{CpuStorage, DType, Layout, Result, Storage, Tensor, WithDType};
use num_traits::Float;
use rayon::prelude::*;

/// The float types the kernels are written for.
pub(crate) trait Real:
    Float + WithDType + Send + Sync + std::ops::AddAssign + std::ops::SubAssign + std::ops::DivAssign
{
    /// Replaces each element by its exponential: SIMD for f32 ([`exp::exp_in_place`]), libm
    /// for f64 (the precision the gradient checks compare at).
    fn exp_in_place(xs: &mut [Self]);
}

impl Real for f32 {
    fn exp_in_place(xs: &mut [Self]) {
        exp::exp_in_place(xs);
    }
}

impl Real for f64 {
    fn exp_in_place(xs: &mut [Self]) {
        for x in xs {
            // exp underflows to exactly 0 below about −745; masked attention scores sit ~1e9
            // below the row's max, and libm's underflow path is slow.
            *x = if *x < -746.0 { 0.0 } else { x.exp() };
        }
    }
}

/// Whether the fused kernels handle tensors like `t`: f32 or f64 on the CPU; f32, bf16 or f16
/// on CUDA with the `cuda` feature, unless `ATOMRL_CUDA_FUSED=0`
/// ([`atomrl_core::device::cuda_fused_kernels`]).
pub(crate) fn fused_on(t: &Tensor) -> bool {
    if t.device().is_cpu() {
        return matches!(t.dtype(), DType::F32 | DType::F64);
    }
    #[cfg(feature = "cuda")]
    if t.device().is_cuda() {
        return atomrl_core::device::cuda_fused_kernels()
            && cuda::supports(t.dtype())
            && verified_on(t.device());
    }
    false
}

/// Whether the CUDA kernels passed their self-check on `device`: the first time they are
/// asked for on a GPU, each kernel runs once fused and once in its tensor-op form on that GPU
/// ([`crate::kernel_check::self_check`]); if any output or gradient disagrees, or is not
/// finite, a warning says which and this process keeps the tensor-op forms on that GPU. A
/// bad kernel (a driver or architecture the kernels were not checked on) thus costs speed,
/// not correctness.
#[cfg(feature = "cuda")]
fn verified_on(device: &candle_core::Device) -> bool {
    passes_once(
        device,
        "AtomRL's fused CUDA kernels",
        "the tensor-op forms (ATOMRL_CUDA_FUSED=0 skips the check)",
        crate::kernel_check::self_check,
    )
}

/// Whether `check` passed on `device`, run the first time this process asks (per GPU and
/// `what`); a failure is warned about once, naming `what`, why, and the `fallback` taken. While
/// the check runs, the answer is yes: its own runs must reach what it checks.
#[cfg(feature = "cuda")]
pub(crate) fn passes_once(
    device: &candle_core::Device,
    what: &'static str,
    fallback: &str,
    check: fn(&candle_core::Device) -> std::result::Result<(), String>,
) -> bool {
    use std::collections::BTreeMap;
    use std::sync::Mutex;
    #[derive(Clone, Copy, PartialEq)]
    enum State {
        Checking,
        Good,
        Bad,
    }
    static STATES: Mutex<BTreeMap<(usize, &'static str), State>> = Mutex::new(BTreeMap::new());
    let candle_core::DeviceLocation::Cuda { gpu_id } = device.location() else {
        return false;
    };
    {
        let Ok(mut states) = STATES.lock() else {
            return false;
        };
        match states.get(&(gpu_id, what)) {
            Some(State::Good | State::Checking) => return true,
            Some(State::Bad) => return false,
            None => {
                states.insert((gpu_id, what), State::Checking);
            }
        }
    }
    let state = match check(device) {
        Ok(()) => State::Good,
        Err(why) => {
            eprintln!(
                "warning: {what} failed their self-check on cuda:{gpu_id} ({why}); using \
                 {fallback} there"
            );
            State::Bad
        }
    };
    if let Ok(mut states) = STATES.lock() {
        states.insert((gpu_id, what), state);
    }
    state == State::Good
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

    /// The elements of `t` as f32, in row-major order.
    pub fn flat(t: &Tensor) -> Vec<f32> {
        t.flatten_all()
            .and_then(|t| t.to_dtype(DType::F32))
            .and_then(|t| t.to_vec1())
            .expect("f32 elements")
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
