//! Gradient checkpointing: a decoder layer whose activations are recomputed in backward.
//!
//! Candle has no checkpointing, so it is built from a custom op. The layer's output is
//! `y = layer(x)` computed without a graph, plus `recompute(packed)`, where `packed` is the
//! layer input and the layer's trainable tensors flattened into one vector (a differentiable
//! `cat`, so the gradients of its pieces flow back to `x` and to the weights). The op's
//! forward returns zeros; its backward re-runs the layer with a graph on the saved input and
//! weights and returns the vector-Jacobian product `∂(layer(x) · g)/∂packed`. Only the
//! layer inputs (and one packed copy of each layer's trainable weights) stay alive between
//! forward and backward, instead of every intermediate activation.

use candle_core::{
    backend::BackendStorage, backprop::GradStore, CpuStorage, CudaStorage, CustomOp1, Layout,
    Result, Shape, Tensor, Var,
};

use crate::input::AttentionBias;
use crate::linear::{cpu_zeros, cuda_zeros};
use crate::network::DecoderLayer;

/// The recompute op of one layer application.
struct Recompute {
    /// The layer as built (its tracked tensors are replaced by the saved values in backward).
    layer: DecoderLayer,
    rope: (Tensor, Tensor),
    bias: AttentionBias,
    /// Shape of the layer input (and output).
    x_shape: Shape,
    /// Shapes of the packed trainable tensors, in [`DecoderLayer::map`] order.
    param_shapes: Vec<Shape>,
    train: bool,
}

impl CustomOp1 for Recompute {
    fn name(&self) -> &'static str {
        "atomrl-checkpoint-recompute"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, _layout: &Layout) -> Result<(CpuStorage, Shape)> {
        Ok((
            cpu_zeros(&self.x_shape, storage.dtype())?,
            self.x_shape.clone(),
        ))
    }

    fn cuda_fwd(&self, storage: &CudaStorage, _layout: &Layout) -> Result<(CudaStorage, Shape)> {
        let zeros = cuda_zeros(storage, &self.x_shape, storage.dtype())?;
        Ok((zeros, self.x_shape.clone()))
    }

    fn bwd(&self, arg: &Tensor, _res: &Tensor, grad_res: &Tensor) -> Result<Option<Tensor>> {
        let packed = arg.detach();
        let mut offset = 0;
        let mut take = |shape: &Shape| -> Result<Var> {
            let n = shape.elem_count();
            let t = packed.narrow(0, offset, n)?.reshape(shape)?;
            offset += n;
            Var::from_tensor(&t)
        };
        let x = take(&self.x_shape)?;
        let params = self
            .param_shapes
            .iter()
            .map(&mut take)
            .collect::<Result<Vec<_>>>()?;
        let mut next = params.iter();
        let layer = self.layer.map(&mut |t| {
            if t.track_op() {
                match next.next() {
                    Some(v) => Ok(v.as_tensor().clone()),
                    None => candle_core::bail!("checkpoint: fewer saved tensors than tracked"),
                }
            } else {
                Ok(t.clone())
            }
        })?;
        let (cos, sin) = &self.rope;
        let y = layer.forward(x.as_tensor(), (cos, sin), &self.bias, None, self.train, 0)?;
        let grads = (y * grad_res.detach())?.sum_all()?.backward()?;
        let grad_of = |v: &Var, grads: &GradStore| -> Result<Tensor> {
            match grads.get(v.as_tensor()) {
                Some(g) => g.flatten_all(),
                None => v.as_tensor().zeros_like()?.flatten_all(),
            }
        };
        let mut pieces = vec![grad_of(&x, &grads)?];
        for p in &params {
            pieces.push(grad_of(p, &grads)?);
        }
        Ok(Some(Tensor::cat(&pieces, 0)?))
    }
}

/// `layer(x)` whose activations are recomputed in backward (see the module docs). Falls back
/// to the plain layer when nothing needs a gradient.
///
/// # Errors
/// A LoRA adapter with dropout in training mode (the recomputation would draw another mask).
pub(crate) fn forward(
    layer: &DecoderLayer,
    x: &Tensor,
    rope: (&Tensor, &Tensor),
    bias: &AttentionBias,
    train: bool,
) -> Result<Tensor> {
    let mut tracked = Vec::new();
    let detached = layer.map(&mut |t| {
        if t.track_op() {
            tracked.push(t.clone());
        }
        Ok(t.detach())
    })?;
    if tracked.is_empty() && !x.track_op() {
        return layer.forward(x, rope, bias, None, train, 0);
    }
    if train && layer.has_dropout() {
        candle_core::bail!(
            "gradient checkpointing does not support LoRA dropout in training mode \
             (set lora dropout to 0 or turn checkpointing off)"
        );
    }
    let y = detached.forward(&x.detach(), rope, bias, None, train, 0)?;
    let mut flat = vec![x.flatten_all()?];
    for t in &tracked {
        flat.push(t.flatten_all()?);
    }
    let packed = Tensor::cat(&flat, 0)?;
    let op = Recompute {
        layer: layer.clone(),
        rope: (rope.0.clone(), rope.1.clone()),
        bias: bias.clone(),
        x_shape: x.shape().clone(),
        param_shapes: tracked.iter().map(|t| t.shape().clone()).collect(),
        train,
    };
    y + packed.apply_op1(op)?
}
