//! Registration of this crate's functions with `atomrl-fn`.

use atomrl_core::shape::flat_f64;
use atomrl_core::{ArgKind, ArgSpec, AtomicFn, Error, FnSpec, Inputs, OutputSpec, Outputs, Result};
use serde_json::{Map, Value};

use crate::builtin::Options;
use crate::{
    answer_number, correctness_reward, digit_reward, extract_answer, extract_gsm8k_ground_truth,
    hard_format_reward, mark_reward, overlong_penalty, soft_format_reward, step_reward,
    OverlongOptions,
};

/// The functions this crate registers with `atomrl-fn`.
pub fn functions() -> Vec<AtomicFn> {
    vec![
        AtomicFn {
            spec: CORRECTNESS_REWARD,
            run: run_correctness,
        },
        AtomicFn {
            spec: DIGIT_REWARD,
            run: run_digit,
        },
        AtomicFn {
            spec: HARD_FORMAT_REWARD,
            run: run_hard_format,
        },
        AtomicFn {
            spec: SOFT_FORMAT_REWARD,
            run: run_soft_format,
        },
        AtomicFn {
            spec: MARK_REWARD,
            run: run_mark,
        },
        AtomicFn {
            spec: STEP_REWARD,
            run: run_step,
        },
        AtomicFn {
            spec: OVERLONG_PENALTY,
            run: run_overlong,
        },
        AtomicFn {
            spec: EXTRACT_ANSWER,
            run: run_extract_answer,
        },
        AtomicFn {
            spec: EXTRACT_GSM8K_GROUND_TRUTH,
            run: run_extract_gsm8k,
        },
    ]
}

const CRATE: &str = "atomrl-reward";

const COMPLETIONS: ArgSpec = ArgSpec::text(
    "completions",
    "[N]",
    "the completions (generated text, without the prompt)",
);
const THINK_TAG: ArgSpec =
    ArgSpec::option("think_tag", "string", "think", "name of the reasoning tag");
const ANSWER_TAG: ArgSpec =
    ArgSpec::option("answer_tag", "string", "answer", "name of the answer tag");
const ORDER: ArgSpec = ArgSpec::option(
    "order",
    "string",
    "answer_tag,boxed,gsm8k,last_number",
    "extraction sources tried in order (comma-separated, or an array)",
);
const REWARDS: OutputSpec = OutputSpec::new("rewards", "[N]", "f32", "one reward per completion");
const EXTRACTED: OutputSpec = OutputSpec::new(
    "extracted",
    "[N]",
    "string|null",
    "the extracted answer text (normalised), null if none",
);

macro_rules! extraction_rules {
    () => {
        "\
Extraction (option `order`, first source that yields a non-empty answer wins; the completion is
first normalised: Unicode digits such as '１２' -> '12', '−' -> '-', no-break/thin spaces -> a
thousands separator, LaTeX '{,}' '\\,' '\\!' '\\%' '\\$' simplified):
  answer_tag   content of <answer>...</answer>: the last <answer> that has a </answer> after it,
               up to the first </answer> after it (nested/duplicated tags: innermost last)
  boxed        content of the last \\boxed{...} (or \\fbox{...}) with balanced braces
  gsm8k        rest of the line after the last '####'
  last_number  the last number anywhere in the text

Normalisation of a number: thousands separators (',' or thin/no-break space, groups of exactly
3 digits; plain spaces too inside an extracted answer), '$', '%' (50% is 50), unit words and
surrounding text dropped, trailing zeros ('12.00' = 12), leading zeros, signs ('-', '−', '+';
'-0' = 0), fractions a/b, \\frac{a}{b} / \\dfrac / \\tfrac / \\frac12, scientific notation (1.5e3,
2 x 10^3, 2\\times10^{3}). Within an extracted answer a \\boxed{...} is unwrapped and the last
number taken ('x = 12' -> 12)."
    };
}

const EXTRACTION_RULES: &str = extraction_rules!();

