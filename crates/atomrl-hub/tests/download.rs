//! The resolver against a local Hub stand-in (`test_server::HubServer`, 127.0.0.1): downloads
//! into the standard cache layout, offline reads, revisions, errors, interrupted downloads.
//! No test touches the internet.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

use atomrl_hub::test_server::{gsm8k_parquet, sharded_model_files, HubServer};
use atomrl_hub::{resolve_dataset_split, resolve_model, HubSettings, RepoKind, RepoSpec};

fn fixture_model() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/reference/models/tiny-qwen2")
}

/// A fresh temporary folder, removed when dropped.
fn temp_dir(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("atomrl_hub_{name}_"))
        .tempdir()
        .unwrap()
}

fn settings(server: &HubServer, cache: &Path) -> HubSettings {
    HubSettings {
        endpoint: server.url(),
        cache_dir: cache.to_path_buf(),
        token: None,
        offline: false,
        progress: false,
    }
}

fn same_bytes(a: &Path, b: &Path) -> bool {
    std::fs::read(a).unwrap() == std::fs::read(b).unwrap()
}

#[test]
fn model_download_then_offline_from_the_cache() {
    let cache_tmp = temp_dir("single");
    let cache = cache_tmp.path();
    let server = HubServer::start().unwrap();
    let sha = server
        .add_folder(RepoKind::Model, "org/tiny", "main", &fixture_model())
        .unwrap();
    let mut s = settings(&server, cache);
    let dir = resolve_model("org/tiny", &s).unwrap();

    // The standard layout: refs/main -> commit, snapshot entries are links into blobs/.
    let repo = cache.join("models--org--tiny");
    assert_eq!(dir, repo.join("snapshots").join(&sha));
    assert_eq!(
        std::fs::read_to_string(repo.join("refs/main"))
            .unwrap()
            .trim(),
        sha
    );
    for f in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ] {
        assert!(same_bytes(&dir.join(f), &fixture_model().join(f)), "{f}");
        assert!(
            dir.join(f)
                .symlink_metadata()
                .unwrap()
                .file_type()
                .is_symlink(),
            "{f}"
        );
    }
    assert!(std::fs::read_dir(repo.join("blobs")).unwrap().count() >= 4);
    // A file nothing loads is not fetched.
    assert!(!dir.join("MANIFEST.json").exists());

    // Server gone: offline (and online, since the cache is complete) reads need no network.
    drop(server);
    s.offline = true;
    assert_eq!(resolve_model("org/tiny", &s).unwrap(), dir);
    s.offline = false;
    assert_eq!(resolve_model("org/tiny", &s).unwrap(), dir);
}

#[test]
fn sharded_model_and_revision() {
    let cache_tmp = temp_dir("sharded");
    let cache = cache_tmp.path();
    let server = HubServer::start().unwrap();
    let files = sharded_model_files(&fixture_model(), 2).unwrap();
    assert!(files
        .iter()
        .any(|(n, _)| n == "model-00002-of-00002.safetensors"));
    server.add_repo(RepoKind::Model, "org/tiny-sharded", "main", files);
    let mut v1 = Vec::new();
    for name in ["config.json", "model.safetensors", "tokenizer.json"] {
        v1.push((
            name.to_string(),
            std::fs::read(fixture_model().join(name)).unwrap(),
        ));
    }
    v1.push((
        "generation_config.json".into(),
        b"{\"max_new_tokens\": 7}".to_vec(),
    ));
    let v1_sha = server.add_repo(RepoKind::Model, "org/tiny-sharded", "v1", v1);
    let mut s = settings(&server, cache);

    let main = resolve_model("org/tiny-sharded", &s).unwrap();
    for f in [
        "model.safetensors.index.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ] {
        assert!(main.join(f).is_file(), "{f}");
    }
    assert!(!main.join("model.safetensors").exists());

    let v1 = resolve_model("org/tiny-sharded@v1", &s).unwrap();
    assert!(v1.ends_with(&v1_sha));
    assert!(v1.join("generation_config.json").is_file());
    let refs = cache.join("models--org--tiny-sharded/refs");
    assert_eq!(
        std::fs::read_to_string(refs.join("v1")).unwrap().trim(),
        v1_sha
    );

    drop(server);
    s.offline = true;
    assert_eq!(resolve_model("org/tiny-sharded@v1", &s).unwrap(), v1);
    assert_eq!(
        resolve_model(&format!("org/tiny-sharded@{v1_sha}"), &s).unwrap(),
        v1
    );
    assert_eq!(resolve_model("org/tiny-sharded", &s).unwrap(), main);
}

