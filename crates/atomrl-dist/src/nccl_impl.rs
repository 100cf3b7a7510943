//! [`NcclCollective`]: one rank per process and one GPU per rank, data moved by NCCL
//! (cudarc's safe bindings), bootstrapped and completed by an [`MpiCollective`].
//!
//! Set-up follows nccl-tests and Horovod: rank 0 creates NCCL's unique id
//! (`ncclGetUniqueId`), its 128 bytes are broadcast over MPI, and every rank joins the
//! communicator with `ncclCommInitRank` on its own device and stream.
//!
//! Sums keep the [rank-order contract](crate#deterministic-sums): NCCL's `ncclAllReduce`
//! (whose summation order depends on the algorithm, ring or tree, and the topology) is not used.
//! [`all_reduce_sum_f32`](Collective::all_reduce_sum_f32) copies the host buffer to the GPU,
//! all-gathers every rank's copy with `ncclAllGather` into a `W × n` device buffer, copies that
//! back and adds the `W` rows in rank order on the host: the bits of
//! [`crate::sum_in_rank_order_f32`] on every rank. Each rank receives `W − 1` times the vector
//! (a ring all-reduce receives about twice the vector); NCCL's bandwidth (NVLink, InfiniBand)
//! is what this buys over MPI's host path. `broadcast_f32` is `ncclBroadcast`; the small and
//! host-side operations (f64 sums, byte broadcasts, gathers of metrics, barrier, abort) go
//! through MPI.
//!
//! A failed CUDA or NCCL call is [`DistError::Broken`]: the other ranks may be blocked inside
//! NCCL, so, as with MPI, the rank that sees the error should [`abort`](Collective::abort).

use std::ffi::c_char;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream, DriverError};
use cudarc::nccl::result::NcclError;
use cudarc::nccl::{Comm, Id};

use crate::{Collective, DistError, MpiCollective, Result};

/// The size of NCCL's unique id (`ncclUniqueId`, `NCCL_UNIQUE_ID_BYTES`), in bytes.
const ID_BYTES: usize = 128;

/// The world of an [`MpiCollective`] with an NCCL communicator on one CUDA device per rank, as
/// a [`Collective`]: f32 sums and broadcasts move through NCCL (sums still in rank order,
/// bit-identical to [`crate::sum_in_rank_order_f32`]), everything else through MPI. Like the
/// [`MpiCollective`] it holds, it is `!Send + !Sync`: collectives are called from the thread
/// that created it.
///
/// ```no_run
/// use atomrl_dist::{Collective, MpiCollective, NcclCollective};
/// // Run under `mpirun -np 2 …` on a node with two GPUs: rank r uses cuda:r.
/// let mpi = MpiCollective::init()?;
/// let gpu = mpi.local_rank();
/// let comm = NcclCollective::new(mpi, gpu)?;
/// let mut grads = vec![comm.rank() as f32; 4];
/// comm.all_reduce_sum_f32(&mut grads)?; // 0 + 1 on both ranks, through NCCL
/// # Ok::<(), atomrl_dist::DistError>(())
/// ```
pub struct NcclCollective {
    // Fields drop in order: the NCCL communicator (`ncclCommAbort`) before its stream and
    // before MPI is finalised.
    comm: Comm,
    stream: Arc<CudaStream>,
    ordinal: usize,
    mpi: MpiCollective,
}

impl std::fmt::Debug for NcclCollective {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NcclCollective")
            .field("mpi", &self.mpi)
            .field("device_ordinal", &self.ordinal)
            .finish_non_exhaustive()
    }
}

fn cuda_error(op: &'static str, rank: usize, e: &DriverError) -> DistError {
    DistError::Broken {
        op,
        rank,
        reason: format!("CUDA: {e}"),
    }
}

fn nccl_error(op: &'static str, rank: usize, e: &NcclError) -> DistError {
    DistError::Broken {
        op,
        rank,
        reason: format!("NCCL: {:?}", e.0),
    }
}

