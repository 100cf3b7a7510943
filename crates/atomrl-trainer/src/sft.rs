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
use atomrl_rollout::{Experience, PromptEncoder};
use atomrl_sample::ChatTokenizer;

use crate::accumulate::{accumulate_and_step, StepSettings};
use crate::config::GRPOArgs;
use crate::data::{EpochSampler, Example};
use crate::logging::{keys, MetricRow};
use crate::recipe::{HeldOut, RecipeStep, RunData, StepExperience, StepReport};
use crate::state::TrainState;
use crate::Trainer;

/// Examples per batch when computing the held-out loss.
const EVAL_LOSS_BATCH: usize = 32;

/// Token ids of one SFT example: the encoded prompt, and the completion followed by EOS
/// (so the model learns to stop), cut to `max_completion_length`.
///
/// # Errors
/// [`Error::Value`] when the example has no completion; tokenizer failures.
pub fn encode_sft_example(
    tokenizer: &ChatTokenizer,
    encoder: &PromptEncoder,
    example: &Example,
    max_completion_length: usize,
) -> Result<(Vec<u32>, Vec<u32>)> {
    let completion = example
        .completion
        .as_deref()
        .ok_or_else(|| Error::missing("sft", "completion", "a completion for every SFT example (prompt + completion, or chat messages ending with the assistant)"))?;
    let prompt = encoder.encode(tokenizer, example)?;
    let ids = encoder.encode_target(tokenizer, completion, max_completion_length)?;
    Ok((prompt.ids, ids))
}

impl Trainer {
    /// A trainer without reward functions: SFT (`recipe = "sft"`: the data's completions are
    /// the targets) or a reward model (`recipe = "reward"`: the data's preference pairs).
    ///
    /// # Errors
    /// As [`Trainer::new`].
    pub fn sft(args: GRPOArgs, model: CausalLm, tokenizer: ChatTokenizer) -> Result<Self> {
        Trainer::new(args, model, tokenizer, WeightedRewards::new())
    }
}

/// The experience of SFT `examples`: their prompts and completions, every completion token in
/// the loss, no advantages.
fn sft_experience(run: &RunData, examples: &[&Example], state: &TrainState) -> Result<Experience> {
    let seqs = examples
        .iter()
        .map(|e| {
            let max = run.args.max_completion_length;
            encode_sft_example(&run.tokenizer, &run.encoder, e, max)
        })
        .collect::<Result<Vec<_>>>()?;
    let masks: Vec<Vec<bool>> = seqs.iter().map(|(_, c)| vec![true; c.len()]).collect();
    let rows: Vec<(&[u32], &[u32], &[bool])> = seqs
        .iter()
        .zip(&masks)
        .map(|((p, c), m)| (p.as_slice(), c.as_slice(), m.as_slice()))
        .collect();
    let zeros = vec![0f32; rows.len()];
    let all = vec![true; rows.len()];
    let pad = run.tokenizer.pad_token_id();
    Experience::from_rows(&rows, &zeros, &all, pad, state.model.device())
}

/// The SFT recipe's step (it holds its optimizer-step settings: the data's completions are
/// the targets).
pub(crate) struct SftStep {
    settings: StepSettings,
}

impl SftStep {
    pub(crate) fn new(args: &GRPOArgs) -> Self {
        Self {
            settings: args.step_settings(),
        }
    }
}

impl RecipeStep for SftStep {
    /// A batch of examples.
    fn experience(
        &mut self,
        run: &RunData,
        state: &TrainState,
        _step: u64,
        sampler: &mut EpochSampler,
    ) -> Result<StepExperience> {
        let started = Instant::now();
        let picked = run.next_examples(sampler);
        Ok(StepExperience {
            experience: sft_experience(run, &picked, state)?,
            rollouts: None,
            seconds: started.elapsed().as_secs_f64(),
        })
    }

    /// Mean completion-token cross-entropy with the step's token count as normaliser,
    /// accumulation, clipping, AdamW.
    fn update(
        &mut self,
        _run: &RunData,
        state: &mut TrainState,
        made: &StepExperience,
        step: u64,
        lr: f64,
    ) -> Result<StepReport> {
        let started = Instant::now();
        let exp = &made.experience;
        let total_tokens = exp.normalizer.tokens;
        let model = &state.model;
        let (outcome, _) = accumulate_and_step(
            &state.params,
            &mut state.optimizer,
            exp,
            StepSettings {
                lr,
                ..self.settings
            },
            state.comm.as_ref(),
            model.share_weight_casts(),
            |_, mb| micro_loss(model, mb, total_tokens),
        )?;
        let mut report = StepReport::default();
        if let Some(reason) = &outcome.skipped {
            report
                .warnings
                .push(format!("step {step}: update skipped: {reason}"));
        }
        let seconds = made.seconds + started.elapsed().as_secs_f64();
        let mut row = MetricRow::new(step);
        row.push(keys::LOSS, outcome.loss);
        row.push(keys::GRAD_NORM, outcome.grad_norm);
        row.push(keys::LR, lr);
        row.push(keys::TOKENS_PER_S, total_tokens / seconds.max(1e-9));
        row.push(keys::COMPLETION_TOKENS, total_tokens);
        row.push(
            keys::SKIPPED_STEP,
            f64::from(u8::from(outcome.skipped.is_some())),
        );
        row.push(keys::TIME_STEP_S, seconds);
        report.row = row;
        Ok(report)
    }

    /// Teacher-forced mean completion-token loss on the held-out examples.
    fn held_out(&self, run: &RunData, state: &TrainState) -> Result<HeldOut> {
        let func = "sft_eval_loss";
        let view = state.model.detached();
        let (mut nll, mut tokens) = (0.0f64, 0.0f64);
        let examples: Vec<&Example> = run
            .eval_set
            .iter()
            .filter(|e| e.completion.is_some())
            .collect();
        for chunk in examples.chunks(EVAL_LOSS_BATCH) {
            let exp = sft_experience(run, chunk, state)?;
            let lp = get_action_log_probs(
                &view,
                &exp.input_ids,
                &exp.attention_mask,
                exp.completion_len,
                1.0,
                false,
            )?
            .log_probs;
            nll -= masked_sum(func, &lp, &exp.loss_mask)?;
            tokens += exp.loss_tokens(func)?;
        }
        Ok(HeldOut {
            loss: Some(if tokens > 0.0 { nll / tokens } else { f64::NAN }),
            ..HeldOut::default()
        })
    }
}

/// The SFT loss of micro-batch `mb` under `model`: completion-token cross-entropy over the
/// whole batch's `total_tokens`; `None` when its log-probs are not finite.
fn micro_loss(
    model: &CausalLm,
    mb: &Experience,
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
    let finite = masked_sum("sft_step", &lp, &mb.loss_mask)?;
    if !finite.is_finite() {
        return Ok(None);
    }
    let loss = compute_sft_loss(&lp, &mb.loss_mask, Some(total_tokens))?.loss;
    Ok(Some((loss, ())))
}
