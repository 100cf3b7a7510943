//! Registration of this crate's functions with `atomrl-fn`.

use atomrl_core::{
    ArgSpec, AtomicFn, CandleContext, Error, FnSpec, Inputs, OutputSpec, Outputs, Result,
};
use atomrl_model::CausalLm;
use candle_core::{DType, Device, Tensor};

use crate::{
    get_action_log_probs, get_sequence_log_probs, get_shared_prompt_log_probs,
    selective_log_softmax, SequenceBatch, SharedPromptBatch,
};

/// The functions this crate registers with `atomrl-fn`.
pub fn functions() -> Vec<AtomicFn> {
    vec![
        AtomicFn {
            spec: GET_ACTION_LOG_PROBS,
            run: run_get_action_log_probs,
        },
        AtomicFn {
            spec: GET_SHARED_PROMPT_LOG_PROBS,
            run: run_get_shared_prompt_log_probs,
        },
        AtomicFn {
            spec: GET_SEQUENCE_LOG_PROBS,
            run: run_get_sequence_log_probs,
        },
        AtomicFn {
            spec: SELECTIVE_LOG_SOFTMAX,
            run: run_selective_log_softmax,
        },
    ]
}

const GET_ACTION_LOG_PROBS: FnSpec = FnSpec {
    name: "get_action_log_probs",
    crate_name: "atomrl-logprob",
    summary:
        "Per-token log-probabilities and entropies of a batch under a Hugging Face model folder",
    formula: "\
z[n, t]          = model(input_ids, attention_mask).logits[n, t] / temperature
log_probs[n, t]  = log_softmax(z[n, t])[input_ids[n, t + 1]]        t = 0 .. L-2
entropy[n, t]    = logsumexp(z[n, t]) - sum_v softmax(z[n, t])_v z[n, t, v]
Both are 0 where the target token is padding (attention_mask[n, t + 1] = 0).

The model (Qwen2/Qwen2.5/Qwen3/Llama, config.json + model.safetensors) runs in float32 with
eager attention; log-softmax is computed a chunk of rows at a time. Rows must be right-padded;
token ids must be below the vocabulary size.",
    inputs: &[
        ArgSpec::path(
            "model_dir",
            "Hugging Face model folder (config.json, model.safetensors)",
        ),
        ArgSpec::tensor(
            "input_ids",
            "[N, L]",
            "u32",
            "token ids, right-padded, L >= 2",
        ),
        ArgSpec::tensor(
            "attention_mask",
            "[N, L]",
            "f32",
            "1 on real tokens, 0 on right padding",
        ),
        ArgSpec::option("temperature", "f64", "1.0", "divides the logits (> 0)"),
    ],
    outputs: &[
        OutputSpec::new(
            "log_probs",
            "[N, L-1]",
            "f32",
            "log-probability of each next token",
        ),
        OutputSpec::new(
            "entropy",
            "[N, L-1]",
            "f32",
            "entropy of each next-token distribution",
        ),
    ],
    example_input: r#"{"model_dir": "tests/fixtures/reference/models/tiny-qwen2", "input_ids": [[1, 40, 41, 2], [1, 50, 0, 0]], "attention_mask": [[1, 1, 1, 1], [1, 1, 0, 0]]}"#,
    example_output: r#"{"log_probs": {"shape": [2, 3], "data": [-8.318409, -6.889324, -13.154926, -10.012997, 0.0, 0.0]}, "entropy": {"shape": [2, 3], "data": [3.0695066, 4.4515605, 3.9019651, 3.0695066, 0.0, 0.0]}}"#,
};

fn run_get_action_log_probs(inputs: &Inputs) -> Result<Outputs> {
    let func = "get_action_log_probs";
    let ids = inputs.id_tensor("input_ids")?;
    let mask = inputs.float_tensor("attention_mask")?;
    let temperature = inputs.opt_f64("temperature")?.unwrap_or(1.0);
    let (n, l) = match ids.dims() {
        &[n, l] if l >= 2 => (n, l),
        d => return Err(Error::shape(func, "input_ids", "[N, L] with L >= 2", d)),
    };
    if mask.dims() != [n, l] {
        return Err(Error::shape(
            func,
            "attention_mask",
            format!("[N, L] = [{n}, {l}]"),
            mask.dims(),
        ));
    }
    check_right_padded(func, "attention_mask", &mask)?;
    let dir = atomrl_model::model_dir_arg(inputs)?;
    let model = CausalLm::from_hf_dir(&dir, DType::F32, &Device::Cpu)?;
    let out = get_action_log_probs(&model, &ids, &mask, l - 1, temperature, true)?;
    let entropy = out
        .entropy
        .ok_or_else(|| Error::missing(func, "entropy", "an entropy output"))?;
    Ok(Outputs::new()
        .tensor("log_probs", &out.log_probs)
        .tensor("entropy", &entropy))
}