const CORRECTNESS_REWARD: FnSpec = FnSpec {
    name: "correctness_reward",
    crate_name: CRATE,
    summary:
        "1.0 when the extracted answer equals the ground truth numerically (text-level reward)",
    formula: concat!(
        "\
reward = 1.0 if number(extract(completion)) matches number(ground_truth) else 0.0
strict = true: 1.0 only if the completion also passes hard_format_reward
  (<think>\\n...\\n</think>\\n<answer>\\n...\\n</answer>, nothing before or after).

Matching: integers exactly (any size: 123456789012345678901 != ...902); otherwise
|a - b| <= tolerance * max(1, |b|) with b the ground truth. A ground truth with '####' is cut to
the text after it. A ground truth that is not a single number (e.g. 'x^2+1', 'B') is compared as
text: whitespace and '$' removed, lower-cased, trailing '.' removed.

",
        extraction_rules!()
    ),
    inputs: &[
        COMPLETIONS,
        ArgSpec::text(
            "ground_truth",
            "[N]",
            "reference answer of each completion ('72', or a GSM8K '... #### 72')",
        ),
        ArgSpec::option("strict", "bool", "false", "also require the hard format"),
        ORDER,
        ArgSpec::option(
            "tolerance",
            "f64",
            "1e-6",
            "relative tolerance for non-integers (>= 0)",
        ),
        THINK_TAG,
        ANSWER_TAG,
    ],
    outputs: &[
        REWARDS,
        EXTRACTED,
        OutputSpec::new(
            "parsed",
            "[N]",
            "string|null",
            "canonical number of the extracted answer",
        ),
    ],
    example_input: r#"{"completions": ["<think>\n5+7\n</think>\n<answer>\n12\n</answer>", "the answer is 1,000"], "ground_truth": ["12", "1000"]}"#,
    example_output: r#"{"rewards": {"shape": [2], "data": [1.0, 1.0]}, "extracted": ["12", "1,000"], "parsed": ["12", "1000"]}"#,
};

/// The option arguments of `inputs` as a JSON object, for [`Options`].
fn option_map(spec: &FnSpec, inputs: &Inputs) -> Value {
    let mut map = Map::new();
    for arg in spec.inputs.iter().filter(|a| a.kind == ArgKind::Option) {
        if let Some(v) = inputs.json(arg.name) {
            map.insert(arg.name.to_string(), v.clone());
        }
    }
    Value::Object(map)
}

fn extracted_json(completions: &[String], opts: &crate::ExtractOptions) -> (Value, Value) {
    let found: Vec<_> = completions
        .iter()
        .map(|c| extract_answer(c, opts))
        .collect();
    let text = found
        .iter()
        .map(|e| {
            e.as_ref()
                .map_or(Value::Null, |e| Value::from(e.text.clone()))
        })
        .collect();
    let parsed = found
        .iter()
        .map(|e| {
            e.as_ref()
                .and_then(|e| answer_number(&e.text))
                .map_or(Value::Null, |n| Value::from(n.to_string()))
        })
        .collect();
    (Value::Array(text), Value::Array(parsed))
}

fn run_correctness(inputs: &Inputs) -> Result<Outputs> {
    let spec = &CORRECTNESS_REWARD;
    let completions = inputs.strings("completions")?;
    let gt = inputs.strings("ground_truth")?;
    let opts_value = option_map(spec, inputs);
    let mut o = Options::new(spec.name, &opts_value)?;
    let opts = o.correctness()?;
    o.finish()?;
    let rewards = correctness_reward(&completions, &gt, &opts)?;
    let (extracted, parsed) = extracted_json(&completions, &opts.extract);
    Ok(Outputs::new()
        .tensor("rewards", &rewards)
        .json("extracted", extracted)
        .json("parsed", parsed))
}

