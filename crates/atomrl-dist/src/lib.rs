//! Collectives for data-parallel training: in-process threads, MPI and NCCL.
//!
//! Data-parallel training runs `W` replicas ("ranks" `0..W`), each on its own share of a
//! batch, and combines their gradients, loss normalisers and metrics with a few collective
//! operations. [`Collective`] is that small set of operations, with four implementations:
//!
//! | implementation | ranks | use |
//! |---|---|---|
//! | [`SingleProcess`] | rank 0 of 1; every operation is the identity | `W = 1`, the default |
//! | [`ThreadGroup`] / [`ThreadMember`] | `W` threads of one process sharing memory | tests and CI: the same code paths as `W` processes, no MPI needed |
//! | `MpiCollective` (feature `mpi`) | one process per rank, launched by `mpirun` | data parallelism across processes and nodes |
//! | `NcclCollective` (feature `nccl`) | one process and one CUDA GPU per rank, launched by `mpirun` | f32 sums and broadcasts through NCCL (set up over MPI), the rest through MPI |
//!
//! # Deterministic sums
//!
//! Every sum ([`Collective::all_reduce_sum_f32`], [`Collective::all_reduce_sum_f64`]) is taken
//! in rank order, element by element: `out[i] = ((x₀[i] + x₁[i]) + x₂[i]) + … + x_{W−1}[i]`,
//! in the element type (f32 stays f32). The result is therefore bit-identical on every rank,
//! from run to run, between [`ThreadGroup`] and MPI, and to [`sum_in_rank_order_f32`] over the
//! `W` shards in one process. The MPI implementation does *not* use `MPI_Allreduce`, whose
//! order of summation is unspecified (it depends on the algorithm the library picks for the
//! message size and the topology): it runs a deterministic reduce-scatter (rank `s` receives
//! slice `s` of every rank's vector and adds the `W` pieces in rank order) followed by an
//! all-gather of the summed slices. The NCCL implementation does not use `ncclAllReduce`
//! either: it all-gathers every rank's vector with NCCL and adds the rows in rank order.
//!
//! ```
//! use atomrl_dist::{sum_in_rank_order_f32, Collective, ThreadGroup};
//!
//! let shards: Vec<Vec<f32>> = (0..3).map(|r| vec![0.1 * r as f32, 1e8, -1e8 + r as f32]).collect();
//! let expected = sum_in_rank_order_f32(&shards);
//! let results = std::thread::scope(|scope| {
//!     let handles: Vec<_> = ThreadGroup::new(3)?
//!         .into_iter()
//!         .map(|member| {
//!             let mut buf = shards[member.rank()].clone();
//!             scope.spawn(move || member.all_reduce_sum_f32(&mut buf).map(|()| buf))
//!         })
//!         .collect();
//!     handles
//!         .into_iter()
//!         .map(|h| h.join().expect("member thread"))
//!         .collect::<Result<Vec<_>, _>>()
//! })?;
//! for r in &results {
//!     assert_eq!(r.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
//!                expected.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
//! }
//! # Ok::<(), atomrl_dist::DistError>(())
//! ```
//!
//! # Failures
//!
//! A collective either completes on every rank or returns an error on every rank that is
//! still waiting; it never hangs because a peer failed. In a [`ThreadGroup`] a member that
//! is dropped (its thread returned early, with `?`, or panicked) or that calls
//! [`ThreadMember::fail`] breaks the group: the other members' current and later operations
//! return [`DistError::Broken`]. Across processes a rank cannot wake peers blocked inside MPI,
//! so a rank that fails calls [`Collective::abort`] (`MPI_Abort`), which ends every rank of
//! the job with a non-zero exit status.
#![deny(missing_docs)]

mod thread;

#[cfg(feature = "mpi")]
mod mpi_impl;

#[cfg(feature = "nccl")]
mod nccl_impl;

