//! The AdamW update in place on f32 tensors (CPU, and CUDA with the `cuda` feature: the
//! multi-tensor kernel of atomrl-core's `cuda/optim.cu`, every parameter in one launch): one
//! pass over memory and no allocation, split over candle's threads on the CPU
//! ([`crate::cpu_loops`]).
//!
//! The tensor-op form allocates a new tensor for each of its ~12 ops per parameter; at
//! Qwen2.5-0.5B's size that is ~24 GB of fresh buffers per step, each page-faulted in and
//! zeroed by the kernel (`docs/performance.md`). The update here computes the same f32
//! arithmetic in the same order as the tensor-op form (candle's `x * a` is `x · a + 0`), so the
//! two agree bit for bit (tested in `adamw.rs`). Each element is computed by itself, so one
//! pass reading the parameter, both moments and the gradient and writing the first three gives
//! the bits of three passes (first moment, second moment, parameter) with 7 parameter-sized
//! reads and writes instead of 10; the clipping factor is applied to the gradient as it is read,
//! where clipping first scaled every gradient in place (2 more).
//!
//! Candle's in-place custom ops give one tensor's storage mutably, and this update writes
//! three. On the CPU the ops below nest: the first moment's op, holding its storage, runs the
//! second moment's op, which runs the parameter's op with both moments' elements in hand. Each
//! level locks a different tensor, so no lock is taken twice. (On CUDA the multi-tensor launch
//! reads every buffer's address from a table instead; `cuda.rs`.)

use std::cell::Cell;

use candle_core::{CpuStorage, InplaceOp1, InplaceOp2, Layout, Result, Tensor};

use crate::inplace::{f32s, f32s_mut};

/// AdamW's hyper-parameters and this step's factors, in f32 as both the CPU loop and the CUDA
/// kernel use them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct UpdateScalars {
    /// β₁ and `1 − β₁`.
    pub beta1: f32,
    pub one_minus_beta1: f32,
    /// β₂ and `1 − β₂`.
    pub beta2: f32,
    pub one_minus_beta2: f32,
    /// `1 / (1 − β₁ᵗ)` and `1 / (1 − β₂ᵗ)`.
    pub inv1: f32,
    pub inv2: f32,
    pub eps: f32,
    pub lr: f32,
    /// `1 − lr·wd` when there is weight decay.
    pub decay: Option<f32>,
    /// The gradient-clipping factor, when the gradient is to be scaled first.
    pub grad_scale: Option<f32>,
}

impl UpdateScalars {
    /// The scalars of one step: `bias1 = 1 − β₁ᵗ`, `bias2 = 1 − β₂ᵗ`.
    pub fn new(
        config: &crate::AdamWConfig,
        lr: f64,
        bias1: f64,
        bias2: f64,
        grad_scale: Option<f64>,
    ) -> Self {
        Self {
            beta1: config.beta1 as f32,
            one_minus_beta1: (1.0 - config.beta1) as f32,
            beta2: config.beta2 as f32,
            one_minus_beta2: (1.0 - config.beta2) as f32,
            inv1: (1.0 / bias1) as f32,
            inv2: (1.0 / bias2) as f32,
            eps: config.eps as f32,
            lr: lr as f32,
            decay: (config.weight_decay > 0.0).then_some((1.0 - lr * config.weight_decay) as f32),
            grad_scale: grad_scale.map(|s| s as f32),
        }
    }

    /// One element's update, in the tensor-op form's order: the gradient scaled
    /// (`g · s + 0`), `m ← (m·β₁ + 0) + (g·(1 − β₁) + 0)`, `v ← (v·β₂ + 0) + (g²·(1 − β₂) + 0)`,
    /// `θ ← decayed − (u·lr + 0)` with `u = (m·inv1 + 0) / (sqrt(v·inv2 + 0)·1 + ε)` and
    /// `decayed = θ·(1 − lr·wd) + 0` (or `θ`).
    #[inline(always)]
    fn apply(&self, t: &mut f32, m: &mut f32, v: &mut f32, g: f32) {
        let g = match self.grad_scale {
            Some(s) => g * s + 0.0,
            None => g,
        };
        *m = (*m * self.beta1 + 0.0) + (g * self.one_minus_beta1 + 0.0);
        *v = (*v * self.beta2 + 0.0) + (g * g * self.one_minus_beta2 + 0.0);
        let update = (*m * self.inv1 + 0.0) / ((*v * self.inv2 + 0.0).sqrt() * 1.0 + self.eps);
        let decayed = match self.decay {
            Some(d) => *t * d + 0.0,
            None => *t,
        };
        *t = decayed - (update * self.lr + 0.0);
    }
}