const DIGIT_REWARD: FnSpec = FnSpec {
    name: "digit_reward",
    crate_name: CRATE,
    summary: "1.0 when the extracted answer is a number",
    formula: concat!(
        "\
reward = 1.0 if extract(completion) is a single number, else 0.0
A single number: after unwrapping \\boxed{...}, exactly one number and otherwise only
whitespace, letters (unit words) and $ % . , : ; ! ? ( ) [ ] { } \\ ' \"  ('$12', '12 apples',
'\\frac{1}{2}' yes; 'x = 5', '2+3', '5 or 6', 'twelve' no). With last_number in the order any text
containing a number has a numeric answer; drop it to require an explicit answer.

",
        "\
Extraction: as correctness_reward (sources answer_tag, boxed, gsm8k, last_number, tried in
`order`)."
    ),
    inputs: &[COMPLETIONS, ORDER, THINK_TAG, ANSWER_TAG],
    outputs: &[REWARDS, EXTRACTED],
    example_input: r#"{"completions": ["<answer>\n$12\n</answer>", "<answer>\nx + 1\n</answer>", "no digits"]}"#,
    example_output: r#"{"rewards": {"shape": [3], "data": [1.0, 0.0, 0.0]}, "extracted": ["$12", "x + 1", null]}"#,
};

fn run_digit(inputs: &Inputs) -> Result<Outputs> {
    let spec = &DIGIT_REWARD;
    let completions = inputs.strings("completions")?;
    let opts_value = option_map(spec, inputs);
    let mut o = Options::new(spec.name, &opts_value)?;
    let opts = o.extract()?;
    o.finish()?;
    let rewards = digit_reward(&completions, &opts)?;
    let (extracted, _) = extracted_json(&completions, &opts);
    Ok(Outputs::new()
        .tensor("rewards", &rewards)
        .json("extracted", extracted))
}

const HARD_FORMAT_REWARD: FnSpec = FnSpec {
    name: "hard_format_reward",
    crate_name: CRATE,
    summary:
        "1.0 when the completion is exactly <think>\\n...\\n</think>\\n<answer>\\n...\\n</answer>",
    formula: "\
reward = 1.0 if the completion is exactly
  <think>\\n ... \\n</think>\\n<answer>\\n ... \\n</answer>
with nothing before <think> and nothing (not even a newline) after </answer>, each of the four
tags exactly once; the contents may be empty or span lines. Else 0.0.",
    inputs: &[COMPLETIONS, THINK_TAG, ANSWER_TAG],
    outputs: &[REWARDS],
    example_input: r#"{"completions": ["<think>\n5+7\n</think>\n<answer>\n12\n</answer>", "<think>5+7</think><answer>12</answer>", "<think>\n5+7\n</think>\n<answer>\n12\n</answer>\nDone."]}"#,
    example_output: r#"{"rewards": {"shape": [3], "data": [1.0, 0.0, 0.0]}}"#,
};

fn tags_of(spec: &FnSpec, inputs: &Inputs) -> Result<crate::Tags> {
    let v = option_map(spec, inputs);
    let mut o = Options::new(spec.name, &v)?;
    let tags = o.tags()?;
    o.finish()?;
    Ok(tags)
}

fn run_hard_format(inputs: &Inputs) -> Result<Outputs> {
    let tags = tags_of(&HARD_FORMAT_REWARD, inputs)?;
    let rewards = hard_format_reward(&inputs.strings("completions")?, &tags)?;
    Ok(Outputs::new().tensor("rewards", &rewards))
}

const SOFT_FORMAT_REWARD: FnSpec = FnSpec {
    name: "soft_format_reward",
    crate_name: CRATE,
    summary: "1.0 when <think>, </think>, <answer>, </answer> appear in this order",
    formula: "\
reward = 1.0 if <think>, </think>, <answer>, </answer> all appear, each found after the previous
one (anything may come before, between and after), else 0.0.",
    inputs: &[COMPLETIONS, THINK_TAG, ANSWER_TAG],
    outputs: &[REWARDS],
    example_input: r#"{"completions": ["Sure. <think>5+7</think> <answer>12</answer> Bye", "<answer>12</answer> <think>5+7</think>"]}"#,
    example_output: r#"{"rewards": {"shape": [2], "data": [1.0, 0.0]}}"#,
};

