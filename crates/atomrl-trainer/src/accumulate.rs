//! One optimizer update over micro-batches: the shared core of every recipe's step.

use std::ops::Range;

use atomrl_core::shape::scalar_f64;
use atomrl_core::{profile, CandleContext, Result};
use candle_core::backprop::GradStore;
use candle_core::{Tensor, Var};

use crate::optim::{AdamW, Gradients};
use crate::parallel::{dist_error, run_shards, Parallel};
use atomrl_dist::Collective;
use atomrl_model::SharedWeightCasts;
use atomrl_rollout::Experience;

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

/// Settings of [`accumulate_and_step`] (from `atomrl-optim`).
pub use atomrl_optim::StepSettings;

/// Statistics a micro-batch reports besides its loss (the `T` of [`accumulate_and_step`]),
/// sent between data-parallel ranks as a few `f64`s.
pub trait MicroStatistics: Send + Sized {
    /// The statistics as numbers.
    fn to_f64s(&self) -> Vec<f64>;
    /// The statistics back from [`to_f64s`](MicroStatistics::to_f64s).
    fn from_f64s(values: &[f64]) -> Self;
}

impl MicroStatistics for () {
    fn to_f64s(&self) -> Vec<f64> {
        Vec::new()
    }
    fn from_f64s(_: &[f64]) -> Self {}
}

/// The function errors name.
const FUNC: &str = "accumulate_and_step";

/// `agg` dividing by the step's normaliser `n` rather than each micro-batch's own tokens /
/// rows, so that the micro-batch losses add up to the full-batch loss (TRL issue #3021): what
/// every loss accumulated by [`accumulate_and_step`] aggregates with.
pub(crate) fn with_step_normalizer(
    mut agg: atomrl_loss::AggOptions,
    n: &atomrl_rollout::LossNormalizer,
) -> atomrl_loss::AggOptions {
    agg.global_tokens = Some(n.tokens);
    agg.global_seqs = Some(n.rows as f64);
    agg
}

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

/// What a micro-batch reports to every rank: `None` when its inputs were not finite, else
/// its loss and statistics.
type Report<T> = Option<(f64, T)>;

/// Splits `exp` into `accumulation × workers × W` micro-batches (`W` ranks of `comm`, every
/// rank holding the same experience), sums their gradients (`micro_loss(c, mb)` gives
/// micro-batch `c`'s loss, `c` in [`Parallel::micro_batches`]' order, already divided by the
/// step's normaliser, with any statistics `T` the caller wants back; `Ok(None)` means its
/// inputs were not finite), clips the global norm and applies AdamW — unless the loss or the
/// norm is not finite, in which case nothing is updated and the reason is returned. Micro-batches without a scored token are skipped (they add 0);
/// when no micro-batch has one, the optimizer still steps, with a zero gradient
/// ([`zero_gradient_step`]). Worker `w` of rank `r` runs micro-batches
/// `r·workers + w, … + workers × W, …` on its own thread and sums their gradients in that
/// order; the workers' sums are then added in worker order and the ranks' in rank order, so
/// the update does not depend on thread timing, and every rank applies the same update. The
/// loss and the statistics come back in micro-batch order. `casts` (the trained model's
/// [`atomrl_model::CausalLm::share_weight_casts`]) lets the micro-batches share one
/// mixed-precision cast of the weights; it is dropped before the weights change.
///
/// # Errors
/// Tensor failures; a failed collective.
pub fn accumulate_and_step<T: MicroStatistics>(
    params: &[(String, Var)],
    optimizer: &mut AdamW,
    exp: &Experience,
    settings: StepSettings,
    comm: &dyn Collective,
    casts: SharedWeightCasts<'_>,
    micro_loss: impl Fn(usize, &Experience) -> Result<Option<(Tensor, T)>> + Sync,
) -> Result<(StepOutcome, Vec<T>)> {
    let acc = accumulate_gradients(params, exp, settings, comm, micro_loss)?;
    drop(casts);
    clip_and_step(acc, settings.max_grad_norm, &mut [(optimizer, settings.lr)])
}

