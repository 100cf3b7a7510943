//! Registration of this crate's TRPO pieces with `atomrl-fn`. In the trainer their operators
//! are functions (Fisher-vector products of a model); here they take explicit numbers so that
//! each has a JSON contract: a matrix for `F`, and the line search's evaluations per fraction.

use atomrl_core::shape::flat_f64;
use atomrl_core::{ArgSpec, AtomicFn, Error, FnSpec, Inputs, OutputSpec, Outputs, Result};
use candle_core::{Device, Tensor};

/// The functions this crate registers with `atomrl-fn`.
pub fn functions() -> Vec<AtomicFn> {
    vec![
        AtomicFn {
            spec: CONJUGATE_GRADIENT,
            run: run_conjugate_gradient,
        },
        AtomicFn {
            spec: FISHER_VECTOR_PRODUCT,
            run: run_fisher_vector_product,
        },
        AtomicFn {
            spec: TRUST_REGION_STEP,
            run: run_trust_region_step,
        },
        AtomicFn {
            spec: BACKTRACKING_LINE_SEARCH,
            run: run_backtracking_line_search,
        },
    ]
}

const CONJUGATE_GRADIENT: FnSpec = FnSpec {
    name: "conjugate_gradient",
    crate_name: "atomrl-optim",
    summary: "TRPO's conjugate-gradient solve of F x = b for a symmetric positive-definite F",
    formula: "\
x_0 = 0, r_0 = p_0 = b
alpha = r.r / p.Fp;  x += alpha p;  r -= alpha Fp;  p = r + (r'.r' / r.r) p
stops after max_iters or when r.r < tol. TRPO solves F x = g with F the KL's Fisher
matrix, given as products F v (here: an explicit matrix). A direction with p.Fp <= 0 is an
error (F not positive definite).",
    inputs: &[
        ArgSpec::tensor(
            "matrix",
            "[n, n]",
            "f64",
            "the symmetric positive-definite F",
        ),
        ArgSpec::tensor(
            "b",
            "[n]",
            "f64",
            "the right-hand side (TRPO: the policy gradient)",
        ),
        ArgSpec::option("max_iters", "usize", "10", "iterations at most (>= 1)"),
        ArgSpec::option(
            "tol",
            "f64",
            "1e-10",
            "stop when the squared residual is below",
        ),
    ],
    outputs: &[
        OutputSpec::new("x", "[n]", "f64", "the approximate solution"),
        OutputSpec::new("iterations", "scalar", "int", "iterations taken"),
        OutputSpec::new("residual_norm", "scalar", "f64", "|b - F x| at the end"),
    ],
    example_input: r#"{"matrix": [[4, 1], [1, 3]], "b": [1, 2]}"#,
    example_output: r#"{"x": {"shape": [2], "data": [0.09090909, 0.63636364]}, "iterations": 2, "residual_norm": 0.0}"#,
};

fn run_conjugate_gradient(inputs: &Inputs) -> Result<Outputs> {
    let (f, n) = square(inputs, "matrix")?;
    let b = vector(inputs, "b", Some(n))?;
    let s = crate::conjugate_gradient(
        |v| Ok(mat_vec(&f, v)),
        &b,
        inputs.opt_usize("max_iters")?.unwrap_or(10),
        inputs.opt_f64("tol")?.unwrap_or(1e-10),
    )?;
    Ok(Outputs::new()
        .tensor("x", &to_tensor(&s.x)?)
        .int("iterations", s.iterations as i64)
        .scalar("residual_norm", s.residual_norm))
}

