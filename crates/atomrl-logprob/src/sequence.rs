//! [`get_sequence_log_probs`]: the summed completion log-probs of preference pairs (DPO), both
//! sides in one forward over the concatenated batch.

use atomrl_core::{CandleContext, Error, Result};
use atomrl_model::CausalLm;
use candle_core::{DType, Tensor};

use crate::action::get_action_log_probs;

const FUNC: &str = "get_sequence_log_probs";

/// One side of `N` preference pairs: prompt + completion rows, right-padded.
#[derive(Debug, Clone)]
pub struct SequenceBatch {
    /// Token ids `[N, L]`.
    pub input_ids: Tensor,
    /// 1 on real tokens, 0 on the right padding `[N, L]`.
    pub attention_mask: Tensor,
    /// 1 on the completion's tokens (0 on the prompt and padding) `[N, L]`.
    pub completion_mask: Tensor,
}

/// What [`get_sequence_log_probs`] gives for each side.
#[derive(Debug, Clone)]
pub struct SequenceLogProbs {
    /// Each chosen completion's log-prob, summed over its tokens `[N]` (differentiable).
    pub chosen: Tensor,
    /// Each rejected completion's, `[N]`.
    pub rejected: Tensor,
    /// The chosen completions' token counts `[N]` (what IPO averages by).
    pub chosen_lengths: Tensor,
    /// The rejected completions' token counts `[N]`.
    pub rejected_lengths: Tensor,
}

/// The log-probs of each completion of `N` pairs under `model`, summed over its tokens, for the
/// chosen and the rejected side: the two sides are padded to one length and run as one batch of
/// `2N` rows (one forward, as TRL's `DPOTrainer` concatenates them), then split. Token `j`
/// counts when `completion_mask[n, j] = 1` (its log-prob is read from position `j − 1`).
///
/// # Shapes
/// Each side's tensors `[N, L_side]`; returns `[N]` sums and counts per side.
///
/// # Errors
/// Sides with different `N`, masks of another shape, a completion token at position 0 (no
/// position predicts it), and [`get_action_log_probs`]'s errors (ids, masks, temperature).
///
/// ```
/// use atomrl_logprob::{get_action_log_probs, get_sequence_log_probs, SequenceBatch};
/// use atomrl_model::CausalLm;
/// use candle_core::{DType, Device, Tensor};
/// let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/reference/models/tiny-qwen2");
/// let model = CausalLm::from_hf_dir(dir, DType::F32, &Device::Cpu)?;
/// let d = Device::Cpu;
/// // Prompt [5, 6]; chosen completion [7, 8], rejected [9] (right-padded).
/// let chosen = SequenceBatch {
///     input_ids: Tensor::new(&[[5u32, 6, 7, 8]], &d)?,
///     attention_mask: Tensor::new(&[[1f32, 1.0, 1.0, 1.0]], &d)?,
///     completion_mask: Tensor::new(&[[0f32, 0.0, 1.0, 1.0]], &d)?,
/// };
/// let rejected = SequenceBatch {
///     input_ids: Tensor::new(&[[5u32, 6, 9]], &d)?,
///     attention_mask: Tensor::new(&[[1f32, 1.0, 1.0]], &d)?,
///     completion_mask: Tensor::new(&[[0f32, 0.0, 1.0]], &d)?,
/// };
/// let out = get_sequence_log_probs(&model, &chosen, &rejected, 1.0)?;
/// let per_token = get_action_log_probs(&model, &chosen.input_ids, &chosen.attention_mask, 3, 1.0, false)?.log_probs;
/// let want = per_token.narrow(1, 1, 2)?.sum_all()?.to_scalar::<f32>()?;
/// assert!((out.chosen.to_vec1::<f32>()?[0] - want).abs() < 1e-5);
/// assert_eq!(out.rejected_lengths.to_vec1::<f32>()?, [1.0]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn get_sequence_log_probs(
    model: &CausalLm,
    chosen: &SequenceBatch,
    rejected: &SequenceBatch,
    temperature: f64,
) -> Result<SequenceLogProbs> {
    let (n, lc) = side_dims("chosen", chosen)?;
    let (nr, lr) = side_dims("rejected", rejected)?;
    if nr != n {
        return Err(Error::shape(
            FUNC,
            "rejected.input_ids",
            format!("[{n}, L] (one row per pair)"),
            rejected.input_ids.dims(),
        ));
    }
    let l = lc.max(lr);
    let pad = |t: &Tensor, len: usize| -> Result<Tensor> {
        let t = t.to_dtype(DType::F32).ctx(FUNC)?;
        if len == l {
            return Ok(t);
        }
        t.pad_with_zeros(1, 0, l - len).ctx(FUNC)
    };
    let ids = Tensor::cat(
        &[pad(&chosen.input_ids, lc)?, pad(&rejected.input_ids, lr)?],
        0,
    )
    .and_then(|t| t.to_dtype(DType::U32))
    .ctx(FUNC)?;
    let mask = Tensor::cat(
        &[
            pad(&chosen.attention_mask, lc)?,
            pad(&rejected.attention_mask, lr)?,
        ],
        0,
    )
    .ctx(FUNC)?;
    let completion = Tensor::cat(
        &[
            pad(&chosen.completion_mask, lc)?,
            pad(&rejected.completion_mask, lr)?,
        ],
        0,
    )
    .ctx(FUNC)?;
    // Position j − 1 predicts token j: the targets' completion mask, shifted by one.
    let targets = completion.narrow(1, 1, l - 1).ctx(FUNC)?;
    let lp = get_action_log_probs(model, &ids, &mask, l - 1, temperature, false)?.log_probs;
    let sums = (lp * &targets).and_then(|x| x.sum(1)).ctx(FUNC)?;
    let counts = targets.sum(1).ctx(FUNC)?;
    Ok(SequenceLogProbs {
        chosen: sums.narrow(0, 0, n).ctx(FUNC)?,
        rejected: sums.narrow(0, n, n).ctx(FUNC)?,
        chosen_lengths: counts.narrow(0, 0, n).ctx(FUNC)?,
        rejected_lengths: counts.narrow(0, n, n).ctx(FUNC)?,
    })
}

/// `(N, L)` of one side, its masks checked to be `[N, L]` and its first column free of
/// completion tokens.
fn side_dims(side: &str, b: &SequenceBatch) -> Result<(usize, usize)> {
    let (n, l) = match b.input_ids.dims() {
        &[n, l] if n >= 1 && l >= 2 => (n, l),
        d => {
            return Err(Error::shape(
                FUNC,
                &format!("{side}.input_ids"),
                "[N, L] with N >= 1, L >= 2",
                d,
            ))
        }
    };
    for (name, t) in [
        ("attention_mask", &b.attention_mask),
        ("completion_mask", &b.completion_mask),
    ] {
        if t.dims() != [n, l] {
            return Err(Error::shape(
                FUNC,
                &format!("{side}.{name}"),
                format!("[{n}, {l}] (as input_ids)"),
                t.dims(),
            ));
        }
    }
    let first: Vec<f32> = b
        .completion_mask
        .narrow(1, 0, 1)
        .and_then(|c| c.flatten_all()?.to_dtype(DType::F32)?.to_vec1())
        .ctx(FUNC)?;
    if let Some(row) = first.iter().position(|&m| m != 0.0) {
        return Err(Error::value(
            FUNC,
            format!("{side}.completion_mask[{row}, 0]"),
            "0 (a completion follows at least one prompt token)",
            first[row],
        ));
    }
    Ok((n, l))
}
