//! Rotary position embeddings (rotate-half layout) as one graph node:
//! `y = x · cos + rotate_half(x) · sin`, with `rotate_half([x₁, x₂]) = [−x₂, x₁]`.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp1, DType, Layout, Result, Shape, Tensor};

use super::{for_rows, slice, with_elements, Real};

struct Rope {
    cos: Tensor,
    sin: Tensor,
}

/// `y = x·cos + R(x)·sin` (`back = false`) or its transpose applied to `g`,
/// `dx = g·cos + Rᵀ(g·sin)` with `Rᵀ([u₁, u₂]) = [u₂, −u₁]` (`back = true`), for rows of
/// `x [N, H, L, d]` against tables `[N, 1, L, d]`.
fn rotate<T: Real>(x: &[T], cos: &[T], sin: &[T], dims: &[usize], back: bool) -> Vec<T> {
    let (heads, l, d) = (dims[1], dims[2], dims[3]);
    let half = d / 2;
    let mut out = vec![T::zero(); x.len()];
    for_rows(&mut out, d, |r, y| {
        let (n, i) = (r / (heads * l), r % l);
        let t = (n * l + i) * d;
        let (c, s, xr) = (&cos[t..t + d], &sin[t..t + d], &x[r * d..(r + 1) * d]);
        for k in 0..half {
            let (a, b) = (xr[k], xr[k + half]);
            if back {
                y[k] = a * c[k] + b * s[k + half];
                y[k + half] = b * c[k + half] - a * s[k];
            } else {
                y[k] = a * c[k] + (-b) * s[k];
                y[k + half] = b * c[k + half] + a * s[k + half];
            }
        }
    });
    out
}

impl Rope {
    fn run<T: Real>(&self, x: &[T], dims: &[usize], back: bool) -> Result<Vec<T>> {
        with_elements::<T, _>(&self.cos, |cos| {
            with_elements::<T, _>(&self.sin, |sin| Ok(rotate(x, cos, sin, dims, back)))
        })
    }
}

impl CustomOp1 for Rope {
    fn name(&self) -> &'static str {
        "atomrl-rope"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let dims = layout.dims();
        let out = match storage.dtype() {
            DType::F32 => CpuStorage::F32(self.run(slice(storage, layout)?, dims, false)?),
            DType::F64 => CpuStorage::F64(self.run(slice(storage, layout)?, dims, false)?),
            dt => candle_core::bail!("atomrl-rope: unsupported dtype {dt:?}"),
        };
        Ok((out, layout.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        storage: &candle_core::CudaStorage,
        layout: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let out = super::cuda::rope(storage, layout, &self.cos, &self.sin, false)?;
        Ok((out, layout.shape().clone()))
    }

    fn bwd(&self, x: &Tensor, _res: &Tensor, g: &Tensor) -> Result<Option<Tensor>> {
        #[cfg(feature = "cuda")]
        if x.device().is_cuda() {
            return Ok(Some(super::cuda::rope_bwd(g, &self.cos, &self.sin)?));
        }
        let dims = x.dims();
        let dx = match x.dtype() {
            DType::F32 => with_elements::<f32, _>(g, |g| self.run(g, dims, true))
                .and_then(|v| Tensor::from_vec(v, dims, x.device()))?,
            DType::F64 => with_elements::<f64, _>(g, |g| self.run(g, dims, true))
                .and_then(|v| Tensor::from_vec(v, dims, x.device()))?,
            dt => candle_core::bail!("atomrl-rope: unsupported dtype {dt:?}"),
        };
        Ok(Some(dx))
    }
}

/// Whether the fused kernel takes `x [N, H, L, d]` with tables `[N, 1, L, d]` of its dtype.
pub(crate) fn rope_fits(x: &Tensor, cos: &Tensor, sin: &Tensor) -> bool {
    match (x.dims4(), cos.dims4()) {
        (Ok((n, _, l, d)), Ok(c)) => {
            c == (n, 1, l, d)
                && sin.dims() == cos.dims()
                && d % 2 == 0
                && cos.dtype() == x.dtype()
                && sin.dtype() == x.dtype()
                && cos.device().same_device(x.device())
                && sin.device().same_device(x.device())
        }
        _ => false,
    }
}

/// Rotary embeddings of `x [N, H, L, d]` with `cos`, `sin [N, 1, L, d]` (one dtype and device:
/// f32/f64 on the CPU, f32/bf16/f16 on CUDA; see [`rope_fits`]) → `[N, H, L, d]`.
pub(crate) fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    x.contiguous()?.apply_op1(Rope {
        cos: cos.contiguous()?,
        sin: sin.contiguous()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testing::{agree, var};

    #[test]
    fn matches_the_tensor_op_form() {
        for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 1e-6)] {
            let x = var(&[2, 3, 4, 8], dtype, 11);
            // Tables that differ between halves, so that a swapped index fails.
            let cos = var(&[2, 1, 4, 8], dtype, 12).as_tensor().detach();
            let sin = var(&[2, 1, 4, 8], dtype, 13).as_tensor().detach();
            assert!(rope_fits(x.as_tensor(), &cos, &sin));
            agree(
                &[x],
                |t| rope(&t[0], &cos, &sin),
                |t| crate::ops::apply_rope(&t[0], &cos, &sin),
                tol,
            );
        }
    }
}
