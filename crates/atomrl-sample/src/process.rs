//! The per-step sampling functions: logits processing (penalty, temperature, top-k, top-p,
//! min-p) and drawing a token, on the host, one row at a time.

use atomrl_core::{CandleContext, Error, Result};
use candle_core::{DType, Tensor};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::params::SamplingParams;

/// The value given to filtered-out logits.
pub const FILTERED: f32 = f32::NEG_INFINITY;

/// A row's own random generator: row `r` of a batch sampled with seed `s` draws from
/// `RowRng::new(s, r)` whatever the other rows do, so a completion does not depend on which
/// rows were still running beside it (or on the batch size the decoder ran at).
///
/// ```
/// use atomrl_sample::RowRng;
/// let (mut a, mut b) = (RowRng::new(7, 3), RowRng::new(7, 3));
/// assert_eq!(a.uniform(), b.uniform());
/// assert_ne!(RowRng::new(7, 3).uniform(), RowRng::new(7, 4).uniform());
/// ```
#[derive(Debug, Clone)]
pub struct RowRng(StdRng);

impl RowRng {
    /// The generator of row `row` under `seed`.
    ///
    /// ```
    /// let _ = atomrl_sample::RowRng::new(0, 0);
    /// ```
    pub fn new(seed: u64, row: usize) -> Self {
        Self(StdRng::seed_from_u64(splitmix64(
            seed ^ splitmix64(row as u64 ^ 0x5851_F42D_4C95_7F2D),
        )))
    }

    /// A uniform number in `[0, 1)`.
    ///
    /// ```
    /// let x = atomrl_sample::RowRng::new(1, 0).uniform();
    /// assert!((0.0..1.0).contains(&x));
    /// ```
    pub fn uniform(&mut self) -> f64 {
        self.0.random::<f64>()
    }
}

/// The first output of SplitMix64 seeded with `x`.
fn splitmix64(x: u64) -> u64 {
    atomrl_core::rng::SplitMix64::new(x).next_u64()
}

/// Applies the repetition penalty, the temperature and the top-k / top-p / min-p filters to
/// one row of logits in place; filtered entries become [`FILTERED`] (−inf). At least the most
/// likely token is always kept.
///
/// Rules (Hugging Face's processors, in their order):
/// 1. repetition penalty `ρ ≠ 1`: for each distinct id in `history`, `l ← l / ρ` if `l > 0`
///    else `l · ρ`;
/// 2. temperature `T > 0`: `l ← l / T` (`T = 0`: greedy, the filters below are skipped, the
///    row keeps its penalised logits);
/// 3. top-k `0 < k < V`: keep `l ≥` the k-th largest value (ties at it kept);
/// 4. top-p `< 1`: sort the kept tokens by decreasing logit (ties by increasing id), keep
///    each token whose preceding cumulative probability (softmax over the kept tokens) is
///    `< top_p`, i.e. the smallest prefix reaching `top_p`;
/// 5. min-p `> 0`: keep `p ≥ min_p · p_max`, i.e. `l ≥ l_max + ln(min_p)`.
///
/// Costs O(V) plus O(m log m) for top-p over the `m` tokens still kept.
///
/// ```
/// use atomrl_sample::{process_logits_row, SamplingParams};
/// let mut row = vec![1.0f32, 3.0, 2.0, 0.0];
/// process_logits_row(&mut row, &SamplingParams { top_k: 2, ..Default::default() }, &[]);
/// assert_eq!(row, vec![f32::NEG_INFINITY, 3.0, 2.0, f32::NEG_INFINITY]);
/// ```
pub fn process_logits_row(row: &mut [f32], params: &SamplingParams, history: &[u32]) {
    if params.repetition_penalty != 1.0 && !history.is_empty() {
        let rho = params.repetition_penalty as f32;
        let mut seen: Vec<u32> = history.to_vec();
        seen.sort_unstable();
        seen.dedup();
        for &t in &seen {
            if let Some(l) = row.get_mut(t as usize) {
                *l = if *l > 0.0 { *l / rho } else { *l * rho };
            }
        }
    }
    if params.is_greedy() || row.is_empty() {
        return;
    }
    if params.temperature != 1.0 {
        let inv = (1.0 / params.temperature) as f32;
        row.iter_mut().for_each(|l| *l *= inv);
    }
    let v = row.len();
    if params.top_k > 0 && params.top_k < v {
        let mut vals: Vec<f32> = row.to_vec();
        let k = params.top_k;
        let (_, kth, _) = vals.select_nth_unstable_by(k - 1, |a, b| b.total_cmp(a));
        let kth = *kth;
        row.iter_mut()
            .filter(|l| **l < kth)
            .for_each(|l| *l = FILTERED);
    }
    if params.top_p < 1.0 {
        let mut kept: Vec<u32> = (0..v as u32)
            .filter(|&i| row[i as usize] > FILTERED)
            .collect();
        kept.sort_by(|&a, &b| row[b as usize].total_cmp(&row[a as usize]).then(a.cmp(&b)));
        if let Some(&top) = kept.first() {
            let max = f64::from(row[top as usize]);
            let weights: Vec<f64> = kept
                .iter()
                .map(|&i| (f64::from(row[i as usize]) - max).exp())
                .collect();
            let total: f64 = weights.iter().sum();
            let threshold = params.top_p * total;
            let mut before = 0.0;
            let mut cut = kept.len();
            for (j, w) in weights.iter().enumerate() {
                if before >= threshold && j > 0 {
                    cut = j;
                    break;
                }
                before += w;
            }
            for &i in &kept[cut..] {
                row[i as usize] = FILTERED;
            }
        }
    }
    if params.min_p > 0.0 {
        let max = row.iter().copied().fold(FILTERED, f32::max);
        let floor = f64::from(max) + params.min_p.ln();
        row.iter_mut()
            .filter(|l| f64::from(**l) < floor)
            .for_each(|l| *l = FILTERED);
    }
}

