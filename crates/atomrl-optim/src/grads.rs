//! Gradient accumulation over micro-batches and global-norm clipping.

use std::collections::HashMap;

use atomrl_core::{CandleContext, Result};
use candle_core::backprop::GradStore;
use candle_core::{DType, Tensor, Var};

const FUNC: &str = "Gradients";

/// Gradients of named parameters summed over micro-batches.
#[derive(Debug, Default)]
pub struct Gradients {
    sums: HashMap<String, Tensor>,
}

impl Gradients {
    /// No gradients yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds the gradients of one backward pass for `params`.
    ///
    /// # Errors
    /// When two gradients of a parameter cannot be added (shape mismatch).
    pub fn accumulate(&mut self, store: &GradStore, params: &[(String, Var)]) -> Result<()> {
        for (name, var) in params {
            let Some(g) = store.get(var.as_tensor()) else {
                continue;
            };
            let g = g.to_dtype(DType::F32).ctx(FUNC)?;
            let sum = match self.sums.remove(name) {
                Some(prev) => (prev + g).ctx(FUNC)?,
                None => g,
            };
            self.sums.insert(name.clone(), sum);
        }
        Ok(())
    }

    /// The summed gradient of `name`.
    pub fn get(&self, name: &str) -> Option<Tensor> {
        self.sums.get(name).cloned()
    }

    /// `sqrt(Σ ‖g‖²)` over every parameter (computed in f64; NaN/Inf propagate).
    ///
    /// # Errors
    /// A tensor read failure.
    pub fn global_norm(&self) -> Result<f64> {
        let mut total = 0.0f64;
        for g in self.sums.values() {
            let s: f32 = g
                .sqr()
                .and_then(|x| x.sum_all())
                .and_then(|x| x.to_scalar())
                .ctx(FUNC)?;
            total += s as f64;
        }
        Ok(total.sqrt())
    }

    /// Scales every gradient so that the global norm is at most `max_norm` (PyTorch's
    /// `clip_grad_norm_`: factor `max_norm / (norm + 1e-6)` when `norm > max_norm`); returns
    /// the norm before clipping. `max_norm = 0` disables clipping.
    ///
    /// # Errors
    /// A tensor operation failure.
    ///
    /// ```
    /// use atomrl_optim::Gradients;
    /// use candle_core::{Device, Var};
    /// let w = Var::new(&[3f32, 4.0], &Device::Cpu)?;
    /// let store = w.as_tensor().sum_all()?.backward()?; // gradient [1, 1]
    /// let mut g = Gradients::new();
    /// g.accumulate(&store, &[("w".into(), w.clone())])?;
    /// g.accumulate(&store, &[("w".into(), w)])?;       // two micro-batches: [2, 2]
    /// let norm = g.clip_global_norm(1.0)?;
    /// assert!((norm - 8f64.sqrt()).abs() < 1e-6);
    /// assert!((g.global_norm()? - 1.0).abs() < 1e-5);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn clip_global_norm(&mut self, max_norm: f64) -> Result<f64> {
        let norm = self.global_norm()?;
        if max_norm > 0.0 && norm.is_finite() && norm > max_norm {
            let scale = max_norm / (norm + 1e-6);
            for g in self.sums.values_mut() {
                *g = (&*g * scale).ctx(FUNC)?;
            }
        }
        Ok(norm)
    }
}
