//! The element-wise f32 loops of the optimizer and of the gradient sums on the CPU, split over
//! candle's threads for large tensors.
//!
//! Each loop reads and writes a few parameter-sized buffers and does almost no arithmetic, so
//! it runs at memory speed: on the 2-core Intel Xeon one thread moves ~21 GB/s and two ~40 GB/s
//! (docs/performance.md item 17). One thread per loop left half of that on the table, and the
//! optimizer step of a 0.5B model is ~20 GB of traffic. Every element is computed by itself, so
//! the split changes no result; the sum of squares keeps candle's own order exactly
//! ([`sum_of_squares`]).

use rayon::prelude::*;

/// Elements a thread takes at a time.
const CHUNK: usize = 1 << 16;

/// Whether a loop over `len` elements is worth splitting: several threads, and at least four
/// pieces (below that the hand-off costs more than the loop).
fn split(len: usize) -> bool {
    len >= 4 * CHUNK && candle_core::utils::get_num_threads() > 1
}

/// `f(a[i])` for every element.
pub(crate) fn for_each_mut(a: &mut [f32], f: impl Fn(&mut f32) + Sync) {
    let run = |a: &mut [f32]| a.iter_mut().for_each(&f);
    if split(a.len()) {
        a.par_chunks_mut(CHUNK).for_each(run);
    } else {
        run(a);
    }
}

/// `f(a[i], b[i])` for every element; `a` and `b` have one length.
pub(crate) fn zip_mut(a: &mut [f32], b: &[f32], f: impl Fn(&mut f32, f32) + Sync) {
    debug_assert_eq!(a.len(), b.len());
    let run = |(a, b): (&mut [f32], &[f32])| {
        for (a, &b) in a.iter_mut().zip(b) {
            f(a, b);
        }
    };
    if split(a.len()) {
        a.par_chunks_mut(CHUNK)
            .zip(b.par_chunks(CHUNK))
            .for_each(run);
    } else {
        run((a, b));
    }
}

/// `f(a[i], b[i], c[i], d[i])` for every element, writing the first three; the four have one
/// length. Compiled for AVX-512 where the CPU has it: the optimizer's update divides and takes
/// a square root per element, and at 4 SSE lanes that arithmetic, not memory, bounded the loop.
/// Each lane rounds as a scalar would (no operation is fused or reordered), so the width
/// changes no bit.
pub(crate) fn zip4_mut3(
    a: &mut [f32],
    b: &mut [f32],
    c: &mut [f32],
    d: &[f32],
    f: impl Fn(&mut f32, &mut f32, &mut f32, f32) + Sync,
) {
    debug_assert!(a.len() == b.len() && a.len() == c.len() && a.len() == d.len());
    if split(a.len()) {
        a.par_chunks_mut(CHUNK)
            .zip(b.par_chunks_mut(CHUNK))
            .zip(c.par_chunks_mut(CHUNK))
            .zip(d.par_chunks(CHUNK))
            .for_each(|(((a, b), c), d)| zip4_widest(a, b, c, d, &f));
    } else {
        zip4_widest(a, b, c, d, &f);
    }
}

/// [`zip4`] in the widest vectors the CPU has.
fn zip4_widest<F: Fn(&mut f32, &mut f32, &mut f32, f32)>(
    a: &mut [f32],
    b: &mut [f32],
    c: &mut [f32],
    d: &[f32],
    f: &F,
) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            #[allow(unsafe_code)]
            // SAFETY: the CPU has AVX-512F, checked just above.
            return unsafe { zip4_avx512(a, b, c, d, f) };
        }
    }
    zip4(a, b, c, d, f)
}

/// [`zip4`] compiled for AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn zip4_avx512<F: Fn(&mut f32, &mut f32, &mut f32, f32)>(
    a: &mut [f32],
    b: &mut [f32],
    c: &mut [f32],
    d: &[f32],
    f: &F,
) {
    zip4(a, b, c, d, f)
}

/// The element loop of [`zip4_mut3`], inlined into each of its compiled forms.
#[inline(always)]
fn zip4<F: Fn(&mut f32, &mut f32, &mut f32, f32)>(
    a: &mut [f32],
    b: &mut [f32],
    c: &mut [f32],
    d: &[f32],
    f: &F,
) {
    for (((a, b), c), &d) in a.iter_mut().zip(b.iter_mut()).zip(c.iter_mut()).zip(d) {
        f(a, b, c, d);
    }
}

/// `a[i] + b[i]` into a new buffer (candle's `a + b`).
pub(crate) fn sum(a: &[f32], b: &[f32]) -> Vec<f32> {
    debug_assert_eq!(a.len(), b.len());
    if split(a.len()) {
        a.par_iter()
            .zip(b)
            .with_min_len(CHUNK)
            .map(|(&a, &b)| a + b)
            .collect()
    } else {
        a.iter().zip(b).map(|(&a, &b)| a + b).collect()
    }
}