const FISHER_VECTOR_PRODUCT: FnSpec = FnSpec {
    name: "fisher_vector_product",
    crate_name: "atomrl-optim",
    summary: "F v by central finite differences of the KL's gradient (here of the quadratic KL 1/2 (t - theta)' F (t - theta))",
    formula: "\
F v = (grad KL(theta + eps v) - grad KL(theta - eps v)) / (2 eps)
with grad KL(t) = F (t - theta) for the given matrix: exact up to rounding for a quadratic
KL, O(eps^2) otherwise. The trainer differentiates the k2 KL of the policy to the old one
(its Hessian at the old policy is the empirical Fisher matrix).",
    inputs: &[
        ArgSpec::tensor("matrix", "[n, n]", "f64", "the Hessian F of the quadratic KL"),
        ArgSpec::tensor("theta", "[n]", "f64", "where the product is taken"),
        ArgSpec::tensor("v", "[n]", "f64", "the vector"),
        ArgSpec::option("eps", "f64", "1e-3", "the finite-difference step (> 0)"),
    ],
    outputs: &[OutputSpec::new("fv", "[n]", "f64", "F v")],
    example_input: r#"{"matrix": [[2, 0], [0, 5]], "theta": [0.3, -0.1], "v": [1, 1]}"#,
    example_output: r#"{"fv": {"shape": [2], "data": [2.0, 5.0]}}"#,
};

fn run_fisher_vector_product(inputs: &Inputs) -> Result<Outputs> {
    let (f, n) = square(inputs, "matrix")?;
    let theta = vector(inputs, "theta", Some(n))?;
    let v = vector(inputs, "v", Some(n))?;
    let grad = |t: &[f64]| {
        let d: Vec<f64> = t.iter().zip(&theta).map(|(a, b)| a - b).collect();
        Ok(mat_vec(&f, &d))
    };
    let fv =
        crate::fisher_vector_product(grad, &theta, &v, inputs.opt_f64("eps")?.unwrap_or(1e-3))?;
    Ok(Outputs::new().tensor("fv", &to_tensor(&fv)?))
}

const TRUST_REGION_STEP: FnSpec = FnSpec {
    name: "trust_region_step",
    crate_name: "atomrl-optim",
    summary:
        "TRPO's full step: the direction x scaled so that the quadratic KL model reaches max_kl",
    formula: "\
step = sqrt(2 max_kl / x'F x) * x          f_x = F x
so that 1/2 step' F step = max_kl.",
    inputs: &[
        ArgSpec::tensor("x", "[n]", "f64", "the direction (conjugate_gradient's x)"),
        ArgSpec::tensor("f_x", "[n]", "f64", "F x"),
        ArgSpec::required_option("max_kl", "f64", "the trust region's KL bound (> 0)"),
    ],
    outputs: &[OutputSpec::new("step", "[n]", "f64", "the full step")],
    example_input: r#"{"x": [1, 0], "f_x": [2, 0], "max_kl": 0.01}"#,
    example_output: r#"{"step": {"shape": [2], "data": [0.1, 0.0]}}"#,
};

fn run_trust_region_step(inputs: &Inputs) -> Result<Outputs> {
    let x = vector(inputs, "x", None)?;
    let f_x = vector(inputs, "f_x", Some(x.len()))?;
    let step = crate::trust_region_step(&x, &f_x, inputs.f64("max_kl")?)?;
    Ok(Outputs::new().tensor("step", &to_tensor(&step)?))
}

const BACKTRACKING_LINE_SEARCH: FnSpec = FnSpec {
    name: "backtracking_line_search",
    crate_name: "atomrl-optim",
    summary: "TRPO's line search: the first of the fractions 1, 1/2, 1/4, ... whose surrogate improves enough inside the KL bound",
    formula: "\
fraction_k = 2^-k, k = 0 .. max_backtracks-1; accept the first k with
  improvement_k > 0, improvement_k >= accept_ratio * expected_improvement * fraction_k,
  kl_k <= max_kl (both finite)
improvements[k] and kls[k] are the surrogate's improvement and the KL at fraction_k (the
trainer evaluates them one by one; here they are given). None accepted: accepted = false,
fraction = 0, the parameters stay.",
    inputs: &[
        ArgSpec::tensor("improvements", "[K]", "f64", "the surrogate's improvement at fraction 2^-k"),
        ArgSpec::tensor("kls", "[K]", "f64", "the KL at fraction 2^-k"),
        ArgSpec::required_option("expected_improvement", "f64", "-g . step, the linear model's improvement of the full step"),
        ArgSpec::required_option("max_kl", "f64", "the KL bound (> 0)"),
        ArgSpec::option("accept_ratio", "f64", "0.1", "share of the expected improvement required, in [0, 1]"),
    ],
    outputs: &[
        OutputSpec::new("accepted", "scalar", "int", "1 when a fraction was accepted"),
        OutputSpec::new("fraction", "scalar", "f64", "the accepted fraction (0: none)"),
        OutputSpec::new("tries", "scalar", "int", "fractions tried"),
        OutputSpec::new("improvement", "scalar", "f64", "the improvement at the accepted fraction"),
        OutputSpec::new("kl", "scalar", "f64", "the KL at the accepted fraction"),
    ],
    example_input: r#"{"improvements": [-0.5, 0.125, 0.078125], "kls": [0.02, 0.005, 0.00125], "expected_improvement": 1.0, "max_kl": 0.01}"#,
    example_output: r#"{"accepted": 1, "fraction": 0.5, "tries": 2, "improvement": 0.125, "kl": 0.005}"#,
};

