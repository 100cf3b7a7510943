//! [`ThreadGroup`]: `W` ranks as threads of one process, exchanging buffers through shared
//! memory.
//!
//! # Why not `std::sync::Barrier`
//!
//! A `std::sync::Barrier` cannot be cancelled: if one member fails and never arrives, the
//! others wait forever. The group instead has its own rendezvous, one `Mutex` + `Condvar`:
//!
//! - a member deposits its contribution in its slot and counts itself in; the last to arrive
//!   combines the slots (in rank order), publishes the result, bumps the *generation* and
//!   wakes everyone;
//! - a waiting member sleeps until the generation changes (its operation completed) **or** the
//!   group's `broken` reason is set;
//! - `broken` is set (under the mutex, then `notify_all`) by [`ThreadMember::fail`], by
//!   dropping a member (an early return with `?` or a panic unwinding its thread), and by the
//!   last arriver when the members called different operations or passed incompatible
//!   buffers. It is never cleared.
//!
//! Every wait therefore ends: either all `W` members arrive, or one of them is gone, and a
//! gone member has set `broken` on its way out. No timeout is involved. The published result
//! of operation `k` is only overwritten by operation `k + 1`'s last arriver, which cannot run
//! before every member has arrived at `k + 1`, i.e. has read `k`'s result: one rendezvous per
//! operation is enough.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use crate::{sum_in_rank_order, Collective, DistError, Result};

/// Builds the `W` members of an in-process group; see [`ThreadGroup::new`].
///
/// ```
/// use atomrl_dist::{Collective, ThreadGroup};
/// let members = ThreadGroup::new(2)?;
/// assert_eq!(members.iter().map(|m| m.rank()).collect::<Vec<_>>(), vec![0, 1]);
/// # Ok::<(), atomrl_dist::DistError>(())
/// ```
#[derive(Debug, Clone, Copy)]
pub struct ThreadGroup;

impl ThreadGroup {
    /// The `w` members of a new group, member `r` being rank `r`. Move each to its own thread
    /// (they are `Send + Sync`); every collective returns when all `w` members have called it.
    ///
    /// # Errors
    /// [`DistError::Setup`] when `w == 0`.
    ///
    /// ```
    /// use atomrl_dist::{Collective, ThreadGroup};
    /// let sums = std::thread::scope(|s| {
    ///     let handles: Vec<_> = ThreadGroup::new(3)?
    ///         .into_iter()
    ///         .map(|m| s.spawn(move || {
    ///             let mut x = [m.rank() as f64];
    ///             m.all_reduce_sum_f64(&mut x).map(|()| x[0])
    ///         }))
    ///         .collect();
    ///     handles.into_iter().map(|h| h.join().expect("thread")).collect::<Result<Vec<_>, _>>()
    /// })?;
    /// assert_eq!(sums, vec![3.0, 3.0, 3.0]);
    /// # Ok::<(), atomrl_dist::DistError>(())
    /// ```
    #[allow(clippy::new_ret_no_self)]
    pub fn new(w: usize) -> Result<Vec<ThreadMember>> {
        if w == 0 {
            return Err(DistError::Setup {
                op: "ThreadGroup::new",
                rank: 0,
                detail: "a group needs at least one member, got 0".into(),
            });
        }
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                slots: (0..w).map(|_| None).collect(),
                arrived: 0,
                generation: 0,
                result: None,
                broken: None,
            }),
            cv: Condvar::new(),
            world: w,
        });
        Ok((0..w)
            .map(|rank| ThreadMember {
                rank,
                shared: Arc::clone(&shared),
            })
            .collect())
    }
}

/// One rank of a [`ThreadGroup`]; implements [`Collective`]. Dropping it breaks the group
/// (the other members' collectives then return [`DistError::Broken`]), so a member thread
/// that returns early with an error, or panics, cannot leave its peers waiting.
///
/// ```
/// use atomrl_dist::{Collective, DistError, ThreadGroup};
/// let mut members = ThreadGroup::new(2)?;
/// let survivor = members.remove(0);
/// drop(members); // rank 1 is gone
/// assert!(matches!(survivor.barrier(), Err(DistError::Broken { rank: 0, .. })));
/// # Ok::<(), atomrl_dist::DistError>(())
/// ```
#[derive(Debug)]
pub struct ThreadMember {
    rank: usize,
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    cv: Condvar,
    world: usize,
}

#[derive(Debug)]
struct State {
    /// Contributions to the operation in progress, by rank.
    slots: Vec<Option<Deposit>>,
    arrived: usize,
    /// Number of completed operations.
    generation: u64,
    /// The last completed operation's result.
    result: Option<Arc<Payload>>,
    /// Why the group broke; set once, never cleared.
    broken: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    SumF32,
    SumF64,
    BroadcastF32(usize),
    BroadcastBytes(usize),
    GatherF64,
    Barrier,
}

