//! Drawing the next tokens on the model's device (a GPU) instead of the host.
//!
//! The host path copies each step's `[B, V]` logits to the CPU and samples row by row: at
//! Qwen's 151,936-token vocabulary that is 39 MB per decode step at batch 64, several times
//! what the step itself must read from memory. For unfiltered sampling (no top-k, top-p,
//! min-p or repetition penalty: what GRPO recipes use) the draw can stay on the device:
//! Gumbel-max, `argmax(x/T − log(−log U))` with `U` uniform, draws from `softmax(x/T)`
//! exactly, and only the `B` token ids and their log-probs cross to the host. Greedy decoding
//! is a device `argmax`. Filters that need sorted rows or the token history stay on the host
//! (candle's device sort does not take rows of 151,936 entries).

use atomrl_core::{CandleContext, Result};
use candle_core::{DType, Device, Tensor, D};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::params::SamplingParams;

/// Where the uniform numbers of the Gumbel-max draw come from.
pub(crate) enum Noise {
    /// `Tensor::rand` on the device, whose generator was seeded once per `generate_samples`
    /// call (CUDA's cuRAND): nothing crosses to the device per step.
    Device,
    /// A seeded host generator, uploaded each step: reproducible on the CPU, where candle's
    /// generator cannot be seeded (tests of this path).
    Host(Box<StdRng>),
}

impl Noise {
    /// The noise source for `device`: the device's own generator seeded with `seed` where it
    /// can be, else a host generator.
    pub(crate) fn for_device(device: &Device, seed: u64) -> Self {
        match device.set_seed(seed) {
            Ok(()) if !device.is_cpu() => Noise::Device,
            _ => Noise::Host(Box::new(StdRng::seed_from_u64(seed))),
        }
    }

    /// Uniform numbers in `[0, 1)` of `shape` on `device`, f32.
    fn uniform(&mut self, rows: usize, vocab: usize, device: &Device) -> Result<Tensor> {
        let func = "generate_samples";
        match self {
            Noise::Device => Tensor::rand(0f32, 1f32, (rows, vocab), device).ctx(func),
            Noise::Host(rng) => {
                let u: Vec<f32> = (0..rows * vocab).map(|_| rng.random::<f32>()).collect();
                Tensor::from_vec(u, (rows, vocab), device).ctx(func)
            }
        }
    }
}

/// Whether a step with `params` can be drawn on `device`: not the CPU (where the host path
/// costs no copy and keeps per-row generators), and no filter or penalty.
pub(crate) fn applies(params: &SamplingParams, device: &Device) -> bool {
    !device.is_cpu() && params.is_unfiltered()
}

/// The next token of each row of `logits [B, V]` and its log-probability under
/// `softmax(logits / T)` (`T = 1` when greedy, as the host path reports), drawn on the
/// logits' device; `temperature = 0` is greedy. On CUDA one kernel does the draw
/// (`pick_cuda`), unless `ATOMRL_CUDA_FUSED=0`.
pub(crate) fn pick(
    logits: &Tensor,
    temperature: f64,
    noise: &mut Noise,
) -> Result<(Vec<u32>, Vec<f32>)> {
    let func = "generate_samples";
    let (rows, vocab) = logits.dims2().ctx(func)?;
    let u = if temperature > 0.0 {
        Some(noise.uniform(rows, vocab, logits.device())?)
    } else {
        None
    };
    let (tokens, log_probs) = draw(logits, temperature, u.as_ref(), true).ctx(func)?;
    let log_probs = log_probs.to_vec1::<f32>().ctx(func)?;
    let tokens = tokens.to_vec1::<u32>().ctx(func)?;
    Ok((tokens, log_probs))
}

