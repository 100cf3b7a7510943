//! `e^x` over a slice of f32, in SIMD registers.
//!
//! The SwiGLU gate and the attention softmax take one exponential per element. Through libm's
//! `expf` (a call per element, no vectorisation) those were ~9% of a reward-model training step
//! on a 2-core Intel Xeon and SwiGLU's backward another ~10% (perf, docs/performance.md); the
//! loop here has no call in it, so the compiler keeps 16 lanes (AVX-512), 8 (AVX2) or 4 (SSE2)
//! in flight. Hand-written because no kept crate offers a vectorisable f32 exp that works on
//! stable Rust without pulling a SIMD framework in.
//!
//! The method is Cephes' `expf`: `x = n·ln 2 + r` with `|r| ≤ ln 2 / 2` (Cody-Waite reduction,
//! `ln 2` in two parts so that `n·ln2_hi` is exact), a degree-7 polynomial for `e^r`, and `2^n`
//! built from its exponent bits in two halves so that no intermediate leaves the normal range.
//! Every step is a plain IEEE multiply or add (Rust never fuses them), so the AVX-512, AVX2 and
//! portable paths give the same bits, on Intel and AMD alike. Relative error ≤ 2 ulp against
//! the exact value (tested against f64 over the whole range); results below the smallest
//! normal f32 (`x < −87.34`, where libm returns subnormals down to `x ≈ −104`) are 0, which
//! also keeps the CPU off its slow subnormal path for masked attention scores.

use candle_core::{DType, Result, Tensor};
use rayon::prelude::*;

/// ln(f32::MIN_POSITIVE): below this `e^x` is not a normal f32 and is returned as 0.
const LOWEST: f32 = -87.336_55;
/// Above this `e^x` overflows to +inf (the clamp keeps `n` in range; the product overflows).
const HIGHEST: f32 = 89.0;

/// `e^x` for one element; `#[inline(always)]` so that the slice loops vectorise it.
// The constants are Cephes' published digits, left as published; the compiler rounds them.
#[allow(clippy::excessive_precision)]
#[inline(always)]
fn exp_one(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_375;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // 1.5 · 2^23: adding it rounds to an integer held in the low mantissa bits.
    const ROUND: f32 = 12_582_912.0;
    let xc = x.clamp(LOWEST, HIGHEST);
    let t = xc * LOG2E + ROUND;
    let n = (t.to_bits() as i32).wrapping_sub(ROUND.to_bits() as i32);
    let nf = t - ROUND;
    let r = (xc - nf * LN2_HI) - nf * LN2_LO;
    let mut p: f32 = 1.987_569_15e-4;
    p = p * r + 1.398_199_950_7e-3;
    p = p * r + 8.333_451_907_3e-3;
    p = p * r + 4.166_579_589_4e-2;
    p = p * r + 1.666_666_545_9e-1;
    p = p * r + 5.000_000_120_1e-1;
    let y = p * (r * r) + r + 1.0;
    let half = n >> 1;
    let a = f32::from_bits((half.wrapping_add(127) as u32).wrapping_shl(23));
    let b = f32::from_bits((n.wrapping_sub(half).wrapping_add(127) as u32).wrapping_shl(23));
    // NaN compares false and stays NaN.
    if x < LOWEST {
        0.0
    } else {
        y * a * b
    }
}

