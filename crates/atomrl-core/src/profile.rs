//! Where a step's time, allocations and bytes go: phase timers that synchronise the device at
//! their boundaries, and an allocation counter, for `cargo xtask bench --profile` and
//! training runs under `ATOMRL_PROFILE=1`.
//!
//! Off by default: a phase then costs one relaxed atomic load and no device synchronisation,
//! and [`CountingAllocator`] one relaxed load per allocation. [`enable`] turns both on.
//!
//! **Why allocations stand for kernel launches.** Candle gives every tensor op (every CUDA
//! kernel launch, every pass over memory on the CPU) a freshly allocated output buffer; views
//! (`reshape`, `narrow`, `transpose`) allocate none. The number of buffers of at least
//! [`BUFFER_MIN_BYTES`] a phase allocates is therefore a count of its tensor ops that a CPU can
//! measure and that does not depend on the device's speed: on a GPU each is a launch and a
//! trip through the caching allocator; on a CPU each is a pass over fresh pages (the
//! page-zeroing churn of `docs/performance.md`). With one compute thread the counts are
//! reproducible to the allocation, which is what the ceiling test of `atomrl-trainer` checks.
//!
//! ```
//! use atomrl_core::profile;
//! use candle_core::{Device, Tensor};
//!
//! profile::enable(true);
//! profile::reset();
//! let dev = Device::Cpu;
//! {
//!     let _p = profile::phase("example.add", &dev);
//!     let a = Tensor::ones(1024, candle_core::DType::F32, &dev)?;
//!     let _b = (&a + &a)?;
//! }
//! let stats = profile::report();
//! let row = stats.iter().find(|s| s.name == "example.add").unwrap();
//! assert_eq!(row.calls, 1);
//! profile::enable(false);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use candle_core::Device;
use serde::Serialize;

/// Allocations of at least this many bytes count as tensor buffers (smaller ones are
/// shapes, strides, `Arc`s and other bookkeeping).
pub const BUFFER_MIN_BYTES: usize = 1024;

static ENABLED: AtomicBool = AtomicBool::new(false);
static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);
static BUFFERS: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);
static PHASES: Mutex<BTreeMap<&'static str, PhaseStats>> = Mutex::new(BTreeMap::new());

/// Turns phase timing and allocation counting on or off (process-wide).
pub fn enable(on: bool) {
    ENABLED.store(on, Ordering::SeqCst);
}

/// Whether profiling is on.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Clears the recorded phases (the allocation counters keep running; phases record
/// differences).
pub fn reset() {
    if let Ok(mut p) = PHASES.lock() {
        p.clear();
    }
}

/// Host allocations counted so far by [`CountingAllocator`] while profiling was on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct AllocCounts {
    /// Every allocation (and growing reallocation).
    pub allocations: u64,
    /// Allocations of at least [`BUFFER_MIN_BYTES`]: tensor buffers, one per tensor op.
    pub buffers: u64,
    /// Bytes of all of them.
    pub bytes: u64,
}

impl AllocCounts {
    /// The counts accumulated since `earlier`.
    pub fn since(self, earlier: AllocCounts) -> AllocCounts {
        AllocCounts {
            allocations: self.allocations.saturating_sub(earlier.allocations),
            buffers: self.buffers.saturating_sub(earlier.buffers),
            bytes: self.bytes.saturating_sub(earlier.bytes),
        }
    }
}

/// The counters now (all zero unless [`CountingAllocator`] is the global allocator).
pub fn alloc_counts() -> AllocCounts {
    AllocCounts {
        allocations: ALLOCATIONS.load(Ordering::Relaxed),
        buffers: BUFFERS.load(Ordering::Relaxed),
        bytes: BYTES.load(Ordering::Relaxed),
    }
}

/// What one named phase took, summed over its calls (inclusive of nested phases).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PhaseStats {
    /// The phase's name, e.g. `forward.layer.attention`.
    pub name: &'static str,
    /// How many times it ran.
    pub calls: u64,
    /// Wall-clock seconds, the device synchronised at entry and exit.
    pub seconds: f64,
    /// Allocations made inside it, on every thread.
    pub alloc: AllocCounts,
}

/// The recorded phases, by name.
pub fn report() -> Vec<PhaseStats> {
    PHASES
        .lock()
        .map(|p| p.values().cloned().collect())
        .unwrap_or_default()
}

