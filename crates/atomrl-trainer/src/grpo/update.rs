//! The policy update of one step: log-probs, loss (+ β·KL − entropy bonus), gradient
//! accumulation with the global normaliser, clipping, the NaN/Inf guard, AdamW.

use atomrl_core::shape::masked_sum;
use atomrl_core::{CandleContext, Result};
use atomrl_logprob::{get_action_log_probs, get_shared_prompt_log_probs, TokenLogProbs};
use atomrl_loss::{
    aggregate_loss, compute_kl_penalty, compute_policy_loss, AggOptions, PolicyLossOptions,
};
use atomrl_model::CausalLm;
use candle_core::{Tensor, Var};

use super::accumulate::{
    accumulate_and_step_hooked, zero_gradient_step, MicroStatistics, StepSettings,
};
use crate::config::GRPOArgs;
use crate::optim::AdamW;
use crate::parallel::{sharded_chunks, split_even};
use atomrl_dist::Collective;
use atomrl_logprob::TrainingBatch;

/// What an update measured.
#[derive(Debug, Clone, Default)]
pub struct UpdateStats {
    /// The loss (sum over micro-batches = the full-batch loss), last iteration.
    pub loss: f64,
    /// Gradient norm before clipping, last iteration.
    pub grad_norm: f64,
    /// Token-weighted clip fractions and approximate KL to the old policy.
    pub clip_frac: f64,
    /// Share of tokens clipped at `1 − ε_low`.
    pub clip_frac_low: f64,
    /// Share of tokens clipped at `1 + ε_high`.
    pub clip_frac_high: f64,
    /// Masked mean of `old − new` log-probs.
    pub ppo_kl: f64,
    /// Masked mean KL to the reference (NaN when β = 0: no reference is held).
    pub kl: f64,
    /// Masked mean entropy of the policy on the completions.
    pub entropy: f64,
    /// Optimizer updates skipped because the loss or gradient norm was not finite.
    pub skipped: usize,
    /// Why the last skip happened.
    pub skip_reason: Option<String>,
}

/// Token-weighted sums of one micro-batch's statistics (each metric times its scored tokens).
#[derive(Debug, Clone, Copy, Default)]
struct MicroStats {
    clip: f64,
    low: f64,
    high: f64,
    ppo_kl: f64,
    kl: f64,
    entropy: f64,
    weight: f64,
}

impl MicroStats {
    /// Writes the token-weighted means into `stats` (the KL only when a reference was used).
    fn write_means(self, stats: &mut UpdateStats, with_kl: bool) {
        if self.weight > 0.0 {
            stats.clip_frac = self.clip / self.weight;
            stats.clip_frac_low = self.low / self.weight;
            stats.clip_frac_high = self.high / self.weight;
            stats.ppo_kl = self.ppo_kl / self.weight;
            stats.entropy = self.entropy / self.weight;
            if with_kl {
                stats.kl = self.kl / self.weight;
            }
        }
    }

    fn add(self, o: Self) -> Self {
        Self {
            clip: self.clip + o.clip,
            low: self.low + o.low,
            high: self.high + o.high,
            ppo_kl: self.ppo_kl + o.ppo_kl,
            kl: self.kl + o.kl,
            entropy: self.entropy + o.entropy,
            weight: self.weight + o.weight,
        }
    }
}

impl MicroStatistics for MicroStats {
    fn to_f64s(&self) -> Vec<f64> {
        let s = self;
        vec![s.clip, s.low, s.high, s.ppo_kl, s.kl, s.entropy, s.weight]
    }

    fn from_f64s(v: &[f64]) -> Self {
        let at = |i: usize| v.get(i).copied().unwrap_or(0.0);
        Self {
            clip: at(0),
            low: at(1),
            high: at(2),
            ppo_kl: at(3),
            kl: at(4),
            entropy: at(5),
            weight: at(6),
        }
    }
}

/// The pieces an update works on.
pub struct UpdateContext<'a> {
    /// The trainable policy.
    pub model: &'a CausalLm,
    /// A frozen reference model (only when β > 0).
    pub reference: Option<&'a CausalLm>,
    /// The trainable parameters, by name (the optimizer's).
    pub params: &'a [(String, Var)],
    /// Run options.
    pub args: &'a GRPOArgs,
    /// The data-parallel ranks the update is shared with ([`atomrl_dist::SingleProcess`]
    /// for one process).
    pub comm: &'a dyn Collective,
}

