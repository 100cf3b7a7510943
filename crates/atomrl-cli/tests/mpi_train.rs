//! `atomrl-train` data-parallel over MPI (feature `mpi`; needs Open MPI's `mpirun` on the
//! PATH): two ranks of one worker compute exactly what one process of two workers does
//! (every metric but the timings, bit for bit, and the final weights and optimizer moments,
//! byte for byte, the critic's too for PPO and TRPO), also when killed and resumed; a rank that fails ends the job; a resume
//! with another world size is refused.
#![cfg(feature = "mpi")]
#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use atomrl_trainer::logging::read_metrics;
use common::{model_dir, temp_dir, train_bin, write_dataset};

/// Open MPI 4's `mpirun`s started at the same moment race on their session directory, so the
/// tests of this file launch one job at a time.
static ONE_JOB: Mutex<()> = Mutex::new(());

fn one_job() -> MutexGuard<'static, ()> {
    ONE_JOB
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// `mpirun -np 2 atomrl-train ARGS` with one compute thread per rank.
fn mpirun_train(args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new("mpirun");
    cmd.args(["--allow-run-as-root", "--oversubscribe", "-np", "2"]);
    cmd.env("RAYON_NUM_THREADS", "1");
    for (k, v) in env {
        cmd.env(k, v);
    }
    for k in ["RAYON_NUM_THREADS"]
        .iter()
        .chain(env.iter().map(|(k, _)| k))
    {
        cmd.args(["-x", k]);
    }
    cmd.arg(env!("CARGO_BIN_EXE_atomrl-train"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// A run of `steps` steps with gradient accumulation, evaluation and checkpoints: GRPO with a
/// KL term (the reference model's log-probs), DAPO (dynamic sampling, its refills exchanged
/// between the ranks), PPO or TRPO (a critic), DPO (online pairs).
fn write_config(dir: &Path, recipe: &str, steps: usize) -> PathBuf {
    let data = write_dataset(dir);
    let path = dir.join("run.toml");
    let (extra, tables) = match recipe {
        "grpo" => ("beta = 0.04\n", ""),
        "dapo" => ("max_num_gen_batches = 3\noverlong_buffer_len = 4\n", ""),
        // The critic's values and GAE in the sharded experience, its update over the ranks,
        // the KL in the reward with its adaptive coefficient, two PPO epochs.
        "ppo" => (
            "beta = 0.04\nnum_iterations = 2\n",
            "[critic]\nlr = 1e-3\nkl_target = 0.01\nkl_horizon = 100.0\n",
        ),
        // Online pairs from the sharded rollouts, the reference pass on the pairs, whole pairs
        // per micro-batch, two optimizer steps per batch of pairs.
        "dpo" => ("num_iterations = 2\n", "[dpo]\nbeta = 0.2\n"),
        // The trust-region step: gradients and Fisher-vector products summed over the ranks.
        _ => ("", "[critic]\nlr = 1e-3\n[trpo]\ncg_iters = 4\n"),
    };
    let toml = format!(
        "recipe = {recipe:?}\nmodel = {:?}\ndataset = {:?}\noutput_dir = {:?}\nmax_steps = {steps}\n\
         batch_size = 3\nnum_generations = 4\nmax_completion_length = 10\neval_size = 5\neval_steps = 2\n\
         lr = 1e-3\nsave_steps = 2\nprogress = false\ngradient_accumulation_steps = 2\n{extra}\
         [[rewards]]\nname = \"digit\"\n{tables}",
        model_dir(),
        data.display().to_string(),
        dir.join("run").display().to_string()
    );
    std::fs::write(&path, toml).unwrap();
    path
}

/// Every metric but the wall-clock ones, as bits.
fn metric_bits(path: &Path) -> Vec<(u64, Vec<(String, u64)>)> {
    read_metrics(path)
        .unwrap()
        .into_iter()
        .map(|r| {
            let values = r
                .values
                .into_iter()
                .filter(|(k, _)| !k.starts_with("time/") && !k.starts_with("throughput/"))
                .map(|(k, x)| (k, x.to_bits()))
                .collect();
            (r.step, values)
        })
        .collect()
}

fn assert_success(out: &Output, what: &str) {
    assert!(
        out.status.success(),
        "{what} failed: {:?}\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The reference: one process of two workers, `steps` steps of `recipe`, in a new temporary
/// folder named `name`.
fn two_workers_run(name: &str, recipe: &str, steps: usize) -> common::TempDir {
    let dir = temp_dir(name);
    let cfg = write_config(&dir, recipe, steps);
    let out = train_bin()
        .args(["--config", cfg.to_str().unwrap(), "--set", "workers=2"])
        .output()
        .unwrap();
    assert_success(&out, "atomrl-train --set workers=2");
    dir
}

/// `mpirun -np 2 atomrl-train --config CFG` with one worker per rank, which must succeed.
fn two_ranks_run(cfg: &Path) -> Output {
    let out = mpirun_train(
        &["--config", cfg.to_str().unwrap(), "--set", "workers=1"],
        &[],
    )
    .output()
    .unwrap();
    assert_success(&out, "mpirun -np 2 atomrl-train");
    out
}

fn same_run_on_two_ranks_and_two_workers(recipe: &str) {
    let _job = one_job();
    let steps = 4;
    let threads = two_workers_run(&format!("mpi-{recipe}-workers"), recipe, steps);

    let ranks = temp_dir(&format!("mpi-{recipe}-ranks"));
    let cfg = write_config(&ranks, recipe, steps);
    let out = two_ranks_run(&cfg);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        stdout.matches("== AtomRL run finished").count(),
        1,
        "rank 0 alone prints the summary:\n{stdout}"
    );

    let (a, b) = (
        metric_bits(&threads.join("run/metrics.jsonl")),
        metric_bits(&ranks.join("run/metrics.jsonl")),
    );
    assert_eq!(a.len(), steps + 1, "step 0 (evaluation) and every step");
    let learned = read_metrics(threads.join("run/metrics.jsonl"))
        .unwrap()
        .iter()
        .filter(|r| r.get("grad_norm").is_some_and(|g| g > 0.0))
        .count();
    assert!(learned >= 2, "only {learned} steps had a gradient");
    assert_eq!(a, b, "metrics of 2 ranks differ from 2 workers");
    let mut files = vec!["model.safetensors", "optimizer.safetensors"];
    if matches!(recipe, "ppo" | "trpo") {
        files.extend(["critic/model.safetensors", "critic/optimizer.safetensors"]);
    }
    for file in files {
        let path = |root: &Path| root.join(format!("run/checkpoint-{steps}/{file}"));
        assert!(
            std::fs::read(path(&threads)).unwrap() == std::fs::read(path(&ranks)).unwrap(),
            "{file} of 2 ranks differs from 2 workers"
        );
    }
}

#[test]
fn two_ranks_train_exactly_as_two_workers_grpo_with_kl() {
    same_run_on_two_ranks_and_two_workers("grpo");
}

#[test]
fn two_ranks_train_exactly_as_two_workers_dapo() {
    same_run_on_two_ranks_and_two_workers("dapo");
}

#[test]
fn two_ranks_train_exactly_as_two_workers_ppo() {
    same_run_on_two_ranks_and_two_workers("ppo");
}

#[test]
fn two_ranks_train_exactly_as_two_workers_dpo() {
    same_run_on_two_ranks_and_two_workers("dpo");
}

#[test]
fn two_ranks_train_exactly_as_two_workers_trpo() {
    same_run_on_two_ranks_and_two_workers("trpo");
}

#[test]
fn a_failing_rank_ends_every_rank_within_seconds() {
    let _job = one_job();
    let dir = temp_dir("mpi-fail");
    let cfg = write_config(&dir, "grpo", 4);
    let start = Instant::now();
    let mut child = mpirun_train(
        &["--config", cfg.to_str().unwrap(), "--set", "workers=1"],
        &[("ATOMRL_TEST_FAIL_RANK", "1:2")],
    )
    .spawn()
    .unwrap();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > Duration::from_secs(120) {
            child.kill().unwrap();
            panic!("the job still runs 120 s after rank 1 failed");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!status.success(), "{stderr}");
    assert!(
        stderr.contains("error on rank 1") && stderr.contains("ATOMRL_TEST_FAIL_RANK"),
        "{stderr}"
    );
    assert!(
        !dir.join("run/checkpoint-2").exists(),
        "no rank went past the failed step"
    );
}

#[test]
fn two_ranks_killed_and_resumed_train_as_an_uninterrupted_run() {
    let _job = one_job();
    let straight = two_workers_run("mpi-resume-straight", "grpo", 4);

    let killed = temp_dir("mpi-resume-killed");
    let cfg = write_config(&killed, "grpo", 4);
    let args = ["--config", cfg.to_str().unwrap(), "--set", "workers=1"];
    // Both ranks SIGKILL themselves after step 3: the last checkpoint is step 2.
    let out = mpirun_train(&args, &[("ATOMRL_TEST_KILL_AFTER_STEP", "3")])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(killed.join("run/checkpoint-2").is_dir() && !killed.join("run/checkpoint-4").exists());
    let out = mpirun_train(&[&args[..], &["--resume"]].concat(), &[])
        .output()
        .unwrap();
    assert_success(&out, "mpirun -np 2 atomrl-train --resume");
    assert_eq!(
        metric_bits(&straight.join("run/metrics.jsonl")),
        metric_bits(&killed.join("run/metrics.jsonl")),
        "a resumed 2-rank run differs from 2 workers uninterrupted"
    );
}

#[test]
fn resuming_with_another_world_size_is_refused() {
    let _job = one_job();
    let dir = temp_dir("mpi-resume");
    let cfg = write_config(&dir, "grpo", 2);
    two_ranks_run(&cfg);
    let out = train_bin()
        .args(["--config", cfg.to_str().unwrap(), "--resume"])
        .args(["--set", "max_steps=4", "--set", "workers=2"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("`resume`") && stderr.contains("2 data-parallel process(es)"),
        "{stderr}"
    );
}
