//! Selective log-softmax: the log-probability of one chosen token per row, and the entropy,
//! computed a chunk of rows at a time.

use atomrl_core::{CandleContext, Error, Result};
use candle_core::{DType, Tensor};

/// Default number of `V`-wide rows processed at once: chunks are capped at
/// [`DEFAULT_CHUNK_ELEMENTS`] elements, e.g. 110 rows for Qwen's 151,936-token vocabulary.
pub const DEFAULT_CHUNK_ELEMENTS: usize = 1 << 24;

/// The largest chunk [`chunk_elements_for`] gives a GPU: 2^26 logits (256 MiB in f32).
pub const MAX_DEVICE_CHUNK_ELEMENTS: usize = 1 << 26;

/// The logits chunk (elements of one `[rows, V]` block of the LM head and log-softmax) for
/// scoring on `device`: [`DEFAULT_CHUNK_ELEMENTS`] on the CPU, where larger chunks only cost
/// memory; on a GPU, where every chunk is a dozen kernel launches, as large as 1/256 of the
/// free device memory allows (a chunk's f32 intermediates, ~16 bytes per logit, then take at
/// most 1/16 of it), between [`DEFAULT_CHUNK_ELEMENTS`] and [`MAX_DEVICE_CHUNK_ELEMENTS`]:
/// 4× fewer chunks than the CPU constant on an 80 GiB GPU.
///
/// ```
/// use atomrl_logprob::{chunk_elements_for, DEFAULT_CHUNK_ELEMENTS};
/// assert_eq!(chunk_elements_for(&candle_core::Device::Cpu), DEFAULT_CHUNK_ELEMENTS);
/// ```
pub fn chunk_elements_for(device: &candle_core::Device) -> usize {
    match device {
        #[cfg(feature = "cuda")]
        candle_core::Device::Cuda(d) => d
            .cuda_stream()
            .context()
            .mem_get_info()
            .map_or(DEFAULT_CHUNK_ELEMENTS, |(free, _)| {
                (free / 256).clamp(DEFAULT_CHUNK_ELEMENTS, MAX_DEVICE_CHUNK_ELEMENTS)
            }),
        _ => DEFAULT_CHUNK_ELEMENTS,
    }
}

/// Per-token log-probabilities and (optionally) entropies.
///
/// # Shapes
/// `log_probs [N, T]`, `entropy [N, T]`, in f32 (the logits' dtype when it is f64).
#[derive(Debug, Clone)]
pub struct TokenLogProbs {
    /// `log softmax(logits / temperature)[token]`.
    pub log_probs: Tensor,
    /// `−Σ p log p` of `softmax(logits / temperature)`, when requested.
    pub entropy: Option<Tensor>,
}

/// Checks `temperature > 0` and finite.
pub(crate) fn check_temperature(func: &str, temperature: f64) -> Result<()> {
    if !(temperature.is_finite() && temperature > 0.0) {
        return Err(Error::value(
            func,
            "temperature",
            "a finite number > 0",
            temperature,
        ));
    }
    Ok(())
}

/// `log softmax(logits / temperature)` at `tokens`, and optionally the entropy, computed
/// [`DEFAULT_CHUNK_ELEMENTS`] at a time: beyond the logits themselves, at most one chunk of
/// `[rows, V]` temporaries is alive at once. Differentiable with respect to `logits`.
///
/// # Shapes
/// `logits [N, T, V]` (any float dtype; half precision is computed in f32), `tokens [N, T]`
/// (integer) → [`TokenLogProbs`] with `[N, T]` tensors.
///
/// # Errors
/// [`Error::Shape`] for mismatched shapes, [`Error::Value`] for a token `≥ V` or a
/// temperature that is not a finite positive number.
///
/// ```
/// use atomrl_logprob::selective_log_softmax;
/// use candle_core::{Device, Tensor};
/// let logits = Tensor::new(&[[[0f32, 0.0], [2.0f32.ln(), 0.0]]], &Device::Cpu)?;
/// let tokens = Tensor::new(&[[1u32, 0]], &Device::Cpu)?;
/// let out = selective_log_softmax(&logits, &tokens, 1.0, true)?;
/// let lp = out.log_probs.to_vec2::<f32>()?;
/// assert!((lp[0][0] - 0.5f32.ln()).abs() < 1e-6 && (lp[0][1] - (2f32 / 3.0).ln()).abs() < 1e-6);
/// let h = out.entropy.unwrap().to_vec2::<f32>()?;
/// assert!((h[0][0] - 2f32.ln()).abs() < 1e-6);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn selective_log_softmax(
    logits: &Tensor,
    tokens: &Tensor,
    temperature: f64,
    with_entropy: bool,
) -> Result<TokenLogProbs> {
    selective_log_softmax_chunked(
        logits,
        tokens,
        temperature,
        with_entropy,
        DEFAULT_CHUNK_ELEMENTS,
    )
}

