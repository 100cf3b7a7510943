//! `atomrl-sweep` end to end on the tiny random Qwen2 fixture: a grid sweep whose trials are
//! ordinary runs, one of which fails and is recorded with its error while the sweep goes on;
//! the reports and a `best.toml` that loads as a run configuration; a killed sweep that resumes
//! (ended trials kept, a running one continued); trials shared by two MPI ranks; bad search
//! spaces rejected naming the key.

#![allow(clippy::unwrap_used)]

#[path = "../../atomrl-trainer/tests/common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{model_dir, temp_dir, write_dataset};

fn sweep_bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_atomrl-sweep"));
    c.env("RAYON_NUM_THREADS", "1");
    for v in [
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_RANK",
        "PMI_SIZE",
        "PMI_RANK",
    ] {
        c.env_remove(v);
    }
    c
}

/// A base run and a sweep over the dataset (one of them missing) and the learning rate.
fn write_sweep(dir: &Path, extra_sweep: &str, search: &str) -> PathBuf {
    let data = write_dataset(dir);
    let base = format!(
        "model = {:?}\ndataset = {:?}\nbatch_size = 4\nnum_generations = 4\n\
         max_completion_length = 8\neval_size = 4\nsave_steps = 1\nprogress = false\nworkers = 1\n\
         [[rewards]]\nname = \"digit\"\n",
        model_dir(),
        data.display().to_string()
    );
    std::fs::write(dir.join("base.toml"), base).unwrap();
    let search = if search.is_empty() {
        format!(
            "dataset = {{ choice = [{:?}, {:?}] }}\nlr = {{ choice = [1e-3, 2e-3] }}\n",
            data.display().to_string(),
            dir.join("missing.jsonl").display().to_string()
        )
    } else {
        search.to_string()
    };
    let sweep = format!(
        "[sweep]\nbase = \"base.toml\"\noutput_dir = {:?}\nbudget_steps = 2\nseed = 1\n{extra_sweep}\n\
         [sweep.objective]\nmetric = \"reward/mean\"\nat = \"best\"\n\n[search]\n{search}",
        dir.join("sweep").display().to_string()
    );
    let path = dir.join("sweep.toml");
    std::fs::write(&path, sweep).unwrap();
    path
}

fn run(cfg: &Path, envs: &[(&str, &str)]) -> std::process::Output {
    let mut c = sweep_bin();
    c.args(["--config", cfg.to_str().unwrap()]);
    for (k, v) in envs {
        c.env(k, v);
    }
    c.output().unwrap()
}

fn record(dir: &Path, i: usize) -> serde_json::Value {
    let text = std::fs::read_to_string(dir.join(format!("sweep/trial-{i:03}/trial.json"))).unwrap();
    serde_json::from_str(&text).unwrap()
}

