//! Runs `atomrl-dist-check` under `mpirun -np 2` (needs Open MPI's `mpirun` on the PATH).
#![cfg(feature = "mpi")]
#![allow(clippy::unwrap_used)]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn mpirun(args: &[&str]) -> Command {
    let mut cmd = Command::new("mpirun");
    cmd.args(["--allow-run-as-root", "--oversubscribe", "-np", "2"])
        .arg(env!("CARGO_BIN_EXE_atomrl-dist-check"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

#[test]
fn mpi_collectives_check_on_two_ranks() {
    let out = mpirun(&[]).output().expect("mpirun on the PATH");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "mpirun failed: {:?}\n{stdout}\n{stderr}",
        out.status
    );
    for rank in 0..2 {
        assert!(
            stdout
                .lines()
                .any(|l| l.starts_with(&format!("rank {rank}/2")) && l.contains(": all_reduce")),
            "no ok line from rank {rank}:\n{stdout}\n{stderr}"
        );
    }
}

#[test]
fn mpi_failing_rank_ends_the_job_non_zero() {
    let start = Instant::now();
    let mut child = mpirun(&["--fail-rank", "1"])
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