#[test]
fn errors_name_the_repository_and_file() {
    let cache_tmp = temp_dir("errors");
    let cache = cache_tmp.path();
    let server = HubServer::start().unwrap();
    server
        .add_folder(RepoKind::Model, "org/tiny", "main", &fixture_model())
        .unwrap();
    server.add_repo(
        RepoKind::Model,
        "org/not-a-model",
        "main",
        vec![("README.md".into(), b"hi".to_vec())],
    );
    server
        .add_folder(RepoKind::Model, "org/gated", "main", &fixture_model())
        .unwrap();
    server.require_token(RepoKind::Model, "org/gated", "secret");
    let mut s = settings(&server, cache);

    let err = resolve_model("org/no-such-model", &s)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("org/no-such-model") && err.contains("not found"),
        "{err}"
    );
    assert!(!err.contains('\n'), "{err}");
    let err = resolve_model("org/tiny@nope", &s).unwrap_err().to_string();
    assert!(err.contains("revision `nope`"), "{err}");
    let err = resolve_model("org/not-a-model", &s)
        .unwrap_err()
        .to_string();
    assert!(err.contains("not a model repository"), "{err}");
    let err = resolve_model("not a name!", &s).unwrap_err().to_string();
    assert!(
        err.contains("`model`") && err.contains("org/name[@revision]"),
        "{err}"
    );

    let err = resolve_model("org/gated", &s).unwrap_err().to_string();
    assert!(
        err.contains("org/gated") && err.contains("HF_TOKEN"),
        "{err}"
    );
    s.token = Some("wrong".into());
    let err = resolve_model("org/gated", &s).unwrap_err().to_string();
    assert!(err.contains("403") && err.contains("no access"), "{err}");
    s.token = Some("secret".into());
    assert!(resolve_model("org/gated", &s).is_ok());

    s.offline = true;
    let err = resolve_model("org/tiny", &s).unwrap_err().to_string();
    assert!(
        err.contains("org/tiny") && err.contains("HF_HUB_OFFLINE"),
        "{err}"
    );

    s.offline = false;
    drop(server);
    let err = resolve_model("org/tiny", &s).unwrap_err().to_string();
    assert!(
        err.contains("cannot reach") && err.contains("HF_HUB_OFFLINE"),
        "{err}"
    );
}

