//! Linear layers: trainable, frozen (no weight-gradient work) and with a LoRA adapter.

use candle_core::{
    backend::{BackendDevice, BackendStorage},
    CpuStorage, CudaStorage, CustomOp1, DType, Layout, Result, Shape, Tensor,
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

/// A linear layer `y = x Wᵀ + b` with Hugging Face's `[out, in]` weight layout.
#[derive(Debug, Clone)]
pub(crate) struct Linear {
    pub weight: Tensor,
    pub bias: Option<Tensor>,
    /// Whether `weight` (and `bias`) is frozen: no gradient work is spent on it.
    pub frozen: bool,
    pub lora: Option<LoraAdapter>,
}

impl Linear {
    /// The same layer with `f` applied to each tensor (weight, bias, LoRA A, LoRA B).
    pub fn map(&self, f: &mut TensorFn<'_>) -> Result<Self> {
        Ok(Self {
            weight: f(&self.weight)?,
            bias: self.bias.as_ref().map(&mut *f).transpose()?,
            frozen: self.frozen,
            lora: self.lora.as_ref().map(|l| l.map(f)).transpose()?,
        })
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
            (Some(b), None) => Ok((frozen_matmul(x, &self.weight)?, Some(b.clone()))),
            _ => Ok((self.forward(x, false)?, None)),
        }
    }

    /// Applies the layer to `x [.., in]`; `train` turns on the adapter's dropout.
    pub fn forward(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        let dims = x.dims().to_vec();
        let in_features = *dims.last().unwrap_or(&0);
        let rows = x.elem_count() / in_features.max(1);
        let x2 = x.reshape((rows, in_features))?;
        let mut y = if self.frozen {
            frozen_matmul(&x2, &self.weight)?
        } else {
            x2.matmul(&self.weight.t()?)?
        };
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
