//! Rotary position embeddings (rotate-half layout) as one graph node:
//! `y = x · cos + rotate_half(x) · sin`, with `rotate_half([x₁, x₂]) = [−x₂, x₁]`.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp1, DType, Layout, Result, Shape, Tensor};

use super::{for_rows, with_elements, Real};

struct Rope {
    cos: Tensor,
    sin: Tensor,
}

/// Where a RoPE operand `[N, H, L, d]` lies in memory. Token-major is `[N, L, H, d]`, read as
/// its `transpose(1, 2)`: the layout the q and k projections make, so the forward reads them
/// without a transposing copy and the backward writes their gradient back in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RopeLayout {
    HeadMajor,
    TokenMajor,
}

impl RopeLayout {
    /// The layout of `l` and its elements' range, where the kernels read it in place.
    pub(crate) fn of(l: &Layout) -> Option<(Self, usize, usize)> {
        if let Some((a, b)) = l.contiguous_offsets() {
            return Some((Self::HeadMajor, a, b));
        }
        let &[n, h, len, d] = l.dims() else {
            return None;
        };
        let start = l.start_offset();
        (l.stride() == [len * h * d, d, h * d, 1]).then_some((
            Self::TokenMajor,
            start,
            start + n * h * len * d,
        ))
    }

    /// The offset of head-major row `r` (`(n · H + h) · L + pos`).
    fn row_offset(self, r: usize, heads: usize, l: usize, d: usize) -> usize {
        match self {
            Self::HeadMajor => r * d,
            Self::TokenMajor => {
                let (n, h, pos) = (r / (heads * l), (r / l) % heads, r % l);
                ((n * l + pos) * heads + h) * d
            }
        }
    }

    /// The head-major row of this layout's `m`-th row in memory.
    fn head_major_row(self, m: usize, heads: usize, l: usize) -> usize {
        match self {
            Self::HeadMajor => m,
            Self::TokenMajor => {
                let (n, pos, h) = (m / (l * heads), (m / heads) % l, m % heads);
                (n * heads + h) * l + pos
            }
        }
    }
}