const GET_SEQUENCE_LOG_PROBS: FnSpec = FnSpec {
    name: "get_sequence_log_probs",
    crate_name: "atomrl-logprob",
    summary: "Summed completion log-probs of preference pairs (chosen and rejected in one forward), for DPO",
    formula: "\
the two sides are right-padded to one length L and run as one batch of 2N rows:
lp[n, j]        = log_softmax(model(ids, mask).logits[n, j - 1] / temperature)[ids[n, j]]
chosen[n]       = sum_j lp[n, j] * chosen_completion_mask[n, j]       (rejected likewise)
chosen_lengths  = sum_j chosen_completion_mask[n, j]
The outputs are compute_dpo_loss's inputs of the same names (the reference model's too).",
    inputs: &[
        ArgSpec::path("model_dir", "Hugging Face model folder (config.json, model.safetensors)"),
        ArgSpec::tensor("chosen_input_ids", "[N, L]", "u32", "prompt + chosen completion, right-padded"),
        ArgSpec::tensor("chosen_attention_mask", "[N, L]", "f32", "1 on real tokens"),
        ArgSpec::tensor("chosen_completion_mask", "[N, L]", "f32", "1 on the chosen completion's tokens"),
        ArgSpec::tensor("rejected_input_ids", "[N, L']", "u32", "prompt + rejected completion, right-padded"),
        ArgSpec::tensor("rejected_attention_mask", "[N, L']", "f32", "1 on real tokens"),
        ArgSpec::tensor("rejected_completion_mask", "[N, L']", "f32", "1 on the rejected completion's tokens"),
        ArgSpec::option("temperature", "f64", "1.0", "divides the logits (> 0)"),
    ],
    outputs: &[
        OutputSpec::new("chosen_log_probs", "[N]", "f32", "each chosen completion's summed log-prob"),
        OutputSpec::new("rejected_log_probs", "[N]", "f32", "each rejected completion's summed log-prob"),
        OutputSpec::new("chosen_lengths", "[N]", "f32", "chosen completion token counts"),
        OutputSpec::new("rejected_lengths", "[N]", "f32", "rejected completion token counts"),
    ],
    example_input: r#"{"model_dir": "tests/fixtures/reference/models/tiny-qwen2", "chosen_input_ids": [[5, 6, 7, 8]], "chosen_attention_mask": [[1, 1, 1, 1]], "chosen_completion_mask": [[0, 0, 1, 1]], "rejected_input_ids": [[5, 6, 9]], "rejected_attention_mask": [[1, 1, 1]], "rejected_completion_mask": [[0, 0, 1]]}"#,
    example_output: r#"{"chosen_log_probs": {"shape": [1], "data": [-16.414627]}, "rejected_log_probs": {"shape": [1], "data": [-8.115815]}, "chosen_lengths": {"shape": [1], "data": [2.0]}, "rejected_lengths": {"shape": [1], "data": [1.0]}}"#,
};

fn run_get_sequence_log_probs(inputs: &Inputs) -> Result<Outputs> {
    let side = |prefix: &str| -> Result<SequenceBatch> {
        Ok(SequenceBatch {
            input_ids: inputs.id_tensor(&format!("{prefix}_input_ids"))?,
            attention_mask: inputs.float_tensor(&format!("{prefix}_attention_mask"))?,
            completion_mask: inputs.float_tensor(&format!("{prefix}_completion_mask"))?,
        })
    };
    let (chosen, rejected) = (side("chosen")?, side("rejected")?);
    for (name, b) in [
        ("chosen_attention_mask", &chosen),
        ("rejected_attention_mask", &rejected),
    ] {
        check_right_padded(inputs.func(), name, &b.attention_mask)?;
    }
    let dir = atomrl_model::model_dir_arg(inputs)?;
    let model = CausalLm::from_hf_dir(&dir, DType::F32, &Device::Cpu)?;
    let temperature = inputs.opt_f64("temperature")?.unwrap_or(1.0);
    let out = get_sequence_log_probs(&model, &chosen, &rejected, temperature)?;
    Ok(Outputs::new()
        .tensor("chosen_log_probs", &out.chosen)
        .tensor("rejected_log_probs", &out.rejected)
        .tensor("chosen_lengths", &out.chosen_lengths)
        .tensor("rejected_lengths", &out.rejected_lengths))
}

