//! Linear layers: trainable, frozen (no weight-gradient work) and with a LoRA adapter.

use std::sync::{Arc, OnceLock};

use candle_core::{
    backend::{BackendDevice, BackendStorage},
    CpuStorage, CudaStorage, CustomOp1, DType, Layout, Result, Shape, Tensor, WithDType,
};

/// A function applied to every tensor of a layer, in a fixed order (casting, detaching,
/// collecting or replacing the weights).
pub(crate) type TensorFn<'a> = dyn FnMut(&Tensor) -> Result<Tensor> + 'a;

/// Zeros of `shape` and `dtype` on the CPU.
pub(crate) fn cpu_zeros(shape: &Shape, dtype: DType) -> Result<CpuStorage> {
    let n = shape.elem_count();
    Ok(match dtype {
        DType::F32 => CpuStorage::F32(vec![0.0; n]),
        DType::F64 => CpuStorage::F64(vec![0.0; n]),
        DType::BF16 => CpuStorage::BF16(vec![half::bf16::ZERO; n]),
        DType::F16 => CpuStorage::F16(vec![half::f16::ZERO; n]),
        dt => candle_core::bail!("atomrl-model: unsupported dtype {dt:?}"),
    })
}

/// Zeros of `shape` and `dtype` on the CUDA device of `like` (without the `cuda` feature this
/// is candle's placeholder backend, never reached).
pub(crate) fn cuda_zeros(like: &CudaStorage, shape: &Shape, dtype: DType) -> Result<CudaStorage> {
    like.device().zeros_impl(shape, dtype)
}

/// The gradient path of `x @ Wᵀ` for a frozen `W`: its forward returns zeros of the output's
/// shape (added to the product computed on detached inputs), its backward returns `g @ W`
/// only. Candle's matmul backward always computes both operands' gradients; this op skips the
/// weight's, which is the expensive half of a frozen layer's backward.
struct FrozenWeightGrad {
    weight: Tensor,
}

impl FrozenWeightGrad {
    fn out_shape(&self, layout: &Layout) -> Result<Shape> {
        let mut dims = layout.dims().to_vec();
        if let Some(last) = dims.last_mut() {
            *last = self.weight.dim(0)?;
        }
        Ok(Shape::from(dims))
    }
}

impl CustomOp1 for FrozenWeightGrad {
    fn name(&self) -> &'static str {
        "atomrl-frozen-weight-grad"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let shape = self.out_shape(layout)?;
        Ok((cpu_zeros(&shape, storage.dtype())?, shape))
    }

    fn cuda_fwd(&self, storage: &CudaStorage, layout: &Layout) -> Result<(CudaStorage, Shape)> {
        let shape = self.out_shape(layout)?;
        Ok((cuda_zeros(storage, &shape, storage.dtype())?, shape))
    }

    fn bwd(&self, _arg: &Tensor, _res: &Tensor, grad_res: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(grad_res.matmul(&self.weight)?))
    }
}

/// `x2 [rows, in] @ wᵀ` where `w [out, in]` is frozen: the gradient reaches `x2` but no work is
/// spent on `w`'s gradient (on the CPU and CUDA; Metal falls back to a detached weight, whose
/// gradient candle computes and drops).
pub(crate) fn frozen_matmul(x2: &Tensor, w: &Tensor) -> Result<Tensor> {
    let w = w.detach();
    if !x2.track_op() || x2.device().is_metal() {
        return x2.matmul(&w.t()?);
    }
    let y = x2.detach().matmul(&w.t()?)?;
    y + x2.apply_op1(FrozenWeightGrad { weight: w })?
}

