//! `cargo xtask dashboard-bench`: how long the dashboard takes to open a large run and a
//! comparison of many runs, over HTTP, cold (first read of the files) and warm (cached), and
//! what a live run's poll costs.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result};
use atomrl_dashboard::{Dashboard, DEFAULT_HOST};
use atomrl_trainer::logging::keys;

#[derive(clap::Args)]
pub struct DashboardBenchArgs {
    /// Rows of the large run.
    #[arg(long, default_value_t = 100_000)]
    rows: u64,
    /// Runs compared.
    #[arg(long, default_value_t = 20)]
    runs: usize,
    /// Rows of each compared run.
    #[arg(long, default_value_t = 100_000)]
    compared_rows: u64,
    /// Where the generated runs go (a temporary folder when not given; removed at the end).
    #[arg(long)]
    dir: Option<std::path::PathBuf>,
}

/// One row as the GRPO trainer logs it: 33 metrics and the wall time.
fn row(step: u64, seed: u64) -> String {
    let x = step as f64 + seed as f64 * 0.37;
    let mut s = format!("{{\"step\":{step}");
    let correctness = keys::reward_fn_mean("correctness");
    let format = keys::reward_fn_mean("format");
    let names = [
        keys::REWARD_MEAN,
        keys::REWARD_STD,
        &correctness,
        &format,
        keys::ACCURACY,
        keys::COMPLETION_LENGTH_MEAN,
        keys::COMPLETION_LENGTH_MAX,
        keys::TRUNCATED_FRAC,
        keys::ZERO_STD_GROUPS_FRAC,
        keys::DROPPED_GROUPS,
        keys::GENERATION_ROUNDS,
        keys::KL,
        keys::ENTROPY,
        keys::CLIP_FRAC_LOW,
        keys::CLIP_FRAC_HIGH,
        keys::CLIP_FRAC_TOTAL,
        keys::PPO_KL,
        keys::LOSS,
        keys::GRAD_NORM,
        keys::LR,
        keys::SKIPPED_STEP,
        keys::TIME_STEP_S,
        keys::TIME_GENERATE_S,
        keys::TIME_TRAIN_S,
        keys::THROUGHPUT_COMPLETIONS_PER_S,
        keys::THROUGHPUT_TOKENS_PER_S,
        keys::TOOLS_CALLS_PER_COMPLETION,
        keys::TOOLS_ERROR_RATE,
        keys::TOOLS_MAX_TURNS_FRAC,
        keys::TOOLS_USE_FRAC,
        keys::CRITIC_VALUE_LOSS,
        keys::CRITIC_CLIP_FRAC,
        keys::CRITIC_EXPLAINED_VARIANCE,
    ];
    for (i, name) in names.iter().enumerate() {
        let v = (x / (7.0 + i as f64)).sin() * (1.0 + i as f64) + 0.001 * x;
        let _ = write!(s, ",\"{name}\":{v}");
    }
    if step.is_multiple_of(50) {
        let _ = write!(
            s,
            ",\"{}\":{}",
            keys::EVAL_ACCURACY,
            0.1 + 0.5 * (1.0 - (-x / 5e4).exp())
        );
    }
    let _ = writeln!(
        s,
        ",\"{}\":{}}}",
        keys::WALL_TIME_S,
        1.764e9 + 1.5 * step as f64
    );
    s
}

/// Writes a run of `rows` rows (and its config) into `dir`.
fn write_run(dir: &Path, rows: u64, seed: u64) -> Result<u64> {
    std::fs::create_dir_all(dir)?;
    let mut text = String::with_capacity(rows as usize * 1100);
    for step in 1..=rows {
        text.push_str(&row(step, seed));
    }
    std::fs::write(dir.join("metrics.jsonl"), &text)?;
    std::fs::write(
        dir.join("config.toml"),
        format!(
            "recipe = \"grpo\"\nlr = {}\nseed = {seed}\n",
            1e-6 * (1 + seed % 4) as f64
        ),
    )?;
    Ok(text.len() as u64)
}

