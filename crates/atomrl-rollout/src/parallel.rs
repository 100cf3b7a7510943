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

/// How a step's work is split: `workers` threads in this process, times the ranks of `comm`
/// (the shard rule of [`split_even`]: shard `s` runs on rank `s / workers`).
///
/// ```
/// use atomrl_dist::SingleProcess;
/// use atomrl_rollout::parallel::Parallel;
/// let par = Parallel { workers: 2, comm: &SingleProcess };
/// assert_eq!(par.shards(), 2);
/// ```
#[derive(Clone, Copy)]
pub struct Parallel<'a> {
    /// Worker threads of this process.
    pub workers: usize,
    /// The data-parallel ranks.
    pub comm: &'a dyn atomrl_dist::Collective,
}

impl Parallel<'_> {
    /// Shards in all: `workers × W`.
    ///
    /// See [`Parallel`] for an example.
    pub fn shards(&self) -> usize {
        self.workers.max(1) * self.comm.world_size()
    }

    /// The micro-batches of an update over `rows` rows with `accumulation` micro-batches per
    /// worker: `accumulation × shards` contiguous ranges ([`split_even`]), micro-batch `c`
    /// running on shard `c mod shards`. The update and every pass that must see its exact
    /// micro-batches (old, reference and critic scoring) take them from here.
    ///
    /// ```
    /// use atomrl_dist::SingleProcess;
    /// use atomrl_rollout::parallel::Parallel;
    /// let par = Parallel { workers: 2, comm: &SingleProcess };
    /// assert_eq!(par.micro_batches(10, 2), vec![0..3, 3..6, 6..8, 8..10]);
    /// ```
    pub fn micro_batches(&self, rows: usize, accumulation: usize) -> Vec<Range<usize>> {
        split_even(rows, accumulation.max(1) * self.shards())
    }
}

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

