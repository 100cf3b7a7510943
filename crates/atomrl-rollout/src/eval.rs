//! Greedy accuracy on held-out examples.

use atomrl_core::Result;
use atomrl_model::CausalLm;
use atomrl_reward::{is_hard_format, Accuracy, Tags};
use atomrl_sample::{generate_rows, ChatTokenizer, SamplingParams, ToolUse};

use crate::parallel::{dist_error, run_shards, split_even};
use crate::prompt::PromptEncoder;
use atomrl_data::Example;
use atomrl_dist::Collective;

use crate::rollout::reward_context;

/// Prompts per generation call during evaluation.
const EVAL_BATCH: usize = 64;

/// Results of one evaluation.
#[derive(Debug, Clone, PartialEq)]
pub struct EvalResult {
    /// Share of examples answered right (greedy decoding).
    pub accuracy: f64,
    /// Share of completions in the exact `<think>…</think><answer>…</answer>` format.
    pub format_rate: f64,
    /// Mean completion length in tokens.
    pub mean_length: f64,
    /// Examples evaluated.
    pub count: usize,
    /// A few (prompt, completion, correct) triples for the log.
    pub samples: Vec<(String, String, f64)>,
    /// The recipe's held-out loss: SFT's teacher-forced completion loss, the pairs' DPO or
    /// reward-model loss.
    pub loss: Option<f64>,
    /// Share of held-out preference pairs ranked right (DPO's implicit rewards, a reward
    /// model's scores).
    pub pair_accuracy: Option<f64>,
    /// A reward model's held-out scores: their standard deviation over both sides of every
    /// pair.
    pub score_std: Option<f64>,
    /// With tools: mean tool calls per completion.
    pub tool_calls: Option<f64>,
    /// With tools: the share of calls that failed.
    pub tool_error_rate: Option<f64>,
}

impl EvalResult {
    /// The result of an evaluation that decoded nothing (a reward model's run evaluates its
    /// held-out pairs only): NaN rates, no example, no loss.
    ///
    /// ```
    /// let r = atomrl_rollout::EvalResult::without_generation();
    /// assert!(r.accuracy.is_nan() && r.count == 0 && r.loss.is_none());
    /// ```
    pub fn without_generation() -> Self {
        Self {
            accuracy: f64::NAN,
            format_rate: f64::NAN,
            mean_length: f64::NAN,
            count: 0,
            samples: Vec::new(),
            loss: None,
            pair_accuracy: None,
            score_std: None,
            tool_calls: None,
            tool_error_rate: None,
        }
    }
}

/// What an evaluation decodes and scores.
pub struct EvalData<'a> {
    /// The policy (decoded through a detached view).
    pub model: &'a CausalLm,
    /// Its tokenizer.
    pub tokenizer: &'a ChatTokenizer,
    /// How examples become prompts.
    pub encoder: &'a PromptEncoder,
    /// The held-out examples.
    pub examples: &'a [Example],
    /// Completion length limit.
    pub max_new_tokens: usize,
    /// The tools the model may call (`None`: single-turn).
    pub tools: Option<ToolUse<'a>>,
    /// Which completions count as correct.
    pub accuracy: &'a Accuracy,
}

