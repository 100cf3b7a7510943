//! AtomRL's own CUDA kernels as PTX (feature `cuda`): compiled from `cuda/*.cu` by the build
//! script with nvcc, loaded by the crates that launch them (`atomrl-optim`: in-place optimizer
//! and gradient kernels; `atomrl-model`: fused decoder kernels; `atomrl-logprob`: the selective
//! log-softmax; the static decode step; FlashAttention) through candle's
//! `CudaDevice::get_or_load_custom_func`. Whether they are used at all is
//! [`crate::device::cuda_fused_kernels`] (`ATOMRL_CUDA_FUSED=0` turns them off).

/// `cuda/optim.cu`: `atomrl_add_assign_f32`, `atomrl_scale_f32`, `atomrl_sq_norm_part_f32`, and
/// the multi-tensor launches over a table of tensors `atomrl_adamw_multi_f32`,
/// `atomrl_sq_norm_multi_f32` and `atomrl_add_multi_f32`.
pub const OPTIM_PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/optim.ptx"));

/// `cuda/model.cu`: RMSNorm, SwiGLU, RoPE and attention-softmax forward and backward kernels,
/// `atomrl_<kernel>_<f32|bf16|f16>`.
pub const MODEL_PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/model.ptx"));

/// `cuda/logprob.cu`: the selective log-softmax of logits rows and its backward,
/// `atomrl_selective_log_softmax_<fwd|bwd>_<f32|bf16|f16>` (launched by atomrl-logprob).
pub const LOGPROB_PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/logprob.ptx"));

/// `cuda/decode.cu`: the static decode step's kernels, whose per-step values come from device
/// memory (`atomrl_decode_bias_*`, `atomrl_decode_qkv_*`; launched by atomrl-model's
/// `StaticDecode`, replayed in a CUDA graph).
pub const DECODE_PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/decode.ptx"));

/// `cuda/attention.cu`: FlashAttention's forward and its two backward passes for training
/// and prefill, `atomrl_flash_<first_key|fwd|bwd_dq|bwd_dkv>_<f32|bf16|f16>` (launched by
/// atomrl-model's attention).
pub const ATTENTION_PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/attention.ptx"));

use candle_core::cuda_backend::cudarc::driver::LaunchConfig;
use candle_core::{DType, Layout};

/// The entry point of kernel `name` for `dtype` in AtomRL's PTX: `atomrl_<name>_<f32|bf16|f16>`.
///
/// # Errors
/// Any other dtype (the kernels are written for these three).
pub fn kernel_name(name: &str, dtype: DType) -> candle_core::Result<String> {
    let suffix = match dtype {
        DType::F32 => "f32",
        DType::BF16 => "bf16",
        DType::F16 => "f16",
        dt => candle_core::bail!("atomrl CUDA kernel {name}: unsupported dtype {dt:?}"),
    };
    Ok(format!("atomrl_{name}_{suffix}"))
}

/// The element range of a contiguous layout (`what` names the tensor in the error).
///
/// # Errors
/// The layout is not contiguous.
pub fn contiguous_range(l: &Layout, what: &str) -> candle_core::Result<(usize, usize)> {
    l.contiguous_offsets().ok_or_else(|| {
        candle_core::Error::Msg(format!("atomrl CUDA kernel: {what} must be contiguous"))
    })
}

/// An elementwise launch over `n` elements ([`crate::launch_dims::elementwise`]).
pub fn elementwise_launch(n: usize) -> LaunchConfig {
    launch_config(crate::launch_dims::elementwise(n))
}

/// One block per row of `width` elements ([`crate::launch_dims::rows`]).
pub fn rows_launch(rows: usize, width: usize) -> LaunchConfig {
    launch_config(crate::launch_dims::rows(rows, width))
}

/// cudarc's launch configuration of `(grid, block)` dimensions from [`crate::launch_dims`] (no
/// dynamic shared memory).
pub fn launch_config((grid, block): crate::launch_dims::Dims) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (grid[0], grid[1], grid[2]),
        block_dim: (block[0], block[1], block[2]),
        shared_mem_bytes: 0,
    }
}

/// Launches a kernel loaded with candle's `get_or_load_custom_func`: `launch_kernel!(func,
/// config, &arg, ...)` pushes the arguments in order and launches on the device's stream,
/// returning a `candle_core::Result<()>`.
///
/// The launch is `unsafe` FFI: the caller states at the call site, in a `SAFETY` comment, what
/// the kernel reads and writes and that the arguments match the kernel's signature.
#[macro_export]
macro_rules! launch_kernel {
    ($func:expr, $config:expr, $($arg:expr),+ $(,)?) => {{
        let config = $config;
        let mut builder = $func.builder();
        $( candle_core::cuda_backend::cudarc::driver::PushKernelArg::arg(&mut builder, $arg); )+
        // SAFETY: as stated at the call site (arguments in the kernel's order and types, and
        // buffers at least as long as the kernel reads and writes).
        candle_core::cuda_backend::WrapErr::w(unsafe { builder.launch(config) })
    }};
}

/// Runs `f` on the CUDA storage and layout of `t` (made contiguous first).
///
/// # Errors
/// `t` is not on a CUDA device, or `f` fails.
pub fn with_cuda<R>(
    t: &candle_core::Tensor,
    f: impl FnOnce(&candle_core::CudaStorage, &Layout) -> candle_core::Result<R>,
) -> candle_core::Result<R> {
    let t = t.contiguous()?;
    let (storage, layout) = t.storage_and_layout();
    match &*storage {
        candle_core::Storage::Cuda(s) => f(s, layout),
        _ => candle_core::bail!("atomrl CUDA kernel: a CUDA tensor was expected"),
    }
}

/// A tensor without a graph over a new device buffer of `shape`.
pub fn tensor_from_slice<T: candle_core::cuda_backend::CudaDType>(
    slice: candle_core::cuda_backend::cudarc::driver::CudaSlice<T>,
    dev: &candle_core::CudaDevice,
    shape: impl Into<candle_core::Shape>,
) -> candle_core::Tensor {
    let storage = candle_core::Storage::Cuda(T::wrap_cuda_slice(slice, dev.clone()));
    candle_core::Tensor::from_storage(storage, shape, candle_core::op::BackpropOp::none(), false)
}

/// The variable that keeps cudarc's per-buffer CUDA events on (`1`): a diagnostic, for
/// measuring what [`configure_device`] saves.
pub const EVENT_TRACKING_ENV: &str = "ATOMRL_CUDA_EVENT_TRACKING";

/// Sets up a CUDA device as AtomRL runs it: without cudarc's per-buffer event tracking.
///
/// cudarc creates two CUDA events with every buffer it allocates, and destroys them when the
/// buffer is freed, so that buffers shared between streams can be synchronised. Candle gives
/// every tensor op a fresh buffer and runs every op of a device on one stream (the calling
/// thread's default stream), on which cudarc never records or waits on those events: they are
/// four driver calls of pure overhead per tensor op, at the hundreds to thousands of ops a
/// decode step or a micro-batch runs. `ATOMRL_CUDA_EVENT_TRACKING=1` keeps them.
#[allow(unsafe_code)]
pub fn configure_device(dev: &candle_core::CudaDevice) {
    if std::env::var(EVENT_TRACKING_ENV).is_ok_and(|v| v.trim() == "1") {
        return;
    }
    // SAFETY: the tracking only synchronises buffers used on several streams of this context;
    // candle's device uses one (AtomRL's NCCL collective opens its own context object, whose
    // tracking this does not change), and the flag only affects buffers allocated afterwards.
    unsafe { dev.disable_event_tracking() }
}