#[cfg(feature = "mpi")]
pub use mpi_impl::{MpiCollective, DEFAULT_MAX_MESSAGE_ELEMS};
#[cfg(feature = "nccl")]
pub use nccl_impl::NcclCollective;
pub use thread::{ThreadGroup, ThreadMember};

/// Errors of a collective operation: each names the operation, the rank that saw it and what
/// went wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DistError {
    /// The arguments of the operation are invalid on this rank (a root outside `0..W`, buffers
    /// whose lengths differ between ranks, a buffer too long for MPI's counts).
    #[error("{op} on rank {rank}: invalid argument: {detail}")]
    Invalid {
        /// The operation (`all_reduce_sum_f32`, `broadcast_bytes`, …).
        op: &'static str,
        /// The rank that reported the error.
        rank: usize,
        /// What was wrong.
        detail: String,
    },
    /// The group can no longer run collectives: a member failed, was dropped or the members
    /// called different operations.
    #[error("{op} on rank {rank}: the group is broken: {reason}")]
    Broken {
        /// The operation that could not complete.
        op: &'static str,
        /// The rank that reported the error.
        rank: usize,
        /// Why the group broke (which member, what it reported).
        reason: String,
    },
    /// Setting up the communicator failed (MPI already initialised, a missing environment
    /// variable, a CUDA device that cannot be opened).
    #[error("{op} on rank {rank}: {detail}")]
    Setup {
        /// The operation (`MpiCollective::init`, `NcclCollective::new`, …).
        op: &'static str,
        /// The rank, when known (0 before MPI is initialised).
        rank: usize,
        /// What went wrong.
        detail: String,
    },
}

/// Result of a collective operation.
pub type Result<T> = std::result::Result<T, DistError>;

/// The collective operations data-parallel training needs, over `W` = [`world_size`] ranks.
///
/// Every rank must call the same operations in the same order with compatible arguments
/// (same lengths for sums and `broadcast_f32`, same root); an operation returns when every rank
/// has called it. Object-safe: the trainer can hold a `Box<dyn Collective>`.
///
/// ```
/// use atomrl_dist::{Collective, SingleProcess};
///
/// let comm: Box<dyn Collective> = Box::new(SingleProcess);
/// let mut grads = vec![1.0f32, 2.0];
/// comm.all_reduce_sum_f32(&mut grads)?; // W = 1: unchanged
/// assert_eq!((comm.rank(), comm.world_size(), grads), (0, 1, vec![1.0, 2.0]));
/// # Ok::<(), atomrl_dist::DistError>(())
/// ```
///
/// [`world_size`]: Collective::world_size
pub trait Collective {
    /// This process's (or thread's) rank, `0..world_size()`.
    ///
    /// ```
    /// use atomrl_dist::{Collective, SingleProcess};
    /// assert_eq!(SingleProcess.rank(), 0);
    /// ```
    fn rank(&self) -> usize;

    /// The number of ranks `W`.
    ///
    /// ```
    /// use atomrl_dist::{Collective, SingleProcess};
    /// assert_eq!(SingleProcess.world_size(), 1);
    /// ```
    fn world_size(&self) -> usize;

    /// Replaces `buf` on every rank by the element-wise sum over ranks, taken in rank order
    /// `0..W` in f32 (see the [crate docs](crate#deterministic-sums)): bit-identical on every
    /// rank and to [`sum_in_rank_order_f32`].
    ///
    /// # Errors
    /// [`DistError::Invalid`] when the lengths differ between ranks; [`DistError::Broken`]
    /// when a peer failed.
    ///
    /// ```
    /// use atomrl_dist::{Collective, SingleProcess};
    /// let mut g = vec![0.5f32; 4];
    /// SingleProcess.all_reduce_sum_f32(&mut g)?;
    /// assert_eq!(g, vec![0.5; 4]);
    /// # Ok::<(), atomrl_dist::DistError>(())
    /// ```
    fn all_reduce_sum_f32(&self, buf: &mut [f32]) -> Result<()>;