/// [`process_logits_row`] on a batch: `logits [R, V]` (any float dtype, any device) with one
/// history (prompt and completion so far, for the repetition penalty) per row.
///
/// # Shapes
/// `logits [R, V]`, `histories.len() = R` (or empty: no history) → `[R, V]` f32 on the host,
/// filtered entries −inf.
///
/// # Errors
/// [`Error::Shape`] when `logits` is not rank 2, [`Error::Value`] when `histories` has another
/// length than `R` or `params` is invalid.
///
/// ```
/// use atomrl_sample::{process_logits, SamplingParams};
/// use candle_core::{Device, Tensor};
/// let logits = Tensor::new(&[[0f32, 1.0, 2.0]], &Device::Cpu)?;
/// let p = SamplingParams { min_p: 0.3, ..Default::default() };
/// let out = process_logits(&logits, &p, &[])?.to_vec2::<f32>()?;
/// assert_eq!(out[0], vec![f32::NEG_INFINITY, 1.0, 2.0]); // e^-1 >= 0.3 > e^-2
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn process_logits(
    logits: &Tensor,
    params: &SamplingParams,
    histories: &[Vec<u32>],
) -> Result<Tensor> {
    let func = "process_logits";
    params.validate()?;
    let mut rows = host_rows(func, logits)?;
    check_histories(func, histories, rows.len())?;
    for (r, row) in rows.iter_mut().enumerate() {
        process_logits_row(row, params, histories.get(r).map_or(&[][..], Vec::as_slice));
    }
    let (r, v) = (rows.len(), logits.dim(1).ctx(func)?);
    Tensor::from_vec(rows.concat(), (r, v), &candle_core::Device::Cpu).ctx(func)
}

/// Draws a token from a processed row (the output of [`process_logits_row`]): the first
/// argmax when `greedy`, otherwise a draw from `softmax(row)` over the finite entries (by
/// inverse CDF with one uniform number from `rng`).
///
/// ```
/// use atomrl_sample::{sample_from_processed, RowRng};
/// let row = [f32::NEG_INFINITY, 0.0, f32::NEG_INFINITY];
/// assert_eq!(sample_from_processed(&row, false, &mut RowRng::new(0, 0)), 1);
/// assert_eq!(sample_from_processed(&[1.0, 5.0, 5.0], true, &mut RowRng::new(0, 0)), 1);
/// ```
pub fn sample_from_processed(row: &[f32], greedy: bool, rng: &mut RowRng) -> u32 {
    let best = argmax(row);
    if greedy {
        return best;
    }
    let max = row[best as usize];
    let total: f64 = row.iter().map(|&l| f64::from(l - max).exp()).sum();
    let target = rng.uniform() * total;
    let mut acc = 0.0;
    let mut last_kept = best;
    for (i, &l) in row.iter().enumerate() {
        if l == FILTERED {
            continue;
        }
        acc += f64::from(l - max).exp();
        last_kept = i as u32;
        if acc > target {
            return i as u32;
        }
    }
    last_kept
}

/// Index of the first maximum (0 for an empty row).
pub(crate) fn argmax(row: &[f32]) -> u32 {
    let mut best = 0usize;
    for (i, &l) in row.iter().enumerate() {
        if l > row[best] {
            best = i;
        }
    }
    best as u32
}

/// `log softmax(raw / T)[token]` in f64 (`T = 1` when greedy): the log-probability that
/// `get_action_log_probs(.., temperature)` recomputes, i.e. without penalty or filters.
pub(crate) fn raw_log_prob(raw: &[f32], token: u32, temperature: f64) -> f32 {
    let t = if temperature > 0.0 { temperature } else { 1.0 };
    let max = raw.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let max = f64::from(max);
    let sum: f64 = raw.iter().map(|&l| ((f64::from(l) - max) / t).exp()).sum();
    ((f64::from(raw[token as usize]) - max) / t - sum.ln()) as f32
}