fn run_backtracking_line_search(inputs: &Inputs) -> Result<Outputs> {
    let improvements = vector(inputs, "improvements", None)?;
    let kls = vector(inputs, "kls", Some(improvements.len()))?;
    let r = crate::backtracking_line_search(
        |fraction| {
            let k = (-fraction.log2()).round() as usize;
            Ok((improvements[k], kls[k]))
        },
        inputs.f64("expected_improvement")?,
        inputs.f64("max_kl")?,
        improvements.len(),
        inputs.opt_f64("accept_ratio")?.unwrap_or(0.1),
    )?;
    Ok(Outputs::new()
        .int("accepted", i64::from(r.accepted))
        .scalar("fraction", r.fraction)
        .int("tries", r.tries as i64)
        .scalar("improvement", r.improvement)
        .scalar("kl", r.kl))
}

/// Input `name` as a square matrix, row-major, and its size.
fn square(inputs: &Inputs, name: &str) -> Result<(Vec<f64>, usize)> {
    let t = inputs.float_tensor(name)?;
    match *t.dims() {
        [n, m] if n == m && n > 0 => Ok((flat_f64(inputs.func(), &t)?, n)),
        _ => Err(Error::shape(
            inputs.func(),
            name,
            "[n, n] with n >= 1",
            t.dims(),
        )),
    }
}

/// Input `name` as a vector, of length `len` when given.
fn vector(inputs: &Inputs, name: &str, len: Option<usize>) -> Result<Vec<f64>> {
    let t = inputs.float_tensor(name)?;
    let ok = match (t.dims(), len) {
        (&[n], Some(want)) => n == want,
        (&[n], None) => n > 0,
        _ => false,
    };
    if !ok {
        let expected = len.map_or("[n] with n >= 1".to_string(), |n| format!("[{n}]"));
        return Err(Error::shape(inputs.func(), name, expected, t.dims()));
    }
    flat_f64(inputs.func(), &t)
}

fn mat_vec(f: &[f64], v: &[f64]) -> Vec<f64> {
    let n = v.len();
    (0..n)
        .map(|i| (0..n).map(|j| f[i * n + j] * v[j]).sum())
        .collect()
}

fn to_tensor(x: &[f64]) -> Result<Tensor> {
    Tensor::new(x, &Device::Cpu).map_err(|e| Error::value("atomrl-optim", "output", "a tensor", e))
}

#[cfg(test)]
mod tests {
    #[test]
    fn worked_examples_match_their_stored_outputs() {
        for f in super::functions() {
            atomrl_core::check_example(&f).unwrap_or_else(|e| panic!("{e}"));
        }
    }

    #[test]
    fn bad_shapes_name_the_argument() {
        let cg = super::functions().remove(0);
        let e = cg
            .run_json(serde_json::json!({"matrix": [[1, 2, 3]], "b": [1]}))
            .unwrap_err()
            .to_string();
        assert!(e.contains("`matrix`"), "{e}");
        let e = cg
            .run_json(serde_json::json!({"matrix": [[1, 0], [0, 1]], "b": [1, 2, 3]}))
            .unwrap_err()
            .to_string();
        assert!(e.contains("`b`") && e.contains("[2]"), "{e}");
    }
}
