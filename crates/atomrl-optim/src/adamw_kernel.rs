//! The AdamW update in place on f32 tensors (CPU, and CUDA with the `cuda` feature: the
//! kernels of atomrl-core's `cuda/optim.cu`): three passes over memory and no allocation, each
//! split over candle's threads on the CPU ([`crate::cpu_loops`]).
//!
//! The tensor-op form allocates a new tensor for each of its ~12 ops per parameter; at
//! Qwen2.5-0.5B's size that is ~24 GB of fresh buffers per step, each page-faulted in and
//! zeroed by the kernel (`docs/performance.md`). These ops compute the same f32 arithmetic in
//! the same order as the tensor-op form (candle's `x * a` is `x · a + 0`), so the two agree
//! bit for bit (tested in `adamw.rs`).

use candle_core::{CpuStorage, InplaceOp2, InplaceOp3, Layout, Result};

use crate::inplace::{f32s, f32s_mut};

/// `moment ← moment · β + f(g) · (1 − β)` with `f(g) = g` (first moment) or `g²` (second).
pub(crate) struct MomentUpdate {
    pub beta: f64,
    pub squared: bool,
}

impl InplaceOp2 for MomentUpdate {
    fn name(&self) -> &'static str {
        "atomrl-adamw-moment"
    }

    fn cpu_fwd(
        &self,
        s1: &mut CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<()> {
        let g = f32s(s2, l2)?;
        let m = f32s_mut(s1, l1)?;
        if m.len() != g.len() {
            candle_core::bail!(
                "AdamW kernel: {} moments for {} gradients",
                m.len(),
                g.len()
            );
        }
        let (b, c) = (self.beta as f32, (1.0 - self.beta) as f32);
        if self.squared {
            crate::cpu_loops::zip_mut(m, g, |m, g| *m = (*m * b + 0.0) + (g * g * c + 0.0));
        } else {
            crate::cpu_loops::zip_mut(m, g, |m, g| *m = (*m * b + 0.0) + (g * c + 0.0));
        }
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
        crate::cuda::adamw_moment(s1, l1, s2, l2, self.beta, self.squared)
    }
}

/// `θ ← θ · (1 − lr·wd) − lr · (m / bias1) / (sqrt(v / bias2) + ε)`.
pub(crate) struct ParamUpdate {
    pub lr: f64,
    pub weight_decay: f64,
    pub bias1: f64,
    pub bias2: f64,
    pub eps: f64,
}

/// [`ParamUpdate`]'s scalars in f32, as both the CPU loop and the CUDA kernel use them.
pub(crate) struct ParamScalars {
    pub inv1: f32,
    pub inv2: f32,
    pub eps: f32,
    pub lr: f32,
    /// `1 − lr·wd` when there is weight decay.
    pub decay: Option<f32>,
}

impl ParamUpdate {
    fn scalars(&self) -> ParamScalars {
        ParamScalars {
            inv1: (1.0 / self.bias1) as f32,
            inv2: (1.0 / self.bias2) as f32,
            eps: self.eps as f32,
            lr: self.lr as f32,
            decay: (self.weight_decay > 0.0).then_some((1.0 - self.lr * self.weight_decay) as f32),
        }
    }
}

impl InplaceOp3 for ParamUpdate {
    fn name(&self) -> &'static str {
        "atomrl-adamw-param"
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
        let (m, v) = (f32s(s2, l2)?, f32s(s3, l3)?);
        let theta = f32s_mut(s1, l1)?;
        if theta.len() != m.len() || theta.len() != v.len() {
            candle_core::bail!("AdamW kernel: parameter and moments differ in size");
        }
        let ParamScalars {
            inv1,
            inv2,
            eps,
            lr,
            decay,
        } = self.scalars();
        crate::cpu_loops::zip3_mut(theta, m, v, |t, m, v| {
            let update = (m * inv1 + 0.0) / ((v * inv2 + 0.0).sqrt() * 1.0 + eps);
            let decayed = match decay {
                Some(d) => *t * d + 0.0,
                None => *t,
            };
            *t = decayed - (update * lr + 0.0);
        });
        Ok(())
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
        crate::cuda::adamw_param(s1, l1, s2, l2, s3, l3, &self.scalars())
    }
}
