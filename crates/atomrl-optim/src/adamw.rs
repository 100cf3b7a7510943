//! AdamW with decoupled weight decay and state that can be saved and restored exactly.
//!
//! Hand-written rather than `candle_nn::AdamW` because exact resume needs the first and second
//! moments and the step count, which candle-nn keeps private.

use std::collections::HashMap;
use std::path::Path;

use atomrl_core::{CandleContext, Error, Result};

use super::adamw_kernel::UpdateScalars;
use candle_core::{DType, Tensor, Var};

const FUNC: &str = "AdamW";

/// AdamW hyper-parameters (PyTorch's defaults but the learning rate).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWConfig {
    /// β₁, decay of the first moment.
    pub beta1: f64,
    /// β₂, decay of the second moment.
    pub beta2: f64,
    /// ε added to `sqrt(v̂)`.
    pub eps: f64,
    /// Decoupled weight decay λ: `θ ← θ − lr·λ·θ` before the Adam update.
    pub weight_decay: f64,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        Self {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
        }
    }
}

/// AdamW over named variables (`torch.optim.AdamW` semantics, bias-corrected moments).
#[derive(Debug)]
pub struct AdamW {
    params: Vec<(String, Var)>,
    m: Vec<Tensor>,
    v: Vec<Tensor>,
    step: u64,
    config: AdamWConfig,
    /// Update f32 parameters in place (`adamw_kernel`: CPU, and CUDA with the `cuda` feature);
    /// off only to test against the tensor-op form.
    in_place: bool,
}

