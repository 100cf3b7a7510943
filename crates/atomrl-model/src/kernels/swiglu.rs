//! The SwiGLU gate as one graph node: `y = silu(gate) · up`, `silu(g) = g / (1 + e^(−g))`.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp2, DType, Layout, Result, Shape, Tensor};

use super::{slice, with_elements, Real};

struct SwiGlu;

/// `e^(−g)` of every gate element (vectorised for f32: [`Real::exp_in_place`]).
fn exp_neg<T: Real>(gate: &[T]) -> Vec<T> {
    let mut e: Vec<T> = gate.iter().map(|&g| -g).collect();
    T::exp_in_place(&mut e);
    e
}

/// `silu(g) · u` with `silu(g) = g / (1 + e^(−g))`, as candle computes silu.
fn forward<T: Real>(gate: &[T], up: &[T]) -> Vec<T> {
    let mut out = exp_neg(gate);
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = g / (*o + T::one()) * u;
    }
    out
}

/// `d gate = G · up · σ(g)(1 + g(1 − σ(g)))`, `d up = G · silu(g)`.
fn backward<T: Real>(gate: &[T], up: &[T], grad: &[T]) -> (Vec<T>, Vec<T>) {
    let mut dg = exp_neg(gate);
    let du: Vec<T> = dg
        .iter()
        .zip(gate)
        .zip(grad)
        .map(|((&e, &g), &gr)| gr * (g / (e + T::one())))
        .collect();
    for (((d, &g), &u), &gr) in dg.iter_mut().zip(gate).zip(up).zip(grad) {
        let s = T::one() / (*d + T::one());
        *d = gr * u * (s * (T::one() + g * (T::one() - s)));
    }
    (dg, du)
}

impl CustomOp2 for SwiGlu {
    fn name(&self) -> &'static str {
        "atomrl-swiglu"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        if l1.shape() != l2.shape() {
            candle_core::bail!(
                "atomrl-swiglu: gate {:?} and up {:?} differ",
                l1.dims(),
                l2.dims()
            );
        }
        let out = match s1.dtype() {
            DType::F32 => CpuStorage::F32(forward(slice(s1, l1)?, slice(s2, l2)?)),
            DType::F64 => CpuStorage::F64(forward(slice(s1, l1)?, slice(s2, l2)?)),
            dt => candle_core::bail!("atomrl-swiglu: unsupported dtype {dt:?}"),
        };
        Ok((out, l1.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        if l1.shape() != l2.shape() {
            candle_core::bail!(
                "atomrl-swiglu: gate {:?} and up {:?} differ",
                l1.dims(),
                l2.dims()
            );
        }
        let out = super::cuda::swiglu_fwd(s1, l1, s2, l2)?;
        Ok((out, l1.shape().clone()))
    }

    fn bwd(
        &self,
        gate: &Tensor,
        up: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        #[cfg(feature = "cuda")]
        if gate.device().is_cuda() {
            let (dg, du) = super::cuda::swiglu_bwd(gate, up, grad)?;
            return Ok((Some(dg), Some(du)));
        }
        fn run<T: Real>(
            gate: &Tensor,
            up: &Tensor,
            grad: &Tensor,
        ) -> Result<(Option<Tensor>, Option<Tensor>)> {
            let (dg, du) = with_elements::<T, _>(gate, |gate| {
                with_elements::<T, _>(up, |up| {
                    with_elements::<T, _>(grad, |grad| Ok(backward(gate, up, grad)))
                })
            })?;
            Ok((
                Some(Tensor::from_vec(dg, gate.shape(), gate.device())?),
                Some(Tensor::from_vec(du, up.shape(), up.device())?),
            ))
        }
        match gate.dtype() {
            DType::F32 => run::<f32>(gate, up, grad),
            DType::F64 => run::<f64>(gate, up, grad),
            dt => candle_core::bail!("atomrl-swiglu: unsupported dtype {dt:?}"),
        }
    }
}

/// `silu(gate) · up` of two `[.., I]` tensors (one dtype: f32/f64 on the CPU, f32/bf16/f16 on
/// CUDA) → `[.., I]`.
pub(crate) fn swiglu(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    gate.contiguous()?.apply_op2(&up.contiguous()?, SwiGlu)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testing::{agree, var};

    #[test]
    fn matches_the_tensor_op_form() {
        for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 1e-6)] {
            let g = var(&[3, 4, 10], dtype, 21);
            let u = var(&[3, 4, 10], dtype, 22);
            agree(
                &[g, u],
                |t| swiglu(&t[0], &t[1]),
                |t| t[0].silu()? * &t[1],
                tol,
            );
        }
    }
}
