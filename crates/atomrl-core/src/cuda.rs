//! AtomRL's own CUDA kernels as PTX (feature `cuda`): compiled from `cuda/*.cu` by the build
//! script with nvcc, loaded by the crates that launch them (`atomrl-optim`: in-place optimizer
//! and gradient kernels; `atomrl-model`: fused decoder kernels) through candle's
//! `CudaDevice::get_or_load_custom_func`. Whether they are used at all is
//! [`crate::device::cuda_fused_kernels`] (`ATOMRL_CUDA_FUSED=0` turns them off).

/// `cuda/optim.cu`: `atomrl_add_assign_f32`, `atomrl_scale_f32`, `atomrl_adamw_moment_f32`,
/// `atomrl_adamw_param_f32`.
pub const OPTIM_PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/optim.ptx"));

/// `cuda/model.cu`: RMSNorm, SwiGLU, RoPE and attention-softmax forward and backward kernels,
/// `atomrl_<kernel>_<f32|bf16|f16>`.
pub const MODEL_PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/model.ptx"));

use candle_core::cuda_backend::cudarc::driver::LaunchConfig;
use candle_core::Layout;

/// The element range of a contiguous layout (`what` names the tensor in the error).
///
/// # Errors
/// The layout is not contiguous.
pub fn contiguous_range(l: &Layout, what: &str) -> candle_core::Result<(usize, usize)> {
    l.contiguous_offsets().ok_or_else(|| {
        candle_core::Error::Msg(format!("atomrl CUDA kernel: {what} must be contiguous"))
    })
}

/// An elementwise launch over `n` elements: 256 threads per block, at most 65,535 blocks (the
/// kernels stride over the rest).
pub fn elementwise_launch(n: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n.div_ceil(256).clamp(1, 65_535) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// One block per row of `width` elements: a multiple of 32 threads, at most 256 (the row
/// kernels of `model.cu` reduce over the block).
pub fn rows_launch(rows: usize, width: usize) -> LaunchConfig {
    let threads = width.div_ceil(32).clamp(1, 8) as u32 * 32;
    LaunchConfig {
        grid_dim: (rows.max(1) as u32, 1, 1),
        block_dim: (threads, 1, 1),
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
