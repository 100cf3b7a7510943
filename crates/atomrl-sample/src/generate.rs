//! [`generate_samples`]: G sampled completions per prompt, as a [`RolloutBatch`].

use atomrl_core::{profile, CandleContext, Error, Result};
use atomrl_model::CausalLm;
use candle_core::{DType, Device, Tensor};

use crate::chat::ChatTokenizer;
use crate::decoder::{check_prompts, BatchDecoder, CacheMode};
use crate::device_pick::{self, Noise};
use crate::params::SamplingParams;
use crate::process::{sample_row, RowRng};
use crate::rollout::{FinishReason, RolloutBatch};

/// Samples `G = params.num_generations` completions for each prompt with batched KV-cache
/// decoding, and returns them with their masks, lengths, finish reasons and sampling
/// log-probabilities.
///
/// - Rows are prompt-major: row `b·G + g` is completion `g` of prompt `b`
///   (`group_index[row] = b`). Prompts are left-padded and computed once each (the cache is
///   then repeated G times); each step feeds one token per running row.
/// - A row ends when it samples a token of `params.stop_token_ids` (finish reason `eos`;
///   the token is kept, inside the mask), when its decoded text comes to contain a stop
///   string (`stop`; the completion ends with the token that completed the string, which may
///   span several tokens), or after `max_new_tokens` tokens (`length`). Finished rows are
///   dropped from the running batch and its KV cache.
/// - Sampling: see [`process_logits_row`](crate::process_logits_row) (temperature 0 =
///   greedy). On the CPU, row `r` draws from its own generator
///   [`RowRng::new(seed, r)`](RowRng), so the same seed gives the same completions, whatever
///   else runs in the batch. On a GPU, unfiltered sampling (no top-k, top-p, min-p or
///   repetition penalty) draws on the device by Gumbel-max, so that only the sampled ids
///   cross to the host each step, with Philox4x32-10 noise keyed by `seed` and indexed by the
///   row's index in the call, the step and the token (made inside AtomRL's CUDA kernel): a
///   row's draws do not depend on which other rows are still decoding, and the same seed
///   gives the same completions, up to the logits' rounding on that device. (With
///   `ATOMRL_CUDA_FUSED=0` the noise comes from the device's generator seeded with `seed`:
///   the same completions for the same batch.)
/// - `sampling_log_probs`: `log softmax(logits / T)` of the sampled token under the raw
///   logits (no repetition penalty, no top-k/top-p/min-p truncation; `T = 1` when greedy),
///   which is what `get_action_log_probs(model, ids, mask, T, temperature)` recomputes.
/// - Padding id: `stop_decoder`'s pad id, else 0.
///
/// The model is used through an inference view ([`CausalLm::generation_view`]): no backward
/// graph is recorded (and on a GPU, RMSNorm, softmax and RoPE run candle's fused kernels).
///
/// # Shapes
/// `B` prompts of any lengths → a [`RolloutBatch`] of `R = B·G` rows: `prompt_ids [R, P]`,
/// `completion_ids [R, T]` with `T ≤ max_new_tokens` the longest completion.
///
/// # Errors
/// [`Error::Value`] for invalid `params` (naming the field), no prompts, an empty prompt or
/// a token id outside the vocabulary (`prompts[b][j]`); [`Error::Missing`] when
/// `stop_strings` is non-empty and no `stop_decoder` is given; model errors otherwise.
///
/// ```
/// use atomrl_model::CausalLm;
/// use atomrl_sample::{generate_samples, FinishReason, SamplingParams};
/// use candle_core::{DType, Device};
/// let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/reference/models/tiny-qwen2");
/// let model = CausalLm::from_hf_dir(dir, DType::F32, &Device::Cpu)?;
/// let params = SamplingParams { num_generations: 3, max_new_tokens: 5, seed: 1, ..Default::default() };
/// let out = generate_samples(&model, &[vec![1, 20, 30], vec![1, 40]], &params, None)?;
/// assert_eq!(out.completion_ids.dims()[0], 6);
/// assert_eq!(out.group_index, vec![0, 0, 0, 1, 1, 1]);
/// assert!(out.finish_reasons.iter().all(|r| *r == FinishReason::Length));
/// let again = generate_samples(&model, &[vec![1, 20, 30], vec![1, 40]], &params, None)?;
/// assert_eq!(out.completion_rows()?, again.completion_rows()?);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn generate_samples(
    model: &CausalLm,
    prompts: &[Vec<u32>],
    params: &SamplingParams,
    stop_decoder: Option<&ChatTokenizer>,
) -> Result<RolloutBatch> {
    generate_samples_with(model, prompts, params, stop_decoder, CacheMode::KvCache)
}

