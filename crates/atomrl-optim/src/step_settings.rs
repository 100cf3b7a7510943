//! [`StepSettings`]: how one optimizer step is accumulated and clipped.

/// How one optimizer step is taken: its micro-batches, the data-parallel workers that run
/// them, gradient-norm clipping and the learning rate.
///
/// ```
/// use atomrl_optim::StepSettings;
/// let s = StepSettings { accumulation: 2, workers: 1, max_grad_norm: 1.0, lr: 0.0 };
/// let at = StepSettings { lr: 1e-5, ..s };
/// assert_eq!((at.accumulation, at.lr), (2, 1e-5));
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepSettings {
    /// Micro-batches per optimizer step (per worker).
    pub accumulation: usize,
    /// Data-parallel workers of this process: each runs its share of the micro-batches on its
    /// own thread.
    pub workers: usize,
    /// Gradient-norm clipping threshold (0 = off).
    pub max_grad_norm: f64,
    /// Learning rate of this step.
    pub lr: f64,
}
