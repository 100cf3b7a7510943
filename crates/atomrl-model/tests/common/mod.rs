//! Shared helpers of atomrl-model's integration tests.
#![allow(dead_code, clippy::unwrap_used)]

use std::path::PathBuf;

use candle_core::{DType, Device, Tensor};

/// The repository's reference models (`tests/fixtures/reference/models/<name>`).
pub fn reference_model(name: &str) -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/fixtures/reference/models"
    ))
    .join(name)
}

/// This crate's fixture models (`tests/fixtures/models/<name>`).
pub fn fixture_model(name: &str) -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/models"
    ))
    .join(name)
}

/// The folder of a model fixture, reference or own.
pub fn model_dir(name: &str) -> PathBuf {
    let r = reference_model(name);
    if r.is_dir() {
        r
    } else {
        fixture_model(name)
    }
}

/// Expected outputs written by xtask/fixtures/gen_model_fixtures.py.
pub fn expected(name: &str) -> std::collections::HashMap<String, Tensor> {
    let p = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/expected"
    ))
    .join(format!("{name}.safetensors"));
    candle_core::safetensors::load(p, &Device::Cpu).unwrap()
}

/// A fresh temporary folder, removed when dropped.
pub fn temp_dir(tag: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("atomrl_model_test_{tag}_"))
        .tempdir()
        .unwrap()
}

/// Max |a - b| over positions where `mask [N, L]` is 1 (a, b: `[N, L, V]`).
pub fn max_diff_masked(a: &Tensor, b: &Tensor, mask: &Tensor) -> f64 {
    let a = a.to_dtype(DType::F64).unwrap().to_vec3::<f64>().unwrap();
    let b = b.to_dtype(DType::F64).unwrap().to_vec3::<f64>().unwrap();
    let m = mask.to_dtype(DType::F64).unwrap().to_vec2::<f64>().unwrap();
    let mut worst = 0f64;
    for (n, row) in m.iter().enumerate() {
        for (l, &keep) in row.iter().enumerate() {
            if keep != 0.0 {
                for (x, y) in a[n][l].iter().zip(&b[n][l]) {
                    worst = worst.max((x - y).abs());
                }
            }
        }
    }
    worst
}

/// Max |a - b| over all elements.
pub fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
    (a.to_dtype(DType::F64).unwrap() - b.to_dtype(DType::F64).unwrap())
        .unwrap()
        .abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar::<f64>()
        .unwrap()
}