fn run_soft_format(inputs: &Inputs) -> Result<Outputs> {
    let tags = tags_of(&SOFT_FORMAT_REWARD, inputs)?;
    let rewards = soft_format_reward(&inputs.strings("completions")?, &tags)?;
    Ok(Outputs::new().tensor("rewards", &rewards))
}

const MARK_REWARD: FnSpec = FnSpec {
    name: "mark_reward",
    crate_name: CRATE,
    summary: "Partial format credit: per_tag for each correctly placed tag, minus a penalty for text after </answer>",
    formula: "\
markers: '<think>\\n', '\\n</think>\\n', '\\n<answer>\\n', '\\n</answer>'
reward = per_tag * (markers occurring exactly once, after every earlier marker that also does)
         - min(per_char * chars after '\\n</answer>' (surrounding whitespace ignored), per_tag)
           (only when '\\n</answer>' earned its credit)
Range [0, 4 * per_tag] = [0, 0.5] by default.",
    inputs: &[
        COMPLETIONS,
        ArgSpec::option("per_tag", "f64", "0.125", "credit per correctly placed tag (>= 0)"),
        ArgSpec::option("per_char", "f64", "0.001", "penalty per character after </answer> (>= 0)"),
        THINK_TAG,
        ANSWER_TAG,
    ],
    outputs: &[REWARDS],
    example_input: r#"{"completions": ["<think>\n5+7\n</think>\n<answer>\n12\n</answer>", "<think>\n5+7\n</think>\n<answer>\n12\n</answer>\nHope this helps!", "<think>\n5+7"]}"#,
    example_output: r#"{"rewards": {"shape": [3], "data": [0.5, 0.484, 0.125]}}"#,
};

fn run_mark(inputs: &Inputs) -> Result<Outputs> {
    let spec = &MARK_REWARD;
    let v = option_map(spec, inputs);
    let mut o = Options::new(spec.name, &v)?;
    let opts = o.mark()?;
    o.finish()?;
    let rewards = mark_reward(&inputs.strings("completions")?, &opts)?;
    Ok(Outputs::new().tensor("rewards", &rewards))
}

const STEP_REWARD: FnSpec = FnSpec {
    name: "step_reward",
    crate_name: CRATE,
    summary: "fraction of the a op b = c steps that are right and built from the problem's numbers (process reward)",
    formula: "\
A step is a line holding only 'a op b = c' (op one of + - * / x × ÷; a GSM8K calculator
annotation <<a op b=c>> counts too). A step is good when
  |c - (a op b)| <= 1e-6 * max(1, |a op b|)   (division by zero is never good)
and, when prompts are given, each of a and b is a number of the prompt or the result c of an
earlier step of the same completion (results are remembered even when wrong).
reward = good steps / steps, 0.0 for a completion without steps.",
    inputs: &[
        COMPLETIONS,
        ArgSpec::text(
            "prompts",
            "[N]",
            "the prompts; without them only the arithmetic is checked",
        )
        .not_required(),
    ],
    outputs: &[REWARDS],
    example_input: r#"{"completions": ["<think>\n9*4=36\n36-20=16\n</think>", "<think>\n9*4=36\n36-20=15\n</think>", "<think>\n9*6=54\n54-20=34\n</think>", "16"], "prompts": ["9 rows of 4 plants, 20 do not grow", "9 rows of 4 plants, 20 do not grow", "9 rows of 4 plants, 20 do not grow", "9 rows of 4 plants, 20 do not grow"]}"#,
    example_output: r#"{"rewards": {"shape": [4], "data": [1.0, 0.5, 0.5, 0.0]}}"#,
};

fn run_step(inputs: &Inputs) -> Result<Outputs> {
    let prompts = inputs.opt_strings("prompts")?;
    let rewards = step_reward(&inputs.strings("completions")?, prompts.as_deref())?;
    Ok(Outputs::new().tensor("rewards", &rewards))
}

