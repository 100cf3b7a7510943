//! The SFT recipe: token cross-entropy on completion tokens only (prompt tokens masked), on
//! the shared trainer loop — same optimizer, schedules, accumulation, clipping, NaN guard,
//! LoRA, checkpoints, metrics and evaluation as GRPO.

use std::time::Instant;

use atomrl_core::shape::masked_sum;
use atomrl_core::{Error, Result};
use atomrl_logprob::get_action_log_probs;
use atomrl_loss::compute_sft_loss;
use atomrl_model::CausalLm;
use atomrl_reward::WeightedRewards;
use atomrl_sample::ChatTokenizer;

use crate::config::GRPOArgs;
use crate::data::{EpochSampler, Example};
use crate::grpo::accumulate::accumulate_and_step_hooked;
use crate::grpo::{StepSettings, Trainer, TrainingBatch};
use crate::logging::{keys, MetricRow};
use crate::recipe::RecipeStep;

/// Examples per batch when computing the held-out loss.
const EVAL_LOSS_BATCH: usize = 32;

/// Token ids of one SFT example: the encoded prompt, and the completion followed by EOS
/// (so the model learns to stop), cut to `max_completion_length`.
///
/// # Errors
/// [`Error::Value`] when the example has no completion; tokenizer failures.
pub fn encode_sft_example(
    trainer_tokenizer: &ChatTokenizer,
    encoder: &crate::grpo::PromptEncoder,
    example: &Example,
    max_completion_length: usize,
) -> Result<(Vec<u32>, Vec<u32>)> {
    let completion = example
        .completion
        .as_deref()
        .ok_or_else(|| Error::missing("sft", "completion", "a completion for every SFT example (prompt + completion, or chat messages ending with the assistant)"))?;
    let prompt = encoder.encode(trainer_tokenizer, example)?;
    let mut ids = trainer_tokenizer.encode(completion, false)?;
    if let Some(&eos) = trainer_tokenizer.eos_token_ids().first() {
        ids.push(eos);
    }
    ids.truncate(max_completion_length);
    Ok((prompt.ids, ids))
}

impl Trainer {
    /// An SFT trainer (`recipe = "sft"`): no reward functions, the data's completions are the
    /// targets.
    ///
    /// # Errors
    /// As [`Trainer::new`].
    pub fn sft(args: GRPOArgs, model: CausalLm, tokenizer: ChatTokenizer) -> Result<Self> {
        Trainer::new(args, model, tokenizer, WeightedRewards::new())
    }

    fn sft_batch(&self, examples: &[&Example]) -> Result<TrainingBatch> {
        let seqs = examples
            .iter()
            .map(|e| {
                encode_sft_example(
                    &self.tokenizer,
                    &self.encoder,
                    e,
                    self.args.max_completion_length,
                )
            })
            .collect::<Result<Vec<_>>>()?;
        let masks: Vec<Vec<bool>> = seqs.iter().map(|(_, c)| vec![true; c.len()]).collect();
        let refs: Vec<(&[u32], &[u32], &[bool])> = seqs
            .iter()
            .zip(&masks)
            .map(|((p, c), m)| (p.as_slice(), c.as_slice(), m.as_slice()))
            .collect();
        let zeros = vec![0f32; refs.len()];
        let all = vec![true; refs.len()];
        TrainingBatch::build(
            &refs,
            &zeros,
            &all,
            self.tokenizer.pad_token_id(),
            self.model.device(),
        )
    }

    /// Teacher-forced mean completion-token loss on the held-out examples.
    pub(crate) fn sft_eval_loss(&self) -> Result<f64> {
        let func = "sft_eval_loss";
        let view = self.model.detached();
        let (mut nll, mut tokens) = (0.0f64, 0.0f64);
        let examples: Vec<&Example> = self
            .eval_set
            .iter()
            .filter(|e| e.completion.is_some())
            .collect();
        for chunk in examples.chunks(EVAL_LOSS_BATCH) {
            let batch = self.sft_batch(chunk)?;
            let lp = get_action_log_probs(
                &view,
                &batch.input_ids,
                &batch.attention_mask,
                batch.completion_len,
                1.0,
                false,
            )?
            .log_probs;
            nll -= masked_sum(func, &lp, &batch.completion_mask)?;
            tokens += batch.completion_tokens(func)?;
        }
        Ok(if tokens > 0.0 { nll / tokens } else { f64::NAN })
    }
}

/// The SFT recipe's step (it holds nothing of its own: the data's completions are the targets).
pub(crate) struct SftStep;

impl RecipeStep for SftStep {
    /// One SFT step: a batch of examples, mean completion-token cross-entropy with the global
    /// token count as normaliser, accumulation, clipping, AdamW.
    fn step(
        &mut self,
        t: &mut Trainer,
        step: u64,
        lr: f64,
        sampler: &mut EpochSampler,
    ) -> Result<MetricRow> {
        let func = "sft_step";
        let started = Instant::now();
        let picked: Vec<&Example> = sampler
            .next_batch(t.args.batch_size)
            .into_iter()
            .map(|i| &t.train_set[i])
            .collect();
        let batch = t.sft_batch(&picked)?;
        let total_tokens = batch.completion_tokens(func)?;
        let settings = StepSettings {
            accumulation: t.args.gradient_accumulation_steps,
            workers: t.args.workers,
            max_grad_norm: t.args.max_grad_norm,
            lr,
        };
        let model = &t.model;
        let inject_nan = t.nan_at(step);
        let (outcome, _) = accumulate_and_step_hooked(
            &t.params,
            &mut t.optimizer,
            &batch,
            settings,
            t.comm.as_ref(),
            inject_nan,
            |mb, _| micro_loss(model, mb, total_tokens),
        )?;
        if let Some(reason) = &outcome.skipped {
            t.warn(format!("step {step}: update skipped: {reason}"));
        }
        let seconds = started.elapsed().as_secs_f64();
        let mut row = MetricRow::new(step);
        row.push(keys::LOSS, outcome.loss);
        row.push(keys::GRAD_NORM, outcome.grad_norm);
        row.push(keys::LR, lr);
        row.push(keys::TOKENS_PER_S, total_tokens / seconds.max(1e-9));
        row.push(keys::COMPLETION_TOKENS, total_tokens);
        row.push(
            keys::SKIPPED_STEP,
            if outcome.skipped.is_some() { 1.0 } else { 0.0 },
        );
        row.push(keys::TIME_STEP_S, seconds);
        t.last_samples.clear();
        Ok(row)
    }

    fn eval_loss(&self, t: &Trainer) -> Result<Option<f64>> {
        t.sft_eval_loss().map(Some)
    }
}

/// The SFT loss of micro-batch `mb` under `model`: completion-token cross-entropy over the
/// whole batch's `total_tokens`; `None` when its log-probs are not finite.
fn micro_loss(
    model: &CausalLm,
    mb: &TrainingBatch,
    total_tokens: f64,
) -> Result<Option<(candle_core::Tensor, ())>> {
    let lp = get_action_log_probs(
        model,
        &mb.input_ids,
        &mb.attention_mask,
        mb.completion_len,
        1.0,
        false,
    )?
    .log_probs;
    let finite = masked_sum("sft_step", &lp, &mb.completion_mask)?;
    if !finite.is_finite() {
        return Ok(None);
    }
    let loss = compute_sft_loss(&lp, &mb.completion_mask, Some(total_tokens))?.loss;
    Ok(Some((loss, ())))
}
