//! One row through a large linear layer, its output rows split over candle's threads.
//!
//! A product of one row (`x [1, in] · Wᵀ`, a decode step at batch 1) is a matrix-vector
//! product: it reads the whole weight once and does two flops per element, so its time is the
//! weight's size over the memory bandwidth. gemm sends it to its matrix-vector kernel, which
//! runs on one thread whatever parallelism it is given, and one core of the 2-core Intel Xeon
//! streams about 12 GB/s from memory where two stream about 23 (numpy's threaded BLAS
//! matrix-vector product over 1 GiB). So this splits `W`'s rows into blocks, one gemm call of
//! the same kernel per block on candle's threads: each output is the same dot product in the
//! same order, so the result is bit for bit the single-threaded one (the tests below).

use candle_core::{DType, Result, Tensor};
use rayon::prelude::*;

use super::with_elements;

/// The fewest weight elements worth splitting (1 MiB of f32): below it the weight sits in
/// cache and a thread pool's hand-off costs about what the split saves.
const MIN_WEIGHT_ELEMENTS: usize = 1 << 18;

/// Blocks per thread, so that a thread slowed by another process does not hold up the rest.
const BLOCKS_PER_THREAD: usize = 4;

/// The fewest rows of a block: gemm computes a product of at most 256 outputs with another
/// kernel (its "horizontal" one, which sums in another order), so blocks of more keep every
/// output equal to the single-threaded product's.
const MIN_BLOCK_ROWS: usize = 257;

/// How many blocks of nearly equal rows `out` rows split into on `threads` threads: up to
/// [`BLOCKS_PER_THREAD`] per thread, none under [`MIN_BLOCK_ROWS`], and a multiple of the
/// threads where there are fewer (three blocks on two threads would leave one idle for a
/// third of the time).
fn block_count(out: usize, threads: usize) -> usize {
    let most = (out / MIN_BLOCK_ROWS).min(threads * BLOCKS_PER_THREAD);
    if most >= threads {
        most / threads * threads
    } else {
        most
    }
}

/// `x [1, in] · Wᵀ` for `W [out, in]`, as `[1, out]`, with `W`'s rows split over candle's
/// threads; `None` where that does not apply (not a single f32 row on the CPU, one thread, a
/// weight under 1 MiB), for the caller's plain product.
pub(crate) fn row_split_gemv(x: &Tensor, w: &Tensor) -> Result<Option<Tensor>> {
    let Some(blocks) = split_blocks(x, w) else {
        return Ok(None);
    };
    let (out, inp) = w.dims2()?;
    let y = with_elements::<f32, _>(w, |w| {
        with_elements::<f32, _>(x, |x| {
            let mut y = vec![0f32; out];
            let mut parts = Vec::with_capacity(blocks);
            let mut rest = y.as_mut_slice();
            for b in 0..blocks {
                let (start, end) = (b * out / blocks, (b + 1) * out / blocks);
                let (part, tail) = rest.split_at_mut(end - start);
                parts.push((start, part));
                rest = tail;
            }
            parts
                .into_par_iter()
                .try_for_each(|(start, ys)| dot_rows(ys, &w[start * inp..], x))?;
            Ok(y)
        })
    })?;
    Tensor::from_vec(y, (1, out), x.device()).map(Some)
}

/// Whether [`row_split_gemv`] splits `x · Wᵀ` rather than leaving it to the caller.
pub(crate) fn splits_rows(x: &Tensor, w: &Tensor) -> bool {
    split_blocks(x, w).is_some()
}

/// The blocks [`row_split_gemv`] splits `W`'s rows into (at least 2), or `None` where it
/// does not apply.
fn split_blocks(x: &Tensor, w: &Tensor) -> Option<usize> {
    let threads = candle_core::utils::get_num_threads();
    let (out, inp) = w.dims2().ok()?;
    let applies = threads > 1
        && x.device().is_cpu()
        && w.device().is_cpu()
        && x.dtype() == DType::F32
        && w.dtype() == DType::F32
        && x.dims() == [1, inp]
        && out * inp >= MIN_WEIGHT_ELEMENTS;
    let blocks = block_count(out, threads);
    (applies && blocks >= 2).then_some(blocks)
}