/// [`generate_samples`] with a choice of [`CacheMode`]: `Recompute` is the no-cache baseline
/// (each step re-runs the whole sequence) and gives the same completions up to float rounding.
///
/// # Errors
/// As [`generate_samples`].
///
/// ```
/// use atomrl_model::CausalLm;
/// use atomrl_sample::{generate_samples, generate_samples_with, CacheMode, SamplingParams};
/// use candle_core::{DType, Device};
/// # let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/reference/models/tiny-qwen2");
/// let model = CausalLm::from_hf_dir(dir, DType::F32, &Device::Cpu)?;
/// let p = SamplingParams { temperature: 0.0, max_new_tokens: 4, ..Default::default() };
/// let a = generate_samples(&model, &[vec![1, 7, 8]], &p, None)?;
/// let b = generate_samples_with(&model, &[vec![1, 7, 8]], &p, None, CacheMode::Recompute)?;
/// assert_eq!(a.completion_rows()?, b.completion_rows()?);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn generate_samples_with(
    model: &CausalLm,
    prompts: &[Vec<u32>],
    params: &SamplingParams,
    stop_decoder: Option<&ChatTokenizer>,
    mode: CacheMode,
) -> Result<RolloutBatch> {
    generate(model, prompts, params, stop_decoder, mode, false)
}

/// The most sequences one call decodes at once (prompts × `num_generations`). Every row has
/// host buffers and a KV cache from the first step, so a count past this is a typo that would
/// end in an allocation failure (an abort) rather than an error; the trainer's configuration
/// bounds a step's rows by it too (`atomrl_config::MAX_STEP_ROWS`).
pub const MAX_ROWS: usize = 1 << 20;

/// `prompts × num_generations` within [`MAX_ROWS`].
fn check_rows(func: &str, prompts: usize, num_generations: usize) -> Result<()> {
    match prompts.checked_mul(num_generations) {
        Some(rows) if rows <= MAX_ROWS => Ok(()),
        rows => Err(Error::value(
            func,
            "num_generations",
            format!("at most {MAX_ROWS} sequences in all (prompts × num_generations)"),
            format!(
                "{num_generations} for {prompts} prompt(s): {} sequences",
                rows.map_or("more than usize holds".to_string(), |r| r.to_string())
            ),
        )),
    }
}

/// The decoding loop. Tokens are drawn on the model's device when
/// [`device_pick::applies`] (a GPU, unfiltered sampling), or when `force_device_pick` is set
/// (tests of that path on the CPU; only for unfiltered `params`), else on the host.
fn generate(
    model: &CausalLm,
    prompts: &[Vec<u32>],
    params: &SamplingParams,
    stop_decoder: Option<&ChatTokenizer>,
    mode: CacheMode,
    force_device_pick: bool,
) -> Result<RolloutBatch> {
    let func = "generate_samples";
    debug_assert!(!force_device_pick || params.is_unfiltered());
    params.validate()?;
    check_prompts(func, prompts, model.config().vocab_size)?;
    check_rows(func, prompts.len(), params.num_generations)?;
    let stops = stop_strings(func, params, stop_decoder)?;
    let pad_id = stop_decoder.map_or(0, ChatTokenizer::pad_token_id);
    let g = params.num_generations;
    let view = model.generation_view_for(prompts.len() * g);
    let mut decoder = BatchDecoder::new(&view, mode).with_max_new_tokens(params.max_new_tokens);
    let mut logits = {
        let _p = profile::phase("decode.prefill", view.device());
        decoder.prefill(prompts, g)?
    };
    let mut rows = Rows::new(prompts, params);
    let mut device_noise = (force_device_pick || device_pick::applies(params, view.device()))
        .then(|| Noise::for_device(view.device(), params.seed));
    loop {
        let active = decoder.active_rows().to_vec();
        let pick_phase = profile::phase("decode.pick", view.device());
        let picks: Vec<(u32, f32)> = match device_noise.as_mut() {
            Some(noise) => {
                let (tokens, lps) = device_pick::pick(&logits, params.temperature, noise, &active)?;
                tokens.into_iter().zip(lps).collect()
            }
            None => rows.pick_on_host(&logits, &active, params, model.config().vocab_size)?,
        };
        drop(pick_phase);
        let (keep, next) = rows.record(&active, picks, params, stops.as_ref())?;
        if keep.is_empty() {
            break;
        }
        let _p = profile::phase("decode.step", view.device());
        decoder.retain(&keep)?;
        logits = decoder.step(&next)?;
    }
    assemble(
        prompts,
        g,
        pad_id,
        rows.completions,
        rows.log_probs,
        rows.finish,
        model.device(),
    )
}