/// `y = x·cos + R(x)·sin` (`back = false`) or its transpose applied to `g`,
/// `dx = g·cos + Rᵀ(g·sin)` with `Rᵀ([u₁, u₂]) = [u₂, −u₁]` (`back = true`), for rows of
/// `x [N, H, L, d]` against tables `[N, 1, L, d]`; `x` and the result lie as `layouts` say.
fn rotate<T: Real>(
    x: &[T],
    (cos, sin): (&[T], &[T]),
    dims: &[usize],
    back: bool,
    (x_layout, y_layout): (RopeLayout, RopeLayout),
) -> Vec<T> {
    let (heads, l, d) = (dims[1], dims[2], dims[3]);
    let half = d / 2;
    let mut out = vec![T::zero(); x.len()];
    for_rows(&mut out, d, |m, y| {
        let r = y_layout.head_major_row(m, heads, l);
        let (n, i) = (r / (heads * l), r % l);
        let t = (n * l + i) * d;
        let xo = x_layout.row_offset(r, heads, l, d);
        let (c, s, xr) = (&cos[t..t + d], &sin[t..t + d], &x[xo..xo + d]);
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
    fn run<T: Real>(
        &self,
        x: &[T],
        dims: &[usize],
        back: bool,
        layouts: (RopeLayout, RopeLayout),
    ) -> Result<Vec<T>> {
        with_elements::<T, _>(&self.cos, |cos| {
            with_elements::<T, _>(&self.sin, |sin| {
                Ok(rotate(x, (cos, sin), dims, back, layouts))
            })
        })
    }
}

/// `x`'s layout and elements' range, which [`rope`] made sure the kernels read in place.
fn input_layout(l: &Layout) -> Result<(RopeLayout, usize, usize)> {
    RopeLayout::of(l).ok_or_else(|| {
        candle_core::Error::Msg(format!(
            "atomrl-rope: x must be [N, H, L, d] row-major or token-major, got strides {:?}",
            l.stride()
        ))
    })
}

impl CustomOp1 for Rope {
    fn name(&self) -> &'static str {
        "atomrl-rope"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let dims = layout.dims();
        let (lie, a, b) = input_layout(layout)?;
        let layouts = (lie, RopeLayout::HeadMajor);
        let out = match storage {
            CpuStorage::F32(v) => CpuStorage::F32(self.run(&v[a..b], dims, false, layouts)?),
            CpuStorage::F64(v) => CpuStorage::F64(self.run(&v[a..b], dims, false, layouts)?),
            _ => candle_core::bail!("atomrl-rope: unsupported dtype {:?}", storage.dtype()),
        };
        Ok((out, layout.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        storage: &candle_core::CudaStorage,
        layout: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let (lie, a, b) = input_layout(layout)?;
        let layouts = (lie, RopeLayout::HeadMajor);
        let out = super::cuda::rope(
            storage,
            (layout, a, b),
            &self.cos,
            &self.sin,
            false,
            layouts,
        )?;
        Ok((out, layout.shape().clone()))
    }

    /// The gradient lies as `x` did: token-major for the projections' view, so their
    /// backward reads it without a copy.
    fn bwd(&self, x: &Tensor, _res: &Tensor, g: &Tensor) -> Result<Option<Tensor>> {
        let (lie, ..) = input_layout(x.layout())?;
        let layouts = (RopeLayout::HeadMajor, lie);
        #[cfg(feature = "cuda")]
        if x.device().is_cuda() {
            return Ok(Some(super::cuda::rope_bwd(
                g, &self.cos, &self.sin, layouts,
            )?));
        }
        let dims = x.dims();
        let dx = match x.dtype() {
            DType::F32 => with_elements::<f32, _>(g, |g| self.run(g, dims, true, layouts))
                .and_then(|v| laid_out(v, dims, lie, x.device()))?,
            DType::F64 => with_elements::<f64, _>(g, |g| self.run(g, dims, true, layouts))
                .and_then(|v| laid_out(v, dims, lie, x.device()))?,
            dt => candle_core::bail!("atomrl-rope: unsupported dtype {dt:?}"),
        };
        Ok(Some(dx))
    }
}

/// The tensor `[N, H, L, d]` whose elements `v` lie as `lie` says.
pub(crate) fn laid_out<T: candle_core::WithDType>(
    v: Vec<T>,
    dims: &[usize],
    lie: RopeLayout,
    device: &candle_core::Device,
) -> Result<Tensor> {
    match (lie, dims) {
        (RopeLayout::TokenMajor, &[n, h, l, d]) => {
            Tensor::from_vec(v, (n, l, h, d), device)?.transpose(1, 2)
        }
        _ => Tensor::from_vec(v, dims, device),
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
/// f32/f64 on the CPU, f32/bf16/f16 on CUDA; see [`rope_fits`]) → `[N, H, L, d]`, row-major.
/// `x` is read in place when row-major or token-major (the `transpose(1, 2)` of a row-major
/// `[N, L, H, d]`, as the attention's projections give it), and its gradient lies as it did.
pub(crate) fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let x = match RopeLayout::of(x.layout()) {
        Some(_) => x.clone(),
        None => x.contiguous()?,
    };
    x.apply_op1(Rope {
        cos: cos.contiguous()?,
        sin: sin.contiguous()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testing::{agree, flat, var};

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

    /// The attention's projections `[N, L, H, d]` go in as their `transpose(1, 2)`: read where
    /// they lie, the gradient written back in their layout, the values and gradients those of
    /// the tensor-op form.
    #[test]
    fn a_token_major_input_is_read_in_place_and_gets_its_gradient_in_its_layout() {
        for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 1e-6)] {
            let x = var(&[2, 4, 3, 8], dtype, 21);
            let cos = var(&[2, 1, 4, 8], dtype, 22).as_tensor().detach();
            let sin = var(&[2, 1, 4, 8], dtype, 23).as_tensor().detach();
            let view = x.as_tensor().transpose(1, 2).unwrap();
            assert!(matches!(
                RopeLayout::of(view.layout()),
                Some((RopeLayout::TokenMajor, 0, 192))
            ));
            let y = rope(&view, &cos, &sin).unwrap();
            assert!(y.is_contiguous(), "the result is head-major");
            let op = Rope {
                cos: cos.clone(),
                sin: sin.clone(),
            };
            let dx = op.bwd(&view, &y, &y).unwrap().unwrap();
            assert_eq!(dx.dims(), view.dims());
            assert!(matches!(
                RopeLayout::of(dx.layout()),
                Some((RopeLayout::TokenMajor, ..))
            ));
            agree(
                std::slice::from_ref(&x),
                |t| rope(&t[0].transpose(1, 2)?, &cos, &sin),
                |t| crate::ops::apply_rope_ops(&t[0].transpose(1, 2)?, &cos, &sin),
                tol,
            );
            // Bit for bit what copying the view to head-major first gave.
            let w = var(&[2, 3, 4, 8], dtype, 24);
            let run = |copy: bool| {
                let v = x.as_tensor().transpose(1, 2).unwrap();
                let v = if copy { v.contiguous().unwrap() } else { v };
                let y = rope(&v, &cos, &sin).unwrap();
                let g = (&y * w.as_tensor()).unwrap().sum_all().unwrap();
                let g = g.backward().unwrap();
                (flat(&y), flat(g.get(x.as_tensor()).unwrap()))
            };
            assert_eq!(run(false), run(true));
        }
    }

    #[test]
    fn other_strides_are_copied_first() {
        let x = var(&[2, 3, 8, 4], DType::F32, 31);
        let cos = var(&[2, 1, 4, 8], DType::F32, 32).as_tensor().detach();
        let sin = var(&[2, 1, 4, 8], DType::F32, 33).as_tensor().detach();
        let view = x.as_tensor().transpose(2, 3).unwrap();
        assert!(RopeLayout::of(view.layout()).is_none());
        agree(
            &[x],
            |t| rope(&t[0].transpose(2, 3)?, &cos, &sin),
            |t| crate::ops::apply_rope_ops(&t[0].transpose(2, 3)?, &cos, &sin),
            1e-6,
        );
    }
}
