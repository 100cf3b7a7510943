//! The device draw alone on a device, for `xtask device-check`: the same logits and noise
//! through AtomRL's CUDA kernel (`atomrl_pick_*`) or the tensor-op form, so that a device can
//! be compared with the CPU and with the tensor-op form on the same device.

use candle_core::{DType, Device, Result, Tensor};

use crate::philox::StepNoise;

/// Outputs by name: `tokens`, `log-probs` (temperature 0.7), `greedy tokens`,
/// `greedy log-probs`; tokens one-hot (f32 `[B, V]`: a different token is a difference of
/// norm √2 in its row, however close the ids).
pub type KernelOutputs = Vec<(String, Tensor)>;

/// Draws the next token of 6 rows of 40,003 fixed logits in `dtype` on `device` (values on a
/// grid of 1/8 in [−4, 4.5], exact in bf16, one largest per row, so every dtype draws from the same distribution),
/// with the Philox noise of seed 5, step 3 for rows 0, 3, 5, 6, 10 and 11 of a call (made
/// inside the kernel, or on the host for the tensor-op form: the same numbers), at temperature
/// 0.7 and greedily, through the CUDA kernel when `fused` (and the device and dtype have it),
/// else through the tensor-op form. The width is not a multiple of 4 and spans ~39 of the
/// kernel's blocks a row, so the last Philox group and the merge of a row's blocks are checked.
///
/// # Errors
/// A tensor failure on the device.
///
/// ```
/// use atomrl_sample::kernel_check::device_pick;
/// use candle_core::{DType, Device};
/// let out = device_pick(&Device::Cpu, DType::F32, true)?;
/// assert_eq!(out.len(), 4);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn device_pick(device: &Device, dtype: DType, fused: bool) -> Result<KernelOutputs> {
    let (rows, vocab) = (6usize, 40_003usize);
    let x = grid_logits(rows, vocab);
    let logits = Tensor::from_vec(x, (rows, vocab), &Device::Cpu)?
        .to_dtype(dtype)?
        .to_device(device)?;
    let noise = StepNoise { seed: 5, step: 3 };
    let row_ids = [0u32, 3, 5, 6, 10, 11];
    let (t, lp) = crate::device_pick::draw(&logits, 0.7, Some((&noise, &row_ids)), fused)?;
    let (gt, glp) = crate::device_pick::draw(&logits, 0.0, None, fused)?;
    let on_device = |tokens: Vec<u32>, log_probs: Vec<f32>| -> Result<(Tensor, Tensor)> {
        Ok((
            Tensor::new(tokens, device)?,
            Tensor::new(log_probs, device)?,
        ))
    };
    let (t, lp) = on_device(t, lp)?;
    let (gt, glp) = on_device(gt, glp)?;
    let ids = Tensor::arange(0u32, vocab as u32, device)?.unsqueeze(0)?;
    let one_hot =
        |t: &Tensor| -> Result<Tensor> { ids.broadcast_eq(&t.unsqueeze(1)?)?.to_dtype(DType::F32) };
    Ok(vec![
        ("tokens".into(), one_hot(&t)?),
        ("log-probs".into(), lp),
        ("greedy tokens".into(), one_hot(&gt)?),
        ("greedy log-probs".into(), glp),
    ])
}

/// `rows × vocab` logits on a grid of 1/8 in [−4, 4] (exact in bf16) with one 4.5 per row, so
/// that the greedy token does not depend on how an argmax breaks ties.
pub(crate) fn grid_logits(rows: usize, vocab: usize) -> Vec<f32> {
    let mut x: Vec<f32> = (0..rows * vocab)
        .map(|i| ((i * 7919 + 13) % 65) as f32 / 8.0 - 4.0)
        .collect();
    for r in 0..rows {
        x[r * vocab + (r * 977 + 11) % vocab] = 4.5;
    }
    x
}
