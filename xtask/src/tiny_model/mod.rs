//! `cargo xtask tiny-model`: builds the small model that `cargo run --release --example
//! grpo_gsm8k` trains by default, reproducibly, with the project's own code.
//!
//! 1. Synthetic GSM8K-style word problems ([`synthetic_splits`](atomrl_trainer::data::synthetic_splits) with the trainer's
//!    [`SYNTHETIC_DEFAULT`] sizes and seed, so the example's held-out set is this one's, never
//!    seen in SFT).
//! 2. A byte-level BPE tokenizer trained on the training split ([`tokenizer`]).
//! 3. A randomly initialised Qwen2 (hidden 128, 4 layers, 4 heads / 2 KV heads, intermediate
//!    512, vocab 512, tied embeddings: 1.05 M parameters).
//! 4. SFT with the trainer (completion-only cross-entropy) on a corpus where 60% of the
//!    demonstrations answer without working ([`sft_data`]), for a number of steps calibrated so
//!    that the model answers in the `<think>…</think><answer>…</answer>` format but is often
//!    wrong: weak, yet trainable by GRPO.
//! 5. The model folder (`config.json`, `model.safetensors` in f32, tokenizer and generation
//!    files) and a `BUILD.md` saying how it was made.
//!
//! Everything is seeded and runs on the CPU with a fixed thread count, so the same command
//! gives the same weights.

mod sft_data;
mod sha256;
pub mod tokenizer;
mod tool_traces;
pub mod tools_model;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use atomrl_model::{Architecture, CausalLm, ModelConfig};
use atomrl_reward::WeightedRewards;
use atomrl_sample::ChatTokenizer;
use atomrl_trainer::config::{LrSchedule, Resume};
use atomrl_trainer::data::{DataSource, SYNTHETIC_DEFAULT, SYNTHETIC_DEFAULT_PROBLEMS};
use atomrl_trainer::logging::keys;
use atomrl_trainer::rollout::{evaluate, EvalData, EvalResult, PromptEncoder};
use atomrl_trainer::{GRPOArgs, Recipe, Trainer};
use candle_core::{DType, Device};
use clap::Args;

/// SFT steps of the shipped model (calibrated: see `BUILD.md`): 600 steps at a constant rate
/// on the mixed corpus give ~14% held-out greedy accuracy with the format right — the model
/// mostly answers bare — while its worked solutions are right about twice as often.
pub const DEFAULT_STEPS: usize = 600;
/// Of which the last ones decay the learning rate to 0 (none for the shipped model).
pub const DEFAULT_DECAY_STEPS: usize = 0;
/// Fraction of bare-answer demonstrations in the shipped model's SFT corpus
/// ([`sft_data::with_bare_answers`]).
pub const DEFAULT_BARE_FRACTION: f64 = 0.6;
/// Compute threads of the shipped model's run.
pub const DEFAULT_THREADS: usize = 1;
/// Peak learning rate.
const LR: f64 = 2e-3;
/// Examples per SFT step.
const BATCH_SIZE: usize = 64;
/// Generation budget (completions are at most ~45 tokens).
const MAX_COMPLETION_LENGTH: usize = 64;
/// Linear warm-up steps before the constant learning rate.
const WARMUP_STEPS: usize = 10;

