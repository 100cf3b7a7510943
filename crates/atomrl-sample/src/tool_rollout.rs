//! [`generate_with_tools`]: multi-turn rollouts that pause at tool calls, run the tools and
//! go on generating after the tool responses.

use atomrl_core::{CandleContext, Error, Result, ToolCallRecord};
use atomrl_model::CausalLm;
use atomrl_tools::{parse_tool_calls, ToolSet};
use serde_json::Value as Json;

use crate::chat::ChatTokenizer;
use crate::generate::generate_samples;
use crate::params::SamplingParams;
use crate::rollout::FinishReason;
use crate::trajectory::{ToolRolloutBatch, ToolTrajectory};

/// The most tool turns a trajectory may have ([`generate_with_tools`]'s `max_tool_turns`).
pub const MAX_TOOL_TURNS_LIMIT: usize = 64;

/// Samples `G = params.num_generations` multi-turn completions per prompt, running `tools`
/// whenever the model calls one.
///
/// Each row alternates model turns and tool turns:
/// 1. The model generates until a stop token (the chat template's end of turn) or a stop
///    string, as in [`generate_samples`].
/// 2. The turn's `<tool_call>{"name": …, "arguments": {…}}</tool_call>` blocks (Qwen2.5 /
///    Qwen3 / Hermes format) are parsed and run by [`ToolSet::run_calls`]: a bad call (bad
///    JSON, an unknown tool, wrong arguments, a tool error, a timeout) becomes an `error: …`
///    response, never a failure of the rollout. A turn without calls ends the row.
/// 3. The responses are rendered by the model's chat template as tool messages
///    ([`ChatTokenizer::tool_turn_text`], with the next generation prompt), tokenized and
///    appended as context: those tokens have `model_token = false` and log-prob 0.
/// 4. After `max_tool_turns` tool turns, a row that calls again ends there
///    (`stopped_at_max_turns`).
///
/// `params.max_new_tokens` bounds the whole continuation, tool turns included: a row whose
/// tool response would not fit ends with [`FinishReason::Length`] before it.
///
/// Batching: turn `k` of every row that is still going is generated as one batch (rows that
/// finished drop out of it), so a row waits for a tool at most until the other rows of its
/// turn are done. Each continuation turn recomputes its context (prompt and earlier turns)
/// in one prefill: there is no cache reuse across turns. Turn 0 samples exactly as
/// `generate_samples(model, prompts, params, ..)`; turn `k` with a seed derived from
/// `(params.seed, k)`.
///
/// # Shapes
/// `B` prompts → [`ToolRolloutBatch`] of `R = B·G` trajectories (a trainer pads them, with
/// their `model_token` loss masks, into an `atomrl_rollout::Experience`).
///
/// # Errors
/// As [`generate_samples`]; [`Error::Value`] for `max_tool_turns` above
/// [`MAX_TOOL_TURNS_LIMIT`]; template errors of [`ChatTokenizer::tool_turn_text`].
///
/// ```
/// use atomrl_model::CausalLm;
/// use atomrl_sample::{generate_with_tools, ChatMessage, ChatTokenizer, SamplingParams};
/// use atomrl_tools::ToolSet;
/// use candle_core::{DType, Device};
/// let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/reference/models/tiny-qwen2");
/// let model = CausalLm::from_hf_dir(dir, DType::F32, &Device::Cpu)?;
/// let tok = ChatTokenizer::from_hf_dir(dir)?;
/// let tools = ToolSet::from_names(&["calculator"])?;
/// let messages = [ChatMessage::user("What is 6 * 7?")];
/// let text = tok.apply_chat_template_with_tools(&messages, &tools.schemas(), true)?;
/// let prompt = tok.encode(&text, false)?;
/// let params = SamplingParams {
///     num_generations: 2, max_new_tokens: 6, stop_token_ids: tok.eos_token_ids(), seed: 3,
///     ..Default::default()
/// };
/// let out = generate_with_tools(&model, &tok, &[prompt], &params, &tools, 2)?;
/// assert_eq!(out.num_rows(), 2);
/// let traj = &out.trajectories[0];
/// assert!(traj.completion_ids.len() <= 6);
/// assert_eq!(traj.num_failed_calls(), 0); // a random model makes no call
/// assert_eq!(traj.model_token.len(), traj.completion_ids.len());
/// assert_eq!(out.prompt_of(1), out.prompts[0].as_slice());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn generate_with_tools(
    model: &CausalLm,
    tokenizer: &ChatTokenizer,
    prompts: &[Vec<u32>],
    params: &SamplingParams,
    tools: &ToolSet,
    max_tool_turns: usize,
) -> Result<ToolRolloutBatch> {
    run_turns(
        tokenizer,
        prompts,
        params,
        tools,
        max_tool_turns,
        |contexts, p| {
            let out = generate_samples(model, contexts, p, Some(tokenizer))?;
            let ids = out.completion_rows()?;
            let lps = out
                .sampling_log_probs
                .to_vec2::<f32>()
                .ctx("generate_with_tools")?;
            Ok(ids
                .into_iter()
                .zip(lps)
                .zip(out.finish_reasons)
                .map(|((ids, mut lps), finish)| {
                    lps.truncate(ids.len());
                    Turn {
                        ids,
                        log_probs: lps,
                        finish,
                    }
                })
                .collect())
        },
    )
}