/// Tokens drawn for a batch, with their log-probabilities.
#[derive(Debug, Clone, PartialEq)]
pub struct SampledTokens {
    /// One token per row.
    pub tokens: Vec<u32>,
    /// `log softmax(logits / T)[token]` per row, from the raw logits (no penalty or filter;
    /// `T = 1` when greedy): what `get_action_log_probs` at the same temperature gives.
    pub log_probs: Vec<f32>,
}

/// One sampling step for a batch: [`process_logits_row`] then [`sample_from_processed`] on
/// each row, with each row's own generator.
///
/// # Shapes
/// `logits [R, V]`, `histories.len() ∈ {0, R}`, `rngs.len() = R` → `R` tokens and log-probs.
///
/// # Errors
/// [`Error::Shape`] when `logits` is not rank 2; [`Error::Value`] for an invalid `params` or
/// a `histories` / `rngs` length other than `R`.
///
/// ```
/// use atomrl_sample::{sample_tokens, RowRng, SamplingParams};
/// use candle_core::{Device, Tensor};
/// let logits = Tensor::new(&[[0f32, 9.0, 1.0], [5.0, 0.0, 0.0]], &Device::Cpu)?;
/// let p = SamplingParams { temperature: 0.0, ..Default::default() };
/// let mut rngs = vec![RowRng::new(0, 0), RowRng::new(0, 1)];
/// let out = sample_tokens(&logits, &p, &[], &mut rngs)?;
/// assert_eq!(out.tokens, vec![1, 0]);
/// assert!(out.log_probs[0] < 0.0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn sample_tokens(
    logits: &Tensor,
    params: &SamplingParams,
    histories: &[Vec<u32>],
    rngs: &mut [RowRng],
) -> Result<SampledTokens> {
    let func = "sample_tokens";
    params.validate()?;
    let rows = host_rows(func, logits)?;
    check_histories(func, histories, rows.len())?;
    if rngs.len() != rows.len() {
        return Err(Error::value(
            func,
            "rngs",
            format!("{} generators (one per row)", rows.len()),
            rngs.len(),
        ));
    }
    let mut out = SampledTokens {
        tokens: Vec::with_capacity(rows.len()),
        log_probs: Vec::with_capacity(rows.len()),
    };
    let mut scratch = Vec::new();
    for (r, raw) in rows.iter().enumerate() {
        let history = histories.get(r).map_or(&[][..], Vec::as_slice);
        let (tok, lp) = sample_row(raw, params, history, &mut rngs[r], &mut scratch);
        out.tokens.push(tok);
        out.log_probs.push(lp);
    }
    Ok(out)
}

/// Samples one row from raw logits: `(token, raw log-prob)`; `scratch` is reused between rows.
pub(crate) fn sample_row(
    raw: &[f32],
    params: &SamplingParams,
    history: &[u32],
    rng: &mut RowRng,
    scratch: &mut Vec<f32>,
) -> (u32, f32) {
    let plain = params.is_unfiltered();
    if plain && !params.is_greedy() {
        return sample_plain(raw, params.temperature, rng, scratch);
    }
    let tok = if plain {
        argmax(raw)
    } else {
        scratch.clear();
        scratch.extend_from_slice(raw);
        process_logits_row(scratch, params, history);
        sample_from_processed(scratch, params.is_greedy(), rng)
    };
    (tok, raw_log_prob(raw, tok, params.temperature))
}

/// Unfiltered sampling from `softmax(raw / T)` in one pass over the row: the weights
/// `exp((l − max) / T)` are computed once and serve both the draw and the log-probability.
fn sample_plain(
    raw: &[f32],
    temperature: f64,
    rng: &mut RowRng,
    weights: &mut Vec<f32>,
) -> (u32, f32) {
    let max = raw.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let inv = (1.0 / temperature) as f32;
    weights.clear();
    weights.extend(raw.iter().map(|&l| ((l - max) * inv).exp()));
    let total: f64 = weights.iter().map(|&w| f64::from(w)).sum();
    let target = rng.uniform() * total;
    let mut acc = 0.0;
    let mut tok = argmax(raw) as usize;
    for (i, &w) in weights.iter().enumerate() {
        if w > 0.0 {
            // The last token with weight, should rounding leave `target` unreached.
            tok = i;
        }
        acc += f64::from(w);
        if acc > target && w > 0.0 {
            break;
        }
    }
    let lp = f64::from((raw[tok] - max) * inv) - total.ln();
    (tok as u32, lp as f32)
}

fn host_rows(func: &str, logits: &Tensor) -> Result<Vec<Vec<f32>>> {
    if logits.rank() != 2 {
        return Err(Error::shape(func, "logits", "[R, V]", logits.dims()));
    }
    logits
        .to_dtype(DType::F32)
        .and_then(|t| t.to_vec2::<f32>())
        .ctx(func)
}

fn check_histories(func: &str, histories: &[Vec<u32>], rows: usize) -> Result<()> {
    if !histories.is_empty() && histories.len() != rows {
        return Err(Error::value(
            func,
            "histories",
            format!("0 or {rows} histories (one per row)"),
            histories.len(),
        ));
    }
    Ok(())
}
