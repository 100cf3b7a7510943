//! `runtime::tune_allocator` keeps freed memory in the process however much of it there is.
//!
//! Its own test binary: the allocator must be tuned before any other thread exists.
#![allow(clippy::unwrap_used)]

/// Resident set size of this process in bytes (Linux: `VmRSS` of /proc/self/status).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn resident_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024
}

/// A 0.5B training step frees more than 2 GiB at once at the top of the heap; with the
/// largest `int` trim threshold glibc returned it to the OS and the next step faulted it in
/// again page by page (docs/performance.md). 2.5 GiB freed must stay resident.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[test]
fn memory_freed_past_two_gib_stays_in_the_heap() {
    atomrl_trainer::runtime::tune_allocator();
    const SIZE: usize = 5 << 29; // 2.5 GiB
    let before = resident_bytes();
    let buffer = std::hint::black_box(vec![1u8; SIZE]);
    let held = resident_bytes();
    assert!(
        held >= before + SIZE as u64 * 9 / 10,
        "the buffer was not resident"
    );
    drop(buffer);
    let after = resident_bytes();
    assert!(
        after >= before + SIZE as u64 * 9 / 10,
        "glibc gave the freed {SIZE} bytes back: resident {before} → {held} → {after}"
    );
}
