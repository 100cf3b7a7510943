//! metrics.jsonl: row round trips and the resume cut, including torn last lines.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

use atomrl_metrics::{read_metrics, JsonlWriter, MetricRow};
use proptest::prelude::*;

fn temp_file(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(dir).unwrap();
    dir.join(format!("logging-jsonl-{name}.jsonl"))
}

fn same(a: f64, b: f64) -> bool {
    if a.is_finite() {
        a.to_bits() == b.to_bits() || a == b
    } else {
        b.is_nan()
    }
}

fn any_value() -> impl Strategy<Value = f64> {
    prop_oneof![
        8 => any::<f64>(),
        1 => Just(f64::NAN),
        1 => Just(f64::INFINITY),
        1 => Just(-0.0),
    ]
}

proptest! {
    #[test]
    fn row_json_round_trip(
        step in any::<u64>(),
        values in proptest::collection::vec(("[a-z_/]{1,12}", any_value()), 0..12),
    ) {
        let mut row = MetricRow::new(step);
        for (name, value) in &values {
            if name != "step" {
                row.push(name.clone(), *value);
            }
        }
        let line = row.to_json().unwrap();
        prop_assert!(!line.contains('\n'));
        let back = MetricRow::from_json(&line).unwrap();
        prop_assert_eq!(back.step, step);
        prop_assert_eq!(back.values.len(), row.values.len());
        for ((n1, v1), (n2, v2)) in row.values.iter().zip(&back.values) {
            prop_assert_eq!(n1, n2);
            prop_assert!(same(*v1, *v2), "{} {} -> {}", n1, v1, v2);
        }
    }

    /// Whatever a killed run left (any number of rows past the checkpoint, a line torn at any
    /// byte), resuming and re-logging gives the uninterrupted file byte for byte.
    #[test]
    fn resume_after_any_kill_point_matches_uninterrupted(
        total in 1u64..25,
        checkpoint_frac in 0.0f64..1.0,
        killed_frac in 0.0f64..1.0,
        torn_frac in 0.0f64..1.0,
    ) {
        let row = |s: u64| {
            MetricRow::new(s)
                .with("reward/mean", s as f64 / 7.0)
                .with("loss", if s % 5 == 0 { f64::NAN } else { 1.0 / s as f64 })
        };
        let reference: String = (1..=total).map(|s| row(s).to_json().unwrap() + "\n").collect();

        let checkpoint = (checkpoint_frac * total as f64) as u64; // 0..total
        let killed_after = checkpoint + (killed_frac * (total - checkpoint) as f64) as u64;
        let mut left: String =
            (1..=killed_after).map(|s| row(s).to_json().unwrap() + "\n").collect();
        let torn = row(killed_after + 1).to_json().unwrap();
        let cut = (torn_frac * torn.len() as f64) as usize; // 0..len: never a complete line
        left.push_str(&torn[..cut]);

        let path = temp_file("prop-resume");
        std::fs::write(&path, &left).unwrap();
        let mut w = JsonlWriter::open(&path, Some(checkpoint)).unwrap();
        prop_assert_eq!(w.kept_rows() as u64, checkpoint);
        for s in checkpoint + 1..=total {
            w.write(&row(s)).unwrap();
        }
        drop(w);
        prop_assert_eq!(std::fs::read_to_string(&path).unwrap(), reference);
    }
}

#[test]
fn resume_with_checkpoint_beyond_the_file_keeps_everything() {
    let path = temp_file("beyond");
    let mut w = JsonlWriter::open(&path, None).unwrap();
    for s in 1..=3 {
        w.write(&MetricRow::new(s).with("kl", 0.1)).unwrap();
    }
    drop(w);
    let before = std::fs::read(&path).unwrap();
    let w = JsonlWriter::open(&path, Some(100)).unwrap();
    assert_eq!(w.kept_rows(), 3);
    assert_eq!(std::fs::read(&path).unwrap(), before);
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn rows_without_a_step_cannot_be_written() {
    let path = temp_file("reserved");
    let mut w = JsonlWriter::open(&path, None).unwrap();
    assert!(w.write(&MetricRow::new(1).with("step", 1.0)).is_err());
    assert_eq!(std::fs::read(&path).unwrap(), b"");
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn read_errors_name_file_and_line() {
    let path = temp_file("errors");
    std::fs::write(&path, "{\"step\":1}\n\n{\"step\":2,\"kl\":\"high\"}\n").unwrap();
    let err = read_metrics(&path).unwrap_err().to_string();
    assert!(err.starts_with(&format!("{}:3: ", path.display())), "{err}");
    assert!(err.contains("`kl` to be a number"), "{err}");
    std::fs::remove_file(&path).unwrap();

    let err = read_metrics(&path).unwrap_err().to_string();
    assert!(err.starts_with(&path.display().to_string()), "{err}");
}

#[test]
fn a_parent_that_is_a_file_is_an_error_not_a_panic() {
    let blocker = temp_file("blocker");
    std::fs::write(&blocker, b"x").unwrap();
    let err = JsonlWriter::open(blocker.join("metrics.jsonl"), None).unwrap_err();
    assert!(err.to_string().contains("metrics.jsonl"), "{err}");
    let err = JsonlWriter::open(blocker.join("metrics.jsonl"), Some(3)).unwrap_err();
    assert!(err.to_string().contains("metrics.jsonl"), "{err}");
    std::fs::remove_file(&blocker).unwrap();
}
