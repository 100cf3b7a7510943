//! An external CBLAS library (MKL, OpenBLAS, BLIS) for candle's f32 matmuls on the CPU,
//! chosen at run time.
//!
//! Candle multiplies matrices on the CPU with the `gemm` crate. On a 2-core Intel Xeon
//! (AVX-512) MKL's `cblas_sgemm` was 1.0–1.9× faster at the shapes of a Qwen2.5-0.5B
//! micro-batch, most where gemm reads a transposed weight (`x · Wᵀ` with a long inner
//! dimension; docs/performance.md, item 16). Linking MKL would make every build need it, so the
//! library is opened when a program starts, from the path in [`ENV`]
//! (`ATOMRL_CBLAS=/path/to/libmkl_rt.so.3`); unset, nothing changes.
//!
//! The library runs single-threaded and AtomRL splits each product over candle's threads
//! (rows or columns, in fixed parts), so a data-parallel worker of one thread makes one call
//! and the BLAS's own thread pool never competes with candle's. Products in other dtypes, and
//! operands with no unit stride, keep candle's kernel.
//!
//! Results differ from gemm's in the last bits (another summation order), and some
//! libraries pick kernels by CPU at run time: for runs that must repeat bit for bit across
//! machines, set the library's own switch (MKL: `MKL_CBWR=COMPATIBLE`) or leave [`ENV`] unset.

use std::ffi::c_int;
use std::path::{Path, PathBuf};
use std::sync::RwLock;

use candle_core::cpu_backend::{set_sgemm_hook, SgemmArgs};

use crate::{Error, Result};

/// The environment variable naming the CBLAS library to load.
pub const ENV: &str = "ATOMRL_CBLAS";

const FUNC: &str = "cblas";

/// CBLAS's `cblas_sgemm`: `c = alpha · op(a) · op(b) + beta · c`.
pub type CblasSgemm = unsafe extern "C" fn(
    layout: c_int,
    trans_a: c_int,
    trans_b: c_int,
    m: c_int,
    n: c_int,
    k: c_int,
    alpha: f32,
    a: *const f32,
    lda: c_int,
    b: *const f32,
    ldb: c_int,
    beta: f32,
    c: *mut f32,
    ldc: c_int,
);

const CBLAS_ROW_MAJOR: c_int = 101;
const CBLAS_NO_TRANS: c_int = 111;
const CBLAS_TRANS: c_int = 112;

/// Below this many multiply-adds a product is not split over threads: the parts would be
/// too small to pay for waking a thread.
const SPLIT_MIN_MACS: usize = 1 << 20;

/// The function candle's matmuls go to, and what [`describe`] says of it.
static SGEMM: RwLock<Option<(CblasSgemm, String)>> = RwLock::new(None);

fn set_sgemm(value: Option<(CblasSgemm, String)>) {
    match SGEMM.write() {
        Ok(mut v) => *v = value,
        Err(poisoned) => *poisoned.into_inner() = value,
    }
}

fn with_sgemm<R>(f: impl FnOnce(Option<&(CblasSgemm, String)>) -> R) -> R {
    match SGEMM.read() {
        Ok(v) => f(v.as_ref()),
        Err(poisoned) => f(poisoned.into_inner().as_ref()),
    }
}

/// Which kernel candle's f32 CPU matmuls use now, for benchmark reports: `gemm (candle's
/// kernel)`, or the CBLAS library's path.
///
/// ```
/// assert_eq!(atomrl_core::cblas::describe(), "gemm (candle's kernel)");
/// ```
pub fn describe() -> String {
    with_sgemm(|s| match s {
        Some((_, source)) => format!("cblas_sgemm of {source}"),
        None => "gemm (candle's kernel)".into(),
    })
}

