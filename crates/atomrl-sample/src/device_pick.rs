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

use atomrl_core::{CandleContext, Error, Result};
use candle_core::{DType, Device, Tensor, D};

use crate::params::SamplingParams;
use crate::philox::StepNoise;

/// The noise of a `generate_samples` call's device draws: the Philox stream of its seed
/// ([`StepNoise`]), one step per draw.
pub(crate) struct Noise {
    seed: u64,
    step: u32,
    /// Draw from the device's own generator (cuRAND, seeded once per call) where the tensor-op
    /// form runs on a GPU (AtomRL's kernels off): Philox numbers would have to be made on the
    /// host and uploaded, `[B, V]` floats a step.
    device_generator: bool,
}

impl Noise {
    /// The noise of a call on `device` with sampling seed `seed`.
    pub(crate) fn for_device(device: &Device, seed: u64) -> Self {
        let device_generator = !device.is_cpu() && device.set_seed(seed).is_ok();
        Self {
            seed,
            step: 0,
            device_generator,
        }
    }

    /// The noise of the next draw.
    fn next_step(&mut self) -> StepNoise {
        let step = StepNoise {
            seed: self.seed,
            step: self.step,
        };
        self.step = self.step.wrapping_add(1);
        step
    }
}

/// Whether a step with `params` can be drawn on `device`: not the CPU (where the host path
/// costs no copy and keeps per-row generators), and no filter or penalty.
pub(crate) fn applies(params: &SamplingParams, device: &Device) -> bool {
    !device.is_cpu() && params.is_unfiltered()
}

/// The next token of each row of `logits [B, V]` and its log-probability under
/// `softmax(logits / T)` (`T = 1` when greedy, as the host path reports), drawn on the
/// logits' device; `temperature = 0` is greedy. `rows` are the rows' indices in the call
/// (`B` of them): a row's noise follows its index and the step, whichever rows are still in
/// the batch. On CUDA one kernel does the draw, noise included (`pick_cuda`), unless
/// `ATOMRL_CUDA_FUSED=0`.
pub(crate) fn pick(
    logits: &Tensor,
    temperature: f64,
    noise: &mut Noise,
    rows: &[usize],
) -> Result<(Vec<u32>, Vec<f32>)> {
    let func = "generate_samples";
    let (b, vocab) = logits.dims2().ctx(func)?;
    let ids = row_ids(func, rows, b)?;
    let step = noise.next_step();
    let sampled = (temperature > 0.0).then_some((&step, ids.as_slice()));
    #[cfg(feature = "cuda")]
    if crate::pick_cuda::available(logits) {
        return crate::pick_cuda::pick(logits, sampled, 1.0 / effective(temperature)).ctx(func);
    }
    let u = match sampled {
        None => None,
        Some(_) if noise.device_generator => {
            Some(Tensor::rand(0f32, 1f32, (b, vocab), logits.device()).ctx(func)?)
        }
        Some((step, ids)) => Some(uniforms(step, ids, vocab, logits.device()).ctx(func)?),
    };
    let (tokens, log_probs) = draw_with(logits, temperature, u.as_ref()).ctx(func)?;
    Ok((
        tokens.to_vec1::<u32>().ctx(func)?,
        log_probs.to_vec1::<f32>().ctx(func)?,
    ))
}

/// The rows' indices as the kernel reads them (u32), one per row of the logits.
fn row_ids(func: &str, rows: &[usize], b: usize) -> Result<Vec<u32>> {
    if rows.len() != b {
        return Err(Error::value(
            func,
            "rows",
            format!("{b} row indices (one per row of the logits)"),
            rows.len(),
        ));
    }
    rows.iter()
        .map(|&r| {
            u32::try_from(r).map_err(|_| Error::value(func, "rows", "row indices below 2^32", r))
        })
        .collect()
}

/// Tokens and log-probs of `logits [B, V]` with the Philox noise of `noise` for the rows it
/// names (`None`: greedy), through the CUDA kernel when `fused` and it takes the logits, else
/// through tensor ops with the same noise made on the host: the draw of the device check.
pub(crate) fn draw(
    logits: &Tensor,
    temperature: f64,
    noise: Option<(&StepNoise, &[u32])>,
    fused: bool,
) -> candle_core::Result<(Vec<u32>, Vec<f32>)> {
    #[cfg(feature = "cuda")]
    if fused && crate::pick_cuda::available(logits) {
        return crate::pick_cuda::pick(logits, noise, 1.0 / effective(temperature));
    }
    let _ = fused;
    let vocab = logits.dims2()?.1;
    let u = noise
        .map(|(step, ids)| uniforms(step, ids, vocab, logits.device()))
        .transpose()?;
    let (tokens, log_probs) = draw_with(logits, temperature, u.as_ref())?;
    Ok((tokens.to_vec1()?, log_probs.to_vec1()?))
}

