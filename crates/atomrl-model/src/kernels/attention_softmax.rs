//! Attention probabilities as one graph node: `softmax(scale · scores + bias)` over the keys,
//! with the causal and key-padding bias applied from the mask's description instead of
//! broadcast-added tensors (three full passes and their backward sums saved).

use std::sync::Arc;

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp1, DType, Layout, Result, Shape, Tensor};

use super::{for_rows, slice, with_elements, Real};

/// Which keys a query may not see, as [`crate::input::AttentionBias`] describes them: keys
/// after the query (`causal`, query `i` of the new block sees keys `0..=past + i`) and padded
/// keys (`pad[n·S + j]`); each adds `mask_value` to the score, as the bias tensors do.
#[derive(Debug, Clone, Default)]
pub(crate) struct KeyMask {
    pub causal: bool,
    pub past: usize,
    pub pad: Option<Arc<Vec<bool>>>,
    pub mask_value: f64,
    /// The key-padding bias on the device, `[N, 1, 1, S]` (0 or `mask_value`), for the CUDA
    /// kernel, which reads it instead of `pad`.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub pad_bias: Option<Tensor>,
}

struct AttentionSoftmax {
    scale: f64,
    mask: KeyMask,
}

impl AttentionSoftmax {
    fn forward<T: Real>(&self, scores: &[T], dims: &[usize]) -> Vec<T> {
        let (heads, l, s) = (dims[1], dims[2], dims[3]);
        let scale = T::from(self.scale).unwrap_or_else(T::one);
        let neg = T::from(self.mask.mask_value as f32).unwrap_or_else(T::min_value);
        let mut out = vec![T::zero(); scores.len()];
        for_rows(&mut out, s, |r, p| {
            let (n, i) = (r / (heads * l), r % l);
            let pad = self.mask.pad.as_ref().map(|m| &m[n * s..(n + 1) * s]);
            let row = &scores[r * s..(r + 1) * s];
            // Keys past the causal limit sit `mask_value` below a key the query sees, so their
            // exponential is exactly 0 (as `exp_in_place` makes it) and adds nothing to the sum:
            // they are written as 0 without the passes, half of a training row's keys. Only
            // when no key up to the limit is unpadded (a padding query) does the full row
            // decide the max.
            let limit = (self.mask.past + i + 1).min(s);
            if self.mask.causal
                && limit < s
                && pad.is_none_or(|m| m[..limit].iter().any(|&padded| !padded))
            {
                let (seen, unseen) = p.split_at_mut(limit);
                unseen.fill(T::zero());
                let pad = pad.map(|m| &m[..limit]);
                softmax_row(seen, &row[..limit], scale, neg, pad, limit);
                return;
            }
            let masked_from = if self.mask.causal { limit } else { s };
            softmax_row(p, row, scale, neg, pad, masked_from);
        });
        out
    }
}

/// Defines `fn $name<T: Real>(args)`, which runs `$body(args)` (an `#[inline(always)]` row
/// loop) compiled for AVX-512F or AVX2 when the CPU has them, else for the baseline: runtime
/// dispatch, as `exp::exp_in_place` does, so each wrapper holds a copy of the loop vectorised
/// for its features.
macro_rules! widest_simd {
    ($(#[$doc:meta])* fn $name:ident => $body:ident($($arg:ident: $ty:ty),* $(,)?)) => {
        $(#[$doc])*
        fn $name<T: Real>($($arg: $ty),*) {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f")]
                fn avx512<T: Real>($($arg: $ty),*) {
                    $body($($arg),*)
                }
                #[target_feature(enable = "avx2")]
                fn avx2<T: Real>($($arg: $ty),*) {
                    $body($($arg),*)
                }
                if std::arch::is_x86_feature_detected!("avx512f") {
                    #[allow(unsafe_code)]
                    // SAFETY: the CPU has AVX-512F, checked just above.
                    unsafe {
                        avx512($($arg),*)
                    };
                    return;
                }
                if std::arch::is_x86_feature_detected!("avx2") {
                    #[allow(unsafe_code)]
                    // SAFETY: the CPU has AVX2, checked just above.
                    unsafe {
                        avx2($($arg),*)
                    };
                    return;
                }
            }
            $body($($arg),*)
        }
    };
}

widest_simd! {
    /// `softmax(scale · row + bias)` of one row, the bias `neg` on keys from `masked_from`
    /// (causality) and again on padded keys.
    fn softmax_row => softmax_row_lanes(
        p: &mut [T],
        row: &[T],
        scale: T,
        neg: T,
        pad: Option<&[bool]>,
        masked_from: usize,
    )
}

widest_simd! {
    /// One row of [`backward`]: `d = scale · p · (g − Σ g·p)`.
    fn backward_row => backward_row_lanes(d: &mut [T], p: &[T], g: &[T], scale: T)
}

/// Lanes of the row reductions: 16 independent accumulators, which the compiler keeps in
/// SIMD registers. A single running max or sum is one long dependency chain that it may not
/// reorder (float addition is not associative), one element per add's latency; this was ~19%
/// of a training step at 2,112 tokens (perf).
const LANES: usize = 16;

/// The largest element (NaNs ignored, as `Float::max` does; −∞ for an empty slice).
#[inline(always)]
fn max_lanes<T: Real>(xs: &[T]) -> T {
    let mut acc = [T::neg_infinity(); LANES];
    let chunks = xs.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for (a, &x) in acc.iter_mut().zip(c) {
            *a = if x > *a { x } else { *a };
        }
    }
    rest.iter()
        .chain(&acc)
        .fold(T::neg_infinity(), |m, &x| if x > m { x } else { m })
}