/// Greedy-decodes every example (up to `max_new_tokens`; with `tools`, each completion may
/// call them and its final model turn is scored) and counts the correct ones by the
/// configured [`Accuracy`]. The examples are split into `workers × W` shards (`W` ranks of
/// `comm`, every rank calling with the same data), rank `r` decoding shards `r·workers ..`
/// on its worker threads; the shards' counts are all-gathered and summed in shard order, so
/// every rank gets the result one process of `workers × W` workers computes (its samples come
/// from this rank's shards). Decoding is greedy, so counts differ between shardings only where
/// the different padding of the generation batches changes float rounding enough to flip an
/// argmax.
///
/// # Errors
/// Generation, tokenizer or accuracy-reward failures; a failed collective.
pub fn evaluate(d: &EvalData<'_>, workers: usize, comm: &dyn Collective) -> Result<EvalResult> {
    let workers = workers.max(1);
    let shards = split_even(d.examples.len(), workers * comm.world_size());
    let mine: Vec<usize> = (0..shards.len())
        .filter(|s| s / workers == comm.rank())
        .collect();
    let parts = run_shards("evaluate", mine.len(), |i| {
        score_greedy(d, &d.examples[shards[mine[i]].clone()])
    })?;
    let mut total = Tally::default();
    for p in &parts {
        total.samples.extend(
            p.samples
                .iter()
                .take(3usize.saturating_sub(total.samples.len()))
                .cloned(),
        );
    }
    let counts: Vec<f64> = parts.iter().flat_map(Tally::counts).collect();
    let all = if comm.world_size() > 1 {
        let gathered = comm
            .all_gather_f64(&counts)
            .map_err(|e| dist_error("evaluate", e))?;
        gathered.concat()
    } else {
        counts
    };
    for c in all.chunks_exact(5) {
        total.correct += c[0];
        total.formatted += c[1];
        total.length += c[2];
        total.calls += c[3];
        total.failed_calls += c[4];
    }
    let n = d.examples.len().max(1) as f64;
    Ok(EvalResult {
        accuracy: total.correct / n,
        format_rate: total.formatted / n,
        mean_length: total.length / n,
        count: d.examples.len(),
        samples: total.samples,
        loss: None,
        pair_accuracy: None,
        score_std: None,
        tool_calls: d.tools.map(|_| total.calls / n),
        tool_error_rate: d.tools.map(|_| total.failed_calls / total.calls.max(1.0)),
    })
}

/// Sums over a shard of examples.
#[derive(Default)]
struct Tally {
    correct: f64,
    formatted: f64,
    length: f64,
    calls: f64,
    failed_calls: f64,
    samples: Vec<(String, String, f64)>,
}

impl Tally {
    /// The counts, in the order [`evaluate`] sums them.
    fn counts(&self) -> [f64; 5] {
        [
            self.correct,
            self.formatted,
            self.length,
            self.calls,
            self.failed_calls,
        ]
    }
}

fn score_greedy(d: &EvalData<'_>, examples: &[Example]) -> Result<Tally> {
    let (model, tokenizer, encoder) = (d.model, d.tokenizer, d.encoder);
    let view = model.detached();
    let params = SamplingParams {
        num_generations: 1,
        max_new_tokens: d.max_new_tokens,
        temperature: 0.0,
        stop_token_ids: tokenizer.eos_token_ids(),
        ..Default::default()
    };
    let mut t = Tally::default();
    for chunk in examples.chunks(EVAL_BATCH) {
        let prompts = chunk
            .iter()
            .map(|e| encoder.encode(tokenizer, e))
            .collect::<Result<Vec<_>>>()?;
        let ids: Vec<Vec<u32>> = prompts.iter().map(|p| p.ids.clone()).collect();
        let (rows, _) = generate_rows(&view, tokenizer, &ids, &params, d.tools)?;
        let correct = d.accuracy.correct(
            &rows.iter().map(|r| r.answer.clone()).collect::<Vec<_>>(),
            &reward_context(
                &rows,
                chunk.iter().map(|e| e.ground_truth.clone()).collect(),
                prompts.iter().map(|p| p.text.clone()).collect(),
                &params,
                d.tools,
            ),
        )?;
        for ((row, prompt), &score) in rows.iter().zip(&prompts).zip(&correct) {
            let text = &row.answer;
            let score = f64::from(score);
            t.correct += score;
            t.formatted += f64::from(u8::from(is_hard_format(text, &Tags::default())));
            t.length += row.completion_ids.len() as f64;
            if let Some(traj) = &row.trajectory {
                t.calls += traj.tool_calls.len() as f64;
                t.failed_calls += traj.num_failed_calls() as f64;
            }
            if t.samples.len() < 3 {
                t.samples
                    .push((prompt.text.clone(), row.text.clone(), score));
            }
        }
    }
    Ok(t)
}
