//! [`MpiCollective`]: one rank per process over MPI (rsmpi), launched by `mpirun`.
//!
//! Sums do not use `MPI_Allreduce` (whose summation order is unspecified). They are a
//! deterministic reduce-scatter + all-gather: rank `s` receives slice `s` of every rank's
//! vector (`MPI_Alltoallv`), adds the `W` pieces in rank order in the element type, and the
//! summed slices are all-gathered (`MPI_Allgatherv`). Every element is the rank-ordered sum,
//! bit-identical on every rank and to [`crate::sum_in_rank_order_f32`] (see the
//! [crate docs](crate#deterministic-sums)); each rank sends and receives about
//! `2 (W − 1) / W` of the vector, as in a ring all-reduce.
//!
//! MPI's default error handler (`MPI_ERRORS_ARE_FATAL`) ends the job on a communication
//! error, so the errors returned here are argument checks made before calling MPI.

use mpi::collective::{CommunicatorCollectives, Root};
use mpi::datatype::{Partition, PartitionMut};
use mpi::environment::Universe;
use mpi::topology::{Communicator, SimpleCommunicator};
use mpi::Count;
use mpi::Threading;
use std::marker::PhantomData;

use crate::{local_rank_from_env, Collective, DistError, Result, LOCAL_RANK_VARS};

/// The MPI world communicator as a [`Collective`]: rank and size of `MPI_COMM_WORLD`.
/// Holds the MPI environment: `MPI_Finalize` runs when it is dropped, so create one per
/// process and keep it for the whole run. MPI is initialised at `MPI_THREAD_FUNNELED`: the
/// process may run other threads (the trainer's CPU workers), but collectives are called from
/// the thread that created this value, which is `!Send` and `!Sync` to enforce it.
///
/// ```no_run
/// use atomrl_dist::{Collective, MpiCollective};
/// // Run under `mpirun -np 2 …`.
/// let comm = MpiCollective::init()?;
/// let mut grads = vec![comm.rank() as f32; 4];
/// comm.all_reduce_sum_f32(&mut grads)?; // 0 + 1 on both ranks
/// println!("rank {} of {} (local {}): {grads:?}", comm.rank(), comm.world_size(), comm.local_rank());
/// # Ok::<(), atomrl_dist::DistError>(())
/// ```
pub struct MpiCollective {
    universe: Universe,
    rank: usize,
    world: usize,
    local_rank: usize,
    /// MPI is initialised with `MPI_THREAD_FUNNELED` (other threads may compute, only the
    /// initialising thread calls MPI); the raw-pointer marker keeps the value `!Send + !Sync`,
    /// so it cannot be moved to or shared with another thread.
    _funneled: PhantomData<*const ()>,
    max_message: usize,
}

/// Default of [`MpiCollective::max_message_elems`]: 64 M elements (256 MB of f32).
pub const DEFAULT_MAX_MESSAGE_ELEMS: usize = 1 << 26;

impl std::fmt::Debug for MpiCollective {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MpiCollective")
            .field("rank", &self.rank)
            .field("world", &self.world)
            .field("local_rank", &self.local_rank)
            .finish_non_exhaustive()
    }
}

fn to_index(op: &'static str, what: &str, value: i32) -> Result<usize> {
    usize::try_from(value).map_err(|_| DistError::Setup {
        op,
        rank: 0,
        detail: format!("MPI returned a negative {what}: {value}"),
    })
}

impl MpiCollective {
    /// Initialises MPI (`MPI_Init_thread`, `MPI_THREAD_FUNNELED`) and takes the world
    /// communicator. The node-local rank (for `cuda:local_rank`) comes from the launcher's
    /// environment ([`local_rank_from_env`]), else from the rank within this node's
    /// shared-memory communicator (`MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)`).
    ///
    /// # Errors
    /// [`DistError::Setup`] when MPI was already initialised in this process.
    ///
    /// ```no_run
    /// let comm = atomrl_dist::MpiCollective::init()?;
    /// # Ok::<(), atomrl_dist::DistError>(())
    /// ```
    pub fn init() -> Result<Self> {
        Self::init_with(false)
    }

