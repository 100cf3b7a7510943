//! One optimizer update over micro-batches: the shared core of every recipe's step.

use std::ops::Range;

use atomrl_core::shape::scalar_f64;
use atomrl_core::{CandleContext, Result};
use candle_core::backprop::GradStore;
use candle_core::{Tensor, Var};

use crate::optim::{AdamW, Gradients};
use crate::parallel::{run_shards, split_even};
use atomrl_logprob::TrainingBatch;

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
    /// Micro-batches per update (per worker).
    pub accumulation: usize,
    /// Data-parallel workers: each wave of `workers` micro-batches runs at once on its own
    /// threads (see [`crate::parallel`]).
    pub workers: usize,
    /// Gradient-norm clipping threshold (0 = off).
    pub max_grad_norm: f64,
    /// Learning rate of this update.
    pub lr: f64,
}

/// The function errors name.
const FUNC: &str = "accumulate_and_step";

/// What one micro-batch gave.
enum Micro<T> {
    /// No scored token: it adds nothing.
    Empty,
    /// Its inputs were not finite: the whole update is skipped.
    NonFinite,
    /// Its gradients, its loss and the caller's statistics.
    Done {
        store: GradStore,
        loss: f64,
        extra: T,
    },
}

/// Splits `batch` into `accumulation × workers` micro-batches, sums their gradients
/// (`micro_loss(mb, first_row)` gives each micro-batch's loss, already divided by the global
/// normaliser, with any statistics `T` the caller wants back; `Ok(None)` means its inputs
/// were not finite), clips the global norm and applies AdamW — unless the loss or the norm is
/// not finite, in which case nothing is updated and the reason is returned. Micro-batches
/// without a scored token are skipped (they add 0); when no micro-batch has one, the
/// optimizer still steps, with a zero gradient ([`zero_gradient_step`]). The micro-batches of one wave run on
/// `workers` threads; gradients are summed in micro-batch order, so the update does not
/// depend on thread timing.
///
/// # Errors
/// Tensor failures.
pub fn accumulate_and_step<T: Send>(
    params: &[(String, Var)],
    optimizer: &mut AdamW,
    batch: &TrainingBatch,
    settings: StepSettings,
    micro_loss: impl Fn(&TrainingBatch, usize) -> Result<Option<(Tensor, T)>> + Sync,
) -> Result<(StepOutcome, Vec<T>)> {
    accumulate_and_step_hooked(params, optimizer, batch, settings, false, micro_loss)
}

/// [`accumulate_and_step`], with the loss made NaN when `inject_nan` (the trainer's test hook
/// for the guard, feature `test-hooks`).
pub(crate) fn accumulate_and_step_hooked<T: Send>(
    params: &[(String, Var)],
    optimizer: &mut AdamW,
    batch: &TrainingBatch,
    settings: StepSettings,
    inject_nan: bool,
    micro_loss: impl Fn(&TrainingBatch, usize) -> Result<Option<(Tensor, T)>> + Sync,
) -> Result<(StepOutcome, Vec<T>)> {
    let workers = settings.workers.max(1);
    let chunks = split_even(batch.num_rows(), settings.accumulation.max(1) * workers);
    let mut grads = Gradients::new();
    let mut outcome = StepOutcome::default();
    let mut extras = Vec::new();
    for wave in chunks.chunks(workers) {
        let results = run_shards(FUNC, wave.len(), |i| {
            micro_backward(batch, &wave[i], inject_nan, &micro_loss)
        })?;
        for result in results {
            match result {
                Micro::Empty => {}
                Micro::NonFinite => {
                    outcome.skipped = Some("non-finite log-probs".into());
                    return Ok((outcome, extras));
                }
                Micro::Done { store, loss, extra } => {
                    grads.accumulate(&store, params)?;
                    outcome.loss += loss;
                    extras.push(extra);
                }
            }
        }
    }
    outcome.grad_norm = grads.clip_global_norm(settings.max_grad_norm)?;
    if !outcome.loss.is_finite() || !outcome.grad_norm.is_finite() {
        outcome.skipped = Some(format!(
            "non-finite loss ({}) or gradient norm ({})",
            outcome.loss, outcome.grad_norm
        ));
        return Ok((outcome, extras));
    }
    if extras.is_empty() {
        zero_gradient_step(optimizer, settings.lr)?;
    } else {
        optimizer.step(&|name| grads.get(name), settings.lr)?;
    }
    Ok((outcome, extras))
}

/// The loss and backward pass of the micro-batch of `batch`'s rows `range` (see
/// [`accumulate_and_step`] for `micro_loss`).
fn micro_backward<T>(
    batch: &TrainingBatch,
    range: &Range<usize>,
    inject_nan: bool,
    micro_loss: &impl Fn(&TrainingBatch, usize) -> Result<Option<(Tensor, T)>>,
) -> Result<Micro<T>> {
    let mb = batch.rows(range.start, range.len())?;
    if mb.completion_tokens(FUNC)? == 0.0 {
        return Ok(Micro::Empty);
    }
    let Some((mut loss, extra)) = micro_loss(&mb, range.start)? else {
        return Ok(Micro::NonFinite);
    };
    if inject_nan {
        loss = (loss * f64::NAN).ctx(FUNC)?;
    }
    let store = loss.backward().ctx(FUNC)?;
    let loss = scalar_f64(FUNC, &loss)?;
    Ok(Micro::Done { store, loss, extra })
}

/// One optimizer update with a zero gradient for every parameter, as TRL and verl take on a
/// step with nothing to learn (every group flat): no forward or backward, but the weights
/// still move through the Adam moments and the weight decay, and the step count advances.
///
/// # Errors
/// Tensor allocation failures.
pub fn zero_gradient_step(optimizer: &mut AdamW, lr: f64) -> Result<()> {
    let zeros = optimizer
        .params()
        .iter()
        .map(|(name, var)| {
            var.as_tensor()
                .zeros_like()
                .and_then(|t| t.to_dtype(candle_core::DType::F32))
                .map(|t| (name.clone(), t))
                .ctx("zero_gradient_step")
        })
        .collect::<Result<std::collections::HashMap<_, _>>>()?;
    optimizer.step(&|name| zeros.get(name).cloned(), lr)
}
