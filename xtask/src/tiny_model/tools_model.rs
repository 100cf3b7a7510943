//! `cargo xtask tiny-model-tools`: builds the start model of `cargo run --release --example
//! grpo_tools`, a tiny model that knows the calculator's call format but uses it only sometimes.
//!
//! 1. The corpus of `cargo xtask tiny-model` (the same synthetic problems, worked and bare
//!    answers), where a share of the demonstrations instead call the calculator with the
//!    problem's expression and answer with its result ([`tool_traces`]), rendered by a chat
//!    template that writes `tools` and `tool` messages as Qwen2.5's does (`<tool_call>` in the
//!    assistant turn, `<tool_response>` in a user turn) with a short system line.
//! 2. A byte-level BPE tokenizer trained on that corpus, with `<tool_call>`, `</tool_call>`,
//!    `<tool_response>` and `</tool_response>` as single tokens (as in Qwen3's vocabulary), so
//!    a call is ~30 tokens rather than ~80 of the word-problem tokenizer.
//! 3. SFT of a random Qwen2 of the same shape as the `grpo_gsm8k` model, with `tools =
//!    ["calculator"]` so the prompts are what GRPO shows.
//! 4. The model folder, with the weights in f16 (half the size in git; they load as f32), and a
//!    `BUILD.md` with the held-out greedy accuracy with tools and the tool-call rate.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{anyhow, Context, Result};
use atomrl_model::CausalLm;
use atomrl_reward::WeightedRewards;
use atomrl_sample::ChatTokenizer;
use atomrl_sample::ToolUse;
use atomrl_tools::ToolSet;
use atomrl_trainer::config::{LrSchedule, Resume};
use atomrl_trainer::data::SYNTHETIC_DEFAULT;
use atomrl_trainer::rollout::{evaluate, EvalData, EvalResult, PromptEncoder};
use atomrl_trainer::{GRPOArgs, Recipe, Trainer};
use candle_core::{DType, Device};
use clap::Args;

use super::{sft_data, sha256, tokenizer, tool_traces, workspace_root, TinyModelArgs};