/// Options of `cargo xtask tiny-model`.
#[derive(Args, Debug, Clone)]
pub struct TinyModelArgs {
    /// SFT steps in all (batch 64).
    #[arg(long, default_value_t = DEFAULT_STEPS)]
    pub steps: usize,
    /// The last this many steps decay the learning rate linearly to 0 (the others keep it
    /// constant after warm-up): annealing lifts accuracy well above the constant-rate model.
    #[arg(long, default_value_t = DEFAULT_DECAY_STEPS)]
    pub decay_steps: usize,
    /// Output folder [default: examples/grpo_gsm8k/model].
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Seed of the synthetic data, the initialisation and the data order.
    #[arg(long, default_value_t = SYNTHETIC_DEFAULT.2)]
    pub seed: u64,
    /// Fewest arithmetic steps per problem (the example's `synthetic` data by default).
    #[arg(long, default_value_t = SYNTHETIC_DEFAULT_PROBLEMS.0)]
    pub min_ops: usize,
    /// Most arithmetic steps per problem.
    #[arg(long, default_value_t = SYNTHETIC_DEFAULT_PROBLEMS.1)]
    pub max_ops: usize,
    /// Largest quantity drawn for a story.
    #[arg(long, default_value_t = SYNTHETIC_DEFAULT_PROBLEMS.2)]
    pub max_value: i64,
    /// Fraction of the SFT demonstrations that answer without working (an empty `<think>`).
    #[arg(long, default_value_t = DEFAULT_BARE_FRACTION)]
    pub bare_fraction: f64,
    /// CPU compute threads (weights are reproducible for a given count).
    #[arg(long, default_value_t = DEFAULT_THREADS)]
    pub threads: usize,
    /// Also evaluate, and keep a checkpoint, every this many steps (0: evaluate only before
    /// and after), for calibration.
    #[arg(long, default_value_t = 0)]
    pub eval_steps: usize,
    /// Continue the SFT from this checkpoint of an earlier run with the same options (e.g.
    /// `target/tiny-model/sft/checkpoint-300`) instead of starting afresh: the trainer resumes
    /// exactly, so the weights are those of an uninterrupted run.
    #[arg(long)]
    pub resume_from: Option<PathBuf>,
    /// Scratch folder for the tokenizer and the trainer's checkpoint and metrics
    /// [default: target/tiny-model].
    #[arg(long)]
    pub work_dir: Option<PathBuf>,
}

impl TinyModelArgs {
    /// The options of the shipped model (every flag at its default).
    pub fn defaults() -> Self {
        Self {
            steps: DEFAULT_STEPS,
            decay_steps: DEFAULT_DECAY_STEPS,
            out: None,
            seed: SYNTHETIC_DEFAULT.2,
            min_ops: SYNTHETIC_DEFAULT_PROBLEMS.0,
            max_ops: SYNTHETIC_DEFAULT_PROBLEMS.1,
            max_value: SYNTHETIC_DEFAULT_PROBLEMS.2,
            bare_fraction: DEFAULT_BARE_FRACTION,
            threads: DEFAULT_THREADS,
            eval_steps: 0,
            resume_from: None,
            work_dir: None,
        }
    }