/// Log-probs (and entropies) of the completion tokens of `batch` under `model`: each prompt
/// goes through the model once for all its completions
/// ([`get_shared_prompt_log_probs`], the same numbers), except under gradient checkpointing,
/// whose memory saving needs the rows run whole.
fn batch_log_probs(
    model: &CausalLm,
    batch: &TrainingBatch,
    temperature: f64,
    with_entropy: bool,
) -> Result<TokenLogProbs> {
    if !model.gradient_checkpointing() {
        if let Some(shared) = batch.shared_prompts()? {
            return get_shared_prompt_log_probs(model, &shared, temperature, with_entropy);
        }
    }
    get_action_log_probs(
        model,
        &batch.input_ids,
        &batch.attention_mask,
        batch.completion_len,
        temperature,
        with_entropy,
    )
}

/// Log-probs of the completion tokens under `model` without a graph (`[R, T]`), micro-batch by
/// micro-batch (`chunks` of rows: the update's micro-batches), each on the worker and rank
/// that will train on it ([`sharded_chunks`]), then shared.
fn detached_log_probs(
    model: &CausalLm,
    batch: &TrainingBatch,
    chunks: &[std::ops::Range<usize>],
    ctx: &UpdateContext<'_>,
) -> Result<Tensor> {
    let view = model.detached();
    let parts = sharded_chunks(
        "update",
        chunks.len(),
        ctx.args.workers,
        ctx.comm,
        model.device(),
        |c| {
            let mb = batch.rows(chunks[c].start, chunks[c].len())?;
            Ok(batch_log_probs(&view, &mb, ctx.args.temperature, false)?.log_probs)
        },
    )?;
    Tensor::cat(&parts, 0).ctx("update")
}

/// Runs `num_iterations` optimizer updates on `batch` at learning rate `lr`.
///
/// # Errors
/// Tensor or shape failures (a non-finite loss is not an error: the step is skipped).
pub fn policy_update(
    ctx: &UpdateContext<'_>,
    optimizer: &mut AdamW,
    batch: &TrainingBatch,
    lr: f64,
) -> Result<UpdateStats> {
    policy_update_hooked(ctx, optimizer, batch, lr, false)
}

/// [`policy_update`], with the loss made NaN when `inject_nan` (the trainer's test hook for the
/// guard, feature `test-hooks`).
pub(crate) fn policy_update_hooked(
    ctx: &UpdateContext<'_>,
    optimizer: &mut AdamW,
    batch: &TrainingBatch,
    lr: f64,
    inject_nan: bool,
) -> Result<UpdateStats> {
    let func = "update";
    let a = ctx.args;
    let rows = batch.num_rows();
    let total_tokens = batch.completion_tokens(func)?;
    let mut stats = UpdateStats {
        kl: f64::NAN,
        ..Default::default()
    };
    if total_tokens == 0.0 {
        stats.skipped = 1;
        stats.skip_reason = Some("no completion token counts in the loss".into());
        return Ok(stats);
    }
    let opts = loss_options(a, total_tokens, rows);
    // With no KL and no entropy term, a row whose advantage is exactly 0 has a per-token loss of
    // exactly 0 and no gradient: skipping its forward and backward changes nothing (its tokens
    // stay in the global normaliser above) and saves the compute of every flat group.
    let kept_rows;
    let batch = if a.beta == 0.0 && a.entropy_coef == 0.0 {
        let Some(kept) = rows_with_advantage(batch)? else {
            // Every group is flat: the loss and its gradient are exactly 0. Like TRL and verl,
            // the optimizer still steps (zero gradient: the moments decay, weight decay
            // applies, the step count advances), once per iteration.
            for _ in 0..a.num_iterations {
                zero_gradient_step(optimizer, lr)?;
            }
            return Ok(stats);
        };
        kept_rows = kept;
        &kept_rows
    } else {
        batch
    };
    let loss = MicroLoss::new(ctx, batch, &opts)?;
    let settings = StepSettings {
        accumulation: a.gradient_accumulation_steps,
        workers: a.workers,
        max_grad_norm: a.max_grad_norm,
        lr,
    };
    for _ in 0..a.num_iterations {
        let (outcome, parts) = accumulate_and_step_hooked(
            ctx.params,
            optimizer,
            batch,
            settings,
            ctx.comm,
            inject_nan,
            |mb, first| loss.of(mb, first),
        )?;
        let m = parts
            .into_iter()
            .fold(MicroStats::default(), MicroStats::add);
        stats.loss = outcome.loss;
        stats.grad_norm = outcome.grad_norm;
        m.write_means(&mut stats, loss.reference.is_some());
        if let Some(reason) = outcome.skipped {
            stats.skipped += 1;
            stats.skip_reason = Some(reason);
        }
    }
    Ok(stats)
}

