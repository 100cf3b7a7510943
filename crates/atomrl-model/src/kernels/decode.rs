//! Forward-only kernels of the static decode step ([`crate::StaticDecode`]), where a step at a
//! small batch is bound by its kernel count: the residual add with the RMSNorm after it, and
//! SwiGLU over a merged gate/up projection. On CUDA each is one launch (`cuda/model.cu`);
//! elsewhere, and with `ATOMRL_CUDA_FUSED=0`, the tensor ops they replace.

use candle_core::{Result, Tensor, D};

use super::fused_on;

/// `(x + r, rms_norm(x + r) · w)` for `x`, `r [.., H]`, `w [H]` (inference only: no
/// gradient). The sum is rounded to the dtype before the norm reads it, and the norm rounds
/// as the generation view's ([`crate::ops::rms_norm`] with `fused`), as apart; `fused` picks
/// the norm's form off CUDA.
pub(crate) fn add_rms_norm(
    x: &Tensor,
    r: &Tensor,
    w: &Tensor,
    eps: f64,
    fused: bool,
) -> Result<(Tensor, Tensor)> {
    #[cfg(feature = "cuda")]
    if x.device().is_cuda()
        && fused_on(x)
        && atomrl_core::device::decode_merge()
        && r.dtype() == x.dtype()
        && w.dtype() == x.dtype()
    {
        return super::cuda::add_rms_norm(x, r, w, eps);
    }
    let s = (x + r)?;
    let y = crate::ops::rms_norm(&s, w, eps, fused)?;
    Ok((s, y))
}

/// `silu(gate) · up` of `gu [R, 2·I]` holding gate | up in each row → `[R, I]` (inference only).
pub(crate) fn swiglu_packed(gu: &Tensor) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if gu.device().is_cuda() && fused_on(gu) {
        return super::cuda::swiglu_packed(gu);
    }
    let inter = gu.dim(D::Minus1)? / 2;
    let gate = gu.narrow(D::Minus1, 0, inter)?;
    let up = gu.narrow(D::Minus1, inter, inter)?;
    if fused_on(&gate) {
        return super::swiglu(&gate, &up);
    }
    gate.silu()? * up
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::kernels::testing::max_diff;
    use candle_core::{DType, Device};

    fn values(dims: &[usize], seed: u64) -> Tensor {
        let n: usize = dims.iter().product();
        let v: Vec<f32> = (0..n)
            .map(|i| (((i as u64 + 1) * (seed * 2654435761 + 7)) % 997) as f32 / 250.0 - 2.0)
            .collect();
        Tensor::from_vec(v, dims, &Device::Cpu).unwrap()
    }

    #[test]
    fn add_rms_norm_is_the_add_then_the_norm() {
        let (x, r, w) = (values(&[3, 16], 1), values(&[3, 16], 2), values(&[16], 3));
        for fused in [true, false] {
            let (s, y) = add_rms_norm(&x, &r, &w, 1e-6, fused).unwrap();
            let s_ref = (&x + &r).unwrap();
            let y_ref = crate::ops::rms_norm_ops(&s_ref, &w, 1e-6).unwrap();
            assert_eq!(max_diff(&s, &s_ref), 0.0);
            assert!(max_diff(&y, &y_ref) < 1e-5);
        }
    }

    #[test]
    fn swiglu_packed_reads_gate_then_up() {
        let gu = values(&[4, 10], 5);
        let want =
            (gu.narrow(1, 0, 5).unwrap().silu().unwrap() * gu.narrow(1, 5, 5).unwrap()).unwrap();
        let got = swiglu_packed(&gu).unwrap();
        assert_eq!(got.dims(), &[4, 5]);
        assert!(max_diff(&got, &want) < 1e-6);
        let half = swiglu_packed(&gu.to_dtype(DType::F64).unwrap()).unwrap();
        assert!(max_diff(&half.to_dtype(DType::F32).unwrap(), &want) < 1e-6);
    }
}
