//! Candle's f32 matmuls through a CBLAS `sgemm` (`atomrl_core::cblas`) equal candle's own
//! kernel for every operand layout a model uses, and layouts CBLAS cannot describe stay on
//! candle's kernel.
//!
//! The CBLAS here is a plain Rust `sgemm` that counts its calls; with `ATOMRL_CBLAS` set (say
//! to MKL's `libmkl_rt.so.3`) the test runs against that library instead. One test function:
//! the hook is process-wide.
#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicUsize, Ordering};

use candle_core::{DType, Device, IndexOp, Tensor};

static CALLS: AtomicUsize = AtomicUsize::new(0);

/// Row-major `cblas_sgemm` by definition (`alpha = 1`, `beta = 0` are all candle asks for).
#[allow(unsafe_code, clippy::too_many_arguments)]
unsafe extern "C" fn counting_sgemm(
    layout: i32,
    trans_a: i32,
    trans_b: i32,
    m: i32,
    n: i32,
    k: i32,
    alpha: f32,
    a: *const f32,
    lda: i32,
    b: *const f32,
    ldb: i32,
    beta: f32,
    c: *mut f32,
    ldc: i32,
) {
    assert_eq!(layout, 101, "row-major");
    assert_eq!((alpha, beta), (1.0, 0.0));
    CALLS.fetch_add(1, Ordering::SeqCst);
    let [m, n, k, lda, ldb, ldc] = [m, n, k, lda, ldb, ldc].map(|x| usize::try_from(x).unwrap());
    for i in 0..m {
        for j in 0..n {
            let mut s = 0f32;
            for p in 0..k {
                let x = if trans_a == 112 {
                    *a.add(p * lda + i)
                } else {
                    *a.add(i * lda + p)
                };
                let y = if trans_b == 112 {
                    *b.add(j * ldb + p)
                } else {
                    *b.add(p * ldb + j)
                };
                s += x * y;
            }
            *c.add(i * ldc + j) = s;
        }
    }
}

/// Small integers, so that every sum is exact in f32 whatever the order.
fn ints(dims: &[usize], seed: usize) -> Tensor {
    let n: usize = dims.iter().product();
    let v: Vec<f32> = (0..n)
        .map(|i| ((i * 7 + seed * 13) % 7) as f32 - 3.0)
        .collect();
    Tensor::from_vec(v, dims, &Device::Cpu).unwrap()
}

type Case = (&'static str, Tensor, Tensor);

fn cases() -> Vec<Case> {
    let w = ints(&[24, 40], 1); // a Linear weight [out, in]
    let x = ints(&[3, 5, 40], 2);
    let big_x = ints(&[300, 64], 3);
    let big_w = ints(&[128, 64], 4);
    let q = ints(&[2, 3, 7, 8], 5);
    let kk = ints(&[2, 3, 9, 8], 6);
    vec![
        ("plain", ints(&[6, 40], 7), ints(&[40, 24], 8)),
        ("x · Wᵀ", ints(&[6, 40], 7), w.t().unwrap()),
        ("aᵀ · b", ints(&[40, 6], 9).t().unwrap(), ints(&[40, 24], 8)),
        ("aᵀ · bᵀ", ints(&[40, 6], 9).t().unwrap(), w.t().unwrap()),
        (
            "batched, rhs broadcast",
            x.clone(),
            w.t().unwrap().broadcast_as((3, 40, 24)).unwrap(),
        ),
        ("batched", x, ints(&[3, 40, 11], 10)),
        (
            "attention scores q · kᵀ",
            q.clone(),
            kk.transpose(2, 3).unwrap(),
        ),
        ("attention values p · v", ints(&[2, 3, 7, 9], 11), kk),
        ("one row", ints(&[1, 40], 12), w.t().unwrap()),
        ("one column", ints(&[6, 40], 7), ints(&[40, 1], 13)),
        ("one product split over threads", big_x, big_w.t().unwrap()),
        (
            "batches split over threads",
            ints(&[4, 64, 64], 17),
            ints(&[4, 128, 64], 18).transpose(1, 2).unwrap(),
        ),
        (
            "column slice",
            ints(&[6, 50], 14).narrow(1, 5, 40).unwrap(),
            w.t().unwrap(),
        ),
    ]
}

#[test]
fn cblas_matmuls_equal_candles_kernel_and_unexpressible_layouts_stay_on_it() {
    let expected: Vec<Vec<f32>> = cases()
        .iter()
        .map(|(_, a, b)| {
            a.matmul(b)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap()
        })
        .collect();
    let real_library = atomrl_core::cblas::use_library_from_env().unwrap();
    if real_library.is_none() {
        atomrl_core::cblas::use_sgemm(counting_sgemm);
    }
    for ((name, a, b), want) in cases().iter().zip(&expected) {
        let before = CALLS.load(Ordering::SeqCst);
        let got: Vec<f32> = a
            .matmul(b)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        assert_eq!(&got, want, "{name}");
        if real_library.is_none() {
            assert!(
                CALLS.load(Ordering::SeqCst) > before,
                "{name}: not sent to cblas"
            );
        }
    }

    // No unit stride in either dimension: CBLAS cannot describe it, candle's kernel runs.
    let strided = ints(&[6, 40, 2], 15).i((.., .., 0)).unwrap();
    assert_eq!(strided.stride(), [80, 2]);
    let w = ints(&[40, 24], 16);
    let before = CALLS.load(Ordering::SeqCst);
    let got = strided.matmul(&w).unwrap();
    let want = strided.contiguous().unwrap().matmul(&w).unwrap();
    assert_eq!(
        got.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
        want.flatten_all().unwrap().to_vec1::<f32>().unwrap()
    );
    // Other dtypes keep candle's kernel too.
    let a64 = ints(&[6, 40], 7).to_dtype(DType::F64).unwrap();
    let b64 = ints(&[40, 24], 8).to_dtype(DType::F64).unwrap();
    let _ = a64.matmul(&b64).unwrap();
    if real_library.is_none() {
        // Only the contiguous copy's product above went to cblas.
        assert_eq!(CALLS.load(Ordering::SeqCst), before + 1);
    }

    atomrl_core::cblas::use_candle_kernel();
    let before = CALLS.load(Ordering::SeqCst);
    let (_, a, b) = &cases()[0];
    let _ = a.matmul(b).unwrap();
    assert_eq!(
        CALLS.load(Ordering::SeqCst),
        before,
        "back on candle's kernel"
    );
}

#[test]
fn a_missing_library_is_refused_naming_the_variable() {
    let err = atomrl_core::cblas::use_library(std::path::Path::new("/nonexistent/libcblas.so"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("ATOMRL_CBLAS"), "{err}");
    assert!(err.contains("/nonexistent/libcblas.so"), "{err}");
    // A library without cblas_sgemm (the C library itself).
    let err = atomrl_core::cblas::use_library(std::path::Path::new("libc.so.6"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("cblas_sgemm"), "{err}");
}
