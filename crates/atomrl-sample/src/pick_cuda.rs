//! The CUDA form of the device draw (`atomrl_pick_part_*` and `atomrl_pick_finish_*` in
//! `crates/atomrl-core/cuda/decode.cu`): each row's Gumbel-max token (or greedy argmax) and its
//! log-prob from the logits in their dtype, with the Philox noise of [`StepNoise`] made inside
//! the kernel, in place of the tensor-op form's ~16 passes over f32 copies and cuRAND's
//! `[B, V]` f32 noise buffer. Rows are split over several blocks, so that a few rows still
//! fill the GPU, and the tokens and log-probs come back in one copy.
// Kernel launches are FFI (`atomrl_core::launch_kernel!`); each launch says what it reads and
// writes.
#![allow(unsafe_code)]

use atomrl_core::cuda::{contiguous_range, launch_config, with_cuda};
use atomrl_core::launch_dims::{self, PICK_THREADS as THREADS};
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::DeviceRepr;
use candle_core::cuda_backend::CudaDType;
use candle_core::{DType, Result, Tensor, WithDType};
use std::sync::OnceLock;

use crate::device_pick::{chunking, effective};
use crate::philox::StepNoise;

/// f32 words of one block's partial state (`PickState` in decode.cu: best, index, max, sum).
const STATE_WORDS: usize = 4;

/// Whether the kernel takes `logits`: CUDA, `[B, V]` with `B` ≤ 65,535, f32, bf16 or f16,
/// AtomRL's kernels on, and the kernel agrees with the tensor-op form on this GPU ([`verified`]).
pub(crate) fn available(logits: &Tensor) -> bool {
    // Rows are the grid's y dimension (at most 65,535 blocks).
    logits.device().is_cuda()
        && logits.dims2().is_ok_and(|(rows, _)| rows <= 65_535)
        && matches!(logits.dtype(), DType::F32 | DType::BF16 | DType::F16)
        && atomrl_core::device::cuda_fused_kernels()
        && verified(logits.device())
}

/// Whether the kernel draws what the tensor-op form draws on this process's GPU, with the same
/// Philox noise made on the host: checked once, on first use, on 3 rows of 5,003 logits (4
/// blocks a row), sampled and greedy, tokens equal and log-probs to 1e-4. A kernel that
/// disagrees or fails is reported and the tensor-op form is kept, so a bad kernel costs
/// speed, not correctness.
fn verified(device: &candle_core::Device) -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    atomrl_core::device::verified_once(
        &OK,
        "AtomRL's CUDA token draw",
        "its tensor-op form",
        || self_check(device),
    )
}

/// `None` when the kernel agrees with the tensor-op form, else what differs.
fn self_check(device: &candle_core::Device) -> Result<Option<String>> {
    let (r, v) = (3usize, 5_003usize);
    let x = crate::kernel_check::grid_logits(r, v);
    let logits = Tensor::from_vec(x, (r, v), device)?;
    let noise = StepNoise { seed: 17, step: 2 };
    let ids = [1u32, 4, 9];
    for (temperature, noise) in [(0.7, Some((&noise, &ids[..]))), (0.0, None)] {
        let (t, lp) = pick(&logits, noise, 1.0 / effective(temperature))?;
        let (t0, lp0) = crate::device_pick::draw(&logits, temperature, noise, false)?;
        if t != t0 {
            return Ok(Some(format!(
                "tokens {t:?} against {t0:?} at T = {temperature}"
            )));
        }
        let d = lp
            .iter()
            .zip(&lp0)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        if d.is_nan() || d > 1e-4 {
            return Ok(Some(format!("log-probs off by {d} at T = {temperature}")));
        }
    }
    Ok(None)
}

/// Tokens and log-probs of `logits [B, V]` scaled by `inv_t`, drawn with `noise` for the rows
/// `row_ids` (their indices in the call), or greedy without it; read back in one copy.
pub(crate) fn pick(
    logits: &Tensor,
    noise: Option<(&StepNoise, &[u32])>,
    inv_t: f64,
) -> Result<(Vec<u32>, Vec<f32>)> {
    fn run<T: CudaDType + DeviceRepr + WithDType>(
        logits: &Tensor,
        noise: Option<(&StepNoise, &[u32])>,
        inv_t: f64,
    ) -> Result<(Vec<u32>, Vec<f32>)> {
        let (rows, v) = logits.dims2()?;
        let part_name = atomrl_core::cuda::kernel_name("pick_part", T::DTYPE)?;
        let finish_name = atomrl_core::cuda::kernel_name("pick_finish", T::DTYPE)?;
        let (chunks, span) = chunking(rows, v, THREADS as usize);
        with_cuda(logits, |ls, ll| {
            let dev = ls.device();
            let (a, b) = contiguous_range(ll, "logits")?;
            let lv = ls.as_cuda_slice::<T>()?.slice(a..b);
            let ptx = atomrl_core::cuda::DECODE_PTX;
            let part = dev.get_or_load_custom_func(&part_name, "atomrl_decode", ptx)?;
            let finish = dev.get_or_load_custom_func(&finish_name, "atomrl_decode", ptx)?;
            let (seed, step, ids) = match noise {
                Some((n, ids)) => (n.key(), n.step, ids.to_vec()),
                // Not read without noise.
                None => ([0, 0], 0, vec![0]),
            };
            let ids = dev.clone_htod(&ids)?;
            // SAFETY: every block of the first launch writes its one state; the second writes
            // every row's token and log-prob.
            let mut parts = unsafe { dev.alloc::<f32>(rows * chunks * STATE_WORDS)? };
            let mut out = unsafe { dev.alloc::<u32>(2 * rows)? };
            let has = i32::from(noise.is_some());
            let (it, vi, sp) = (inv_t as f32, v as i32, span as i32);
            let config = launch_config(launch_dims::pick_part(chunks, rows));
            // Launch: reads rows × v logits and `rows` row ids (one when has = 0), writes
            // rows × chunks states; argument types as in decode.cu's atomrl_pick_part.
            atomrl_core::launch_kernel!(
                part, config, &lv, &has, &seed[0], &seed[1], &ids, &step, &it, &vi, &sp, &mut parts
            )?;
            let (ri, ci) = (rows as i32, chunks as i32);
            let config = launch_config(launch_dims::pick_finish(rows));
            // Launch: reads the states and each row's chosen logit, writes 2 × rows words;
            // argument types as in atomrl_pick_finish.
            atomrl_core::launch_kernel!(finish, config, &lv, &parts, &ri, &ci, &it, &vi, &mut out)?;
            let host = dev.clone_dtoh(&out)?;
            let tokens = host[..rows].to_vec();
            let log_probs = host[rows..].iter().map(|&w| f32::from_bits(w)).collect();
            Ok((tokens, log_probs))
        })
    }
    if let Some((_, ids)) = noise {
        let rows = logits.dims2()?.0;
        if ids.len() != rows {
            candle_core::bail!(
                "atomrl-pick: {} row ids for {rows} rows of logits",
                ids.len()
            );
        }
    }
    match logits.dtype() {
        DType::F32 => run::<f32>(logits, noise, inv_t),
        DType::BF16 => run::<half::bf16>(logits, noise, inv_t),
        DType::F16 => run::<half::f16>(logits, noise, inv_t),
        dt => candle_core::bail!("atomrl-pick: unsupported dtype {dt:?}"),
    }
}