/// Seconds and bytes of a GET of `url`.
fn timed_get(url: &str) -> Result<(f64, usize)> {
    let t = Instant::now();
    let body = ureq::get(url)
        .call()
        .with_context(|| format!("GET {url}"))?
        .into_string()?;
    Ok((t.elapsed().as_secs_f64(), body.len()))
}

pub fn run(a: &DashboardBenchArgs) -> Result<()> {
    let owned = a.dir.is_none();
    let root = a.dir.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("atomrl-dashboard-bench-{}", std::process::id()))
    });
    let _ = std::fs::remove_dir_all(&root);
    let t = Instant::now();
    let big = write_run(&root.join("big"), a.rows, 0)?;
    let mut compared = 0;
    for i in 0..a.runs {
        compared += write_run(
            &root.join(format!("cmp-{i:02}")),
            a.compared_rows,
            i as u64 + 1,
        )?;
    }
    println!(
        "generated: 1 run of {} rows ({:.0} MB), {} runs of {} rows ({:.0} MB) in {:.1} s",
        a.rows,
        big as f64 / 1e6,
        a.runs,
        a.compared_rows,
        compared as f64 / 1e6,
        t.elapsed().as_secs_f64()
    );
    // The reader alone, one thread: what a cold open is bound by.
    let t = Instant::now();
    let mut m = atomrl_dashboard::RunMetrics::new(&root.join("big/metrics.jsonl"));
    m.refresh();
    let s = t.elapsed().as_secs_f64();
    println!(
        "reading metrics.jsonl (one thread): {} rows in {s:.3} s, {:.0} MB/s",
        m.steps().len(),
        big as f64 / 1e6 / s
    );
    drop(m);
    let d = Dashboard::bind(&root, DEFAULT_HOST, 0)?;
    let url = d.url();
    d.spawn()?;
    let names: Vec<String> = (0..a.runs).map(|i| format!("cmp-{i:02}")).collect();
    let compare = format!("{url}api/compare?runs={}", names.join(","));
    let page = [
        ("run page: detail", format!("{url}api/run/big")),
        ("run page: metrics", format!("{url}api/run/big/metrics")),
    ];
    println!("| request | cold s | warm s | response |");
    println!("|---|---|---|---|");
    let mut open_run = (0.0, 0.0);
    for (what, u) in &page {
        let (cold, _) = timed_get(u)?;
        let (warm, bytes) = timed_get(u)?;
        open_run.0 += cold;
        open_run.1 += warm;
        println!(
            "| {what} | {cold:.3} | {warm:.3} | {:.0} kB |",
            bytes as f64 / 1e3
        );
    }
    println!(
        "| **open a {}-row run** (both) | **{:.3}** | **{:.3}** | |",
        a.rows, open_run.0, open_run.1
    );
    let (cold, _) = timed_get(&compare)?;
    let (warm, bytes) = timed_get(&compare)?;
    println!(
        "| **compare {} runs of {} rows** | **{cold:.3}** | **{warm:.3}** | {:.0} kB |",
        a.runs,
        a.compared_rows,
        bytes as f64 / 1e3
    );
    let (list_s, _) = timed_get(&format!("{url}api/runs"))?;
    println!(
        "| runs list ({} runs, cached) | | {list_s:.3} | |",
        a.runs + 1
    );
    // A live run: one appended row, then the poll that reads it.
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(root.join("big/metrics.jsonl"))?;
    std::io::Write::write_all(&mut f, row(a.rows + 1, 0).as_bytes())?;
    let (poll, _) = timed_get(&format!("{url}api/run/big/metrics"))?;
    println!("| live poll after one appended row | | {poll:.3} | |");
    if owned {
        let _ = std::fs::remove_dir_all(&root);
    }
    Ok(())
}