impl NcclCollective {
    /// Joins every rank of `mpi`'s world in an NCCL communicator on CUDA device
    /// `device_ordinal` of this node (usually [`MpiCollective::local_rank`]). A collective
    /// operation: every rank calls it. Each rank opens its device and a stream; rank 0 creates
    /// NCCL's unique id and broadcasts its bytes over MPI; every rank then calls
    /// `ncclCommInitRank`.
    ///
    /// # Errors
    /// [`DistError::Setup`], the same on every rank, when a rank cannot open its device or
    /// rank 0 cannot create the id (the ranks agree over MPI first, so none is left waiting).
    /// `ncclCommInitRank` itself cannot be agreed on (the other ranks are blocked inside it):
    /// when it fails in a world of more than one rank, this rank prints the error and ends the
    /// job ([`Collective::abort`] with status 2); in a world of one it is an error.
    ///
    /// ```no_run
    /// let mpi = atomrl_dist::MpiCollective::init()?;
    /// let gpu = mpi.local_rank();
    /// let comm = atomrl_dist::NcclCollective::new(mpi, gpu)?;
    /// assert_eq!(comm.device_ordinal(), gpu);
    /// # Ok::<(), atomrl_dist::DistError>(())
    /// ```
    pub fn new(mpi: MpiCollective, device_ordinal: usize) -> Result<Self> {
        const OP: &str = "NcclCollective::new";
        let (rank, world) = (mpi.rank(), mpi.world_size());
        let setup = |detail: String| DistError::Setup {
            op: OP,
            rank,
            detail,
        };

        // This rank's device and stream; every rank learns which ranks failed.
        let stream = CudaContext::new(device_ordinal).and_then(|ctx| ctx.new_stream());
        let failed: Vec<usize> = mpi
            .all_gather_f64(&[if stream.is_err() { 1.0 } else { 0.0 }])?
            .iter()
            .enumerate()
            .filter(|(_, flag)| flag.first() != Some(&0.0))
            .map(|(r, _)| r)
            .collect();
        let stream = match stream {
            Err(e) => {
                return Err(setup(format!(
                    "cannot open CUDA device {device_ordinal}: {e}"
                )))
            }
            Ok(_) if !failed.is_empty() => {
                return Err(setup(format!(
                    "rank(s) {failed:?} could not open their CUDA device"
                )))
            }
            Ok(stream) => stream,
        };

        // NCCL's unique id from rank 0; an empty message means rank 0 could not make one.
        let mut id_bytes = Vec::new();
        let mut id_error = None;
        if rank == 0 {
            match Id::new() {
                Ok(id) => id_bytes = id.internal().iter().map(|c| c.to_ne_bytes()[0]).collect(),
                Err(e) => id_error = Some(format!("ncclGetUniqueId failed: {:?}", e.0)),
            }
        }
        mpi.broadcast_bytes(&mut id_bytes, 0)?;
        let internal: [u8; ID_BYTES] = id_bytes.as_slice().try_into().map_err(|_| {
            setup(id_error.unwrap_or_else(|| {
                format!(
                    "rank 0 sent a {}-byte NCCL id, not {ID_BYTES} bytes (no id: rank 0 could not create one)",
                    id_bytes.len()
                )
            }))
        })?;
        let id = Id::uninit(internal.map(|b| c_char::from_ne_bytes([b])));

        let comm = match Comm::from_rank(Arc::clone(&stream), rank, world, id) {
            Ok(comm) => comm,
            Err(e) if world > 1 => {
                eprintln!(
                    "rank {rank}: {OP}: ncclCommInitRank on CUDA device {device_ordinal} failed ({:?}): aborting the MPI job",
                    e.0
                );
                mpi.abort(2)
            }
            Err(e) => return Err(setup(format!("ncclCommInitRank failed: {:?}", e.0))),
        };
        Ok(Self {
            comm,
            stream,
            ordinal: device_ordinal,
            mpi,
        })
    }

    /// The CUDA device (ordinal on this node) this rank's NCCL communicator runs on.
    ///
    /// ```no_run
    /// let mpi = atomrl_dist::MpiCollective::init()?;
    /// let comm = atomrl_dist::NcclCollective::new(mpi, 0)?;
    /// assert_eq!(comm.device_ordinal(), 0);
    /// # Ok::<(), atomrl_dist::DistError>(())
    /// ```
    pub fn device_ordinal(&self) -> usize {
        self.ordinal
    }

    /// The rank within this node ([`MpiCollective::local_rank`]).
    ///
    /// ```no_run
    /// let mpi = atomrl_dist::MpiCollective::init()?;
    /// let local = mpi.local_rank();
    /// let comm = atomrl_dist::NcclCollective::new(mpi, local)?;
    /// assert_eq!(comm.local_rank(), local);
    /// # Ok::<(), atomrl_dist::DistError>(())
    /// ```
    pub fn local_rank(&self) -> usize {
        self.mpi.local_rank()
    }