/// `Σ xs`, summed in [`LANES`] interleaved partial sums and then in order.
#[inline(always)]
fn sum_lanes<T: Real>(xs: &[T]) -> T {
    let mut acc = [T::zero(); LANES];
    let chunks = xs.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for (a, &x) in acc.iter_mut().zip(c) {
            *a += x;
        }
    }
    acc.iter().chain(rest).fold(T::zero(), |s, &x| s + x)
}

/// `Σ a·b`, in lanes as [`sum_lanes`].
#[inline(always)]
fn dot_lanes<T: Real>(a: &[T], b: &[T]) -> T {
    let mut acc = [T::zero(); LANES];
    let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for ((s, &x), &y) in acc.iter_mut().zip(x).zip(y) {
            *s += x * y;
        }
    }
    let tail = ra.iter().zip(rb).fold(T::zero(), |s, (&x, &y)| s + x * y);
    acc.iter().fold(T::zero(), |s, &x| s + x) + tail
}

/// The body of [`softmax_row`]: each pass a loop the compiler vectorises.
#[inline(always)]
fn softmax_row_lanes<T: Real>(
    p: &mut [T],
    row: &[T],
    scale: T,
    neg: T,
    pad: Option<&[bool]>,
    masked_from: usize,
) {
    for (p, &v) in p.iter_mut().zip(row) {
        *p = v * scale;
    }
    if let Some(masked) = p.get_mut(masked_from..) {
        for p in masked {
            *p += neg;
        }
    }
    if let Some(m) = pad {
        for (p, &padded) in p.iter_mut().zip(m) {
            if padded {
                *p += neg;
            }
        }
    }
    let max = max_lanes(p);
    for p in p.iter_mut() {
        *p -= max;
    }
    // Masked keys sit ~1e9 below the max: their exponential is exactly 0 (f32's SIMD
    // exp returns 0 below the normal range without touching subnormals).
    T::exp_in_place(p);
    let sum = sum_lanes(p);
    for p in p.iter_mut() {
        *p /= sum;
    }
}

/// `dscores = scale · p · (g − Σ g·p)` per row.
fn backward<T: Real>(p: &[T], g: &[T], s: usize, scale: f64) -> Vec<T> {
    let scale = T::from(scale).unwrap_or_else(T::one);
    let mut dx = vec![T::zero(); p.len()];
    for_rows(&mut dx, s, |r, d| {
        let (pr, gr) = (&p[r * s..(r + 1) * s], &g[r * s..(r + 1) * s]);
        backward_row(d, pr, gr, scale);
    });
    dx
}

/// The body of [`backward_row`].
#[inline(always)]
fn backward_row_lanes<T: Real>(d: &mut [T], p: &[T], g: &[T], scale: T) {
    let dot = dot_lanes(p, g);
    for ((d, &pv), &gv) in d.iter_mut().zip(p).zip(g) {
        *d = scale * (pv * (gv - dot));
    }
}

impl CustomOp1 for AttentionSoftmax {
    fn name(&self) -> &'static str {
        "atomrl-attention-softmax"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let dims = layout.dims();
        if dims.len() != 4 {
            candle_core::bail!(
                "atomrl-attention-softmax: scores must be [N, H, L, S], got {dims:?}"
            );
        }
        let out = match storage.dtype() {
            DType::F32 => CpuStorage::F32(self.forward(slice(storage, layout)?, dims)),
            DType::F64 => CpuStorage::F64(self.forward(slice(storage, layout)?, dims)),
            dt => candle_core::bail!("atomrl-attention-softmax: unsupported dtype {dt:?}"),
        };
        Ok((out, layout.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        storage: &candle_core::CudaStorage,
        layout: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let out = super::cuda::attn_softmax_fwd(storage, layout, self.scale, &self.mask)?;
        Ok((out, layout.shape().clone()))
    }

    fn bwd(&self, _scores: &Tensor, res: &Tensor, g: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(attention_softmax_backward(res, g, self.scale)?))
    }
}

