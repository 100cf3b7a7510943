//! Log-probabilities of the action (completion) tokens under a model.

use atomrl_core::{CandleContext, Error, Result};
use atomrl_model::{CausalLm, ForwardInput};
use candle_core::{DType, Tensor};

use crate::fused::{chunk_log_softmax, head_log_softmax};
use crate::selective::{
    check_ids, check_mask, check_temperature, chunk_elements_for, rows_log_softmax, TokenLogProbs,
};

/// Log-probabilities (and entropies) of the last `logits_to_keep` tokens of each row under
/// `model`, at `temperature`: token `t` is scored by the logits at position `t − 1`.
///
/// Runs one forward pass for the hidden states, then applies the LM head and the
/// log-softmax a chunk of rows at a time, so the `[N, T, V]` logits are never materialised
/// whole (beyond one chunk). In a training forward each chunk's log-softmax is one graph node
/// that recomputes the softmax in backward. From [`FUSED_HEAD_MIN_VOCAB`] tokens on, the LM
/// head joins it and all chunks become one node: neither a chunk's intermediates nor its
/// logits are kept for backward, which recomputes them chunk by chunk and sums the head's
/// weight gradient in one buffer.
/// Works with left and right padding (positions come from the mask);
/// outputs are 0 where the target token is padding (`attention_mask = 0`). Differentiable
/// with respect to the model's trainable variables.
///
/// # Shapes
/// `input_ids [N, L]` (integer), `attention_mask [N, L]` (0/1, any numeric dtype),
/// `1 ≤ logits_to_keep = T ≤ L − 1` → `log_probs [N, T]`, `entropy [N, T]` (f32, or f64 for
/// an f64 model).
///
/// # Errors
/// [`Error::Shape`] for mismatched shapes or `T` out of range, [`Error::Value`] for a token
/// id `≥ V` (naming `input_ids`), a non-0/1 mask, or a temperature that is not a finite
/// positive number.
///
/// ```
/// use atomrl_logprob::get_action_log_probs;
/// use atomrl_model::CausalLm;
/// use candle_core::{DType, Device, Tensor};
/// let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/reference/models/tiny-qwen3");
/// let model = CausalLm::from_hf_dir(dir, DType::F32, &Device::Cpu)?;
/// // Left-padded prompt of 2 tokens + 3 completion tokens (the last one padding).
/// let ids = Tensor::new(&[[0u32, 10, 11, 12, 13, 0]], &Device::Cpu)?;
/// let mask = Tensor::new(&[[0u32, 1, 1, 1, 1, 0]], &Device::Cpu)?;
/// let out = get_action_log_probs(&model, &ids, &mask, 3, 1.0, true)?;
/// let lp = out.log_probs.to_vec2::<f32>()?;
/// assert_eq!(lp[0].len(), 3);
/// assert!(lp[0][0] < 0.0 && lp[0][2] == 0.0);
/// assert_eq!(out.entropy.unwrap().dims(), &[1, 3]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn get_action_log_probs(
    model: &CausalLm,
    input_ids: &Tensor,
    attention_mask: &Tensor,
    logits_to_keep: usize,
    temperature: f64,
    with_entropy: bool,
) -> Result<TokenLogProbs> {
    get_action_log_probs_chunked(
        model,
        input_ids,
        attention_mask,
        logits_to_keep,
        temperature,
        with_entropy,
        chunk_elements_for(model.device()),
    )
}