/// `ys[r] = w[r·k .. (r+1)·k] · x` for each `r`, with `k = x.len()`, on this thread.
fn dot_rows(ys: &mut [f32], w: &[f32], x: &[f32]) -> Result<()> {
    let (m, k) = (ys.len(), x.len());
    if w.len() < m * k {
        candle_core::bail!(
            "atomrl row-split gemv: a block of {m} rows of {k} past the weight's end"
        );
    }
    // SAFETY: `ys` holds the m outputs (dst m × 1, row stride 1), `w` at least the m rows of k
    // read row-major (checked above), `x` the k inputs; `ys` is borrowed mutably, so it aliases
    // neither input. gemm with n = 1, a row-major lhs and a contiguous rhs is its matrix-vector
    // kernel, the one a plain `[1, k] · [m, k]ᵀ` product reaches.
    #[allow(unsafe_code)]
    unsafe {
        gemm::gemm(
            m,
            1,
            k,
            ys.as_mut_ptr(),
            1,
            1,
            false,
            w.as_ptr(),
            1,
            k as isize,
            x.as_ptr(),
            1,
            1,
            0f32,
            1f32,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use candle_core::Device;

    #[test]
    fn equals_the_plain_product_bit_for_bit() {
        let dev = Device::Cpu;
        // Odd sizes: blocks of 345 and 346 rows, not a multiple of any SIMD width.
        let w = Tensor::randn(0f32, 1.0, (1037, 261), &dev).unwrap();
        let x = Tensor::randn(0f32, 1.0, (1, 261), &dev).unwrap();
        let plain = x.matmul(&w.t().unwrap()).unwrap();
        let mut y = vec![0f32; 1037];
        let wv = w.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let xv = x.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let (first, rest) = y.split_at_mut(345);
        let (second, third) = rest.split_at_mut(346);
        dot_rows(first, &wv, &xv).unwrap();
        dot_rows(second, &wv[345 * 261..], &xv).unwrap();
        dot_rows(third, &wv[691 * 261..], &xv).unwrap();
        assert_eq!(plain.flatten_all().unwrap().to_vec1::<f32>().unwrap(), y);
    }

    #[test]
    fn splits_large_weights_and_leaves_the_rest() {
        let dev = Device::Cpu;
        let w = Tensor::randn(0f32, 1.0, (2050, 130), &dev).unwrap();
        let x = Tensor::randn(0f32, 1.0, (1, 130), &dev).unwrap();
        let plain = x.matmul(&w.t().unwrap()).unwrap();
        match row_split_gemv(&x, &w).unwrap() {
            Some(y) => {
                assert_eq!(y.dims(), &[1, 2050]);
                let diff = (y - &plain).unwrap().abs().unwrap().max_all().unwrap();
                assert_eq!(diff.to_scalar::<f32>().unwrap(), 0.0);
            }
            None => assert_eq!(candle_core::utils::get_num_threads(), 1),
        }
        let two_rows = Tensor::randn(0f32, 1.0, (2, 130), &dev).unwrap();
        assert!(row_split_gemv(&two_rows, &w).unwrap().is_none());
        let small = Tensor::randn(0f32, 1.0, (20, 130), &dev).unwrap();
        assert!(row_split_gemv(&x, &small).unwrap().is_none());
        // A weight over the size bound with too few rows for two blocks.
        let few_rows = Tensor::randn(0f32, 1.0, (500, 600), &dev).unwrap();
        let wide_x = Tensor::randn(0f32, 1.0, (1, 600), &dev).unwrap();
        assert!(row_split_gemv(&wide_x, &few_rows).unwrap().is_none());
        let f64_w = w.to_dtype(DType::F64).unwrap();
        let f64_x = x.to_dtype(DType::F64).unwrap();
        assert!(row_split_gemv(&f64_x, &f64_w).unwrap().is_none());
    }

    #[test]
    fn blocks_are_large_enough_and_fill_the_threads() {
        assert_eq!(block_count(896, 2), 2);
        assert_eq!(block_count(4864, 2), 8);
        assert_eq!(block_count(151_936, 16), 64);
        assert_eq!(block_count(600, 4), 2);
        assert_eq!(block_count(500, 2), 1);
        for out in [514, 896, 1037, 4864, 9728] {
            let blocks = block_count(out, 2);
            assert!(
                out / blocks >= MIN_BLOCK_ROWS,
                "{out} rows in {blocks} blocks"
            );
        }
    }
}