#[test]
fn a_grid_sweep_records_failures_writes_reports_and_resumes() {
    let dir = temp_dir("sweep-grid");
    let cfg = write_sweep(&dir, "sampler = \"grid\"\ntrials = 4\nparallel = 2", "");
    let out = run(&cfg, &[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Grid order: the last key fastest; trials 2 and 3 read the missing dataset.
    for i in 0..4 {
        let r = record(&dir, i);
        let want = if i < 2 { "finished" } else { "failed" };
        assert_eq!(r["status"], want, "trial {i}: {r}");
        if i >= 2 {
            assert!(
                r["error"].as_str().unwrap().contains("missing.jsonl"),
                "{r}"
            );
        } else {
            assert!(r["objective"].as_f64().unwrap().is_finite());
            assert!(dir
                .join(format!("sweep/trial-{i:03}/run/metrics.jsonl"))
                .is_file());
        }
    }
    for f in [
        "trials.csv",
        "trials.md",
        "sweep.jsonl",
        "best.toml",
        "objective.png",
        "curves.png",
    ] {
        assert!(
            dir.join("sweep").join(f).is_file(),
            "{f} missing:\n{stdout}"
        );
    }
    let csv = std::fs::read_to_string(dir.join("sweep/trials.csv")).unwrap();
    assert_eq!(csv.lines().count(), 5, "{csv}");
    // best.toml is a run configuration as it stands.
    let best = dir.join("sweep/best.toml");
    let args = atomrl_config::load_args(Some(&best), None, &[]).unwrap();
    assert_eq!(args.max_steps, 2);
    assert!(
        args.output_dir.ends_with("sweep/best"),
        "{}",
        args.output_dir
    );
    assert!([1e-3, 2e-3].contains(&args.lr));

    // A sweep killed while trial 1 ran: trial 0 is kept, trial 1 continues from its checkpoint.
    let r1 = dir.join("sweep/trial-001");
    let mut rec = record(&dir, 1);
    rec["status"] = "running".into();
    std::fs::write(r1.join("trial.json"), rec.to_string()).unwrap();
    let log0 = std::fs::read_to_string(dir.join("sweep/trial-000/log.txt")).unwrap();
    let log1_before = std::fs::read_to_string(r1.join("log.txt")).unwrap();
    let out = run(&cfg, &[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("trial 1: resuming"), "{stdout}");
    assert!(!stdout.contains("trial 0: starting"), "{stdout}");
    assert_eq!(
        std::fs::read_to_string(dir.join("sweep/trial-000/log.txt")).unwrap(),
        log0
    );
    assert_eq!(record(&dir, 1)["status"], "finished");
    // It ran again, on top of its checkpoint: its steps were logged once each.
    let log1 = std::fs::read_to_string(r1.join("log.txt")).unwrap();
    assert!(log1.len() > log1_before.len(), "{log1}");
    let rows = atomrl_trainer::logging::read_metrics(r1.join("run/metrics.jsonl")).unwrap();
    let steps: Vec<u64> = rows.iter().map(|r| r.step).filter(|&s| s > 0).collect();
    let mut unique = steps.clone();
    unique.dedup();
    assert_eq!(steps, unique, "{log1}");
}

#[test]
fn two_mpi_ranks_share_the_trials() {
    let dir = temp_dir("sweep-ranks");
    let search = "lr = { log_uniform = [1e-4, 1e-2] }\n";
    let cfg = write_sweep(&dir, "sampler = \"random\"\ntrials = 4", search);
    let spawn = |rank: &str| {
        let mut c = sweep_bin();
        c.args(["--config", cfg.to_str().unwrap()])
            .env("OMPI_COMM_WORLD_SIZE", "2")
            .env("OMPI_COMM_WORLD_RANK", rank);
        c.spawn().unwrap()
    };
    let (a, b) = (spawn("0"), spawn("1"));
    let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
    assert!(a.status.success() && b.status.success());
    for i in 0..4 {
        assert_eq!(record(&dir, i)["status"], "finished");
    }
    // Rank 0 writes the reports.
    assert!(dir.join("sweep/trials.md").is_file());
}

#[test]
fn bad_search_spaces_are_errors_naming_the_key() {
    let dir = temp_dir("sweep-bad");
    for (search, key) in [
        ("lrr = { uniform = [0.1, 0.2] }\n", "search.lrr"),
        ("lr = { uniform = [0.2, 0.1] }\n", "search.lr.uniform"),
        (
            "lr = { log_uniform = [0.0, 0.1] }\n",
            "search.lr.log_uniform",
        ),
        (
            "num_generations = { choice = [] }\n",
            "search.num_generations.choice",
        ),
        (
            "num_generations = { choice = [\"four\"] }\n",
            "search.num_generations",
        ),
    ] {
        let cfg = write_sweep(&dir, "trials = 2", search);
        let out = run(&cfg, &[]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{search}: {stderr}");
        assert!(stderr.contains(key), "{search}: {stderr}");
    }
}

#[test]
fn asha_stops_trials_that_fall_behind_at_a_rung_and_keeps_their_checkpoint() {
    let dir = temp_dir("sweep-asha");
    // The logged learning rate as the objective: known in advance, so the rule's decisions are.
    // The budget is long enough that a trial is still running when the sweep, which looks every
    // 0.3 s, sees its first rung (at 60 steps a fast CPU finished the trial between two looks,
    // and a trial that has ended is not stopped).
    let cfg = write_sweep(
        &dir,
        "sampler = \"grid\"\ntrials = 3\n[sweep.asha]\nmin_steps = 10\nreduction_factor = 2",
        "lr = { choice = [1e-2, 1e-3, 1e-4] }\n",
    );
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("metric = \"reward/mean\"\nat = \"best\"", "metric = \"lr\"")
        .replace("budget_steps = 2\n", "budget_steps = 600\n");
    std::fs::write(&cfg, text).unwrap();
    let out = run(&cfg, &[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(record(&dir, 0)["status"], "finished", "{stdout}");
    for i in [1, 2] {
        let r = record(&dir, i);
        assert_eq!(r["status"], "pruned", "{stdout}");
        assert!(
            r["rungs"][0][1].as_f64().unwrap() < record(&dir, 0)["rungs"][0][1].as_f64().unwrap()
        );
        let run = dir.join(format!("sweep/trial-{i:03}/run"));
        let kept = std::fs::read_dir(&run)
            .unwrap()
            .flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with("checkpoint-"));
        assert!(kept, "{stdout}");
    }
}