/// One model turn of one row.
#[derive(Debug, Clone)]
pub(crate) struct Turn {
    pub(crate) ids: Vec<u32>,
    pub(crate) log_probs: Vec<f32>,
    pub(crate) finish: FinishReason,
}

/// The turn loop of [`generate_with_tools`], over any turn generator (`generate(contexts,
/// params)` returns one [`Turn`] per context and generation), so that tests can script the
/// model's turns.
pub(crate) fn run_turns<F>(
    tokenizer: &ChatTokenizer,
    prompts: &[Vec<u32>],
    params: &SamplingParams,
    tools: &ToolSet,
    max_tool_turns: usize,
    mut generate: F,
) -> Result<ToolRolloutBatch>
where
    F: FnMut(&[Vec<u32>], &SamplingParams) -> Result<Vec<Turn>>,
{
    let func = "generate_with_tools";
    if max_tool_turns > MAX_TOOL_TURNS_LIMIT {
        return Err(Error::value(
            func,
            "max_tool_turns",
            format!("at most {MAX_TOOL_TURNS_LIMIT}"),
            max_tool_turns,
        ));
    }
    params.validate()?;
    let g = params.num_generations;
    let budget = params.max_new_tokens;
    let schemas = tools.schemas();
    let mut trajectories: Vec<ToolTrajectory> = generate(prompts, params)?
        .into_iter()
        .map(ToolTrajectory::first_turn)
        .collect();
    let mut generated: usize = trajectories.iter().map(|t| t.completion_ids.len()).sum();
    let mut active: Vec<usize> = (0..trajectories.len()).collect();
    for turn in 1..=max_tool_turns {
        let mut next = Vec::new();
        for &row in &active {
            if add_tool_turn(&mut trajectories[row], tokenizer, tools, &schemas, budget)? {
                next.push(row);
            }
        }
        active = next;
        if active.is_empty() {
            break;
        }
        let contexts: Vec<Vec<u32>> = active
            .iter()
            .map(|&row| {
                [
                    prompts[row / g].as_slice(),
                    &trajectories[row].completion_ids,
                ]
                .concat()
            })
            .collect();
        let room: Vec<usize> = active
            .iter()
            .map(|&row| budget - trajectories[row].completion_ids.len())
            .collect();
        let turn_params = SamplingParams {
            num_generations: 1,
            max_new_tokens: room.iter().copied().max().unwrap_or(1),
            seed: turn_seed(params.seed, turn),
            ..params.clone()
        };
        let turns = generate(&contexts, &turn_params)?;
        for ((&row, t), &room) in active.iter().zip(turns).zip(&room) {
            generated += trajectories[row].push_model_turn(t, room);
        }
    }
    for &row in &active {
        mark_unanswered_calls(&mut trajectories[row], tokenizer)?;
    }
    Ok(ToolRolloutBatch {
        prompts: prompts.to_vec(),
        num_generations: g,
        trajectories,
        num_generated_tokens: generated,
    })
}

impl ToolTrajectory {
    /// A trajectory of one model turn (the first).
    fn first_turn(turn: Turn) -> Self {
        Self {
            model_token: vec![true; turn.ids.len()],
            sampling_log_probs: turn.log_probs,
            completion_ids: turn.ids,
            finish_reason: turn.finish,
            calls: Vec::new(),
            turn_starts: vec![0],
            stopped_at_max_turns: false,
        }
    }

