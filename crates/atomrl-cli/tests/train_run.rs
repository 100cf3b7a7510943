//! `atomrl-train` end to end on the tiny random Qwen2 fixture: a run killed with SIGKILL
//! resumes and writes the same rows as an uninterrupted one (and the dashboard reads it as
//! killed and resumable, then finished); configuration errors exit 2 naming the key.

#![allow(clippy::unwrap_used)]

mod common;

use common::{comparable, model_dir, temp_dir, train_bin, write_dataset};
use std::path::{Path, PathBuf};

use atomrl_trainer::logging::read_metrics;

fn write_config(dir: &Path, max_steps: usize) -> PathBuf {
    let data = write_dataset(dir);
    let path = dir.join("run.toml");
    let toml = format!(
        "model = {:?}\ndataset = {:?}\noutput_dir = {:?}\nmax_steps = {max_steps}\nbatch_size = 2\nnum_generations = 4\n\
         max_completion_length = 12\neval_size = 4\nlr = 1e-3\nsave_steps = 2\nlogging_steps = 2\nprogress = false\n\
         lr_scheduler = \"cosine\"\nwarmup_steps = 1\n[[rewards]]\nname = \"digit\"\n[[rewards]]\nname = \"overlong\"\noptions = {{ buffer_len = 12 }}\n",
        model_dir(),
        data.display().to_string(),
        dir.join("run").display().to_string()
    );
    std::fs::write(&path, toml).unwrap();
    path
}

#[test]
fn a_killed_run_resumes_and_writes_the_same_rows_as_an_uninterrupted_one() {
    let straight = temp_dir("resume-straight");
    let cfg = write_config(&straight, 6);
    // With the dashboard on a free port, beside the run.
    let out = train_bin()
        .args(["--config", cfg.to_str().unwrap(), "--dashboard", "0"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("dashboard of ") && stderr.contains("at http://127.0.0.1:"),
        "{stderr}"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("dashboard:   cargo run --release -p atomrl-dashboard -- "),
        "{stdout}"
    );
    assert_eq!(
        dashboard_status(&straight.join("run")),
        ("finished", false, Some(6))
    );
    // The rollout log: every 2 steps, whole groups of 4 with their rewards and advantages.
    let samples = std::fs::read_to_string(straight.join("run/samples.jsonl")).unwrap();
    let records: Vec<serde_json::Value> = samples
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(records.len(), 3 * 8, "{samples}");
    assert_eq!(records[5]["group"], 1);
    assert!(records[5]["advantage"].is_number() && records[5]["rewards"]["digit"].is_number());
    assert!(["eos", "stop", "length"].contains(&records[5]["finish_reason"].as_str().unwrap()));

    let killed = temp_dir("resume-killed");
    let cfg = write_config(&killed, 6);
    // Killed with SIGKILL after step 3 was logged: the last checkpoint is step 2.
    let status = train_bin()
        .args(["--config", cfg.to_str().unwrap()])
        .env("ATOMRL_TEST_KILL_AFTER_STEP", "3")
        .status()
        .unwrap();
    assert!(!status.success());
    assert!(killed.join("run/checkpoint-2").is_dir() && !killed.join("run/checkpoint-4").exists());
    assert_eq!(
        dashboard_status(&killed.join("run")),
        ("killed", true, Some(6))
    );
    let out = train_bin()
        .args(["--config", cfg.to_str().unwrap(), "--resume"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        dashboard_status(&killed.join("run")),
        ("finished", false, Some(6))
    );

    let (a, b) = (
        comparable(&straight.join("run/metrics.jsonl")),
        comparable(&killed.join("run/metrics.jsonl")),
    );
    assert_eq!(a.len(), 7);
    // The rows compared carry a learning signal (so equal rows mean equal weights and state).
    let learning = read_metrics(straight.join("run/metrics.jsonl"))
        .unwrap()
        .iter()
        .filter(|r| r.get("grad_norm").is_some_and(|g| g > 0.0))
        .count();
    assert!(learning >= 4, "only {learning} steps had a gradient");
    assert_eq!(
        a, b,
        "rows after resuming differ from the uninterrupted run"
    );
}

/// The dashboard's status of the run in `dir`: its word, whether it can resume, the steps
/// planned.
fn dashboard_status(dir: &Path) -> (&'static str, bool, Option<u64>) {
    let mut m = atomrl_dashboard::RunMetrics::new(&dir.join("metrics.jsonl"));
    m.refresh();
    let s = atomrl_dashboard::summarize("run", dir, &m);
    (s.status, s.resumable, s.steps_planned)
}

#[test]
fn config_errors_name_the_key() {
    let dir = temp_dir("config-errors");
    let cfg = write_config(&dir, 2);
    let a_file = format!("output_dir={:?}", cfg.display().to_string());
    for (set, needle) in [
        ("output_dir=\"\"", "`output_dir`"),
        (a_file.as_str(), "`output_dir` must be a folder"),
        ("lr=-1", "`lr`"),
        ("num_generations=1", "`num_generations`"),
        ("bogus=1", "bogus"),
        ("kl_estimator=\"k9\"", "`kl_estimator`"),
        ("lr=\"fast\"", "`lr`"),
        ("dtype=\"f64\"", "`dtype`"),
        ("batch_size=\"eight\"", "`batch_size`"),
    ] {
        let out = train_bin()
            .args(["--config", cfg.to_str().unwrap(), "--set", set])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{set}: {err}");
        assert!(err.contains(needle), "{set}: {err}");
    }
}
