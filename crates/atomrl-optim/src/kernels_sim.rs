//! optim.cu's kernels run on the CPU by atomrl-cuda-sim, with the launches of `cuda.rs`,
//! against the CPU forms: AdamW's one-pass update of every parameter in one multi-tensor
//! launch bit for bit (the kernel's `_rn` intrinsics keep the CPU's order and roundings), the
//! in-place add and scale (one tensor, and many in one launch), and the squared-norm partial
//! sums (one tensor, and many in one launch with the per-tensor launch's bits).
#![allow(clippy::unwrap_used)]

use atomrl_core::launch_dims;
use atomrl_cuda_sim::kernels::{self, AdamWScalars};
use atomrl_cuda_sim::Launch;
use candle_core::{Device, Tensor};

use crate::adamw_kernel::{update, UpdateScalars};
use crate::AdamWConfig;

fn values(n: usize, seed: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|i| (((i * 7_919 + seed * 104_729) % 10_007) as f32 / 10_007.0 - 0.5) * scale)
        .collect()
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

fn sim_scalars(s: &UpdateScalars) -> AdamWScalars {
    AdamWScalars {
        grad_scale: s.grad_scale,
        beta1: s.beta1,
        one_minus_beta1: s.one_minus_beta1,
        beta2: s.beta2,
        one_minus_beta2: s.one_minus_beta2,
        inv1: s.inv1,
        inv2: s.inv2,
        eps: s.eps,
        lr: s.lr,
        decay: s.decay,
    }
}

#[test]
fn the_cuda_add_and_scale_are_the_cpu_arithmetic() {
    let n = 1_500;
    let (a, b) = (values(n, 5, 3.0), values(n, 6, 3.0));
    let mut sum = a.clone();
    kernels::add_assign_f32(Launch::from_dims(launch_dims::elementwise(n)), &mut sum, &b);
    let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
    assert_eq!(bits(&sum), bits(&want));
    let mut scaled = a.clone();
    kernels::scale_f32(Launch::linear(3, 128), &mut scaled, 0.3);
    let want: Vec<f32> = a.iter().map(|x| x * 0.3 + 0.0).collect();
    assert_eq!(bits(&scaled), bits(&want));
}

#[test]
fn the_cuda_squared_norm_is_the_sum_of_squares() {
    for n in [1, 255, 2_048, 9_999] {
        let a = values(n, 7, 4.0);
        let l = Launch::from_dims(launch_dims::sq_norm(n));
        let mut part = vec![0f32; l.grid.0 as usize];
        kernels::sq_norm_part_f32(l, &a, &mut part);
        let got: f64 = part.iter().map(|&p| f64::from(p)).sum();
        let want: f64 = a.iter().map(|&x| f64::from(x) * f64::from(x)).sum();
        assert!(
            (got - want).abs() <= 1e-6 * want.max(1e-30),
            "n = {n}: {got} against {want}"
        );
    }
}

/// Tensor sizes of a multi-tensor launch: one element, part of a block, and tensors whose
/// blocks stride over 2,048 elements each (1, 1, 2, 5 and 20 blocks of 256 threads).
const MULTI_SIZES: [usize; 5] = [1, 255, 3_000, 9_999, 40_000];

