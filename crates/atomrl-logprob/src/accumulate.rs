//! `acc ← acc + aᵀ · b` in place: the LM head's weight gradient summed over chunks of rows.
//!
//! The fused head's backward ([`crate::fused`]) computes the weight gradient `dxᵀ · h` one
//! chunk of rows at a time. Returned per chunk, each is a fresh `[V, H]` buffer that candle's
//! backprop then adds into yet another one: at Qwen2.5-0.5B's 151,936 × 896 head, two 544 MB
//! f32 buffers per chunk and an addition that reads both, several times per micro-batch. Here
//! the first chunk's product is the accumulator and later chunks are added into it by the
//! matrix product itself (gemm's `dst ← dst + lhs · rhs`), so the gradient is one buffer
//! written once per chunk.
//!
//! gemm (on CUDA, cuBLAS with `β = 1`) is called directly because candle's matmul has no
//! accumulating form. Where this op does not run (other dtypes, `ATOMRL_CUDA_FUSED=0`)
//! [`add_transposed_product`] falls back to `acc + aᵀ · b`. On CUDA the sum is rounded once
//! into `acc`'s dtype, where the fallback rounds the product and then the sum: in bf16 the
//! in-place form is the more exact of the two, and not the same bits.

use candle_core::{CpuStorage, DType, InplaceOp3, Layout, Result, Tensor};

/// `acc [M, N] ← acc + aᵀ · b` for `a [K, M]`, `b [K, N]`, returning the updated `acc`: in
/// place on the CPU in f32 and f64 and on CUDA in f32, bf16 and f16 (all three contiguous;
/// `acc` must be a buffer no other tensor shares), else as a new tensor.
pub(crate) fn add_transposed_product(acc: Tensor, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let in_place_dtype = if acc.device().is_cpu() {
        matches!(acc.dtype(), DType::F32 | DType::F64)
    } else {
        cuda_in_place(&acc)
    };
    let in_place = in_place_dtype && [&acc, a, b].iter().all(|t| t.dtype() == acc.dtype());
    if !in_place {
        return acc + a.t()?.matmul(b)?;
    }
    let (a, b) = (a.contiguous()?, b.contiguous()?);
    acc.inplace_op3(&a, &b, &AddTransposedProduct)?;
    Ok(acc)
}

/// Whether `acc` is summed into in place on CUDA: f32, bf16 or f16, AtomRL's kernels on, and
/// cuBLAS's accumulating product agreeing with the matmul and addition on this GPU (checked
/// once, on first use, on a small f32 case to 1e-5 of its scale; if it disagrees, a warning
/// says so and the tensor-op form is kept, so a bad path costs speed, not correctness).
#[cfg(feature = "cuda")]
fn cuda_in_place(acc: &Tensor) -> bool {
    static OK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    acc.device().is_cuda()
        && matches!(acc.dtype(), DType::F32 | DType::BF16 | DType::F16)
        && atomrl_core::device::cuda_fused_kernels()
        && atomrl_core::device::verified_once(
            &OK,
            "cuBLAS's accumulating product",
            "a matmul and an addition",
            || self_check(acc.device()),
        )
}

#[cfg(not(feature = "cuda"))]
fn cuda_in_place(_acc: &Tensor) -> bool {
    false
}

/// `None` when the in-place sum of a `[5, 7] += [9, 5]ᵀ · [9, 7]` case matches the tensor-op
/// form on `device` to 1e-5 of its largest value, else the largest difference.
#[cfg(feature = "cuda")]
fn self_check(device: &candle_core::Device) -> Result<Option<String>> {
    let grid = |n: usize, k: usize| -> Result<Tensor> {
        let x: Vec<f32> = (0..n)
            .map(|i| ((i * 37 + k) % 23) as f32 / 11.0 - 1.0)
            .collect();
        Tensor::from_vec(x, n, device)
    };
    let (acc, a, b) = (
        grid(35, 1)?.reshape((5, 7))?,
        grid(45, 2)?.reshape((9, 5))?,
        grid(63, 3)?.reshape((9, 7))?,
    );
    let want = (&acc + a.t()?.matmul(&b)?)?;
    let got = acc.copy()?;
    got.inplace_op3(&a, &b, &AddTransposedProduct)?;
    let largest = |t: &Tensor| -> Result<f32> { t.abs()?.max_all()?.to_scalar::<f32>() };
    let diff = largest(&(&got - &want)?)?;
    let ok = diff.is_finite() && diff <= 1e-5 * largest(&want)?.max(1.0);
    Ok((!ok).then(|| format!("max |diff| {diff:e}")))
}

/// The in-place op of [`add_transposed_product`].
struct AddTransposedProduct;

/// The `(start, end)` element range of a contiguous layout, or an error naming the op.
fn contiguous(l: &Layout) -> Result<(usize, usize)> {
    l.contiguous_offsets().ok_or_else(|| {
        candle_core::Error::Msg("atomrl-add-transposed-product: contiguous tensors expected".into())
    })
}

