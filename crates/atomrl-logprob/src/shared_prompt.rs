//! Log-probabilities of completions that share prompts, with one forward pass per prompt.

use atomrl_core::{CandleContext, Error, Result};
use atomrl_model::{CausalLm, ForwardInput};
use candle_core::{DType, Tensor};

use crate::action::{score_hidden, ScoreSettings};
use crate::selective::{
    check_ids, check_mask, check_temperature, chunk_elements_for, TokenLogProbs,
};

/// Completions grouped by prompt: the input of [`get_shared_prompt_log_probs`].
///
/// # Shapes
/// `prompt_ids [K, P]` (integer, left-padded: every prompt's last column is a real token),
/// `prompt_mask [K, P]` (0/1), `completion_ids [N, T]` (integer, right-padded),
/// `completion_mask [N, T]` (0/1, 1 on real tokens), `prompt_index [N]` (integer in `0..K`:
/// the prompt row `i`'s completion follows).
#[derive(Debug, Clone)]
pub struct SharedPromptBatch {
    /// The distinct prompts.
    pub prompt_ids: Tensor,
    /// 1 on real prompt tokens.
    pub prompt_mask: Tensor,
    /// One completion per row.
    pub completion_ids: Tensor,
    /// 1 on real completion tokens.
    pub completion_mask: Tensor,
    /// The prompt of each completion.
    pub prompt_index: Tensor,
}

/// Log-probabilities (and entropies) of each completion token at `temperature`, given its
/// prompt: the numbers [`get_action_log_probs`](crate::get_action_log_probs) gives on the rows
/// `prompt_ids[prompt_index[i]] ++ completion_ids[i]`, with each prompt run through the model
/// once rather than once per completion.
///
/// GRPO samples G completions of every prompt, and the policy update scores them all: run
/// row by row, the model computes each prompt's keys and values G times (in the forward and
/// the backward pass). Here the prompts go through the model once, their key/value cache is
/// gathered to the completions' rows, and the completions attend to it; the gather's backward
/// adds the G completions' gradients into the one prompt pass. The embedded GSM8K run (8
/// completions of ~44 prompt tokens, ~22 completion tokens) trains on 2.4x fewer tokens.
/// Differentiable with respect to the model's trainable variables.
///
/// # Shapes
/// See [`SharedPromptBatch`] → `log_probs [N, T]`, `entropy [N, T]` (0 where
/// `completion_mask` is 0).
///
/// # Errors
/// [`Error::Shape`] for mismatched shapes, [`Error::Value`] for a token id `≥ V`, a non-0/1
/// mask, a prompt whose last column is padding, a `prompt_index` entry `≥ K`, or a
/// temperature that is not a finite positive number.
///
/// ```
/// use atomrl_logprob::{get_action_log_probs, get_shared_prompt_log_probs, SharedPromptBatch};
/// use atomrl_model::CausalLm;
/// use candle_core::{DType, Device, Tensor};
/// let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/reference/models/tiny-qwen2");
/// let model = CausalLm::from_hf_dir(dir, DType::F32, &Device::Cpu)?;
/// let d = Device::Cpu;
/// // One prompt [5, 6] with two completions, [7, 8] and [9] (right-padded).
/// let shared = SharedPromptBatch {
///     prompt_ids: Tensor::new(&[[5u32, 6]], &d)?,
///     prompt_mask: Tensor::new(&[[1u32, 1]], &d)?,
///     completion_ids: Tensor::new(&[[7u32, 8], [9, 0]], &d)?,
///     completion_mask: Tensor::new(&[[1u32, 1], [1, 0]], &d)?,
///     prompt_index: Tensor::new(&[0u32, 0], &d)?,
/// };
/// let a = get_shared_prompt_log_probs(&model, &shared, 1.0, false)?.log_probs;
/// let ids = Tensor::new(&[[5u32, 6, 7, 8], [5, 6, 9, 0]], &d)?;
/// let mask = Tensor::new(&[[1u32, 1, 1, 1], [1, 1, 1, 0]], &d)?;
/// let b = get_action_log_probs(&model, &ids, &mask, 2, 1.0, false)?.log_probs;
/// assert!((a - b)?.abs()?.max_all()?.to_scalar::<f32>()? < 1e-5);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn get_shared_prompt_log_probs(
    model: &CausalLm,
    batch: &SharedPromptBatch,
    temperature: f64,
    with_entropy: bool,
) -> Result<TokenLogProbs> {
    let func = "get_shared_prompt_log_probs";
    check_temperature(func, temperature)?;
    let (hidden, completion_ids, completion_mask) = shared_prompt_states(func, model, batch)?;
    let settings = ScoreSettings {
        temperature,
        with_entropy,
        chunk_elements: chunk_elements_for(model.device()),
    };
    score_hidden(
        func,
        model,
        &hidden,
        &completion_ids,
        &completion_mask,
        &settings,
    )
}