/// The policy-loss options of `a`, with the global normaliser: every micro-batch divides by the
/// whole batch's tokens / rows, so the micro-batch losses add up to the full-batch loss (TRL
/// issue #3021).
fn loss_options(a: &GRPOArgs, total_tokens: f64, rows: usize) -> PolicyLossOptions {
    PolicyLossOptions {
        clip_low: a.clip_low,
        clip_high: a.clip_high,
        clip_ratio_c: a.clip_ratio_c,
        ratio_level: a.ratio_level,
        agg: AggOptions {
            mode: a.loss_agg,
            max_len: Some(a.max_completion_length),
            global_tokens: Some(total_tokens),
            global_seqs: Some(rows as f64),
        },
    }
}

/// The rows of `batch` whose advantage is not 0, or `None` when every row's is.
fn rows_with_advantage(batch: &TrainingBatch) -> Result<Option<TrainingBatch>> {
    let adv: Vec<f32> = batch.advantages.to_vec1().ctx("update")?;
    let keep: Vec<u32> = (0..adv.len() as u32)
        .filter(|&i| adv[i as usize] != 0.0)
        .collect();
    if keep.is_empty() {
        return Ok(None);
    }
    Ok(Some(batch.select(&keep)?.compact()?))
}

/// The loss of one micro-batch: the clipped policy loss, `+ β·KL` to the reference, `−` the
/// entropy bonus, each aggregated with the whole batch's normaliser.
struct MicroLoss<'a> {
    model: &'a CausalLm,
    args: &'a GRPOArgs,
    opts: &'a PolicyLossOptions,
    /// Log-probs of the policy before the update (`num_iterations > 1`), all rows.
    old: Option<Tensor>,
    /// Log-probs of the reference model (β > 0), all rows.
    reference: Option<Tensor>,
}

impl<'a> MicroLoss<'a> {
    /// The loss of `ctx` on `batch`, with the old policy's log-probs (`num_iterations > 1`)
    /// and the reference's (β > 0) computed first, without a graph.
    fn new(
        ctx: &UpdateContext<'a>,
        batch: &TrainingBatch,
        opts: &'a PolicyLossOptions,
    ) -> Result<Self> {
        let a = ctx.args;
        // The update's own micro-batches and shard rule (`accumulate_and_step`).
        let shards = a.workers.max(1) * ctx.comm.world_size();
        let micro = split_even(
            batch.num_rows(),
            a.gradient_accumulation_steps.max(1) * shards,
        );
        Ok(Self {
            model: ctx.model,
            args: a,
            opts,
            old: if a.num_iterations > 1 {
                Some(detached_log_probs(ctx.model, batch, &micro, ctx)?)
            } else {
                None
            },
            reference: match ctx.reference {
                Some(r) if a.beta > 0.0 => Some(detached_log_probs(r, batch, &micro, ctx)?),
                _ => None,
            },
        })
    }

    /// The loss of micro-batch `mb` (rows `first..` of the batch) and its token-weighted
    /// statistics; `None` when its log-probs are not finite.
    fn of(&self, mb: &TrainingBatch, first: usize) -> Result<Option<(Tensor, MicroStats)>> {
        let func = "update";
        let a = self.args;
        let agg = &self.opts.agg;
        let len = mb.num_rows();
        let tokens = mb.completion_tokens(func)?;
        let out = batch_log_probs(self.model, mb, a.temperature, true)?;
        let lp = out.log_probs;
        let lp_sum = masked_sum(func, &lp, &mb.completion_mask)?;
        if !lp_sum.is_finite() {
            return Ok(None);
        }
        let old_mb = match &self.old {
            Some(o) => o.narrow(0, first, len).ctx(func)?,
            None => lp.detach(),
        };
        let pl = compute_policy_loss(&lp, &old_mb, &mb.advantages, &mb.completion_mask, self.opts)?;
        let mut loss = pl.loss.clone();
        let mut m = MicroStats {
            clip: pl.clip_frac * tokens,
            low: pl.clip_frac_low * tokens,
            high: pl.clip_frac_high * tokens,
            ppo_kl: pl.ppo_kl * tokens,
            weight: tokens,
            ..Default::default()
        };
        if let Some(r) = &self.reference {
            let k = compute_kl_penalty(
                &lp,
                &r.narrow(0, first, len).ctx(func)?,
                &mb.completion_mask,
                a.kl_estimator,
            )?;
            let term = aggregate_loss(&k.kl, &mb.completion_mask, agg)?;
            loss = (loss + (term * a.beta).ctx(func)?).ctx(func)?;
            m.kl = masked_sum(func, &k.kl, &mb.completion_mask)?;
        }
        if let Some(entropy) = &out.entropy {
            if a.entropy_coef > 0.0 {
                let term = aggregate_loss(entropy, &mb.completion_mask, agg)?;
                loss = (loss - (term * a.entropy_coef).ctx(func)?).ctx(func)?;
            }
            m.entropy = masked_sum(func, entropy, &mb.completion_mask)?;
        }
        Ok(Some((loss, m)))
    }
}
