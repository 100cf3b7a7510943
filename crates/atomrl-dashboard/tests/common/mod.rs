//! A runs folder with one run of each kind the dashboard must show, made in a temporary
//! folder: finished, running, killed with a checkpoint, failed, from before runs wrote their
//! status, corrupt, a sweep's trial; plus links that lead out of the folder.

#![allow(dead_code, clippy::unwrap_used)]

use std::fmt::Write as _;
use std::fs;
use std::path::Path;

use atomrl_dashboard::{Dashboard, DEFAULT_HOST};
use tempfile::TempDir;

/// A fresh folder under the system's temporary one, removed when dropped.
pub fn temp_dir(tag: &str) -> TempDir {
    tempfile::Builder::new()
        .prefix(&format!("atomrl-dash-{tag}-"))
        .tempdir()
        .unwrap()
}

/// The fixture runs folder and the folder outside it that its links lead to; both are
/// removed when dropped.
pub struct Runs {
    root: TempDir,
    _outside: TempDir,
}

impl Runs {
    /// The runs folder.
    pub fn path(&self) -> &Path {
        self.root.path()
    }
}

/// Serves `root` on a free port from a background thread; its base URL.
pub fn serve(root: &Path) -> String {
    let d = Dashboard::bind(root, DEFAULT_HOST, 0).unwrap();
    let url = d.url();
    d.spawn().unwrap();
    url.trim_end_matches('/').to_string()
}

/// One metrics row of step `step` at wall time `t`.
pub fn metrics_row(step: u64, t: f64) -> String {
    let x = step as f64;
    format!(
        "{{\"step\":{step},\"reward/mean\":{},\"reward/std\":{},\"reward/correctness/mean\":{},\"accuracy\":{},\"loss\":{},\"kl\":{},\"lr\":1e-6,\"completion_length/mean\":{},\"time/step_s\":1.5,\"time/wall_s\":{t}}}\n",
        0.2 + 0.6 * (1.0 - (-x / 60.0).exp()),
        0.3 + 0.01 * (x / 7.0).sin(),
        0.1 + 0.7 * (1.0 - (-x / 50.0).exp()),
        0.1 + 0.5 * (1.0 - (-x / 80.0).exp()),
        0.05 * (x / 5.0).cos(),
        0.001 * x,
        120.0 - 0.2 * x,
    )
}

/// `steps` rows (an eval row at step 0 and every 50 steps) for a run started at `t0`.
fn metrics(steps: u64, t0: f64) -> String {
    let mut s = format!(
        "{{\"step\":0,\"eval/accuracy\":0.12,\"eval/format_rate\":0.3,\"time/wall_s\":{t0}}}\n"
    );
    for step in 1..=steps {
        let mut row = metrics_row(step, t0 + 1.5 * step as f64);
        if step % 50 == 0 {
            row.pop(); // the newline
            row.pop(); // the closing brace
            let _ = writeln!(
                row,
                ",\"eval/accuracy\":{},\"eval/format_rate\":0.9}}",
                0.12 + step as f64 / 1000.0
            );
        }
        s += &row;
    }
    s
}

/// A config.toml of recipe `grpo` with learning rate `lr`.
fn config(lr: &str, output_dir: &str, tools: bool) -> String {
    format!(
        "recipe = \"grpo\"\nmodel = \"embedded:tiny-word-problems\"\ndataset = \"embedded:word-problems\"\nlr = {lr}\nmax_steps = 200\ntime_budget_s = {}\nnum_generations = 4\noutput_dir = \"{output_dir}\"\ntools = [{}]\nsystem_prompt = \"Answer in <answer> tags.\"\n",
        if tools { "280.0" } else { "0.0" },
        if tools { "\"calculator\"" } else { "" }
    )
}

/// Logged completions: `steps` × 2 groups × 4, with a truncated completion and a tool call.
fn samples(steps: &[u64]) -> String {
    let mut s = String::new();
    for &step in steps {
        for i in 0..8u64 {
            let group = i / 4;
            let correct = (i + step / 10) % 3 == 0;
            let reward = if correct { 1.5 } else { 0.25 * (i % 2) as f64 };
            let finish = if i == 5 { "length" } else { "eos" };
            let tools = if i == 2 {
                r#"[{"name":"calculator","call":"{\"name\": \"calculator\", \"arguments\": {\"expression\": \"12*7\"}}","output":"84","failed":false}]"#
            } else {
                "[]"
            };
            let _ = writeln!(
                s,
                "{{\"step\":{step},\"index\":{i},\"group\":{group},\"prompt\":\"Tom has {n} apples and buys {m} more. How many?\",\"completion\":\"<think>{n}+{m}</think> <answer>{ans}</answer> <b>not bold</b>\",\"reward\":{reward},\"rewards\":{{\"correctness\":{c},\"format\":0.5}},\"advantage\":{adv},\"correct\":{correct},\"completion_tokens\":{len},\"finish_reason\":\"{finish}\",\"tool_calls\":{tools}}}",
                n = 3 + group,
                m = 4 + step % 5,
                ans = if correct { 7 + group + step % 5 } else { 99 },
                c = if correct { 1.0 } else { 0.0 },
                adv = if correct { 0.87 } else { -0.29 },
                len = 20 + 7 * i,
            );
        }
    }
    s
}