#[test]
fn the_multi_tensor_adamw_is_the_cpu_update_of_each_tensor_bit_for_bit() {
    // The first step without scaling or decay, then clipped steps with decay.
    for (step, grad_scale, wd) in [
        (1i32, None, 0.0),
        (7, Some(0.37), 0.1),
        (300, Some(1.7), 0.1),
    ] {
        let config = AdamWConfig {
            weight_decay: wd,
            ..AdamWConfig::default()
        };
        let (bias1, bias2) = (1.0 - config.beta1.powi(step), 1.0 - config.beta2.powi(step));
        let s = UpdateScalars::new(&config, 3e-4, bias1, bias2, grad_scale);
        let start: Vec<[Vec<f32>; 4]> = MULTI_SIZES
            .iter()
            .enumerate()
            .map(|(k, &n)| {
                let v: Vec<f32> = values(n, 4 * k + 3, 1e-4).iter().map(|x| x.abs()).collect();
                [
                    values(n, 4 * k, 2.0),
                    values(n, 4 * k + 1, 0.01),
                    v,
                    values(n, 4 * k + 2, 0.5),
                ]
            })
            .collect();
        let want: Vec<[Vec<f32>; 3]> = start
            .iter()
            .map(|[t, m, v, g]| {
                let dev = Device::Cpu;
                let ts = [t, m, v, g].map(|x| Tensor::new(x.as_slice(), &dev).unwrap());
                update(&ts[0], &ts[1], &ts[2], &ts[3], s).unwrap();
                [0, 1, 2].map(|i| ts[i].to_vec1::<f32>().unwrap())
            })
            .collect();
        let mut got = start.clone();
        let (dims, blocks) = launch_dims::multi_tensor(&MULTI_SIZES);
        let mut tensors: Vec<kernels::AdamWTensors<'_>> = got
            .iter_mut()
            .map(|[t, m, v, g]| kernels::AdamWTensors { theta: t, m, v, g })
            .collect();
        kernels::adamw_multi_f32(
            Launch::from_dims(dims),
            &blocks,
            &mut tensors,
            &sim_scalars(&s),
        );
        for (k, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_ne!(bits(&g[0]), bits(&start[k][0]), "tensor {k} moved");
            for (i, what) in ["θ", "m", "v"].iter().enumerate() {
                assert_eq!(
                    bits(&g[i]),
                    bits(&w[i]),
                    "{what} of tensor {k} at step {step}"
                );
            }
        }
    }
}

#[test]
fn the_multi_tensor_squared_norm_writes_the_per_tensor_partial_sums_bit_for_bit() {
    let tensors: Vec<Vec<f32>> = MULTI_SIZES
        .iter()
        .enumerate()
        .map(|(k, &n)| values(n, k + 11, 3.0))
        .collect();
    let views: Vec<&[f32]> = tensors.iter().map(Vec::as_slice).collect();
    let (dims, blocks) = launch_dims::multi_tensor(&MULTI_SIZES);
    let mut part = vec![f32::NAN; dims.0[0] as usize];
    kernels::sq_norm_multi_f32(Launch::from_dims(dims), &blocks, &views, &mut part);
    let mut offset = 0;
    for (k, t) in tensors.iter().enumerate() {
        let l = Launch::from_dims(launch_dims::sq_norm(t.len()));
        let mut alone = vec![0f32; l.grid.0 as usize];
        kernels::sq_norm_part_f32(l, t, &mut alone);
        assert_eq!(
            bits(&part[offset..offset + alone.len()]),
            bits(&alone),
            "tensor {k}"
        );
        offset += alone.len();
    }
    assert_eq!(offset, part.len());
}

#[test]
fn the_multi_tensor_add_is_each_tensors_sum_bit_for_bit() {
    let a: Vec<Vec<f32>> = MULTI_SIZES
        .iter()
        .enumerate()
        .map(|(k, &n)| values(n, k + 21, 3.0))
        .collect();
    let b: Vec<Vec<f32>> = MULTI_SIZES
        .iter()
        .enumerate()
        .map(|(k, &n)| values(n, k + 31, 0.7))
        .collect();
    // Odd tensors add in place, even ones into a new buffer, in the same launch.
    let mut out: Vec<Vec<f32>> = a
        .iter()
        .enumerate()
        .map(|(k, x)| {
            if k % 2 == 1 {
                x.clone()
            } else {
                vec![f32::NAN; x.len()]
            }
        })
        .collect();
    let (dims, blocks) = launch_dims::multi_tensor(&MULTI_SIZES);
    let mut sums: Vec<kernels::AddTensors<'_>> = out
        .iter_mut()
        .zip(a.iter().zip(&b))
        .enumerate()
        .map(|(k, (o, (a, b)))| kernels::AddTensors {
            out: o,
            a: (k % 2 == 0).then_some(a.as_slice()),
            b,
        })
        .collect();
    kernels::add_multi_f32(Launch::from_dims(dims), &blocks, &mut sums);
    for (k, ((s, a), b)) in out.iter().zip(&a).zip(&b).enumerate() {
        let want: Vec<f32> = a.iter().zip(b).map(|(x, y)| x + y).collect();
        assert_eq!(bits(s), bits(&want), "tensor {k}");
    }
}
