//! `atomrl-train` with hub ids, against a local Hub stand-in on 127.0.0.1 (`HF_ENDPOINT`) and
//! an empty `HF_HOME`: the model (single-file and sharded) and a GSM8K-format dataset are
//! downloaded into the cache layout and trained on, as is a preference dataset in
//! `trl-lib/ultrafeedback_binarized`'s layout (a reward model); a rerun with the server gone and
//! `HF_HUB_OFFLINE=1` trains from the cache; an unknown model exits 2 with one line naming
//! it; a run killed in the middle of a download resumes it. No test touches the internet.

#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use atomrl_hub::test_server::HubServer;
use common::{model_dir, temp_dir, train_bin};

/// A server with `org/tiny`, `org/tiny-sharded` and `openai/gsm8k` (config `main`).
fn hub() -> HubServer {
    let server = HubServer::start().unwrap();
    server.add_tiny_models(&PathBuf::from(model_dir())).unwrap();
    let rows = |n: usize| -> Vec<(String, String)> {
        (0..n)
            .map(|i| {
                let (a, b) = (i % 7, i % 5);
                (
                    format!("What is {a} plus {b}?"),
                    format!("{a}+{b}={0}\n#### {0}", a + b),
                )
            })
            .collect()
    };
    server
        .add_gsm8k("openai/gsm8k", &rows(24), &rows(6))
        .unwrap();
    server
}

/// `atomrl-train` for two short steps of `model` on `openai/gsm8k`, with the hub environment
/// set to `endpoint` and the cache under `home`.
fn train(home: &Path, endpoint: &str, model: &str, out: &Path) -> Command {
    let mut c = train_bin();
    c.env_remove("HF_HUB_CACHE")
        .env_remove("HF_TOKEN")
        .env_remove("HF_HUB_OFFLINE")
        .env("HF_HOME", home)
        .env("HF_ENDPOINT", endpoint)
        .args(["--set", &format!("model={model:?}")])
        .args([
            "--set",
            "dataset=\"openai/gsm8k\"",
            "--set",
            "eval_dataset=\"openai/gsm8k\"",
        ])
        .args([
            "--set",
            &format!("output_dir={:?}", out.display().to_string()),
        ])
        .args([
            "--set",
            "max_steps=2",
            "--set",
            "batch_size=2",
            "--set",
            "num_generations=4",
        ])
        .args(["--set", "max_completion_length=8", "--set", "eval_size=4"])
        .args(["--set", "save_steps=0", "--set", "progress=false"]);
    c
}

