//! [`generate_rows`]: one generation call, single-turn or with tools, decoded into what
//! rewards, metrics and an update read (the one path of a trainer's rollouts, its evaluation
//! and `atomrl-infer`).

use atomrl_core::{Result, Trajectory};
use atomrl_model::CausalLm;
use atomrl_tools::ToolSet;

use crate::chat::ChatTokenizer;
use crate::generate::generate_samples;
use crate::params::SamplingParams;
use crate::rollout::FinishReason;
use crate::tool_rollout::generate_with_tools;
use crate::trajectory::ToolTrajectory;

/// The tools of a generation call and their turn limit.
///
/// See [`generate_rows`] for an example.
#[derive(Clone, Copy)]
pub struct ToolUse<'a> {
    /// The tools the model may call.
    pub tools: &'a ToolSet,
    /// Tool turns per completion at most.
    pub max_tool_turns: usize,
}

/// One decoded completion (with tools: its whole trajectory): the one record of a generated
/// sequence, from generation through rewards to the logs. Serialisable, so that data-parallel
/// ranks can exchange their rollouts.
///
/// See [`generate_rows`] for an example.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Completion {
    /// Every token after the prompt (tool turns included).
    pub completion_ids: Vec<u32>,
    /// `true` on the tokens the model generated (the loss mask), one per token.
    pub model_token: Vec<bool>,
    /// The final model turn, decoded: what the rewards score (the whole completion without
    /// tools).
    pub answer: String,
    /// The whole completion, decoded (with the tool turns), for logs and samples.
    pub text: String,
    /// Why generation stopped.
    pub finish_reason: FinishReason,
    /// With tools: the trajectory the rewards see in their context.
    pub trajectory: Option<Trajectory>,
    /// With tools: the model called a tool once more after the last allowed tool turn.
    pub stopped_at_max_turns: bool,
}

/// The rows of one call (`B·G`, prompt-major) and the tokens the model generated: with tools
/// (a non-empty set), [`generate_with_tools`]; otherwise [`generate_samples`], each row's
/// text cut at its stop string as [`ChatTokenizer::decode_completions`] does.
///
/// # Errors
/// Generation, template or tokenizer failures.
///
/// ```
/// use atomrl_model::CausalLm;
/// use atomrl_sample::{generate_rows, ChatTokenizer, SamplingParams, ToolUse};
/// use atomrl_tools::ToolSet;
/// use candle_core::{DType, Device};
/// let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/reference/models/tiny-qwen2");
/// let model = CausalLm::from_hf_dir(dir, DType::F32, &Device::Cpu)?;
/// let tok = ChatTokenizer::from_hf_dir(dir)?;
/// let p = SamplingParams { num_generations: 2, max_new_tokens: 4, seed: 1, ..Default::default() };
/// let prompts = [tok.encode_chat_prompt("hi")?];
/// let (plain, n) = generate_rows(&model, &tok, &prompts, &p, None)?;
/// assert_eq!((plain.len(), plain[0].trajectory.is_none()), (2, true));
/// assert_eq!(n, plain.iter().map(|r| r.completion_ids.len()).sum::<usize>());
/// let tools = ToolSet::from_names(&["calculator"])?;
/// let with = ToolUse { tools: &tools, max_tool_turns: 2 };
/// let (rows, _) = generate_rows(&model, &tok, &prompts, &p, Some(with))?;
/// assert!(rows[0].trajectory.is_some()); // no call from a random model, but a trajectory
/// assert_eq!(rows[0].model_token.len(), rows[0].completion_ids.len());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn generate_rows(
    model: &CausalLm,
    tokenizer: &ChatTokenizer,
    prompts: &[Vec<u32>],
    params: &SamplingParams,
    tools: Option<ToolUse<'_>>,
) -> Result<(Vec<Completion>, usize)> {
    match tools.filter(|t| !t.tools.is_empty()) {
        None => single_turn(model, tokenizer, prompts, params),
        Some(t) => {
            let out =
                generate_with_tools(model, tokenizer, prompts, params, t.tools, t.max_tool_turns)?;
            let rows = out
                .trajectories
                .iter()
                .map(|traj| decode_trajectory(tokenizer, traj, &params.stop_strings))
                .collect::<Result<Vec<_>>>()?;
            Ok((rows, out.num_generated_tokens))
        }
    }
}

fn single_turn(
    model: &CausalLm,
    tokenizer: &ChatTokenizer,
    prompts: &[Vec<u32>],
    params: &SamplingParams,
) -> Result<(Vec<Completion>, usize)> {
    let out = generate_samples(model, prompts, params, Some(tokenizer))?;
    let texts = tokenizer.decode_completions(&out, &params.stop_strings)?;
    let rows = out
        .completion_rows()?
        .into_iter()
        .zip(texts)
        .zip(&out.finish_reasons)
        .map(|((ids, text), &finish_reason)| Completion {
            model_token: vec![true; ids.len()],
            completion_ids: ids,
            answer: text.clone(),
            text,
            finish_reason,
            trajectory: None,
            stopped_at_max_turns: false,
        })
        .collect();
    Ok((rows, out.num_generated_tokens))
}

fn decode_trajectory(
    tokenizer: &ChatTokenizer,
    traj: &ToolTrajectory,
    stop_strings: &[String],
) -> Result<Completion> {
    let text = tokenizer.decode(&traj.completion_ids, true)?;
    let answer = tokenizer.decode_turn(traj.final_turn(), traj.finish_reason, stop_strings)?;
    let tool_calls = traj.calls.clone();
    Ok(Completion {
        completion_ids: traj.completion_ids.clone(),
        model_token: traj.model_token.clone(),
        answer,
        trajectory: Some(Trajectory {
            text: text.clone(),
            tool_calls,
        }),
        text,
        finish_reason: traj.finish_reason,
        stopped_at_max_turns: traj.stopped_at_max_turns,
    })
}