    /// The longest message, in elements ([`MpiCollective::max_message_elems`]): broadcasts go
    /// in pieces of this many elements, and sums in pieces of `max / W` elements, so that the
    /// gathered `W × piece` buffer of a sum (on the device and on the host) holds at most this
    /// many.
    ///
    /// ```no_run
    /// let mpi = atomrl_dist::MpiCollective::init()?;
    /// let comm = atomrl_dist::NcclCollective::new(mpi, 0)?;
    /// assert_eq!(comm.max_message_elems(), atomrl_dist::DEFAULT_MAX_MESSAGE_ELEMS);
    /// # Ok::<(), atomrl_dist::DistError>(())
    /// ```
    pub fn max_message_elems(&self) -> usize {
        self.mpi.max_message_elems()
    }

    /// Sets [`max_message_elems`](Self::max_message_elems) (of the NCCL and the MPI
    /// operations). Every rank must use the same value; results do not depend on it.
    ///
    /// ```no_run
    /// let mpi = atomrl_dist::MpiCollective::init()?;
    /// let mut comm = atomrl_dist::NcclCollective::new(mpi, 0)?;
    /// comm.set_max_message_elems(16 << 20);
    /// # Ok::<(), atomrl_dist::DistError>(())
    /// ```
    pub fn set_max_message_elems(&mut self, elems: usize) {
        self.mpi.set_max_message_elems(elems);
    }

    /// The rank-ordered sum of one piece: host → device, `ncclAllGather` into `W × n`,
    /// device → host, rows added in rank order into `piece`.
    fn sum_piece(&self, op: &'static str, piece: &mut [f32]) -> Result<()> {
        let (rank, n) = (self.mpi.rank(), piece.len());
        let cuda = |e: DriverError| cuda_error(op, rank, &e);
        let local = self.stream.clone_htod(&*piece).map_err(cuda)?;
        let mut all = self
            .stream
            .alloc_zeros::<f32>(n * self.mpi.world_size())
            .map_err(cuda)?;
        self.comm
            .all_gather(&local, &mut all)
            .map_err(|e| nccl_error(op, rank, &e))?;
        // Synchronises the stream: the gather is complete when the copy returns.
        let all = self.stream.clone_dtoh(&all).map_err(cuda)?;
        let (first, rest) = all.split_at(n);
        piece.copy_from_slice(first);
        for row in rest.chunks_exact(n) {
            for (a, x) in piece.iter_mut().zip(row) {
                *a += *x;
            }
        }
        Ok(())
    }
}

impl Collective for NcclCollective {
    fn rank(&self) -> usize {
        self.mpi.rank()
    }

    fn world_size(&self) -> usize {
        self.mpi.world_size()
    }

    fn all_reduce_sum_f32(&self, buf: &mut [f32]) -> Result<()> {
        const OP: &str = "all_reduce_sum_f32";
        self.mpi.same_len(OP, buf.len())?;
        let w = self.mpi.world_size();
        if w == 1 {
            return Ok(());
        }
        let piece = (self.mpi.max_message_elems() / w).max(1);
        for chunk in buf.chunks_mut(piece) {
            self.sum_piece(OP, chunk)?;
        }
        Ok(())
    }

    fn all_reduce_sum_f64(&self, buf: &mut [f64]) -> Result<()> {
        self.mpi.all_reduce_sum_f64(buf)
    }

    fn broadcast_f32(&self, buf: &mut [f32], root: usize) -> Result<()> {
        const OP: &str = "broadcast_f32";
        let rank = self.mpi.rank();
        let is_root = root == rank;
        let root = self.mpi.check_broadcast(OP, buf.len(), root)?;
        let cuda = |e: DriverError| cuda_error(OP, rank, &e);
        for piece in buf.chunks_mut(self.mpi.max_message_elems()) {
            let mut dev = if is_root {
                self.stream.clone_htod(&*piece)
            } else {
                self.stream.alloc_zeros::<f32>(piece.len())
            }
            .map_err(cuda)?;
            self.comm
                .broadcast_in_place(&mut dev, root)
                .map_err(|e| nccl_error(OP, rank, &e))?;
            if !is_root {
                self.stream.memcpy_dtoh(&dev, piece).map_err(cuda)?;
            }
        }
        // The root's pieces too have left when this returns.
        self.stream.synchronize().map_err(cuda)
    }

    fn broadcast_bytes(&self, buf: &mut Vec<u8>, root: usize) -> Result<()> {
        self.mpi.broadcast_bytes(buf, root)
    }

    fn all_gather_f64(&self, local: &[f64]) -> Result<Vec<Vec<f64>>> {
        self.mpi.all_gather_f64(local)
    }

    fn barrier(&self) -> Result<()> {
        self.mpi.barrier()
    }

    fn abort(&self, code: i32) -> ! {
        self.mpi.abort(code)
    }
}
