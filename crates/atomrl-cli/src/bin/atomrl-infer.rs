//! `atomrl-infer`: answer questions with a trained checkpoint.
//!
//! ```text
//! atomrl-infer --checkpoint runs/x/checkpoint-100 "What is 3+4?"
//! atomrl-infer --checkpoint runs/x/checkpoint-100 --file questions.jsonl   # prints accuracy when ground truths are given
//! ```

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{anyhow, bail, Result};
use atomrl_cli::infer::Answerer;
use atomrl_core::DeviceSpec;
use atomrl_tools::ToolSet;
use atomrl_trainer::data::{load_jsonl, Example, Prompt};
use atomrl_trainer::runtime::set_threads;
use clap::Parser;

/// Answer questions with a checkpoint (full model or LoRA adapter), through its chat template.
#[derive(Parser)]
#[command(name = "atomrl-infer", version)]
struct Cli {
    /// A checkpoint folder (`output_dir/checkpoint-N`) or any Hugging Face model folder.
    #[arg(long, value_name = "DIR")]
    checkpoint: PathBuf,
    /// A question to answer.
    question: Option<String>,
    /// A JSONL file of questions (`prompt` + optional `ground_truth`, or GSM8K `question`/`answer`).
    #[arg(long, value_name = "FILE.jsonl")]
    file: Option<PathBuf>,
    /// Generation budget in tokens.
    #[arg(long, default_value_t = 256)]
    max_new_tokens: usize,
    /// Sampling temperature (0 = greedy).
    #[arg(long, default_value_t = 0.0)]
    temperature: f64,
    /// A system prompt put before each question.
    #[arg(long)]
    system_prompt: Option<String>,
    /// `cpu`, `cuda` or `cuda:N`.
    #[arg(long, default_value = "cpu")]
    device: DeviceSpec,
    /// Compute threads (0 = all cores).
    #[arg(long, default_value_t = 0, value_parser = thread_count)]
    threads: usize,
    /// Tools the model may call (`--tools calculator`); each call and its result are shown.
    #[arg(long, value_delimiter = ',')]
    tools: Vec<String>,
    /// With `--tools`: tool turns per answer at most.
    #[arg(long, default_value_t = 3)]
    max_tool_turns: usize,
}

fn main() -> ExitCode {
    atomrl_trainer::runtime::tune_allocator();
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    atomrl_trainer::runtime::cblas_from_env()?;
    set_threads(cli.threads);
    let examples: Vec<Example> = match (&cli.question, &cli.file) {
        (Some(q), None) => vec![Example::new(Prompt::Text(q.clone()), String::new())],
        (None, Some(f)) => load_jsonl(f)?,
        _ => bail!("give either a question or --file questions.jsonl"),
    };
    let device = cli.device.open()?;
    let tools = ToolSet::from_names(&cli.tools).map_err(|e| anyhow!("--tools: {e}"))?;
    let answerer = Answerer::load(
        &cli.checkpoint,
        &device,
        cli.max_new_tokens,
        cli.temperature,
        cli.system_prompt,
    )?
    .with_tools(tools, cli.max_tool_turns);
    let answers = answerer.answer(&examples)?;
    if cli.question.is_some() {
        if let Some(a) = answers.first() {
            for c in &a.tool_calls {
                let name = c.name.as_deref().unwrap_or("?");
                eprintln!("tool call: {name}: {} -> {}", c.call, c.output);
            }
            println!("{}", a.completion);
        }
        return Ok(());
    }
    let mut scored = Vec::new();
    for a in &answers {
        println!(
            "{}",
            serde_json::json!({
                "question": a.question,
                "completion": a.completion,
                "correct": a.correct,
                "tool_calls": a.tool_calls.iter().map(|c| serde_json::json!({
                    "name": c.name, "call": c.call, "output": c.output, "failed": c.failed,
                })).collect::<Vec<_>>(),
            })
        );
        scored.extend(a.correct);
    }
    if !scored.is_empty() {
        let acc = scored.iter().sum::<f64>() / scored.len() as f64;
        eprintln!(
            "accuracy: {:.1}% ({} of {} with ground truth)",
            100.0 * acc,
            scored.iter().filter(|c| **c > 0.5).count(),
            scored.len()
        );
    }
    Ok(())
}

/// `--threads`: at most the training config's bound (more spawned threads until the OS
/// refused, with no answer).
fn thread_count(raw: &str) -> Result<usize, String> {
    let most = atomrl_trainer::config::MAX_THREADS_OR_WORKERS;
    match raw.parse::<usize>() {
        Ok(n) if n <= most => Ok(n),
        _ => Err(format!("expected 0 (all cores) to {most}, got {raw}")),
    }
}