/// The chat template of the tool model: ChatML, plus Qwen2.5's rendering of tool turns (a run
/// of `tool` messages becomes one user turn of `<tool_response>` blocks) and a one-line system
/// message naming the tools (Qwen's long JSON tool list would triple this model's prompts).
pub const TOOLS_CHAT_TEMPLATE: &str = r"{%- if tools %}
{{- '<|im_start|>system\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\n\n' }}{%- endif %}
{{- 'Tools: ' }}
{%- for tool in tools %}{{- tool.function.name }}{%- if not loop.last %}{{- ', ' }}{%- endif %}{%- endfor %}
{{- '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'system' and loop.first and tools %}
{%- elif message.role == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\n<tool_response>\n' + message.content + '\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\n' }}{%- endif %}
{%- else %}
{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}";

/// The added tags of the tool model's tokenizer: the answer format's and the tool format's.
pub const TOOL_TAGS: [&str; 8] = [
    "<think>",
    "</think>",
    "<answer>",
    "</answer>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
];
/// SFT steps of the shipped tool model (calibrated: see its `BUILD.md`).
pub const DEFAULT_TOOL_STEPS: usize = 500;
/// Share of the SFT demonstrations that call the calculator.
pub const DEFAULT_TOOL_FRACTION: f64 = 0.25;
/// Peak learning rate of the SFT (constant after a short warm-up).
const TOOL_LR: f64 = 2e-3;
/// Examples per SFT step.
const BATCH_SIZE: usize = 64;
/// Generation and SFT budget (a traced completion is ~60 tokens).
pub const TOOL_MAX_COMPLETION_LENGTH: usize = 96;
/// Tool turns per completion in the evaluation.
const MAX_TOOL_TURNS: usize = 2;

/// Options of `cargo xtask tiny-model-tools`.
#[derive(Args, Debug, Clone)]
pub struct ToolModelArgs {
    /// SFT steps (batch 64).
    #[arg(long, default_value_t = DEFAULT_TOOL_STEPS)]
    pub steps: usize,
    /// Share of the SFT demonstrations that call the calculator.
    #[arg(long, default_value_t = DEFAULT_TOOL_FRACTION)]
    pub tool_fraction: f64,
    /// Data-parallel SFT workers of one thread each (weights are reproducible for a given
    /// count).
    #[arg(long, default_value_t = 2)]
    pub workers: usize,
    /// Output folder [default: examples/grpo_tools/model].
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// CPU compute threads (weights are reproducible for a given count).
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Scratch folder [default: target/tiny-model-tools].
    #[arg(long)]
    pub work_dir: Option<PathBuf>,
}

/// Runs the whole build.
///
/// # Errors
/// Any failing stage.
pub fn run(a: &ToolModelArgs) -> Result<()> {
    atomrl_trainer::runtime::set_threads(a.threads);
    let started = Instant::now();
    let root = workspace_root();
    let out = a
        .out
        .clone()
        .unwrap_or_else(|| root.join("examples/grpo_tools/model"));
    let work = a
        .work_dir
        .clone()
        .unwrap_or_else(|| root.join("target/tiny-model-tools"));
    if work.exists() {
        std::fs::remove_dir_all(&work).with_context(|| format!("clearing {}", work.display()))?;
    }
    let tools = ToolSet::from_names(&["calculator"]).map_err(|e| anyhow!("{e}"))?;
    let schemas = tools.schemas();
    let base_args = TinyModelArgs::defaults();
    let data = base_args.data_source();
    println!("== [1/4] SFT corpus: `{data}` with calculator traces");
    let train = data.load("train").map_err(|e| anyhow!("{e}"))?;
    let eval = data.load("test").map_err(|e| anyhow!("{e}"))?;
    // The template alone renders the tool turn (the vocabulary plays no part): any tokenizer
    // folder serves, here the fixture's.
    let renderer =
        ChatTokenizer::from_hf_dir(root.join("tests/fixtures/reference/models/tiny-qwen2"))
            .and_then(|t| t.with_chat_template(TOOLS_CHAT_TEMPLATE))
            .map_err(|e| anyhow!("{e}"))?;
    let mut turn_error = None;
    let tool_turn = |result: &str| match renderer.tool_turn_text(&[result.to_string()], &schemas) {
        Ok(t) => t,
        Err(e) => {
            turn_error.get_or_insert(e.to_string());
            String::new()
        }
    };
    let traced =
        tool_traces::with_tool_traces(train.clone(), a.tool_fraction, base_args.seed, tool_turn);
    if let Some(e) = turn_error {
        anyhow::bail!("rendering a tool turn: {e}");
    }
    let bare = sft_data::with_bare_answers(train, base_args.bare_fraction, base_args.seed);
    let is_trace = |c: Option<&str>| c.is_some_and(|c| c.starts_with("<tool_call>"));
    let train: Vec<_> = traced
        .into_iter()
        .zip(bare)
        .map(|(t, b)| {
            if is_trace(t.completion.as_deref()) {
                t
            } else {
                b
            }
        })
        .collect();
    let n_traced = train
        .iter()
        .filter(|e| is_trace(e.completion.as_deref()))
        .count();
    println!(
        "   {n_traced} of {} demonstrations call the calculator; of the others {:.0}% answer bare",
        train.len(),
        100.0 * base_args.bare_fraction
    );

    println!("== [2/4] byte-level BPE tokenizer on the corpus, tool tags as single tokens");
    let tok_dir = work.join("tokenizer");
    tokenizer::train_tokenizer_with(&train, &tok_dir, &TOOL_TAGS, TOOLS_CHAT_TEMPLATE)?;
    let tok = ChatTokenizer::from_hf_dir(&tok_dir).map_err(|e| anyhow!("{e}"))?;
    for tag in TOOL_TAGS {
        let ids = tok.encode(tag, false).map_err(|e| anyhow!("{e}"))?;
        anyhow::ensure!(ids.len() == 1, "{tag} is {} tokens", ids.len());
    }
    let trace_tokens = train
        .iter()
        .filter_map(|e| {
            e.completion
                .as_deref()
                .filter(|c| c.starts_with("<tool_call>"))
        })
        .take(200)
        .map(|c| tok.encode(c, false).map(|ids| ids.len() + 1))
        .collect::<atomrl_core::Result<Vec<_>>>()
        .map_err(|e| anyhow!("{e}"))?;
    let trace_max = trace_tokens.iter().copied().max().unwrap_or(0);
    println!(
        "   a traced completion: {:.1} tokens on average (max {trace_max})",
        trace_tokens.iter().sum::<usize>() as f64 / trace_tokens.len().max(1) as f64
    );

    let mut model = CausalLm::from_config_random(
        super::model_config()?,
        base_args.seed,
        DType::F32,
        &Device::Cpu,
    )
    .map_err(|e| anyhow!("{e}"))?;
    model.set_source_dir(&tok_dir);
    let encoder = PromptEncoder {
        chat_template: true,
        system_prompt: None,
        max_prompt_length: GRPOArgs::preset(Recipe::Sft).max_prompt_length,
        tool_schemas: schemas.clone(),
    };
    let tool_use = ToolUse {
        tools: &tools,
        max_tool_turns: MAX_TOOL_TURNS,
    };
    println!(
        "== [3/4] SFT of a random Qwen2 ({} steps x {BATCH_SIZE}, lr {TOOL_LR:e}, {} worker(s))",
        a.steps, a.workers
    );
    let sft_dir = work.join("sft");
    let args = sft_args(a, &sft_dir);
    let mut trainer = Trainer::with_data(
        args,
        model,
        tok.clone(),
        WeightedRewards::new(),
        train,
        Vec::new(),
    )
    .map_err(|e| anyhow!("{e}"))?;
    let t0 = Instant::now();
    trainer.train().map_err(|e| anyhow!("{e}"))?;
    let sft_seconds = t0.elapsed().as_secs_f64();

    println!("== [4/4] writing {} (f16 weights)", out.display());
    if out.exists() {
        std::fs::remove_dir_all(&out).with_context(|| format!("clearing {}", out.display()))?;
    }
    trainer
        .model()
        .save_hf_as(&out, DType::F16)
        .map_err(|e| anyhow!("{e}"))?;
    let reloaded =
        CausalLm::from_hf_dir(&out, DType::F32, &Device::Cpu).map_err(|e| anyhow!("{e}"))?;
    let reloaded_tok = ChatTokenizer::from_hf_dir(&out).map_err(|e| anyhow!("{e}"))?;
    let accuracy = atomrl_reward::Accuracy::default();
    let data = EvalData {
        model: &reloaded,
        tokenizer: &reloaded_tok,
        encoder: &encoder,
        examples: &eval,
        max_new_tokens: TOOL_MAX_COMPLETION_LENGTH,
        tools: Some(tool_use),
        accuracy: &accuracy,
    };
    let after =
        evaluate(&data, a.workers, &atomrl_dist::SingleProcess).map_err(|e| anyhow!("{e}"))?;
    let weights = std::fs::read(out.join("model.safetensors")).context("reading the weights")?;
    let sha = sha256::hex_digest(&weights);
    let md = build_markdown(a, &after, sft_seconds, &sha, n_traced, trace_max);
    let build_md = out.join("BUILD.md");
    let calibration = std::fs::read_to_string(&build_md)
        .ok()
        .and_then(|old| old.find("\n## Calibration").map(|i| old[i..].to_string()))
        .unwrap_or_default();
    std::fs::write(&build_md, md + &calibration).context("writing BUILD.md")?;
    println!(
        "   done in {:.0} s: held-out greedy with tools {}",
        started.elapsed().as_secs_f64(),
        summary(&after)
    );
    Ok(())
}

fn sft_args(a: &ToolModelArgs, output_dir: &Path) -> GRPOArgs {
    let mut args = GRPOArgs::preset(Recipe::Sft);
    args.output_dir = output_dir.display().to_string();
    args.batch_size = BATCH_SIZE;
    args.lr = TOOL_LR;
    args.max_steps = a.steps;
    args.lr_scheduler = LrSchedule::Constant;
    args.warmup_steps = 10;
    args.max_completion_length = TOOL_MAX_COMPLETION_LENGTH;
    args.max_grad_norm = 1.0;
    args.weight_decay = 0.0;
    args.seed = SYNTHETIC_DEFAULT.2;
    args.eval_size = 0;
    args.eval_steps = 0;
    args.save_steps = 0;
    args.save_total_limit = 1;
    args.logging_steps = 0;
    args.threads = a.threads;
    args.workers = a.workers;
    args.resume = Resume::Never;
    args.tools = vec!["calculator".into()];
    args.max_tool_turns = MAX_TOOL_TURNS;
    args.progress = true;
    args
}

fn pct(x: f64) -> String {
    format!("{:.1}%", 100.0 * x)
}

fn summary(r: &EvalResult) -> String {
    format!(
        "accuracy {}, format {}, {:.2} calls per completion ({} failed), {:.1} tokens",
        pct(r.accuracy),
        pct(r.format_rate),
        r.tool_calls.unwrap_or(0.0),
        pct(r.tool_error_rate.unwrap_or(0.0)),
        r.mean_length
    )
}

fn build_markdown(
    a: &ToolModelArgs,
    after: &EvalResult,
    sft_seconds: f64,
    sha: &str,
    traced: usize,
    trace_max: usize,
) -> String {
    let mut cmd = String::from("cargo xtask tiny-model-tools");
    if a.steps != DEFAULT_TOOL_STEPS {
        let _ = write!(cmd, " --steps {}", a.steps);
    }
    if a.tool_fraction != DEFAULT_TOOL_FRACTION {
        let _ = write!(cmd, " --tool-fraction {}", a.tool_fraction);
    }
    if a.workers != 2 {
        let _ = write!(cmd, " --workers {}", a.workers);
    }
    if a.threads != 1 {
        let _ = write!(cmd, " --threads {}", a.threads);
    }
    let mut s = String::new();
    let _ = writeln!(s, "# The embedded tool-calling model of `grpo_tools`\n");
    let _ = writeln!(
        s,
        "Built by AtomRL's own code, reproducibly (same command, same weights on CPU):\n\n```sh\n{cmd}\n```\n"
    );
    let _ = writeln!(s, "| | |\n|---|---|");
    let _ = writeln!(
        s,
        "| data | the `grpo_gsm8k` model's (`synthetic:20000:500:20261121:1-2:10`, see `examples/grpo_gsm8k/model/BUILD.md`); evaluated on the 500 held-out problems |"
    );
    let _ = writeln!(
        s,
        "| SFT demonstrations | {traced} of 20000 ({:.0}%) call `calculator` with the problem's expression (`(a op b) op c`), then answer bare with its result (at most {trace_max} tokens); of the others 60% answer bare, 40% with worked steps |",
        100.0 * a.tool_fraction
    );
    let _ = writeln!(
        s,
        "| tokenizer | byte-level BPE trained on that corpus: 512 tokens, digits one per token, `<think>`, `</think>`, `<answer>`, `</answer>`, `<tool_call>`, `</tool_call>`, `<tool_response>`, `</tool_response>` added; chat template: ChatML with Qwen2.5's tool turns and a `Tools: calculator` system line |"
    );
    let _ = writeln!(
        s,
        "| model | Qwen2, hidden 128, 4 layers, 4 heads / 2 KV heads, intermediate 512, vocab 512, tied embeddings (1.05 M parameters), random init; weights stored in f16 |"
    );
    let _ = writeln!(
        s,
        "| SFT | {} steps x {BATCH_SIZE} examples, lr {TOOL_LR:e} constant after 10 warm-up steps, completion-only cross-entropy, prompts rendered with `tools = [calculator]`, {} worker(s) of {} thread(s): {sft_seconds:.0} s |",
        a.steps, a.workers, a.threads
    );
    let _ = writeln!(
        s,
        "| held-out greedy, with the calculator (at most {MAX_TOOL_TURNS} tool turns, {TOOL_MAX_COMPLETION_LENGTH} tokens) | {} |",
        summary(after)
    );
    let _ = writeln!(s, "| `model.safetensors` sha256 | `{sha}` |");
    if let Some((prompt, completion, score)) = after.samples.first() {
        let _ = writeln!(
            s,
            "\nA held-out example (greedy, {}):\n\n```text\n{prompt}{completion}\n```",
            if *score > 0.0 { "right" } else { "wrong" }
        );
    }
    s
}