/// The gradient of [`attention_softmax`] with respect to its raw scores, from its output
/// probabilities `p [N, H, L, S]` and their gradient `g` (same shape):
/// `scale · p · (g − Σ g·p)` per row.
pub(crate) fn attention_softmax_backward(p: &Tensor, g: &Tensor, scale: f64) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if p.device().is_cuda() {
        return super::cuda::attn_softmax_bwd(p, g, scale);
    }
    let s = p.dim(candle_core::D::Minus1)?;
    fn run<T: Real>(p: &Tensor, g: &Tensor, s: usize, scale: f64) -> Result<Tensor> {
        let dx = with_elements::<T, _>(p, |p| {
            with_elements::<T, _>(g, |g| Ok(backward(p, g, s, scale)))
        })?;
        Tensor::from_vec(dx, p.shape(), p.device())
    }
    match p.dtype() {
        DType::F32 => run::<f32>(p, g, s, scale),
        DType::F64 => run::<f64>(p, g, s, scale),
        dt => candle_core::bail!("atomrl-attention-softmax: unsupported dtype {dt:?}"),
    }
}

/// Attention probabilities `[N, H, L, S]` of raw scores `q·kᵀ [N, H, L, S]` (f32/f64 on the
/// CPU, f32/bf16/f16 on CUDA).
pub(crate) fn attention_softmax(scores: &Tensor, scale: f64, mask: &KeyMask) -> Result<Tensor> {
    scores.contiguous()?.apply_op1(AttentionSoftmax {
        scale,
        mask: mask.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testing::{agree, var};
    use candle_core::{Device, D};

    /// The tensor-op form: scale, add the bias tensors, softmax with a detached max.
    fn reference(scores: &Tensor, scale: f64, mask: &KeyMask) -> Result<Tensor> {
        let (n, _, l, s) = scores.dims4()?;
        let neg = mask.mask_value as f32;
        let mut causal = vec![0f32; l * s];
        for i in 0..l {
            for j in 0..s {
                if mask.causal && j > mask.past + i {
                    causal[i * s + j] = neg;
                }
            }
        }
        let dt = scores.dtype();
        let causal = Tensor::from_vec(causal, (1, 1, l, s), &Device::Cpu)?.to_dtype(dt)?;
        let mut x = (scores * scale)?.broadcast_add(&causal)?;
        if let Some(pad) = &mask.pad {
            let p: Vec<f32> = pad.iter().map(|&m| if m { neg } else { 0.0 }).collect();
            let p = Tensor::from_vec(p, (n, 1, 1, s), &Device::Cpu)?.to_dtype(dt)?;
            x = x.broadcast_add(&p)?;
        }
        let max = x.max_keepdim(D::Minus1)?.detach();
        let e = x.broadcast_sub(&max)?.exp()?;
        e.broadcast_div(&e.sum_keepdim(D::Minus1)?)
    }

    #[test]
    fn matches_the_tensor_op_form_with_causal_and_padding_masks() {
        // Two rows, left padding on the second (its first two keys are pads), a cached past of
        // 2 positions before 3 new queries over 5 keys, and a full-prompt case without past.
        let pad = Arc::new(vec![
            false, false, false, false, false, true, true, false, false, false,
        ]);
        for (past, l) in [(2, 3), (0, 5)] {
            let mask = KeyMask {
                causal: true,
                past,
                pad: Some(pad.clone()),
                mask_value: -1e9,
                pad_bias: None,
            };
            for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 1e-6)] {
                let scores = var(&[2, 3, l, 5], dtype, 5 + past as u64);
                agree(
                    &[scores],
                    |t| attention_softmax(&t[0], 0.35, &mask),
                    |t| reference(&t[0], 0.35, &mask),
                    tol,
                );
            }
        }
    }

    #[test]
    fn without_any_mask_it_is_a_scaled_softmax() {
        let mask = KeyMask {
            causal: false,
            past: 0,
            pad: None,
            mask_value: -1e9,
            pad_bias: None,
        };
        let scores = var(&[1, 2, 1, 7], DType::F64, 8);
        agree(
            &[scores],
            |t| attention_softmax(&t[0], 0.5, &mask),
            |t| reference(&t[0], 0.5, &mask),
            1e-12,
        );
    }
}
