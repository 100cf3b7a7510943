//! The CUDA form of the selective log-softmax (`crates/atomrl-core/cuda/logprob.cu`, PTX built
//! by atomrl-core's build script): the log-prob of each row's token and the row's entropy, and
//! the gradient with respect to the logits, each one kernel reading the `[R, V]` logits in their
//! dtype (f32, bf16, f16) and computing in f32, in place of the tensor-op form's f32 copies of
//! the chunk (module docs of `fused.rs`). Used where [`available`] says so.
// Kernel launches are FFI (`atomrl_core::launch_kernel!`) and buffers are allocated
// uninitialised; each launch says what the kernel reads and writes.
#![allow(unsafe_code)]

use std::sync::OnceLock;

use atomrl_core::cuda::{contiguous_range as range, rows_launch, tensor_from_slice, with_cuda};
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::DeviceRepr;
use candle_core::cuda_backend::CudaDType;
use candle_core::{DType, Result, Tensor};

/// The module name the device caches the PTX under.
const MODULE: &str = "atomrl_logprob";

/// Whether the kernels take `logits`: a CUDA tensor of f32, bf16 or f16, with AtomRL's CUDA
/// kernels on (`ATOMRL_CUDA_FUSED`) and the kernels' self-check passed on this process's
/// first use.
pub(crate) fn available(logits: &Tensor) -> bool {
    logits.device().is_cuda()
        && matches!(logits.dtype(), DType::F32 | DType::BF16 | DType::F16)
        && atomrl_core::device::cuda_fused_kernels()
        && verified(logits)
}

/// The kernel name for `dtype`.
fn kernel(pass: &str, dtype: DType) -> Result<String> {
    atomrl_core::cuda::kernel_name(&format!("selective_log_softmax_{pass}"), dtype)
}

/// Checks shapes and returns `(R, V)`.
fn dims(logits: &Tensor, tokens: &Tensor) -> Result<(usize, usize)> {
    let (r, v) = logits.dims2()?;
    if tokens.dims() != [r] || tokens.dtype() != DType::U32 {
        candle_core::bail!(
            "atomrl-selective-log-softmax: tokens must be u32 [{r}], got {:?} {:?}",
            tokens.dtype(),
            tokens.dims()
        );
    }
    Ok((r, v))
}

/// `log_probs [R]` and (when `with_entropy`) `entropy [R]`, f32, of `logits [R, V]` at
/// temperature `temperature`, without a graph.
pub(crate) fn forward(
    logits: &Tensor,
    tokens: &Tensor,
    temperature: f64,
    with_entropy: bool,
) -> Result<(Tensor, Option<Tensor>)> {
    fn run<T: CudaDType + DeviceRepr>(
        logits: &Tensor,
        tokens: &Tensor,
        inv_t: f32,
        with_entropy: bool,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let (r, v) = dims(logits, tokens)?;
        with_cuda(logits, |xs, lx| {
            with_cuda(tokens, |ts, lt| {
                let dev = xs.device();
                let (rx, rt) = (range(lx, "logits")?, range(lt, "tokens")?);
                let xv = xs.as_cuda_slice::<T>()?.slice(rx.0..rx.1);
                let tv = ts.as_cuda_slice::<u32>()?.slice(rt.0..rt.1);
                let f = dev.get_or_load_custom_func(
                    &kernel("fwd", logits.dtype())?,
                    MODULE,
                    atomrl_core::cuda::LOGPROB_PTX,
                )?;
                // SAFETY: one value per row, written by the kernel (entropies only when asked).
                let lp = unsafe { dev.alloc::<f32>(r)? };
                let ent = unsafe { dev.alloc::<f32>(r)? };
                let (vi, we) = (v as i32, i32::from(with_entropy));
                // Launch: reads R × V logits and R tokens, writes R log-probs (and R
                // entropies); argument types as in logprob.cu.
                atomrl_core::launch_kernel!(
                    f,
                    rows_launch(r, v),
                    &xv,
                    &tv,
                    &lp,
                    &ent,
                    &vi,
                    &inv_t,
                    &we
                )?;
                let lp = tensor_from_slice(lp, dev, r);
                let ent = with_entropy.then(|| tensor_from_slice(ent, dev, r));
                Ok((lp, ent))
            })
        })
    }
    let inv_t = (1.0 / temperature) as f32;
    match logits.dtype() {
        DType::F32 => run::<f32>(logits, tokens, inv_t, with_entropy),
        DType::BF16 => run::<half::bf16>(logits, tokens, inv_t, with_entropy),
        DType::F16 => run::<half::f16>(logits, tokens, inv_t, with_entropy),
        dt => candle_core::bail!("atomrl-selective-log-softmax: unsupported dtype {dt:?}"),
    }
}

