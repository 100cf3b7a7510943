//! Runs `atomrl-dist-check` under `mpirun -np 2` (needs Open MPI's `mpirun` on the PATH).
#![cfg(feature = "mpi")]
#![allow(clippy::unwrap_used)]

use std::process::{Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Open MPI 4's `mpirun`s started at the same moment race on creating their session
/// directory (`/tmp/ompi.<host>.<uid>`: "mkdir … File exists", orte_init fails), so the
/// tests of this file launch one job at a time.
static ONE_JOB: Mutex<()> = Mutex::new(());

fn one_job() -> MutexGuard<'static, ()> {
    ONE_JOB
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn mpirun(np: usize, args: &[&str]) -> Command {
    let mut cmd = Command::new("mpirun");
    cmd.args([
        "--allow-run-as-root",
        "--oversubscribe",
        "-np",
        &np.to_string(),
    ])
    .arg(env!("CARGO_BIN_EXE_atomrl-dist-check"))
    .args(args)
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    cmd
}

fn check_ranks(np: usize) {
    let _job = one_job();
    let out = mpirun(np, &[]).output().expect("mpirun on the PATH");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "mpirun failed: {:?}\n{stdout}\n{stderr}",
        out.status
    );
    for rank in 0..np {
        assert!(
            stdout
                .lines()
                .any(|l| l.starts_with(&format!("rank {rank}/{np}"))
                    && l.contains(": all_reduce")
                    && l.contains("1000-element")),
            "no ok line from rank {rank}:\n{stdout}\n{stderr}"
        );
    }
}

#[test]
fn mpi_collectives_check_on_two_ranks() {
    check_ranks(2);
}

#[test]
fn mpi_collectives_check_on_three_ranks() {
    // Vectors shorter than W (n = 0, 1) leave some ranks an empty slice of the reduce-scatter.
    check_ranks(3);
}

#[test]
fn mpi_failing_rank_ends_the_job_non_zero() {
    let _job = one_job();
    let start = Instant::now();
    let mut child = mpirun(2, &["--fail-rank", "1"])
        .spawn()
        .expect("mpirun on the PATH");
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > Duration::from_secs(30) {
            child.kill().unwrap();
            let _ = child.wait();
            panic!("the job did not end within 30 s after rank 1 aborted");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!status.success(), "the job succeeded: {stderr}");
    assert!(stderr.contains("rank 1/2: error"), "{stderr}");
    eprintln!("failing job ended in {:?} with {status:?}", start.elapsed());
}