/// Tokens (u32 `[B]`) and log-probs (f32 `[B]`) of `logits [B, V]` with the uniform noise `u`
/// (`None`: greedy), through the CUDA kernel when `fused` and it takes the logits, else
/// through tensor ops.
pub(crate) fn draw(
    logits: &Tensor,
    temperature: f64,
    u: Option<&Tensor>,
    fused: bool,
) -> candle_core::Result<(Tensor, Tensor)> {
    let t = if temperature > 0.0 { temperature } else { 1.0 };
    #[cfg(feature = "cuda")]
    if fused && crate::pick_cuda::available(logits) {
        return crate::pick_cuda::pick(logits, u, 1.0 / t);
    }
    let _ = fused;
    let x = logits.to_dtype(DType::F32)?;
    let x = if t == 1.0 { x } else { x.affine(1.0 / t, 0.0)? };
    let tokens = match u {
        Some(u) => {
            // −log(−log U) is standard Gumbel; U = 0 gives −inf, a token never drawn.
            let gumbel = u.log()?.neg()?.log()?.neg()?;
            (&x + gumbel)?.argmax(D::Minus1)?
        }
        None => x.argmax(D::Minus1)?,
    };
    let max = x.max_keepdim(D::Minus1)?;
    let log_sum = (x
        .broadcast_sub(&max)?
        .exp()?
        .sum_keepdim(D::Minus1)?
        .log()?
        + &max)?;
    let chosen = x.gather(&tokens.unsqueeze(1)?, 1)?;
    let log_probs = (chosen - log_sum)?.squeeze(1)?;
    Ok((tokens, log_probs))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn host(seed: u64) -> Noise {
        Noise::Host(Box::new(StdRng::seed_from_u64(seed)))
    }

    #[test]
    fn greedy_is_the_argmax_with_its_log_prob() {
        let logits = Tensor::new(&[[0.0f32, 2.0, 1.0], [5.0, -1.0, 4.9]], &Device::Cpu).unwrap();
        let (tok, lp) = pick(&logits, 0.0, &mut host(0)).unwrap();
        assert_eq!(tok, vec![1, 0]);
        let want = 2.0 - (1f32 + 2f32.exp() + 1f32.exp()).ln();
        assert!((lp[0] - want).abs() < 1e-6);
    }

    /// Draw frequencies match `softmax(x / T)`: a chi-square test over 20,000 draws of one
    /// 4-token row (3 degrees of freedom; 16.3 is the 0.1% critical value), with a seeded
    /// host generator so the test is deterministic.
    #[test]
    fn gumbel_max_draws_from_the_tempered_softmax() {
        for t in [0.7, 1.0, 1.6] {
            let row = [0.3f32, 1.2, -0.5, 0.9];
            let n = 20_000;
            let logits = Tensor::new(&[row], &Device::Cpu)
                .unwrap()
                .repeat((n, 1))
                .unwrap();
            let (tok, lp) = pick(&logits, t, &mut host(11)).unwrap();
            let w: Vec<f64> = row.iter().map(|&l| (f64::from(l) / t).exp()).collect();
            let z: f64 = w.iter().sum();
            let mut counts = [0usize; 4];
            for (&k, &l) in tok.iter().zip(&lp) {
                counts[k as usize] += 1;
                assert!((f64::from(l) - (w[k as usize] / z).ln()).abs() < 1e-5);
            }
            let chi2: f64 = (0..4)
                .map(|k| {
                    let e = n as f64 * w[k] / z;
                    (counts[k] as f64 - e).powi(2) / e
                })
                .sum();
            assert!(chi2 < 16.3, "T = {t}: chi-square {chi2}, counts {counts:?}");
        }
    }

    #[test]
    fn the_host_path_stays_on_the_cpu_and_filters_stay_on_the_host() {
        let plain = SamplingParams::default();
        assert!(!applies(&plain, &Device::Cpu));
        assert!(plain.is_unfiltered());
        for p in [
            SamplingParams {
                top_k: 5,
                ..Default::default()
            },
            SamplingParams {
                top_p: 0.9,
                ..Default::default()
            },
            SamplingParams {
                min_p: 0.1,
                ..Default::default()
            },
            SamplingParams {
                repetition_penalty: 1.1,
                ..Default::default()
            },
        ] {
            assert!(!p.is_unfiltered());
        }
    }
}
