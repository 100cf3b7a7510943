//! Autograd gradients (candle `Var` + `backward`) against f64 central finite differences.

#![allow(clippy::unwrap_used)]

use atomrl_loss::{
    aggregate_loss, compute_kl_penalty, compute_policy_loss, entropy_from_logits_chunked,
    AggOptions, KlEstimator, LossAgg, PolicyLossOptions, RatioLevel,
};
use candle_core::{Device, Result, Tensor, Var};

const N: usize = 3;
const T: usize = 5;

/// Deterministic pseudo-random values in `[lo, hi)` (xorshift).
fn values(seed: u64, k: usize, lo: f64, hi: f64) -> Vec<f64> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..k)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            lo + (hi - lo) * ((s >> 11) as f64 / (1u64 << 53) as f64)
        })
        .collect()
}

fn mask() -> Tensor {
    // Row 1 is partly masked, row 2 has a single valid token.
    let m = [1., 1., 1., 1., 1., 1., 1., 0., 0., 0., 0., 0., 1., 0., 0.];
    Tensor::from_vec(m.to_vec(), (N, T), &Device::Cpu).expect("mask")
}

/// Checks d f / d x from `backward` against central differences at `x0`.
fn check(name: &str, x0: &[f64], dims: &[usize], f: &dyn Fn(&Tensor) -> Result<Tensor>) {
    let var = Var::from_tensor(&Tensor::from_vec(x0.to_vec(), dims, &Device::Cpu).expect("x"))
        .expect("var");
    let y = f(var.as_tensor()).expect("forward");
    let grads = y.backward().expect("backward");
    let g = grads
        .get(var.as_tensor())
        .map(|g| {
            g.flatten_all()
                .and_then(|g| g.to_vec1::<f64>())
                .expect("grad")
        })
        .unwrap_or_else(|| vec![0.0; x0.len()]);
    let h = 1e-6;
    for i in 0..x0.len() {
        let eval = |d: f64| {
            let mut x = x0.to_vec();
            x[i] += d;
            let t = Tensor::from_vec(x, dims, &Device::Cpu).expect("x");
            f(&t).and_then(|y| y.to_scalar::<f64>()).expect("eval")
        };
        let fd = (eval(h) - eval(-h)) / (2.0 * h);
        let tol = 1e-6 + 1e-5 * fd.abs();
        assert!(
            (g[i] - fd).abs() <= tol,
            "{name}: d/dx[{i}] autograd {} vs finite difference {fd}",
            g[i]
        );
    }
}

fn policy_inputs(seed: u64) -> (Vec<f64>, Tensor, Tensor) {
    let logp = values(seed, N * T, -3.0, -0.1);
    // Ratios spread over e^±0.6 so that some tokens are clipped and some are not.
    let shift = values(seed + 1, N * T, -0.6, 0.6);
    let old: Vec<f64> = logp.iter().zip(&shift).map(|(l, s)| l - s).collect();
    let old = Tensor::from_vec(old, (N, T), &Device::Cpu).expect("old");
    let adv = Tensor::new(&[1.3f64, -0.7, -2.0], &Device::Cpu).expect("adv");
    (logp, old, adv)
}

#[test]
fn policy_loss_gradient_in_every_mode() {
    for (k, mode) in LossAgg::NAMES.iter().enumerate() {
        for level in [RatioLevel::Token, RatioLevel::Sequence] {
            for c in [None, Some(1.5)] {
                let (logp, old, adv) = policy_inputs(10 + k as u64);
                let opts = PolicyLossOptions {
                    clip_low: 0.2,
                    clip_high: 0.28,
                    clip_ratio_c: c,
                    ratio_level: level,
                    agg: AggOptions {
                        max_len: Some(8),
                        ..AggOptions::new(mode.parse().expect("mode"))
                    },
                };
                let m = mask();
                let name = format!("{mode}/{level}/{c:?}");
                check(&name, &logp, &[N, T], &|x| {
                    compute_policy_loss(x, &old, &adv, &m, &opts)
                        .map(|o| o.loss)
                        .map_err(candle_core::Error::wrap)
                });
            }
        }
    }
}

#[test]
fn policy_loss_gradient_with_token_advantages_and_clamped_ratios() {
    let (mut logp, old, _) = policy_inputs(3);
    logp[0] += 30.0; // log-ratio beyond +20: clamped, zero gradient
    logp[1] -= 30.0; // beyond −20
    let adv = Tensor::from_vec(values(4, N * T, -2.0, 2.0), (N, T), &Device::Cpu).expect("adv");
    let m = mask();
    let opts = PolicyLossOptions::default();
    check("token advantages", &logp, &[N, T], &|x| {
        compute_policy_loss(x, &old, &adv, &m, &opts)
            .map(|o| o.loss)
            .map_err(candle_core::Error::wrap)
    });
}

#[test]
fn kl_gradient_for_every_estimator() {
    let logp = values(7, N * T, -4.0, -0.1);
    let refp = Tensor::from_vec(values(8, N * T, -4.0, -0.1), (N, T), &Device::Cpu).expect("ref");
    let m = mask();
    for est in KlEstimator::NAMES {
        let est: KlEstimator = est.parse().expect("estimator");
        check(est.name(), &logp, &[N, T], &|x| {
            compute_kl_penalty(x, &refp, &m, est)
                .map(|o| o.kl_mean)
                .map_err(candle_core::Error::wrap)
        });
    }
}

#[test]
fn aggregate_gradient_for_every_mode() {
    let l = values(9, N * T, -2.0, 2.0);
    let m = mask();
    for mode in LossAgg::NAMES {
        let opts = AggOptions::new(mode.parse().expect("mode"));
        check(mode, &l, &[N, T], &|x| {
            aggregate_loss(x, &m, &opts).map_err(candle_core::Error::wrap)
        });
    }
}

#[test]
fn entropy_gradient_wrt_logits() {
    let v = 7;
    let z = values(11, N * T * v, -5.0, 5.0);
    let m = mask();
    let w = Tensor::from_vec(values(12, N * T, 0.5, 1.5), (N, T), &Device::Cpu).expect("w");
    check("entropy", &z, &[N, T, v], &|x| {
        entropy_from_logits_chunked(x, &m, 4)
            .map_err(candle_core::Error::wrap)?
            .mul(&w)?
            .sum_all()
    });
}