#[test]
fn interrupted_download_is_never_complete_and_resumes() {
    let cache_tmp = temp_dir("interrupted");
    let cache = cache_tmp.path();
    let server = HubServer::start().unwrap();
    server
        .add_folder(RepoKind::Model, "org/tiny", "main", &fixture_model())
        .unwrap();
    // More cuts than the client's retries: the first run fails half-way through the weights.
    server.cut_downloads("model.safetensors", 10);
    let s = settings(&server, cache);
    let err = resolve_model("org/tiny", &s).unwrap_err().to_string();
    assert!(
        err.contains("model.safetensors") && err.contains("org/tiny"),
        "{err}"
    );

    let repo = cache.join("models--org--tiny");
    let parts: Vec<PathBuf> = std::fs::read_dir(repo.join("blobs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "part"))
        .collect();
    assert_eq!(parts.len(), 1, "{parts:?}");
    let partial = std::fs::metadata(&parts[0]).unwrap().len();
    let full = std::fs::metadata(fixture_model().join("model.safetensors"))
        .unwrap()
        .len();
    assert!(partial > 0 && partial < full, "{partial} of {full}");
    // Nothing counts as complete: the snapshot has no weights, an offline read fails.
    let snap = atomrl_core::hub::snapshot_dir(&repo, "org/tiny", "main");
    assert!(snap.is_err() || !snap.unwrap().join("model.safetensors").exists());
    let offline = HubSettings {
        offline: true,
        ..s.clone()
    };
    assert!(resolve_model("org/tiny", &offline).is_err());

    // Restarted: the download resumes from the part file and completes.
    server.clear_faults();
    let dir = resolve_model("org/tiny", &s).unwrap();
    assert!(same_bytes(
        &dir.join("model.safetensors"),
        &fixture_model().join("model.safetensors")
    ));
    let resumed = format!("bytes={partial}-");
    assert!(
        server.requests().iter().any(|r| r.ends_with(&resumed)),
        "{:?}",
        server.requests()
    );
}

#[test]
fn dataset_splits_parquet_shards_and_jsonl() {
    let cache_tmp = temp_dir("datasets");
    let cache = cache_tmp.path();
    let server = HubServer::start().unwrap();
    let rows = |p: &str, n: usize| -> Vec<(String, String)> {
        (0..n)
            .map(|i| {
                (
                    format!("{p} {i}: {i} plus {i}?"),
                    format!("{i}+{i}\n#### {}", 2 * i),
                )
            })
            .collect()
    };
    server.add_repo(
        RepoKind::Dataset,
        "openai/gsm8k",
        "main",
        vec![
            ("README.md".into(), b"# gsm8k".to_vec()),
            (
                "main/train-00000-of-00002.parquet".into(),
                gsm8k_parquet(&rows("a", 3)).unwrap(),
            ),
            (
                "main/train-00001-of-00002.parquet".into(),
                gsm8k_parquet(&rows("b", 2)).unwrap(),
            ),
            (
                "main/test-00000-of-00001.parquet".into(),
                gsm8k_parquet(&rows("t", 2)).unwrap(),
            ),
            (
                "socratic/train-00000-of-00001.parquet".into(),
                gsm8k_parquet(&rows("s", 1)).unwrap(),
            ),
        ],
    );
    server.add_repo(
        RepoKind::Dataset,
        "org/maths",
        "main",
        vec![(
            "data/train.jsonl".into(),
            b"{\"prompt\": \"1+1?\", \"ground_truth\": \"2\"}\n".to_vec(),
        )],
    );
    let mut s = settings(&server, cache);
    let gsm8k = RepoSpec::parse("openai/gsm8k").unwrap();
    let train = resolve_dataset_split(&gsm8k, Some("main"), "train", &s).unwrap();
    let names: Vec<String> = train
        .iter()
        .map(|p| {
            p.strip_prefix(cache.join("datasets--openai--gsm8k/snapshots"))
                .unwrap()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    assert_eq!(names.len(), 2);
    assert!(
        names[0].ends_with("main/train-00000-of-00002.parquet"),
        "{names:?}"
    );
    assert!(
        names[1].ends_with("main/train-00001-of-00002.parquet"),
        "{names:?}"
    );
    let maths = RepoSpec::parse("org/maths").unwrap();
    let jsonl = resolve_dataset_split(&maths, None, "train", &s).unwrap();
    assert!(jsonl[0].ends_with("data/train.jsonl"));

    let err = resolve_dataset_split(&gsm8k, Some("main"), "validation", &s)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("openai/gsm8k") && err.contains("validation"),
        "{err}"
    );
    let err = resolve_dataset_split(&RepoSpec::parse("org/none").unwrap(), None, "train", &s)
        .unwrap_err()
        .to_string();
    assert!(err.contains("dataset `org/none` not found"), "{err}");

    drop(server);
    s.offline = true;
    assert_eq!(
        resolve_dataset_split(&gsm8k, Some("main"), "train", &s).unwrap(),
        train
    );
    let err = resolve_dataset_split(&gsm8k, Some("main"), "test", &s)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("HF_HUB_OFFLINE") && err.contains("test"),
        "{err}"
    );
}
