//! Registration of this crate's functions with `atomrl-fn`.

use std::path::Path;

use atomrl_core::{
    ArgSpec, AtomicFn, CandleContext, Error, FnSpec, Inputs, OutputSpec, Outputs, Result,
};
use atomrl_model::CausalLm;
use candle_core::{DType, Device, Tensor};
use serde_json::Value;

use crate::{generate_samples, ChatTokenizer, SamplingParams};

/// The functions this crate registers with `atomrl-fn`.
///
/// ```
/// assert_eq!(atomrl_sample::functions()[0].spec.name, "generate_samples");
/// ```
pub fn functions() -> Vec<AtomicFn> {
    vec![AtomicFn {
        spec: GENERATE_SAMPLES,
        run: run_generate_samples,
    }]
}

const GENERATE_SAMPLES: FnSpec = FnSpec {
    name: "generate_samples",
    crate_name: "atomrl-sample",
    summary: "Sample G completions per prompt from a Hugging Face model folder (KV cache, top-k/top-p/min-p, stops)",
    formula: "\
Rows are prompt-major: row b*G + g is completion g of prompt b. Each step, for each running row:
  l = logits of the next token;  l <- repetition_penalty(l, prompt + completion so far)
  l <- l / temperature;  keep top_k;  keep top_p (smallest prefix reaching top_p);
  keep p >= min_p * p_max;  token ~ softmax(l)            (temperature 0: argmax)
  sampling_log_probs = log softmax(raw logits / temperature)[token]   (no penalty or filter;
  temperature 1 when greedy): what get_action_log_probs recomputes on the same sequences.
A row ends on a stop token id (finish_reason eos, token kept in the mask), on a stop string
in its decoded text (stop; ends with the token completing it, the text is cut before it), or
after max_new_tokens tokens (length). Same seed, same completions (row r draws from its own
generator seeded by (seed, r)).

prompts are chat-templated with the folder's chat_template (one user message + generation
prompt) unless chat_template is false. stop_token_ids default to the tokenizer's and
generation_config.json's EOS ids; [] disables them.",
    inputs: &[
        ArgSpec::path("model_dir", "Hugging Face model folder (config.json, model.safetensors, tokenizer files)"),
        ArgSpec::optional("prompt_ids", "[[u32]]", "prompts as arrays of token ids (ragged); or give `prompts`"),
        ArgSpec::text("prompts", "[B]", "prompts as text (needs tokenizer.json); or give `prompt_ids`").not_required(),
        ArgSpec::option("chat_template", "bool", "true", "apply the folder's chat template to `prompts`"),
        ArgSpec::option("num_generations", "usize", "1", "G, completions per prompt"),
        ArgSpec::option("max_new_tokens", "usize", "256", "most tokens per completion"),
        ArgSpec::option("temperature", "f64", "1.0", "softmax temperature; 0 = greedy"),
        ArgSpec::option("top_p", "f64", "1.0", "nucleus mass in (0, 1]; 1 = off"),
        ArgSpec::option("top_k", "usize", "0", "keep the k most likely tokens; 0 = off"),
        ArgSpec::option("min_p", "f64", "0.0", "keep p >= min_p * p_max; 0 = off"),
        ArgSpec::option("repetition_penalty", "f64", "1.0", "HF repetition penalty (> 0); 1 = off"),
        ArgSpec::option("seed", "u64", "0", "sampling seed"),
        ArgSpec::optional("stop_token_ids", "[u32]", "ids that end a completion (default: the model's EOS ids)"),
        ArgSpec::text("stop_strings", "[S]", "strings that end a completion").not_required(),
    ],
    outputs: &[
        OutputSpec::new("completion_ids", "[R, T]", "u32", "completions, right-padded with the pad id (R = B*G)"),
        OutputSpec::new("completion_mask", "[R, T]", "f32", "1 on completion tokens (stop token included)"),
        OutputSpec::new("lengths", "[R]", "u32", "completion lengths"),
        OutputSpec::new("sampling_log_probs", "[R, T]", "f32", "log softmax(logits / temperature) of each sampled token; 0 where masked"),
        OutputSpec::new("finish_reason", "[R]", "string", "eos | stop | length"),
        OutputSpec::new("group_index", "[R]", "int", "the prompt of each row"),
        OutputSpec::new("completions", "[R]", "string", "decoded completions (when the folder has a tokenizer)"),
    ],
    example_input: r#"{"model_dir": "tests/fixtures/reference/models/tiny-qwen2", "prompt_ids": [[1, 40, 41], [1, 50]], "num_generations": 2, "max_new_tokens": 4, "temperature": 0.8, "seed": 3}"#,
    example_output: r#"{"completion_ids": {"shape": [4, 4], "data": [392, 336, 284, 290, 319, 190, 50, 17, 411, 157, 479, 34, 411, 277, 176, 228]}, "completion_mask": {"shape": [4, 4], "data": [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]}, "lengths": {"shape": [4], "data": [4, 4, 4, 4]}, "sampling_log_probs": {"shape": [4, 4], "data": [-2.577302, -1.0086875, -1.2047544, -0.3238795, -1.3182498, -1.6673597, -3.4865797, -3.8358479, -0.78058684, -4.8975196, -3.4829059, -4.6103096, -0.78058684, -5.570108, -0.8858363, -0.35982743]}, "finish_reason": ["length", "length", "length", "length"], "group_index": [0, 0, 1, 1], "completions": ["way gives are_st", " re\ufffdP/", " total\ufffdZoe@", " totalns\ufffd"]}"#,
};