    /// [`all_reduce_sum_f32`](Collective::all_reduce_sum_f32) in f64 (counts, normalisers,
    /// metric sums), with the same rank-order guarantee.
    ///
    /// # Errors
    /// As [`all_reduce_sum_f32`](Collective::all_reduce_sum_f32).
    ///
    /// ```
    /// use atomrl_dist::{Collective, SingleProcess};
    /// let mut counts = vec![128.0f64, 8.0];
    /// SingleProcess.all_reduce_sum_f64(&mut counts)?;
    /// assert_eq!(counts, vec![128.0, 8.0]);
    /// # Ok::<(), atomrl_dist::DistError>(())
    /// ```
    fn all_reduce_sum_f64(&self, buf: &mut [f64]) -> Result<()>;

    /// Copies `buf` of rank `root` into `buf` of every other rank (same length on every rank).
    ///
    /// # Errors
    /// [`DistError::Invalid`] when `root >= W` or the lengths differ from the root's;
    /// [`DistError::Broken`] when a peer failed.
    ///
    /// ```
    /// use atomrl_dist::{Collective, SingleProcess};
    /// let mut w = vec![1.0f32, -1.0];
    /// SingleProcess.broadcast_f32(&mut w, 0)?;
    /// assert_eq!(w, vec![1.0, -1.0]);
    /// assert!(SingleProcess.broadcast_f32(&mut w, 1).is_err());
    /// # Ok::<(), atomrl_dist::DistError>(())
    /// ```
    fn broadcast_f32(&self, buf: &mut [f32], root: usize) -> Result<()>;

    /// Replaces `buf` on every rank by rank `root`'s bytes; the length may differ between
    /// ranks (the root's length is sent first), so other ranks may pass an empty vector.
    ///
    /// # Errors
    /// [`DistError::Invalid`] when `root >= W`; [`DistError::Broken`] when a peer failed.
    ///
    /// ```
    /// use atomrl_dist::{Collective, SingleProcess};
    /// let mut state = b"step=12".to_vec();
    /// SingleProcess.broadcast_bytes(&mut state, 0)?;
    /// assert_eq!(state, b"step=12");
    /// # Ok::<(), atomrl_dist::DistError>(())
    /// ```
    fn broadcast_bytes(&self, buf: &mut Vec<u8>, root: usize) -> Result<()>;

    /// Every rank's `local` slice, indexed by rank, on every rank (lengths may differ between
    /// ranks). For per-rank metrics.
    ///
    /// # Errors
    /// [`DistError::Broken`] when a peer failed.
    ///
    /// ```
    /// use atomrl_dist::{Collective, SingleProcess};
    /// assert_eq!(SingleProcess.all_gather_f64(&[0.25, 3.0])?, vec![vec![0.25, 3.0]]);
    /// # Ok::<(), atomrl_dist::DistError>(())
    /// ```
    fn all_gather_f64(&self, local: &[f64]) -> Result<Vec<Vec<f64>>>;

    /// Every rank's `local` bytes, indexed by rank, on every rank (lengths may differ): for
    /// serialised records such as one step's rollouts. One
    /// [`broadcast_bytes`](Collective::broadcast_bytes) from each rank in turn: `W` messages
    /// of the sizes given, small next to a step's gradient all-reduce.
    ///
    /// # Errors
    /// [`DistError::Broken`] when a peer failed.
    ///
    /// ```
    /// use atomrl_dist::{Collective, SingleProcess};
    /// assert_eq!(SingleProcess.all_gather_bytes(b"rows")?, vec![b"rows".to_vec()]);
    /// # Ok::<(), atomrl_dist::DistError>(())
    /// ```
    fn all_gather_bytes(&self, local: &[u8]) -> Result<Vec<Vec<u8>>> {
        (0..self.world_size())
            .map(|root| {
                let mut buf = if root == self.rank() {
                    local.to_vec()
                } else {
                    Vec::new()
                };
                self.broadcast_bytes(&mut buf, root)?;
                Ok(buf)
            })
            .collect()
    }

