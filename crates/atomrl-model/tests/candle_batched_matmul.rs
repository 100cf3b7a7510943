//! The vendored candle-core shares a batch of f32 products among its threads whole, each
//! product on one thread (vendor/README.md, change 4). Each product must keep the bits it gets
//! computed alone, where gemm splits it among the threads.
//!
//! One test in its own process: candle reads its thread count from `RAYON_NUM_THREADS` on
//! every matmul, and CI sets it to 1, which would take neither parallel path.
#![allow(clippy::unwrap_used)]

use candle_core::{Device, Tensor};

#[test]
fn batched_matmuls_equal_their_products_one_by_one() {
    std::env::set_var("RAYON_NUM_THREADS", "2");
    assert_eq!(candle_core::utils::get_num_threads(), 2);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    pool.install(|| {
        // (batch, m, k, n): attention-like shapes, an odd batch, a batch as small as the pool.
        for (b, m, k, n) in [
            (8, 96, 64, 96),
            (6, 33, 70, 41),
            (9, 64, 64, 64),
            (2, 200, 64, 300),
        ] {
            let q = Tensor::randn(0f32, 1.0, (b, m, k), &Device::Cpu).unwrap();
            let kt = Tensor::randn(0f32, 1.0, (b, n, k), &Device::Cpu)
                .unwrap()
                .transpose(1, 2)
                .unwrap();
            let batched = q.matmul(&kt).unwrap();
            for i in 0..b {
                let alone = q.get(i).unwrap().matmul(&kt.get(i).unwrap()).unwrap();
                assert_eq!(
                    batched
                        .get(i)
                        .unwrap()
                        .flatten_all()
                        .unwrap()
                        .to_vec1::<f32>()
                        .unwrap(),
                    alone.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                    "product {i} of {b} × [{m}, {k}] · [{k}, {n}]"
                );
            }
        }
    });
}