/// `w [rows, cols]` as a new row-major `[cols, rows]` tensor. On the CPU by tiles: candle's
/// copy of a transposed view walks it one element at a time, which took 12 ms for the 4m
/// bench's 3.7M projection weights (2-core Intel Xeon), more than its batch-1 prefill.
pub(crate) fn transposed_copy(w: &Tensor) -> Result<Tensor> {
    if !w.device().is_cpu() {
        return w.t()?.contiguous();
    }
    match w.dtype() {
        DType::F32 => tiled_transpose::<f32>(w),
        DType::F64 => tiled_transpose::<f64>(w),
        DType::BF16 => tiled_transpose::<half::bf16>(w),
        DType::F16 => tiled_transpose::<half::f16>(w),
        _ => w.t()?.contiguous(),
    }
}

/// [`transposed_copy`] of a CPU tensor, 32 × 32 elements at a time (both tiles stay in L1).
fn tiled_transpose<T: WithDType>(w: &Tensor) -> Result<Tensor> {
    const TILE: usize = 32;
    let (rows, cols) = w.dims2()?;
    let src = w.flatten_all()?.to_vec1::<T>()?;
    let mut dst = vec![T::zero(); rows * cols];
    for r0 in (0..rows).step_by(TILE) {
        for c0 in (0..cols).step_by(TILE) {
            for r in r0..(r0 + TILE).min(rows) {
                for c in c0..(c0 + TILE).min(cols) {
                    dst[c * rows + r] = src[r * cols + c];
                }
            }
        }
    }
    Tensor::from_vec(dst, (cols, rows), w.device())
}

/// A LoRA adapter `Δy = scale · dropout(x) @ Aᵀ @ Bᵀ` with `A [r, in]`, `B [out, r]`.
#[derive(Debug, Clone)]
pub(crate) struct LoraAdapter {
    pub a: Tensor,
    pub b: Tensor,
    pub scale: f64,
    pub dropout: f32,
}

impl LoraAdapter {
    fn map(&self, f: &mut TensorFn<'_>) -> Result<Self> {
        Ok(Self {
            a: f(&self.a)?,
            b: f(&self.b)?,
            scale: self.scale,
            dropout: self.dropout,
        })
    }
}

/// Row counts for which [`Linear::weight_t`] is read instead of `weight`. gemm wants the
/// operand it walks by rows of the output's columns in column-major order, which `Wᵀ` of a
/// row-major `[out, in]` weight is not: it copies (packs) the whole weight on every call, and
/// for the few rows of a decode step that copy costs as much as the product. One row takes
/// gemm's matrix-vector path, which reads `Wᵀ` directly (and sums in another order), and from
/// a few hundred rows up the packing is paid back by the rows. 2-core Intel Xeon (AVX-512),
/// one thread, `[rows, 128] · [128, 512]`: 64 rows 86 → 62 µs, 8 rows 33 → 8 µs, 800 rows
/// 858 → 909 µs, 1 row 7.7 → 6.7 µs (`[rows, 512] · [512, 128]` at 1 row: 4.6 → 9.2 µs).
const TRANSPOSED_ROWS: std::ops::Range<usize> = 2..512;

/// A linear layer `y = x Wᵀ + b` with Hugging Face's `[out, in]` weight layout.
#[derive(Debug, Clone)]
pub(crate) struct Linear {
    pub weight: Tensor,
    pub bias: Option<Tensor>,
    /// Whether `weight` (and `bias`) is frozen: no gradient work is spent on it.
    pub frozen: bool,
    pub lora: Option<LoraAdapter>,
    /// `weight` transposed into its own row-major `[in, out]` buffer, for the products of a
    /// few rows without a graph (decode steps; see [`Linear::keep_transposed`]): made by the
    /// first such product and shared by the layer's clones. The products equal those with
    /// `Wᵀ` up to float rounding: gemm sums each dot product in order either way at most
    /// shapes (the embedded model's decode steps give the same bits), but for narrow layers
    /// or two rows it reads `Wᵀ` with dot-product kernels that sum in another order.
    pub weight_t: Option<Arc<OnceLock<Tensor>>>,
    /// Products of a few rows without a graph computed as `(W · xᵀ)ᵀ` on the CPU (see
    /// [`Linear::transpose_products`]): no copy of the weight is kept or packed.
    pub product_t: bool,
}