/// The gradient with respect to `logits [R, V]` of the log-prob and entropy columns
/// `grad_res [R, 2]`, in the logits' dtype.
pub(crate) fn backward(
    logits: &Tensor,
    tokens: &Tensor,
    temperature: f64,
    with_entropy: bool,
    grad_res: &Tensor,
) -> Result<Tensor> {
    fn run<T: CudaDType + DeviceRepr>(
        logits: &Tensor,
        tokens: &Tensor,
        inv_t: f32,
        with_entropy: bool,
        g: &Tensor,
    ) -> Result<Tensor> {
        let (r, v) = dims(logits, tokens)?;
        if g.dims() != [r, 2] {
            candle_core::bail!(
                "atomrl-selective-log-softmax: gradient [{r}, 2] expected, got {:?}",
                g.dims()
            );
        }
        let g = g.detach().to_dtype(DType::F32)?;
        with_cuda(logits, |xs, lx| {
            with_cuda(tokens, |ts, lt| {
                with_cuda(&g, |gs, lg| {
                    let dev = xs.device();
                    let (rx, rt, rg) = (
                        range(lx, "logits")?,
                        range(lt, "tokens")?,
                        range(lg, "gradient")?,
                    );
                    let xv = xs.as_cuda_slice::<T>()?.slice(rx.0..rx.1);
                    let tv = ts.as_cuda_slice::<u32>()?.slice(rt.0..rt.1);
                    let gv = gs.as_cuda_slice::<f32>()?.slice(rg.0..rg.1);
                    let f = dev.get_or_load_custom_func(
                        &kernel("bwd", logits.dtype())?,
                        MODULE,
                        atomrl_core::cuda::LOGPROB_PTX,
                    )?;
                    // SAFETY: written in full by the kernel.
                    let dx = unsafe { dev.alloc::<T>(r * v)? };
                    let (vi, we) = (v as i32, i32::from(with_entropy));
                    // Launch: reads R × V logits, R tokens and R × 2 gradients, writes R × V
                    // gradients; argument types as in logprob.cu.
                    atomrl_core::launch_kernel!(
                        f,
                        rows_launch(r, v),
                        &xv,
                        &tv,
                        &gv,
                        &dx,
                        &vi,
                        &inv_t,
                        &we
                    )?;
                    Ok(tensor_from_slice(dx, dev, (r, v)))
                })
            })
        })
    }
    let inv_t = (1.0 / temperature) as f32;
    match logits.dtype() {
        DType::F32 => run::<f32>(logits, tokens, inv_t, with_entropy, grad_res),
        DType::BF16 => run::<half::bf16>(logits, tokens, inv_t, with_entropy, grad_res),
        DType::F16 => run::<half::f16>(logits, tokens, inv_t, with_entropy, grad_res),
        dt => candle_core::bail!("atomrl-selective-log-softmax: unsupported dtype {dt:?}"),
    }
}

/// Whether the kernels agree with the tensor-op form on this process's GPU: checked once, on
/// first use, on a small f32 case (log-probs, entropies and gradients to 1e-4); a kernel that
/// disagrees or is not finite is reported and the tensor-op form is kept, so a bad kernel costs
/// speed, not correctness.
fn verified(like: &Tensor) -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    atomrl_core::device::verified_once(
        &OK,
        "AtomRL's CUDA selective log-softmax",
        "its tensor-op form",
        || self_check(like.device()),
    )
}

/// `None` when the kernels agree with [`crate::fused`]'s tensor-op form, else what differs.
fn self_check(device: &candle_core::Device) -> Result<Option<String>> {
    let (r, v) = (3usize, 1000usize);
    let x: Vec<f32> = (0..r * v)
        .map(|i| ((i * 7919 + 13) % 1013) as f32 / 97.0 - 5.0)
        .collect();
    let logits = Tensor::from_vec(x, (r, v), device)?;
    let tokens = Tensor::new(&[0u32, 517, 999], device)?;
    let g = Tensor::new(&[[1f32, 0.5], [-0.25, 2.0], [0.75, -1.0]], device)?;
    for temperature in [1.0, 0.7] {
        let (lp, ent) = forward(&logits, &tokens, temperature, true)?;
        let (lp0, ent0) = crate::fused::values_tensor_ops(&logits, &tokens, temperature, true)?;
        let dx = backward(&logits, &tokens, temperature, true, &g)?;
        let dx0 = crate::fused::logits_grad_tensor_ops(&logits, &tokens, temperature, true, &g)?;
        let missing = || candle_core::Error::Msg("no entropy".into());
        let (ent, ent0) = (ent.ok_or_else(missing)?, ent0.ok_or_else(missing)?);
        let pairs = [
            ("log-probs", lp, lp0),
            ("entropy", ent, ent0),
            ("gradient", dx, dx0),
        ];
        for (name, a, b) in pairs {
            let d = (a - b)?.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()?;
            if d.is_nan() || d > 1e-4 {
                return Ok(Some(format!("{name} off by {d} at T = {temperature}")));
            }
        }
    }
    Ok(None)
}
