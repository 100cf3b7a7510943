//! Registration of this crate's functions with `atomrl-fn`.

use atomrl_core::{
    ArgSpec, AtomicFn, CandleContext, Error, FnSpec, Inputs, OutputSpec, Outputs, Result,
};
use atomrl_model::CausalLm;
use candle_core::{DType, Device, Tensor};

use crate::{get_action_log_probs, selective_log_softmax};

/// The functions this crate registers with `atomrl-fn`.
pub fn functions() -> Vec<AtomicFn> {
    vec![
        AtomicFn {
            spec: GET_ACTION_LOG_PROBS,
            run: run_get_action_log_probs,
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
    let rows: Vec<Vec<f32>> = mask.to_vec2().ctx(func)?;
    for (r, row) in rows.iter().enumerate() {
        if let Some(j) = row.iter().position(|&m| m != 0.0 && m != 1.0) {
            return Err(Error::value(
                func,
                format!("attention_mask[{r}, {j}]"),
                "0 or 1",
                row[j],
            ));
        }
        if let Some(j) = row.windows(2).position(|w| w[0] == 0.0 && w[1] == 1.0) {
            return Err(Error::value(
                func,
                "attention_mask",
                "right-padded (no 1 after a 0)",
                format!("a 1 after a 0 in row {r} at column {}", j + 1),
            ));
        }
    }
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
    #[test]
    fn worked_examples_match_their_stored_outputs() {
        for f in super::functions() {
            atomrl_core::check_example(&f).unwrap();
        }
    }
}
