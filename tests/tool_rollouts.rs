//! Multi-turn tool rollouts on the embedded tool model (`examples/grpo_tools/model`, which
//! calls the calculator): the sampling log-probs of the model's tokens equal a full forward's
//! over the whole trajectory (tool turns in context), and the tool turns are outside the loss.

#![allow(clippy::unwrap_used)]

use atomrl_logprob::get_action_log_probs;
use atomrl_model::CausalLm;
use atomrl_rollout::Experience;
use atomrl_sample::{generate_with_tools, ChatMessage, ChatTokenizer, SamplingParams};
use atomrl_tools::ToolSet;
use candle_core::{DType, Device, Tensor};

const MODEL: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/grpo_tools/model");

const QUESTIONS: [&str; 4] = [
    "Hana plants 7 rows of bean plants with 3 in each row. How many bean plants does Hana plant?",
    "Mia buys 4 comics for $12 each and pays with $60. How many dollars of change does Mia get?",
    "A baker makes 9 trays of rolls with 8 rolls on each tray and sells 20 rolls. How many rolls are left?",
    "Leo has 45 marbles and gives 9 to each of his 5 friends. How many marbles does Leo have left?",
];

fn setup() -> (CausalLm, ChatTokenizer, ToolSet, Vec<Vec<u32>>) {
    let model = CausalLm::from_hf_dir(MODEL, DType::F32, &Device::Cpu).unwrap();
    let tok = ChatTokenizer::from_hf_dir(MODEL).unwrap();
    let tools = ToolSet::from_names(&["calculator"]).unwrap();
    let prompts = QUESTIONS
        .iter()
        .map(|q| {
            let text = tok
                .apply_chat_template_with_tools(&[ChatMessage::user(*q)], &tools.schemas(), true)
                .unwrap();
            tok.encode(&text, false).unwrap()
        })
        .collect();
    (model, tok, tools, prompts)
}

#[test]
fn sampling_log_probs_match_a_full_forward_over_multi_turn_trajectories() {
    let (model, tok, tools, prompts) = setup();
    let params = SamplingParams {
        num_generations: 8,
        max_new_tokens: 128,
        temperature: 1.0,
        stop_token_ids: tok.eos_token_ids(),
        seed: 7,
        ..Default::default()
    };
    let out = generate_with_tools(&model, &tok, &prompts, &params, &tools, 2).unwrap();
    let with_calls: Vec<_> = out
        .trajectories
        .iter()
        .filter(|t| !t.calls.is_empty())
        .collect();
    assert!(
        with_calls.len() >= 4,
        "the tool model made {} multi-turn rollouts of 32",
        with_calls.len()
    );
    for t in &with_calls {
        let tool_tokens: Vec<u32> = t
            .completion_ids
            .iter()
            .zip(&t.model_token)
            .filter(|(_, &m)| !m)
            .map(|(&id, _)| id)
            .collect();
        let text = tok.decode(&tool_tokens, false).unwrap();
        assert!(text.contains("<tool_response>"), "{text}");
        assert!(t.turn_starts.len() >= 2);
    }
    // Padded as the trainer pads them: tool tokens attended to, outside the loss mask.
    let rows: Vec<(&[u32], &[u32], &[bool])> = out
        .trajectories
        .iter()
        .enumerate()
        .map(|(r, t)| {
            (
                out.prompt_of(r),
                t.completion_ids.as_slice(),
                t.model_token.as_slice(),
            )
        })
        .collect();
    let n = rows.len();
    let exp = Experience::from_rows(
        &rows,
        &vec![0.0; n],
        &vec![true; n],
        tok.pad_token_id(),
        &Device::Cpu,
    )
    .unwrap();
    let width = exp.completion_len;
    let sampled: Vec<f32> = out
        .trajectories
        .iter()
        .flat_map(|t| {
            let mut v = t.sampling_log_probs.clone();
            v.resize(width, 0.0);
            v
        })
        .collect();
    let sampled = Tensor::from_vec(sampled, (n, width), &Device::Cpu).unwrap();
    let recomputed = get_action_log_probs(
        &model,
        &exp.input_ids,
        &exp.attention_mask,
        exp.completion_len,
        1.0,
        false,
    )
    .unwrap()
    .log_probs;
    let diff = ((recomputed - &sampled).unwrap() * &exp.loss_mask)
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    assert!(
        diff < 1e-4,
        "max |sampling - recomputed| log-prob on model tokens: {diff}"
    );
}

#[test]
fn greedy_tool_calls_reach_the_calculator_and_its_results_are_exact() {
    let (model, tok, tools, prompts) = setup();
    let params = SamplingParams {
        num_generations: 1,
        max_new_tokens: 128,
        temperature: 0.0,
        stop_token_ids: tok.eos_token_ids(),
        ..Default::default()
    };
    let out = generate_with_tools(&model, &tok, &prompts, &params, &tools, 2).unwrap();
    assert_eq!(out.num_rows(), QUESTIONS.len());
    for t in &out.trajectories {
        for call in &t.calls {
            // Every successful response is what the calculator computes for the call.
            if !call.failed {
                let again = tools.run_calls(&format!("<tool_call>{}</tool_call>", call.call));
                assert_eq!(again[0].output, call.output);
            }
        }
        assert_eq!(t.model_token.len(), t.completion_ids.len());
    }
}