impl AdamW {
    /// An optimizer over `params` (name, variable), moments at zero.
    ///
    /// # Errors
    /// When a zero tensor cannot be allocated.
    ///
    /// ```
    /// use atomrl_optim::{AdamW, AdamWConfig};
    /// use candle_core::{Device, Var};
    /// let w = Var::new(&[1f32, -1.0], &Device::Cpu)?;
    /// let mut opt = AdamW::new(vec![("w".into(), w.clone())], AdamWConfig::default())?;
    /// let loss = w.as_tensor().sqr()?.sum_all()?;
    /// let grads = loss.backward()?;
    /// opt.step(&|name: &str| (name == "w").then(|| grads.get(w.as_tensor()).cloned()).flatten(), 0.1)?;
    /// let after = w.as_tensor().to_vec1::<f32>()?;
    /// assert!((after[0] - 0.9).abs() < 1e-6 && (after[1] + 0.9).abs() < 1e-6); // first Adam step moves by lr
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new(params: Vec<(String, Var)>, config: AdamWConfig) -> Result<Self> {
        let zeros = |p: &Var| {
            p.as_tensor()
                .zeros_like()
                .and_then(|t| t.to_dtype(DType::F32))
                .ctx(FUNC)
        };
        let m = params
            .iter()
            .map(|(_, p)| zeros(p))
            .collect::<Result<Vec<_>>>()?;
        let v = params
            .iter()
            .map(|(_, p)| zeros(p))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            params,
            m,
            v,
            step: 0,
            config,
            in_place: true,
        })
    }

    /// Number of updates applied so far.
    pub fn step_count(&self) -> u64 {
        self.step
    }

    /// The parameters, by name.
    pub fn params(&self) -> &[(String, Var)] {
        &self.params
    }

    /// One update with learning rate `lr`; `grad(name)` gives each parameter's gradient
    /// (`None`: the parameter is skipped, its moments unchanged).
    ///
    /// # Errors
    /// A gradient whose shape differs from its parameter's.
    pub fn step(&mut self, grad: &dyn Fn(&str) -> Option<Tensor>, lr: f64) -> Result<()> {
        self.step_scaled(grad, lr, None)
    }

    /// [`step`](AdamW::step) on the gradients scaled by `grad_scale` (`None`: unscaled): the
    /// clipping factor of [`Gradients::clip_factor`](crate::Gradients::clip_factor), applied
    /// as each gradient is read instead of in a pass of its own over every gradient. The
    /// result has the bits of [`Gradients::clip_global_norm`](crate::Gradients::clip_global_norm)
    /// followed by [`step`](AdamW::step).
    ///
    /// # Errors
    /// A gradient whose shape differs from its parameter's.
    ///
    /// ```
    /// use atomrl_optim::{AdamW, AdamWConfig};
    /// use candle_core::{Device, Var};
    /// let w = Var::new(&[1f32, -1.0], &Device::Cpu)?;
    /// let mut opt = AdamW::new(vec![("w".into(), w.clone())], AdamWConfig::default())?;
    /// let grads = w.as_tensor().sqr()?.sum_all()?.backward()?; // gradient [2, -2]
    /// opt.step_scaled(&|_: &str| grads.get(w.as_tensor()).cloned(), 0.1, Some(0.25))?;
    /// // Adam's first step moves each parameter by lr, whatever the gradient's scale.
    /// assert!((w.as_tensor().to_vec1::<f32>()?[0] - 0.9).abs() < 1e-6);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn step_scaled(
        &mut self,
        grad: &dyn Fn(&str) -> Option<Tensor>,
        lr: f64,
        grad_scale: Option<f64>,
    ) -> Result<()> {
        let _p = self
            .params
            .first()
            .map(|(_, v)| atomrl_core::profile::phase("optimizer.step", v.device()));
        self.step += 1;
        let c = self.config;
        let t = self.step as i32;
        let bias1 = 1.0 - c.beta1.powi(t);
        let bias2 = 1.0 - c.beta2.powi(t);
        let scalars = UpdateScalars::new(&c, lr, bias1, bias2, grad_scale);
        // The parameters the in-place kernel updates, gathered so that a GPU updates them all
        // in one launch.
        let mut in_place: Vec<(usize, Tensor)> = Vec::new();
        for (i, (name, var)) in self.params.iter().enumerate() {
            let Some(g) = grad(name) else { continue };
            if g.dims() != var.as_tensor().dims() {
                return Err(Error::shape(
                    FUNC,
                    name,
                    format!("{:?}", var.as_tensor().dims()),
                    g.dims(),
                ));
            }
            let g = g.to_dtype(DType::F32).ctx(FUNC)?;
            let theta = var.as_tensor();
            if self.in_place && crate::inplace::applies(&[theta, &g, &self.m[i], &self.v[i]]) {
                in_place.push((i, g.contiguous().ctx(FUNC)?));
                continue;
            }
            let g = match grad_scale {
                Some(s) => (&g * s).ctx(FUNC)?,
                None => g,
            };
            let m = ((&self.m[i] * c.beta1).ctx(FUNC)? + (&g * (1.0 - c.beta1)).ctx(FUNC)?)
                .ctx(FUNC)?;
            let v = ((&self.v[i] * c.beta2).ctx(FUNC)?
                + (g.sqr().ctx(FUNC)? * (1.0 - c.beta2)).ctx(FUNC)?)
            .ctx(FUNC)?;
            let m_hat = (&m / bias1).ctx(FUNC)?;
            let v_hat = (&v / bias2).ctx(FUNC)?;
            let update = (m_hat / (v_hat.sqrt().ctx(FUNC)? + c.eps).ctx(FUNC)?).ctx(FUNC)?;
            let theta = var.as_tensor().to_dtype(DType::F32).ctx(FUNC)?;
            let decayed = if c.weight_decay > 0.0 {
                (&theta * (1.0 - lr * c.weight_decay)).ctx(FUNC)?
            } else {
                theta
            };
            let next = (decayed - (update * lr).ctx(FUNC)?).ctx(FUNC)?;
            var.set(&next.to_dtype(var.dtype()).ctx(FUNC)?).ctx(FUNC)?;
            self.m[i] = m;
            self.v[i] = v;
        }
        let groups: Vec<crate::adamw_kernel::Group<'_>> = in_place
            .iter()
            .map(|(i, g)| [self.params[*i].1.as_tensor(), &self.m[*i], &self.v[*i], g])
            .collect();
        crate::adamw_kernel::update_all(&groups, scalars).ctx(FUNC)
    }

    /// Saves the moments (`m.NAME`, `v.NAME`) and the step count to a safetensors file.
    ///
    /// # Errors
    /// [`Error::File`] when the file cannot be written.
    pub fn save(&self, path: &Path) -> Result<()> {
        let mut tensors = HashMap::new();
        for (i, (name, _)) in self.params.iter().enumerate() {
            tensors.insert(format!("m.{name}"), self.m[i].clone());
            tensors.insert(format!("v.{name}"), self.v[i].clone());
        }
        let step = Tensor::new(&[self.step as i64], &candle_core::Device::Cpu).ctx(FUNC)?;
        tensors.insert("step".to_string(), step);
        candle_core::safetensors::save(&tensors, path).map_err(|e| Error::file(path.display(), e))
    }

    /// Restores the moments and the step count saved by [`AdamW::save`] (parameters are
    /// matched by name; every parameter must be present).
    ///
    /// # Errors
    /// [`Error::File`] for a missing or malformed file or a missing parameter.
    pub fn load(&mut self, path: &Path) -> Result<()> {
        let device = self
            .params
            .first()
            .map(|(_, v)| v.device().clone())
            .unwrap_or(candle_core::Device::Cpu);
        let tensors = candle_core::safetensors::load(path, &device)
            .map_err(|e| Error::file(path.display(), e))?;
        let get = |key: &str| {
            tensors
                .get(key)
                .cloned()
                .ok_or_else(|| Error::file(path.display(), format!("missing `{key}`")))
        };
        let step: Vec<i64> = get("step")?
            .to_vec1()
            .map_err(|e| Error::file(path.display(), e))?;
        self.step = step.first().copied().unwrap_or(0).max(0) as u64;
        for (i, (name, var)) in self.params.iter().enumerate() {
            let (m, v) = (get(&format!("m.{name}"))?, get(&format!("v.{name}"))?);
            if m.dims() != var.as_tensor().dims() || v.dims() != var.as_tensor().dims() {
                return Err(Error::file(
                    path.display(),
                    format!(
                        "moments of `{name}` have shape {:?}, expected {:?}",
                        m.dims(),
                        var.as_tensor().dims()
                    ),
                ));
            }
            self.m[i] = m;
            self.v[i] = v;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn params(seed: f32) -> Vec<(String, Var)> {
        let w: Vec<f32> = (0..60).map(|i| (i as f32 * 0.37 + seed).sin()).collect();
        let b: Vec<f32> = (0..6).map(|i| (i as f32 - 2.5) * 0.1).collect();
        let dev = &Device::Cpu;
        vec![
            ("w".into(), Var::from_vec(w, (6, 10), dev).unwrap()),
            ("b".into(), Var::from_vec(b, 6, dev).unwrap()),
        ]
    }

    #[test]
    fn the_in_place_kernel_equals_the_tensor_op_form_bit_for_bit() {
        let config = AdamWConfig {
            weight_decay: 0.05,
            ..AdamWConfig::default()
        };
        let (pa, pb) = (params(0.3), params(0.3));
        let mut fused = AdamW::new(pa.clone(), config).unwrap();
        let mut plain = AdamW::new(pb.clone(), config).unwrap();
        plain.in_place = false;
        for step in 0..4 {
            // Gradients that vary by step, with a transposed (non-contiguous) one.
            let grad = |name: &str| -> Option<Tensor> {
                let k = step as f64 + 1.0;
                match name {
                    "w" => Tensor::arange(0f32, 60.0, &Device::Cpu)
                        .and_then(|t| t.reshape((10, 6)))
                        .and_then(|t| t.t())
                        .and_then(|t| (t * (0.01 * k))?.cos())
                        .ok(),
                    _ => Tensor::new(&[0.5f32, -1.0, 0.0, 2.0, -0.25, 1e-3], &Device::Cpu)
                        .and_then(|t| t * k)
                        .ok(),
                }
            };
            fused.step(&grad, 1e-2).unwrap();
            plain.step(&grad, 1e-2).unwrap();
        }
        for (((_, a), (_, b)), (_, start)) in pa.iter().zip(&pb).zip(&params(0.3)) {
            let a: Vec<f32> = a.as_tensor().flatten_all().unwrap().to_vec1().unwrap();
            let b: Vec<f32> = b.as_tensor().flatten_all().unwrap().to_vec1().unwrap();
            let start: Vec<f32> = start.as_tensor().flatten_all().unwrap().to_vec1().unwrap();
            assert_ne!(a, start, "the parameters moved");
            let (ab, bb): (Vec<u32>, Vec<u32>) = (
                a.iter().map(|x| x.to_bits()).collect(),
                b.iter().map(|x| x.to_bits()).collect(),
            );
            assert_eq!(ab, bb);
        }
        for i in 0..2 {
            assert_eq!(bits(&fused.m[i]), bits(&plain.m[i]));
            assert_eq!(bits(&fused.v[i]), bits(&plain.v[i]));
        }
    }

    fn bits(t: &Tensor) -> Vec<u32> {
        t.flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap()
            .iter()
            .map(|x| x.to_bits())
            .collect()
    }

    #[test]
    fn a_scaled_step_equals_clipping_then_stepping_bit_for_bit() {
        use crate::Gradients;
        // Large enough that the update is split over threads; one small parameter besides.
        let big = 4 * 65_536 + 37;
        let make = || -> Vec<(String, Var)> {
            let w: Vec<f32> = (0..big).map(|i| (i as f32 * 0.013).sin()).collect();
            vec![
                ("w".into(), Var::from_vec(w, big, &Device::Cpu).unwrap()),
                (
                    "b".into(),
                    Var::new(&[0.5f32, -0.25, 2.0], &Device::Cpu).unwrap(),
                ),
            ]
        };
        let config = AdamWConfig {
            weight_decay: 0.01,
            ..AdamWConfig::default()
        };
        let (clipped, scaled, plain) = (make(), make(), make());
        let mut by_clip = AdamW::new(clipped.clone(), config).unwrap();
        let mut by_scale = AdamW::new(scaled.clone(), config).unwrap();
        let mut by_ops = AdamW::new(plain.clone(), config).unwrap();
        by_ops.in_place = false;
        let grads_of = |params: &[(String, Var)], step: usize| -> Gradients {
            // loss = Σ w·cos(w·k) + Σ b³: non-trivial gradients that change with the step.
            let k = 1.0 + step as f64;
            let (w, b) = (params[0].1.as_tensor(), params[1].1.as_tensor());
            let loss = ((w * (w * k).unwrap().cos().unwrap())
                .unwrap()
                .sum_all()
                .unwrap()
                + b.powf(3.0).unwrap().sum_all().unwrap())
            .unwrap();
            let mut g = Gradients::new();
            g.accumulate(&loss.backward().unwrap(), params).unwrap();
            g
        };
        for step in 0..3 {
            let mut a = grads_of(&clipped, step);
            let norm_a = a.clip_global_norm(1.0).unwrap();
            by_clip.step(&|n| a.get(n), 1e-2).unwrap();
            let b = grads_of(&scaled, step);
            let (norm_b, factor) = b.clip_factor(1.0).unwrap();
            assert!(factor.is_some(), "the test clips");
            assert_eq!(norm_a.to_bits(), norm_b.to_bits());
            by_scale.step_scaled(&|n| b.get(n), 1e-2, factor).unwrap();
            let c = grads_of(&plain, step);
            let (_, factor) = c.clip_factor(1.0).unwrap();
            by_ops.step_scaled(&|n| c.get(n), 1e-2, factor).unwrap();
        }
        for i in 0..2 {
            let want = bits(clipped[i].1.as_tensor());
            assert_eq!(bits(scaled[i].1.as_tensor()), want, "{}", clipped[i].0);
            assert_eq!(bits(plain[i].1.as_tensor()), want, "{}", clipped[i].0);
            assert_eq!(bits(&by_scale.m[i]), bits(&by_clip.m[i]));
            assert_eq!(bits(&by_scale.v[i]), bits(&by_clip.v[i]));
            assert_eq!(bits(&by_ops.v[i]), bits(&by_clip.v[i]));
        }
    }
}
