//! TRPO's natural-gradient step (Schulman et al., "Trust Region Policy Optimization", 2015):
//! the conjugate-gradient solve of `F·x = g`, Fisher-vector products by central finite
//! differences of the KL gradient, the step scaled to the trust region, and the backtracking
//! line search. On flat `f64` parameter vectors, so that any model's parameters (flattened)
//! and any way of computing gradients fit.

use atomrl_core::{Error, Result};

/// The result of [`conjugate_gradient`].
#[derive(Debug, Clone, PartialEq)]
pub struct CgSolution {
    /// The approximate solution `x` of `F·x = b`.
    pub x: Vec<f64>,
    /// Iterations taken.
    pub iterations: usize,
    /// `‖b − F·x‖` at the end.
    pub residual_norm: f64,
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Solves `F·x = b` for a symmetric positive-definite `F` given only as the product
/// `fvp(v) = F·v` (conjugate gradients, from `x = 0`), stopping after `max_iters` or when the
/// squared residual falls below `tol`. TRPO calls it with the Fisher matrix of the KL and the
/// policy gradient `g`; 10 iterations is the usual budget.
///
/// # Errors
/// `fvp`'s errors; a product of the wrong length; `max_iters == 0`; a direction of
/// non-positive curvature (`vᵀF·v ≤ 0`: `F` is not positive definite).
///
/// ```
/// use atomrl_optim::conjugate_gradient;
/// // F = [[4, 1], [1, 3]], b = [1, 2]: x = [1/11, 7/11].
/// let f = |v: &[f64]| Ok(vec![4.0 * v[0] + v[1], v[0] + 3.0 * v[1]]);
/// let s = conjugate_gradient(f, &[1.0, 2.0], 10, 1e-20)?;
/// assert!((s.x[0] - 1.0 / 11.0).abs() < 1e-12 && (s.x[1] - 7.0 / 11.0).abs() < 1e-12);
/// assert!(s.iterations <= 2);
/// # Ok::<(), atomrl_core::Error>(())
/// ```
pub fn conjugate_gradient(
    mut fvp: impl FnMut(&[f64]) -> Result<Vec<f64>>,
    b: &[f64],
    max_iters: usize,
    tol: f64,
) -> Result<CgSolution> {
    let func = "conjugate_gradient";
    if max_iters == 0 {
        return Err(Error::value(func, "max_iters", ">= 1", 0));
    }
    let mut x = vec![0.0; b.len()];
    let mut r = b.to_vec();
    let mut p = b.to_vec();
    let mut rr = dot(&r, &r);
    let mut iterations = 0;
    while iterations < max_iters && rr >= tol {
        let fp = fvp(&p)?;
        if fp.len() != b.len() {
            return Err(Error::value(
                func,
                "fvp(v)",
                format!("{} entries (one per parameter)", b.len()),
                fp.len(),
            ));
        }
        let curvature = dot(&p, &fp);
        if curvature <= 0.0 || !curvature.is_finite() {
            return Err(Error::value(
                func,
                "fvp",
                "a positive-definite product (vᵀF·v > 0)",
                curvature,
            ));
        }
        let alpha = rr / curvature;
        for i in 0..x.len() {
            x[i] += alpha * p[i];
            r[i] -= alpha * fp[i];
        }
        let next = dot(&r, &r);
        let beta = next / rr;
        for i in 0..p.len() {
            p[i] = r[i] + beta * p[i];
        }
        rr = next;
        iterations += 1;
    }
    Ok(CgSolution {
        x,
        iterations,
        residual_norm: rr.sqrt(),
    })
}

/// The Fisher-vector product `F·v` by central finite differences of the KL's gradient:
/// `(∇KL(θ + εv) − ∇KL(θ − εv)) / 2ε`, where `F` is the Hessian of the KL at `θ` (the Fisher
/// information of the policy there). Exact for a quadratic KL, `O(ε²)` otherwise; two gradient
/// evaluations per product, no second-order autodiff.
///
/// # Errors
/// `grad_kl`'s errors; gradients of the wrong length; `eps` not > 0 and finite.
///
/// ```
/// use atomrl_optim::fisher_vector_product;
/// // KL(θ) = ½ θᵀFθ with F = [[2, 0], [0, 5]]: ∇KL = Fθ.
/// let grad = |t: &[f64]| Ok(vec![2.0 * t[0], 5.0 * t[1]]);
/// let fv = fisher_vector_product(grad, &[0.3, -0.1], &[1.0, 1.0], 1e-3)?;
/// assert!((fv[0] - 2.0).abs() < 1e-9 && (fv[1] - 5.0).abs() < 1e-9);
/// # Ok::<(), atomrl_core::Error>(())
/// ```
pub fn fisher_vector_product(
    mut grad_kl: impl FnMut(&[f64]) -> Result<Vec<f64>>,
    theta: &[f64],
    v: &[f64],
    eps: f64,
) -> Result<Vec<f64>> {
    let func = "fisher_vector_product";
    if !(eps > 0.0 && eps.is_finite()) {
        return Err(Error::value(func, "eps", "> 0 and finite", eps));
    }
    if v.len() != theta.len() {
        return Err(Error::value(
            func,
            "v",
            format!("{} entries", theta.len()),
            v.len(),
        ));
    }
    let shifted = |sign: f64| -> Vec<f64> {
        theta
            .iter()
            .zip(v)
            .map(|(t, d)| t + sign * eps * d)
            .collect()
    };
    let plus = grad_kl(&shifted(1.0))?;
    let minus = grad_kl(&shifted(-1.0))?;
    if plus.len() != theta.len() || minus.len() != theta.len() {
        return Err(Error::value(
            func,
            "grad_kl(θ)",
            format!("{} entries (one per parameter)", theta.len()),
            plus.len(),
        ));
    }
    Ok(plus
        .iter()
        .zip(&minus)
        .map(|(p, m)| (p - m) / (2.0 * eps))
        .collect())
}

/// The full TRPO step along the natural-gradient direction `x` (from [`conjugate_gradient`]),
/// scaled so that the quadratic model of the KL reaches `max_kl`:
/// `step = sqrt(2·max_kl / xᵀF·x) · x`, given `f_x = F·x`.
///
/// # Errors
/// Lengths that differ; `max_kl` not > 0 and finite; `xᵀF·x ≤ 0`.
///
/// ```
/// use atomrl_optim::trust_region_step;
/// // x = [1, 0], F·x = [2, 0]: xᵀFx = 2, so the step is sqrt(2·0.01 / 2) = 0.1 along x.
/// let s = trust_region_step(&[1.0, 0.0], &[2.0, 0.0], 0.01)?;
/// assert!((s[0] - 0.1).abs() < 1e-12 && s[1] == 0.0);
/// # Ok::<(), atomrl_core::Error>(())
/// ```
pub fn trust_region_step(x: &[f64], f_x: &[f64], max_kl: f64) -> Result<Vec<f64>> {
    let func = "trust_region_step";
    if f_x.len() != x.len() {
        return Err(Error::value(
            func,
            "f_x",
            format!("{} entries", x.len()),
            f_x.len(),
        ));
    }
    if !(max_kl > 0.0 && max_kl.is_finite()) {
        return Err(Error::value(func, "max_kl", "> 0 and finite", max_kl));
    }
    let shs = dot(x, f_x);
    if !(shs > 0.0 && shs.is_finite()) {
        return Err(Error::value(func, "xᵀF·x", "> 0", shs));
    }
    let scale = (2.0 * max_kl / shs).sqrt();
    Ok(x.iter().map(|v| v * scale).collect())
}

/// What [`backtracking_line_search`] decided.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LineSearchResult {
    /// Whether a fraction of the step was accepted (else the parameters must stay).
    pub accepted: bool,
    /// The accepted fraction of the full step (0 when none was).
    pub fraction: f64,
    /// Fractions tried.
    pub tries: usize,
    /// The surrogate improvement at the accepted fraction.
    pub improvement: f64,
    /// The KL at the accepted fraction.
    pub kl: f64,
}

