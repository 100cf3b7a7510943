//! PNG charts: valid files of the right size, one per metric group present.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

use atomrl_metrics::{chart_files, write_charts, MetricRow, CHART_SIZE};

fn temp_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("logging-charts-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// Width and height from a PNG's IHDR chunk, after checking the signature.
fn png_size(path: &Path) -> (u32, u32) {
    let bytes = std::fs::read(path).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "{}", path.display());
    assert_eq!(&bytes[12..16], b"IHDR");
    let w = u32::from_be_bytes(bytes[16..20].try_into().unwrap());
    let h = u32::from_be_bytes(bytes[20..24].try_into().unwrap());
    assert_eq!(&bytes[bytes.len() - 8..bytes.len() - 4], b"IEND");
    (w, h)
}

/// A plausible GRPO run: rising reward and accuracy, eval every 10 steps, a NaN step.
fn run_rows(steps: u64) -> Vec<MetricRow> {
    (1..=steps)
        .map(|s| {
            let t = s as f64 / steps as f64;
            let mut row = MetricRow::new(s);
            row.push("reward/mean", 0.2 + 0.6 * t + 0.05 * (s as f64).sin())
                .push("reward/std", 0.3 - 0.1 * t)
                .push("reward/accuracy/mean", 0.1 + 0.7 * t)
                .push("reward/format/mean", 0.5 + 0.4 * t)
                .push("accuracy", 0.1 + 0.7 * t + 0.03 * (s as f64).cos())
                .push("completion_length/mean", 180.0 - 60.0 * t)
                .push("completion_length/max", 512.0 - 100.0 * t)
                .push("kl", 0.002 * s as f64)
                .push("entropy", 0.9 - 0.4 * t)
                .push("loss", if s == 7 { f64::NAN } else { 0.05 * (1.0 - t) })
                .push("tools/calls_per_completion", 0.2 + 0.8 * t)
                .push("tools/error_rate", 0.1 * (1.0 - t))
                .push("tools/max_turns_frac", 0.0)
                .push("rewards/chosen", 0.1 * t)
                .push("rewards/rejected", -0.1 * t)
                .push("rewards/margins", 0.2 * t)
                .push("rewards/accuracies", 0.5 + 0.4 * t);
            if s % 10 == 0 {
                row.push("eval/accuracy", 0.15 + 0.65 * t);
            }
            row
        })
        .collect()
}

#[test]
fn every_chart_is_a_valid_png_of_the_right_size() {
    let dir = temp_dir("all");
    let written = write_charts(&run_rows(60), &dir).unwrap();
    let names: Vec<&str> = written
        .iter()
        .map(|p| p.file_name().unwrap().to_str().unwrap())
        .collect();
    assert_eq!(names, chart_files());
    assert_eq!(
        names,
        [
            "reward.png",
            "accuracy.png",
            "completion_length.png",
            "tools.png",
            "kl.png",
            "entropy.png",
            "preference.png",
            "loss.png"
        ]
    );
    for path in &written {
        assert!(path.starts_with(&dir));
        assert_eq!(png_size(path), CHART_SIZE);
        assert_eq!(CHART_SIZE, (800, 480));
    }
    // Keep the output for a look when ATOMRL_KEEP_TEST_OUTPUT is set.
    if std::env::var_os("ATOMRL_KEEP_TEST_OUTPUT").is_none() {
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

#[test]
fn charts_of_missing_metrics_are_not_written() {
    let dir = temp_dir("partial");
    let rows: Vec<MetricRow> = (0..5)
        .map(|s| {
            MetricRow::new(s)
                .with("reward/mean", s as f64)
                .with("kl", f64::NAN) // never finite: no kl.png
                .with("eval/accuracy", 0.5) // alone it does not make a reward chart
        })
        .collect();
    let written = write_charts(&rows, &dir).unwrap();
    let names: Vec<&str> = written
        .iter()
        .map(|p| p.file_name().unwrap().to_str().unwrap())
        .collect();
    assert_eq!(names, ["reward.png", "accuracy.png"]);
    assert!(!dir.join("kl.png").exists());
    assert!(!dir.join("loss.png").exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn no_metrics_no_charts_and_no_folder() {
    let dir = temp_dir("empty");
    assert!(write_charts(&[], &dir).unwrap().is_empty());
    assert!(write_charts(&[MetricRow::new(1).with("lr", 1e-6)], &dir)
        .unwrap()
        .is_empty());
    assert!(!dir.exists());
}

#[test]
fn single_step_and_constant_series_render() {
    let dir = temp_dir("single");
    let written = write_charts(
        &[MetricRow::new(0).with("loss", 0.0).with("entropy", 2.0)],
        &dir,
    )
    .unwrap();
    assert_eq!(written.len(), 2);
    for path in &written {
        assert_eq!(png_size(path), CHART_SIZE);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn unwritable_folder_is_a_file_error() {
    let dir = temp_dir("blocked");
    std::fs::create_dir_all(dir.parent().unwrap()).unwrap();
    std::fs::write(&dir, b"a file, not a folder").unwrap();
    let err = write_charts(&run_rows(3), &dir).unwrap_err().to_string();
    assert!(err.starts_with(&dir.display().to_string()), "{err}");
    std::fs::remove_file(&dir).unwrap();
}
