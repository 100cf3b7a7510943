//! The workspace's candle-core carries two changes to its CPU kernels
//! (`vendor/candle-core-cpu-kernels.patch`): a sum over leading dimensions adds whole rows,
//! and a matmul's output is not zero-filled before gemm writes it. These tests pin the
//! results to the element-by-element definitions, bit for bit where the order of additions
//! is the same.
#![allow(clippy::unwrap_used)]

use candle_core::{Device, Tensor};
use proptest::prelude::*;

/// Deterministic f32 values of the given length.
fn values(n: usize, seed: u64) -> Vec<f32> {
    (0..n)
        .map(|i| ((i as f64 + 1.0) * 12.9898 + seed as f64 * 78.233).sin() as f32)
        .collect()
}

/// The column sums of a row-major `[outer, inner]` buffer (a sum over leading dimensions),
/// rows added in order (the order candle's element loop adds them in).
fn sum_rows(src: &[f32], inner: usize) -> Vec<f32> {
    let mut dst = vec![0f32; inner];
    for row in src.chunks_exact(inner) {
        for (d, s) in dst.iter_mut().zip(row) {
            *d += s;
        }
    }
    dst
}

proptest! {
    /// A bias gradient's reduction, `[a, b, c] → [c]` and `[a, b, c] → [b, c]`, is the row sum
    /// to the bit; a strided source takes candle's general path and agrees to rounding.
    #[test]
    fn sums_over_leading_dims_add_whole_rows(a in 1usize..6, b in 1usize..7, c in 1usize..9, seed in 0u64..1000) {
        let v = values(a * b * c, seed);
        let t = Tensor::from_vec(v.clone(), (a, b, c), &Device::Cpu).unwrap();
        let over_two = t.sum((0, 1)).unwrap().to_vec1::<f32>().unwrap();
        prop_assert_eq!(over_two, sum_rows(&v, c));
        let over_one = t.sum(0).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        prop_assert_eq!(over_one, sum_rows(&v, b * c));
        let kept = t.sum_keepdim((0, 1)).unwrap();
        prop_assert_eq!(kept.dims(), &[1, 1, c]);
        let strided = t.transpose(0, 1).unwrap().sum((0, 1)).unwrap().to_vec1::<f32>().unwrap();
        for (x, y) in strided.iter().zip(sum_rows(&v, c)) {
            prop_assert!((x - y).abs() <= 1e-5 * (1.0 + y.abs()));
        }
    }

    /// Matmuls, batched and with a shared right-hand side, equal the triple loop.
    #[test]
    fn matmul_writes_every_output_element(b in 1usize..4, m in 1usize..9, k in 1usize..9, n in 1usize..9, seed in 0u64..1000) {
        let (x, w) = (values(b * m * k, seed), values(k * n, seed + 1));
        let lhs = Tensor::from_vec(x.clone(), (b, m, k), &Device::Cpu).unwrap();
        let rhs = Tensor::from_vec(w.clone(), (k, n), &Device::Cpu).unwrap();
        let got = lhs.broadcast_matmul(&rhs).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        for bi in 0..b {
            for i in 0..m {
                for j in 0..n {
                    let want: f32 = (0..k).map(|l| x[(bi * m + i) * k + l] * w[l * n + j]).sum();
                    let g = got[(bi * m + i) * n + j];
                    prop_assert!((g - want).abs() <= 1e-5 * (1.0 + want.abs()), "{g} vs {want}");
                }
            }
        }
    }
}

/// An inner dimension of 0 gives zeros (gemm writes nothing then).
#[test]
fn matmul_over_an_empty_inner_dimension_is_zero() {
    let lhs = Tensor::zeros((3, 0), candle_core::DType::F32, &Device::Cpu).unwrap();
    let rhs = Tensor::zeros((0, 4), candle_core::DType::F32, &Device::Cpu).unwrap();
    let out = lhs.matmul(&rhs).unwrap();
    assert_eq!(out.dims(), &[3, 4]);
    assert_eq!(
        out.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
        vec![0f32; 12]
    );
}
