//! glibc's allocator tuned for candle's CPU tensors: freed buffers kept in the process, and one
//! malloc arena per data-parallel worker for small models.
//!
//! Both are `mallopt(3)` calls; on platforms other than Linux with glibc they do nothing.

/// Models up to this many parameters get a malloc arena per data-parallel worker thread
/// ([`arenas_for_workers`]); larger ones keep the one arena of [`tune_allocator`].
///
/// Measured on a 2-core Intel Xeon with two workers of one thread: the embedded ~1M-parameter
/// model's GRPO step (`grpo_gsm8k`, 150 steps) took 23.2–25.7 s with one arena and 19.2–21.5 s
/// with three (the main thread's and one per worker), where the two workers had waited on the
/// one arena's lock for each of the thousands of small buffers a step allocates (kernel time
/// 1.8–2.2 s → 0.2–0.3 s); peak memory 237–241 → 247 MB. At the 3.7M-parameter `4m` bench
/// shape the same setting made the training step slower (0.65–0.97 → 0.88–1.03 s) and doubled
/// its peak memory (0.55 → 1.0 GiB): there each worker's arena holds its own activations,
/// which one arena lets the workers reuse, and LM-head chunks of 64 MiB do not fit a worker
/// arena's heaps, so glibc maps and unmaps them on every use.
pub const ARENA_PER_WORKER_MAX_PARAMS: usize = 2_000_000;

/// Keeps freed tensor buffers in the process instead of returning them to the OS.
///
/// Candle allocates a new buffer for every tensor op; glibc serves large ones with mmap and
/// unmaps them on free, and trims the heap, so each op page-faults its output in again. On a
/// 2-core machine this was ~25% of a training step of a 1M-parameter model; with buffers up to
/// 32 MiB kept in the heap and trimming off, forward + backward ran ~1.7x faster. One arena
/// for all threads: glibc gives each data-parallel worker thread its own arena, whose heaps
/// are mapped apart and cannot hold a buffer over 64 MiB (glibc maps such a buffer and unmaps
/// it on free, whatever `M_MMAP_MAX` says), and each arena keeps its own high-water mark (two
/// workers at the 4m shape: twice the peak memory); [`arenas_for_workers`] makes the
/// exception for small models. No buffer is mmapped at all (`M_MMAP_MAX = 0`): at
/// Qwen2.5-0.5B a parameter's gradient is up to 544 MB, above any mmap threshold, and each was
/// mapped, faulted in and unmapped again; the CPU training step then flipped between 13 s and
/// 17–19 s from run to run with the number of page faults (9 vs 11–12 million), and with every
/// buffer in the retained heap it takes 13.2–13.9 s every time with 4 million faults and the
/// same peak memory (2-core AMD EPYC; on a 2-core Intel Xeon the same setting gave 24.4 → 20.6
/// s, docs/performance.md). Trimming is off altogether (`M_TRIM_THRESHOLD = -1`, mallopt(3)):
/// the largest threshold an `int` can say is 2 GiB, and at 0.5B the memory freed at the end of
/// a step (activations, gradients) joins into a top chunk larger than that, which glibc then
/// gave back to the OS, so every step faulted its buffers in again (Intel Xeon: 21% of the
/// step in the kernel zeroing pages, 17.5–18.6 s → 14.2–15.5 s a step without it).
///
/// Call once at the start of `main`, before other threads exist.
///
/// ```
/// atomrl_core::allocator::tune_allocator();
/// let kept = vec![0f32; 1 << 20]; // served from the heap, not mmapped
/// assert_eq!(kept.len(), 1 << 20);
/// ```
pub fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[allow(unsafe_code)]
    // SAFETY: mallopt only changes allocator parameters (under glibc's own lock), with valid
    // option constants and values.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_MMAP_MAX, 0);
        libc::mallopt(libc::M_TRIM_THRESHOLD, -1);
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

/// One malloc arena per data-parallel worker thread (and the main thread's, and one for each
/// thread of rayon's global pool), for models of at most [`ARENA_PER_WORKER_MAX_PARAMS`]
/// parameters trained by two or more workers; otherwise nothing changes. Call once the run's
/// workers are known, before they start.
///
/// The pool's threads count because a running thread keeps its arena: where they were left
/// out, the one pool thread of a one-thread plan (started by the gradient norm, which no
/// longer uses rayon at one thread) held a worker's arena for the whole run, and the two
/// workers shared the other one and waited on its lock (2-core AMD EPYC, embedded model:
/// GRPO 43.8–47.5 → 39.8–42.3 ms a step, PPO 51.6–57.1 → 47.8–52.6 ms; docs/performance.md
/// item 27). A limit above the threads that allocate costs nothing: arenas are made on demand.
///
/// A worker's heap also keeps 64 MiB of padding at its top (`M_TOP_PAD`): without it glibc
/// unmaps a worker heap that a step has emptied, and the next step faults it in again
/// (~800 page faults a step of the embedded model).
///
/// ```
/// use atomrl_core::allocator::arenas_for_workers;
/// arenas_for_workers(1_000_000, 2); // the embedded model, two workers: an arena each
/// arenas_for_workers(494_000_000, 1); // one worker: unchanged
/// ```
pub fn arenas_for_workers(num_params: usize, workers: usize) {
    if workers < 2 || num_params > ARENA_PER_WORKER_MAX_PARAMS {
        return;
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[allow(unsafe_code)]
    // SAFETY: as in `tune_allocator`; the arena limit only affects arenas created later.
    unsafe {
        let pool = candle_core::utils::get_num_threads();
        let arenas = libc::c_int::try_from(workers + 1 + pool).unwrap_or(libc::c_int::MAX);
        libc::mallopt(libc::M_ARENA_MAX, arenas);
        libc::mallopt(libc::M_TOP_PAD, 64 << 20);
    }
}