/// [`selective_log_softmax`] with an explicit chunk size in elements (at least one row).
///
/// # Shapes
/// As [`selective_log_softmax`].
///
/// # Errors
/// As [`selective_log_softmax`].
///
/// ```
/// use atomrl_logprob::{selective_log_softmax, selective_log_softmax_chunked};
/// use candle_core::{Device, Tensor};
/// let logits = Tensor::randn(0f32, 1.0, (2, 3, 5), &Device::Cpu)?;
/// let tokens = Tensor::new(&[[0u32, 1, 2], [3, 4, 0]], &Device::Cpu)?;
/// let a = selective_log_softmax(&logits, &tokens, 0.7, false)?.log_probs;
/// let b = selective_log_softmax_chunked(&logits, &tokens, 0.7, false, 1)?.log_probs;
/// let d = (a - b)?.abs()?.max_all()?.to_scalar::<f32>()?;
/// assert!(d < 1e-6);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn selective_log_softmax_chunked(
    logits: &Tensor,
    tokens: &Tensor,
    temperature: f64,
    with_entropy: bool,
    chunk_elements: usize,
) -> Result<TokenLogProbs> {
    let func = "selective_log_softmax";
    check_temperature(func, temperature)?;
    let (n, t, v) = match logits.dims() {
        &[n, t, v] if v > 0 => (n, t, v),
        d => return Err(Error::shape(func, "logits", "[N, T, V] with V >= 1", d)),
    };
    if !logits.dtype().is_float() {
        return Err(Error::value(
            func,
            "logits",
            "a float tensor",
            format!("{:?}", logits.dtype()),
        ));
    }
    if tokens.dims() != [n, t] {
        return Err(Error::shape(
            func,
            "tokens",
            format!("[N, T] = [{n}, {t}]"),
            tokens.dims(),
        ));
    }
    let tokens = tokens.to_dtype(DType::U32).ctx(func)?;
    check_ids(func, "tokens", &tokens, v)?;
    let rows = n * t;
    if rows == 0 {
        let dtype = if logits.dtype() == DType::F64 {
            DType::F64
        } else {
            DType::F32
        };
        let z = Tensor::zeros((n, t), dtype, logits.device()).ctx(func)?;
        return Ok(TokenLogProbs {
            log_probs: z.clone(),
            entropy: with_entropy.then_some(z),
        });
    }
    let flat = logits.reshape((rows, v)).ctx(func)?;
    let flat_tokens = tokens.reshape(rows).ctx(func)?;
    let out = rows_log_softmax(rows, chunk_elements / v, with_entropy, |start, len| {
        crate::fused::chunk_log_softmax(
            &flat.narrow(0, start, len)?,
            &flat_tokens.narrow(0, start, len)?,
            temperature,
            with_entropy,
        )
    })
    .ctx(func)?;
    Ok(TokenLogProbs {
        log_probs: out.0.reshape((n, t)).ctx(func)?,
        entropy: out.1.map(|e| e.reshape((n, t))).transpose().ctx(func)?,
    })
}

/// Runs a chunked computation over `rows` rows, `chunk_rows` at a time: `chunk(start, len)`
/// returns the `[len]` log-probs (and entropies) of rows `start..start + len`. Returns flat
/// `[rows]` log-probs and entropies.
pub(crate) fn rows_log_softmax(
    rows: usize,
    chunk_rows: usize,
    with_entropy: bool,
    chunk: impl Fn(usize, usize) -> candle_core::Result<(Tensor, Option<Tensor>)>,
) -> candle_core::Result<(Tensor, Option<Tensor>)> {
    let mut lps = Vec::new();
    let mut ents = Vec::new();
    for (start, len) in chunks(rows, chunk_rows) {
        let (lp, ent) = chunk(start, len)?;
        lps.push(lp);
        ents.extend(ent);
    }
    let lp = Tensor::cat(&lps, 0)?;
    let ent = if with_entropy {
        Some(Tensor::cat(&ents, 0)?)
    } else {
        None
    };
    Ok((lp, ent))
}

/// `(start, len)` of consecutive chunks of at most `chunk_rows` (at least 1) of `rows` rows.
pub(crate) fn chunks(rows: usize, chunk_rows: usize) -> impl Iterator<Item = (usize, usize)> {
    let step = chunk_rows.max(1);
    (0..rows)
        .step_by(step)
        .map(move |start| (start, step.min(rows - start)))
}

/// Checks that `mask` holds only 0 and 1 (naming `arg` and the first bad position) and returns
/// it as f32.
pub(crate) fn check_mask(func: &str, arg: &str, mask: &Tensor) -> Result<Tensor> {
    let mask = mask.to_dtype(DType::F32).ctx(func)?;
    let values: Vec<f32> = mask.flatten_all().and_then(|m| m.to_vec1()).ctx(func)?;
    if let Some(i) = values.iter().position(|&m| m != 0.0 && m != 1.0) {
        return Err(Error::value(
            func,
            format!("{arg}[{}]", atomrl_core::shape::unravel(i, mask.dims())),
            "0 or 1",
            values[i],
        ));
    }
    Ok(mask)
}

/// Checks that every id is below `vocab`, naming the argument and the first offender.
pub(crate) fn check_ids(func: &str, arg: &str, ids: &Tensor, vocab: usize) -> Result<()> {
    let flat: Vec<u32> = ids.flatten_all().and_then(|t| t.to_vec1()).ctx(func)?;
    if let Some(i) = flat.iter().position(|&x| x as usize >= vocab) {
        return Err(Error::value(
            func,
            format!("{arg}[{}]", atomrl_core::shape::unravel(i, ids.dims())),
            format!("a token id in [0, {vocab})"),
            flat[i],
        ));
    }
    Ok(())
}