/// [`get_action_log_probs`] with an explicit chunk size (elements of the `[rows, V]` logits
/// chunk; at least one row).
///
/// # Shapes
/// As [`get_action_log_probs`].
///
/// # Errors
/// As [`get_action_log_probs`].
///
/// ```
/// use atomrl_logprob::{get_action_log_probs, get_action_log_probs_chunked};
/// use atomrl_model::CausalLm;
/// use candle_core::{DType, Device, Tensor};
/// let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/reference/models/tiny-qwen2");
/// let model = CausalLm::from_hf_dir(dir, DType::F32, &Device::Cpu)?;
/// let ids = Tensor::new(&[[5u32, 6, 7, 8], [9, 10, 0, 0]], &Device::Cpu)?;
/// let mask = Tensor::new(&[[1u32, 1, 1, 1], [1, 1, 0, 0]], &Device::Cpu)?;
/// let a = get_action_log_probs(&model, &ids, &mask, 3, 1.0, false)?.log_probs;
/// let b = get_action_log_probs_chunked(&model, &ids, &mask, 3, 1.0, false, 1)?.log_probs;
/// assert!((a - b)?.abs()?.max_all()?.to_scalar::<f32>()? < 1e-5); // f32 rounding of the chunks
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn get_action_log_probs_chunked(
    model: &CausalLm,
    input_ids: &Tensor,
    attention_mask: &Tensor,
    logits_to_keep: usize,
    temperature: f64,
    with_entropy: bool,
    chunk_elements: usize,
) -> Result<TokenLogProbs> {
    let func = "get_action_log_probs";
    check_temperature(func, temperature)?;
    let (n, l) = match input_ids.dims() {
        &[n, l] if l >= 2 => (n, l),
        d => return Err(Error::shape(func, "input_ids", "[N, L] with L >= 2", d)),
    };
    if attention_mask.dims() != [n, l] {
        return Err(Error::shape(
            func,
            "attention_mask",
            format!("[N, L] = [{n}, {l}]"),
            attention_mask.dims(),
        ));
    }
    if logits_to_keep == 0 || logits_to_keep > l - 1 {
        return Err(Error::value(
            func,
            "logits_to_keep",
            format!("in 1..={} (L - 1)", l - 1),
            logits_to_keep,
        ));
    }
    if input_ids.dtype().is_float() {
        return Err(Error::value(
            func,
            "input_ids",
            "an integer tensor of token ids",
            format!("{:?}", input_ids.dtype()),
        ));
    }
    let ids = input_ids.to_dtype(DType::U32).ctx(func)?;
    let vocab = model.config().vocab_size;
    check_ids(func, "input_ids", &ids, vocab)?;
    let mask = check_mask(func, "attention_mask", attention_mask)?;
    let t = logits_to_keep;
    // The states from the position before the first scored token on; the last layer
    // computes nothing before it.
    let states = model.forward_hidden(
        &ForwardInput::new(ids.clone())
            .with_attention_mask(mask.clone())
            .with_outputs_from(l - 1 - t),
        None,
    )?;
    // The last position predicts no scored token.
    let scoring = states.narrow(1, 0, t).ctx(func)?;
    let targets = ids.narrow(1, l - t, t).ctx(func)?;
    let keep = mask.narrow(1, l - t, t).ctx(func)?;
    let settings = ScoreSettings {
        temperature,
        with_entropy,
        chunk_elements,
    };
    score_hidden(func, model, &scoring, &targets, &keep, &settings)
}

/// From this vocabulary size on, scoring fuses the LM head with the log-softmax: the backward
/// recomputes each chunk's logits (one more `[rows, H] × [H, V]` matmul) instead of keeping
/// them, e.g. 0.6 GB of bf16 logits per 2,048 completion tokens at Qwen's 151,936 tokens.
/// Below it the logits are small and keeping them is cheaper.
pub const FUSED_HEAD_MIN_VOCAB: usize = 16_384;

/// How [`score_hidden`] computes its log-softmax.
pub(crate) struct ScoreSettings {
    pub temperature: f64,
    pub with_entropy: bool,
    /// Elements of one `[rows, V]` logits chunk.
    pub chunk_elements: usize,
}

/// Log-probs (and entropies) of `targets [N, T]` from the hidden states `[N, T, H]` that
/// predict them: the LM head and log-softmax a chunk of rows at a time, zeroed where
/// `keep [N, T]` is 0.
pub(crate) fn score_hidden(
    func: &str,
    model: &CausalLm,
    hidden: &Tensor,
    targets: &Tensor,
    keep: &Tensor,
    settings: &ScoreSettings,
) -> Result<TokenLogProbs> {
    let _p = atomrl_core::profile::phase("forward.lm_head_log_softmax", hidden.device());
    let (n, t, h) = hidden.dims3().ctx(func)?;
    let hidden = hidden
        .contiguous()
        .and_then(|x| x.reshape((n * t, h)))
        .ctx(func)?;
    let targets = targets
        .contiguous()
        .and_then(|x| x.reshape(n * t))
        .ctx(func)?;
    let vocab = model.config().vocab_size;
    let (temperature, with_entropy) = (settings.temperature, settings.with_entropy);
    // Large vocabularies recompute the head in backward rather than keep each chunk's logits.
    let head = if vocab >= FUSED_HEAD_MIN_VOCAB {
        Some(model.lm_head_weight()?)
    } else {
        None
    };
    let chunk_rows = settings.chunk_elements / vocab;
    let (lp, ent) = match &head {
        Some(w) => head_log_softmax(&hidden, w, &targets, chunk_rows, temperature, with_entropy)
            .ctx(func)?,
        None => rows_log_softmax(n * t, chunk_rows, with_entropy, |start, len| {
            let logits = model
                .logits(&hidden.narrow(0, start, len)?)
                .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
            chunk_log_softmax(
                &logits,
                &targets.narrow(0, start, len)?,
                temperature,
                with_entropy,
            )
        })
        .ctx(func)?,
    };
    let shape = |x: Tensor| -> Result<Tensor> {
        let x = x.reshape((n, t)).ctx(func)?;
        x.mul(&keep.to_dtype(x.dtype()).ctx(func)?).ctx(func)
    };
    Ok(TokenLogProbs {
        log_probs: shape(lp)?,
        entropy: ent.map(shape).transpose()?,
    })
}