fn run_generate_samples(inputs: &Inputs) -> Result<Outputs> {
    let func = "generate_samples";
    let dir = atomrl_model::model_dir_arg(inputs)?;
    let model = CausalLm::from_hf_dir(&dir, DType::F32, &Device::Cpu)?;
    let tok = if dir.join("tokenizer.json").is_file() {
        Some(ChatTokenizer::from_hf_dir(&dir)?)
    } else {
        None
    };
    let prompts = prompt_ids_arg(func, inputs, tok.as_ref(), &dir)?;
    let stop_token_ids = match inputs.json("stop_token_ids") {
        Some(v) => ids_from_json(func, "stop_token_ids", v)?,
        None => match &tok {
            Some(t) => t.eos_token_ids(),
            None => config_eos_ids(&dir),
        },
    };
    let params = sampling_params_arg(func, inputs, stop_token_ids)?;
    let out = generate_samples(&model, &prompts, &params, tok.as_ref())?;
    let lengths: Vec<u32> = out.lengths.iter().map(|&l| l as u32).collect();
    let lengths = Tensor::new(lengths, &Device::Cpu).ctx(func)?;
    let mut outputs = Outputs::new()
        .tensor("completion_ids", &out.completion_ids)
        .tensor("completion_mask", &out.completion_mask)
        .tensor("lengths", &lengths)
        .tensor("sampling_log_probs", &out.sampling_log_probs)
        .strings(
            "finish_reason",
            out.finish_reasons.iter().map(ToString::to_string).collect(),
        )
        .json("group_index", out.group_index.clone().into());
    if let Some(t) = &tok {
        outputs = outputs.strings(
            "completions",
            t.decode_completions(&out, &params.stop_strings)?,
        );
    }
    Ok(outputs)
}

