//! RMSNorm as one graph node: `y = w · x / sqrt(mean(x²) + eps)` over the last dimension.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp2, DType, Layout, Result, Shape, Tensor};

use super::{for_rows, slice, with_elements, Real};

struct RmsNorm {
    eps: f64,
    /// CUDA half precision: round the normalised value before the weight multiplies it (the
    /// tensor-op form's and transformers' roundings; the training forward), or round once
    /// (candle's forward-only kernel; the generation view).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    round_xhat: bool,
}

/// `1 / sqrt(mean(row²) + eps)`.
fn inv_rms<T: Real>(row: &[T], eps: f64) -> T {
    let sum = row.iter().fold(T::zero(), |acc, &v| acc + v * v);
    let ms = sum / T::from(row.len()).unwrap_or_else(T::one);
    T::one() / (ms + T::from(eps).unwrap_or_else(T::zero)).sqrt()
}

fn forward<T: Real>(x: &[T], w: &[T], eps: f64) -> Vec<T> {
    let h = w.len();
    let mut out = vec![T::zero(); x.len()];
    for_rows(&mut out, h, |r, y| {
        let xr = &x[r * h..(r + 1) * h];
        let inv = inv_rms(xr, eps);
        for ((y, &xv), &wv) in y.iter_mut().zip(xr).zip(w) {
            *y = wv * (xv * inv);
        }
    });
    out
}

/// `(dx, dw)` of `sum(y · g)`: with `x̂ = x · inv`, `dx = inv · (g·w − x̂ · mean(g·w·x̂))` and
/// `dw = Σ_rows g · x̂`.
fn backward<T: Real>(x: &[T], w: &[T], g: &[T], eps: f64, want_dw: bool) -> (Vec<T>, Vec<T>) {
    let h = w.len();
    let hf = T::from(h).unwrap_or_else(T::one);
    let invs: Vec<T> = x.chunks(h).map(|r| inv_rms(r, eps)).collect();
    let mut dx = vec![T::zero(); x.len()];
    for_rows(&mut dx, h, |r, d| {
        let (xr, gr, inv) = (&x[r * h..(r + 1) * h], &g[r * h..(r + 1) * h], invs[r]);
        let dot = xr
            .iter()
            .zip(gr)
            .zip(w)
            .fold(T::zero(), |acc, ((&xv, &gv), &wv)| {
                acc + gv * wv * (xv * inv)
            });
        let mean = dot / hf;
        for (((d, &xv), &gv), &wv) in d.iter_mut().zip(xr).zip(gr).zip(w) {
            *d = inv * (gv * wv - xv * inv * mean);
        }
    });
    let mut dw = Vec::new();
    if want_dw {
        dw = vec![T::zero(); h];
        for ((xr, gr), &inv) in x.chunks(h).zip(g.chunks(h)).zip(&invs) {
            for ((d, &xv), &gv) in dw.iter_mut().zip(xr).zip(gr) {
                *d += gv * (xv * inv);
            }
        }
    }
    (dx, dw)
}

impl CustomOp2 for RmsNorm {
    fn name(&self) -> &'static str {
        "atomrl-rms-norm"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let out = match s1.dtype() {
            DType::F32 => CpuStorage::F32(forward(slice(s1, l1)?, slice(s2, l2)?, self.eps)),
            DType::F64 => CpuStorage::F64(forward(slice(s1, l1)?, slice(s2, l2)?, self.eps)),
            dt => candle_core::bail!("atomrl-rms-norm: unsupported dtype {dt:?}"),
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
        let out = super::cuda::rms_norm_fwd(s1, l1, s2, l2, self.eps, self.round_xhat)?;
        Ok((out, l1.shape().clone()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _res: &Tensor,
        g: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        #[cfg(feature = "cuda")]
        if x.device().is_cuda() {
            let (dx, dw) = super::cuda::rms_norm_bwd(x, w, g, self.eps, w.track_op())?;
            return Ok((Some(dx), dw));
        }
        fn run<T: Real>(
            op: &RmsNorm,
            x: &Tensor,
            w: &Tensor,
            g: &Tensor,
        ) -> Result<(Option<Tensor>, Option<Tensor>)> {
            let want_dw = w.track_op();
            let (dx, dw) = with_elements::<T, _>(x, |x| {
                with_elements::<T, _>(w, |w| {
                    with_elements::<T, _>(g, |g| Ok(backward(x, w, g, op.eps, want_dw)))
                })
            })?;
            let dx = Tensor::from_vec(dx, x.shape(), x.device())?;
            let dw = if want_dw {
                Some(Tensor::from_vec(dw, w.shape(), w.device())?)
            } else {
                None
            };
            Ok((Some(dx), dw))
        }
        match x.dtype() {
            DType::F32 => run::<f32>(self, x, w, g),
            DType::F64 => run::<f64>(self, x, w, g),
            dt => candle_core::bail!("atomrl-rms-norm: unsupported dtype {dt:?}"),
        }
    }
}

/// RMSNorm of `x [.., H]` with `weight [H]` (one dtype: f32/f64 on the CPU, f32/bf16/f16 on
/// CUDA) → `[.., H]`.
pub(crate) fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> Result<Tensor> {
    let op = RmsNorm {
        eps,
        round_xhat: true,
    };
    x.contiguous()?.apply_op2(&weight.contiguous()?, op)
}

/// [`rms_norm`] rounding once in half precision on CUDA (`round(w · x / rms)`, as candle's
/// forward-only kernel, which the generation view used before): for inference, where it is
/// the more accurate form and keeps earlier releases' decoding numbers.
pub(crate) fn rms_norm_rounding_once(x: &Tensor, weight: &Tensor, eps: f64) -> Result<Tensor> {
    let op = RmsNorm {
        eps,
        round_xhat: false,
    };
    x.contiguous()?.apply_op2(&weight.contiguous()?, op)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testing::{agree, var};
    use candle_core::D;

    fn reference(x: &Tensor, w: &Tensor, eps: f64) -> Result<Tensor> {
        let ms = x.sqr()?.mean_keepdim(D::Minus1)?;
        x.broadcast_div(&(ms + eps)?.sqrt()?)?.broadcast_mul(w)
    }

    #[test]
    fn matches_the_tensor_op_form() {
        for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 2e-5)] {
            let x = var(&[3, 5, 16], dtype, 1);
            let w = var(&[16], dtype, 2);
            agree(
                &[x, w],
                |t| rms_norm(&t[0], &t[1], 1e-6),
                |t| reference(&t[0], &t[1], 1e-6),
                tol,
            );
        }
    }

    #[test]
    fn a_frozen_weight_gets_no_gradient_work() {
        let x = var(&[4, 8], DType::F32, 3);
        let w = var(&[8], DType::F32, 4).as_tensor().detach();
        let y = rms_norm(x.as_tensor(), &w, 1e-6).unwrap();
        let grads = y.sum_all().unwrap().backward().unwrap();
        assert!(grads.get(x.as_tensor()).is_some());
        assert!(grads.get(&w).is_none());
    }
}