/// The stop-string detector of `params` (`None` without stop strings).
fn stop_strings<'a>(
    func: &str,
    params: &'a SamplingParams,
    stop_decoder: Option<&'a ChatTokenizer>,
) -> Result<Option<StopStrings<'a>>> {
    match (params.stop_strings.is_empty(), stop_decoder) {
        (true, _) => Ok(None),
        (false, Some(tok)) => Ok(Some(StopStrings::new(&params.stop_strings, tok))),
        (false, None) => Err(Error::missing(
            func,
            "stop_decoder",
            "a tokenizer to decode completions for `stop_strings`",
        )),
    }
}

/// What the decoding loop keeps per row: the tokens so far, their log-probs, why each row
/// stopped, and the host sampler's state (generators, repetition histories, scratch).
struct Rows {
    completions: Vec<Vec<u32>>,
    log_probs: Vec<Vec<f32>>,
    finish: Vec<FinishReason>,
    rngs: Vec<RowRng>,
    /// Prompt and completion tokens of each row (only with a repetition penalty).
    histories: Vec<Vec<u32>>,
    scratch: Vec<f32>,
}

impl Rows {
    fn new(prompts: &[Vec<u32>], params: &SamplingParams) -> Self {
        let g = params.num_generations;
        let r_total = prompts.len() * g;
        Self {
            completions: vec![Vec::new(); r_total],
            log_probs: vec![Vec::new(); r_total],
            finish: vec![FinishReason::Length; r_total],
            rngs: (0..r_total).map(|r| RowRng::new(params.seed, r)).collect(),
            histories: if params.repetition_penalty != 1.0 {
                (0..r_total).map(|r| prompts[r / g].clone()).collect()
            } else {
                Vec::new()
            },
            scratch: Vec::new(),
        }
    }

    /// The next token and its log-prob of each `active` row, drawn on the host from `logits`
    /// `[active, V]`.
    fn pick_on_host(
        &mut self,
        logits: &candle_core::Tensor,
        active: &[usize],
        params: &SamplingParams,
        vocab: usize,
    ) -> Result<Vec<(u32, f32)>> {
        let flat = logits
            .to_dtype(DType::F32)
            .and_then(|t| t.flatten_all())
            .and_then(|t| t.to_vec1::<f32>())
            .ctx("generate_samples")?;
        let mut picks = Vec::with_capacity(active.len());
        for (&row, raw) in active.iter().zip(flat.chunks(vocab)) {
            let history = self.histories.get(row).map_or(&[][..], Vec::as_slice);
            picks.push(sample_row(
                raw,
                params,
                history,
                &mut self.rngs[row],
                &mut self.scratch,
            ));
        }
        Ok(picks)
    }

