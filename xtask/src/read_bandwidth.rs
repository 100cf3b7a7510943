//! The CPU's memory read bandwidth, measured: the bound of `xtask bench`'s decode on the CPU.
//!
//! A decode step reads every weight once, so its floor is the weights' bytes over the rate the
//! cores can stream memory. That rate differs by machine (about 23 GB/s on the 2-core Intel
//! Xeon of docs/performance.md, where a fixed 20 GB/s put batch 1 above 100% of its bound), so
//! the bench measures it instead of assuming it, in a child process.

use std::time::Instant;

use anyhow::{anyhow, Context, Result};

/// [`cpu_read_bandwidth`] measured by a child process (`xtask read-bandwidth`): the AtomRL
/// binaries never give memory back to the OS (`atomrl_core::allocator::tune_allocator`), so
/// the 1 GiB buffer read in this process would stay in its resident set and in the bench's
/// peak memory.
pub fn cpu_read_bandwidth_in_child() -> Result<f64> {
    let exe = std::env::current_exe().context("finding the xtask binary")?;
    let out = std::process::Command::new(&exe)
        .arg("read-bandwidth")
        .output()
        .with_context(|| format!("running {} read-bandwidth", exe.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(anyhow!(
            "{} read-bandwidth failed: {}",
            exe.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    text.trim()
        .parse()
        .with_context(|| format!("reading the bandwidth from {:?}", text.trim()))
}

/// Bytes read per pass: more than a large server's last-level cache (300 MiB on that Xeon), so
/// the reads come from memory.
const BYTES: usize = 1 << 30;

/// Timed passes; the fastest is kept (another process may slow any one of them).
const PASSES: usize = 3;

/// Bytes a second that every core together reads from memory: the fastest of [`PASSES`] sums
/// of a 1 GiB buffer split over one thread per core.
pub fn cpu_read_bandwidth() -> Result<f64> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let data = vec![1f32; BYTES / std::mem::size_of::<f32>()];
    let per_thread = data.len().div_ceil(threads);
    let mut best = f64::INFINITY;
    for _ in 0..PASSES {
        let start = Instant::now();
        let total = std::thread::scope(|s| {
            let handles: Vec<_> = data
                .chunks(per_thread)
                .map(|part| s.spawn(move || pulp::Arch::new().dispatch(|| sum(part))))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().map_err(|_| anyhow!("a bandwidth thread panicked")))
                .sum::<Result<f32>>()
        })?;
        best = best.min(start.elapsed().as_secs_f64());
        std::hint::black_box(total);
    }
    Ok(BYTES as f64 / best)
}

/// The sum of `xs` in 16 independent lanes, so the compiler vectorises it, inlined into
/// pulp's dispatch so that it gets the CPU's widest vectors: with SSE2 alone two cores of the
/// Intel Xeon read 20.3 GB/s, with AVX-512 23.5 (as torch's sum).
#[inline(always)]
fn sum(xs: &[f32]) -> f32 {
    let mut lanes = [0f32; 16];
    let chunks = xs.chunks_exact(16);
    let rest: f32 = chunks.remainder().iter().sum();
    for c in chunks {
        for (l, x) in lanes.iter_mut().zip(c) {
            *l += x;
        }
    }
    lanes.iter().sum::<f32>() + rest
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_every_element() {
        let xs: Vec<f32> = (0..1000).map(|i| i as f32).collect();
        assert_eq!(sum(&xs), 499_500.0);
        assert_eq!(sum(&xs[..7]), 21.0);
    }
}
