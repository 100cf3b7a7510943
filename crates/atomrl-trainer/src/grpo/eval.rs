//! Greedy accuracy on held-out examples.

use atomrl_core::Result;
use atomrl_model::CausalLm;
use atomrl_reward::{correctness_score, is_hard_format, Tags};
use atomrl_sample::{generate_samples, ChatTokenizer, SamplingParams};

use super::prompt::PromptEncoder;
use crate::data::Example;

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
    /// Teacher-forced completion loss (SFT only).
    pub loss: Option<f64>,
}

/// Greedy-decodes every example of `examples` (up to `max_new_tokens`) and scores correctness.
///
/// # Errors
/// Generation or tokenizer failures.
pub fn evaluate(
    model: &CausalLm,
    tokenizer: &ChatTokenizer,
    encoder: &PromptEncoder,
    examples: &[Example],
    max_new_tokens: usize,
) -> Result<EvalResult> {
    let view = model.detached();
    let params = SamplingParams {
        num_generations: 1,
        max_new_tokens,
        temperature: 0.0,
        stop_token_ids: tokenizer.eos_token_ids(),
        ..Default::default()
    };
    let (mut correct, mut formatted, mut length) = (0.0, 0.0, 0.0);
    let mut samples = Vec::new();
    for chunk in examples.chunks(EVAL_BATCH) {
        let prompts = chunk
            .iter()
            .map(|e| encoder.encode(tokenizer, e))
            .collect::<Result<Vec<_>>>()?;
        let ids: Vec<Vec<u32>> = prompts.iter().map(|p| p.ids.clone()).collect();
        let out = generate_samples(&view, &ids, &params, Some(tokenizer))?;
        let texts = tokenizer.decode_completions(&out, &params.stop_strings)?;
        for ((example, text), (prompt, len)) in chunk
            .iter()
            .zip(&texts)
            .zip(prompts.iter().zip(&out.lengths))
        {
            let score = correctness_score(text, &example.ground_truth, &Default::default()) as f64;
            correct += score;
            formatted += f64::from(u8::from(is_hard_format(text, &Tags::default())));
            length += *len as f64;
            if samples.len() < 3 {
                samples.push((prompt.text.clone(), text.clone(), score));
            }
        }
    }
    let n = examples.len().max(1) as f64;
    Ok(EvalResult {
        accuracy: correct / n,
        format_rate: formatted / n,
        mean_length: length / n,
        count: examples.len(),
        samples,
        loss: None,
    })
}