/// TRPO's backtracking line search: tries fractions `1, ½, ¼, …` (at most `max_backtracks`) of
/// the full step and accepts the first whose surrogate improves (`improvement > 0`), by at
/// least `accept_ratio` of the improvement the linear model expects (`expected_improvement ·
/// fraction`), and whose KL stays within `max_kl`. `evaluate(fraction)` applies that fraction
/// of the step and returns `(improvement, kl)`; on rejection the caller restores the old
/// parameters.
///
/// # Errors
/// `evaluate`'s errors; `max_backtracks == 0`; `max_kl` not > 0; `accept_ratio` outside
/// `[0, 1]`.
///
/// ```
/// use atomrl_optim::backtracking_line_search;
/// // The surrogate changes by f·(1 − 1.5f) at fraction f (worse past f = 2/3), the KL by 0.02·f².
/// let eval = |f: f64| Ok((f * (1.0 - 1.5 * f), 0.02 * f * f));
/// let r = backtracking_line_search(eval, 1.0, 0.01, 10, 0.1)?;
/// assert!(r.accepted);
/// assert_eq!((r.fraction, r.tries), (0.5, 2)); // f = 1 worsens; f = ½ improves, KL 0.005
/// # Ok::<(), atomrl_core::Error>(())
/// ```
pub fn backtracking_line_search(
    mut evaluate: impl FnMut(f64) -> Result<(f64, f64)>,
    expected_improvement: f64,
    max_kl: f64,
    max_backtracks: usize,
    accept_ratio: f64,
) -> Result<LineSearchResult> {
    let func = "backtracking_line_search";
    if max_backtracks == 0 {
        return Err(Error::value(func, "max_backtracks", ">= 1", 0));
    }
    if !(max_kl > 0.0 && max_kl.is_finite()) {
        return Err(Error::value(func, "max_kl", "> 0 and finite", max_kl));
    }
    if !(0.0..=1.0).contains(&accept_ratio) {
        return Err(Error::value(
            func,
            "accept_ratio",
            "in [0, 1]",
            accept_ratio,
        ));
    }
    let mut fraction = 1.0;
    for tries in 1..=max_backtracks {
        let (improvement, kl) = evaluate(fraction)?;
        let wanted = accept_ratio * expected_improvement * fraction;
        if improvement.is_finite()
            && kl.is_finite()
            && improvement > 0.0
            && improvement >= wanted
            && kl <= max_kl
        {
            return Ok(LineSearchResult {
                accepted: true,
                fraction,
                tries,
                improvement,
                kl,
            });
        }
        fraction *= 0.5;
    }
    Ok(LineSearchResult {
        accepted: false,
        fraction: 0.0,
        tries: max_backtracks,
        improvement: 0.0,
        kl: 0.0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The natural-gradient step on a quadratic KL and a linear surrogate: CG recovers
    /// `F⁻¹g` exactly (n iterations for n parameters), the finite-difference products are the
    /// matrix's, and the scaled step has exactly `½ sᵀFs = max_kl`.
    #[test]
    fn the_whole_step_on_a_quadratic_problem() {
        let f = [[3.0, 0.5, 0.0], [0.5, 2.0, 0.3], [0.0, 0.3, 1.0]];
        let mul = |v: &[f64]| -> Vec<f64> { (0..3).map(|i| dot(&f[i], v)).collect() };
        let grad_kl = |t: &[f64]| Ok(mul(t));
        let g = [1.0, -2.0, 0.5];
        let theta = [0.1, 0.2, -0.3];
        let fvp = |v: &[f64]| fisher_vector_product(grad_kl, &theta, v, 1e-4);
        let cg = conjugate_gradient(fvp, &g, 10, 1e-24).unwrap();
        let back = mul(&cg.x);
        for i in 0..3 {
            assert!((back[i] - g[i]).abs() < 1e-8, "{back:?}");
        }
        assert!(cg.iterations <= 3);
        let step = trust_region_step(&cg.x, &back, 0.01).unwrap();
        let kl = 0.5 * dot(&step, &mul(&step));
        assert!((kl - 0.01).abs() < 1e-12, "{kl}");
    }

    #[test]
    fn bad_inputs_are_errors() {
        let id = |v: &[f64]| Ok(v.to_vec());
        assert!(conjugate_gradient(id, &[1.0], 0, 1e-10).is_err());
        let negative = |v: &[f64]| Ok(v.iter().map(|x| -x).collect());
        let err = conjugate_gradient(negative, &[1.0], 5, 1e-10).unwrap_err();
        assert!(err.to_string().contains("positive-definite"));
        let short = |_: &[f64]| Ok(vec![1.0]);
        assert!(conjugate_gradient(short, &[1.0, 1.0], 5, 1e-10).is_err());
        assert!(trust_region_step(&[1.0], &[0.0], 0.01).is_err());
        assert!(trust_region_step(&[1.0], &[1.0], 0.0).is_err());
        assert!(fisher_vector_product(|v: &[f64]| Ok(v.to_vec()), &[0.0], &[1.0], 0.0).is_err());
        let never = |_: f64| Ok((-1.0, 0.0));
        let r = backtracking_line_search(never, 1.0, 0.01, 5, 0.1).unwrap();
        assert_eq!((r.accepted, r.tries, r.fraction), (false, 5, 0.0));
        // A step whose KL is too large at every fraction is rejected too.
        let wide = |_: f64| Ok((1.0, 1.0));
        assert!(
            !backtracking_line_search(wide, 1.0, 0.01, 3, 0.1)
                .unwrap()
                .accepted
        );
        assert!(backtracking_line_search(wide, 1.0, 0.01, 3, 1.5).is_err());
    }
}
