//! End-to-end tests of the `atomrl-fn` binary: listing, help, the JSON and safetensors
//! contracts, flags, and the one-line exit-2 errors on bad input.

#![allow(clippy::unwrap_used)]

use std::io::Write;
use std::process::{Command, Output, Stdio};

fn atomrl_fn(args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_atomrl-fn"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn atomrl-fn");
    let mut pipe = child.stdin.take().expect("stdin");
    if let Some(text) = stdin {
        pipe.write_all(text.as_bytes()).expect("write stdin");
    }
    drop(pipe);
    child.wait_with_output().expect("wait atomrl-fn")
}

fn stdout_json(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("stdout is JSON")
}

#[test]
fn list_has_one_line_per_function() {
    let out = atomrl_fn(&["list"], None);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let line = text
        .lines()
        .find(|l| l.starts_with("compute_advantages "))
        .expect("listed");
    assert!(line.contains("atomrl-advantage"), "{line}");
    assert_eq!(text.lines().count(), atomrl_fn::catalog::all().len());
}

#[test]
fn help_shows_formula_shapes_and_example() {
    let out = atomrl_fn(&["compute_advantages", "--help"], None);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    for needle in [
        "FORMULA",
        "(r - mean_g) / (std_g + eps)",
        "INPUTS",
        "rewards",
        "[N]",
        "OUTPUTS",
        "group_std",
        "EXAMPLE",
        "--input -",
    ] {
        assert!(text.contains(needle), "help lacks {needle:?}:\n{text}");
    }
}

#[test]
fn acceptance_example_gives_exact_zeros_for_the_flat_group() {
    let out = atomrl_fn(
        &["compute_advantages", "--input", "-"],
        Some(r#"{"rewards":[1,0,0,1,1,1,1,1],"group_size":4,"mode":"grpo"}"#),
    );
    let v = stdout_json(&out);
    assert_eq!(v["advantages"]["shape"], serde_json::json!([8]));
    let data: Vec<f64> = serde_json::from_value(v["advantages"]["data"].clone()).unwrap();
    assert_eq!(&data[4..], &[0.0; 4]);
    assert!((data[0] - 0.866_024).abs() < 1e-5);
}

#[test]
fn flags_override_the_file_and_can_replace_it() {
    let v = stdout_json(&atomrl_fn(
        &[
            "compute_advantages",
            "--input",
            "-",
            "--mode",
            "grpo_no_std",
        ],
        Some(r#"{"rewards":[1,0],"group_size":2,"mode":"grpo"}"#),
    ));
    assert_eq!(v["advantages"]["data"], serde_json::json!([0.5, -0.5]));
    let v = stdout_json(&atomrl_fn(
        &[
            "compute_advantages",
            "--rewards",
            "[3, 1]",
            "--group-size",
            "2",
            "--mode",
            "raw",
        ],
        None,
    ));
    assert_eq!(v["advantages"]["data"], serde_json::json!([3.0, 1.0]));
}

#[test]
fn json_file_and_output_file_round_trip() {
    let tmp = tempfile::Builder::new()
        .prefix("atomrl-fn-test-")
        .tempdir()
        .unwrap();
    let dir = tmp.path();
    let input = dir.join("batch.json");
    std::fs::write(
        &input,
        r#"{"rewards": {"shape": [4], "data": [1, 0, 1, 1]}, "group_size": 2}"#,
    )
    .unwrap();
    let output = dir.join("out.json");
    let out = atomrl_fn(
        &[
            "compute_advantages",
            "--input",
            input.to_str().unwrap(),
            "--output",
            output.to_str().unwrap(),
        ],
        None,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.stdout.is_empty());
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&output).unwrap()).unwrap();
    assert_eq!(v["advantages"]["shape"], serde_json::json!([4]));
}

