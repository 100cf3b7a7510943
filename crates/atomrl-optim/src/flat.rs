//! Parameters and gradients as one flat `f64` vector on the host: what second-order methods
//! working on plain vectors (TRPO's conjugate gradients, [`crate::conjugate_gradient`]) read and
//! write. Exact for f32 parameters; meant for the small models such methods are practical on.

use atomrl_core::shape::flat_f64;
use atomrl_core::{CandleContext, Error, Result};
use candle_core::{Tensor, Var};

use crate::Gradients;

const FUNC: &str = "flat parameters";

/// The values of `vars`, concatenated in their order, flattened row-major.
///
/// # Errors
/// Tensor failures.
///
/// ```
/// use atomrl_optim::{flatten_vars, set_vars_from_flat};
/// use candle_core::{Device, Var};
/// let vars = vec![("a".to_string(), Var::new(&[1f32, 2.0], &Device::Cpu)?), ("b".to_string(), Var::new(&[[3f32]], &Device::Cpu)?)];
/// assert_eq!(flatten_vars(&vars)?, [1.0, 2.0, 3.0]);
/// set_vars_from_flat(&vars, &[4.0, 5.0, 6.0])?;
/// assert_eq!(vars[1].1.as_tensor().to_vec2::<f32>()?, [[6.0]]);
/// assert!(set_vars_from_flat(&vars, &[1.0]).is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn flatten_vars(vars: &[(String, Var)]) -> Result<Vec<f64>> {
    let mut out = Vec::new();
    for (_, v) in vars {
        out.extend(flat_f64(FUNC, v.as_tensor())?);
    }
    Ok(out)
}

/// Sets `vars`, in place and in their order, from a flat vector ([`flatten_vars`]'s layout),
/// each in its own dtype.
///
/// # Errors
/// A vector of another length than the parameters'; tensor failures.
///
/// See [`flatten_vars`] for an example.
pub fn set_vars_from_flat(vars: &[(String, Var)], flat: &[f64]) -> Result<()> {
    let total: usize = vars.iter().map(|(_, v)| v.as_tensor().elem_count()).sum();
    if flat.len() != total {
        return Err(Error::value(
            FUNC,
            "flat",
            format!("{total} values"),
            flat.len(),
        ));
    }
    let mut at = 0;
    for (_, var) in vars {
        let t = var.as_tensor();
        let n = t.elem_count();
        let values: Vec<f32> = flat[at..at + n].iter().map(|&x| x as f32).collect();
        let new = Tensor::from_vec(values, t.dims(), t.device())
            .and_then(|x| x.to_dtype(t.dtype()))
            .ctx(FUNC)?;
        var.set(&new).ctx(FUNC)?;
        at += n;
    }
    Ok(())
}

impl Gradients {
    /// The gradient sums of `vars`, flat in [`flatten_vars`]'s layout; 0 for a parameter
    /// without one.
    ///
    /// # Errors
    /// Tensor failures.
    ///
    /// ```
    /// use atomrl_optim::Gradients;
    /// use candle_core::{Device, Var};
    /// let x = Var::new(&[1f32, 2.0], &Device::Cpu)?;
    /// let y = Var::new(&[5f32], &Device::Cpu)?;
    /// let vars = vec![("x".to_string(), x.clone()), ("y".to_string(), y)];
    /// let store = (x.as_tensor() * 3.0)?.sum_all()?.backward()?;
    /// let mut g = Gradients::new();
    /// g.accumulate(&store, &vars)?;
    /// assert_eq!(g.flat(&vars)?, [3.0, 3.0, 0.0]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn flat(&self, vars: &[(String, Var)]) -> Result<Vec<f64>> {
        let mut out = Vec::new();
        for (name, var) in vars {
            match self.get(name) {
                Some(g) => out.extend(flat_f64(FUNC, &g)?),
                None => out.extend(std::iter::repeat_n(0.0, var.as_tensor().elem_count())),
            }
        }
        Ok(out)
    }
}