    /// Appends a model turn, cut to the `room` left in the token budget (then it ends at the
    /// length limit); returns its tokens.
    fn push_model_turn(&mut self, mut t: Turn, room: usize) -> usize {
        if t.ids.len() > room {
            t.ids.truncate(room);
            t.log_probs.truncate(room);
            t.finish = FinishReason::Length;
        }
        let n = t.ids.len();
        self.turn_starts.push(self.completion_ids.len());
        self.model_token.extend(std::iter::repeat_n(true, n));
        self.completion_ids.extend(t.ids);
        self.sampling_log_probs.extend(t.log_probs);
        self.finish_reason = t.finish;
        n
    }
}

/// Runs the calls of the row's last model turn and appends the tool turn; returns whether the
/// row goes on (it made calls, and their responses fit in the budget).
fn add_tool_turn(
    traj: &mut ToolTrajectory,
    tokenizer: &ChatTokenizer,
    tools: &ToolSet,
    schemas: &[Json],
    budget: usize,
) -> Result<bool> {
    if traj.finish_reason == FinishReason::Length {
        return Ok(false);
    }
    let text = tokenizer.decode(traj.final_turn(), true)?;
    let outcomes = tools.run_calls(&text);
    if outcomes.is_empty() {
        return Ok(false);
    }
    let responses: Vec<String> = outcomes.iter().map(|o| o.output.clone()).collect();
    // From here on a call is one record, the one rewards, metrics and logs read.
    traj.calls.extend(outcomes.into_iter().map(|o| {
        let failed = o.is_error();
        ToolCallRecord::new(o.name.as_deref(), o.raw, o.output, failed)
    }));
    let mut turn_text = tokenizer.tool_turn_text(&responses, schemas)?;
    // The template's end of the assistant turn starts with the stop token the model already
    // generated: append only what follows it.
    if traj.finish_reason == FinishReason::Eos {
        if let Some(&last) = traj.completion_ids.last() {
            let eos_text = tokenizer.decode(&[last], false)?;
            if let Some(rest) = turn_text.strip_prefix(eos_text.as_str()) {
                turn_text = rest.to_string();
            }
        }
    }
    let ids = tokenizer.encode(&turn_text, false)?;
    if traj.completion_ids.len() + ids.len() >= budget {
        traj.finish_reason = FinishReason::Length;
        return Ok(false);
    }
    traj.model_token
        .extend(std::iter::repeat_n(false, ids.len()));
    traj.sampling_log_probs
        .extend(std::iter::repeat_n(0f32, ids.len()));
    traj.completion_ids.extend(ids);
    Ok(true)
}

/// After the last allowed tool turn: a final turn that still calls a tool is left unanswered.
fn mark_unanswered_calls(traj: &mut ToolTrajectory, tokenizer: &ChatTokenizer) -> Result<()> {
    if traj.finish_reason != FinishReason::Length {
        let text = tokenizer.decode(traj.final_turn(), true)?;
        traj.stopped_at_max_turns = !parse_tool_calls(&text).is_empty();
    }
    Ok(())
}

