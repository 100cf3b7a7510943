//! logprob.cu's selective log-softmax run on the CPU by atomrl-cuda-sim, with the launches of
//! `cuda.rs` (one block per row, `rows_launch`), against the tensor-op form of `fused.rs`:
//! log-probs, entropies and the logits' gradient, at temperatures 1 and 0.7, f32 to ~1e-5 and
//! bf16 against the f32 form on the same rounded logits.
#![allow(clippy::unwrap_used)]

use atomrl_core::launch_dims;
use atomrl_cuda_sim::{kernels, Elem, Launch};
use candle_core::{DType, Device, Tensor};
use half::bf16;

use crate::fused::{logits_grad_tensor_ops, values_tensor_ops};

fn logits(rows: usize, v: usize) -> Vec<f32> {
    // Values exact in bf16, a spread of a few units, and one large logit a row.
    let mut x: Vec<f32> = (0..rows * v)
        .map(|i| ((i * 7_919 + 17) % 97) as f32 / 16.0 - 3.0)
        .collect();
    for r in 0..rows {
        x[r * v + (r * 31 + 5) % v] = 6.0;
    }
    x
}

fn flat(t: &Tensor) -> Vec<f32> {
    t.flatten_all()
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap()
        .to_vec1()
        .unwrap()
}

fn assert_close(got: &[f32], want: &[f32], tol: f32, what: &str) {
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        assert!(
            (a - b).abs() <= tol * b.abs().max(1.0),
            "{what}[{i}]: {a} against {b}"
        );
    }
}

fn check<T: Elem + Default>(
    x: &[T],
    to_f32: fn(T) -> f32,
    (rows, v): (usize, usize),
    x32: &[f32],
    tol: f32,
) {
    let tokens: Vec<u32> = (0..rows as u32).map(|r| (r * 131 + 2) % v as u32).collect();
    let g: Vec<f32> = (0..2 * rows).map(|i| (i as f32 * 0.37).sin()).collect();
    let dev = Device::Cpu;
    let lt = Tensor::from_vec(x32.to_vec(), (rows, v), &dev).unwrap();
    let tt = Tensor::new(tokens.as_slice(), &dev).unwrap();
    let gt = Tensor::from_vec(g.clone(), (rows, 2), &dev).unwrap();
    let l = Launch::from_dims(launch_dims::rows(rows, v));
    for temperature in [1.0, 0.7] {
        let inv_t = (1.0 / temperature) as f32;
        let (lp0, ent0) = values_tensor_ops(&lt, &tt, temperature, true).unwrap();
        let (mut lp, mut ent) = (vec![0f32; rows], vec![0f32; rows]);
        kernels::selective_log_softmax_fwd(l, x, &tokens, &mut lp, Some(&mut ent), v, inv_t);
        assert_close(&lp, &flat(&lp0), tol, "log-probs");
        assert_close(&ent, &flat(&ent0.unwrap()), tol, "entropies");
        let mut lp_only = vec![0f32; rows];
        kernels::selective_log_softmax_fwd(l, x, &tokens, &mut lp_only, None, v, inv_t);
        assert_eq!(lp_only, lp, "log-probs without the entropy");
        for with_entropy in [true, false] {
            let dx0 =
                flat(&logits_grad_tensor_ops(&lt, &tt, temperature, with_entropy, &gt).unwrap());
            let mut dx = vec![T::default(); rows * v];
            kernels::selective_log_softmax_bwd(l, x, &tokens, &g, &mut dx, v, inv_t, with_entropy);
            let dx: Vec<f32> = dx.into_iter().map(to_f32).collect();
            assert_close(&dx, &dx0, tol, "logits' gradient");
        }
    }
}

#[test]
fn the_cuda_selective_log_softmax_matches_the_tensor_op_form() {
    // 3 rows of 1,000 (256 threads striding), 5 rows of 40 (64 threads, most of a warp idle).
    for (rows, v) in [(3, 1_000), (5, 40)] {
        let x = logits(rows, v);
        check(&x, |a| a, (rows, v), &x, 2e-5);
        let xb: Vec<bf16> = x.iter().map(|&a| bf16::from_f32(a)).collect();
        check(&xb, bf16::to_f32, (rows, v), &x, 1e-2);
    }
}