impl Linear {
    /// The same layer with `f` applied to each tensor (weight, bias, LoRA A, LoRA B).
    pub fn map(&self, f: &mut TensorFn<'_>) -> Result<Self> {
        Ok(Self {
            weight: f(&self.weight)?,
            bias: self.bias.as_ref().map(&mut *f).transpose()?,
            frozen: self.frozen,
            lora: self.lora.as_ref().map(|l| l.map(f)).transpose()?,
            // The mapped weight is another tensor: a transposed copy of the old one is stale.
            weight_t: None,
            product_t: self.product_t,
        })
    }

    /// Lets products that gain from it use [`Linear::weight_t`] (a copy of the weight's size,
    /// made when first needed: a batch of one row never makes it). Only for a layer whose
    /// weight no longer changes while it is used: a view for decoding.
    pub fn keep_transposed(&mut self) {
        self.weight_t = Some(Arc::default());
    }

    /// Lets products that gain from it run as `(W · xᵀ)ᵀ` ([`Linear::product_t`]) instead: the
    /// row-major weight is gemm's left operand as it is, and only the small `[out, rows]`
    /// result is transposed back. No memory beyond the result, so it suits weights too large
    /// to copy. Qwen2.5-0.5B, 64 rows, 2-core Intel Xeon (`xtask bench --decode-ops`, the
    /// transpose back included): gate/up 5.60 → 3.86 ms, down 9.89 → 3.93 ms, LM head 242.9 →
    /// 172.6 ms (docs/performance.md item 23).
    pub fn transpose_products(&mut self) {
        self.product_t = true;
    }

    /// `x2 [rows, in] · Wᵀ` from [`Linear::weight_t`] or as [`Linear::product_t`] says, where
    /// that is allowed and faster.
    fn transposed_product(&self, x2: &Tensor) -> Result<Option<Tensor>> {
        let rows = x2.dim(0)?;
        if rows == 1 && !x2.track_op() && !self.weight.track_op() {
            return crate::kernels::row_split_gemv(x2, &self.weight);
        }
        if x2.track_op() || !TRANSPOSED_ROWS.contains(&rows) {
            return Ok(None);
        }
        if self.product_t && x2.device().is_cpu() {
            let yt = self.weight.matmul(&x2.t()?)?;
            return transposed_copy(&yt).map(Some);
        }
        let Some(cell) = &self.weight_t else {
            return Ok(None);
        };
        let wt = match cell.get() {
            Some(wt) => wt.clone(),
            None => {
                let wt = transposed_copy(&self.weight)?;
                // Another clone may have made it meanwhile: the same values either way.
                let _ = cell.set(wt.clone());
                wt
            }
        };
        x2.matmul(&wt).map(Some)
    }

    /// `x2 [rows, in] · Wᵀ`, with no gradient work on `W` when it is frozen.
    fn product(&self, x2: &Tensor) -> Result<Tensor> {
        if let Some(y) = self.transposed_product(x2)? {
            return Ok(y);
        }
        if self.frozen {
            frozen_matmul(x2, &self.weight)
        } else {
            x2.matmul(&self.weight.t()?)
        }
    }

    /// Whether the adapter applies dropout in training mode.
    pub fn has_dropout(&self) -> bool {
        self.lora.as_ref().is_some_and(|l| l.dropout > 0.0)
    }

    /// `x [R, in]` through the layer without its bias, and the bias apart (`None` when there
    /// is none, or when a LoRA adapter is attached: then the output is the whole
    /// [`Linear::forward`], in its order of additions). For kernels that add the bias
    /// themselves (the static decode step's `decode_qkv`). Inference only (no dropout).
    pub fn split_bias(&self, x: &Tensor) -> Result<(Tensor, Option<Tensor>)> {
        match (&self.bias, &self.lora) {
            (Some(b), None) => {
                let y = match self.transposed_product(x)? {
                    Some(y) => y,
                    None => frozen_matmul(x, &self.weight)?,
                };
                Ok((y, Some(b.clone())))
            }
            _ => Ok((self.forward(x, false)?, None)),
        }
    }

