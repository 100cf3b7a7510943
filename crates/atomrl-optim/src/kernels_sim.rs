//! optim.cu's kernels run on the CPU by atomrl-cuda-sim, with the launches of `cuda.rs`,
//! against the CPU forms: AdamW's one-pass update bit for bit (the kernel's `_rn` intrinsics
//! keep the CPU's order and roundings), the in-place add and scale, and the squared-norm
//! partial sums.
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
fn the_cuda_adamw_is_the_cpu_update_bit_for_bit() {
    let n = 3_000;
    let config = AdamWConfig {
        weight_decay: 0.1,
        ..AdamWConfig::default()
    };
    for (step, grad_scale, wd) in [
        (1i32, None, 0.0),
        (7, Some(0.37), 0.1),
        (300, Some(1.7), 0.1),
    ] {
        let config = AdamWConfig {
            weight_decay: wd,
            ..config
        };
        let bias1 = 1.0 - config.beta1.powi(step);
        let bias2 = 1.0 - config.beta2.powi(step);
        let s = UpdateScalars::new(&config, 3e-4, bias1, bias2, grad_scale);
        let (theta, m) = (values(n, 1, 2.0), values(n, 2, 0.01));
        let v: Vec<f32> = values(n, 3, 1e-4).iter().map(|x| x.abs()).collect();
        let g = values(n, 4, 0.5);

        let dev = Device::Cpu;
        let t_cpu = Tensor::new(theta.as_slice(), &dev).unwrap();
        let m_cpu = Tensor::new(m.as_slice(), &dev).unwrap();
        let v_cpu = Tensor::new(v.as_slice(), &dev).unwrap();
        let g_cpu = Tensor::new(g.as_slice(), &dev).unwrap();
        update(&t_cpu, &m_cpu, &v_cpu, &g_cpu, s).unwrap();

        // The CUDA launch (elementwise: 12 blocks of 256), and a 2-block grid that strides.
        for l in [
            Launch::from_dims(launch_dims::elementwise(n)),
            Launch::linear(2, 256),
        ] {
            let (mut t, mut mm, mut vv) = (theta.clone(), m.clone(), v.clone());
            kernels::adamw_f32(l, &mut t, &mut mm, &mut vv, &g, &sim_scalars(&s));
            assert_eq!(
                bits(&t),
                bits(&t_cpu.to_vec1().unwrap()),
                "θ at step {step}, {l:?}"
            );
            assert_eq!(
                bits(&mm),
                bits(&m_cpu.to_vec1().unwrap()),
                "m at step {step}"
            );
            assert_eq!(
                bits(&vv),
                bits(&v_cpu.to_vec1().unwrap()),
                "v at step {step}"
            );
        }
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
