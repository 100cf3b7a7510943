//! Checks and the stable log-sigmoid shared by the pairwise preference losses (DPO, the reward
//! model's Bradley–Terry loss).

use atomrl_core::shape::flat_f64;
use atomrl_core::{CandleContext, Error, Result};
use candle_core::{DType, Tensor};

/// Checks that `x` is a float vector `[n]` (`n` from the first of the pair when `None`, at
/// least 1) with finite entries, and returns it in f32.
pub(crate) fn checked_vector(
    func: &str,
    name: &str,
    x: &Tensor,
    n: Option<usize>,
) -> Result<Tensor> {
    let ok = match (x.dims(), n) {
        (&[len], Some(want)) => len == want,
        (&[len], None) => len >= 1,
        _ => false,
    };
    if !ok {
        let expected = n.map_or("[N] with N >= 1".to_string(), |n| {
            format!("[N] = [{n}] (one per pair)")
        });
        return Err(Error::shape(func, name, expected, x.dims()));
    }
    if !x.dtype().is_float() {
        return Err(Error::value(
            func,
            name,
            "a float tensor",
            format!("{:?}", x.dtype()),
        ));
    }
    let values = flat_f64(func, x)?;
    if let Some((i, v)) = values.iter().enumerate().find(|(_, v)| !v.is_finite()) {
        return Err(Error::value(func, format!("{name}[{i}]"), "finite", v));
    }
    x.to_dtype(DType::F32).ctx(func)
}

/// `log σ(x) = min(x, 0) − log(1 + exp(−|x|))`, stable for large `|x|` (torch's `logsigmoid`).
pub(crate) fn log_sigmoid(func: &str, x: &Tensor) -> Result<Tensor> {
    let low = x.minimum(0f64).ctx(func)?;
    let tail = x
        .abs()
        .and_then(|a| a.neg())
        .and_then(|a| a.exp())
        .and_then(|e| e.affine(1.0, 1.0))
        .and_then(|e| e.log())
        .ctx(func)?;
    (low - tail).ctx(func)
}

/// The mean of `[N]` as a host number.
pub(crate) fn host_mean(func: &str, x: &Tensor) -> Result<f64> {
    let v = flat_f64(func, x)?;
    Ok(v.iter().sum::<f64>() / v.len().max(1) as f64)
}

/// The share of pairs with `a > b`.
pub(crate) fn share_greater(func: &str, a: &Tensor, b: &Tensor) -> Result<f64> {
    let (a, b) = (flat_f64(func, a)?, flat_f64(func, b)?);
    let wins = a.iter().zip(&b).filter(|(x, y)| x > y).count();
    Ok(wins as f64 / a.len().max(1) as f64)
}