/// The final hidden states that predict each completion token, `[N, T, H]`, with each prompt
/// run through the model once (as [`get_shared_prompt_log_probs`] does): position `j` is the
/// state after the prompt and completion tokens `0..j`. What a value head reads (PPO's critic:
/// the value of the state before each completion token). Differentiable.
///
/// # Errors
/// As [`get_shared_prompt_log_probs`].
///
/// ```
/// use atomrl_logprob::{get_shared_prompt_hidden, SharedPromptBatch};
/// use atomrl_model::{CausalLm, ForwardInput};
/// use candle_core::{DType, Device, Tensor};
/// let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/reference/models/tiny-qwen2");
/// let model = CausalLm::from_hf_dir(dir, DType::F32, &Device::Cpu)?;
/// let d = Device::Cpu;
/// let shared = SharedPromptBatch {
///     prompt_ids: Tensor::new(&[[5u32, 6]], &d)?,
///     prompt_mask: Tensor::new(&[[1u32, 1]], &d)?,
///     completion_ids: Tensor::new(&[[7u32, 8]], &d)?,
///     completion_mask: Tensor::new(&[[1u32, 1]], &d)?,
///     prompt_index: Tensor::new(&[0u32], &d)?,
/// };
/// let h = get_shared_prompt_hidden(&model, &shared)?;
/// // The states after [5, 6] and after [5, 6, 7]: positions 1 and 2 of the whole row.
/// let full = model.forward_hidden(&ForwardInput::new(Tensor::new(&[[5u32, 6, 7, 8]], &d)?), None)?;
/// let diff = (h - full.narrow(1, 1, 2)?)?.abs()?.max_all()?.to_scalar::<f32>()?;
/// assert!(diff < 1e-5);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn get_shared_prompt_hidden(model: &CausalLm, batch: &SharedPromptBatch) -> Result<Tensor> {
    Ok(shared_prompt_states("get_shared_prompt_hidden", model, batch)?.0)
}