/// `dst [m, n] += aᵀ · b` over row-major slices `a [k, m]`, `b [k, n]`.
fn accumulate<T: 'static + Copy + num_traits::One>(
    dst: &mut [T],
    a: &[T],
    b: &[T],
    (k, m, n): (usize, usize, usize),
) -> Result<()> {
    if dst.len() != m * n || a.len() != k * m || b.len() != k * n {
        candle_core::bail!(
            "atomrl-add-transposed-product: [{m}, {n}] += [{k}, {m}]ᵀ · [{k}, {n}] does not fit {}, {} and {} elements",
            dst.len(),
            a.len(),
            b.len()
        );
    }
    if k == 0 {
        return Ok(());
    }
    let threads = candle_core::utils::get_num_threads();
    let parallelism = if threads > 1 {
        gemm::Parallelism::Rayon(threads)
    } else {
        gemm::Parallelism::None
    };
    // SAFETY: the three slices hold exactly the elements the strides below address (checked
    // above: dst m × n row-major, a k × m read transposed, b k × n row-major); dst is borrowed
    // mutably, so it aliases neither input.
    #[allow(unsafe_code)]
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            n as isize,
            true,
            a.as_ptr(),
            m as isize,
            1,
            b.as_ptr(),
            1,
            n as isize,
            T::one(),
            T::one(),
            false,
            false,
            false,
            parallelism,
        );
    }
    Ok(())
}

impl InplaceOp3 for AddTransposedProduct {
    fn name(&self) -> &'static str {
        "atomrl-add-transposed-product"
    }

    fn cpu_fwd(
        &self,
        s1: &mut CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<()> {
        let (k, m, n) = dims(l1, l2, l3)?;
        let ((a1, b1), (a2, b2), (a3, b3)) = (contiguous(l1)?, contiguous(l2)?, contiguous(l3)?);
        match (s1, s2, s3) {
            (CpuStorage::F32(d), CpuStorage::F32(a), CpuStorage::F32(b)) => {
                accumulate(&mut d[a1..b1], &a[a2..b2], &b[a3..b3], (k, m, n))
            }
            (CpuStorage::F64(d), CpuStorage::F64(a), CpuStorage::F64(b)) => {
                accumulate(&mut d[a1..b1], &a[a2..b2], &b[a3..b3], (k, m, n))
            }
            _ => candle_core::bail!("atomrl-add-transposed-product: f32 or f64 tensors expected"),
        }
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &mut candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
        s3: &candle_core::CudaStorage,
        l3: &Layout,
    ) -> Result<()> {
        cuda::accumulate(s1, l1, s2, l2, s3, l3)
    }
}

/// `(K, M, N)` of `acc [M, N] += a [K, M]ᵀ · b [K, N]`, or an error naming the shapes.
fn dims(l1: &Layout, l2: &Layout, l3: &Layout) -> Result<(usize, usize, usize)> {
    let (d1, d2, d3) = (l1.dims(), l2.dims(), l3.dims());
    let [m, n] = *d1 else {
        candle_core::bail!("atomrl-add-transposed-product: acc {d1:?} is not a matrix")
    };
    let k = d2.first().copied().unwrap_or(0);
    if d2 != [k, m] || d3 != [k, n] {
        candle_core::bail!(
            "atomrl-add-transposed-product: acc {d1:?} += {d2:?}ᵀ · {d3:?}: expected [K, {m}] and [K, {n}]"
        );
    }
    Ok((k, m, n))
}

/// The CUDA form: one cuBLAS GEMM with `β = 1` on candle's handle and stream.
#[cfg(feature = "cuda")]
mod cuda {
    // cuBLAS is FFI; the call says what it reads and writes.
    #![allow(unsafe_code)]

    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::cublas::CudaBlas;
    use candle_core::cuda_backend::cudarc::cublas::{sys::cublasOperation_t, Gemm, GemmConfig};
    use candle_core::cuda_backend::{CudaDType, WrapErr};
    use candle_core::{CudaStorage, Layout, Result, WithDType};

    use super::{contiguous, dims};

    /// `acc += aᵀ · b` (see [`super::add_transposed_product`]) on the storages of one device.
    pub(super) fn accumulate(
        s1: &mut CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
        s3: &CudaStorage,
        l3: &Layout,
    ) -> Result<()> {
        let (k, m, n) = dims(l1, l2, l3)?;
        if k == 0 {
            return Ok(());
        }
        let ranges = (contiguous(l1)?, contiguous(l2)?, contiguous(l3)?);
        let blas = s1.device().cublas_handle();
        match s1.dtype() {
            candle_core::DType::F32 => run::<f32>(&blas, s1, s2, s3, ranges, (k, m, n)),
            candle_core::DType::BF16 => run::<half::bf16>(&blas, s1, s2, s3, ranges, (k, m, n)),
            candle_core::DType::F16 => run::<half::f16>(&blas, s1, s2, s3, ranges, (k, m, n)),
            dt => candle_core::bail!("atomrl-add-transposed-product: unsupported dtype {dt:?}"),
        }
    }

