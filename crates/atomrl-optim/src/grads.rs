//! Gradient accumulation over micro-batches and global-norm clipping.

use std::collections::BTreeMap;

use atomrl_dist::Collective;

use atomrl_core::{CandleContext, Error, Result};
use candle_core::backprop::GradStore;
use candle_core::{DType, Tensor, Var};

const FUNC: &str = "Gradients";

/// Gradients of named parameters summed over micro-batches.
///
/// Kept in name order, so that [`global_norm`](Gradients::global_norm) adds the parameters'
/// squared norms in the same order in every process: data-parallel ranks must compute the
/// same clipping factor to the last bit.
#[derive(Debug, Default)]
pub struct Gradients {
    sums: BTreeMap<String, Tensor>,
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

    /// Adds `other`'s gradients to these (`self + other`, element by element, in f32); a
    /// parameter only one of them has keeps that gradient. Data-parallel workers each sum
    /// their own micro-batches, then the workers' sums are added in worker order.
    ///
    /// # Errors
    /// When two gradients of a parameter have different shapes.
    ///
    /// ```
    /// use atomrl_optim::Gradients;
    /// use candle_core::{Device, Var};
    /// let w = Var::new(&[3f32, 4.0], &Device::Cpu)?;
    /// let params = [("w".to_string(), w.clone())];
    /// let store = w.as_tensor().sum_all()?.backward()?; // gradient [1, 1]
    /// let (mut a, mut b) = (Gradients::new(), Gradients::new());
    /// a.accumulate(&store, &params)?;
    /// b.accumulate(&store, &params)?;
    /// a.add(b)?;
    /// assert_eq!(a.get("w").unwrap().to_vec1::<f32>()?, vec![2.0, 2.0]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn add(&mut self, other: Gradients) -> Result<()> {
        for (name, g) in other.sums {
            let sum = match self.sums.remove(&name) {
                Some(prev) => (prev + g).ctx(FUNC)?,
                None => g,
            };
            self.sums.insert(name, sum);
        }
        Ok(())
    }

    /// Sums these gradients over the ranks of `comm` (in rank order, bit-identical on every
    /// rank; see [`Collective::all_reduce_sum_f32`]): one all-reduce of every parameter's
    /// gradient, in the order of `params`, followed by one flag per parameter, so that a
    /// parameter gets a gradient when any rank had one (a rank without one adds zeros) and
    /// none when no rank did. A no-op for a world of one rank.
    ///
    /// # Errors
    /// A failed collective ([`Error::Value`] naming the rank's error), a tensor read failure.
    ///
    /// ```
    /// use atomrl_dist::SingleProcess;
    /// use atomrl_optim::Gradients;
    /// use candle_core::{Device, Var};
    /// let w = Var::new(&[3f32, 4.0], &Device::Cpu)?;
    /// let params = [("w".to_string(), w.clone())];
    /// let mut g = Gradients::new();
    /// g.accumulate(&w.as_tensor().sum_all()?.backward()?, &params)?;
    /// g.all_reduce_sum(&params, &SingleProcess)?; // one rank: unchanged
    /// assert_eq!(g.get("w").unwrap().to_vec1::<f32>()?, vec![1.0, 1.0]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn all_reduce_sum(
        &mut self,
        params: &[(String, Var)],
        comm: &dyn Collective,
    ) -> Result<()> {
        if comm.world_size() <= 1 {
            return Ok(());
        }
        let sizes: Vec<usize> = params
            .iter()
            .map(|(_, v)| v.as_tensor().elem_count())
            .collect();
        let total: usize = sizes.iter().sum();
        let mut flat = Vec::with_capacity(total + params.len());
        for ((name, _), &n) in params.iter().zip(&sizes) {
            match self.sums.get(name) {
                Some(g) => flat.extend(g.flatten_all().and_then(|g| g.to_vec1::<f32>()).ctx(FUNC)?),
                None => flat.resize(flat.len() + n, 0.0),
            }
        }
        flat.extend(
            params
                .iter()
                .map(|(name, _)| f32::from(u8::from(self.sums.contains_key(name)))),
        );
        comm.all_reduce_sum_f32(&mut flat)
            .map_err(|e| Error::value(FUNC, "gradients", "an all-reduce over every rank", e))?;
        let mut offset = 0;
        for (i, ((name, var), &n)) in params.iter().zip(&sizes).enumerate() {
            let piece = &flat[offset..offset + n];
            offset += n;
            if flat[total + i] > 0.0 {
                let t = var.as_tensor();
                let g = Tensor::from_slice(piece, t.dims(), t.device()).ctx(FUNC)?;
                self.sums.insert(name.clone(), g);
            } else {
                self.sums.remove(name);
            }
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
