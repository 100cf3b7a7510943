//! One optimizer update over micro-batches: the shared core of every recipe's step.

use atomrl_core::{CandleContext, Result};
use candle_core::{Tensor, Var};

use super::batch::TrainingBatch;
use crate::optim::{AdamW, Gradients};

/// How an update went.
#[derive(Debug, Clone, Default)]
pub struct StepOutcome {
    /// Sum of the micro-batch losses (= the full-batch loss under a global normaliser).
    pub loss: f64,
    /// Gradient norm before clipping.
    pub grad_norm: f64,
    /// Why the optimizer step was skipped, if it was.
    pub skipped: Option<String>,
}

/// Settings of [`accumulate_and_step`].
#[derive(Debug, Clone, Copy)]
pub struct StepSettings {
    /// Micro-batches per update.
    pub accumulation: usize,
    /// Gradient-norm clipping threshold (0 = off).
    pub max_grad_norm: f64,
    /// Learning rate of this update.
    pub lr: f64,
    /// Make the loss NaN (test hook for the guard).
    pub inject_nan: bool,
}

/// Splits `batch` into `accumulation` micro-batches, sums their gradients
/// (`micro_loss(mb, first_row)` gives each micro-batch's loss, already divided by the global
/// normaliser; `Ok(None)` means its inputs were not finite), clips the global norm and applies
/// AdamW — unless the loss or the norm is not finite, in which case nothing is updated and the
/// reason is returned. Micro-batches without a scored token are skipped (they add 0).
///
/// # Errors
/// Tensor failures.
pub fn accumulate_and_step(
    params: &[(String, Var)],
    optimizer: &mut AdamW,
    batch: &TrainingBatch,
    settings: StepSettings,
    mut micro_loss: impl FnMut(&TrainingBatch, usize) -> Result<Option<Tensor>>,
) -> Result<StepOutcome> {
    let func = "accumulate_and_step";
    let rows = batch.num_rows();
    let micro = rows.div_ceil(settings.accumulation.max(1)).max(1);
    let mut grads = Gradients::new();
    let mut outcome = StepOutcome::default();
    let mut start = 0;
    while start < rows {
        let len = micro.min(rows - start);
        let mb = batch.rows(start, len)?;
        let first = start;
        start += len;
        let tokens: f32 = mb
            .completion_mask
            .sum_all()
            .and_then(|t| t.to_scalar())
            .ctx(func)?;
        if tokens == 0.0 {
            continue;
        }
        let Some(mut loss) = micro_loss(&mb, first)? else {
            outcome.skipped = Some("non-finite log-probs".into());
            return Ok(outcome);
        };
        if settings.inject_nan {
            loss = (loss * f64::NAN).ctx(func)?;
        }
        let store = loss.backward().ctx(func)?;
        grads.accumulate(&store, params)?;
        outcome.loss += loss
            .to_dtype(candle_core::DType::F64)
            .and_then(|l| l.to_scalar::<f64>())
            .ctx(func)?;
    }
    outcome.grad_norm = grads.clip_global_norm(settings.max_grad_norm)?;
    if !outcome.loss.is_finite() || !outcome.grad_norm.is_finite() {
        outcome.skipped = Some(format!(
            "non-finite loss ({}) or gradient norm ({})",
            outcome.loss, outcome.grad_norm
        ));
        return Ok(outcome);
    }
    optimizer.step(&|name| grads.get(name), settings.lr)?;
    Ok(outcome)
}
