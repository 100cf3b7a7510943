//! How a CPU run spreads over the cores: data-parallel workers, and the threads each of their
//! tensor ops uses, chosen from the model's size (docs/performance.md, "The thread rule").
//! `atomrl_trainer::runtime` re-exports it; the trainer, the examples and the benches use it.

/// Models up to this many parameters train on the CPU with data-parallel workers of one
/// thread each. Small models' ops are too short to share between threads (candle splits one op
/// at a time and waits at a barrier after it), so whole micro-batches per core win: at the 4m
/// shape on 2 cores, 2 workers × 1 thread ran a training step in 0.57 s against 1.03 s for 1
/// worker × 2 threads. Larger models: see [`TWO_WORKERS_MAX_PARAMS`].
pub const WORKERS_MAX_PARAMS: usize = 100_000_000;

/// Models above [`WORKERS_MAX_PARAMS`] and up to this many parameters train with two workers,
/// each op on half the cores; larger ones with one worker whose ops use every core. The matrix
/// products and AtomRL's own kernels split over threads, but candle's element-wise maps,
/// copies and reductions run on the calling thread, so with a single worker the other cores
/// idle through them. Two workers keep two cores busy there, at the cost of a second gradient
/// store (4 bytes a parameter: 2 GB at 0.5B, hence the bound). Qwen2.5-0.5B on a 2-core Intel
/// Xeon (`xtask bench`, medians of 3 steps, docs/performance.md item 22): 13.05–13.12 s a step
/// against 16.36–16.58 s with one worker of two threads.
pub const TWO_WORKERS_MAX_PARAMS: usize = 1_000_000_000;

/// How a CPU run spreads over the cores: data-parallel `workers`, each op on `threads`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuPlan {
    /// Compute threads of each tensor op (candle's thread pools).
    pub threads: usize,
    /// Data-parallel workers (`atomrl_rollout::parallel`).
    pub workers: usize,
}

impl CpuPlan {
    /// A warning when `workers × threads` exceeds `cores`: every op then waits for threads the
    /// OS has to time-slice (1 worker × 1,000 threads on 2 cores barely moved), and nothing
    /// else would tell the user why the run crawls.
    ///
    /// ```
    /// use atomrl_core::cpu_plan::CpuPlan;
    /// assert!(CpuPlan { threads: 1, workers: 2 }.oversubscription(2).is_none());
    /// assert!(CpuPlan { threads: 4, workers: 2 }.oversubscription(2).is_some());
    /// ```
    pub fn oversubscription(&self, cores: usize) -> Option<String> {
        let (w, t) = (self.workers, self.threads);
        (w.saturating_mul(t) > cores).then(|| {
            format!(
                "{w} worker(s) × {t} thread(s) on {cores} core(s): more threads than cores slow \
                 every op down (0 for `threads` and `workers` chooses)"
            )
        })
    }
}

/// The CPU plan for a model of `num_params` parameters on this machine's cores; a non-zero
/// `threads` or `workers` is kept as given (0 = choose). See [`WORKERS_MAX_PARAMS`] for the
/// rule and [`cpu_plan_for`] for it with the core count given.
///
/// ```
/// use atomrl_core::cpu_plan::cpu_plan;
/// let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
/// // A 1M-parameter model: every core a worker of one thread.
/// let plan = cpu_plan(1_000_000, 0, 0);
/// assert_eq!((plan.workers, plan.threads), (cores, 1));
/// ```
pub fn cpu_plan(num_params: usize, threads: usize, workers: usize) -> CpuPlan {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    cpu_plan_for(num_params, cores, threads, workers)
}

/// [`cpu_plan`] on `cores` cores.
///
/// ```
/// use atomrl_core::cpu_plan::{cpu_plan_for, CpuPlan};
/// // The embedded 1M-parameter model on 2 cores: two workers of one thread.
/// assert_eq!(cpu_plan_for(1_000_000, 2, 0, 0), CpuPlan { threads: 1, workers: 2 });
/// // Qwen2.5-0.5B: two workers, each op on half the cores.
/// assert_eq!(cpu_plan_for(494_000_000, 2, 0, 0), CpuPlan { threads: 1, workers: 2 });
/// assert_eq!(cpu_plan_for(494_000_000, 8, 0, 0), CpuPlan { threads: 4, workers: 2 });
/// // Qwen2.5-1.5B: one worker on every core.
/// assert_eq!(cpu_plan_for(1_540_000_000, 8, 0, 0), CpuPlan { threads: 8, workers: 1 });
/// // Given values are kept; the other one fills the cores.
/// assert_eq!(cpu_plan_for(1_000_000, 8, 0, 2), CpuPlan { threads: 4, workers: 2 });
/// assert_eq!(cpu_plan_for(494_000_000, 2, 2, 0), CpuPlan { threads: 2, workers: 1 });
/// ```
pub fn cpu_plan_for(num_params: usize, cores: usize, threads: usize, workers: usize) -> CpuPlan {
    let cores = cores.max(1);
    let most_workers = if num_params <= WORKERS_MAX_PARAMS {
        cores
    } else if num_params <= TWO_WORKERS_MAX_PARAMS {
        cores.min(2)
    } else {
        1
    };
    let workers = match (workers, threads) {
        (0, 0) => most_workers,
        (0, t) => (cores / t).clamp(1, most_workers),
        (w, _) => w,
    };
    let threads = if threads == 0 {
        (cores / workers).max(1)
    } else {
        threads
    };
    CpuPlan { threads, workers }
}

/// Chooses the CPU plan for a model of `num_params` parameters (see [`cpu_plan`]) and sets its
/// thread count for candle (see [`set_threads`]). Call before any tensor work: candle sizes
/// its thread pools on first use. `atomrl-train`, the examples and the benches call it (as
/// `atomrl_trainer::runtime::apply_cpu_plan`); a library user building an
/// `atomrl_trainer::Trainer` directly calls it first to get the same speed.
pub fn apply_cpu_plan(num_params: usize, threads: usize, workers: usize) -> CpuPlan {
    let plan = cpu_plan(num_params, threads, workers);
    set_threads(plan.threads);
    plan
}

/// Sets the number of CPU compute threads (candle reads `RAYON_NUM_THREADS` when its thread
/// pool starts); 0 leaves the default (all cores). Call before any tensor work.
pub fn set_threads(threads: usize) {
    if threads > 0 && std::env::var_os("RAYON_NUM_THREADS").is_none() {
        std::env::set_var("RAYON_NUM_THREADS", threads.to_string());
    }
}