#[derive(Debug)]
struct Deposit {
    op: Op,
    name: &'static str,
    len: usize,
    data: Payload,
}

#[derive(Debug)]
enum Payload {
    Empty,
    F32(Vec<f32>),
    F64(Vec<f64>),
    Bytes(Vec<u8>),
    Gathered(Vec<Vec<f64>>),
}

impl ThreadMember {
    /// Marks the group broken with `reason` (naming this rank): every other member's current
    /// and later collectives return [`DistError::Broken`] carrying it, and so do this
    /// member's. Use it when this rank hits an error the others cannot know about.
    ///
    /// ```
    /// use atomrl_dist::{Collective, ThreadGroup};
    /// let members = ThreadGroup::new(2)?;
    /// members[1].fail("reward server unreachable");
    /// let err = members[0].barrier().unwrap_err();
    /// assert!(err.to_string().contains("rank 1 failed: reward server unreachable"), "{err}");
    /// # Ok::<(), atomrl_dist::DistError>(())
    /// ```
    pub fn fail(&self, reason: &str) {
        self.break_group(format!("rank {} failed: {reason}", self.rank));
    }

    fn break_group(&self, reason: String) {
        let mut st = self.lock();
        if st.broken.is_none() {
            st.broken = Some(reason);
        }
        drop(st);
        self.shared.cv.notify_all();
    }

    /// The state, even if a thread panicked while holding the lock (the state is only
    /// mutated in small steps that leave it consistent; a panicking member's drop then
    /// breaks the group anyway).
    fn lock(&self) -> MutexGuard<'_, State> {
        self.shared
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn broken(&self, name: &'static str, reason: &str) -> DistError {
        DistError::Broken {
            op: name,
            rank: self.rank,
            reason: reason.to_string(),
        }
    }

    fn check_root(&self, name: &'static str, root: usize) -> Result<()> {
        if root < self.shared.world {
            Ok(())
        } else {
            let err = DistError::Invalid {
                op: name,
                rank: self.rank,
                detail: format!(
                    "root {root} outside the world of {} ranks",
                    self.shared.world
                ),
            };
            // The peers would otherwise wait for this rank forever.
            self.break_group(err.to_string());
            Err(err)
        }
    }

    /// The one rendezvous every operation goes through: deposit, wait for all (or for the
    /// group to break), read the shared result.
    fn exchange(
        &self,
        name: &'static str,
        op: Op,
        len: usize,
        data: Payload,
    ) -> Result<Arc<Payload>> {
        let shared = &*self.shared;
        let mut st = self.lock();
        if let Some(reason) = &st.broken {
            return Err(self.broken(name, reason));
        }
        st.slots[self.rank] = Some(Deposit {
            op,
            name,
            len,
            data,
        });
        st.arrived += 1;
        let generation = st.generation;
        if st.arrived == shared.world {
            let deposits: Vec<Deposit> = st.slots.iter_mut().filter_map(Option::take).collect();
            st.arrived = 0;
            match combine(deposits) {
                Ok(result) => {
                    st.result = Some(Arc::new(result));
                    st.generation += 1;
                }
                Err(reason) => st.broken = Some(reason),
            }
            drop(st);
            shared.cv.notify_all();
            st = self.lock();
        } else {
            while st.generation == generation && st.broken.is_none() {
                st = shared
                    .cv
                    .wait(st)
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
            }
        }
        if st.generation != generation {
            if let Some(result) = &st.result {
                return Ok(Arc::clone(result));
            }
        }
        let reason = st.broken.clone().unwrap_or_else(|| "no result".into());
        Err(self.broken(name, &reason))
    }
}

