//! AtomRL development tasks: `cargo xtask <task>`.

use std::process::Command;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};

mod bench;

/// Counts allocations for `cargo xtask bench --profile` (off, one atomic load per
/// allocation, otherwise).
#[global_allocator]
static ALLOCATOR: atomrl_core::profile::CountingAllocator = atomrl_core::profile::CountingAllocator;

mod dashboard_bench;
mod device_check;
mod hub_serve;
mod kernel_races;
mod matmul_bench;
mod read_bandwidth;
mod size;
mod tiny_model;

#[derive(Parser)]
#[command(name = "xtask", about = "AtomRL development tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Run what CI runs: fmt --check, clippy -D warnings, the test suite, the dependency check.
    Check,
    /// Check that the light atomic crates do not pull in heavy or CLI dependencies.
    Deps,
    /// Build the embedded tiny model of the `grpo_gsm8k` example (tokenizer + SFT), reproducibly.
    TinyModel(tiny_model::TinyModelArgs),
    /// Build the embedded tool-calling model of the `grpo_tools` example (a short SFT of the
    /// tiny model on calculator traces), reproducibly.
    TinyModelTools(tiny_model::tools_model::ToolModelArgs),
    /// Decode tokens/s, one GRPO step and peak memory on a random-weight model (docs/cuda.md).
    Bench(bench::BenchArgs),
    /// Check that a device (a GPU) computes what the CPU does: logits, log-probs, gradients,
    /// LoRA, gradient checkpointing, KV-cache decoding, in f32 and bf16; then a few GRPO steps.
    DeviceCheck(device_check::DeviceCheckArgs),
    /// Redraw a run's PNG charts from its `metrics.jsonl` (e.g. after a chart style change).
    Charts(ChartsArgs),
    /// Write a dataset spec's train and held-out splits as JSONL (e.g. the synthetic problems,
    /// for `xtask/fixtures/trl_grpo_learning.py`).
    Data(DataArgs),
    /// Check the size limits of the training step's crates: atomrl-trainer's non-test lines
    /// (at most the budget in xtask/src/size.rs), no function of the trainer, rollouts or
    /// sampler over 80 lines.
    Size,
    /// Time the dashboard opening a large run and comparing many (HTTP, cold and warm).
    DashboardBench(dashboard_bench::DashboardBenchArgs),
    /// Print the CPU's memory read bandwidth in bytes a second (`bench` runs it as a child
    /// process, so that the 1 GiB it reads never counts in the bench's peak memory).
    #[command(hide = true)]
    ReadBandwidth,
    /// Run the CUDA kernels' CPU tests (atomrl-cuda-sim) with the kernels built under
    /// ThreadSanitizer: a race between a block's threads fails the run (g++ or clang with
    /// libtsan).
    KernelRaces,
    /// Serve a local stand-in of the Hugging Face Hub (the fixture model, single-file and
    /// sharded, and a GSM8K-format dataset) to try downloads offline: set `HF_ENDPOINT` to it.
    HubServe(hub_serve::HubServeArgs),
}

#[derive(clap::Args)]
struct ChartsArgs {
    /// The run's output folder (reads `metrics.jsonl`, writes `charts/`).
    run: std::path::PathBuf,
}

fn charts(a: &ChartsArgs) -> Result<()> {
    use atomrl_trainer::logging::{read_metrics, write_charts};
    let rows = read_metrics(a.run.join("metrics.jsonl")).map_err(|e| anyhow::anyhow!("{e}"))?;
    for path in write_charts(&rows, &a.run.join("charts")).map_err(|e| anyhow::anyhow!("{e}"))? {
        println!("{}", path.display());
    }
    Ok(())
}

#[derive(clap::Args)]
struct DataArgs {
    /// A dataset spec as the trainer reads it (`synthetic`, `synthetic:TRAIN:EVAL:SEED:OPS:MAX`).
    #[arg(long, default_value = "synthetic")]
    dataset: String,
    /// Output folder: `train.jsonl` and `test.jsonl`.
    #[arg(long)]
    out: std::path::PathBuf,
}

fn data(a: &DataArgs) -> Result<()> {
    use atomrl_trainer::data::{write_jsonl, DataSource};
    let src = DataSource::parse(&a.dataset).map_err(|e| anyhow::anyhow!("{e}"))?;
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    for split in ["train", "test"] {
        let examples =
            atomrl_trainer::runtime::load_split(&src, split).map_err(|e| anyhow::anyhow!("{e}"))?;
        let path = a.out.join(format!("{split}.jsonl"));
        write_jsonl(&path, &examples).map_err(|e| anyhow::anyhow!("{e}"))?;
        println!("{}: {} examples", path.display(), examples.len());
    }
    Ok(())
}

