//! The dashboard's HTTP API over real HTTP, on the fixture runs folder: the runs list and its
//! statuses, a run's detail, curves, rollouts and comparison, live updates, bad input, and
//! that nothing outside the runs folder is served.

#![allow(clippy::unwrap_used)]

mod common;

use std::io::Write;
use std::process::Command;

use serde_json::Value;

fn get(url: &str) -> (u16, String) {
    match ureq::get(url).call() {
        Ok(r) => (r.status(), r.into_string().unwrap()),
        Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap_or_default()),
        Err(e) => panic!("{url}: {e}"),
    }
}

/// A GET with the path sent byte for byte (an HTTP client would resolve its `..`).
fn raw_get(url: &str, path: &str) -> (u16, String) {
    use std::io::Read;
    let host = url.trim_start_matches("http://");
    let mut stream = std::net::TcpStream::connect(host).unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, response)
}

fn get_json(url: &str) -> Value {
    let (status, body) = get(url);
    assert_eq!(status, 200, "{url}: {body}");
    serde_json::from_str(&body).unwrap()
}

fn run<'a>(list: &'a Value, name: &str) -> &'a Value {
    list["runs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == name)
        .unwrap_or_else(|| panic!("no {name} in {list}"))
}

#[test]
fn runs_list_reads_each_status_from_the_files() {
    let root = common::fixture_runs("api-list");
    let url = common::serve(root.path());
    let list = get_json(&format!("{url}/api/runs"));
    let names: Vec<&str> = list["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    // Links are not followed; files are not runs.
    assert_eq!(
        names,
        [
            "corrupt-f",
            "failed-d",
            "grpo-a",
            "grpo-b",
            "killed-c",
            "old-e",
            "sweep/trial-000/run"
        ]
    );
    let a = run(&list, "grpo-a");
    assert_eq!(a["status"], "finished");
    assert_eq!(
        (a["recipe"].as_str(), a["model"].as_str()),
        (Some("grpo"), Some("embedded:tiny-word-problems"))
    );
    assert_eq!(a["dataset"], "embedded:word-problems");
    assert_eq!(
        (a["steps_done"].as_u64(), a["steps_planned"].as_u64()),
        (Some(200), Some(200))
    );
    assert!((a["eval_accuracy"].as_f64().unwrap() - 0.32).abs() < 1e-9);
    assert!(a["reward"].as_f64().unwrap() > 0.7);
    assert_eq!(a["duration_s"].as_f64(), Some(300.0));
    assert_eq!(run(&list, "grpo-b")["status"], "running");
    let c = run(&list, "killed-c");
    assert_eq!(
        (c["status"].as_str(), c["resumable"].as_bool()),
        (Some("killed"), Some(true))
    );
    assert_eq!(c["duration_s"].as_f64(), Some(90.0)); // to its last row
    let d = run(&list, "failed-d");
    assert_eq!(d["status"], "failed");
    assert!(d["error"].as_str().unwrap().contains("train.jsonl:3"));
    assert_eq!(d["resumable"], false); // no checkpoint
    let e = run(&list, "old-e");
    assert_eq!(
        (e["status"].as_str(), e["steps_done"].as_u64()),
        (Some("unknown"), Some(2))
    );
    let f = run(&list, "corrupt-f");
    let msgs = f["messages"].to_string();
    assert!(msgs.contains("metrics.jsonl:2"), "{msgs}");
    assert!(
        msgs.contains("config.toml") && msgs.contains("status.json"),
        "{msgs}"
    );
    assert!(msgs.contains("the last line is incomplete"), "{msgs}");
    assert_eq!(f["steps_done"], 3);
}

#[test]
fn a_missing_runs_folder_fails_at_start_and_an_empty_one_lists_nothing() {
    let root = common::temp_dir("api-empty");
    let missing = root.path().join("no-such-folder");
    let out = Command::new(env!("CARGO_BIN_EXE_atomrl-dashboard"))
        .arg(&missing)
        .args(["--port", "0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no-such-folder"), "{err}");

    let url = common::serve(root.path());
    let list = get_json(&format!("{url}/api/runs"));
    assert_eq!(list["runs"], serde_json::json!([]));
}

#[test]
fn another_address_than_loopback_is_warned_about() {
    let root = common::temp_dir("api-host");
    let d = atomrl_dashboard::Dashboard::bind(root.path(), "0.0.0.0".parse().unwrap(), 0).unwrap();
    let w = d.exposure_warning().expect("a warning");
    assert!(w.contains("anyone who can reach this machine"), "{w}");
}

#[test]
fn run_detail_has_config_evaluations_and_checkpoints_with_their_command() {
    let root = common::fixture_runs("api-detail");
    let url = common::serve(root.path());
    let d = get_json(&format!("{url}/api/run/grpo-a"));
    assert!(d["config"]["text"].as_str().unwrap().contains("lr = 1e-6"));
    assert_eq!(d["config"]["keys"]["num_generations"], "4");
    let evals = d["evals"].as_array().unwrap();
    assert_eq!(evals.len(), 5); // steps 0, 50, 100, 150, 200
    assert_eq!(evals[0]["step"], 0);
    assert_eq!(evals[4]["metrics"]["eval/format_rate"], 0.9);
    let ckpts = d["checkpoints"].as_array().unwrap();
    assert_eq!(ckpts.len(), 2);
    let cmd = ckpts[1]["command"].as_str().unwrap();
    assert!(cmd.starts_with("atomrl-infer --checkpoint "), "{cmd}");
    assert!(
        cmd.contains("checkpoint-200") && cmd.contains("--tools calculator"),
        "{cmd}"
    );
    assert!(
        cmd.contains("--system-prompt 'Answer in <answer> tags.'"),
        "{cmd}"
    );
    // A sweep trial by its path; a run without config.
    let t = get_json(&format!("{url}/api/run/sweep/trial-000/run"));
    assert_eq!(t["summary"]["steps_done"], 20);
    let old = get_json(&format!("{url}/api/run/old-e"));
    assert!(old["config"].is_null());
    assert!(old["messages"].to_string().contains("no config.toml"));
}

#[test]
fn curves_are_downsampled_and_polling_an_unchanged_run_costs_a_304() {
    let root = common::fixture_runs("api-metrics");
    let url = common::serve(root.path());
    let m = get_json(&format!("{url}/api/run/grpo-a/metrics?points=40"));
    assert_eq!(m["rows"], 201);
    let loss = &m["series"]["loss"];
    let xs = loss["x"].as_array().unwrap();
    assert!(xs.len() <= 40 && xs.len() >= 20, "{}", xs.len());
    assert_eq!(
        (xs[0].as_f64(), xs.last().unwrap().as_f64()),
        (Some(1.0), Some(200.0))
    );
    assert!(m["series"].get("time/wall_s").is_none());
    // The wall-time axis: Unix seconds.
    let w = get_json(&format!("{url}/api/run/grpo-a/metrics?x=wall"));
    assert_eq!(w["x"], "wall");
    assert_eq!(w["series"]["loss"]["x"][0], 1_764_000_001.5);
    // A run without wall times falls back to steps, and says so; its NaN loss is left out.
    let old = get_json(&format!("{url}/api/run/old-e/metrics?x=wall"));
    assert_eq!(old["x"], "step");
    assert!(old["messages"].to_string().contains("no wall time"));
    assert_eq!(old["series"]["loss"]["x"], serde_json::json!([1.0]));

    // ETag: unchanged → 304; a new line → new data.
    let first = ureq::get(&format!("{url}/api/run/grpo-b/metrics"))
        .call()
        .unwrap();
    let etag = first.header("etag").unwrap().to_string();
    let again = ureq::get(&format!("{url}/api/run/grpo-b/metrics"))
        .set("If-None-Match", &etag)
        .call()
        .unwrap();
    assert_eq!(again.status(), 304);
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(root.path().join("grpo-b/metrics.jsonl"))
        .unwrap();
    f.write_all(common::metrics_row(121, 1_764_000_500.0).as_bytes())
        .unwrap();
    let after = ureq::get(&format!("{url}/api/run/grpo-b/metrics"))
        .set("If-None-Match", &etag)
        .call()
        .unwrap();
    assert_eq!(after.status(), 200);
    let body: Value = serde_json::from_str(&after.into_string().unwrap()).unwrap();
    assert_eq!(body["rows"], 122);
    // Half a line (being written) is not read yet.
    f.write_all(b"{\"step\":122,\"lo").unwrap();
    let m = get_json(&format!("{url}/api/run/grpo-b/metrics"));
    assert_eq!(m["rows"], 122);
    assert_eq!(m["messages"], serde_json::json!([]));
}

#[test]
fn rollouts_by_step_with_rewards_advantages_and_tool_calls() {
    let root = common::fixture_runs("api-rollouts");
    let url = common::serve(root.path());
    let r = get_json(&format!("{url}/api/run/grpo-a/rollouts"));
    assert_eq!(r["steps"], serde_json::json!([10, 20]));
    let s = get_json(&format!("{url}/api/run/grpo-a/rollouts?step=20"));
    let records = s["records"].as_array().unwrap();
    assert_eq!(records.len(), 8);
    assert_eq!(records[2]["tool_calls"][0]["output"], "84");
    assert_eq!(records[5]["finish_reason"], "length");
    assert!(records[0]["rewards"]["format"].is_number());
    assert!(records[0]["advantage"].is_number());
    // Older runs' records pass as they are; a run without samples has no steps.
    let old = get_json(&format!("{url}/api/run/old-e/rollouts?step=2"));
    assert_eq!(old["records"][0]["completion"], "4");
    let none = get_json(&format!("{url}/api/run/killed-c/rollouts"));
    assert_eq!(none["steps"], serde_json::json!([]));
    let bad = get_json(&format!("{url}/api/run/corrupt-f/rollouts"));
    assert!(bad["messages"][0]
        .as_str()
        .unwrap()
        .contains("samples.jsonl:1"));
}

#[test]
fn compare_gives_differing_keys_final_and_best_and_overlaid_curves() {
    let root = common::fixture_runs("api-compare");
    let url = common::serve(root.path());
    let keys = |c: &Value| -> Vec<String> {
        c["differing"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["key"].as_str().unwrap().to_string())
            .collect()
    };
    let two = get_json(&format!("{url}/api/compare?runs=grpo-a,grpo-b"));
    assert_eq!(keys(&two), ["lr", "time_budget_s", "tools"]); // output_dir aside
                                                              // A run without config.toml differs in every key.
    let c = get_json(&format!("{url}/api/compare?runs=grpo-a,grpo-b,old-e"));
    assert!(keys(&c).contains(&"recipe".to_string()));
    let lr = c["differing"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["key"] == "lr")
        .unwrap();
    assert_eq!(
        lr["values"],
        serde_json::json!(["0.000001", "0.000002", null])
    );
    let acc = c["metrics"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["metric"] == "eval/accuracy")
        .unwrap();
    assert_eq!(acc["values"][0]["best_step"], 200);
    assert!(acc["values"][2].is_null());
    assert_eq!(c["series"]["reward/mean"].as_array().unwrap().len(), 3);
}

#[test]
fn bad_arguments_are_named_and_nothing_outside_the_folder_is_served() {
    let root = common::fixture_runs("api-bad");
    let url = common::serve(root.path());
    for (path, status, says) in [
        ("/api/run/grpo-a/metrics?x=time", 400, "argument x"),
        ("/api/run/grpo-a/metrics?points=2", 400, "argument points"),
        ("/api/run/grpo-a/rollouts?step=last", 400, "argument step"),
        ("/api/compare?runs=", 400, "argument runs"),
        ("/api/run/nope", 404, "no run"),
        ("/api/run/notes.txt", 404, "no run"),
        ("/api/run/..", 400, "not a plain relative path"),
        ("/api/run/%2e%2e/metrics", 400, "not a plain relative path"),
        (
            "/api/run/grpo-a/../../etc/metrics",
            400,
            "not a plain relative path",
        ),
        ("/api/run/%2Fetc/metrics", 400, "not a plain relative path"),
        ("/api/run/escape", 400, "leads out of the runs folder"),
        (
            "/api/run/escape/metrics",
            400,
            "leads out of the runs folder",
        ),
        ("/api/run/etc-link", 400, "leads out of the runs folder"),
        (
            "/api/compare?runs=grpo-a,escape",
            400,
            "leads out of the runs folder",
        ),
        ("/api/run/grpo-a%5C..%5C..", 400, "backslash"),
    ] {
        let (code, body) = raw_get(&url, path);
        assert_eq!(code, status, "{path}: {body}");
        assert!(body.contains(says), "{path}: {body}");
        assert!(
            !body.contains("SECRET") && !body.contains("root:"),
            "{path}: {body}"
        );
    }
    // The page's files are an embedded list: no path reaches the disk.
    for path in [
        "/../../etc/passwd",
        "/%2e%2e/%2e%2e/etc/passwd",
        "/vendor/../Cargo.toml",
        "/escape/secret.txt",
    ] {
        let (code, body) = raw_get(&url, path);
        assert_eq!(code, 404, "{path}");
        assert!(
            !body.contains("root:") && !body.contains("SECRET"),
            "{path}"
        );
    }
    // Read-only: no method but GET.
    let post = ureq::post(&format!("{url}/api/runs")).call();
    assert!(matches!(post, Err(ureq::Error::Status(405, _))), "{post:?}");
    // The page and its vendored chart library are served.
    let (code, page) = get(&format!("{url}/"));
    assert!(code == 200 && page.contains("app.js"), "{page}");
    let csp = ureq::get(&format!("{url}/")).call().unwrap();
    assert!(csp
        .header("content-security-policy")
        .unwrap()
        .contains("script-src 'self'"));
    let (code, js) = get(&format!("{url}/vendor/uplot/uPlot.iife.min.js"));
    assert!(code == 200 && js.contains("uPlot"));
}
