//! AtomRL's CUDA kernels (`crates/atomrl-core/cuda/*.cu`) run on the CPU, so that the CPU test
//! suite checks them where no GPU is at hand.
//!
//! `build.rs` compiles the very `.cu` files as host C++ with `sim/sim.h` force-included: the
//! CUDA keywords and intrinsics the kernels use, `__nv_bfloat16` and `__half` with CUDA's
//! round-to-nearest-even conversions. A launch ([`Launch`]) runs the grid's blocks one after
//! another and each block's threads as host threads, so that `__syncthreads` (a barrier over
//! the block), warp shuffles (a barrier and an exchange over the warp) and `__shared__` memory
//! behave as on the GPU. Threads that skip a barrier race here as they would there: with the
//! `__syncthreads` of the token draw's reduction removed, its tests fail. (A race is found when
//! the host's scheduling exposes it, not proven absent; Numba's CUDA simulator,
//! `NUMBA_ENABLE_CUDASIM`, has the same limit and takes the same approach.)
//!
//! Tensor-core products (`nvcuda::wmma`) come from `sim/mma.h`, in place of `<mma.h>`: every lane
//! holds a whole 16 × 16 tile, since CUDA leaves the spread of a fragment over the warp
//! unspecified, and a kernel may only use fragments in ways that do not depend on it.
//!
//! What it does not check: speed, memory coalescing, the GPU's own `expf`/`logf` (the host C
//! library's stand in, so results agree with the GPU's to a few ulps, not bit for bit), the
//! tensor cores' own summation order, and
//! the host code that launches the kernels on a GPU (the functions here take the same
//! [`Launch`] that code computes; `xtask device-check` covers the rest on a GPU).
//!
//! The functions of [`kernels`] are safe: each checks its slices' lengths (and the indices it
//! will follow: tokens, positions, the cache column) against what the kernel reads and writes,
//! and panics naming the argument, the expected and the actual value before the kernel runs. The crates that own the CPU forms of these
//! kernels (atomrl-model, atomrl-logprob, atomrl-sample, atomrl-optim) compare them here in
//! their unit tests.
//!
//! ```
//! use atomrl_cuda_sim::{kernels, Launch};
//!
//! // AtomRL's in-place `a += b` kernel, two blocks of 32 threads striding over 100 elements.
//! let mut a = vec![1.0f32; 100];
//! let b: Vec<f32> = (0..100).map(|i| i as f32).collect();
//! kernels::add_assign_f32(Launch::linear(2, 32), &mut a, &b);
//! assert_eq!(a[99], 100.0);
//! ```

mod ffi;
pub mod kernels;
mod launch;

pub use ffi::{FlashShape, PickState};
pub use launch::Launch;

/// An element type the generic kernels are built for (`_f32`, `_bf16` and `_f16` entry
/// points): `f32`, [`half::bf16`] and [`half::f16`], with the layout of CUDA's `float`,
/// `__nv_bfloat16` and `__half`.
pub trait Elem: Copy + Send + Sync + 'static + sealed::Sealed {
    #[doc(hidden)]
    #[allow(private_interfaces)]
    const KERNELS: ffi::Kernels;
}

impl Elem for f32 {
    #[allow(private_interfaces)]
    const KERNELS: ffi::Kernels = ffi::F32;
}
impl Elem for half::bf16 {
    #[allow(private_interfaces)]
    const KERNELS: ffi::Kernels = ffi::BF16;
}
impl Elem for half::f16 {
    #[allow(private_interfaces)]
    const KERNELS: ffi::Kernels = ffi::F16;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::bf16 {}
    impl Sealed for half::f16 {}
}
