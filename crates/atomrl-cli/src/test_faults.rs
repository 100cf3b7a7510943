//! Faults the process-level tests inject into `atomrl-train` (feature `test-hooks` only: no
//! other build reads these variables). They go through the trainer's public experience hook,
//! so nothing of them is in the training code.
//!
//! - `ATOMRL_TEST_KILL_AFTER_STEP=N`: a real SIGKILL of this process once step `N` is logged
//!   (and saved, if it is a save step) — at step `N + 1`'s hook, exactly like an operator's
//!   `kill -9` during that step.
//! - `ATOMRL_TEST_FAIL_RANK=R:N`: rank `R` fails at step `N` with an error naming the variable.

use atomrl_core::Error;
use atomrl_trainer::ExperienceHook;

/// The hook of the faults the environment asks for on rank `rank`, if any.
pub fn from_env(rank: usize) -> Option<ExperienceHook> {
    let kill_after = std::env::var("ATOMRL_TEST_KILL_AFTER_STEP")
        .ok()
        .and_then(|s| s.parse::<u64>().ok());
    let fail = std::env::var("ATOMRL_TEST_FAIL_RANK").ok();
    if kill_after.is_none() && fail.is_none() {
        return None;
    }
    Some(Box::new(move |step, _| {
        if kill_after.is_some_and(|n| step == n + 1) {
            let _ = std::process::Command::new("kill")
                .args(["-9", &std::process::id().to_string()])
                .status();
            std::thread::sleep(std::time::Duration::from_secs(10));
        }
        match &fail {
            Some(asked) if *asked == format!("{rank}:{step}") => Err(Error::value(
                "atomrl-train",
                "ATOMRL_TEST_FAIL_RANK",
                "no failure",
                asked,
            )),
            _ => Ok(()),
        }
    }))
}