/// The portable loop (SSE2 on any x86-64; NEON on aarch64).
#[inline(always)]
fn exp_loop(xs: &mut [f32]) {
    for x in xs {
        *x = exp_one(*x);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn exp_avx512(xs: &mut [f32]) {
    exp_loop(xs);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn exp_avx2(xs: &mut [f32]) {
    exp_loop(xs);
}

/// Replaces every element of `xs` by its exponential, with the widest SIMD the CPU has (the
/// same bits on every path; tests below).
pub(crate) fn exp_in_place(xs: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            #[allow(unsafe_code)]
            // SAFETY: the CPU has AVX-512F, checked just above.
            unsafe {
                exp_avx512(xs)
            };
            return;
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            #[allow(unsafe_code)]
            // SAFETY: the CPU has AVX2, checked just above.
            unsafe {
                exp_avx2(xs)
            };
            return;
        }
    }
    exp_loop(xs);
}

/// `e^x` of every element of `xs`, `[any shape]` → the same shape, without a graph.
///
/// On the CPU in f32 this is the vectorised exp of this module (≤ 2 ulp; 0 below −87.34,
/// where libm returns subnormals), split over candle's threads for large tensors as candle's
/// own unary ops are; every other dtype and device takes candle's `exp`. For the softmax over a
/// vocabulary (atomrl-logprob's selective log-softmax), where libm's `expf` was the largest
/// cost after the matmuls.
///
/// # Errors
/// The tensor cannot be read (candle's error).
///
/// # Example
/// ```
/// use candle_core::{Device, Tensor};
/// let x = Tensor::new(&[0f32, 1.0, -100.0], &Device::Cpu)?;
/// let e = atomrl_model::exp_detached(&x)?.to_vec1::<f32>()?;
/// assert!((e[0] - 1.0).abs() < 1e-7 && (e[1] - std::f32::consts::E).abs() < 1e-6);
/// assert_eq!(e[2], 0.0);
/// # Ok::<(), candle_core::Error>(())
/// ```
pub fn exp_detached(xs: &Tensor) -> Result<Tensor> {
    if !(xs.device().is_cpu() && xs.dtype() == DType::F32) {
        return xs.detach().exp();
    }
    let mut values = xs.flatten_all()?.to_vec1::<f32>()?;
    const CHUNK: usize = 1 << 14;
    if candle_core::utils::get_num_threads() > 1 && values.len() >= 4 * CHUNK {
        values.par_chunks_mut(CHUNK).for_each(exp_in_place);
    } else {
        exp_in_place(&mut values);
    }
    Tensor::from_vec(values, xs.shape(), xs.device())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Distance in units in the last place between `got` and the exact `e^x` (f64).
    fn ulps(got: f32, x: f32) -> f64 {
        let exact = f64::from(x).exp();
        let ulp = f64::from(f32::EPSILON) * exact.abs().max(f64::from(f32::MIN_POSITIVE));
        (f64::from(got) - exact).abs() / ulp
    }

    #[test]
    fn within_two_ulp_of_the_exact_value_over_the_normal_range() {
        let mut x = LOWEST;
        let mut worst = 0f64;
        let (mut xs, mut count) = (Vec::new(), 0);
        while x < 88.7 {
            xs.push(x);
            x += 0.000_731;
            count += 1;
        }
        let mut got = xs.clone();
        exp_in_place(&mut got);
        for (&x, &g) in xs.iter().zip(&got) {
            worst = worst.max(ulps(g, x));
        }
        assert!(count > 200_000);
        assert!(worst <= 2.0, "worst error {worst} ulp");
    }

    #[test]
    fn edges_nan_and_infinities() {
        let mut v = [
            0.0,
            -0.0,
            1.0,
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            -1e9,
            -88.0,
            89.5,
            88.7,
        ];
        exp_in_place(&mut v);
        assert_eq!(v[0], 1.0);
        assert_eq!(v[1], 1.0);
        assert!((v[2] - std::f32::consts::E).abs() <= f32::EPSILON * 3.0);
        assert!(v[3].is_nan());
        assert_eq!(v[4], f32::INFINITY);
        assert_eq!(v[5], 0.0);
        assert_eq!(v[6], 0.0); // a masked attention score
        assert_eq!(v[7], 0.0); // below the normal range
        assert_eq!(v[8], f32::INFINITY);
        assert!(v[9].is_finite() && ulps(v[9], 88.7) <= 2.0);
    }

    #[test]
    fn every_simd_path_gives_the_portable_bits() {
        let xs: Vec<f32> = (0..10_007).map(|i| (i as f32 - 5000.0) * 0.0191).collect();
        let mut portable = xs.clone();
        exp_loop(&mut portable);
        let mut dispatched = xs.clone();
        exp_in_place(&mut dispatched);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&portable), bits(&dispatched));
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            let mut avx2 = xs.clone();
            #[allow(unsafe_code)]
            // SAFETY: AVX2 checked above.
            unsafe {
                exp_avx2(&mut avx2)
            };
            assert_eq!(bits(&portable), bits(&avx2));
        }
    }

    /// The tensor form keeps the shape, is the slice loop's bits whether or not it splits
    /// over threads, and leaves f64 to libm.
    #[test]
    fn the_tensor_form_is_the_slice_loop_in_any_shape() {
        use candle_core::{Device, Tensor};
        let n = 2 * 3 * 16_500;
        let xs: Vec<f32> = (0..n).map(|i| (i % 4001) as f32 * 0.05 - 100.0).collect();
        let t = Tensor::from_vec(xs.clone(), (2, 3, 16_500), &Device::Cpu).unwrap();
        let got = exp_detached(&t).unwrap();
        assert_eq!(got.dims(), t.dims());
        let mut want = xs;
        exp_loop(&mut want);
        let got: Vec<u32> = got
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap()
            .iter()
            .map(|x| x.to_bits())
            .collect();
        assert_eq!(got, want.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
        let t64 = Tensor::new(&[0.5f64, -800.0], &Device::Cpu).unwrap();
        let e64 = exp_detached(&t64).unwrap().to_vec1::<f64>().unwrap();
        assert_eq!(e64, vec![0.5f64.exp(), 0.0]);
    }
}