    /// [`init`](Self::init), with the local rank taken only from the launcher's environment
    /// (`OMPI_COMM_WORLD_LOCAL_RANK`, `MPI_LOCALRANKID`, `SLURM_LOCALID`, `LOCAL_RANK`).
    ///
    /// # Errors
    /// [`DistError::Setup`] when MPI was already initialised or none of those variables is
    /// set to an integer.
    ///
    /// ```no_run
    /// let comm = atomrl_dist::MpiCollective::from_env()?;
    /// let device = format!("cuda:{}", comm.local_rank());
    /// # Ok::<(), atomrl_dist::DistError>(())
    /// ```
    pub fn from_env() -> Result<Self> {
        Self::init_with(true)
    }

    fn init_with(env_only: bool) -> Result<Self> {
        const OP: &str = "MpiCollective::init";
        let (universe, _level) =
            mpi::initialize_with_threading(Threading::Funneled).ok_or(DistError::Setup {
                op: OP,
                rank: 0,
                detail: "MPI is already initialised in this process".into(),
            })?;
        let comm = universe.world();
        let rank = to_index(OP, "rank", comm.rank())?;
        let world = to_index(OP, "size", comm.size())?;
        let local_rank = match local_rank_from_env() {
            Some(l) => l,
            None if env_only => {
                return Err(DistError::Setup {
                    op: "MpiCollective::from_env",
                    rank,
                    detail: format!(
                        "none of {} is set to an integer",
                        LOCAL_RANK_VARS.join(", ")
                    ),
                })
            }
            None => to_index(OP, "local rank", comm.split_shared(comm.rank()).rank())?,
        };
        Ok(Self {
            universe,
            rank,
            world,
            local_rank,
            _funneled: PhantomData,
            max_message: DEFAULT_MAX_MESSAGE_ELEMS,
        })
    }

    /// The rank within this node (`0..ranks on this node`), for mapping ranks to GPUs.
    ///
    /// ```no_run
    /// let comm = atomrl_dist::MpiCollective::init()?;
    /// assert!(comm.local_rank() <= atomrl_dist::Collective::rank(&comm));
    /// # Ok::<(), atomrl_dist::DistError>(())
    /// ```
    pub fn local_rank(&self) -> usize {
        self.local_rank
    }

    /// The longest message, in elements, of the sums and broadcasts: longer buffers go in
    /// pieces of this many elements. This bounds the scratch memory of a sum (about one piece)
    /// and keeps MPI's `int` counts in range, so buffers of any length work.
    ///
    /// ```no_run
    /// let comm = atomrl_dist::MpiCollective::init()?;
    /// assert_eq!(comm.max_message_elems(), atomrl_dist::DEFAULT_MAX_MESSAGE_ELEMS);
    /// # Ok::<(), atomrl_dist::DistError>(())
    /// ```
    pub fn max_message_elems(&self) -> usize {
        self.max_message
    }

    /// Sets [`max_message_elems`](Self::max_message_elems), clamped to `1..=i32::MAX`. Every
    /// rank must use the same value. Results do not depend on it (each element is still the
    /// rank-ordered sum).
    ///
    /// ```no_run
    /// let mut comm = atomrl_dist::MpiCollective::init()?;
    /// comm.set_max_message_elems(16 << 20); // 64 MB pieces of f32
    /// # Ok::<(), atomrl_dist::DistError>(())
    /// ```
    pub fn set_max_message_elems(&mut self, elems: usize) {
        self.max_message = elems.clamp(1, Count::MAX as usize);
    }