/// The second half of [`accumulate_and_step`]: clips the global norm of `acc`'s gradients to
/// `max_grad_norm` (one norm over every optimizer's parameters) and steps each optimizer at
/// its own learning rate on its own parameters' gradients — unless the loss or the norm is
/// not finite (nothing is updated and the reason is returned). No micro-batch with a scored
/// token: each optimizer takes a [`zero_gradient_step`].
///
/// # Errors
/// Tensor failures.
pub fn clip_and_step<T>(
    acc: Accumulated<T>,
    max_grad_norm: f64,
    optimizers: &mut [(&mut AdamW, f64)],
) -> Result<(StepOutcome, Vec<T>)> {
    let Accumulated {
        grads,
        mut outcome,
        extras,
    } = acc;
    if outcome.skipped.is_some() {
        return Ok((outcome, extras));
    }
    // The clipping factor goes to the optimizers, which scale each gradient as they read it:
    // the bits of clipping first, without a pass of its own over every gradient.
    let (norm, clip) = grads.clip_factor(max_grad_norm)?;
    outcome.grad_norm = norm;
    if !outcome.loss.is_finite() || !outcome.grad_norm.is_finite() {
        outcome.skipped = Some(format!(
            "non-finite loss ({}) or gradient norm ({})",
            outcome.loss, outcome.grad_norm
        ));
        return Ok((outcome, extras));
    }
    for (optimizer, lr) in optimizers.iter_mut() {
        if extras.is_empty() {
            zero_gradient_step(optimizer, *lr)?;
        } else {
            optimizer.step_scaled(&|name| grads.get(name), *lr, clip)?;
        }
    }
    Ok((outcome, extras))
}

/// The summed gradients of an experience's micro-batches ([`accumulate_gradients`]).
pub struct Accumulated<T> {
    /// The gradient sums of every micro-batch, worker and rank (the same on every rank).
    pub grads: Gradients,
    /// The summed loss; `skipped` when a micro-batch's inputs were not finite (then `grads`
    /// is incomplete and must not be used). `grad_norm` is left 0.
    pub outcome: StepOutcome,
    /// The micro-batches' statistics, in micro-batch order (empty: no micro-batch had a
    /// scored token).
    pub extras: Vec<T>,
}

/// The first half of [`accumulate_and_step`]: the gradients of `micro_loss` summed over the
/// micro-batches of every worker and rank, in the same fixed order, without clipping or an
/// optimizer step (TRPO's policy gradient and Fisher-vector products).
///
/// # Errors
/// Tensor failures; a failed collective.
pub fn accumulate_gradients<T: MicroStatistics>(
    params: &[(String, Var)],
    exp: &Experience,
    settings: StepSettings,
    comm: &dyn Collective,
    micro_loss: impl Fn(usize, &Experience) -> Result<Option<(Tensor, T)>> + Sync,
) -> Result<Accumulated<T>> {
    let par = Parallel {
        workers: settings.workers,
        comm,
    };
    let (workers, shards) = (settings.workers.max(1), par.shards());
    let first = workers * comm.rank();
    let chunks = update_chunks(par, exp, settings.accumulation);
    let per_worker = run_shards(FUNC, workers, |w| {
        let mut grads = Gradients::new();
        let mut reports = Vec::new();
        for c in (first + w..chunks.len()).step_by(shards) {
            match micro_backward(exp, &chunks[c], |mb| micro_loss(c, mb))? {
                Micro::Empty => {}
                Micro::NonFinite => {
                    reports.push((c, None));
                    break;
                }
                Micro::Done { store, loss, extra } => {
                    grads.accumulate(&store, params)?;
                    reports.push((c, Some((loss, extra))));
                }
            }
        }
        Ok((grads, reports))
    })?;
    let mut grads = Gradients::new();
    let mut reports = Vec::new();
    for (g, r) in per_worker {
        grads.add(g)?;
        reports.extend(r);
    }
    let mut outcome = StepOutcome::default();
    let mut extras = Vec::new();
    for (_, report) in exchange_reports(comm, reports)? {
        let Some((loss, extra)) = report else {
            outcome.skipped = Some("non-finite log-probs".into());
            return Ok(Accumulated {
                grads,
                outcome,
                extras,
            });
        };
        outcome.loss += loss;
        extras.push(extra);
    }
    if !extras.is_empty() {
        grads.all_reduce_sum(params, comm)?;
    }
    Ok(Accumulated {
        grads,
        outcome,
        extras,
    })
}