/// Opens the CBLAS library at `path`, makes it single-threaded and sends candle's f32 CPU
/// matmuls to its `cblas_sgemm`. The library stays loaded for the life of the process.
///
/// # Errors
/// [`Error::Value`] naming [`ENV`] when the library cannot be opened or has no
/// `cblas_sgemm`.
///
/// ```
/// // A path that is not a library is refused, naming ATOMRL_CBLAS.
/// let err = atomrl_core::cblas::use_library(std::path::Path::new("/no/such/libblas.so"));
/// assert!(err.unwrap_err().to_string().contains("ATOMRL_CBLAS"));
/// ```
pub fn use_library(path: &Path) -> Result<()> {
    let refuse = |what: &str, e: &dyn std::fmt::Display| {
        Error::value(
            FUNC,
            ENV,
            format!("a CBLAS shared library ({what})"),
            format!("{}: {e}", path.display()),
        )
    };
    // SAFETY: opening a shared library runs its initialisers; the path is the user's choice
    // of a BLAS library, which is what this function is for.
    #[allow(unsafe_code)]
    let library = unsafe { libloading::Library::new(path) }
        .map_err(|e| refuse("one that the dynamic loader can open", &e))?;
    // SAFETY: `cblas_sgemm` has this signature in every CBLAS (netlib's cblas.h).
    #[allow(unsafe_code)]
    let sgemm = unsafe { library.get::<CblasSgemm>(b"cblas_sgemm\0") }
        .map(|f| *f)
        .map_err(|e| refuse("one that exports cblas_sgemm", &e))?;
    single_threaded(&library);
    // The function pointer must stay valid for every later matmul.
    std::mem::forget(library);
    install(sgemm, path.display().to_string());
    Ok(())
}

/// Loads the library named by [`ENV`] when it is set and not empty; returns its path.
///
/// # Errors
/// As [`use_library`].
pub fn use_library_from_env() -> Result<Option<PathBuf>> {
    match std::env::var_os(ENV) {
        Some(path) if !path.is_empty() => {
            let path = PathBuf::from(path);
            use_library(&path)?;
            Ok(Some(path))
        }
        _ => Ok(None),
    }
}

/// Sends candle's f32 CPU matmuls to `sgemm`, any function with CBLAS's `cblas_sgemm`
/// contract (one linked into the program, say). It is called from several threads at once,
/// each on its own rows or columns of the output.
///
/// ```
/// use candle_core::{Device, Tensor};
/// # #[allow(unsafe_code)]
/// unsafe extern "C" fn naive(
///     _layout: i32, ta: i32, tb: i32, m: i32, n: i32, k: i32, alpha: f32,
///     a: *const f32, lda: i32, b: *const f32, ldb: i32, beta: f32, c: *mut f32, ldc: i32,
/// ) {
///     let (m, n, k, lda, ldb, ldc) = (m as usize, n as usize, k as usize, lda as usize, ldb as usize, ldc as usize);
///     for i in 0..m {
///         for j in 0..n {
///             let mut s = 0f32;
///             for p in 0..k {
///                 let x = if ta == 112 { *a.add(p * lda + i) } else { *a.add(i * lda + p) };
///                 let y = if tb == 112 { *b.add(j * ldb + p) } else { *b.add(p * ldb + j) };
///                 s += x * y;
///             }
///             let c = c.add(i * ldc + j);
///             *c = alpha * s + if beta == 0.0 { 0.0 } else { beta * *c };
///         }
///     }
/// }
/// atomrl_core::cblas::use_sgemm(naive);
/// let a = Tensor::new(&[[1f32, 2.], [3., 4.]], &Device::Cpu)?;
/// assert_eq!(a.matmul(&a.t()?)?.to_vec2::<f32>()?, [[5., 11.], [11., 25.]]);
/// atomrl_core::cblas::use_candle_kernel();
/// # Ok::<(), candle_core::Error>(())
/// ```
pub fn use_sgemm(sgemm: CblasSgemm) {
    install(sgemm, "a cblas_sgemm function".into());
}

fn install(sgemm: CblasSgemm, source: String) {
    set_sgemm(Some((sgemm, source)));
    set_sgemm_hook(Some(hooked_sgemm));
}

/// Goes back to candle's own matmul kernel.
pub fn use_candle_kernel() {
    set_sgemm_hook(None);
    set_sgemm(None);
}

/// Asks the library to run each call on the calling thread, through whichever switch it has
/// (MKL's threading layer, OpenBLAS's or BLIS's thread count); a library without any is left
/// as it is.
fn single_threaded(library: &libloading::Library) {
    const MKL_THREADING_SEQUENTIAL: c_int = 1;
    // SAFETY: each symbol, where present, has the signature its library documents.
    #[allow(unsafe_code)]
    unsafe {
        if let Ok(f) =
            library.get::<unsafe extern "C" fn(c_int) -> c_int>(b"MKL_Set_Threading_Layer\0")
        {
            f(MKL_THREADING_SEQUENTIAL);
        } else if let Ok(f) =
            library.get::<unsafe extern "C" fn(c_int)>(b"openblas_set_num_threads\0")
        {
            f(1);
        } else if let Ok(f) =
            library.get::<unsafe extern "C" fn(i64)>(b"bli_thread_set_num_threads\0")
        {
            f(1);
        }
    }
}