/// The temperature the log-probs are taken at: `T`, or 1 when greedy.
pub(crate) fn effective(temperature: f64) -> f64 {
    if temperature > 0.0 {
        temperature
    } else {
        1.0
    }
}

/// The uniform numbers of `step` for the rows `ids`, f32 `[ids.len(), vocab]` on `device`.
fn uniforms(
    step: &StepNoise,
    ids: &[u32],
    vocab: usize,
    device: &Device,
) -> candle_core::Result<Tensor> {
    Tensor::from_vec(step.uniforms(ids, vocab), (ids.len(), vocab), device)
}

/// Chunks per row and the columns of each (a multiple of 4, so that a Philox call's four words
/// stay in one block) for the CUDA draw over `rows` rows of `vocab` with `threads` threads a
/// block: at least 256 blocks where the rows allow (two per SM of an H100), none narrower
/// than 4 columns a thread. A function of the shape alone, so a draw has the same bits on
/// every device.
// Used by the CUDA form only; tested here so the CPU suite checks the layout.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn chunking(rows: usize, vocab: usize, threads: usize) -> (usize, usize) {
    const TARGET_BLOCKS: usize = 256;
    let most = (vocab / (4 * threads)).max(1);
    let chunks = TARGET_BLOCKS.div_ceil(rows.max(1)).clamp(1, most);
    let span = (vocab.div_ceil(chunks).div_ceil(4) * 4).max(4);
    (vocab.div_ceil(span).max(1), span)
}

/// The tensor-op form: tokens (u32 `[B]`) and log-probs (f32 `[B]`) of `logits [B, V]` with
/// the uniform noise `u` (`None`: greedy).
fn draw_with(
    logits: &Tensor,
    temperature: f64,
    u: Option<&Tensor>,
) -> candle_core::Result<(Tensor, Tensor)> {
    let t = effective(temperature);
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
        Noise::for_device(&Device::Cpu, seed)
    }

    #[test]
    fn greedy_is_the_argmax_with_its_log_prob() {
        let logits = Tensor::new(&[[0.0f32, 2.0, 1.0], [5.0, -1.0, 4.9]], &Device::Cpu).unwrap();
        let (tok, lp) = pick(&logits, 0.0, &mut host(0), &[0, 1]).unwrap();
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
            let rows: Vec<usize> = (0..n).collect();
            let (tok, lp) = pick(&logits, t, &mut host(11), &rows).unwrap();
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

    /// A row draws what it draws alone, wherever it sits in the batch: its noise follows its
    /// index in the call and the step.
    #[test]
    fn a_row_draws_the_same_tokens_in_any_batch() {
        let x: Vec<f32> = (0..3 * 50).map(|i| ((i * 37) % 11) as f32 / 4.0).collect();
        let logits = Tensor::from_vec(x, (3, 50), &Device::Cpu).unwrap();
        let mut all = host(9);
        let (tok, lp) = pick(&logits, 1.0, &mut all, &[4, 7, 9]).unwrap();
        let middle = logits.narrow(0, 1, 1).unwrap();
        let (alone, alone_lp) = pick(&middle, 1.0, &mut host(9), &[7]).unwrap();
        assert_eq!((alone[0], alone_lp[0]), (tok[1], lp[1]));
        // The next step has other numbers.
        let again: Vec<u32> = (0..20)
            .flat_map(|_| pick(&middle, 1.0, &mut all, &[7]).unwrap().0)
            .collect();
        assert!(again.iter().any(|&t| t != again[0]), "{again:?}");
    }

    #[test]
    fn wrong_row_indices_are_refused() {
        let logits = Tensor::zeros((2, 5), DType::F32, &Device::Cpu).unwrap();
        let err = pick(&logits, 1.0, &mut host(0), &[0])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("rows") && err.contains("2 row indices"),
            "{err}"
        );
    }

    /// The CUDA draw's chunks cover each row once, in spans of whole Philox groups, with at
    /// least 256 blocks where the row is wide enough and none below 4 columns a thread.
    #[test]
    fn the_chunks_cover_the_row_and_fill_the_device() {
        for (rows, vocab) in [
            (1, 151_936),
            (64, 151_936),
            (256, 151_936),
            (3, 1_000),
            (2, 5),
        ] {
            let (chunks, span) = chunking(rows, vocab, 256);
            assert_eq!(span % 4, 0);
            assert!(
                chunks * span >= vocab && (chunks - 1) * span < vocab,
                "{rows} x {vocab}"
            );
            if vocab >= 256 * 1024 / rows.max(1) {
                assert!(rows * chunks >= 256, "{rows} x {vocab}: {chunks} chunks");
            }
            assert!(chunks == 1 || span >= 1024, "{rows} x {vocab}: span {span}");
        }
        assert_eq!(chunking(64, 151_936, 256), (4, 37_984));
    }
}
