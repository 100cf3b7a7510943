//! Log-probs of an experience's completion tokens: under the model being trained (with a
//! graph, in the update) and, once per step, under the old policy and the reference model.

use atomrl_core::{CandleContext, Result};
use atomrl_logprob::{
    get_action_log_probs, get_hidden_log_probs, get_shared_prompt_hidden,
    get_shared_prompt_log_probs, TokenLogProbs,
};
use atomrl_model::{CausalLm, ForwardInput};
use candle_core::Tensor;

use crate::experience::Experience;
use crate::make::ExperienceConfig;
use crate::parallel::{sharded_chunks, Parallel};

/// Log-probs (and entropies) of the completion tokens of `exp` under `model` (`[R, T]`): each
/// prompt goes through the model once for all its completions
/// ([`get_shared_prompt_log_probs`], the same numbers), except under gradient checkpointing,
/// whose memory saving needs the rows run whole.
///
/// # Errors
/// Tensor or model failures.
///
/// ```
/// use atomrl_rollout::{experience_log_probs, Experience};
/// use candle_core::{DType, Device};
/// let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/reference/models/tiny-qwen2");
/// let model = atomrl_model::CausalLm::from_hf_dir(dir, DType::F32, &Device::Cpu)?;
/// let rows: [(&[u32], &[u32], &[bool]); 2] = [(&[1, 2], &[3, 4], &[true; 2]), (&[1, 2], &[5], &[true])];
/// let exp = Experience::from_rows(&rows, &[1.0, -1.0], &[true; 2], 0, &Device::Cpu)?;
/// let out = experience_log_probs(&model, &exp, 1.0, true)?;
/// assert_eq!(out.log_probs.dims(), [2, 2]);
/// assert!(out.entropy.is_some());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn experience_log_probs(
    model: &CausalLm,
    exp: &Experience,
    temperature: f64,
    with_entropy: bool,
) -> Result<TokenLogProbs> {
    if !model.gradient_checkpointing() {
        if let Some(shared) = exp.shared_prompts()? {
            return get_shared_prompt_log_probs(model, &shared, temperature, with_entropy);
        }
    }
    get_action_log_probs(
        model,
        &exp.input_ids,
        &exp.attention_mask,
        exp.completion_len,
        temperature,
        with_entropy,
    )
}

/// [`experience_log_probs`] together with the final hidden states `[R, T, H]` they came
/// from (position `t` predicts completion token `t`): what a value head on the policy reads,
/// so that one forward pass (and one backward) serves the policy loss and the value loss.
/// The log-probs are the same numbers [`experience_log_probs`] gives.
///
/// # Errors
/// Tensor or model failures.
///
/// ```
/// use atomrl_rollout::{experience_log_probs, experience_log_probs_and_hidden, Experience};
/// use candle_core::{DType, Device};
/// let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/reference/models/tiny-qwen2");
/// let model = atomrl_model::CausalLm::from_hf_dir(dir, DType::F32, &Device::Cpu)?;
/// let rows: [(&[u32], &[u32], &[bool]); 2] = [(&[1, 2], &[3, 4], &[true; 2]), (&[1, 2], &[5], &[true])];
/// let exp = Experience::from_rows(&rows, &[1.0, -1.0], &[true; 2], 0, &Device::Cpu)?;
/// let (out, hidden) = experience_log_probs_and_hidden(&model, &exp, 1.0, false)?;
/// assert_eq!(hidden.dims(), [2, 2, model.config().hidden_size]);
/// let alone = experience_log_probs(&model, &exp, 1.0, false)?.log_probs;
/// assert_eq!(out.log_probs.to_vec2::<f32>()?, alone.to_vec2::<f32>()?);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn experience_log_probs_and_hidden(
    model: &CausalLm,
    exp: &Experience,
    temperature: f64,
    with_entropy: bool,
) -> Result<(TokenLogProbs, Tensor)> {
    let func = "experience_log_probs_and_hidden";
    if !model.gradient_checkpointing() {
        if let Some(shared) = exp.shared_prompts()? {
            let hidden = get_shared_prompt_hidden(model, &shared)?;
            let out = get_hidden_log_probs(
                model,
                &hidden,
                &shared.completion_ids,
                &shared.completion_mask,
                temperature,
                with_entropy,
            )?;
            return Ok((out, hidden));
        }
    }
    let (l, t) = (exp.input_ids.dim(1).ctx(func)?, exp.completion_len);
    let input =
        ForwardInput::new(exp.input_ids.clone()).with_attention_mask(exp.attention_mask.clone());
    let hidden = model
        .forward_hidden(&input, None)?
        .narrow(1, l - 1 - t, t)
        .ctx(func)?;
    let out = get_hidden_log_probs(
        model,
        &hidden,
        &exp.input_ids.narrow(1, l - t, t).ctx(func)?,
        &exp.attention_mask.narrow(1, l - t, t).ctx(func)?,
        temperature,
        with_entropy,
    )?;
    Ok((out, hidden))
}

