//! `cargo xtask kernel-races`: the tests that run AtomRL's CUDA kernels on the CPU
//! (atomrl-cuda-sim, docs/cuda.md) again with the kernels built under ThreadSanitizer. A thread
//! of a block that touches memory another thread of the block touches, with no barrier between,
//! is then reported on every run, where the plain tests catch it only when the host's
//! scheduling makes a value come out wrong.

use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context, Result};

/// The crates whose unit tests run the kernels, and the filter naming those tests (empty: all
/// of the crate's tests).
const KERNEL_TESTS: [(&str, &str); 5] = [
    ("atomrl-cuda-sim", ""),
    ("atomrl-optim", "kernels_sim"),
    ("atomrl-logprob", "kernels_sim"),
    ("atomrl-sample", "pick_sim"),
    ("atomrl-model", "sim_tests"),
];

/// Runs each crate's kernel tests with `ATOMRL_SIM_SANITIZE=thread`; fails on a failed test or
/// any race the sanitizer reports (its exit code 66).
pub fn run() -> Result<()> {
    let suppressions =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../crates/atomrl-cuda-sim/sim/tsan.supp");
    for (krate, filter) in KERNEL_TESTS {
        let mut args = vec!["test", "-p", krate];
        if !filter.is_empty() {
            args.extend(["--lib", filter]);
        }
        // One test at a time: launches from two test threads are ordered by a Rust mutex, whose
        // uninstrumented atomics the sanitizer cannot see.
        args.extend(["--", "--test-threads=1"]);
        println!("== ATOMRL_SIM_SANITIZE=thread cargo {}", args.join(" "));
        let status = Command::new(env!("CARGO"))
            .args(&args)
            .env("ATOMRL_SIM_SANITIZE", "thread")
            .env(
                "TSAN_OPTIONS",
                format!(
                    "suppressions={} halt_on_error=0 exitcode=66",
                    suppressions.display()
                ),
            )
            .status()
            .with_context(|| format!("running cargo {}", args.join(" ")))?;
        if !status.success() {
            bail!(
                "{krate}: a kernel test failed or ThreadSanitizer reported a data race ({status})"
            );
        }
    }
    println!("AtomRL's CUDA kernels: no data race under ThreadSanitizer");
    Ok(())
}
