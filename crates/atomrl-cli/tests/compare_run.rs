//! `atomrl-compare` on runs written here (metrics and configurations, no training): the keys
//! that differ and only those, final and best values, a sweep folder standing for its trials,
//! the PNG, and a missing folder named in a one-line error.

#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::process::Command;

use common::temp_dir;

fn write_run(dir: &Path, lr: &str, acc: [f64; 3]) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(
        dir.join("config.toml"),
        format!(
            "lr = {lr}\nseed = 0\noutput_dir = {:?}\n[lora]\nr = 8\n",
            dir.display().to_string()
        ),
    )
    .unwrap();
    let lines: Vec<String> = acc
        .iter()
        .enumerate()
        .map(|(i, a)| {
            format!(
                "{{\"step\":{},\"eval/accuracy\":{a},\"loss\":{}}}",
                i * 10,
                1.0 / (i + 1) as f64
            )
        })
        .collect();
    // A torn last line, as a run being written leaves it.
    std::fs::write(
        dir.join("metrics.jsonl"),
        lines.join("\n") + "\n{\"step\":30,\"eval/acc",
    )
    .unwrap();
}

fn compare() -> Command {
    Command::new(env!("CARGO_BIN_EXE_atomrl-compare"))
}

#[test]
fn two_runs_and_a_sweep_compare() {
    let dir = temp_dir("compare");
    write_run(&dir.join("a"), "1e-4", [0.1, 0.4, 0.3]);
    write_run(&dir.join("b"), "2e-4", [0.1, 0.2, 0.5]);
    let png = dir.join("c.png");
    let out = compare()
        .args([dir.join("a"), dir.join("b")])
        .arg("--png")
        .arg(&png)
        .output()
        .unwrap();
    let md = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{md}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(md.contains("| lr | 0.0001 | 0.0002 |"), "{md}");
    assert!(
        !md.contains("| seed |") && !md.contains("| lora.r |") && !md.contains("| output_dir |"),
        "{md}"
    );
    assert!(
        md.contains("| eval/accuracy | 0.3000 (0.4000 @ 10) | 0.5000 (0.5000 @ 20) |"),
        "{md}"
    );
    assert!(md.contains("| loss | 0.3333 (0.3333 @ 20)"), "{md}");
    assert!(png.is_file());

    // A sweep folder: its trials' runs.
    write_run(&dir.join("sweep/trial-000/run"), "1e-4", [0.1, 0.1, 0.1]);
    write_run(&dir.join("sweep/trial-001/run"), "3e-4", [0.1, 0.2, 0.2]);
    let out = compare()
        .arg(dir.join("sweep"))
        .arg("--png")
        .arg(&png)
        .output()
        .unwrap();
    let md = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{md}");
    assert!(
        md.contains("trial-000")
            && md.contains("trial-001")
            && md.contains("| lr | 0.0001 | 0.0003 |"),
        "{md}"
    );
}

#[test]
fn a_missing_folder_is_named() {
    let out = compare().arg("/no/such/run").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("/no/such/run") && err.lines().count() == 1,
        "{err}"
    );
}