    /// Appends each active row's pick; returns the positions (in `active`) of the rows that go
    /// on and their tokens.
    fn record(
        &mut self,
        active: &[usize],
        picks: Vec<(u32, f32)>,
        params: &SamplingParams,
        stops: Option<&StopStrings<'_>>,
    ) -> Result<(Vec<usize>, Vec<u32>)> {
        let mut keep = Vec::with_capacity(active.len());
        let mut next = Vec::with_capacity(active.len());
        for (a, (&row, (tok, lp))) in active.iter().zip(picks).enumerate() {
            self.completions[row].push(tok);
            self.log_probs[row].push(lp);
            if let Some(h) = self.histories.get_mut(row) {
                h.push(tok);
            }
            let reason = if params.stop_token_ids.contains(&tok) {
                Some(FinishReason::Eos)
            } else {
                match stops {
                    Some(s) if s.hit(&self.completions[row])? => Some(FinishReason::Stop),
                    _ => None,
                }
            };
            match reason {
                Some(r) => self.finish[row] = r,
                None if self.completions[row].len() >= params.max_new_tokens => {
                    self.finish[row] = FinishReason::Length
                }
                None => {
                    keep.push(a);
                    next.push(tok);
                }
            }
        }
        Ok((keep, next))
    }
}

/// Detects stop strings at the end of a completion by decoding only its last tokens.
struct StopStrings<'a> {
    strings: &'a [String],
    tokenizer: &'a ChatTokenizer,
    window: usize,
}

impl<'a> StopStrings<'a> {
    fn new(strings: &'a [String], tokenizer: &'a ChatTokenizer) -> Self {
        // Every (non-special) byte-level token decodes to at least one byte, so a stop string
        // of n bytes that ends in the newest token lies within its last n tokens; a few more
        // cover a UTF-8 character split across tokens at the window's start.
        let window = strings.iter().map(String::len).max().unwrap_or(0) + 4;
        Self {
            strings,
            tokenizer,
            window,
        }
    }

    /// Whether the completion's text now contains a stop string (it did not one token ago,
    /// or decoding would have stopped there).
    fn hit(&self, completion: &[u32]) -> Result<bool> {
        let start = completion.len().saturating_sub(self.window);
        let text = self.tokenizer.decode(&completion[start..], true)?;
        Ok(self.strings.iter().any(|s| text.contains(s.as_str())))
    }
}