/// The phases as a text table: calls, total and per-call time, tensor buffers and MiB
/// allocated per call (empty when there are none).
pub fn format_table(title: &str, phases: &[PhaseStats]) -> String {
    if phases.is_empty() {
        return String::new();
    }
    let mut out = format!(
        "profile of {title} (device synchronised at each phase boundary; nested phases are \
         included in their parents)\n  {:<30} {:>7} {:>10} {:>10} {:>12} {:>10}\n",
        "phase", "calls", "total s", "ms/call", "buffers/call", "MiB/call"
    );
    for p in phases {
        let calls = p.calls.max(1) as f64;
        out.push_str(&format!(
            "  {:<30} {:>7} {:>10.4} {:>10.3} {:>12.1} {:>10.2}\n",
            p.name,
            p.calls,
            p.seconds,
            1e3 * p.seconds / calls,
            p.alloc.buffers as f64 / calls,
            p.alloc.bytes as f64 / calls / f64::from(1u32 << 20),
        ));
    }
    out
}

/// A running phase; records itself when dropped. See [`phase`].
#[must_use = "a phase measures until it is dropped"]
pub struct Phase {
    inner: Option<(&'static str, Device, Instant, AllocCounts)>,
}

/// Starts phase `name` on `device`: when profiling is on, synchronises the device (so that
/// queued GPU work is charged to the phase before), and on drop synchronises it again and adds
/// the elapsed time and the allocations to the phase's totals. Off: does nothing.
pub fn phase(name: &'static str, device: &Device) -> Phase {
    if !enabled() {
        return Phase { inner: None };
    }
    // A failed synchronisation would surface at the next real op; the profile just gets
    // a less exact boundary.
    let _ = device.synchronize();
    Phase {
        inner: Some((name, device.clone(), Instant::now(), alloc_counts())),
    }
}

impl Drop for Phase {
    fn drop(&mut self) {
        let Some((name, device, start, counts)) = self.inner.take() else {
            return;
        };
        let _ = device.synchronize();
        let seconds = start.elapsed().as_secs_f64();
        let alloc = alloc_counts().since(counts);
        if let Ok(mut p) = PHASES.lock() {
            let s = p.entry(name).or_insert_with(|| PhaseStats {
                name,
                ..PhaseStats::default()
            });
            s.calls += 1;
            s.seconds += seconds;
            s.alloc.allocations += alloc.allocations;
            s.alloc.buffers += alloc.buffers;
            s.alloc.bytes += alloc.bytes;
        }
    }
}

/// The system allocator, counting allocations while profiling is on. A binary opts in with
/// `#[global_allocator] static A: CountingAllocator = CountingAllocator;`; every allocation
/// still goes to [`System`] (glibc's malloc, as tuned by `runtime::tune_allocator`).
#[derive(Debug, Default, Clone, Copy)]
pub struct CountingAllocator;

impl CountingAllocator {
    fn count(size: usize) {
        if ENABLED.load(Ordering::Relaxed) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
            BYTES.fetch_add(size as u64, Ordering::Relaxed);
            if size >= BUFFER_MIN_BYTES {
                BUFFERS.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

// Hand-written rather than a counting-allocator crate: the counters must be the ones
// `phase` reads, and this is six lines of forwarding.
#[allow(unsafe_code)]
// SAFETY: every method forwards to `System` with the caller's arguments unchanged, so the
// `GlobalAlloc` contract is System's; the counting touches only atomics (no allocation).
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        Self::count(layout.size());
        // SAFETY: forwarded as received.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        Self::count(layout.size());
        // SAFETY: forwarded as received.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded as received.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > layout.size() {
            Self::count(new_size - layout.size());
        }
        // SAFETY: forwarded as received.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_subtracts_without_underflow() {
        let a = AllocCounts {
            allocations: 5,
            buffers: 2,
            bytes: 100,
        };
        let b = AllocCounts {
            allocations: 7,
            buffers: 3,
            bytes: 150,
        };
        assert_eq!(
            b.since(a),
            AllocCounts {
                allocations: 2,
                buffers: 1,
                bytes: 50
            }
        );
        assert_eq!(a.since(b), AllocCounts::default());
    }

    #[test]
    fn a_disabled_phase_records_nothing() {
        // Other tests of this binary never enable profiling.
        let dev = Device::Cpu;
        drop(phase("test.disabled", &dev));
        assert!(report().iter().all(|s| s.name != "test.disabled"));
    }
}