/// `Σ x²` of `xs` with the bits of candle's `sqr()` then `sum_all()` on the CPU, without the
/// buffer of squares (`None` where candle's order is not the one written here).
///
/// Candle squares each element in f32 and sums the squares with its `vec_sum`: on x86 with
/// AVX2, four 8-lane accumulators over blocks of 32 elements, folded as `(a0 + a1) + (a2 + a3)`,
/// then the eight lanes as `((l0 + l4) + (l1 + l5)) + ((l2 + l6) + (l3 + l7))`, then the
/// remainder one by one; elsewhere on x86 one running sum. Rust neither fuses nor reorders f32
/// additions, so the arrays below give exactly those roundings.
pub(crate) fn sum_of_squares(xs: &[f32]) -> Option<f32> {
    #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
    {
        if std::arch::is_x86_feature_detected!("avx2") {
            #[allow(unsafe_code)]
            // SAFETY: the CPU has AVX2, checked just above.
            return Some(unsafe { blocked_sum_of_squares_avx2(xs) });
        }
        Some(xs.iter().fold(0f32, |s, &x| s + x * x))
    }
    #[cfg(not(any(target_arch = "x86", target_arch = "x86_64")))]
    {
        let _ = xs;
        None
    }
}

/// [`blocked_sum_of_squares`] compiled for AVX2, whose 8-lane registers hold one accumulator
/// each (the lanes are independent sums, so the width changes no rounding).
#[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
#[target_feature(enable = "avx2")]
fn blocked_sum_of_squares_avx2(xs: &[f32]) -> f32 {
    blocked_sum_of_squares(xs)
}

/// [`sum_of_squares`] in the order of candle's AVX2 `vec_sum`.
#[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
#[inline(always)]
fn blocked_sum_of_squares(xs: &[f32]) -> f32 {
    const LANES: usize = 8;
    const STEP: usize = 4 * LANES;
    let mut acc = [[0f32; LANES]; 4];
    let blocks = xs.chunks_exact(STEP);
    let rest = blocks.remainder();
    for block in blocks {
        for (a, part) in acc.iter_mut().zip(block.chunks_exact(LANES)) {
            for (s, &x) in a.iter_mut().zip(part) {
                *s += x * x;
            }
        }
    }
    let lanes = |a: [f32; LANES], b: [f32; LANES]| std::array::from_fn(|l| a[l] + b[l]);
    let x = lanes(lanes(acc[0], acc[1]), lanes(acc[2], acc[3]));
    let t: [f32; 4] = std::array::from_fn(|l| x[l] + x[l + 4]);
    let mut total = (t[0] + t[1]) + (t[2] + t[3]);
    for &x in rest {
        total += x * x;
    }
    total
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use candle_core::{Device, Tensor};

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| ((i as u32).wrapping_mul(2_654_435_761) ^ seed) as f32 * 1e-9 - 2.1)
            .collect()
    }

    #[test]
    fn the_sum_of_squares_has_candles_bits() {
        for n in [0, 1, 7, 31, 32, 33, 64, 95, 1000, 100_003, 4 * CHUNK + 5] {
            let xs = values(n, n as u32);
            let Some(ours) = sum_of_squares(&xs) else {
                return;
            };
            let t = Tensor::from_vec(xs, n, &Device::Cpu).unwrap();
            let candle: f32 = t.sqr().unwrap().sum_all().unwrap().to_scalar().unwrap();
            assert_eq!(ours.to_bits(), candle.to_bits(), "{n} elements");
        }
    }

    #[test]
    fn split_loops_touch_every_element_once() {
        for n in [0, 3, CHUNK, 4 * CHUNK + 17] {
            let b = values(n, 1);
            let c = values(n, 2);
            let mut a = values(n, 3);
            let want: Vec<f32> = a
                .iter()
                .zip(&b)
                .zip(&c)
                .map(|((&a, &b), &c)| a * b + c)
                .collect();
            let (mut b2, mut c2) = (b.clone(), c.clone());
            zip4_mut3(&mut a, &mut b2, &mut c2, &c, |a, b, c, d| {
                *a = *a * *b + d;
                *b = -*b;
                *c = c.abs().sqrt() / d;
            });
            assert_eq!(a, want);
            let neg: Vec<f32> = b.iter().map(|&b| -b).collect();
            let root: Vec<f32> = c.iter().map(|&c| c.abs().sqrt() / c).collect();
            assert_eq!(b2, neg);
            assert_eq!(
                c2.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                root.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
            );
            zip_mut(&mut a, &b, |a, b| *a -= b);
            for_each_mut(&mut a, |a| *a *= 2.0);
            let twice: Vec<f32> = want.iter().zip(&b).map(|(&w, &b)| (w - b) * 2.0).collect();
            assert_eq!(a, twice);
            let s: Vec<f32> = b.iter().zip(&c).map(|(&b, &c)| b + c).collect();
            assert_eq!(sum(&b, &c), s);
        }
    }
}
