//! `MetricsLogger` end to end, including a run killed with SIGKILL and resumed: its
//! metrics.jsonl and samples.jsonl must equal those of an uninterrupted run.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use atomrl_metrics::{read_metrics, MetricRow, MetricsLogger};

const TOTAL_STEPS: u64 = 30;
const CHECKPOINT_EVERY: u64 = 10;
const SAMPLES_EVERY: u64 = 5;
/// Set in the child process of the SIGKILL test: the output folder it logs into.
const CHILD_ENV: &str = "ATOMRL_LOGGING_KILL_CHILD_DIR";

fn temp_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("logging-logger-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// The metrics of step `s`, a pure function of `s` (step 13 is a skipped NaN step).
fn row(s: u64) -> MetricRow {
    let t = s as f64 / TOTAL_STEPS as f64;
    let mut row = MetricRow::new(s);
    row.push("reward/mean", 0.1 + 0.8 * t)
        .push("reward/std", 0.2)
        .push("reward/accuracy/mean", 0.1 + 0.8 * t)
        .push("accuracy", 0.1 + 0.8 * t)
        .push("completion_length/mean", 100.0 + s as f64)
        .push("completion_length/max", 200.0 + s as f64)
        .push("kl", 1e-3 * s as f64)
        .push("entropy", 1.0 - 0.5 * t)
        .push("loss", if s == 13 { f64::NAN } else { 0.1 * (1.0 - t) })
        .push("grad_norm", if s == 13 { f64::NAN } else { 0.5 })
        .push("lr", 1e-6)
        .push("skipped_step", if s == 13 { 1.0 } else { 0.0 });
    if s % CHECKPOINT_EVERY == 0 {
        row.push("eval/accuracy", 0.2 + 0.7 * t);
    }
    row
}

fn samples(s: u64) -> Vec<atomrl_core::RolloutRecord> {
    (0..2)
        .map(|i| atomrl_core::RolloutRecord {
            group: 0,
            prompt: format!("Q{s}.{i}: what is {s} + {i}?"),
            completion: format!("<think>\n{s}+{i}\n</think>\n{}", s + i),
            reward: f64::from(i == 0),
            rewards: [("correctness".to_string(), f64::from(i == 0))].into(),
            advantage: Some(if i == 0 { 0.7 } else { -0.7 }),
            correct: Some(i == 0),
            completion_tokens: 5,
            finish_reason: "eos".into(),
            tool_calls: vec![],
        })
        .collect()
}

/// Logs steps `from..=to` the way the trainer does.
fn log_steps(logger: &mut MetricsLogger, from: u64, to: u64, pause: Duration) {
    for s in from..=to {
        logger.log(&row(s)).unwrap();
        if s % SAMPLES_EVERY == 0 {
            logger.log_samples(s, &samples(s)).unwrap();
        }
        std::thread::sleep(pause);
    }
}

fn uninterrupted(dir: &Path) {
    let mut logger = MetricsLogger::create(dir, None, TOTAL_STEPS, false).unwrap();
    log_steps(&mut logger, 1, TOTAL_STEPS, Duration::ZERO);
}

fn read(path: PathBuf) -> String {
    std::fs::read_to_string(path).unwrap()
}

/// The rows of a `metrics.jsonl` without their wall time (which differs between runs), each
/// checked to have one.
fn rows_without_wall_time(path: PathBuf) -> Vec<MetricRow> {
    read_metrics(path)
        .unwrap()
        .into_iter()
        .map(|mut r| {
            let before = r.values.len();
            r.values
                .retain(|(k, _)| k != atomrl_metrics::keys::WALL_TIME_S);
            assert_eq!(
                r.values.len() + 1,
                before,
                "no wall time in step {}",
                r.step
            );
            r
        })
        .collect()
}

fn count_lines(path: &Path) -> usize {
    std::fs::read(path)
        .map(|b| b.iter().filter(|&&c| c == b'\n').count())
        .unwrap_or(0)
}

/// Not a test on its own: the body of the child process that `sigkill_then_resume...` kills.
#[test]
fn kill_child_body() {
    let Some(dir) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    let mut logger = MetricsLogger::create(Path::new(&dir), None, TOTAL_STEPS, false).unwrap();
    log_steps(&mut logger, 1, TOTAL_STEPS, Duration::from_millis(15));
    // Wait to be killed.
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

#[test]
fn sigkill_then_resume_writes_the_same_rows_as_an_uninterrupted_run() {
    let reference = temp_dir("reference");
    uninterrupted(&reference);

    let killed = temp_dir("killed");
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "kill_child_body",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, &killed)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let metrics = killed.join("metrics.jsonl");
    let start = Instant::now();
    while count_lines(&metrics) < 17 {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "child wrote no rows"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    child.kill().unwrap(); // SIGKILL on Unix
    child.wait().unwrap();
    let rows_at_kill = read_metrics(&metrics).unwrap().len();
    assert!(rows_at_kill >= 17, "{rows_at_kill}");
    // SIGKILL during a write leaves a torn line; make sure there is one.
    let mut torn = std::fs::OpenOptions::new()
        .append(true)
        .open(&metrics)
        .unwrap();
    std::io::Write::write_all(&mut torn, b"{\"step\":99,\"reward/me").unwrap();
    drop(torn);

    // Resume from the last checkpoint before the kill.
    let checkpoint = 10;
    let mut logger = MetricsLogger::create(&killed, Some(checkpoint), TOTAL_STEPS, false).unwrap();
    log_steps(&mut logger, checkpoint + 1, TOTAL_STEPS, Duration::ZERO);
    let charts = logger.finish().unwrap();
    assert_eq!(charts.len(), 6);

    // As JSON: a NaN loss is `null` in both (and NaN != NaN).
    let json = |path: PathBuf| -> Vec<String> {
        rows_without_wall_time(path)
            .iter()
            .map(|r| r.to_json().unwrap())
            .collect()
    };
    assert_eq!(
        json(killed.join("metrics.jsonl")),
        json(reference.join("metrics.jsonl"))
    );
    assert_eq!(
        read(killed.join("samples.jsonl")),
        read(reference.join("samples.jsonl"))
    );
    let steps: Vec<u64> = read_metrics(killed.join("metrics.jsonl"))
        .unwrap()
        .iter()
        .map(|r| r.step)
        .collect();
    assert_eq!(steps, (1..=TOTAL_STEPS).collect::<Vec<_>>());
    // One event file per process.
    assert_eq!(
        std::fs::read_dir(killed.join("tensorboard"))
            .unwrap()
            .count(),
        2
    );
    if std::env::var_os("ATOMRL_KEEP_TEST_OUTPUT").is_none() {
        std::fs::remove_dir_all(&reference).unwrap();
        std::fs::remove_dir_all(&killed).unwrap();
    }
}

#[test]
fn outputs_of_a_full_run() {
    let dir = temp_dir("full");
    let mut logger = MetricsLogger::create(&dir, None, TOTAL_STEPS, false).unwrap();
    assert_eq!(logger.output_dir(), dir.as_path());
    log_steps(&mut logger, 1, TOTAL_STEPS, Duration::ZERO);
    logger.log_samples(TOTAL_STEPS, &[]).unwrap(); // nothing
    logger.flush().unwrap();
    let charts = logger.finish().unwrap();

    let rows = rows_without_wall_time(logger.metrics_path());
    assert_eq!(rows.len() as u64, TOTAL_STEPS);
    assert_eq!(rows[0], row(1));
    assert!(rows[12].get("loss").unwrap().is_nan());
    assert_eq!(rows[9].get("eval/accuracy"), row(10).get("eval/accuracy"));
    let first = read(dir.join("metrics.jsonl"));
    assert!(first.starts_with("{\"step\":1,\"reward/mean\":"), "{first}");
    assert!(first.contains("\"loss\":null"));

    let samples: Vec<serde_json::Value> = read(dir.join("samples.jsonl"))
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(samples.len() as u64, 2 * TOTAL_STEPS / SAMPLES_EVERY);
    assert_eq!(samples[0]["step"], 5);
    assert_eq!(samples[0]["index"], 0);
    assert_eq!(samples[0]["prompt"], "Q5.0: what is 5 + 0?");
    assert_eq!(samples[1]["completion"], "<think>\n5+1\n</think>\n6");
    assert_eq!(samples[1]["reward"], 0.0);
    assert_eq!(samples[1]["advantage"], -0.7);
    assert_eq!(samples[1]["rewards"]["correctness"], 0.0);
    assert_eq!(samples[1]["finish_reason"], "eos");
    let status = atomrl_metrics::RunStatus::read(&dir).unwrap().unwrap();
    assert_eq!(status.state, atomrl_metrics::RunState::Finished);
    assert_eq!(status.steps_planned, TOTAL_STEPS);

    let names: Vec<String> = charts
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        [
            "reward.png",
            "accuracy.png",
            "completion_length.png",
            "kl.png",
            "entropy.png",
            "loss.png"
        ]
    );
    assert!(charts.iter().all(|p| p.starts_with(dir.join("charts"))));

    let tb = logger.tensorboard_path();
    assert!(tb.starts_with(dir.join("tensorboard")));
    assert!(std::fs::metadata(tb).unwrap().len() > 1000);
    if std::env::var_os("ATOMRL_KEEP_TEST_OUTPUT").is_none() {
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

#[test]
fn fresh_run_in_an_old_folder_starts_over() {
    let dir = temp_dir("fresh");
    uninterrupted(&dir);
    let mut logger = MetricsLogger::create(&dir, None, 3, false).unwrap();
    logger.log(&row(1)).unwrap();
    assert_eq!(read_metrics(logger.metrics_path()).unwrap().len(), 1);
    assert_eq!(read(dir.join("samples.jsonl")), "");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_reserved_metric_name_is_rejected_before_anything_is_written() {
    let dir = temp_dir("reserved");
    let mut logger = MetricsLogger::create(&dir, None, 3, false).unwrap();
    assert!(logger.log(&MetricRow::new(1).with("step", 1.0)).is_err());
    assert_eq!(read(dir.join("metrics.jsonl")), "");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Works with stderr a terminal (a bar; run under `script` to see it) or not (plain lines).
#[test]
fn enabled_progress_draws_or_prints() {
    let progress = atomrl_metrics::Progress::new(5, 1, true);
    assert_eq!(
        progress.has_bar(),
        std::io::IsTerminal::is_terminal(&std::io::stderr())
    );
    for s in 2..=5 {
        progress.update(&row(s).with("time/step_s", 0.01));
        progress.println(format!("message at step {s}"));
        std::thread::sleep(Duration::from_millis(50));
    }
    progress.finish();
}