/// A `status.json`.
fn status(
    state: &str,
    pid: u32,
    process: Option<&str>,
    t0: f64,
    t1: f64,
    error: Option<&str>,
) -> String {
    serde_json::json!({
        "state": state, "steps_planned": 200, "started_at": t0, "updated_at": t1, "pid": pid,
        "process": process, "host": fs::read_to_string("/proc/sys/kernel/hostname").ok().map(|h| h.trim().to_string()),
        "error": error,
    })
    .to_string()
}

/// A complete checkpoint folder of `run` at `step`.
fn checkpoint(run: &Path, step: u64) {
    let dir = run.join(format!("checkpoint-{step}"));
    fs::create_dir_all(&dir).unwrap();
    fs::write(
        dir.join("trainer_state.json"),
        format!("{{\"step\":{step}}}"),
    )
    .unwrap();
}

/// The fixture runs folder in a new temporary folder.
pub fn fixture_runs(tag: &str) -> Runs {
    let root_dir = temp_dir(tag);
    let root = root_dir.path();
    let t0 = 1_764_000_000.0;
    let me = std::process::id();
    let my_name = fs::read_to_string("/proc/self/comm")
        .ok()
        .map(|s| s.trim().to_string());
    let write = |run: &str, file: &str, text: &str| {
        let dir = root.join(run);
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join(file), text).unwrap();
    };
    // Finished, with evaluations, checkpoints and rollouts.
    write("grpo-a", "metrics.jsonl", &metrics(200, t0));
    write(
        "grpo-a",
        "config.toml",
        &config("1e-6", "runs/grpo-a", true),
    );
    write(
        "grpo-a",
        "status.json",
        &status("finished", 1, None, t0, t0 + 300.0, None),
    );
    write("grpo-a", "samples.jsonl", &samples(&[10, 20]));
    checkpoint(&root.join("grpo-a"), 100);
    checkpoint(&root.join("grpo-a"), 200);
    // Running (this process writes it), a different learning rate.
    write("grpo-b", "metrics.jsonl", &metrics(120, t0 + 10.0));
    write(
        "grpo-b",
        "config.toml",
        &config("2e-6", "runs/grpo-b", false),
    );
    write(
        "grpo-b",
        "status.json",
        &status(
            "running",
            me,
            my_name.as_deref(),
            t0 + 10.0,
            t0 + 10.0,
            None,
        ),
    );
    write("grpo-b", "samples.jsonl", &samples(&[10]));
    // Killed (its process is gone) with a checkpoint: resumable.
    write("killed-c", "metrics.jsonl", &metrics(60, t0));
    write(
        "killed-c",
        "config.toml",
        &config("1e-6", "runs/killed-c", false),
    );
    write(
        "killed-c",
        "status.json",
        &status("running", 0x7fff_fff0, Some("atomrl-train"), t0, t0, None),
    );
    checkpoint(&root.join("killed-c"), 50);
    // Failed.
    write("failed-d", "metrics.jsonl", &metrics(5, t0));
    write(
        "failed-d",
        "config.toml",
        &config("1e-6", "runs/failed-d", false),
    );
    write(
        "failed-d",
        "status.json",
        &status(
            "failed",
            1,
            None,
            t0,
            t0 + 9.0,
            Some("data: train.jsonl:3: expected a JSON object"),
        ),
    );
    // From before runs wrote their status, configuration and wall times.
    write("old-e", "metrics.jsonl", "{\"step\":1,\"reward/mean\":0.5,\"loss\":0.1}\n{\"step\":2,\"reward/mean\":0.6,\"loss\":null}\n");
    write(
        "old-e",
        "samples.jsonl",
        "{\"step\":2,\"index\":0,\"prompt\":\"2+2?\",\"completion\":\"4\",\"reward\":1.0}\n",
    );
    // Corrupt: a bad line, a torn last line, a configuration and a status that do not parse.
    write("corrupt-f", "metrics.jsonl", "{\"step\":1,\"loss\":0.5}\n{this is not json}\n{\"step\":3,\"loss\":0.4}\n{\"step\":4,\"lo");
    write("corrupt-f", "config.toml", "lr = = 3\n");
    write("corrupt-f", "status.json", "{\"state\": \"runn");
    write("corrupt-f", "samples.jsonl", "not json\n");
    // A sweep's trial, two folders down.
    write("sweep/trial-000/run", "metrics.jsonl", &metrics(20, t0));
    write(
        "sweep/trial-000/run",
        "config.toml",
        &config("3e-6", "runs/sweep/trial-000/run", false),
    );
    // Links out of the folder: to a run outside it, and to /etc.
    let outside_dir = temp_dir(&format!("{tag}-outside"));
    let outside = outside_dir.path();
    fs::write(outside.join("metrics.jsonl"), metrics(3, t0)).unwrap();
    fs::write(outside.join("secret.txt"), "SECRET-OUTSIDE").unwrap();
    #[cfg(unix)]
    {
        std::os::unix::fs::symlink(outside, root.join("escape")).unwrap();
        std::os::unix::fs::symlink("/etc", root.join("etc-link")).unwrap();
    }
    fs::write(root.join("notes.txt"), "not a run").unwrap();
    Runs {
        root: root_dir,
        _outside: outside_dir,
    }
}