/// The row ranges of the update's micro-batches: the shard rule's, in whole pairs for a
/// preference experience (a pair's two rows meet in one loss term).
fn update_chunks(par: Parallel<'_>, exp: &Experience, accumulation: usize) -> Vec<Range<usize>> {
    let unit = if exp.pairs.is_some() { 2 } else { 1 };
    par.micro_batches(exp.num_rows() / unit, accumulation)
        .into_iter()
        .map(|r| r.start * unit..r.end * unit)
        .collect()
}

/// Every rank's micro-batch reports, in micro-batch order (one all-gather of a few numbers
/// per micro-batch; none for a single process).
fn exchange_reports<T: MicroStatistics>(
    comm: &dyn Collective,
    mut local: Vec<(usize, Report<T>)>,
) -> Result<Vec<(usize, Report<T>)>> {
    if comm.world_size() > 1 {
        let mut flat = Vec::new();
        for (c, report) in &local {
            let values = report
                .as_ref()
                .map(|(loss, extra)| [vec![*loss], extra.to_f64s()].concat());
            flat.push(*c as f64);
            flat.push(values.as_ref().map_or(-1.0, |v| v.len() as f64));
            flat.extend(values.into_iter().flatten());
        }
        let gathered = comm
            .all_gather_f64(&flat)
            .map_err(|e| dist_error(FUNC, e))?;
        local = gathered.iter().flat_map(|v| decode_reports(v)).collect();
    }
    local.sort_by_key(|(c, _)| *c);
    Ok(local)
}

/// The reports [`exchange_reports`] encoded: `chunk, n, values[n]` each (`n = -1`: not
/// finite).
fn decode_reports<T: MicroStatistics>(mut v: &[f64]) -> Vec<(usize, Report<T>)> {
    let mut out = Vec::new();
    while let [c, n, rest @ ..] = v {
        let n = if *n < 0.0 { None } else { Some(*n as usize) };
        let len = n.unwrap_or(0).min(rest.len());
        let report = n.map(|_| match &rest[..len] {
            [loss, extra @ ..] => (*loss, T::from_f64s(extra)),
            [] => (f64::NAN, T::from_f64s(&[])),
        });
        out.push((*c as usize, report));
        v = &rest[len..];
    }
    out
}

/// The loss and backward pass of the micro-batch of `exp`'s rows `range` (see
/// [`accumulate_and_step`] for `micro_loss`).
fn micro_backward<T>(
    exp: &Experience,
    range: &Range<usize>,
    micro_loss: impl Fn(&Experience) -> Result<Option<(Tensor, T)>>,
) -> Result<Micro<T>> {
    let mb = exp.rows(range.start, range.len())?;
    if mb.loss_tokens(FUNC)? == 0.0 {
        return Ok(Micro::Empty);
    }
    let forward = profile::phase("train.forward", mb.input_ids.device());
    let Some((loss, extra)) = micro_loss(&mb)? else {
        return Ok(Micro::NonFinite);
    };
    drop(forward);
    let store = {
        let _p = profile::phase("train.backward", loss.device());
        loss.backward().ctx(FUNC)?
    };
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