/// One piece of a hook call's work: products `batch` (a range of the batch) and, of each,
/// output rows (or columns, when `!by_rows`) `lo..hi`.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Part {
    batch: (usize, usize),
    by_rows: bool,
    lo: usize,
    hi: usize,
}

/// How a hook call is shared among candle's threads: whole products per thread when there
/// are several, else rows (or columns, whichever extent is larger) of the one product, in
/// fixed parts of about equal size; all on the calling thread when the work is too small to
/// pay for waking another.
fn split(args: &SgemmArgs) -> Vec<Part> {
    let threads = args.num_threads.min(rayon::current_num_threads()).max(1);
    let by_rows = args.m >= args.n;
    let extent = if by_rows { args.m } else { args.n };
    let whole = |batch| Part {
        batch,
        by_rows,
        lo: 0,
        hi: extent,
    };
    if threads == 1 || args.batch * args.m * args.n * args.k < SPLIT_MIN_MACS {
        return vec![whole((0, args.batch))];
    }
    if args.batch > 1 {
        let parts = threads.min(args.batch);
        return (0..parts)
            .map(|p| whole((p * args.batch / parts, (p + 1) * args.batch / parts)))
            .collect();
    }
    let parts = threads.min(extent);
    (0..parts)
        .map(|p| Part {
            batch: (0, 1),
            by_rows,
            lo: p * extent / parts,
            hi: (p + 1) * extent / parts,
        })
        .collect()
}

/// The CBLAS calls of one part.
///
/// # Safety
/// As [`candle_core::cpu_backend::SgemmHook`]; `part` lies within `args`' output.
#[allow(unsafe_code)]
unsafe fn call_part(sgemm: CblasSgemm, args: &SgemmArgs, part: Part) {
    let trans = |t: bool| if t { CBLAS_TRANS } else { CBLAS_NO_TRANS };
    for i in part.batch.0..part.batch.1 {
        let (a, b, c) = (
            args.a.add(i * args.a_skip),
            args.b.add(i * args.b_skip),
            args.c.add(i * args.c_skip),
        );
        let (lo, hi) = (part.lo, part.hi);
        let (m, n, a, b, c) = if part.by_rows {
            let a = if args.trans_a {
                a.add(lo)
            } else {
                a.add(lo * args.lda)
            };
            (hi - lo, args.n, a, b, c.add(lo * args.ldc))
        } else {
            let b = if args.trans_b {
                b.add(lo * args.ldb)
            } else {
                b.add(lo)
            };
            (args.m, hi - lo, a, b, c.add(lo))
        };
        let sub = SgemmArgs {
            batch: 1,
            m,
            n,
            a,
            b,
            c,
            ..*args
        };
        let ints = [m, n, args.k, args.lda, args.ldb, args.ldc].map(c_int::try_from);
        let [Ok(m), Ok(n), Ok(k), Ok(lda), Ok(ldb), Ok(ldc)] = ints else {
            // CBLAS takes 32-bit extents; a matrix past them (far beyond any model's) is
            // computed here instead.
            fallback(&sub);
            continue;
        };
        sgemm(
            CBLAS_ROW_MAJOR,
            trans(sub.trans_a),
            trans(sub.trans_b),
            m,
            n,
            k,
            1.0,
            a,
            lda,
            b,
            ldb,
            0.0,
            c,
            ldc,
        );
    }
}

/// Candle's hook: the registered `cblas_sgemm`, shared among the calling thread pool.
///
/// # Safety
/// As [`candle_core::cpu_backend::SgemmHook`].
#[allow(unsafe_code)]
unsafe fn hooked_sgemm(args: &SgemmArgs) {
    let Some(sgemm) = with_sgemm(|s| s.map(|(f, _)| *f)) else {
        // Only reachable when `use_candle_kernel` runs during a matmul; the output must still
        // be written.
        fallback(args);
        return;
    };
    let parts = split(args);
    if let [part] = parts[..] {
        call_part(sgemm, args, part);
        return;
    }
    // Raw pointers are not Send; the parts write disjoint outputs and only read the inputs.
    struct Shared(SgemmArgs);
    // SAFETY: see above.
    unsafe impl Sync for Shared {}
    let shared = Shared(*args);
    rayon::scope(|s| {
        for &part in &parts {
            let shared = &shared;
            // SAFETY: each part lies within the output (from `split`).
            s.spawn(move |_| unsafe { call_part(sgemm, &shared.0, part) });
        }
    });
}