    type Ranges = ((usize, usize), (usize, usize), (usize, usize));

    fn run<T: CudaDType + WithDType>(
        blas: &CudaBlas,
        s1: &mut CudaStorage,
        s2: &CudaStorage,
        s3: &CudaStorage,
        ((a1, b1), (a2, b2), (a3, b3)): Ranges,
        (k, m, n): (usize, usize, usize),
    ) -> Result<()>
    where
        CudaBlas: Gemm<T>,
    {
        let int = |x: usize| {
            i32::try_from(x).map_err(|_| {
                candle_core::Error::Msg(format!(
                    "atomrl-add-transposed-product: dimension {x} is past cuBLAS's 32-bit sizes"
                ))
            })
        };
        let a = s2.as_cuda_slice::<T>()?.slice(a2..b2);
        let b = s3.as_cuda_slice::<T>()?.slice(a3..b3);
        let mut acc = s1.as_cuda_slice_mut::<T>()?.slice_mut(a1..b1);
        // Column-major, acc [M, N] row-major is accᶜ [N, M] (leading dimension N), and
        // accᶜ += bᶜ · (aᶜ)ᵀ with bᶜ [N, K] (leading dimension N) and aᶜ [M, K] (M).
        let cfg = GemmConfig {
            transa: cublasOperation_t::CUBLAS_OP_N,
            transb: cublasOperation_t::CUBLAS_OP_T,
            m: int(n)?,
            n: int(m)?,
            k: int(k)?,
            alpha: T::from_f64(1.0),
            lda: int(n)?,
            ldb: int(m)?,
            beta: T::from_f64(1.0),
            ldc: int(n)?,
        };
        // SAFETY: b holds K × N elements read with leading dimension N, a holds K × M read
        // transposed with leading dimension M, acc holds M × N written with leading dimension N
        // (the ranges are the contiguous layouts `dims` checked); acc is borrowed mutably, so it
        // aliases neither input; the handle runs on the storages' device stream.
        unsafe { blas.gemm(cfg, &b, &a, &mut acc) }.w()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use candle_core::Device;

    /// In place it is the matmul and the addition it replaces: bit for bit, since gemm sums
    /// each dot product over the same few rows in the same order and adds it to `acc` once.
    #[test]
    fn equals_a_matmul_then_an_addition() {
        let d = Device::Cpu;
        for dtype in [DType::F32, DType::F64] {
            for (k, m, n) in [(5, 7, 3), (1, 4, 4), (37, 130, 19)] {
                let acc = Tensor::randn(0f32, 1.0, (m, n), &d)
                    .unwrap()
                    .to_dtype(dtype)
                    .unwrap();
                let a = Tensor::randn(0f32, 1.0, (k, m), &d)
                    .unwrap()
                    .to_dtype(dtype)
                    .unwrap();
                let b = Tensor::randn(0f32, 1.0, (k, n), &d)
                    .unwrap()
                    .to_dtype(dtype)
                    .unwrap();
                let want = (&acc + a.t().unwrap().matmul(&b).unwrap()).unwrap();
                let got = add_transposed_product(acc.copy().unwrap(), &a, &b).unwrap();
                let diff = (got - want)
                    .unwrap()
                    .abs()
                    .unwrap()
                    .to_dtype(DType::F64)
                    .unwrap()
                    .max_all()
                    .unwrap()
                    .to_scalar::<f64>()
                    .unwrap();
                assert_eq!(diff, 0.0, "{dtype:?} k={k} m={m} n={n}");
            }
        }
    }

    #[test]
    fn other_dtypes_take_the_tensor_op_form() {
        let d = Device::Cpu;
        let t = |r, c| {
            Tensor::ones((r, c), DType::F32, &d)
                .unwrap()
                .to_dtype(DType::BF16)
                .unwrap()
        };
        let got = add_transposed_product(t(2, 3), &t(4, 2), &t(4, 3)).unwrap();
        let v: Vec<Vec<f32>> = got.to_dtype(DType::F32).unwrap().to_vec2().unwrap();
        assert_eq!(v, vec![vec![5.0; 3]; 2]);
    }

    #[test]
    fn shapes_that_do_not_fit_are_errors() {
        let d = Device::Cpu;
        let z = |r, c| Tensor::zeros((r, c), DType::F32, &d).unwrap();
        let err = add_transposed_product(z(2, 3), &z(4, 2), &z(5, 3)).unwrap_err();
        assert!(
            err.to_string().contains("expected [K, 2] and [K, 3]"),
            "{err}"
        );
    }
}