/// Crates users `cargo add` for one piece: they must stay light.
const LIGHT_CRATES: [&str; 9] = [
    "atomrl-core",
    "atomrl-tools",
    "atomrl-dist",
    "atomrl-advantage",
    "atomrl-loss",
    "atomrl-reward",
    "atomrl-optim",
    "atomrl-data",
    "atomrl-metrics",
];

/// Dependencies that must never reach a light crate.
const FORBIDDEN: [&str; 5] = [
    "hf-hub",
    "clap",
    "candle-transformers",
    "minijinja",
    "atomrl-model",
];

fn main() -> Result<()> {
    atomrl_trainer::runtime::tune_allocator();
    atomrl_trainer::runtime::cblas_from_env()?;
    match Cli::parse().task {
        Task::Check => check(),
        Task::Deps => deps(),
        Task::Size => size::run(),
        Task::KernelRaces => kernel_races::run(),
        Task::TinyModel(args) => tiny_model::run(&args),
        Task::TinyModelTools(args) => tiny_model::tools_model::run(&args),
        Task::Bench(args) => bench::run(&args),
        Task::DeviceCheck(args) => device_check::run(&args).map(|_| ()),
        Task::Data(args) => data(&args),
        Task::Charts(args) => charts(&args),
        Task::DashboardBench(args) => dashboard_bench::run(&args),
        Task::HubServe(args) => hub_serve::run(&args).map(|_| ()),
        Task::ReadBandwidth => {
            println!("{}", read_bandwidth::cpu_read_bandwidth()?);
            Ok(())
        }
    }
}

fn cargo(args: &[&str]) -> Result<String> {
    let out = Command::new(env!("CARGO"))
        .args(args)
        .output()
        .with_context(|| format!("running cargo {}", args.join(" ")))?;
    if !out.status.success() {
        bail!(
            "cargo {} failed:\n{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn run_step(args: &[&str]) -> Result<()> {
    println!("== cargo {}", args.join(" "));
    let status = Command::new(env!("CARGO")).args(args).status()?;
    if !status.success() {
        bail!("cargo {} failed", args.join(" "));
    }
    Ok(())
}

/// `cargo doc` as `.ci/run` runs it: rustdoc's warnings (broken intra-doc links) are errors.
fn doc_step() -> Result<()> {
    println!("== RUSTDOCFLAGS=-D warnings cargo doc --workspace --no-deps");
    let status = Command::new(env!("CARGO"))
        .args(["doc", "--workspace", "--no-deps"])
        .env("RUSTDOCFLAGS", "-D warnings")
        .status()?;
    if !status.success() {
        bail!("cargo doc failed");
    }
    Ok(())
}

fn check() -> Result<()> {
    run_step(&["fmt", "--all", "--", "--check"])?;
    run_step(&[
        "clippy",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ])?;
    doc_step()?;
    // The test suite includes the dependency check (`tests::the_light_crates_keep_their_dependencies`).
    run_step(&["test", "--workspace"])?;
    size::run()
}

/// `tokenizers` is tolerated only as candle-core's own dependency: every candle-core 0.11.x
/// release depends on it unconditionally (for its GGUF tokenizer), so no crate built on candle
/// can avoid it. Nothing of ours may add it, nor any forbidden crate.
fn deps() -> Result<()> {
    for krate in LIGHT_CRATES {
        let tree = cargo(&[
            "tree", "-p", krate, "-e", "normal", "--prefix", "none", "--format", "{p}",
        ])?;
        let names: Vec<&str> = tree
            .lines()
            .filter_map(|l| l.split_whitespace().next())
            .collect();
        for bad in FORBIDDEN {
            if names.contains(&bad) {
                bail!("{krate} depends on {bad}; light crates must not");
            }
        }
        if names.contains(&"tokenizers") {
            let inverse = cargo(&[
                "tree",
                "-p",
                krate,
                "-e",
                "normal",
                "-i",
                "tokenizers",
                "--depth",
                "1",
                "--prefix",
                "none",
                "--format",
                "{p}",
            ])?;
            let dependents: Vec<&str> = inverse
                .lines()
                .skip(1)
                .filter_map(|l| l.split_whitespace().next())
                .collect();
            if dependents.iter().any(|d| *d != "candle-core") {
                bail!("{krate}: tokenizers reached through {dependents:?}, not only candle-core");
            }
        }
        let distinct: std::collections::BTreeSet<&str> = names.iter().copied().collect();
        println!(
            "{krate}: ok ({} crates; none of {})",
            distinct.len(),
            FORBIDDEN.join(", ")
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    /// The dependency check of `cargo xtask deps`, run with the test suite: CI need not build
    /// xtask a second time (a whole-workspace build of its own) to run it.
    #[test]
    fn the_light_crates_keep_their_dependencies() {
        super::deps().expect("the light crates' dependencies");
    }
}