/// The checked batch's predicting hidden states `[N, T, H]`, completion ids and mask.
fn shared_prompt_states(
    func: &str,
    model: &CausalLm,
    batch: &SharedPromptBatch,
) -> Result<(Tensor, Tensor, Tensor)> {
    let vocab = model.config().vocab_size;
    let (k, p) = dims2(
        func,
        "prompt_ids",
        "[K, P] with K, P >= 1",
        &batch.prompt_ids,
    )?;
    let (n, t) = dims2(
        func,
        "completion_ids",
        "[N, T] with N, T >= 1",
        &batch.completion_ids,
    )?;
    same_dims(func, "prompt_mask", &batch.prompt_mask, k, p)?;
    same_dims(func, "completion_mask", &batch.completion_mask, n, t)?;
    if batch.prompt_index.dims() != [n] {
        return Err(Error::shape(
            func,
            "prompt_index",
            format!("[N] = [{n}]"),
            batch.prompt_index.dims(),
        ));
    }
    let prompt_ids = token_ids(func, "prompt_ids", &batch.prompt_ids, vocab)?;
    let completion_ids = token_ids(func, "completion_ids", &batch.completion_ids, vocab)?;
    let index = prompt_rows(func, &batch.prompt_index, k)?;
    let prompt_mask = check_mask(func, "prompt_mask", &batch.prompt_mask)?
        .contiguous()
        .ctx(func)?;
    let completion_mask = check_mask(func, "completion_mask", &batch.completion_mask)?;
    let last_column: Vec<f32> = prompt_mask
        .narrow(1, p - 1, 1)
        .and_then(|c| c.flatten_all()?.to_vec1())
        .ctx(func)?;
    if let Some(row) = last_column.iter().position(|&m| m != 1.0) {
        return Err(Error::value(
            func,
            format!("prompt_mask[{row}, {}]", p - 1),
            "1 (prompts are left-padded)",
            last_column[row],
        ));
    }

    let mut cache = model.new_kv_cache();
    let prompt_hidden = model.forward_hidden(
        &ForwardInput::new(prompt_ids).with_attention_mask(prompt_mask.clone()),
        Some(&mut cache),
    )?;
    // The last prompt position scores the first completion token.
    let mut scoring = vec![prompt_hidden
        .narrow(1, p - 1, 1)
        .and_then(|h| h.contiguous()?.index_select(&index, 0))
        .ctx(func)?];
    if t > 1 {
        // The last completion token is only a target: its hidden state is never needed.
        let mut rows_cache = cache.index_select(&index)?;
        let mask = Tensor::cat(
            &[
                prompt_mask.index_select(&index, 0).ctx(func)?,
                completion_mask.narrow(1, 0, t - 1).ctx(func)?,
            ],
            1,
        )
        .ctx(func)?;
        let inputs = completion_ids.narrow(1, 0, t - 1).ctx(func)?;
        scoring.push(model.forward_hidden(
            &ForwardInput::new(inputs).with_attention_mask(mask),
            Some(&mut rows_cache),
        )?);
    }
    let hidden = Tensor::cat(&scoring, 1).ctx(func)?;
    Ok((hidden, completion_ids, completion_mask))
}

/// `(rows, columns)` of a rank-2 tensor with at least one column.
fn dims2(func: &str, arg: &str, expected: &str, x: &Tensor) -> Result<(usize, usize)> {
    match x.dims() {
        &[rows, cols] if rows >= 1 && cols >= 1 => Ok((rows, cols)),
        d => Err(Error::shape(func, arg, expected, d)),
    }
}

/// Checks that `x` is `[rows, cols]`.
fn same_dims(func: &str, arg: &str, x: &Tensor, rows: usize, cols: usize) -> Result<()> {
    if x.dims() != [rows, cols] {
        return Err(Error::shape(
            func,
            arg,
            format!("[{rows}, {cols}]"),
            x.dims(),
        ));
    }
    Ok(())
}

/// `ids` as u32, checked to be integers below `vocab`.
pub(crate) fn token_ids(func: &str, arg: &str, ids: &Tensor, vocab: usize) -> Result<Tensor> {
    let ids = integers(func, arg, ids)?;
    check_ids(func, arg, &ids, vocab)?;
    Ok(ids)
}

/// `prompt_index` as u32, checked to point at one of the `k` prompts.
fn prompt_rows(func: &str, index: &Tensor, k: usize) -> Result<Tensor> {
    let index = integers(func, "prompt_index", index)?;
    let values: Vec<u32> = index.to_vec1().ctx(func)?;
    if let Some(i) = values.iter().position(|&x| x as usize >= k) {
        return Err(Error::value(
            func,
            format!("prompt_index[{i}]"),
            format!("a prompt row in [0, {k})"),
            values[i],
        ));
    }
    Ok(index)
}

/// `x` as u32, or an error if it holds floats.
fn integers(func: &str, arg: &str, x: &Tensor) -> Result<Tensor> {
    if x.dtype().is_float() {
        return Err(Error::value(
            func,
            arg,
            "an integer tensor",
            format!("{:?}", x.dtype()),
        ));
    }
    x.to_dtype(DType::U32).ctx(func)
}