    /// The synthetic data of the build (the example's `--dataset synthetic` for the defaults).
    fn data_source(&self) -> DataSource {
        let (train, eval, _) = SYNTHETIC_DEFAULT;
        DataSource::Synthetic {
            train,
            eval,
            seed: self.seed,
            min_ops: self.min_ops,
            max_ops: self.max_ops,
            max_value: self.max_value,
        }
    }
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

/// The model's configuration: Qwen2, hidden 128, 4 layers, 4 heads / 2 KV heads,
/// intermediate 512, vocab 512, tied embeddings; EOS `<|im_end|>` = 2, padding 0.
fn model_config() -> Result<ModelConfig> {
    let base = ModelConfig::new(Architecture::Qwen2, 512, 128, 512, 4, 4, 2)
        .map_err(|e| anyhow!("{e}"))?;
    let mut json = base.to_json(DType::F32);
    let obj = json
        .as_object_mut()
        .ok_or_else(|| anyhow!("config is an object"))?;
    obj.insert("bos_token_id".into(), 0.into());
    obj.insert("eos_token_id".into(), 2.into());
    obj.insert("pad_token_id".into(), 0.into());
    obj.insert("max_position_embeddings".into(), 1024.into());
    obj.insert("use_cache".into(), true.into());
    ModelConfig::from_json(&json).map_err(|e| anyhow!("{e}"))
}

/// Trainer options of one phase: `Constant` (warm-up, then `LR`) up to `a.steps -
/// a.decay_steps`, or `Linear` for the decay phase, which resumes from the constant phase's
/// last checkpoint. The trainer's linear schedule decays from the end of warm-up, so the decay
/// phase declares the constant phase as its "warm-up": it starts at that step and never runs
/// those steps, and its rate goes from `LR` to 0 over the last `a.decay_steps` steps.
fn sft_args(a: &TinyModelArgs, output_dir: &Path, decay: bool, resume: Option<&Path>) -> GRPOArgs {
    let constant_steps = a.steps - a.decay_steps;
    let mut args = GRPOArgs::preset(Recipe::Sft);
    args.output_dir = output_dir.display().to_string();
    args.batch_size = BATCH_SIZE;
    args.lr = LR;
    if decay {
        args.max_steps = a.steps;
        args.lr_scheduler = LrSchedule::Linear;
        args.warmup_steps = constant_steps;
        args.min_lr_ratio = 0.0;
    } else {
        args.max_steps = constant_steps;
        args.lr_scheduler = LrSchedule::Constant;
        args.warmup_steps = WARMUP_STEPS;
    }
    args.max_completion_length = MAX_COMPLETION_LENGTH;
    args.max_grad_norm = 1.0;
    args.weight_decay = 0.0;
    args.seed = a.seed;
    args.eval_steps = a.eval_steps;
    args.save_steps = a.eval_steps;
    args.save_total_limit = if a.eval_steps > 0 { 0 } else { 1 };
    args.logging_steps = 0;
    args.threads = a.threads;
    args.resume = resume.map_or(Resume::Never, |p| Resume::From(p.to_path_buf()));
    args.progress = true;
    args
}

fn pct(x: f64) -> String {
    format!("{:.1}%", 100.0 * x)
}

/// Runs the whole build.
///
/// # Errors
/// Any failing stage.
pub fn run(a: &TinyModelArgs) -> Result<()> {
    // Before any tensor or tokenizer work: both use the global rayon pool.
    atomrl_trainer::runtime::set_threads(a.threads);
    let started = Instant::now();
    if a.decay_steps > a.steps {
        bail!(
            "--decay-steps ({}) must not exceed --steps ({})",
            a.decay_steps,
            a.steps
        );
    }
    let root = workspace_root();
    let out = a
        .out
        .clone()
        .unwrap_or_else(|| root.join("examples/grpo_gsm8k/model"));
    let work = a
        .work_dir
        .clone()
        .unwrap_or_else(|| root.join("target/tiny-model"));
    let sft_dir = match &a.resume_from {
        Some(ckpt) => ckpt
            .parent()
            .ok_or_else(|| anyhow!("{} has no parent folder", ckpt.display()))?
            .to_path_buf(),
        None => {
            if work.exists() {
                std::fs::remove_dir_all(&work)
                    .with_context(|| format!("clearing {}", work.display()))?;
            }
            work.join("sft")
        }
    };
    let (n_train, n_eval, _) = SYNTHETIC_DEFAULT;

    println!(
        "== [1/4] synthetic data: {n_train} train / {n_eval} held-out problems, seed {}",
        a.seed
    );
    let data = a.data_source();
    println!("   dataset `{data}`");
    let train = data.load("train").map_err(|e| anyhow!("{e}"))?;
    let eval = data.load("test").map_err(|e| anyhow!("{e}"))?;

    println!("== [2/4] byte-level BPE tokenizer on the training split");
    let tok_dir = work.join("tokenizer");
    tokenizer::train_tokenizer(&train, &tok_dir)?;
    let stats = tokenizer::check_tokenizer(&tok_dir, &eval)?;
    println!(
        "   vocab {}, prompt {:.1} tokens (max {}), completion {:.1} tokens (max {}); digits one per token",
        stats.vocab_size, stats.prompt_tokens.0, stats.prompt_tokens.1, stats.completion_tokens.0, stats.completion_tokens.1
    );
    if !(0.0..=1.0).contains(&a.bare_fraction) {
        bail!("--bare-fraction must be in [0, 1], got {}", a.bare_fraction);
    }
    let train = sft_data::with_bare_answers(train, a.bare_fraction, a.seed);
    if a.bare_fraction > 0.0 {
        println!(
            "   {:.0}% of the SFT demonstrations answer without working",
            100.0 * a.bare_fraction
        );
    }
    let chat = || ChatTokenizer::from_hf_dir(&tok_dir).map_err(|e| anyhow!("{e}"));
    // The random initial model (a resumed phase overwrites every weight from its checkpoint).
    let new_model = || -> Result<CausalLm> {
        let mut model =
            CausalLm::from_config_random(model_config()?, a.seed, DType::F32, &Device::Cpu)
                .map_err(|e| anyhow!("{e}"))?;
        model.set_source_dir(&tok_dir);
        Ok(model)
    };
    let params = new_model()?.num_parameters();
    println!(
        "== [3/4] SFT of a random Qwen2 (hidden 128, 4 layers, 4/2 heads, {params} parameters): \
         {} steps x {BATCH_SIZE} examples, lr {LR:e}, {} thread(s)",
        a.steps, a.threads
    );
    let constant_steps = a.steps - a.decay_steps;
    let resumed_at = a.resume_from.as_deref().map(checkpoint_step).transpose()?;
    let encoder = PromptEncoder {
        chat_template: true,
        system_prompt: None,
        max_prompt_length: GRPOArgs::preset(Recipe::Sft).max_prompt_length,
        tool_schemas: Vec::new(),
    };
    let mut phase2_resume = a.resume_from.clone();
    if constant_steps > 0 && resumed_at.is_none_or(|s| s < constant_steps) {
        println!("   constant learning rate for {constant_steps} steps");
        let args = sft_args(a, &sft_dir, false, a.resume_from.as_deref());
        let mut trainer = Trainer::with_data(
            args,
            new_model()?,
            chat()?,
            WeightedRewards::new(),
            train.clone(),
            eval.clone(),
        )
        .map_err(|e| anyhow!("{e}"))?;
        let summary = trainer.train().map_err(|e| anyhow!("{e}"))?;
        phase2_resume = summary.checkpoint;
    }
    if a.decay_steps > 0 {
        println!(
            "   learning rate decaying linearly to 0 over {} steps",
            a.decay_steps
        );
    }
    // The decay phase (or, without one, a no-op resume at the last step).
    let args = sft_args(a, &sft_dir, a.decay_steps > 0, phase2_resume.as_deref());
    let mut trainer = Trainer::with_data(
        args,
        new_model()?,
        chat()?,
        WeightedRewards::new(),
        train,
        eval.clone(),
    )
    .map_err(|e| anyhow!("{e}"))?;
    let summary = trainer.train().map_err(|e| anyhow!("{e}"))?;
    let after = match summary.eval_after.clone() {
        Some(r) => r,
        // Resumed at the last step: nothing left to train, so nothing was evaluated.
        None => trainer.evaluate().map_err(|e| anyhow!("{e}"))?,
    };
    let (sft_seconds, before_accuracy) = step_time_and_first_eval(&sft_dir, a.steps)?;
    println!(
        "   SFT done ({sft_seconds:.0} s of training steps): held-out greedy accuracy {} -> {}, format {}",
        before_accuracy.map_or("-".into(), pct),
        pct(after.accuracy),
        pct(after.format_rate)
    );

    println!("== [4/4] writing {}", out.display());
    if out.exists() {
        std::fs::remove_dir_all(&out).with_context(|| format!("clearing {}", out.display()))?;
    }
    trainer.model().save_hf(&out).map_err(|e| anyhow!("{e}"))?;
    // The saved folder must load as the example loads it and score what the trainer saw.
    let reloaded =
        CausalLm::from_hf_dir(&out, DType::F32, &Device::Cpu).map_err(|e| anyhow!("{e}"))?;
    let reloaded_tok = ChatTokenizer::from_hf_dir(&out).map_err(|e| anyhow!("{e}"))?;
    let accuracy = atomrl_reward::Accuracy::default();
    let data = EvalData {
        model: &reloaded,
        tokenizer: &reloaded_tok,
        encoder: &encoder,
        examples: &eval,
        max_new_tokens: MAX_COMPLETION_LENGTH,
        tools: None,
        accuracy: &accuracy,
    };
    let check = evaluate(&data, 1, &atomrl_dist::SingleProcess).map_err(|e| anyhow!("{e}"))?;
    anyhow::ensure!(
        check.accuracy == after.accuracy && check.format_rate == after.format_rate,
        "the saved model scores {} / {} format, the trained one {} / {}",
        pct(check.accuracy),
        pct(check.format_rate),
        pct(after.accuracy),
        pct(after.format_rate)
    );
    let weights = std::fs::read(out.join("model.safetensors")).context("reading the weights")?;
    let sha = sha256::hex_digest(&weights);
    let build = BuildInfo {
        args: a,
        params,
        stats: &stats,
        after: &after,
        before: before_accuracy,
        sft_seconds,
        sha: &sha,
        sample: after.samples.first(),
    };
    let build_md = out.join("BUILD.md");
    let calibration = std::fs::read_to_string(&build_md)
        .map(|old| hand_written_calibration(&old).to_owned())
        .unwrap_or_default();
    std::fs::write(&build_md, build.markdown() + &calibration).context("writing BUILD.md")?;
    println!(
        "   done in {:.0} s: {params} parameters, held-out accuracy {} / format {}, model.safetensors sha256 {sha}",
        started.elapsed().as_secs_f64(),
        pct(after.accuracy),
        pct(after.format_rate)
    );
    Ok(())
}

/// The step of a checkpoint folder, from its `trainer_state.json`.
fn checkpoint_step(dir: &Path) -> Result<usize> {
    let path = dir.join("trainer_state.json");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    v.get("step")
        .and_then(serde_json::Value::as_u64)
        .map(|s| s as usize)
        .ok_or_else(|| anyhow!("{} has no step", path.display()))
}

/// Seconds spent in training steps 1..=`steps` and the accuracy at step 0, from the trainer's
/// `metrics.jsonl` (complete for resumed runs too).
fn step_time_and_first_eval(sft_dir: &Path, steps: usize) -> Result<(f64, Option<f64>)> {
    let path = sft_dir.join("metrics.jsonl");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let (mut seconds, mut first) = (0.0, None);
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let row: serde_json::Value =
            serde_json::from_str(line).with_context(|| format!("parsing {}", path.display()))?;
        let step = row
            .get(keys::STEP)
            .and_then(serde_json::Value::as_u64)
            .unwrap_or(0);
        if step == 0 {
            first = first.or_else(|| {
                row.get(keys::EVAL_ACCURACY)
                    .and_then(serde_json::Value::as_f64)
            });
        } else if step as usize <= steps {
            seconds += row
                .get(keys::TIME_STEP_S)
                .and_then(serde_json::Value::as_f64)
                .unwrap_or(0.0);
        }
    }
    Ok((seconds, first))
}