/// The sampling seed of continuation turn `turn` (turn 0 uses `seed` itself).
fn turn_seed(seed: u64, turn: usize) -> u64 {
    // SplitMix64's finaliser: nearby turns give unrelated seeds.
    use atomrl_core::rng::{mix, GOLDEN_GAMMA};
    mix(seed.wrapping_add((turn as u64).wrapping_mul(GOLDEN_GAMMA)))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use proptest::prelude::*;

    const EOS: u32 = 2;

    fn tokenizer() -> ChatTokenizer {
        let dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/fixtures/reference/models/tiny-qwen2"
        );
        ChatTokenizer::from_hf_dir(dir).unwrap()
    }

    fn call(expression: &str) -> String {
        format!(
            "<tool_call>\n{{\"name\": \"calculator\", \"arguments\": {{\"expression\": \"{expression}\"}}}}\n</tool_call>"
        )
    }

    /// A scripted model: context `c` of a call gets `script(c, turn index)` then EOS, with
    /// log-prob -1 per token.
    fn scripted<'a>(
        tok: &'a ChatTokenizer,
        script: impl Fn(usize, usize) -> String + 'a,
    ) -> impl FnMut(&[Vec<u32>], &SamplingParams) -> Result<Vec<Turn>> + 'a {
        let mut turn = 0;
        move |contexts, p| {
            let mut out = Vec::new();
            for c in 0..contexts.len() {
                for _ in 0..p.num_generations {
                    let mut ids = tok.encode(&script(out.len(), turn), false).unwrap();
                    ids.push(EOS);
                    let finish = if ids.len() > p.max_new_tokens {
                        ids.truncate(p.max_new_tokens);
                        FinishReason::Length
                    } else {
                        FinishReason::Eos
                    };
                    let _ = c;
                    out.push(Turn {
                        log_probs: vec![-1.0; ids.len()],
                        ids,
                        finish,
                    });
                }
            }
            turn += 1;
            Ok(out)
        }
    }

    fn params(g: usize, budget: usize) -> SamplingParams {
        SamplingParams {
            num_generations: g,
            max_new_tokens: budget,
            stop_token_ids: vec![EOS],
            ..Default::default()
        }
    }

    #[test]
    fn a_tool_turn_is_appended_as_context_and_masked() {
        let tok = tokenizer();
        let tools = ToolSet::from_names(&["calculator"]).unwrap();
        // Row 0 calls the calculator, then answers; row 1 answers at once.
        let script = |row: usize, turn: usize| match (row, turn) {
            (0, 0) => call("6*7"),
            (_, 0) => "42".to_string(),
            _ => "The answer is 42".to_string(),
        };
        let out = run_turns(
            &tok,
            &[vec![1, 5]],
            &params(2, 200),
            &tools,
            3,
            scripted(&tok, script),
        )
        .unwrap();
        let (a, b) = (&out.trajectories[0], &out.trajectories[1]);
        assert_eq!(a.calls.len(), 1);
        assert_eq!(a.calls[0].output, "42");
        assert!(!a.calls[0].failed);
        assert_eq!(a.finish_reason, FinishReason::Eos);
        assert!(!a.stopped_at_max_turns);
        // model turn 1 | tool turn | model turn 2
        let first = tok.encode(&call("6*7"), false).unwrap().len() + 1;
        let tool_text = tok
            .tool_turn_text(&["42".to_string()], &tools.schemas())
            .unwrap();
        let eos_text = tok.decode(&[EOS], false).unwrap();
        let tool_ids = tok
            .encode(
                tool_text
                    .strip_prefix(eos_text.as_str())
                    .unwrap_or(&tool_text),
                false,
            )
            .unwrap();
        let last = tok.encode("The answer is 42", false).unwrap().len() + 1;
        assert_eq!(a.completion_ids.len(), first + tool_ids.len() + last);
        assert_eq!(
            &a.completion_ids[first..first + tool_ids.len()],
            tool_ids.as_slice()
        );
        let want_mask: Vec<bool> = std::iter::repeat_n(true, first)
            .chain(std::iter::repeat_n(false, tool_ids.len()))
            .chain(std::iter::repeat_n(true, last))
            .collect();
        assert_eq!(a.model_token, want_mask);
        assert_eq!(a.turn_starts, vec![0, first + tool_ids.len()]);
        assert_eq!(
            tok.decode(a.final_turn(), true).unwrap(),
            "The answer is 42"
        );
        assert_eq!(a.num_model_tokens(), first + last);
        assert!(a
            .sampling_log_probs
            .iter()
            .zip(&a.model_token)
            .all(|(&lp, &m)| (lp == 0.0) != m));
        assert!(b.calls.is_empty());
        assert_eq!(b.turn_starts, vec![0]);
        assert_eq!(
            out.num_generated_tokens,
            first + last + b.completion_ids.len()
        );
        // The tool turn is part of the sequence but not of the loss.
        let in_loss = a.model_token.iter().filter(|&&m| m).count();
        assert_eq!(in_loss, first + last);
        assert_eq!(a.model_token.len(), a.completion_ids.len());
    }

    #[test]
    fn bad_calls_become_error_responses_and_the_rollout_goes_on() {
        let tok = tokenizer();
        let tools = ToolSet::from_names(&["calculator"]).unwrap();
        let bad = [
            "<tool_call>\n{\"name\": \"calculator\", \"arguments\": \n</tool_call>".to_string(),
            "<tool_call>\n{\"name\": \"weather\", \"arguments\": {}}\n</tool_call>".to_string(),
            "<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"x\": \"1\"}}\n</tool_call>"
                .to_string(),
            call("1/0"),
            call(&"1+".repeat(150)),
        ];
        let n = bad.len();
        let script = move |row: usize, turn: usize| {
            if turn == 0 {
                bad[row].clone()
            } else {
                "sorry".to_string()
            }
        };
        let prompts: Vec<Vec<u32>> = (0..n).map(|i| vec![1, 5 + i as u32]).collect();
        let out = run_turns(
            &tok,
            &prompts,
            &params(1, 1000),
            &tools,
            2,
            scripted(&tok, script),
        )
        .unwrap();
        for traj in &out.trajectories {
            assert_eq!(traj.calls.len(), 1);
            assert_eq!(traj.num_failed_calls(), 1, "{:?}", traj.calls);
            assert!(
                traj.calls[0].output.starts_with("error: "),
                "{:?}",
                traj.calls
            );
            assert_eq!(traj.turn_starts.len(), 2);
            assert_eq!(traj.finish_reason, FinishReason::Eos);
        }
    }

    #[test]
    fn the_turn_limit_and_the_budget_end_a_trajectory() {
        let tok = tokenizer();
        let tools = ToolSet::from_names(&["calculator"]).unwrap();
        let always = |_: usize, _: usize| call("1+1");
        let out = run_turns(
            &tok,
            &[vec![1]],
            &params(1, 400),
            &tools,
            2,
            scripted(&tok, always),
        )
        .unwrap();
        let t = &out.trajectories[0];
        assert_eq!((t.calls.len(), t.turn_starts.len()), (2, 3));
        assert!(t.stopped_at_max_turns);
        // No tool turn at all.
        let out = run_turns(
            &tok,
            &[vec![1]],
            &params(1, 400),
            &tools,
            0,
            scripted(&tok, always),
        )
        .unwrap();
        assert!(out.trajectories[0].stopped_at_max_turns);
        assert!(out.trajectories[0].calls.is_empty());
        // A budget with room for the call but not for its response.
        let call_len = tok.encode(&call("1+1"), false).unwrap().len() + 1;
        let out = run_turns(
            &tok,
            &[vec![1]],
            &params(1, call_len + 3),
            &tools,
            2,
            scripted(&tok, always),
        )
        .unwrap();
        let t = &out.trajectories[0];
        assert_eq!(t.finish_reason, FinishReason::Length);
        assert_eq!(t.completion_ids.len(), call_len);
        assert!(!t.stopped_at_max_turns);
        assert!(run_turns(
            &tok,
            &[vec![1]],
            &params(1, 4),
            &tools,
            65,
            scripted(&tok, always)
        )
        .is_err());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]

        /// Whatever the script and budget: the budget holds, tool tokens are never model tokens,
        /// model-token log-probs are the generator's, and tool turns are bounded by the turn
        /// limit.
        #[test]
        fn trajectories_keep_their_invariants(
            calls in proptest::collection::vec(0usize..4, 1..4),
            budget in 8usize..160,
            max_turns in 0usize..3,
        ) {
            let tok = tokenizer();
            let tools = ToolSet::from_names(&["calculator"]).unwrap();
            let g = calls.len();
            let script = move |row: usize, turn: usize| {
                if turn < calls[row % g] { call("2*3") } else { "6".to_string() }
            };
            let out = run_turns(&tok, &[vec![1, 9]], &params(g, budget), &tools, max_turns,
                scripted(&tok, script)).unwrap();
            let mut model_tokens = 0;
            for t in &out.trajectories {
                prop_assert!(t.completion_ids.len() <= budget);
                prop_assert_eq!(t.model_token.len(), t.completion_ids.len());
                prop_assert_eq!(t.sampling_log_probs.len(), t.completion_ids.len());
                for (&m, &lp) in t.model_token.iter().zip(&t.sampling_log_probs) {
                    prop_assert_eq!(lp, if m { -1.0 } else { 0.0 });
                }
                // One call per scripted turn; the last call may have found no room.
                prop_assert!(t.turn_starts.len() - 1 <= max_turns);
                prop_assert!(t.calls.len() >= t.turn_starts.len() - 1);
                prop_assert!(t.calls.len() <= t.turn_starts.len());
                model_tokens += t.num_model_tokens();
            }
            prop_assert_eq!(out.num_generated_tokens, model_tokens);
        }
    }
}