#[test]
fn safetensors_input_and_output() {
    use candle_core::{Device, Tensor};
    let tmp = tempfile::Builder::new()
        .prefix("atomrl-fn-st-")
        .tempdir()
        .unwrap();
    let dir = tmp.path();
    let input = dir.join("batch.safetensors");
    let rewards = Tensor::new(&[1f32, 0.0, 0.5, 0.5], &Device::Cpu).unwrap();
    candle_core::safetensors::save(
        &std::collections::HashMap::from([("rewards".to_string(), rewards)]),
        &input,
    )
    .unwrap();
    let output = dir.join("out.safetensors");
    let out = atomrl_fn(
        &[
            "compute_advantages",
            "--input",
            input.to_str().unwrap(),
            "--group-size",
            "2",
            "--output",
            output.to_str().unwrap(),
        ],
        None,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tensors = candle_core::safetensors::load(&output, &Device::Cpu).unwrap();
    let adv = tensors["advantages"].to_vec1::<f32>().unwrap();
    assert!(
        (adv[0] - std::f32::consts::FRAC_1_SQRT_2).abs() < 1e-5 && adv[2] == 0.0,
        "{adv:?}"
    );
    assert_eq!(tensors["num_flat_groups"].to_scalar::<i64>().unwrap(), 1);
}

#[test]
fn bad_inputs_exit_2_with_one_line_naming_the_field() {
    let cases: &[(&str, &str)] = &[
        (r#"{"group_size":2}"#, "missing required argument `rewards`"),
        (
            r#"{"rewards":[[1,0]],"group_size":2}"#,
            "`rewards` has shape [1, 2], expected [N]",
        ),
        (
            r#"{"rewards":[1,0],"group_size":2,"mode":"gae"}"#,
            "`mode` must be one of",
        ),
        (
            r#"{"rewards":[1,0,1],"group_size":2}"#,
            "multiple of group_size = 2, got 3",
        ),
        (
            r#"{"rewards":[1,0],"group_size":1}"#,
            "`group_size` must be >= 2, got 1",
        ),
        (
            r#"{"rewards":[1,NaN],"group_size":2}"#,
            "`rewards[1]` must be finite, got NaN",
        ),
        (
            r#"{"rewards":[1,0],"group_size":2,"eps":0}"#,
            "`eps` must be > 0",
        ),
        (r#"{"rewards":[1,0"#, "invalid JSON"),
        (
            r#"{"rewards":[1,0],"group_size":2,"grup":1}"#,
            "unknown argument `grup`",
        ),
        (
            r#"{"rewards":[[1,0],[1]],"group_size":2}"#,
            "`rewards[1]` must be 2 elements",
        ),
    ];
    for (input, needle) in cases {
        let out = atomrl_fn(&["compute_advantages", "--input", "-"], Some(input));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{input}: {stderr}");
        assert!(out.stdout.is_empty(), "{input}: stdout not empty");
        assert_eq!(stderr.lines().count(), 1, "{input}: {stderr}");
        assert!(
            stderr.starts_with("error: ") && stderr.contains(needle),
            "{input}: {stderr}"
        );
    }
}

#[test]
fn an_overflowing_output_is_written_as_python_does_and_named_on_stderr() {
    // 0.5 · (1e38)² overflows f32: the loss is +inf, as PyTorch's would be, not a missing value.
    let input = r#"{"values": [[1e38, 1e38, 1]], "old_values": [[0, 0, 0]],
        "returns": [[0, 0, 0]], "mask": [[1, 1, 1]], "clip_range_value": 1e39}"#;
    let out = atomrl_fn(&["compute_value_loss", "--input", "-"], Some(input));
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stderr}");
    assert!(stdout.starts_with(r#"{"loss":Infinity,"#), "{stdout}");
    assert!(
        stderr.starts_with("warning: compute_value_loss: output `loss` has a value")
            && stderr.contains("not finite"),
        "{stderr}"
    );
    // What it writes, --input reads back: the same literals Python's json.dumps writes.
    let again = atomrl_fn(
        &["compute_pg_loss", "--input", "-"],
        Some(r#"{"log_probs": [[-1, -1]], "advantages": [Infinity], "mask": [[1, 1]]}"#),
    );
    assert_eq!(again.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&again.stderr).contains("`advantages[0]` must be finite"));
}

#[test]
fn every_registered_worked_example_matches_its_help() {
    for f in atomrl_fn::catalog::all() {
        if f.spec
            .inputs
            .iter()
            .any(|a| a.kind == atomrl_core::ArgKind::Path)
        {
            continue; // needs a model folder; its crate tests the example with a fixture
        }
        atomrl_core::check_example(&f).unwrap();
    }
}