/// One parameter's `[θ, m, v, g]` for [`update_all`].
pub(crate) type Group<'a> = [&'a Tensor; 4];

/// [`update`] of every group of `params`, all on one device: on CUDA in one multi-tensor
/// launch (`atomrl_adamw_multi_f32`) rather than one launch per parameter.
///
/// # Errors
/// As [`update`]; tensors on two devices.
pub(crate) fn update_all(params: &[Group<'_>], scalars: UpdateScalars) -> Result<()> {
    #[cfg(feature = "cuda")]
    if params.first().is_some_and(|p| p[0].device().is_cuda()) {
        return crate::cuda::adamw_multi(params, &scalars);
    }
    for [theta, m, v, g] in params {
        update(theta, m, v, g, scalars)?;
    }
    Ok(())
}

/// Updates `theta`, its moments `m` and `v` in place from the gradient `g` (four contiguous
/// f32 CPU tensors of one length, `m` and `v` distinct from each other and from `theta` and
/// `g`; CUDA tensors go through [`update_all`]).
///
/// # Errors
/// Tensors of other dtypes, layouts, lengths or devices.
pub(crate) fn update(
    theta: &Tensor,
    m: &Tensor,
    v: &Tensor,
    g: &Tensor,
    scalars: UpdateScalars,
) -> Result<()> {
    m.inplace_op1(&WithFirstMoment {
        v,
        theta,
        g,
        scalars,
    })
}

/// The outer level: holds the first moment's storage while the second moment's op runs.
struct WithFirstMoment<'a> {
    v: &'a Tensor,
    theta: &'a Tensor,
    g: &'a Tensor,
    scalars: UpdateScalars,
}

/// The middle level: holds both moments while the parameter's op runs.
struct WithMoments<'a, M> {
    m: Cell<Option<M>>,
    theta: &'a Tensor,
    g: &'a Tensor,
    scalars: UpdateScalars,
}

/// The inner level: the parameter (written) and the gradient (read), the moments in hand.
struct ParamAndMoments<M> {
    moments: Cell<Option<(M, M)>>,
    scalars: UpdateScalars,
}

/// The moments, taken once by the level that uses them.
fn take<T>(cell: &Cell<Option<T>>) -> Result<T> {
    match cell.take() {
        Some(t) => Ok(t),
        None => candle_core::bail!("atomrl-adamw: the moments were used twice"),
    }
}

impl InplaceOp1 for WithFirstMoment<'_> {
    fn name(&self) -> &'static str {
        "atomrl-adamw"
    }

    fn cpu_fwd(&self, s: &mut CpuStorage, l: &Layout) -> Result<()> {
        let m = f32s_mut(s, l)?;
        self.v.inplace_op1(&WithMoments {
            m: Cell::new(Some(m)),
            theta: self.theta,
            g: self.g,
            scalars: self.scalars,
        })
    }
}

impl InplaceOp1 for WithMoments<'_, &mut [f32]> {
    fn name(&self) -> &'static str {
        "atomrl-adamw"
    }

    fn cpu_fwd(&self, s: &mut CpuStorage, l: &Layout) -> Result<()> {
        let m = take(&self.m)?;
        let v = f32s_mut(s, l)?;
        self.theta.inplace_op2(
            self.g,
            &ParamAndMoments {
                moments: Cell::new(Some((m, v))),
                scalars: self.scalars,
            },
        )
    }
}

impl InplaceOp2 for ParamAndMoments<&mut [f32]> {
    fn name(&self) -> &'static str {
        "atomrl-adamw"
    }

    fn cpu_fwd(
        &self,
        s1: &mut CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<()> {
        let (m, v) = take(&self.moments)?;
        let g = f32s(s2, l2)?;
        let theta = f32s_mut(s1, l1)?;
        let n = theta.len();
        if m.len() != n || v.len() != n || g.len() != n {
            candle_core::bail!(
                "atomrl-adamw: {n} parameters, {} and {} moments, {} gradients",
                m.len(),
                v.len(),
                g.len()
            );
        }
        let k = self.scalars;
        crate::cpu_loops::zip4_mut3(theta, m, v, g, |t, m, v, g| k.apply(t, m, v, g));
        Ok(())
    }
}
