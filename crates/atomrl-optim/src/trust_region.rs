//! One whole TRPO update from its pieces ([`conjugate_gradient`], [`trust_region_step`],
//! [`backtracking_line_search`]), over closures that evaluate the policy: the trainer gives
//! the Fisher-vector products and the surrogate, this gives the order and the decisions.

use std::cell::Cell;

use atomrl_core::{Error, Result};

use crate::trpo::{backtracking_line_search, conjugate_gradient, trust_region_step};

/// The settings of [`trust_region_update`] (TRPO's `max_kl` δ, its CG iterations, and its line
/// search's backtracks and acceptance ratio).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TrustRegion {
    /// The KL bound δ of the trust region.
    pub max_kl: f64,
    /// Conjugate-gradient iterations for `F·x = −g`.
    pub cg_iters: usize,
    /// Step fractions `1, ½, ¼, …` tried at most.
    pub max_backtracks: usize,
    /// The share of the linearly predicted improvement a fraction must reach.
    pub accept_ratio: f64,
}

/// What [`trust_region_update`] did.
#[derive(Debug, Clone, PartialEq)]
pub struct TrustRegionOutcome {
    /// The parameters to keep: `θ + fraction · step` when a fraction was accepted, else `θ`.
    pub params: Vec<f64>,
    /// The accepted fraction of the full step (0 when none was).
    pub fraction: f64,
    /// The KL at the accepted fraction.
    pub kl: f64,
    /// The surrogate's improvement at the accepted fraction.
    pub improvement: f64,
    /// Conjugate-gradient iterations run.
    pub cg_iterations: usize,
    /// Why the parameters did not move, when they did not.
    pub skipped: Option<String>,
}

/// One TRPO update of the flat parameters `theta`, where the surrogate is `loss` with gradient
/// `g` (length `P`): the direction `x ≈ −F⁻¹g` by conjugate gradients over `fvp(v) = F·v`, the
/// full step `sqrt(2δ / xᵀFx)·x`, then fractions `1, ½, …` of it until `evaluate(params)`,
/// which returns the surrogate and the KL at `params`, shows an improvement within the KL
/// bound.
///
/// `fvp` returns `None` when its product is not finite (the shifted policy met NaN or Inf):
/// then, like a line search that accepts nothing, the parameters stay at `theta` and `skipped`
/// says why — a training loop skips such a step instead of ending the run.
///
/// # Errors
/// The closures' errors; the pieces' errors on bad settings or a product that is finite but
/// not positive definite.
///
/// ```
/// use atomrl_optim::{trust_region_update, TrustRegion};
/// // Surrogate ½|θ − (1, 1)|² from θ = 0 (g = (−1, −1)), F = I; the true KL ¼|θ|² is half
/// // the quadratic model's, so the full step (0.1, 0.1) stays inside δ = 0.01.
/// let loss = |t: &[f64]| 0.5 * ((t[0] - 1.0).powi(2) + (t[1] - 1.0).powi(2));
/// let kl = |t: &[f64]| 0.25 * (t[0] * t[0] + t[1] * t[1]);
/// let s = TrustRegion { max_kl: 0.01, cg_iters: 10, max_backtracks: 10, accept_ratio: 0.1 };
/// let fvp = |v: &[f64]| Ok(Some(v.to_vec()));
/// let out = trust_region_update(&[0.0, 0.0], 1.0, &[-1.0, -1.0], fvp, |t| Ok((loss(t), kl(t))), &s)?;
/// assert_eq!(out.fraction, 1.0);
/// assert!((out.params[0] - 0.1).abs() < 1e-12 && (out.kl - 0.005).abs() < 1e-12);
/// assert!(out.skipped.is_none());
/// // A product that is not finite: nothing moves.
/// let out = trust_region_update(&[0.0, 0.0], 1.0, &[-1.0, -1.0], |_| Ok(None), |t| Ok((loss(t), kl(t))), &s)?;
/// assert_eq!(out.params, [0.0, 0.0]);
/// assert!(out.skipped.is_some_and(|why| why.contains("not finite")));
/// # Ok::<(), atomrl_core::Error>(())
/// ```
pub fn trust_region_update(
    theta: &[f64],
    loss: f64,
    g: &[f64],
    mut fvp: impl FnMut(&[f64]) -> Result<Option<Vec<f64>>>,
    mut evaluate: impl FnMut(&[f64]) -> Result<(f64, f64)>,
    s: &TrustRegion,
) -> Result<TrustRegionOutcome> {
    let unmoved = |skipped: String, cg_iterations| TrustRegionOutcome {
        params: theta.to_vec(),
        fraction: 0.0,
        kl: 0.0,
        improvement: 0.0,
        cg_iterations,
        skipped: Some(skipped),
    };
    // The pieces take products that are there; a missing one stops them with an error that
    // this tells apart from a real one.
    let non_finite = Cell::new(false);
    let mut product = |v: &[f64]| match fvp(v)? {
        Some(fv) => Ok(fv),
        None => {
            non_finite.set(true);
            let why = "a finite product";
            Err(Error::value(
                "trust_region_update",
                "fvp(v)",
                why,
                "NaN or Inf",
            ))
        }
    };
    let minus_g: Vec<f64> = g.iter().map(|x| -x).collect();
    let found = conjugate_gradient(&mut product, &minus_g, s.cg_iters, 1e-10).and_then(|cg| {
        let f_x = product(&cg.x)?;
        Ok((trust_region_step(&cg.x, &f_x, s.max_kl)?, cg.iterations))
    });
    let (step, cg_iterations) = match found {
        Ok(found) => found,
        Err(_) if non_finite.get() => {
            let why = "a Fisher-vector product was not finite (the shifted policy met NaN or Inf)";
            return Ok(unmoved(why.into(), 0));
        }
        Err(e) => return Err(e),
    };
    let shifted = |fraction: f64| -> Vec<f64> {
        theta
            .iter()
            .zip(&step)
            .map(|(t, d)| t + fraction * d)
            .collect()
    };
    let expected: f64 = -g.iter().zip(&step).map(|(a, b)| a * b).sum::<f64>();
    let search = backtracking_line_search(
        |fraction| {
            let (new_loss, kl) = evaluate(&shifted(fraction))?;
            Ok((loss - new_loss, kl))
        },
        expected,
        s.max_kl,
        s.max_backtracks,
        s.accept_ratio,
    )?;
    if !search.accepted {
        let why = format!(
            "the TRPO line search accepted none of {} step fractions",
            search.tries
        );
        return Ok(unmoved(why, cg_iterations));
    }
    Ok(TrustRegionOutcome {
        params: shifted(search.fraction),
        fraction: search.fraction,
        kl: search.kl,
        improvement: search.improvement,
        cg_iterations,
        skipped: None,
    })
}