/// `c = op(a) · op(b)` element by element, for what CBLAS cannot be given: a hook left
/// without a function (`use_candle_kernel` during a matmul), extents past 32 bits.
///
/// # Safety
/// As [`candle_core::cpu_backend::SgemmHook`].
#[allow(unsafe_code)]
unsafe fn fallback(args: &SgemmArgs) {
    for bi in 0..args.batch {
        let (a, b, c) = (
            args.a.add(bi * args.a_skip),
            args.b.add(bi * args.b_skip),
            args.c.add(bi * args.c_skip),
        );
        for i in 0..args.m {
            for j in 0..args.n {
                let mut s = 0f32;
                for p in 0..args.k {
                    let x = if args.trans_a {
                        *a.add(p * args.lda + i)
                    } else {
                        *a.add(i * args.lda + p)
                    };
                    let y = if args.trans_b {
                        *b.add(j * args.ldb + p)
                    } else {
                        *b.add(p * args.ldb + j)
                    };
                    s += x * y;
                }
                *c.add(i * args.ldc + j) = s;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(batch: usize, m: usize, n: usize, k: usize, num_threads: usize) -> SgemmArgs {
        SgemmArgs {
            batch,
            a_skip: m * k,
            b_skip: k * n,
            c_skip: m * n,
            trans_a: false,
            trans_b: false,
            m,
            n,
            k,
            a: std::ptr::null(),
            lda: k,
            b: std::ptr::null(),
            ldb: n,
            c: std::ptr::null_mut(),
            ldc: n,
            num_threads,
        }
    }

    /// Every output element of every product is in exactly one part.
    fn covered_once(args: &SgemmArgs, parts: &[Part]) -> bool {
        let mut seen = vec![0u8; args.batch * args.m * args.n];
        for p in parts {
            for b in p.batch.0..p.batch.1 {
                for i in 0..args.m {
                    for j in 0..args.n {
                        let x = if p.by_rows { i } else { j };
                        if (p.lo..p.hi).contains(&x) {
                            seen[b * args.m * args.n + i * args.n + j] += 1;
                        }
                    }
                }
            }
        }
        seen.iter().all(|&s| s == 1)
    }

    #[test]
    #[allow(unsafe_code)]
    fn the_element_by_element_fallback_computes_batched_transposed_products() {
        // Two products of a (2 × 3, stored transposed) and b (3 × 2), b shared.
        let a = [
            1f32, 4., 2., 5., 3., 6., /* second */ 0., 1., 1., 0., 2., 2.,
        ];
        let b = [1f32, 0., 0., 1., 1., 1.];
        let mut c = [0f32; 8];
        let args = SgemmArgs {
            batch: 2,
            a_skip: 6,
            b_skip: 0,
            c_skip: 4,
            trans_a: true,
            trans_b: false,
            m: 2,
            n: 2,
            k: 3,
            a: a.as_ptr(),
            lda: 2,
            b: b.as_ptr(),
            ldb: 2,
            c: c.as_mut_ptr(),
            ldc: 2,
            num_threads: 1,
        };
        // SAFETY: the arrays hold the extents `args` describes.
        unsafe { fallback(&args) };
        // [[1, 2, 3], [4, 5, 6]] · b and [[0, 1, 2], [1, 0, 2]] · b
        assert_eq!(c, [4., 5., 10., 11., 2., 3., 3., 2.]);
    }

    #[test]
    fn small_products_stay_on_the_calling_thread() {
        let a = args(3, 8, 8, 8, 4);
        assert_eq!(split(&a).len(), 1);
        assert!(covered_once(&a, &split(&a)));
    }

    #[test]
    fn batches_are_shared_whole_and_one_product_by_its_longer_side() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .expect("pool");
        pool.install(|| {
            let batched = args(7, 64, 64, 128, 3);
            let parts = split(&batched);
            assert_eq!(parts.len(), 3);
            assert!(parts.iter().all(|p| (p.lo, p.hi) == (0, 64)));
            assert!(covered_once(&batched, &parts));

            let tall = args(1, 301, 40, 256, 3);
            let parts = split(&tall);
            assert_eq!(parts.len(), 3);
            assert!(parts.iter().all(|p| p.by_rows));
            assert!(covered_once(&tall, &parts));

            let wide = args(1, 40, 301, 256, 8);
            let parts = split(&wide);
            assert_eq!(parts.len(), 3, "no more parts than the pool has threads");
            assert!(parts.iter().all(|p| !p.by_rows));
            assert!(covered_once(&wide, &parts));

            let one_thread = args(1, 301, 40, 256, 1);
            assert_eq!(split(&one_thread).len(), 1);
        });
    }
}
