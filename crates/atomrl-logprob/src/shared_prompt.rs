//! Log-probabilities of completions that share prompts, with one forward pass per prompt.

use atomrl_core::{CandleContext, Error, Result};
use atomrl_model::{CausalLm, ForwardInput, KvCache};
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
/// use atomrl_model::{CausalLm, ForwardInput, KvCache};
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

/// Each completion's final hidden state at its last real token, `[N, H]`, with each prompt run
/// through the model once: what a reward model's head reads (transformers'
/// `ForSequenceClassification` pools the last non-pad token). Row `i` equals the state
/// [`CausalLm::forward_hidden`] gives at the last real position of the joined row
/// `prompt_ids[prompt_index[i]] ++ completion_ids[i]` (the prompt's last token for a completion
/// of padding alone). Differentiable.
///
/// A reward model scores both sides of each preference pair, and GRPO's G completions of each
/// prompt: run row by row, every prompt goes through the model twice (G times); here once.
///
/// # Errors
/// As [`get_shared_prompt_log_probs`].
///
/// ```
/// use atomrl_logprob::{get_shared_prompt_last_hidden, SharedPromptBatch};
/// use atomrl_model::{CausalLm, ForwardInput, KvCache};
/// use candle_core::{DType, Device, Tensor};
/// let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/reference/models/tiny-qwen2");
/// let model = CausalLm::from_hf_dir(dir, DType::F32, &Device::Cpu)?;
/// let d = Device::Cpu;
/// // One prompt [5, 6]; completions [7, 8] and [9] (right-padded).
/// let shared = SharedPromptBatch {
///     prompt_ids: Tensor::new(&[[5u32, 6]], &d)?,
///     prompt_mask: Tensor::new(&[[1u32, 1]], &d)?,
///     completion_ids: Tensor::new(&[[7u32, 8], [9, 0]], &d)?,
///     completion_mask: Tensor::new(&[[1u32, 1], [1, 0]], &d)?,
///     prompt_index: Tensor::new(&[0u32, 0], &d)?,
/// };
/// let h = get_shared_prompt_last_hidden(&model, &shared)?;
/// // The state after [5, 6, 7, 8] and the state after [5, 6, 9].
/// let full = model.forward_hidden(&ForwardInput::new(Tensor::new(&[[5u32, 6, 7, 8]], &d)?), None)?;
/// let diff = (h.get(0)? - full.get(0)?.get(3)?)?.abs()?.max_all()?.to_scalar::<f32>()?;
/// assert!(diff < 1e-5);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn get_shared_prompt_last_hidden(
    model: &CausalLm,
    batch: &SharedPromptBatch,
) -> Result<Tensor> {
    let func = "get_shared_prompt_last_hidden";
    let checked = check_batch(func, model, batch)?;
    let t = checked.completion_ids.dim(1).ctx(func)?;
    // Both passes run on one mixed-precision cast of the weights.
    let _casts = model.share_weight_casts();
    let (prompt_last, mut cache) = prompt_pass(func, model, &checked)?;
    let completions = completion_pass(func, model, &checked, &mut cache, t)?;
    // Position 0 is the prompt's last token, 1 + j completion token j: the row's last real
    // token is at 1 + (its last completion position), or 0 for an all-padding completion.
    let states = Tensor::cat(&[prompt_last, completions], 1).ctx(func)?;
    let mask: Vec<Vec<f32>> = checked
        .completion_mask
        .to_dtype(DType::F32)
        .and_then(|m| m.to_vec2())
        .ctx(func)?;
    let flat: Vec<u32> = mask
        .iter()
        .enumerate()
        .map(|(i, row)| {
            let last = row.iter().rposition(|&m| m != 0.0).map_or(0, |j| j + 1);
            (i * (t + 1) + last) as u32
        })
        .collect();
    let n = flat.len();
    let hidden = states.dim(2).ctx(func)?;
    let index = Tensor::new(flat, states.device()).ctx(func)?;
    states
        .reshape((n * (t + 1), hidden))
        .and_then(|s| s.index_select(&index, 0))
        .ctx(func)
}

/// A [`SharedPromptBatch`] whose shapes, ids, masks and prompt rows were checked.
struct CheckedBatch {
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    completion_ids: Tensor,
    completion_mask: Tensor,
    /// `prompt_index` as u32.
    index: Tensor,
}

/// The checked batch's predicting hidden states `[N, T, H]`, completion ids and mask.
fn shared_prompt_states(
    func: &str,
    model: &CausalLm,
    batch: &SharedPromptBatch,
) -> Result<(Tensor, Tensor, Tensor)> {
    let checked = check_batch(func, model, batch)?;
    let t = checked.completion_ids.dim(1).ctx(func)?;
    // Both passes run on one mixed-precision cast of the weights.
    let _casts = model.share_weight_casts();
    let (prompt_last, mut cache) = prompt_pass(func, model, &checked)?;
    // The last prompt position scores the first completion token.
    let mut scoring = vec![prompt_last];
    if t > 1 {
        // The last completion token is only a target: its hidden state is never needed.
        scoring.push(completion_pass(func, model, &checked, &mut cache, t - 1)?);
    }
    let hidden = Tensor::cat(&scoring, 1).ctx(func)?;
    Ok((hidden, checked.completion_ids, checked.completion_mask))
}

/// Checks `batch` against `model`: shapes, token ids below the vocabulary, 0/1 masks,
/// left-padded prompts, prompt rows in range.
fn check_batch(func: &str, model: &CausalLm, batch: &SharedPromptBatch) -> Result<CheckedBatch> {
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
    Ok(CheckedBatch {
        prompt_ids,
        prompt_mask,
        completion_ids,
        completion_mask,
        index,
    })
}

/// The prompts through the model once: each completion's row of the prompts' last hidden
/// state `[N, 1, H]`, and the prompts' key/value cache.
fn prompt_pass(func: &str, model: &CausalLm, b: &CheckedBatch) -> Result<(Tensor, KvCache)> {
    let mut cache = model.new_kv_cache();
    // The completions read the prompts' keys and values and the last position's state; the
    // last layer computes nothing else.
    let prompt_last = model.forward_hidden(
        &ForwardInput::new(b.prompt_ids.clone())
            .with_attention_mask(b.prompt_mask.clone())
            .with_last_position_only(),
        Some(&mut cache),
    )?;
    let last = prompt_last.index_select(&b.index, 0).ctx(func)?;
    Ok((last, cache))
}

/// The first `len` completion tokens of every row through the model after its prompt's cached
/// keys and values (gathered to the completions' rows; the gather's backward adds the rows'
/// gradients into the one prompt pass): their hidden states `[N, len, H]`.
fn completion_pass(
    func: &str,
    model: &CausalLm,
    b: &CheckedBatch,
    cache: &mut KvCache,
    len: usize,
) -> Result<Tensor> {
    let mut rows_cache = cache.index_select(&b.index)?;
    let mask = Tensor::cat(
        &[
            b.prompt_mask.index_select(&b.index, 0).ctx(func)?,
            b.completion_mask.narrow(1, 0, len).ctx(func)?,
        ],
        1,
    )
    .ctx(func)?;
    let inputs = b.completion_ids.narrow(1, 0, len).ctx(func)?;
    model.forward_hidden(
        &ForwardInput::new(inputs).with_attention_mask(mask),
        Some(&mut rows_cache),
    )
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
