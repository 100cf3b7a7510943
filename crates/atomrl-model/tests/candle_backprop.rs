//! The workspace's candle-core carries a patch to its backward pass (vendor/README.md): a
//! gradient's first contribution is stored as computed, views included, instead of being added
//! to a zero tensor, and a matmul operand stored transposed gets its gradient computed
//! transposed. These tests pin what the patch must keep: the gradients' values (against closed
//! forms), sums over several uses of a tensor, and every variable's gradient a row-major buffer
//! from offset 0 (`atomrl_optim` reads gradient storage directly).
#![allow(clippy::unwrap_used)]

use candle_core::{DType, Device, Tensor, Var, D};
use proptest::prelude::*;

/// Deterministic values in [-1, 1] of the given shape.
fn values(shape: &[usize], seed: u64) -> Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<f64> = (0..n)
        .map(|i| ((i as f64 + 1.0) * 12.9898 + seed as f64 * 78.233).sin())
        .collect();
    Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
}

fn var(shape: &[usize], seed: u64) -> Var {
    Var::from_tensor(&values(shape, seed)).unwrap()
}

/// The gradient's values, after checking it is a dense row-major buffer from offset 0.
fn dense_grad(grads: &candle_core::backprop::GradStore, v: &Var) -> Vec<f64> {
    let g = grads.get(v.as_tensor()).expect("a gradient");
    assert_eq!(g.dims(), v.dims());
    let (storage, layout) = g.storage_and_layout();
    assert!(
        layout.is_contiguous(),
        "strided gradient: {:?}",
        layout.stride()
    );
    assert_eq!(layout.start_offset(), 0);
    drop(storage);
    g.flatten_all().unwrap().to_vec1::<f64>().unwrap()
}

fn assert_close(a: &[f64], b: &[f64]) {
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(
            (x - y).abs() <= 1e-12 * (1.0 + y.abs()),
            "[{i}]: {x} vs {y}"
        );
    }
}

fn flat(t: &Tensor) -> Vec<f64> {
    t.flatten_all().unwrap().to_vec1::<f64>().unwrap()
}

#[test]
fn a_linear_layer_gets_row_major_weight_gradients_equal_to_the_closed_form() {
    // y = x Wᵀ + b as the model's Linear computes it; loss = Σ y ⊙ c.
    let (rows, inp, out) = (5, 4, 3);
    let x = var(&[rows, inp], 1);
    let w = var(&[out, inp], 2);
    let b = var(&[out], 3);
    let c = values(&[rows, out], 4);
    let y = x
        .as_tensor()
        .matmul(&w.as_tensor().t().unwrap())
        .unwrap()
        .broadcast_add(b.as_tensor())
        .unwrap();
    let grads = (y * &c).unwrap().sum_all().unwrap().backward().unwrap();
    // dW = cᵀ x, dx = c W, db = Σ_rows c.
    let dw = c.t().unwrap().matmul(x.as_tensor()).unwrap();
    let dx = c.matmul(w.as_tensor()).unwrap();
    let db = c.sum(0).unwrap();
    assert_close(&dense_grad(&grads, &w), &flat(&dw));
    assert_close(&dense_grad(&grads, &x), &flat(&dx));
    assert_close(&dense_grad(&grads, &b), &flat(&db));
}

#[test]
fn a_tensor_used_several_times_sums_its_gradients() {
    // loss = Σ (x² + x − 2x + sin x · x), each use a separate contribution (add, sub, mul).
    let x = var(&[2, 3], 5);
    let t = x.as_tensor();
    let y = ((t.sqr().unwrap() + t).unwrap() - (t * 2.0).unwrap()).unwrap();
    let y = (y + (t.sin().unwrap() * t).unwrap()).unwrap();
    let grads = y.sum_all().unwrap().backward().unwrap();
    let v = flat(t);
    let expected: Vec<f64> = v
        .iter()
        .map(|x| 2.0 * x + 1.0 - 2.0 + x.cos() * x + x.sin())
        .collect();
    assert_close(&dense_grad(&grads, &x), &expected);
}

#[test]
fn the_subtracted_side_gets_the_negated_gradient_on_first_and_later_uses() {
    let a = var(&[4], 6);
    let b = var(&[4], 7);
    // b is subtracted once (first contribution: −1) and then divided by (−a/b²).
    let y = (a.as_tensor() - b.as_tensor()).unwrap();
    let y = (y + (a.as_tensor() / b.as_tensor()).unwrap()).unwrap();
    let grads = y.sum_all().unwrap().backward().unwrap();
    let (va, vb) = (flat(a.as_tensor()), flat(b.as_tensor()));
    let da: Vec<f64> = vb.iter().map(|b| 1.0 + 1.0 / b).collect();
    let db: Vec<f64> = va
        .iter()
        .zip(&vb)
        .map(|(a, b)| -1.0 - a / (b * b))
        .collect();
    assert_close(&dense_grad(&grads, &a), &da);
    assert_close(&dense_grad(&grads, &b), &db);
}