/// Checks that `mask [N, L]` holds 0/1 with no 1 after a 0 in a row, naming `arg` and the
/// first bad position.
fn check_right_padded(func: &str, arg: &str, mask: &Tensor) -> Result<()> {
    let rows: Vec<Vec<f32>> = mask.to_vec2().ctx(func)?;
    for (r, row) in rows.iter().enumerate() {
        if let Some(j) = row.iter().position(|&m| m != 0.0 && m != 1.0) {
            return Err(Error::value(
                func,
                format!("{arg}[{r}, {j}]"),
                "0 or 1",
                row[j],
            ));
        }
        if let Some(j) = row.windows(2).position(|w| w[0] == 0.0 && w[1] == 1.0) {
            return Err(Error::value(
                func,
                arg,
                "right-padded (no 1 after a 0)",
                format!("a 1 after a 0 in row {r} at column {}", j + 1),
            ));
        }
    }
    Ok(())
}

const GET_SHARED_PROMPT_LOG_PROBS: FnSpec = FnSpec {
    name: "get_shared_prompt_log_probs",
    crate_name: "atomrl-logprob",
    summary: "Per-token log-probabilities and entropies of completions that share prompts, one \
              forward pass per prompt",
    formula: "\
k                = prompt_index[n]                  (the prompt of completion n)
x[n]             = prompt_ids[k] ++ completion_ids[n]   (left-padded prompt, right-padded completion)
z[n, t]          = model(x[n]).logits at the position before completion token t, / temperature
log_probs[n, t]  = log_softmax(z[n, t])[completion_ids[n, t]]
entropy[n, t]    = logsumexp(z[n, t]) - sum_v softmax(z[n, t])_v z[n, t, v]
Both are 0 where completion_mask[n, t] = 0.

The same numbers as get_action_log_probs on the concatenated rows, but each distinct prompt
runs through the model once and its KV cache is shared by its completions (in training the
gradients of the G completions sum into the one prompt pass).",
    inputs: &[
        ArgSpec::path(
            "model_dir",
            "Hugging Face model folder (config.json, model.safetensors)",
        ),
        ArgSpec::tensor("prompt_ids", "[K, P]", "u32", "the distinct prompts, left-padded"),
        ArgSpec::tensor(
            "prompt_mask",
            "[K, P]",
            "f32",
            "1 on real prompt tokens, 0 on left padding (last column all 1)",
        ),
        ArgSpec::tensor("completion_ids", "[N, T]", "u32", "one completion per row, right-padded"),
        ArgSpec::tensor(
            "completion_mask",
            "[N, T]",
            "f32",
            "1 on real completion tokens, 0 on right padding",
        ),
        ArgSpec::tensor("prompt_index", "[N]", "u32", "the prompt of each completion (< K)"),
        ArgSpec::option("temperature", "f64", "1.0", "divides the logits (> 0)"),
    ],
    outputs: &[
        OutputSpec::new(
            "log_probs",
            "[N, T]",
            "f32",
            "log-probability of each completion token",
        ),
        OutputSpec::new(
            "entropy",
            "[N, T]",
            "f32",
            "entropy of each next-token distribution",
        ),
    ],
    example_input: r#"{"model_dir": "tests/fixtures/reference/models/tiny-qwen2", "prompt_ids": [[1, 40, 41], [0, 1, 50]], "prompt_mask": [[1, 1, 1], [0, 1, 1]], "completion_ids": [[42, 2], [43, 0], [51, 52]], "completion_mask": [[1, 1], [1, 0], [1, 1]], "prompt_index": [0, 0, 1]}"#,
    example_output: r#"{"log_probs": {"shape": [3, 2], "data": [-13.007544, -12.840654, -13.402482, 0.0, -9.686754, -3.9203658]}, "entropy": {"shape": [3, 2], "data": [3.9019666, 4.350643, 3.9019666, 0.0, 2.1407962, 4.1511536]}}"#,
};