    /// Returns when every rank has called it.
    ///
    /// # Errors
    /// [`DistError::Broken`] when a peer failed.
    ///
    /// ```
    /// use atomrl_dist::{Collective, SingleProcess};
    /// SingleProcess.barrier()?;
    /// # Ok::<(), atomrl_dist::DistError>(())
    /// ```
    fn barrier(&self) -> Result<()>;

    /// Ends the whole job with exit status `code`: every rank, not only this one. MPI calls
    /// `MPI_Abort` on the world communicator (`mpirun` then kills the other ranks and exits
    /// non-zero); [`SingleProcess`] and [`ThreadGroup`] (whose ranks all live in this process)
    /// exit the process, a [`ThreadMember`] first marking its group broken. For a failure that
    /// should come back as an error instead, drop the [`ThreadMember`] or call
    /// [`ThreadMember::fail`].
    ///
    /// ```no_run
    /// use atomrl_dist::{Collective, SingleProcess};
    /// SingleProcess.abort(3);
    /// ```
    fn abort(&self, code: i32) -> !;
}

/// Rank 0 of a world of 1: every collective is the identity (`W = 1`, CPU runs, CI).
///
/// ```
/// use atomrl_dist::{Collective, SingleProcess};
/// let gathered = SingleProcess.all_gather_f64(&[1.0])?;
/// assert_eq!(gathered, vec![vec![1.0]]);
/// # Ok::<(), atomrl_dist::DistError>(())
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SingleProcess;

impl SingleProcess {
    fn check_root(op: &'static str, root: usize) -> Result<()> {
        if root == 0 {
            Ok(())
        } else {
            Err(DistError::Invalid {
                op,
                rank: 0,
                detail: format!("root {root} outside the world of 1 rank"),
            })
        }
    }
}

impl Collective for SingleProcess {
    fn rank(&self) -> usize {
        0
    }
    fn world_size(&self) -> usize {
        1
    }
    fn all_reduce_sum_f32(&self, _buf: &mut [f32]) -> Result<()> {
        Ok(())
    }
    fn all_reduce_sum_f64(&self, _buf: &mut [f64]) -> Result<()> {
        Ok(())
    }
    fn broadcast_f32(&self, _buf: &mut [f32], root: usize) -> Result<()> {
        Self::check_root("broadcast_f32", root)
    }
    fn broadcast_bytes(&self, _buf: &mut Vec<u8>, root: usize) -> Result<()> {
        Self::check_root("broadcast_bytes", root)
    }
    fn all_gather_f64(&self, local: &[f64]) -> Result<Vec<Vec<f64>>> {
        Ok(vec![local.to_vec()])
    }
    fn barrier(&self) -> Result<()> {
        Ok(())
    }
    fn abort(&self, code: i32) -> ! {
        std::process::exit(code)
    }
}

/// The reference sum of equal-length shards in rank order, in f32:
/// `out[i] = ((shards[0][i] + shards[1][i]) + shards[2][i]) + …`. Every
/// [`Collective::all_reduce_sum_f32`] returns exactly this (bit for bit); empty when there
/// are no shards.
///
/// # Panics
/// When the shards' lengths differ.
///
/// ```
/// use atomrl_dist::sum_in_rank_order_f32;
/// // f32 addition is not associative: the order is part of the result.
/// let shards = [vec![1e8f32], vec![1.0], vec![-1e8]];
/// assert_eq!(sum_in_rank_order_f32(&shards), vec![0.0]); // (1e8 + 1) rounds to 1e8
/// ```
pub fn sum_in_rank_order_f32<S: AsRef<[f32]>>(shards: &[S]) -> Vec<f32> {
    sum_in_rank_order(shards)
}

/// [`sum_in_rank_order_f32`] in f64.
///
/// # Panics
/// When the shards' lengths differ.
///
/// ```
/// use atomrl_dist::sum_in_rank_order_f64;
/// assert_eq!(sum_in_rank_order_f64(&[vec![1.0, 2.0], vec![0.5, 0.5]]), vec![1.5, 2.5]);
/// ```
pub fn sum_in_rank_order_f64<S: AsRef<[f64]>>(shards: &[S]) -> Vec<f64> {
    sum_in_rank_order(shards)
}

