//! Data parallelism on the CPU: shards of a batch run on their own threads, each with
//! single-threaded tensor math; the same shard rule across data-parallel ranks.
//!
//! Why not just more candle threads: the models this trainer runs on a CPU are small
//! (~1M parameters for the embedded example), and candle parallelises one op at a time, so
//! with two threads much of an op's time goes into the thread pool's barrier (forward +
//! backward of 64 x 72 tokens on the example's model, 2 cores: 0.67 s with one thread,
//! 0.50–0.56 s with two). Splitting the *batch* instead keeps every core busy on whole forward
//! and backward passes (0.34 s for the same work on two workers:
//! `cargo bench -p atomrl-trainer --bench embedded_fwd_bwd`), and the rollouts and the
//! evaluation split the same way (a GRPO step of the example: 0.46 s on one worker, 0.27 s on
//! two).
//! Results are combined in shard order, so a run is deterministic for a given worker count.
//!
//! Across processes (`mpirun -np N atomrl-train`, an [`atomrl_dist::Collective`] of `N`
//! ranks), each rank runs `workers` of the `N × workers` shards with the same rule, and the
//! ranks combine their results in rank order: `N` ranks of one worker compute exactly what
//! one process of `N` workers does (docs/distributed.md).

use std::ops::Range;

use atomrl_core::{Error, Result};

/// Splits `0..n` into `parts` contiguous ranges whose lengths differ by at most one (the
/// first ones longer); fewer ranges when `n < parts`, none when `n == 0`.
///
/// ```
/// use atomrl_rollout::parallel::split_even;
/// assert_eq!(split_even(5, 2), vec![0..3, 3..5]);
/// assert_eq!(split_even(1, 4), vec![0..1]);
/// assert!(split_even(0, 3).is_empty());
/// ```
pub fn split_even(n: usize, parts: usize) -> Vec<Range<usize>> {
    let parts = parts.clamp(1, n.max(1));
    let (base, extra) = (n / parts, n % parts);
    let mut start = 0;
    (0..parts)
        .map(|i| {
            let len = base + usize::from(i < extra);
            let range = start..start + len;
            start += len;
            range
        })
        .filter(|r| !r.is_empty())
        .collect()
}

/// A failed collective operation as this crate's error, naming `func`.
pub fn dist_error(func: &str, e: atomrl_dist::DistError) -> Error {
    Error::value(func, "collective", "every rank to take part", e)
}

/// Runs `f(shard)` for every shard `0..shards`, each on its own scoped thread (the current
/// thread when there is a single shard), and returns the results in shard order.
///
/// # Errors
/// The first shard's error, in shard order; an [`Error::Value`] naming `func` when a worker
/// thread panicked.
///
/// ```
/// use atomrl_rollout::parallel::run_shards;
/// let squares = run_shards("example", 3, |i| Ok(i * i))?;
/// assert_eq!(squares, vec![0, 1, 4]);
/// # Ok::<(), atomrl_core::Error>(())
/// ```
pub fn run_shards<T: Send>(
    func: &str,
    shards: usize,
    f: impl Fn(usize) -> Result<T> + Sync,
) -> Result<Vec<T>> {
    if shards <= 1 {
        return (0..shards).map(&f).collect();
    }
    let f = &f;
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..shards).map(|i| scope.spawn(move || f(i))).collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().map_err(|_| {
                    Error::value(func, "workers", "worker threads that finish", "a panic")
                })?
            })
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn split_even_covers_in_order(n in 0usize..200, parts in 0usize..9) {
            let ranges = split_even(n, parts);
            prop_assert!(ranges.len() <= parts.max(1));
            let mut next = 0;
            for r in &ranges {
                prop_assert_eq!(r.start, next);
                prop_assert!(!r.is_empty());
                next = r.end;
            }
            prop_assert_eq!(next, n);
            let lens: Vec<usize> = ranges.iter().map(|r| r.len()).collect();
            if let (Some(max), Some(min)) = (lens.iter().max(), lens.iter().min()) {
                prop_assert!(max - min <= 1);
            }
        }
    }

    #[test]
    fn shard_errors_come_back_in_order() {
        let err = run_shards("t", 4, |i| {
            if i >= 2 {
                Err(Error::value("t", "shard", "< 2", i))
            } else {
                Ok(i)
            }
        })
        .unwrap_err();
        assert!(err.to_string().contains('2'), "{err}");
    }
}
