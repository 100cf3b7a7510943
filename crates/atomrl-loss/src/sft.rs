//! Supervised fine-tuning loss: token cross-entropy on completion tokens only.

use atomrl_core::shape::{expect_dims, expect_float, expect_rank, flat_f64, unravel};
use atomrl_core::{CandleContext, Error, Result};
use candle_core::{DType, Tensor, D};

use crate::check::{check_finite_where_valid, check_mask};

const FUNC: &str = "compute_sft_loss";

/// PyTorch's `ignore_index`: labels equal to it are not scored.
pub const IGNORE_INDEX: i64 = -100;

/// Output of [`compute_sft_loss`] and [`compute_sft_loss_from_logits`].
#[derive(Debug, Clone)]
pub struct SftLossOutput {
    /// `Σ ℓ·m / normaliser` (scalar, differentiable).
    pub loss: Tensor,
    /// `ℓ = −log p(label)` per token, 0 where masked, `[N, T]`.
    pub per_token_loss: Tensor,
    /// Number of scored tokens in this batch.
    pub num_tokens: usize,
}

/// Mean negative log-likelihood of the label tokens: `loss = Σ −logp·m / Σ m`.
///
/// With gradient accumulation, pass `global_tokens` (the scored tokens of all micro-batches)
/// so that the micro-batch losses add up to the full-batch loss.
///
/// # Shapes
/// - `log_probs`: `[N, T]`, log-probabilities of each label token (e.g. from
///   `get_action_log_probs`).
/// - `mask`: `[N, T]`, 1 on completion tokens (prompt and padding tokens are 0).
/// - returns `loss` (scalar) and `per_token_loss [N, T]`.
///
/// # Errors
/// Mismatched shapes, a mask that is not 0/1 or has no 1, a non-finite log-prob on a scored
/// token, `global_tokens ≤ 0`.
///
/// ```
/// use atomrl_loss::compute_sft_loss;
/// use candle_core::{Device, Tensor};
/// let lp = Tensor::new(&[[-1f32, -2.0, -9.0], [-3.0, -4.0, -5.0]], &Device::Cpu)?;
/// let mask = Tensor::new(&[[1f32, 1.0, 0.0], [0.0, 1.0, 1.0]], &Device::Cpu)?;
/// let out = compute_sft_loss(&lp, &mask, None)?;
/// assert_eq!(out.loss.to_scalar::<f32>()?, (1.0 + 2.0 + 4.0 + 5.0) / 4.0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn compute_sft_loss(
    log_probs: &Tensor,
    mask: &Tensor,
    global_tokens: Option<f64>,
) -> Result<SftLossOutput> {
    let m = check_mask(FUNC, "log_probs", log_probs, mask)?;
    check_finite_where_valid(FUNC, "log_probs", log_probs, &m)?;
    let denominator = match global_tokens {
        Some(g) if g.is_finite() && g > 0.0 => g,
        Some(g) => {
            return Err(Error::value(
                FUNC,
                "global_tokens",
                "a finite number > 0",
                g,
            ))
        }
        None => m.valid as f64,
    };
    let per_token = m.select(FUNC, &log_probs.neg().ctx(FUNC)?)?;
    let loss = (per_token.sum_all().ctx(FUNC)? / denominator).ctx(FUNC)?;
    Ok(SftLossOutput {
        loss,
        per_token_loss: per_token,
        num_tokens: m.valid,
    })
}

/// Token cross-entropy from logits, as `torch.nn.functional.cross_entropy(logits.view(-1, V),
/// labels.view(-1), ignore_index=-100)`: labels of −100 (and, when given, positions where
/// `mask` is 0) are not scored.
///
/// # Shapes
/// - `logits`: `[N, T, V]`, float; position `t` predicts `labels[:, t]` (already shifted).
/// - `labels`: `[N, T]`, integer token ids in `[0, V)` or −100.
/// - `mask`: optional `[N, T]` 0/1.
/// - returns `loss` (scalar, mean over scored tokens) and `per_token_loss [N, T]`.
///
/// # Errors
/// Mismatched shapes, a label outside `[0, V)` that is not −100, no scored token.
///
/// ```
/// use atomrl_loss::compute_sft_loss_from_logits;
/// use candle_core::{Device, Tensor};
/// let logits = Tensor::new(&[[[0f32, 0.0], [5.0, 5.0]]], &Device::Cpu)?;
/// let labels = Tensor::new(&[[1i64, -100]], &Device::Cpu)?;
/// let out = compute_sft_loss_from_logits(&logits, &labels, None)?;
/// assert!((out.loss.to_scalar::<f32>()? - 2f32.ln()).abs() < 1e-6);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn compute_sft_loss_from_logits(
    logits: &Tensor,
    labels: &Tensor,
    mask: Option<&Tensor>,
) -> Result<SftLossOutput> {
    let dims = expect_rank(FUNC, "logits", logits, 3, "[N, T, V]")?;
    let (n, t, v) = (dims[0], dims[1], dims[2]);
    expect_float(FUNC, "logits", logits)?;
    expect_dims(
        FUNC,
        "labels",
        labels,
        &[n, t],
        "[N, T] (same N, T as logits)",
    )?;
    let label_values = flat_f64(FUNC, labels)?;
    let mut keep = vec![1f32; n * t];
    if let Some(mask) = mask {
        expect_dims(FUNC, "mask", mask, &[n, t], "[N, T] (same N, T as logits)")?;
        for (k, &mv) in keep.iter_mut().zip(&flat_f64(FUNC, mask)?) {
            if mv != 0.0 && mv != 1.0 {
                return Err(Error::value(FUNC, "mask", "0 or 1", mv));
            }
            *k = mv as f32;
        }
    }
    let mut index = Vec::with_capacity(n * t);
    for (i, &l) in label_values.iter().enumerate() {
        if l == IGNORE_INDEX as f64 {
            keep[i] = 0.0;
            index.push(0u32);
        } else if l.fract() == 0.0 && l >= 0.0 && l < v as f64 {
            index.push(l as u32);
        } else {
            return Err(Error::value(
                FUNC,
                format!("labels[{}]", unravel(i, &[n, t])),
                format!("a token id in [0, {v}) or -100"),
                l,
            ));
        }
    }
    let device = logits.device();
    let index = Tensor::from_vec(index, (n, t, 1), device).ctx(FUNC)?;
    let keep = Tensor::from_vec(keep, (n, t), device)
        .and_then(|k| k.to_dtype(logits.dtype()))
        .ctx(FUNC)?;
    // log p = x_label − logsumexp(x), with the max subtracted for stability.
    let max = logits.max_keepdim(D::Minus1).ctx(FUNC)?.detach();
    let shifted = logits.broadcast_sub(&max).ctx(FUNC)?;
    let lse = shifted
        .exp()
        .and_then(|e| e.sum_keepdim(D::Minus1))
        .and_then(|s| s.log())
        .ctx(FUNC)?;
    let picked = shifted.gather(&index, D::Minus1).ctx(FUNC)?;
    let log_probs = (picked - lse)
        .and_then(|x| x.squeeze(D::Minus1))
        .ctx(FUNC)?;
    let log_probs = if log_probs.dtype() == DType::F64 {
        log_probs
    } else {
        log_probs.to_dtype(DType::F32).ctx(FUNC)?
    };
    let keep = keep.to_dtype(log_probs.dtype()).ctx(FUNC)?;
    compute_sft_loss(&log_probs, &keep, None)
}