fn ok(out: Output) -> Output {
    assert!(
        out.status.success(),
        "stdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

#[test]
fn downloads_then_trains_offline_from_the_cache() {
    let dir = temp_dir("hub-train");
    let home = dir.join("hf");
    let server = hub();
    let url = server.url();
    for model in ["org/tiny", "org/tiny-sharded"] {
        let out = dir.join(model.replace('/', "_"));
        ok(train(&home, &url, model, &out).output().unwrap());
        assert!(out.join("metrics.jsonl").is_file(), "{model}");
    }
    let cache = home.join("hub");
    for path in [
        "models--org--tiny/refs/main",
        "models--org--tiny-sharded/refs/main",
        "datasets--openai--gsm8k/refs/main",
    ] {
        assert!(cache.join(path).is_file(), "{path}");
    }
    let requests = server.requests().len();
    drop(server);

    // The server is gone: offline, both models and the dataset come from the cache.
    for model in ["org/tiny", "org/tiny-sharded"] {
        let out = dir.join(format!("offline_{}", model.replace('/', "_")));
        ok(train(&home, &url, model, &out)
            .env("HF_HUB_OFFLINE", "1")
            .output()
            .unwrap());
    }
    assert!(requests > 0);
}

#[test]
fn unknown_model_exits_2_naming_it() {
    let dir = temp_dir("hub-404");
    let server = hub();
    let out = train(
        &dir.join("hf"),
        &server.url(),
        "org/no-such-model",
        &dir.join("run"),
    )
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let errors: Vec<&str> = stderr.lines().filter(|l| l.contains("error")).collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    assert!(
        errors[0].contains("org/no-such-model") && errors[0].contains("not found"),
        "{stderr}"
    );
}

#[test]
fn a_run_killed_mid_download_resumes_it() {
    let dir = temp_dir("hub-kill");
    let home = dir.join("hf");
    let server = hub();
    server.stall_downloads("model.safetensors");
    let mut child = train(&home, &server.url(), "org/tiny", &dir.join("run"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let blobs = home.join("hub/models--org--tiny/blobs");
    let part = |blobs: &Path| -> Option<u64> {
        std::fs::read_dir(blobs).ok()?.flatten().find_map(|e| {
            let p = e.path();
            (p.extension().is_some_and(|x| x == "part"))
                .then(|| std::fs::metadata(&p).map(|m| m.len()).unwrap_or(0))
                .filter(|n| *n > 0)
        })
    };
    let start = Instant::now();
    while part(&blobs).is_none() {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "no partial download appeared"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "the run ended before the stall"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let partial = part(&blobs).unwrap();
    let full = std::fs::metadata(Path::new(&model_dir()).join("model.safetensors"))
        .unwrap()
        .len();
    assert!(partial < full);
    let offline = train(&home, &server.url(), "org/tiny", &dir.join("run"))
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .unwrap();
    assert_eq!(
        offline.status.code(),
        Some(2),
        "a partial file never counts as complete"
    );

    server.clear_faults();
    ok(train(&home, &server.url(), "org/tiny", &dir.join("run"))
        .output()
        .unwrap());
    let resumed = format!("bytes={partial}-");
    assert!(
        server.requests().iter().any(|r| r.ends_with(&resumed)),
        "{:?}",
        server.requests()
    );
}

/// A preference dataset named on the hub in `trl-lib/ultrafeedback_binarized`'s layout
/// (`data/{train,test}-00000-of-00001.*`, conversations whose shared messages are the prompt)
/// is downloaded and a reward model trains on it, its held-out pairs from the test split.
#[test]
fn a_hub_preference_dataset_trains_a_reward_model() {
    let dir = temp_dir("hub-preference");
    let server = hub();
    let rows = |n: usize| -> Vec<u8> {
        let lines: Vec<String> = (0..n)
            .map(|i| {
                let user = serde_json::json!({"role": "user", "content": format!("What is {i} plus 1?")});
                let side = |answer: String| {
                    serde_json::json!([user, {"role": "assistant", "content": answer}])
                };
                serde_json::json!({
                    "chosen": side(format!("{}", i + 1)),
                    "rejected": side("I do not know.".into()),
                    "score_chosen": 9.0,
                    "score_rejected": 2.0,
                })
                .to_string()
            })
            .collect();
        lines.join("\n").into_bytes()
    };
    server.add_repo(
        atomrl_hub::RepoKind::Dataset,
        "trl-lib/ultrafeedback_binarized",
        "main",
        vec![
            ("data/train-00000-of-00001.jsonl".into(), rows(12)),
            ("data/test-00000-of-00001.jsonl".into(), rows(4)),
        ],
    );
    let out = dir.join("rm");
    let mut c = train(&dir.join("hf"), &server.url(), "org/tiny", &out);
    c.args(["--recipe", "reward"])
        .args(["--set", "dataset=\"trl-lib/ultrafeedback_binarized\""])
        .args(["--set", "eval_dataset=\"trl-lib/ultrafeedback_binarized\""])
        .args(["--set", "save_steps=2"]);
    ok(c.output().unwrap());
    let rows = atomrl_trainer::logging::read_metrics(out.join("metrics.jsonl")).unwrap();
    assert!(rows.iter().any(|r| r.get("eval/pair_accuracy").is_some()));
    assert!(rows.iter().any(|r| r.get("pairs") == Some(2.0)));
    assert!(out.join("checkpoint-2/reward_model/config.json").is_file());
    assert!(dir
        .join("hf/hub/datasets--trl-lib--ultrafeedback_binarized/refs/main")
        .is_file());
}