/// The log-probs of `exp`'s completion tokens under `model` without a graph, `[R, T]`,
/// computed on the update's micro-batches (`accumulation` per worker), each by the worker
/// and rank that trains on it ([`sharded_chunks`]), then shared: what the old and reference
/// passes of [`crate::make_experience`] compute, and TRPO's line search re-computes.
///
/// # Errors
/// Model failures; a failed collective.
///
/// ```
/// use atomrl_dist::SingleProcess;
/// use atomrl_rollout::parallel::Parallel;
/// use atomrl_rollout::{experience_log_probs, sharded_log_probs, Experience};
/// use candle_core::{DType, Device};
/// let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/reference/models/tiny-qwen2");
/// let model = atomrl_model::CausalLm::from_hf_dir(dir, DType::F32, &Device::Cpu)?;
/// let rows: [(&[u32], &[u32], &[bool]); 2] = [(&[1, 2], &[3, 4], &[true; 2]), (&[1, 2], &[5], &[true])];
/// let exp = Experience::from_rows(&rows, &[1.0, -1.0], &[true; 2], 0, &Device::Cpu)?;
/// let par = Parallel { workers: 2, comm: &SingleProcess };
/// let lp = sharded_log_probs(&model, &exp, par, 1, 1.0)?;
/// let whole = experience_log_probs(&model, &exp, 1.0, false)?.log_probs;
/// let d = (lp - whole)?.abs()?.max_all()?.to_scalar::<f32>()?;
/// assert!(d < 1e-5);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn sharded_log_probs(
    model: &CausalLm,
    exp: &Experience,
    par: Parallel<'_>,
    accumulation: usize,
    temperature: f64,
) -> Result<Tensor> {
    let micro = par.micro_batches(exp.num_rows(), accumulation);
    detached_log_probs(model, exp, &micro, par, temperature)
}

/// Fills `exp.old_log_probs` (when `config.old_log_probs`) and `exp.ref_log_probs` (when a
/// `reference` is given), without a graph.
pub(crate) fn attach_log_probs(
    exp: &mut Experience,
    policy: &CausalLm,
    par: Parallel<'_>,
    reference: Option<&CausalLm>,
    config: &ExperienceConfig,
) -> Result<()> {
    // The update's own micro-batches and shard rule.
    let micro = par.micro_batches(exp.num_rows(), config.micro_batches);
    let temperature = config.sampling.temperature;
    if config.old_log_probs {
        exp.old_log_probs = Some(detached_log_probs(policy, exp, &micro, par, temperature)?);
    }
    if let Some(r) = reference {
        exp.ref_log_probs = Some(detached_log_probs(r, exp, &micro, par, temperature)?);
    }
    Ok(())
}

/// Log-probs of the completion tokens under `model` without a graph (`[R, T]`), micro-batch by
/// micro-batch (`chunks` of rows), each on the worker and rank that will train on it
/// ([`sharded_chunks`]), then shared.
fn detached_log_probs(
    model: &CausalLm,
    exp: &Experience,
    chunks: &[std::ops::Range<usize>],
    par: Parallel<'_>,
    temperature: f64,
) -> Result<Tensor> {
    let view = model.detached();
    let parts = sharded_chunks(
        "make_experience",
        chunks.len(),
        par.workers,
        par.comm,
        model.device(),
        |c| {
            let mb = exp.rows(chunks[c].start, chunks[c].len())?;
            Ok(experience_log_probs(&view, &mb, temperature, false)?.log_probs)
        },
    )?;
    Tensor::cat(&parts, 0).ctx("make_experience")
}