fn sum_in_rank_order<T, S>(shards: &[S]) -> Vec<T>
where
    T: Copy + std::ops::AddAssign,
    S: AsRef<[T]>,
{
    let Some((first, rest)) = shards.split_first() else {
        return Vec::new();
    };
    let mut acc = first.as_ref().to_vec();
    for shard in rest {
        let shard = shard.as_ref();
        assert_eq!(shard.len(), acc.len(), "shards of different lengths");
        for (a, x) in acc.iter_mut().zip(shard) {
            *a += *x;
        }
    }
    acc
}

/// The node-local rank the launcher set in the environment, for mapping ranks to GPUs
/// (`cuda:local_rank`): the first of `OMPI_COMM_WORLD_LOCAL_RANK` (Open MPI's `mpirun`),
/// `MPI_LOCALRANKID` (MPICH's Hydra), `SLURM_LOCALID` (`srun`) and `LOCAL_RANK` (`torchrun`)
/// that is set to an integer.
///
/// ```
/// // Outside a launcher none is set.
/// if std::env::var_os("OMPI_COMM_WORLD_LOCAL_RANK").is_none()
///     && std::env::var_os("MPI_LOCALRANKID").is_none()
///     && std::env::var_os("SLURM_LOCALID").is_none()
///     && std::env::var_os("LOCAL_RANK").is_none()
/// {
///     assert_eq!(atomrl_dist::local_rank_from_env(), None);
/// }
/// ```
pub fn local_rank_from_env() -> Option<usize> {
    LOCAL_RANK_VARS
        .iter()
        .find_map(|v| std::env::var(v).ok()?.trim().parse().ok())
}

/// The number of ranks on this node that the launcher set in the environment (to share the
/// node's cores or GPUs between them): the first of `OMPI_COMM_WORLD_LOCAL_SIZE` (Open MPI),
/// `MPI_LOCALNRANKS` (MPICH's Hydra) and `LOCAL_WORLD_SIZE` (`torchrun`) that is set to an
/// integer.
///
/// ```
/// if std::env::var_os("OMPI_COMM_WORLD_LOCAL_SIZE").is_none()
///     && std::env::var_os("MPI_LOCALNRANKS").is_none()
///     && std::env::var_os("LOCAL_WORLD_SIZE").is_none()
/// {
///     assert_eq!(atomrl_dist::local_size_from_env(), None);
/// }
/// ```
pub fn local_size_from_env() -> Option<usize> {
    [
        "OMPI_COMM_WORLD_LOCAL_SIZE",
        "MPI_LOCALNRANKS",
        "LOCAL_WORLD_SIZE",
    ]
    .iter()
    .find_map(|v| std::env::var(v).ok()?.trim().parse().ok())
}

/// Whether this process was started by an MPI launcher (`mpirun`/`mpiexec` of Open MPI or
/// MPICH, or Slurm's `srun` with PMI): one of `OMPI_COMM_WORLD_SIZE`, `PMI_SIZE`,
/// `PMIX_RANK` is set. `atomrl-train` then trains with one rank per process.
///
/// ```
/// if std::env::var_os("OMPI_COMM_WORLD_SIZE").is_none()
///     && std::env::var_os("PMI_SIZE").is_none()
///     && std::env::var_os("PMIX_RANK").is_none()
/// {
///     assert!(!atomrl_dist::launched_by_mpi());
/// }
/// ```
pub fn launched_by_mpi() -> bool {
    ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"]
        .iter()
        .any(|v| std::env::var_os(v).is_some())
}

/// The environment variables [`local_rank_from_env`] reads, in order.
pub const LOCAL_RANK_VARS: [&str; 4] = [
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "MPI_LOCALRANKID",
    "SLURM_LOCALID",
    "LOCAL_RANK",
];
