//! The selective log-softmax alone on a device, for `xtask device-check`: the same logits
//! through AtomRL's CUDA kernel or the tensor-op form, with the log-probs, the entropies and
//! the gradient with respect to the logits, so that a device can be compared with the CPU and
//! with the tensor-op form on the same device.

use candle_core::{DType, Device, Result, Tensor, Var};

/// Outputs by name: `log-probs`, `entropy`, `d/logits`.
pub type KernelOutputs = Vec<(String, Tensor)>;

/// Runs the selective log-softmax of `[4, 3000]` fixed logits in `dtype` on `device` at
/// temperature 0.8, with entropies, through the CUDA kernel when `fused` (and the device and
/// dtype have it), else through the tensor-op form; the gradient is that of
/// `Σ lp · r₁ + Σ H · r₂` for fixed `r₁`, `r₂`.
///
/// # Errors
/// A tensor failure on the device.
///
/// ```
/// use atomrl_logprob::kernel_check::selective_log_softmax;
/// use candle_core::{DType, Device};
/// let out = selective_log_softmax(&Device::Cpu, DType::F32, true)?;
/// let names: Vec<&str> = out.iter().map(|(n, _)| n.as_str()).collect();
/// assert_eq!(names, ["log-probs", "entropy", "d/logits"]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn selective_log_softmax(device: &Device, dtype: DType, fused: bool) -> Result<KernelOutputs> {
    let (rows, vocab) = (4usize, 3000usize);
    let x: Vec<f32> = (0..rows * vocab)
        .map(|i| ((i * 7919 + 13) % 4001) as f32 / 400.0 - 5.0)
        .collect();
    let logits = Var::from_tensor(
        &Tensor::from_vec(x, (rows, vocab), &Device::Cpu)?
            .to_dtype(dtype)?
            .to_device(device)?,
    )?;
    let tokens = Tensor::new(&[0u32, 1234, 2999, 77], device)?;
    atomrl_core::device::set_cuda_fused_kernels(Some(fused));
    let out = outputs(&logits, &tokens);
    atomrl_core::device::set_cuda_fused_kernels(None);
    let (lp, ent, d) = out?;
    Ok(vec![
        ("log-probs".into(), lp),
        ("entropy".into(), ent),
        ("d/logits".into(), d),
    ])
}

/// Log-probs, entropies and the logits' gradient (see [`selective_log_softmax`]).
fn outputs(logits: &Var, tokens: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
    let device = logits.device();
    let (lp, ent) = crate::fused::chunk_log_softmax(logits.as_tensor(), tokens, 0.8, true)?;
    let ent = ent.ok_or_else(|| candle_core::Error::Msg("no entropy".into()))?;
    let r1 = Tensor::new(&[1f32, -0.5, 0.25, 2.0], device)?;
    let r2 = Tensor::new(&[0.5f32, 1.0, -1.5, 0.75], device)?;
    let objective = ((&lp * &r1)?.sum_all()? + (&ent * &r2)?.sum_all()?)?;
    let grads = objective.backward()?;
    let d = grads
        .get(logits.as_tensor())
        .cloned()
        .ok_or_else(|| candle_core::Error::Msg("the logits got no gradient".into()))?;
    Ok((lp, ent, d))
}
