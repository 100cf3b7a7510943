//! Running a kernel: blocks one after another, each block's threads as host threads.

use std::sync::Mutex;

/// A launch's grid and block dimensions, as cudarc's `LaunchConfig` gives them (no dynamic
/// shared memory: AtomRL's kernels use none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Launch {
    /// Blocks along x, y and z.
    pub grid: (u32, u32, u32),
    /// Threads per block along x, y and z.
    pub block: (u32, u32, u32),
}

impl Launch {
    /// A one-dimensional launch of `blocks` blocks of `threads` threads.
    ///
    /// ```
    /// let l = atomrl_cuda_sim::Launch::linear(4, 256);
    /// assert_eq!((l.grid, l.block), ((4, 1, 1), (256, 1, 1)));
    /// ```
    pub fn linear(blocks: u32, threads: u32) -> Self {
        Self {
            grid: (blocks, 1, 1),
            block: (threads, 1, 1),
        }
    }

    /// The launch of `(grid, block)` dimensions as `atomrl_core::launch_dims` computes them for
    /// the CUDA launches.
    ///
    /// ```
    /// let l = atomrl_cuda_sim::Launch::from_dims(([2, 3, 1], [64, 1, 1]));
    /// assert_eq!((l.grid, l.block), ((2, 3, 1), (64, 1, 1)));
    /// ```
    pub fn from_dims((grid, block): ([u32; 3], [u32; 3])) -> Self {
        Self {
            grid: (grid[0], grid[1], grid[2]),
            block: (block[0], block[1], block[2]),
        }
    }

    fn threads(&self) -> u32 {
        self.block.0 * self.block.1 * self.block.2
    }
}

/// A device pointer for the kernel closure: a host address that threads may share, because
/// the kernel, like a CUDA kernel, decides which thread touches which element.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ptr(usize);

impl Ptr {
    pub(crate) fn of<T>(s: &[T]) -> Self {
        Self(s.as_ptr() as usize)
    }
    pub(crate) fn of_mut<T>(s: &mut [T]) -> Self {
        Self(s.as_mut_ptr() as usize)
    }
    pub(crate) fn get<T>(self) -> *const T {
        self.0 as *const T
    }
    pub(crate) fn get_mut<T>(self) -> *mut T {
        self.0 as *mut T
    }
}

// The thread model of sim/runtime.cpp.
#[allow(unsafe_code)]
mod ffi {
    extern "C" {
        pub fn atomrl_sim_block_begin(grid: *const u32, dims: *const u32, index: *const u32);
        pub fn atomrl_sim_block_end();
        pub fn atomrl_sim_thread_begin(t: u32);
        pub fn atomrl_sim_thread_end();
    }
}

/// The runtime's launch state is global: one launch at a time in the process.
static LAUNCH: Mutex<()> = Mutex::new(());

/// Runs `kernel` (a call of one `extern "C"` kernel of `../atomrl-core/cuda`) as the GPU would
/// under `launch`: every block in turn (x fastest), each block's threads at once, with
/// `__syncthreads` and warp shuffles synchronising them.
///
/// # Panics
/// When a dimension is 0 or a block has more than 1,024 threads (CUDA's limit).
#[allow(unsafe_code)]
pub(crate) fn launch(launch: Launch, kernel: &(dyn Fn() + Sync)) {
    let threads = launch.threads();
    assert!(
        (1..=1024).contains(&threads) && launch.grid.0 * launch.grid.1 * launch.grid.2 > 0,
        "a launch needs 1 to 1,024 threads a block and at least one block, got {launch:?}"
    );
    let _one_at_a_time = LAUNCH.lock().unwrap_or_else(|e| e.into_inner());
    let grid = [launch.grid.0, launch.grid.1, launch.grid.2];
    let dims = [launch.block.0, launch.block.1, launch.block.2];
    for z in 0..grid[2] {
        for y in 0..grid[1] {
            for x in 0..grid[0] {
                let index = [x, y, z];
                // SAFETY: the three arrays hold three u32 each; the runtime copies them.
                unsafe {
                    ffi::atomrl_sim_block_begin(grid.as_ptr(), dims.as_ptr(), index.as_ptr())
                };
                std::thread::scope(|s| {
                    let threads: Vec<_> = (0..threads)
                        .map(|t| {
                            s.spawn(move || {
                                // SAFETY: within the block begun above; `t` < its thread count.
                                unsafe { ffi::atomrl_sim_thread_begin(t) };
                                kernel();
                                // SAFETY: this thread's last call into the block.
                                unsafe { ffi::atomrl_sim_thread_end() };
                            })
                        })
                        .collect();
                    // Joined one by one (pthread_join), not only by the scope's end, so that
                    // a sanitizer sees each thread's writes happen before the block's end.
                    for t in threads {
                        if let Err(panic) = t.join() {
                            std::panic::resume_unwind(panic);
                        }
                    }
                });
                // SAFETY: every thread of the block has returned (the scope joined them).
                unsafe { ffi::atomrl_sim_block_end() };
            }
        }
    }
}