    /// Applies the layer to `x [.., in]`; `train` turns on the adapter's dropout.
    pub fn forward(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        let dims = x.dims().to_vec();
        let in_features = *dims.last().unwrap_or(&0);
        let rows = x.elem_count() / in_features.max(1);
        let x2 = x.reshape((rows, in_features))?;
        let mut y = self.product(&x2)?;
        if let Some(b) = &self.bias {
            y = y.broadcast_add(b)?;
        }
        if let Some(lora) = &self.lora {
            let h = if train && lora.dropout > 0.0 {
                candle_nn::ops::dropout(&x2, lora.dropout)?
            } else {
                x2.clone()
            };
            let delta = h.matmul(&lora.a.t()?)?.matmul(&lora.b.t()?)?;
            y = (y + delta.affine(lora.scale, 0.0)?)?;
        }
        let mut out_dims = dims;
        if let Some(last) = out_dims.last_mut() {
            *last = y.dim(1)?;
        }
        y.reshape(out_dims)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use candle_core::Device;

    #[test]
    fn products_as_w_times_x_transposed_equal_the_plain_product() {
        let dev = Device::Cpu;
        let (inp, out) = (96, 200);
        let plain = Linear {
            weight: Tensor::randn(0f32, 1.0, (out, inp), &dev).unwrap(),
            bias: Some(Tensor::randn(0f32, 1.0, out, &dev).unwrap()),
            frozen: true,
            lora: None,
            weight_t: None,
            product_t: false,
        };
        let mut transposed = plain.clone();
        transposed.transpose_products();
        // One row keeps gemm's matrix-vector path; 2..512 rows take (W · xᵀ)ᵀ.
        for rows in [1, 2, 7, 64, 300] {
            let x = Tensor::randn(0f32, 1.0, (rows, inp), &dev).unwrap();
            let a = plain.forward(&x, false).unwrap();
            let b = transposed.forward(&x, false).unwrap();
            assert_eq!(a.dims(), b.dims());
            let a: Vec<f32> = a.flatten_all().unwrap().to_vec1().unwrap();
            let b: Vec<f32> = b.flatten_all().unwrap().to_vec1().unwrap();
            for (p, q) in a.iter().zip(&b) {
                assert!(
                    (p - q).abs() <= 1e-4 * (1.0 + p.abs()),
                    "{rows} rows: {p} vs {q}"
                );
            }
        }
        // A product on a graph (training) keeps the plain form and its gradients.
        let x = candle_core::Var::randn(0f32, 1.0, (4, inp), &dev).unwrap();
        let y = transposed.forward(x.as_tensor(), false).unwrap();
        assert!(y.sum_all().unwrap().backward().unwrap().get(&x).is_some());
    }

    #[test]
    fn the_tiled_transpose_equals_candles() {
        // Shapes around the tile size, and every CPU float dtype.
        for (rows, cols) in [(1, 1), (3, 70), (32, 32), (33, 65), (128, 40)] {
            let w = Tensor::randn(0f32, 1.0, (rows, cols), &Device::Cpu).unwrap();
            for dtype in [DType::F32, DType::F64, DType::BF16, DType::F16] {
                let w = w.to_dtype(dtype).unwrap();
                let ours = transposed_copy(&w).unwrap();
                let candle = w.t().unwrap().contiguous().unwrap();
                assert_eq!(ours.dims(), &[cols, rows]);
                let (a, b) = (ours.to_dtype(DType::F64), candle.to_dtype(DType::F64));
                let a: Vec<f64> = a.unwrap().flatten_all().unwrap().to_vec1().unwrap();
                let b: Vec<f64> = b.unwrap().flatten_all().unwrap().to_vec1().unwrap();
                assert_eq!(a, b, "{rows} × {cols} {dtype:?}");
            }
        }
    }
}
