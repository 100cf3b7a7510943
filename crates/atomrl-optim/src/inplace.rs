//! In-place gradient arithmetic on f32 tensors: `a += b` and `a *= s`, on the CPU and (feature
//! `cuda`) on CUDA.
//!
//! Summing micro-batch gradients and clipping them with tensor ops allocates a new
//! parameter-sized buffer per parameter per micro-batch and again per clip: at Qwen2.5-0.5B's
//! size ~2 GB of fresh pages per micro-batch on a CPU, and ~290 allocations and launches per
//! pass on a GPU. These ops write into a buffer [`crate::Gradients`] owns instead. The
//! arithmetic is candle's (`a + b`; `a * s` is candle's affine `a · s + 0`), so results are
//! bit-identical to the tensor-op form (tested below).

use candle_core::{CpuStorage, DType, InplaceOp1, InplaceOp2, Layout, Result, Tensor};

/// Whether `a += b` / `a *= s` can run in place on these tensors: f32, same device, CPU, or
/// CUDA with the `cuda` feature and [`atomrl_core::device::cuda_fused_kernels`] on.
pub(crate) fn applies(ts: &[&Tensor]) -> bool {
    let Some(first) = ts.first() else {
        return false;
    };
    ts.iter()
        .all(|t| t.dtype() == DType::F32 && t.device().same_device(first.device()))
        && device_supported(first.device())
}

/// The devices the in-place kernels run on.
pub(crate) fn device_supported(device: &candle_core::Device) -> bool {
    device.is_cpu()
        || (cfg!(feature = "cuda") && device.is_cuda() && atomrl_core::device::cuda_fused_kernels())
}

/// The contiguous f32 elements of a CPU storage.
pub(crate) fn f32s<'a>(s: &'a CpuStorage, l: &Layout) -> Result<&'a [f32]> {
    match contiguous_f32s(s, l) {
        Some(v) => Ok(v),
        None => candle_core::bail!("atomrl in-place kernel: contiguous f32 tensors expected"),
    }
}

/// The elements of a CPU storage when it holds f32 in `l`'s contiguous range; else `None`.
pub(crate) fn contiguous_f32s<'a>(s: &'a CpuStorage, l: &Layout) -> Option<&'a [f32]> {
    match (s, l.contiguous_offsets()) {
        (CpuStorage::F32(v), Some((a, b))) => Some(&v[a..b]),
        _ => None,
    }
}

/// The contiguous f32 elements of a CPU storage, writable.
pub(crate) fn f32s_mut<'a>(s: &'a mut CpuStorage, l: &Layout) -> Result<&'a mut [f32]> {
    match (s, l.contiguous_offsets()) {
        (CpuStorage::F32(v), Some((a, b))) => Ok(&mut v[a..b]),
        _ => candle_core::bail!("atomrl in-place kernel: contiguous f32 tensors expected"),
    }
}

/// `a ← a + b`.
pub(crate) struct AddAssign;

impl InplaceOp2 for AddAssign {
    fn name(&self) -> &'static str {
        "atomrl-add-assign"
    }

    fn cpu_fwd(
        &self,
        s1: &mut CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<()> {
        let b = f32s(s2, l2)?;
        let a = f32s_mut(s1, l1)?;
        if a.len() != b.len() {
            candle_core::bail!(
                "atomrl-add-assign: {} elements += {} elements",
                a.len(),
                b.len()
            );
        }
        crate::cpu_loops::zip_mut(a, b, |a, b| *a += b);
        Ok(())
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &mut candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<()> {
        crate::cuda::add_assign(s1, l1, s2, l2)
    }
}

/// `a ← a · s + 0`.
pub(crate) struct Scale(pub f64);

impl InplaceOp1 for Scale {
    fn name(&self) -> &'static str {
        "atomrl-scale"
    }

    fn cpu_fwd(&self, s: &mut CpuStorage, l: &Layout) -> Result<()> {
        let s_f32 = self.0 as f32;
        crate::cpu_loops::for_each_mut(f32s_mut(s, l)?, |a| *a = *a * s_f32 + 0.0);
        Ok(())
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, s: &mut candle_core::CudaStorage, l: &Layout) -> Result<()> {
        crate::cuda::scale(s, l, self.0 as f32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn t(v: &[f32]) -> Tensor {
        Tensor::new(v, &Device::Cpu).expect("tensor")
    }

    #[test]
    fn add_assign_equals_the_tensor_sum_bit_for_bit() -> Result<()> {
        let a: Vec<f32> = (0..257).map(|i| (i as f32 * 0.731).sin() * 1e-3).collect();
        let b: Vec<f32> = (0..257).map(|i| (i as f32 * 1.37).cos() * 7.0).collect();
        let expected = (t(&a) + t(&b))?.to_vec1::<f32>()?;
        let owned = t(&a);
        owned.inplace_op2(&t(&b), &AddAssign)?;
        assert_eq!(owned.to_vec1::<f32>()?, expected);
        Ok(())
    }

    #[test]
    fn scale_equals_the_tensor_product_bit_for_bit() -> Result<()> {
        let a: Vec<f32> = (0..300).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
        let s = 0.123_456_789_f64;
        let expected = (t(&a) * s)?.to_vec1::<f32>()?;
        let owned = t(&a);
        owned.inplace_op1(&Scale(s))?;
        assert_eq!(owned.to_vec1::<f32>()?, expected);
        Ok(())
    }

    #[test]
    fn mismatched_lengths_are_an_error() {
        let owned = t(&[1.0, 2.0]);
        let err = owned.inplace_op2(&t(&[1.0]), &AddAssign).unwrap_err();
        assert!(
            err.to_string().contains("2 elements += 1 elements"),
            "{err}"
        );
    }
}