/// The prompts of `generate_samples`: `prompt_ids`, or `prompts` encoded with the folder's
/// tokenizer (through its chat template unless `chat_template` is false).
fn prompt_ids_arg(
    func: &str,
    inputs: &Inputs,
    tok: Option<&ChatTokenizer>,
    dir: &std::path::Path,
) -> Result<Vec<Vec<u32>>> {
    Ok(match (inputs.has("prompt_ids"), inputs.has("prompts")) {
        (true, true) => {
            return Err(Error::value(
                func,
                "prompts",
                "absent when `prompt_ids` is given (give one of them)",
                "both",
            ));
        }
        (true, false) => inputs.id_lists("prompt_ids")?,
        (false, true) => {
            let tok = tok.ok_or_else(|| {
                Error::missing(
                    func,
                    "model_dir",
                    format!("a tokenizer.json in {} to encode `prompts`", dir.display()),
                )
            })?;
            let chat = inputs.opt_bool("chat_template")?.unwrap_or(true);
            inputs
                .strings("prompts")?
                .iter()
                .map(|p| {
                    if chat {
                        tok.encode_chat_prompt(p)
                    } else {
                        tok.encode(p, true)
                    }
                })
                .collect::<Result<Vec<_>>>()?
        }
        (false, false) => {
            return Err(Error::missing(
                func,
                "prompt_ids",
                "`prompt_ids` (arrays of token ids) or `prompts` (text)",
            ))
        }
    })
}

/// The sampling settings of `generate_samples` (defaults where absent).
fn sampling_params_arg(
    func: &str,
    inputs: &Inputs,
    stop_token_ids: Vec<u32>,
) -> Result<SamplingParams> {
    let defaults = SamplingParams::default();
    let seed = match inputs.json("seed") {
        Some(v) => v
            .as_u64()
            .ok_or_else(|| Error::value(func, "seed", "a non-negative integer", v))?,
        None => defaults.seed,
    };
    Ok(SamplingParams {
        num_generations: inputs
            .opt_usize("num_generations")?
            .unwrap_or(defaults.num_generations),
        max_new_tokens: inputs
            .opt_usize("max_new_tokens")?
            .unwrap_or(defaults.max_new_tokens),
        temperature: inputs
            .opt_f64("temperature")?
            .unwrap_or(defaults.temperature),
        top_p: inputs.opt_f64("top_p")?.unwrap_or(defaults.top_p),
        top_k: inputs.opt_usize("top_k")?.unwrap_or(defaults.top_k),
        min_p: inputs.opt_f64("min_p")?.unwrap_or(defaults.min_p),
        repetition_penalty: inputs
            .opt_f64("repetition_penalty")?
            .unwrap_or(defaults.repetition_penalty),
        stop_token_ids,
        stop_strings: inputs.opt_strings("stop_strings")?.unwrap_or_default(),
        seed,
    })
}

fn ids_from_json(func: &str, name: &str, v: &Value) -> Result<Vec<u32>> {
    let as_id = |i: Option<usize>, x: &Value| {
        x.as_u64()
            .and_then(|x| u32::try_from(x).ok())
            .ok_or_else(|| {
                let arg = i.map_or(name.to_owned(), |i| format!("{name}[{i}]"));
                Error::value(func, arg, "a non-negative integer token id", x)
            })
    };
    match v {
        Value::Array(items) => items
            .iter()
            .enumerate()
            .map(|(i, x)| as_id(Some(i), x))
            .collect(),
        other => Ok(vec![as_id(None, other)?]),
    }
}

/// EOS ids of `generation_config.json` (else `config.json`) for a folder without a tokenizer.
fn config_eos_ids(dir: &Path) -> Vec<u32> {
    ["generation_config.json", "config.json"]
        .iter()
        .find_map(|f| {
            let text = std::fs::read_to_string(dir.join(f)).ok()?;
            let v: Value = serde_json::from_str(&text).ok()?;
            let ids = match v.get("eos_token_id")? {
                Value::Array(a) => a
                    .iter()
                    .filter_map(|x| x.as_u64().map(|x| x as u32))
                    .collect(),
                x => x.as_u64().map(|x| vec![x as u32])?,
            };
            Some(ids)
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    #[test]
    fn worked_example_matches_its_stored_output() {
        for f in super::functions() {
            atomrl_core::check_example(&f).unwrap();
        }
    }
}