/// Row blocks `[len, T]` (f32) computed chunk by chunk and shared: chunk `c` of `0..chunks`
/// runs on shard `c mod (workers × W)` (this process's worker threads, then the ranks of
/// `comm`, as [`split_even`]'s shards do), and every rank gets every chunk in chunk order (one
/// all-gather of the values, exact: f32 through f64). Each chunk is computed exactly as one
/// process would compute it alone, so the blocks do not depend on the sharding.
///
/// For the passes whose results every shard needs, such as the old policy's and the reference
/// model's log-probs of a step: done once per step and split, instead of repeated on one
/// thread of every rank.
///
/// # Errors
/// A chunk's error (in chunk order), a failed collective, or a chunk that is not `[len, T]`.
/// Blocks received from other ranks are put on `device` (where the local ones are).
///
/// ```
/// use atomrl_core::CandleContext;
/// use atomrl_dist::SingleProcess;
/// use atomrl_rollout::parallel::sharded_chunks;
/// use candle_core::{Device, Tensor};
/// let blocks = sharded_chunks("example", 3, 2, &SingleProcess, &Device::Cpu, |c| {
///     Tensor::full(c as f32, (1, 2), &Device::Cpu).ctx("example")
/// })?;
/// let all = Tensor::cat(&blocks, 0)?.to_vec2::<f32>()?;
/// assert_eq!(all, vec![vec![0.0, 0.0], vec![1.0, 1.0], vec![2.0, 2.0]]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn sharded_chunks(
    func: &str,
    chunks: usize,
    workers: usize,
    comm: &dyn atomrl_dist::Collective,
    device: &candle_core::Device,
    f: impl Fn(usize) -> Result<candle_core::Tensor> + Sync,
) -> Result<Vec<candle_core::Tensor>> {
    use atomrl_core::CandleContext;
    let workers = workers.max(1);
    let shards = workers * comm.world_size();
    let first = workers * comm.rank();
    let local = run_shards(func, workers, |w| {
        (first + w..chunks)
            .step_by(shards)
            .map(|c| Ok((c, f(c)?)))
            .collect::<Result<Vec<_>>>()
    })?;
    let mut blocks: Vec<Option<candle_core::Tensor>> = vec![None; chunks];
    let mut flat = Vec::new();
    for (c, t) in local.into_iter().flatten() {
        if comm.world_size() > 1 {
            let (len, width) = t.dims2().ctx(func)?;
            let values = t
                .to_dtype(candle_core::DType::F32)
                .and_then(|t| t.to_vec2::<f32>());
            flat.extend([c as f64, len as f64, width as f64]);
            flat.extend(values.ctx(func)?.into_iter().flatten().map(f64::from));
        }
        blocks[c] = Some(t);
    }
    if comm.world_size() > 1 {
        for v in comm
            .all_gather_f64(&flat)
            .map_err(|e| dist_error(func, e))?
        {
            let mut rest = v.as_slice();
            while let [c, len, width, tail @ ..] = rest {
                let (c, len, width) = (*c as usize, *len as usize, *width as usize);
                let n = (len * width).min(tail.len());
                let values: Vec<f32> = tail[..n].iter().map(|&x| x as f32).collect();
                if c < chunks && blocks[c].is_none() {
                    blocks[c] = Some(
                        candle_core::Tensor::from_vec(values, (len, width), device).ctx(func)?,
                    );
                }
                rest = &tail[n..];
            }
        }
    }
    blocks
        .into_iter()
        .enumerate()
        .map(|(c, b)| {
            b.ok_or_else(|| {
                Error::value(
                    func,
                    "chunks",
                    "every chunk from some shard",
                    format!("chunk {c} missing"),
                )
            })
        })
        .collect()
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

    /// Chunk `c`: rows `[c + 1, 3]` of values that name the chunk, row and column.
    fn chunk(c: usize) -> Result<candle_core::Tensor> {
        let v: Vec<f32> = (0..(c + 1) * 3)
            .map(|i| c as f32 * 100.0 + i as f32 + 0.25)
            .collect();
        candle_core::Tensor::from_vec(v, (c + 1, 3), &candle_core::Device::Cpu)
            .map_err(|e| Error::value("t", "chunk", "a tensor", e))
    }

    fn values(blocks: &[candle_core::Tensor]) -> Vec<Vec<f32>> {
        blocks
            .iter()
            .flat_map(|b| b.to_vec2::<f32>().expect("values"))
            .collect()
    }

    #[test]
    fn sharded_chunks_equal_one_thread_for_any_workers_and_ranks() {
        let single = atomrl_dist::SingleProcess;
        let reference = values(
            &sharded_chunks("t", 5, 1, &single, &candle_core::Device::Cpu, chunk).expect("one"),
        );
        assert_eq!(reference.len(), 1 + 2 + 3 + 4 + 5);
        for workers in [2, 3, 7] {
            let got = sharded_chunks("t", 5, workers, &single, &candle_core::Device::Cpu, chunk)
                .expect("workers");
            assert_eq!(values(&got), reference, "{workers} workers");
        }
        // Two ranks of two workers each, as threads: every rank gets every chunk, and computes
        // only its own (chunk c on shard c mod 4).
        let computed = std::sync::Mutex::new(Vec::new());
        let per_rank = std::thread::scope(|s| {
            let handles: Vec<_> = atomrl_dist::ThreadGroup::new(2)
                .expect("group")
                .into_iter()
                .map(|m| {
                    let computed = &computed;
                    s.spawn(move || {
                        let f = |c| {
                            computed.lock().expect("lock").push(c);
                            chunk(c)
                        };
                        sharded_chunks("t", 5, 2, &m, &candle_core::Device::Cpu, f)
                            .map(|b| values(&b))
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("thread"))
                .collect::<Result<Vec<_>>>()
        })
        .expect("ranks");
        assert!(per_rank.iter().all(|v| *v == reference));
        let mut done = computed.into_inner().expect("lock");
        done.sort_unstable();
        assert_eq!(done, vec![0, 1, 2, 3, 4], "each chunk computed once");
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