fn assemble(
    prompts: &[Vec<u32>],
    g: usize,
    pad_id: u32,
    completions: Vec<Vec<u32>>,
    log_probs: Vec<Vec<f32>>,
    finish_reasons: Vec<FinishReason>,
    dev: &Device,
) -> Result<RolloutBatch> {
    let func = "generate_samples";
    let r = completions.len();
    let p = prompts.iter().map(Vec::len).max().unwrap_or(0);
    let t = completions.iter().map(Vec::len).max().unwrap_or(0);
    let mut prompt_ids = Vec::with_capacity(r * p);
    let mut prompt_mask = Vec::with_capacity(r * p);
    for row in 0..r {
        let x = &prompts[row / g];
        let pad = p - x.len();
        prompt_ids.extend(std::iter::repeat_n(pad_id, pad));
        prompt_ids.extend_from_slice(x);
        prompt_mask.extend(std::iter::repeat_n(0f32, pad));
        prompt_mask.extend(std::iter::repeat_n(1f32, x.len()));
    }
    let mut ids = vec![pad_id; r * t];
    let mut mask = vec![0f32; r * t];
    let mut lps = vec![0f32; r * t];
    for (row, (c, lp)) in completions.iter().zip(&log_probs).enumerate() {
        ids[row * t..row * t + c.len()].copy_from_slice(c);
        mask[row * t..row * t + c.len()]
            .iter_mut()
            .for_each(|m| *m = 1.0);
        lps[row * t..row * t + lp.len()].copy_from_slice(lp);
    }
    let lengths: Vec<usize> = completions.iter().map(Vec::len).collect();
    Ok(RolloutBatch {
        prompt_ids: Tensor::from_vec(prompt_ids, (r, p), dev).ctx(func)?,
        prompt_mask: Tensor::from_vec(prompt_mask, (r, p), dev).ctx(func)?,
        completion_ids: Tensor::from_vec(ids, (r, t), dev).ctx(func)?,
        completion_mask: Tensor::from_vec(mask, (r, t), dev).ctx(func)?,
        num_generated_tokens: lengths.iter().sum(),
        lengths,
        finish_reasons,
        sampling_log_probs: Tensor::from_vec(lps, (r, t), dev).ctx(func)?,
        group_index: (0..r).map(|row| row / g).collect(),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn model() -> CausalLm {
        let dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/fixtures/reference/models/tiny-qwen2"
        );
        CausalLm::from_hf_dir(dir, DType::F32, &Device::Cpu).unwrap()
    }

    #[test]
    fn a_call_of_more_sequences_than_max_rows_is_refused_before_decoding() {
        let p = SamplingParams {
            num_generations: MAX_ROWS / 2 + 1,
            ..Default::default()
        };
        let e = generate_samples(&model(), &[vec![1], vec![2]], &p, None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`num_generations`") && e.contains(&format!("{} sequences", MAX_ROWS + 2)),
            "{e}"
        );
        assert!(check_rows("f", usize::MAX, 2)
            .unwrap_err()
            .to_string()
            .contains("more than usize holds"));
        assert!(check_rows("f", 1, MAX_ROWS).is_ok());
    }

    fn run(params: &SamplingParams, on_device: bool) -> RolloutBatch {
        let prompts = vec![vec![1, 20, 30], vec![40]];
        generate(
            &model(),
            &prompts,
            params,
            None,
            CacheMode::KvCache,
            on_device,
        )
        .unwrap()
    }

    /// The device path's log-probs are what `get_action_log_probs` recomputes from one full
    /// forward over the sampled sequences.
    fn assert_log_probs_match_a_full_forward(out: &RolloutBatch, temperature: f64) {
        let (ids, mask) = out.full_sequences().unwrap();
        let t = out.completion_ids.dims()[1];
        let temperature = if temperature > 0.0 { temperature } else { 1.0 };
        let want =
            atomrl_logprob::get_action_log_probs(&model(), &ids, &mask, t, temperature, false)
                .unwrap()
                .log_probs;
        let d = (&out.sampling_log_probs - want)
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        assert!(d < 1e-4, "max |log-prob difference| {d}");
    }

    #[test]
    fn greedy_on_the_device_path_equals_the_host_path() {
        let p = SamplingParams {
            temperature: 0.0,
            max_new_tokens: 6,
            num_generations: 2,
            ..Default::default()
        };
        let (host, device) = (run(&p, false), run(&p, true));
        assert_eq!(
            host.completion_rows().unwrap(),
            device.completion_rows().unwrap()
        );
        assert_log_probs_match_a_full_forward(&device, 0.0);
    }

    #[test]
    fn sampling_on_the_device_path_reports_the_log_probs_of_its_draws() {
        let p = SamplingParams {
            temperature: 0.8,
            max_new_tokens: 6,
            num_generations: 3,
            seed: 5,
            stop_token_ids: vec![3],
            ..Default::default()
        };
        let out = run(&p, true);
        assert_eq!(out.num_rows(), 6);
        assert_log_probs_match_a_full_forward(&out, 0.8);
        // Seeded: the same draws again.
        assert_eq!(
            out.completion_rows().unwrap(),
            run(&p, true).completion_rows().unwrap()
        );
    }

    /// On the device path a row's noise follows its index in the call and the step, not its
    /// place in the running batch: rows 0-2 (prompt A) draw the same completions with or
    /// without prompt B's rows after them (a batch-wide stream would give them other numbers
    /// from the second step on).
    #[test]
    fn a_row_draws_the_same_completion_on_the_device_path_whatever_follows_it() {
        let model = model();
        let p = SamplingParams {
            temperature: 1.0,
            max_new_tokens: 6,
            num_generations: 3,
            seed: 8,
            ..Default::default()
        };
        let a = vec![1u32, 5, 6];
        let gen = |prompts: &[Vec<u32>]| {
            generate(&model, prompts, &p, None, CacheMode::KvCache, true)
                .unwrap()
                .completion_rows()
                .unwrap()
        };
        let alone = gen(std::slice::from_ref(&a));
        let with_b = gen(&[a, vec![1, 7]]);
        assert_eq!(alone[..], with_b[..3]);
    }
}