fn run_get_shared_prompt_log_probs(inputs: &Inputs) -> Result<Outputs> {
    let func = "get_shared_prompt_log_probs";
    let batch = SharedPromptBatch {
        prompt_ids: inputs.id_tensor("prompt_ids")?,
        prompt_mask: inputs.float_tensor("prompt_mask")?,
        completion_ids: inputs.id_tensor("completion_ids")?,
        completion_mask: inputs.float_tensor("completion_mask")?,
        prompt_index: inputs.id_tensor("prompt_index")?,
    };
    let temperature = inputs.opt_f64("temperature")?.unwrap_or(1.0);
    if batch.completion_mask.rank() == 2 {
        check_right_padded(func, "completion_mask", &batch.completion_mask)?;
    }
    let dir = atomrl_model::model_dir_arg(inputs)?;
    let model = CausalLm::from_hf_dir(&dir, DType::F32, &Device::Cpu)?;
    let out = get_shared_prompt_log_probs(&model, &batch, temperature, true)?;
    let entropy = out
        .entropy
        .ok_or_else(|| Error::missing(func, "entropy", "an entropy output"))?;
    Ok(Outputs::new()
        .tensor("log_probs", &out.log_probs)
        .tensor("entropy", &entropy))
}

const SELECTIVE_LOG_SOFTMAX: FnSpec = FnSpec {
    name: "selective_log_softmax",
    crate_name: "atomrl-logprob",
    summary: "Log-probability of one chosen token per position, and the entropy, from logits",
    formula: "\
z[n, t]          = logits[n, t] / temperature
log_probs[n, t]  = z[n, t, tokens[n, t]] - logsumexp(z[n, t])
entropy[n, t]    = logsumexp(z[n, t]) - sum_v softmax(z[n, t])_v z[n, t, v]

Computed a chunk of rows at a time, never holding more than one [rows, V] chunk of
temporaries beyond the logits (Qwen's V is 151,936).",
    inputs: &[
        ArgSpec::tensor("logits", "[N, T, V]", "f32", "unnormalised scores"),
        ArgSpec::tensor(
            "tokens",
            "[N, T]",
            "u32",
            "the chosen token at each position (< V)",
        ),
        ArgSpec::option("temperature", "f64", "1.0", "divides the logits (> 0)"),
    ],
    outputs: &[
        OutputSpec::new(
            "log_probs",
            "[N, T]",
            "f32",
            "log-probability of each chosen token",
        ),
        OutputSpec::new("entropy", "[N, T]", "f32", "entropy of each distribution"),
    ],
    example_input: r#"{"logits": [[[0, 0], [0.6931472, 0]]], "tokens": [[1, 0]], "temperature": 1.0}"#,
    example_output: r#"{"log_probs": {"shape": [1, 2], "data": [-0.6931472, -0.4054651]}, "entropy": {"shape": [1, 2], "data": [0.6931472, 0.6365142]}}"#,
};

fn run_selective_log_softmax(inputs: &Inputs) -> Result<Outputs> {
    let func = "selective_log_softmax";
    let logits = inputs.float_tensor("logits")?;
    let tokens = inputs.id_tensor("tokens")?;
    let temperature = inputs.opt_f64("temperature")?.unwrap_or(1.0);
    let out = selective_log_softmax(&logits, &tokens, temperature, true)?;
    let entropy: Tensor = out
        .entropy
        .ok_or_else(|| Error::missing(func, "entropy", "an entropy output"))?;
    Ok(Outputs::new()
        .tensor("log_probs", &out.log_probs)
        .tensor("entropy", &entropy))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use atomrl_core::Inputs;

    #[test]
    fn worked_examples_match_their_stored_outputs() {
        for f in super::functions() {
            atomrl_core::check_example(&f).unwrap();
        }
    }

    #[test]
    fn a_completion_mask_with_a_hole_is_refused_by_name() {
        let mut v: serde_json::Value =
            serde_json::from_str(super::GET_SHARED_PROMPT_LOG_PROBS.example_input).unwrap();
        v["model_dir"] = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/fixtures/reference/models/tiny-qwen2"
        )
        .into();
        v["completion_mask"] = serde_json::json!([[0, 1], [1, 0], [1, 1]]);
        let inputs = Inputs::from_json(&super::GET_SHARED_PROMPT_LOG_PROBS, v).unwrap();
        let err = super::run_get_shared_prompt_log_probs(&inputs)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("`completion_mask`") && err.contains("right-padded"),
            "{err}"
        );
    }
}
