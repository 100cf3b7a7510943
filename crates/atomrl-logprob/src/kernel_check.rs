//! The selective log-softmax and the fused LM head alone on a device, for `xtask
//! device-check`: the same inputs through AtomRL's CUDA kernels or the tensor-op forms, with
//! the log-probs, the entropies and the gradients, so that a device can be compared with the
//! CPU and with the tensor-op form on the same device.

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

/// Runs the fused LM head and log-softmax (`atomrl_logprob`'s chunked head) of hidden states
/// `[10, 48]` through a head weight `[1000, 48]` (fixed values in `dtype` on `device`), 4 rows a
/// chunk (3 chunks) at temperature 0.8 with entropies, with AtomRL's CUDA kernels when `fused`
/// (the selective log-softmax, and the weight gradient summed over the chunks in place by
/// cuBLAS with `β = 1`), else the tensor-op forms. Twice: keeping each chunk's logits for the
/// backward, and recomputing them there. The gradients are those of `Σ lp · r₁ + Σ H · r₂`.
///
/// # Errors
/// A tensor failure on the device.
///
/// ```
/// use atomrl_logprob::kernel_check::lm_head;
/// use candle_core::{DType, Device};
/// let out = lm_head(&Device::Cpu, DType::F32, true)?;
/// assert_eq!(out.len(), 8);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn lm_head(device: &Device, dtype: DType, fused: bool) -> Result<KernelOutputs> {
    let (rows, hidden, vocab) = (10usize, 48usize, 1000usize);
    let grid = |n: usize, modulus: usize, scale: f32| -> Result<Var> {
        let x: Vec<f32> = (0..n)
            .map(|i| ((i * 7919 + 13) % modulus) as f32 / scale - 0.5)
            .collect();
        Var::from_tensor(
            &Tensor::from_vec(x, n, &Device::Cpu)?
                .to_dtype(dtype)?
                .to_device(device)?,
        )
    };
    let h = grid(rows * hidden, 257, 256.0)?;
    let w = grid(vocab * hidden, 509, 254.0)?;
    let (h, w) = (
        Var::from_tensor(&h.reshape((rows, hidden))?)?,
        Var::from_tensor(&w.reshape((vocab, hidden))?)?,
    );
    let tokens: Vec<u32> = (0..rows as u32)
        .map(|r| (r * 397 + 5) % vocab as u32)
        .collect();
    let tokens = Tensor::new(tokens, device)?;
    let r1: Vec<f32> = (0..rows).map(|r| 1.0 - 0.3 * r as f32).collect();
    let r2: Vec<f32> = (0..rows).map(|r| 0.5 + 0.1 * r as f32).collect();
    let (r1, r2) = (Tensor::new(r1, device)?, Tensor::new(r2, device)?);
    atomrl_core::device::set_cuda_fused_kernels(Some(fused));
    let out = head_outputs(&h, &w, &tokens, &r1, &r2);
    atomrl_core::device::set_cuda_fused_kernels(None);
    out
}

/// The outputs of [`lm_head`]: its four values with the logits kept, then recomputed.
fn head_outputs(
    h: &Var,
    w: &Var,
    tokens: &Tensor,
    r1: &Tensor,
    r2: &Tensor,
) -> Result<KernelOutputs> {
    let mut out = Vec::new();
    for (keep, name) in [(crate::fused::KEEP_CHUNKS, "kept"), (0, "recomputed")] {
        let head = crate::fused::Head {
            tokens,
            chunk_rows: 4,
            temperature: 0.8,
            with_entropy: true,
        };
        let (lp, ent) = head.log_softmax(h, w, keep)?;
        let ent = ent.ok_or_else(|| candle_core::Error::Msg("no entropy".into()))?;
        let objective = ((&lp * r1)?.sum_all()? + (&ent * r2)?.sum_all()?)?;
        let grads = objective.backward()?;
        let grad = |v: &Var| {
            grads
                .get(v.as_tensor())
                .cloned()
                .ok_or_else(|| candle_core::Error::Msg("the head's inputs got no gradient".into()))
        };
        out.extend([
            (format!("log-probs, {name} logits"), lp),
            (format!("entropy, {name} logits"), ent),
            (format!("d/hidden, {name} logits"), grad(h)?),
            (format!("d/weight, {name} logits"), grad(w)?),
        ]);
    }
    Ok(out)
}