/// The hand-written `## Calibration` section of an earlier `BUILD.md` (with its leading
/// newline), or "" if it has none: a rebuild regenerates the facts above it but must not drop
/// the record of the runs that chose the settings.
fn hand_written_calibration(build_md: &str) -> &str {
    build_md
        .find("\n## Calibration")
        .map_or("", |start| &build_md[start..])
}

struct BuildInfo<'a> {
    args: &'a TinyModelArgs,
    params: usize,
    stats: &'a tokenizer::TokenizerStats,
    after: &'a EvalResult,
    before: Option<f64>,
    sft_seconds: f64,
    sha: &'a str,
    sample: Option<&'a (String, String, f64)>,
}

impl BuildInfo<'_> {
    fn markdown(&self) -> String {
        let a = self.args;
        let mut cmd = String::from("cargo xtask tiny-model");
        if a.steps != DEFAULT_STEPS {
            let _ = write!(cmd, " --steps {}", a.steps);
        }
        if a.decay_steps != DEFAULT_DECAY_STEPS {
            let _ = write!(cmd, " --decay-steps {}", a.decay_steps);
        }
        if a.seed != SYNTHETIC_DEFAULT.2 {
            let _ = write!(cmd, " --seed {}", a.seed);
        }
        if (a.min_ops, a.max_ops, a.max_value) != SYNTHETIC_DEFAULT_PROBLEMS {
            let _ = write!(
                cmd,
                " --min-ops {} --max-ops {} --max-value {}",
                a.min_ops, a.max_ops, a.max_value
            );
        }
        if a.bare_fraction != DEFAULT_BARE_FRACTION {
            let _ = write!(cmd, " --bare-fraction {}", a.bare_fraction);
        }
        if a.threads != DEFAULT_THREADS {
            let _ = write!(cmd, " --threads {}", a.threads);
        }
        let (n_train, n_eval, _) = SYNTHETIC_DEFAULT;
        let mut s = String::new();
        let _ = writeln!(s, "# The embedded tiny model of `grpo_gsm8k`\n");
        let _ = writeln!(
            s,
            "Built by AtomRL's own code, reproducibly (same command, same weights on CPU):\n\n\
             ```sh\n{cmd}\n```\n"
        );
        let _ = writeln!(s, "| | |\n|---|---|");
        let _ = writeln!(
            s,
            "| data | `{}`: synthetic word problems ({} to {} arithmetic steps, quantities up to {}); SFT on the {n_train} training ones, evaluated on the {n_eval} held-out ones (the example's eval set) |",
            a.data_source(), a.min_ops, a.max_ops, a.max_value
        );
        let _ = writeln!(
            s,
            "| tokenizer | byte-level BPE trained on the training split: {} tokens (`<|endoftext|>` = 0, `<|im_start|>` = 1, `<|im_end|>` = 2 special; `<think>`, `</think>`, `<answer>`, `</answer>` added), digits one per token, ChatML chat template; prompts {:.1} tokens on average (max {}), completions {:.1} (max {}) with `<|im_end|>` |",
            self.stats.vocab_size,
            self.stats.prompt_tokens.0,
            self.stats.prompt_tokens.1,
            self.stats.completion_tokens.0,
            self.stats.completion_tokens.1
        );
        let _ = writeln!(
            s,
            "| model | Qwen2, hidden 128, 4 layers, 4 heads / 2 KV heads, intermediate 512, vocab 512, tied embeddings: {} parameters, f32, random init (seed {}) |",
            self.params, a.seed
        );
        let _ = writeln!(
            s,
            "| SFT | {} steps x {BATCH_SIZE} examples, completion-only cross-entropy, AdamW lr {LR:e} (linear warm-up over {WARMUP_STEPS} steps, constant to step {}, then linear decay to 0 over the last {} steps), grad clip 1.0, no weight decay, {} CPU thread(s): {:.0} s of training steps (evaluations not counted) |",
            a.steps, a.steps - a.decay_steps, a.decay_steps, a.threads, self.sft_seconds
        );
        let _ = writeln!(
            s,
            "| SFT demonstrations | {:.0}% worked solutions (one `a op b=c` step per line in `<think>`), {:.0}% bare answers (an empty `<think>`), chosen per example with the seed |",
            100.0 * (1.0 - a.bare_fraction),
            100.0 * a.bare_fraction
        );
        let _ = writeln!(
            s,
            "| held-out greedy | accuracy {} (from {} at random init), format {}, mean completion {:.1} tokens ({} problems, max {MAX_COMPLETION_LENGTH} new tokens) |",
            pct(self.after.accuracy),
            self.before.map_or("-".into(), pct),
            pct(self.after.format_rate),
            self.after.mean_length,
            self.after.count
        );
        let _ = writeln!(s, "| `model.safetensors` sha256 | `{}` |", self.sha);
        if let Some((prompt, completion, score)) = self.sample {
            let _ = writeln!(
                s,
                "\nA held-out example (greedy, {}):\n\n```text\n{prompt}{completion}\n```",
                if *score > 0.0 { "right" } else { "wrong" }
            );
        }
        let _ = writeln!(
            s,
            "\nThe number of SFT steps is calibrated so that the model keeps the answer format \
             but is often wrong (weak, yet trainable): GRPO then has room to raise its accuracy. \
             Rebuild after changing the synthetic data, the tokenizer or the trainer."
        );
        if a.bare_fraction > 0.0 {
            let _ = writeln!(
                s,
                "\nWhy bare answers: the text real models learn from holds worked solutions next to \
                 bare answers, and a pretrained model imitates both. A model this small that \
                 answers a two-step problem without working is usually wrong, so the mixture \
                 makes it often wrong in a way a reward can reveal: nothing tells it that working \
                 pays but the correctness reward (both styles pass the format reward). GRPO finds \
                 out within a few hundred steps (the completions grow from ~14 to ~22 tokens) and \
                 then, more slowly, gets the working itself right."
            );
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::hand_written_calibration;

    #[test]
    fn a_rebuild_keeps_the_calibration_section() {
        let old = "# Model\n\n| a | b |\n\n## Calibration\n\nruns\n";
        assert_eq!(hand_written_calibration(old), "\n## Calibration\n\nruns\n");
        assert_eq!(hand_written_calibration("# Model\n"), "");
    }
}