    /// Makes a panic on any thread of this process end the whole job: after the usual panic
    /// message, `MPI_Abort(MPI_COMM_WORLD, code)`, so the other ranks do not wait forever in
    /// their next collective. (Unwinding out of `main` alone would leave them blocked: MPI
    /// cannot wake a peer blocked on a rank that silently disappeared before finalising.)
    ///
    /// ```no_run
    /// let comm = atomrl_dist::MpiCollective::init()?;
    /// comm.abort_on_panic(101);
    /// # Ok::<(), atomrl_dist::DistError>(())
    /// ```
    pub fn abort_on_panic(&self, code: i32) {
        let rank = self.rank;
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            previous(info);
            eprintln!("rank {rank}: panic: aborting the MPI job");
            #[allow(unsafe_code)]
            // SAFETY: MPI is initialised (this hook is installed by a live MpiCollective) and
            // MPI_Abort on the world communicator may be called from any thread to end the job:
            // it does not return and touches no Rust state.
            unsafe {
                mpi::ffi::MPI_Abort(mpi::ffi::RSMPI_COMM_WORLD, code);
            }
        }));
    }

    fn comm(&self) -> SimpleCommunicator {
        self.universe.world()
    }

    fn count(&self, op: &'static str, len: usize) -> Result<Count> {
        Count::try_from(len).map_err(|_| DistError::Invalid {
            op,
            rank: self.rank,
            detail: format!("{len} elements exceed MPI's count limit ({})", Count::MAX),
        })
    }

    fn root(&self, op: &'static str, root: usize) -> Result<i32> {
        if root < self.world {
            self.count(op, root)
        } else {
            Err(DistError::Invalid {
                op,
                rank: self.rank,
                detail: format!("root {root} outside the world of {} ranks", self.world),
            })
        }
    }

    /// Checks the arguments of a broadcast of `len` elements from `root`: `root < W` and every
    /// rank's length equal to the root's. Every rank learns every length, so a mismatch is an
    /// error on every rank (not a hang of the ranks that passed the check). Returns the root
    /// as MPI's rank type.
    pub(crate) fn check_broadcast(&self, op: &'static str, len: usize, root: usize) -> Result<i32> {
        let root = self.root(op, root)?;
        let lens = self.gather_lens(len);
        let root_len = lens[root as usize];
        match lens.iter().enumerate().find(|(_, &l)| l != root_len) {
            None => Ok(root),
            Some((r, l)) => Err(DistError::Invalid {
                op,
                rank: self.rank,
                detail: format!(
                    "buffer lengths differ: root {root} has {root_len}, rank {r} has {l}"
                ),
            }),
        }
    }

    /// Checks that every rank passed `len` elements (the lengths are all-gathered first, so
    /// a mismatch is an error on every rank rather than a truncated message).
    pub(crate) fn same_len(&self, op: &'static str, len: usize) -> Result<()> {
        let lens = self.gather_lens(len);
        match lens.iter().enumerate().find(|(_, &l)| l != lens[0]) {
            None => Ok(()),
            Some((r, l)) => Err(DistError::Invalid {
                op,
                rank: self.rank,
                detail: format!(
                    "buffer lengths differ: rank 0 has {}, rank {r} has {l}",
                    lens[0]
                ),
            }),
        }
    }

    fn gather_lens(&self, len: usize) -> Vec<u64> {
        let mut lens = vec![0u64; self.world];
        self.comm().all_gather_into(&(len as u64), &mut lens[..]);
        lens
    }

    /// The rank-ordered sum as a deterministic reduce-scatter + all-gather: the vector is cut
    /// into `W` contiguous slices (lengths differing by at most one); rank `s` receives slice
    /// `s` of every rank (`MPI_Alltoallv`), sums the `W` pieces in rank order, and every rank
    /// then collects all the summed slices (`MPI_Allgatherv`). Each element is still
    /// `((x₀ + x₁) + x₂) + …`, so the bits equal [`crate::sum_in_rank_order_f32`]'s, while the traffic
    /// and the additions are spread over the ranks as in a ring all-reduce.
    fn sum_rank_order<T>(&self, op: &'static str, buf: &mut [T], zero: T) -> Result<()>
    where
        T: mpi::datatype::Equivalence + Copy + std::ops::AddAssign,
    {
        self.same_len(op, buf.len())?;
        if self.world == 1 {
            return Ok(());
        }
        for piece in buf.chunks_mut(self.max_message) {
            self.sum_piece(op, piece, zero)?;
        }
        Ok(())
    }

    /// [`sum_rank_order`](Self::sum_rank_order) of one piece of at most
    /// [`max_message_elems`](Self::max_message_elems) elements.
    fn sum_piece<T>(&self, op: &'static str, buf: &mut [T], zero: T) -> Result<()>
    where
        T: mpi::datatype::Equivalence + Copy + std::ops::AddAssign,
    {
        let (n, w) = (buf.len(), self.world);
        // Slice s = starts[s]..starts[s] + lens[s]; counts fit in `Count` as n does.
        let (base, extra) = (n / w, n % w);
        let lens: Vec<usize> = (0..w).map(|s| base + usize::from(s < extra)).collect();
        let starts: Vec<usize> = lens
            .iter()
            .scan(0, |acc, &l| {
                let start = *acc;
                *acc += l;
                Some(start)
            })
            .collect();
        let counts =
            |v: &[usize]| -> Result<Vec<Count>> { v.iter().map(|&x| self.count(op, x)).collect() };
        let mine = lens[self.rank];
        let comm = self.comm();

        // Reduce-scatter: piece r of `scratch` is rank r's copy of my slice.
        let mut scratch = vec![zero; mine * w];
        {
            let send = Partition::new(&buf[..], counts(&lens)?, counts(&starts)?);
            let recv_displs: Vec<usize> = (0..w).map(|r| r * mine).collect();
            let mut recv = PartitionMut::new(
                &mut scratch[..],
                counts(&vec![mine; w])?,
                counts(&recv_displs)?,
            );
            comm.all_to_all_varcount_into(&send, &mut recv);
        }
        let mut pieces = scratch.chunks_exact(mine.max(1));
        let mut sum: Vec<T> = pieces.next().map(<[T]>::to_vec).unwrap_or_default();
        for piece in pieces {
            for (a, x) in sum.iter_mut().zip(piece) {
                *a += *x;
            }
        }
        sum.truncate(mine);

        // All-gather the summed slices back into `buf`.
        let mut recv = PartitionMut::new(buf, counts(&lens)?, counts(&starts)?);
        comm.all_gather_varcount_into(&sum[..], &mut recv);
        Ok(())
    }
}

impl Collective for MpiCollective {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world
    }

    fn all_reduce_sum_f32(&self, buf: &mut [f32]) -> Result<()> {
        self.sum_rank_order("all_reduce_sum_f32", buf, 0.0)
    }

    fn all_reduce_sum_f64(&self, buf: &mut [f64]) -> Result<()> {
        self.sum_rank_order("all_reduce_sum_f64", buf, 0.0)
    }

    fn broadcast_f32(&self, buf: &mut [f32], root: usize) -> Result<()> {
        let root = self.check_broadcast("broadcast_f32", buf.len(), root)?;
        let comm = self.comm();
        for piece in buf.chunks_mut(self.max_message) {
            comm.process_at_rank(root).broadcast_into(piece);
        }
        Ok(())
    }

    fn broadcast_bytes(&self, buf: &mut Vec<u8>, root: usize) -> Result<()> {
        const OP: &str = "broadcast_bytes";
        let root = self.root(OP, root)?;
        let comm = self.comm();
        let mut len = buf.len() as u64;
        comm.process_at_rank(root).broadcast_into(&mut len);
        let len = usize::try_from(len).map_err(|_| DistError::Invalid {
            op: OP,
            rank: self.rank,
            detail: format!("root {root} sends {len} bytes, more than this platform addresses"),
        })?;
        buf.resize(len, 0);
        for piece in buf.chunks_mut(self.max_message) {
            comm.process_at_rank(root).broadcast_into(piece);
        }
        Ok(())
    }

    fn all_gather_f64(&self, local: &[f64]) -> Result<Vec<Vec<f64>>> {
        const OP: &str = "all_gather_f64";
        let lens = self.gather_lens(local.len());
        let lens: Vec<usize> = lens
            .iter()
            .map(|&l| usize::try_from(l).unwrap_or(usize::MAX))
            .collect();
        let total = lens.iter().fold(0usize, |a, &l| a.saturating_add(l));
        self.count(OP, total)?;
        let counts = lens
            .iter()
            .map(|&l| self.count(OP, l))
            .collect::<Result<Vec<Count>>>()?;
        let displs: Vec<Count> = counts
            .iter()
            .scan(0, |acc: &mut Count, &c| {
                let d = *acc;
                *acc += c;
                Some(d)
            })
            .collect();
        let mut all = vec![0.0f64; total];
        {
            let mut partition = PartitionMut::new(&mut all[..], counts, &displs[..]);
            self.comm().all_gather_varcount_into(local, &mut partition);
        }
        let mut out = Vec::with_capacity(self.world);
        let mut rest = &all[..];
        for &l in &lens {
            let (head, tail) = rest.split_at(l);
            out.push(head.to_vec());
            rest = tail;
        }
        Ok(out)
    }

    fn barrier(&self) -> Result<()> {
        self.comm().barrier();
        Ok(())
    }

    fn abort(&self, code: i32) -> ! {
        self.comm().abort(code)
    }
}