#[test]
fn concatenated_and_narrowed_variables_get_gradients_of_their_own() {
    // The gradients of `cat` are narrow views into one buffer; each variable gets its own.
    let p = var(&[2, 3], 8);
    let q = var(&[4, 3], 9);
    let c = values(&[6, 3], 10);
    let y = Tensor::cat(&[p.as_tensor(), q.as_tensor()], 0).unwrap();
    let grads = (y * &c).unwrap().sum_all().unwrap().backward().unwrap();
    assert_close(&dense_grad(&grads, &p), &flat(&c.narrow(0, 0, 2).unwrap()));
    assert_close(&dense_grad(&grads, &q), &flat(&c.narrow(0, 2, 4).unwrap()));
}

#[test]
fn attention_scores_through_transposed_keys_match_the_closed_form() {
    // s = q kᵀ over a batch of heads; loss = Σ s ⊙ c. dq = c k, dk = cᵀ q.
    let q = var(&[2, 3, 5, 4], 11);
    let k = var(&[2, 3, 6, 4], 12);
    let c = values(&[2, 3, 5, 6], 13);
    let s = q.as_tensor().matmul(&k.as_tensor().t().unwrap()).unwrap();
    let grads = (s * &c).unwrap().sum_all().unwrap().backward().unwrap();
    let dq = c.matmul(k.as_tensor()).unwrap();
    let dk = c.t().unwrap().matmul(q.as_tensor()).unwrap();
    assert_close(&dense_grad(&grads, &q), &flat(&dq));
    assert_close(&dense_grad(&grads, &k), &flat(&dk));
}

#[test]
fn a_variable_used_only_transposed_gets_a_dense_gradient() {
    // The last node before the variable is a transpose: its gradient arrives strided.
    let w = var(&[3, 4], 14);
    let c = values(&[4, 3], 15);
    let grads = (w.as_tensor().t().unwrap() * &c)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    assert_close(&dense_grad(&grads, &w), &flat(&c.t().unwrap()));
}

#[test]
fn f32_gradients_of_a_two_layer_mlp_match_f64() {
    // The patch changes no arithmetic: f32 gradients agree with the f64 ones to f32 rounding.
    let run = |dtype: DType| {
        let x = Var::from_tensor(&values(&[6, 5], 16).to_dtype(dtype).unwrap()).unwrap();
        let w1 = Var::from_tensor(&values(&[7, 5], 17).to_dtype(dtype).unwrap()).unwrap();
        let w2 = Var::from_tensor(&values(&[2, 7], 18).to_dtype(dtype).unwrap()).unwrap();
        let h = x.as_tensor().matmul(&w1.as_tensor().t().unwrap()).unwrap();
        let h = candle_nn::ops::silu(&h).unwrap();
        let y = h.matmul(&w2.as_tensor().t().unwrap()).unwrap();
        let loss = candle_nn::ops::log_softmax(&y, D::Minus1)
            .unwrap()
            .sum_all()
            .unwrap();
        let grads = loss.backward().unwrap();
        [x, w1, w2].map(|v| {
            grads
                .get(v.as_tensor())
                .unwrap()
                .to_dtype(DType::F64)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f64>()
                .unwrap()
        })
    };
    for (a, b) in run(DType::F32).iter().zip(run(DType::F64).iter()) {
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() <= 1e-5 * (1.0 + y.abs()), "{x} vs {y}");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// Any linear layer's gradients equal the closed form, whatever its shape.
    #[test]
    fn linear_gradients_match_the_closed_form(
        rows in 1usize..6, inp in 1usize..6, out in 1usize..6, seed in 0u64..1000
    ) {
        let x = var(&[rows, inp], seed);
        let w = var(&[out, inp], seed + 1);
        let c = values(&[rows, out], seed + 2);
        let y = x.as_tensor().matmul(&w.as_tensor().t().unwrap()).unwrap();
        let grads = (y * &c).unwrap().sum_all().unwrap().backward().unwrap();
        assert_close(&dense_grad(&grads, &w), &flat(&c.t().unwrap().matmul(x.as_tensor()).unwrap()));
        assert_close(&dense_grad(&grads, &x), &flat(&c.matmul(w.as_tensor()).unwrap()));
    }
}
