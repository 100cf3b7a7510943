//! The CUDA form of the device draw (`atomrl_pick_*` in `crates/atomrl-core/cuda/decode.cu`):
//! each row's Gumbel-max token (or greedy argmax) and its log-prob in one kernel reading the
//! logits in their dtype, in place of the tensor-op form's ~16 passes over f32 copies.
// Kernel launches are FFI (`atomrl_core::launch_kernel!`); the launch says what it reads and
// writes.
#![allow(unsafe_code)]

use atomrl_core::cuda::{contiguous_range, tensor_from_slice, with_cuda};
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, LaunchConfig};
use candle_core::cuda_backend::CudaDType;
use candle_core::{DType, Result, Tensor, WithDType};

/// Threads per row (`PICK_THREADS` in decode.cu).
const THREADS: u32 = 1024;

/// Whether the kernel takes `logits`: CUDA, f32, bf16 or f16, AtomRL's kernels on.
pub(crate) fn available(logits: &Tensor) -> bool {
    logits.device().is_cuda()
        && matches!(logits.dtype(), DType::F32 | DType::BF16 | DType::F16)
        && atomrl_core::device::cuda_fused_kernels()
}

/// Tokens (u32 `[B]`) and log-probs (f32 `[B]`) of `logits [B, V]` scaled by `inv_t`, drawn
/// with the uniform `noise [B, V]` (f32), or greedy without it.
pub(crate) fn pick(
    logits: &Tensor,
    noise: Option<&Tensor>,
    inv_t: f64,
) -> Result<(Tensor, Tensor)> {
    fn run<T: CudaDType + DeviceRepr + WithDType>(
        logits: &Tensor,
        noise: &Tensor,
        has_noise: bool,
        inv_t: f64,
    ) -> Result<(Tensor, Tensor)> {
        let (rows, v) = logits.dims2()?;
        let name = atomrl_core::cuda::kernel_name("pick", T::DTYPE)?;
        with_cuda(logits, |ls, ll| {
            with_cuda(noise, |us, ul| {
                let dev = ls.device();
                let (a, b) = contiguous_range(ll, "logits")?;
                let lv = ls.as_cuda_slice::<T>()?.slice(a..b);
                let (c, d) = contiguous_range(ul, "noise")?;
                let uv = us.as_cuda_slice::<f32>()?.slice(c..d);
                let func = dev.get_or_load_custom_func(
                    &name,
                    "atomrl_decode",
                    atomrl_core::cuda::DECODE_PTX,
                )?;
                // SAFETY: the kernel writes one token and one log-prob per row.
                let tokens = unsafe { dev.alloc::<u32>(rows)? };
                let lps = unsafe { dev.alloc::<f32>(rows)? };
                let config = LaunchConfig {
                    grid_dim: (rows as u32, 1, 1),
                    block_dim: (THREADS, 1, 1),
                    shared_mem_bytes: 0,
                };
                let (has, it, vi) = (i32::from(has_noise), inv_t as f32, v as i32);
                // Launch: reads rows × v logits (and as many noise values when has = 1), writes
                // rows tokens and log-probs; types as in decode.cu.
                atomrl_core::launch_kernel!(func, config, &lv, &uv, &has, &it, &vi, &tokens, &lps)?;
                Ok((
                    tensor_from_slice(tokens, dev, rows),
                    tensor_from_slice(lps, dev, rows),
                ))
            })
        })
    }
    let (rows, v) = logits.dims2()?;
    let stand_in;
    let (u, has) = match noise {
        Some(u) => {
            if u.dims() != [rows, v] || u.dtype() != DType::F32 {
                candle_core::bail!("atomrl-pick: noise must be f32 [{rows}, {v}]");
            }
            (u, true)
        }
        // Not read without noise.
        None => {
            stand_in = Tensor::zeros(1, DType::F32, logits.device())?;
            (&stand_in, false)
        }
    };
    match logits.dtype() {
        DType::F32 => run::<f32>(logits, u, has, inv_t),
        DType::BF16 => run::<half::bf16>(logits, u, has, inv_t),
        DType::F16 => run::<half::f16>(logits, u, has, inv_t),
        dt => candle_core::bail!("atomrl-pick: unsupported dtype {dt:?}"),
    }
}