/// Combines the `W` deposits of one operation (in rank order), or says why they do not match.
fn combine(deposits: Vec<Deposit>) -> std::result::Result<Payload, String> {
    let first = deposits.first().ok_or("no deposits")?;
    let (op, name, len) = (first.op, first.name, first.len);
    for (rank, d) in deposits.iter().enumerate() {
        if d.op != op {
            return Err(format!(
                "ranks called different operations: rank 0 {name} ({op:?}), rank {rank} {} ({:?})",
                d.name, d.op
            ));
        }
    }
    let check_lens = |what: &str| -> std::result::Result<(), String> {
        for (rank, d) in deposits.iter().enumerate() {
            if d.len != len {
                return Err(format!(
                    "{name}: {what} lengths differ: rank 0 has {len}, rank {rank} has {}",
                    d.len
                ));
            }
        }
        Ok(())
    };
    Ok(match op {
        Op::Barrier => Payload::Empty,
        Op::SumF32 => {
            check_lens("buffer")?;
            let shards: Vec<&[f32]> = deposits
                .iter()
                .map(|d| match &d.data {
                    Payload::F32(v) => v.as_slice(),
                    _ => &[],
                })
                .collect();
            Payload::F32(sum_in_rank_order(&shards))
        }
        Op::SumF64 => {
            check_lens("buffer")?;
            let shards: Vec<&[f64]> = deposits
                .iter()
                .map(|d| match &d.data {
                    Payload::F64(v) => v.as_slice(),
                    _ => &[],
                })
                .collect();
            Payload::F64(sum_in_rank_order(&shards))
        }
        Op::BroadcastF32(root) => {
            let root_len = deposits[root].len;
            if let Some((rank, d)) = deposits.iter().enumerate().find(|(_, d)| d.len != root_len) {
                return Err(format!(
                    "{name}: buffer lengths differ: root {root} has {root_len}, rank {rank} has {}",
                    d.len
                ));
            }
            deposits
                .into_iter()
                .nth(root)
                .map_or(Payload::Empty, |d| d.data)
        }
        Op::BroadcastBytes(root) => deposits
            .into_iter()
            .nth(root)
            .map_or(Payload::Empty, |d| d.data),
        Op::GatherF64 => Payload::Gathered(
            deposits
                .into_iter()
                .map(|d| match d.data {
                    Payload::F64(v) => v,
                    _ => Vec::new(),
                })
                .collect(),
        ),
    })
}

impl Drop for ThreadMember {
    fn drop(&mut self) {
        let reason = if std::thread::panicking() {
            format!("rank {} panicked", self.rank)
        } else {
            format!("rank {} left the group (its member was dropped)", self.rank)
        };
        self.break_group(reason);
    }
}

fn mismatch(name: &'static str, rank: usize, what: &str) -> DistError {
    DistError::Broken {
        op: name,
        rank,
        reason: format!("unexpected result kind ({what})"),
    }
}

impl Collective for ThreadMember {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.shared.world
    }

    fn all_reduce_sum_f32(&self, buf: &mut [f32]) -> Result<()> {
        const NAME: &str = "all_reduce_sum_f32";
        let result = self.exchange(NAME, Op::SumF32, buf.len(), Payload::F32(buf.to_vec()))?;
        match &*result {
            Payload::F32(sum) if sum.len() == buf.len() => {
                buf.copy_from_slice(sum);
                Ok(())
            }
            _ => Err(mismatch(NAME, self.rank, "f32 sum")),
        }
    }

    fn all_reduce_sum_f64(&self, buf: &mut [f64]) -> Result<()> {
        const NAME: &str = "all_reduce_sum_f64";
        let result = self.exchange(NAME, Op::SumF64, buf.len(), Payload::F64(buf.to_vec()))?;
        match &*result {
            Payload::F64(sum) if sum.len() == buf.len() => {
                buf.copy_from_slice(sum);
                Ok(())
            }
            _ => Err(mismatch(NAME, self.rank, "f64 sum")),
        }
    }

    fn broadcast_f32(&self, buf: &mut [f32], root: usize) -> Result<()> {
        const NAME: &str = "broadcast_f32";
        self.check_root(NAME, root)?;
        let data = if self.rank == root {
            Payload::F32(buf.to_vec())
        } else {
            Payload::Empty
        };
        let result = self.exchange(NAME, Op::BroadcastF32(root), buf.len(), data)?;
        match &*result {
            Payload::F32(v) if v.len() == buf.len() => {
                buf.copy_from_slice(v);
                Ok(())
            }
            _ => Err(mismatch(NAME, self.rank, "f32 broadcast")),
        }
    }

    fn broadcast_bytes(&self, buf: &mut Vec<u8>, root: usize) -> Result<()> {
        const NAME: &str = "broadcast_bytes";
        self.check_root(NAME, root)?;
        let data = if self.rank == root {
            Payload::Bytes(buf.clone())
        } else {
            Payload::Empty
        };
        let result = self.exchange(NAME, Op::BroadcastBytes(root), buf.len(), data)?;
        match &*result {
            Payload::Bytes(v) => {
                buf.clear();
                buf.extend_from_slice(v);
                Ok(())
            }
            _ => Err(mismatch(NAME, self.rank, "byte broadcast")),
        }
    }

    fn all_gather_f64(&self, local: &[f64]) -> Result<Vec<Vec<f64>>> {
        const NAME: &str = "all_gather_f64";
        let result = self.exchange(
            NAME,
            Op::GatherF64,
            local.len(),
            Payload::F64(local.to_vec()),
        )?;
        match &*result {
            Payload::Gathered(v) => Ok(v.clone()),
            _ => Err(mismatch(NAME, self.rank, "gather")),
        }
    }

    fn barrier(&self) -> Result<()> {
        self.exchange("barrier", Op::Barrier, 0, Payload::Empty)
            .map(|_| ())
    }

    fn abort(&self, code: i32) -> ! {
        self.break_group(format!("rank {} aborted with code {code}", self.rank));
        std::process::exit(code)
    }
}