const OVERLONG_PENALTY: FnSpec = FnSpec {
    name: "overlong_penalty",
    crate_name: CRATE,
    summary: "DAPO soft overlong punishment on completion lengths in tokens (verl's formula; TRL's as an option)",
    formula: "\
verl 0.9.1 verl/workers/reward_manager/dapo.py:
  expected = max_len - buffer_len
  exceed   = length - expected
  penalty  = min(-exceed / buffer_len * penalty_factor, 0)
0 up to max_len - buffer_len tokens, then linear down to -penalty_factor at max_len.
variant = dapo: a length above max_len is an error (verl never sees one).
variant = trl : a length above max_len gets -penalty_factor (TRL's -1 with factor 1).
Rejected: buffer_len outside 1..=max_len, penalty_factor < 0 or not finite.",
    inputs: &[
        ArgSpec::tensor("lengths", "[N]", "int", "completion lengths in tokens"),
        ArgSpec::required_option("max_len", "usize", "maximum completion length in tokens"),
        ArgSpec::required_option("buffer_len", "usize", "soft-punishment buffer length (1..=max_len)"),
        ArgSpec::option("penalty_factor", "f64", "1.0", "penalty at max_len (>= 0)"),
        ArgSpec::option("variant", "string", "dapo", "dapo | trl"),
    ],
    outputs: &[OutputSpec::new("penalty", "[N]", "f32", "penalty per completion, in [-penalty_factor, 0]")],
    example_input: r#"{"lengths": [0, 12, 13, 15, 16], "max_len": 16, "buffer_len": 4, "penalty_factor": 1.0}"#,
    example_output: r#"{"penalty": {"shape": [5], "data": [0.0, 0.0, -0.25, -0.75, -1.0]}}"#,
};

/// Lengths as a flat array of non-negative integers (or a float tensor with integral values).
fn lengths(inputs: &Inputs) -> Result<Vec<usize>> {
    const FUNC: &str = "overlong_penalty";
    if let Some(Value::Array(items)) = inputs.json("lengths") {
        return items
            .iter()
            .enumerate()
            .map(|(i, x)| {
                x.as_u64().map(|v| v as usize).ok_or_else(|| {
                    Error::value(FUNC, format!("lengths[{i}]"), "a non-negative integer", x)
                })
            })
            .collect();
    }
    let t = inputs.float_tensor("lengths")?;
    atomrl_core::shape::expect_rank(FUNC, "lengths", &t, 1, "[N]")?;
    flat_f64(FUNC, &t)?
        .into_iter()
        .enumerate()
        .map(|(i, x)| {
            if x >= 0.0 && x.fract() == 0.0 {
                Ok(x as usize)
            } else {
                Err(Error::value(
                    FUNC,
                    format!("lengths[{i}]"),
                    "a non-negative integer",
                    x,
                ))
            }
        })
        .collect()
}

fn run_overlong(inputs: &Inputs) -> Result<Outputs> {
    let opts = OverlongOptions {
        max_len: inputs.usize("max_len")?,
        buffer_len: inputs.usize("buffer_len")?,
        penalty_factor: inputs.opt_f64("penalty_factor")?.unwrap_or(1.0),
        variant: inputs.opt_str("variant")?.unwrap_or("dapo").parse()?,
    };
    let penalty = overlong_penalty(&lengths(inputs)?, &opts)?;
    Ok(Outputs::new().tensor("penalty", &penalty))
}

const EXTRACT_ANSWER: FnSpec = FnSpec {
    name: "extract_answer",
    crate_name: CRATE,
    summary: "The final answer of each completion, its source and its canonical number (for debugging rewards)",
    formula: EXTRACTION_RULES,
    inputs: &[COMPLETIONS, ORDER, THINK_TAG, ANSWER_TAG],
    outputs: &[
        EXTRACTED,
        OutputSpec::new("source", "[N]", "string|null", "answer_tag | boxed | gsm8k | last_number"),
        OutputSpec::new("parsed", "[N]", "string|null", "canonical number of the extracted answer"),
    ],
    example_input: r#####"{"completions": ["<answer>\n$1,000.00\n</answer>", "so \\boxed{\\frac{3}{4}}", "Total: 48 + 24 = 72\n#### 72", "about １２ km", "no answer"]}"#####,
    example_output: r#"{"extracted": ["$1,000.00", "\\frac{3}{4}", "72", "12", null], "source": ["answer_tag", "boxed", "gsm8k", "last_number", null], "parsed": ["1000", "3/4", "72", "12", null]}"#,
};

fn run_extract_answer(inputs: &Inputs) -> Result<Outputs> {
    let spec = &EXTRACT_ANSWER;
    let completions = inputs.strings("completions")?;
    let v = option_map(spec, inputs);
    let mut o = Options::new(spec.name, &v)?;
    let opts = o.extract()?;
    o.finish()?;
    let (extracted, parsed) = extracted_json(&completions, &opts);
    let source = completions
        .iter()
        .map(|c| extract_answer(c, &opts).map_or(Value::Null, |e| Value::from(e.source.name())))
        .collect();
    Ok(Outputs::new()
        .json("extracted", extracted)
        .json("source", Value::Array(source))
        .json("parsed", parsed))
}

const EXTRACT_GSM8K_GROUND_TRUTH: FnSpec = FnSpec {
    name: "extract_gsm8k_ground_truth",
    crate_name: CRATE,
    summary: "The reference answer of GSM8K solutions ('... #### 72' -> '72')",
    formula: "\
ground_truth = text after the last '####' up to the end of its line, trimmed, with ',' and '$'
removed; null when there is no '####' or nothing after it.",
    inputs: &[ArgSpec::text(
        "solutions",
        "[N]",
        "GSM8K reference solutions (the dataset's `answer` column)",
    )],
    outputs: &[OutputSpec::new(
        "ground_truth",
        "[N]",
        "string|null",
        "the reference answers",
    )],
    example_input: r#####"{"solutions": ["Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72", "#### 1,200", "no marker"]}"#####,
    example_output: r#"{"ground_truth": ["72", "1200", null]}"#,
};

fn run_extract_gsm8k(inputs: &Inputs) -> Result<Outputs> {
    let out = inputs
        .strings("solutions")?
        .iter()
        .map(|s| extract_gsm8k_ground_truth(s).map_or(Value::Null, Value::from))
        .collect();
    Ok(Outputs::new().json("ground_truth", Value::Array(out)))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    fn get(name: &str) -> atomrl_core::AtomicFn {
        super::functions()
            .into_iter()
            .find(|f| f.spec.name == name)
            .unwrap()
    }

    #[test]
    fn worked_examples_match_their_stored_outputs() {
        for f in super::functions() {
            atomrl_core::check_example(&f).unwrap();
        }
    }

    #[test]
    fn acceptance_strict_mode() {
        let f = get("correctness_reward");
        let input = json!({"completions": ["<think>\n5+7\n</think>\n<answer>\n12\n</answer>", "the answer is 1,000"], "ground_truth": ["12", "1000"], "strict": true});
        let out = f.run_json(input).unwrap().to_json().unwrap();
        assert_eq!(out["rewards"], json!({"shape": [2], "data": [1.0, 0.0]}));
    }

    #[test]
    fn cli_errors_name_the_argument() {
        let f = get("correctness_reward");
        let e = f
            .run_json(json!({"completions": ["1", "2"], "ground_truth": ["1"]}))
            .unwrap_err()
            .to_string();
        assert!(e.contains("`ground_truth`") && e.contains("N = 2"), "{e}");
        let e = f
            .run_json(json!({"completions": ["1"], "ground_truth": ["1"], "order": "boxed,oops"}))
            .unwrap_err()
            .to_string();
        assert!(e.contains("oops"), "{e}");
        let o = get("overlong_penalty");
        let e = o
            .run_json(json!({"lengths": [1, -2], "max_len": 4, "buffer_len": 2}))
            .unwrap_err()
            .to_string();
        assert!(e.contains("lengths[1]"), "{e}");
        let ok = o
            .run_json(
                json!({"lengths": {"shape": [2], "data": [3, 4]}, "max_len": 4, "buffer_len": 2}),
            )
            .unwrap();
        assert_eq!(
            ok.to_json().unwrap()["penalty"]["data"],
            json!([-0.5, -1.0])
        );
    }
}
