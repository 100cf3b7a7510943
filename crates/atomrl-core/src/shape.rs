//! Shape and value checks run before any computation.
//!
//! Every check takes the function and argument names so that the error it returns can be shown
//! to a user as is.

use candle_core::{DType, Tensor};

use crate::error::{CandleContext, Error, Result};

/// Checks that `t` has exactly `rank` dimensions; returns its dims.
pub fn expect_rank<'a>(
    func: &str,
    arg: &str,
    t: &'a Tensor,
    rank: usize,
    notation: &str,
) -> Result<&'a [usize]> {
    let dims = t.dims();
    if dims.len() != rank {
        return Err(Error::shape(func, arg, notation, dims));
    }
    Ok(dims)
}

/// Checks that `t` has exactly the dims `expected` (`notation` is shown in the error, e.g.
/// `"[N, T] = [4, 7] (same as log_probs)"`).
pub fn expect_dims(
    func: &str,
    arg: &str,
    t: &Tensor,
    expected: &[usize],
    notation: &str,
) -> Result<()> {
    if t.dims() != expected {
        return Err(Error::shape(
            func,
            arg,
            format!("{notation} = {expected:?}"),
            t.dims(),
        ));
    }
    Ok(())
}

/// Checks that `t` is a floating-point tensor (f16, bf16, f32 or f64).
pub fn expect_float(func: &str, arg: &str, t: &Tensor) -> Result<()> {
    match t.dtype() {
        DType::F16 | DType::BF16 | DType::F32 | DType::F64 => Ok(()),
        other => Err(Error::value(
            func,
            arg,
            "a floating-point tensor",
            format!("{other:?}"),
        )),
    }
}

/// Checks every element of `t` is finite; the error names the first bad flat index.
pub fn expect_finite(func: &str, arg: &str, t: &Tensor) -> Result<()> {
    let values = flat_f64(func, t)?;
    if let Some((i, v)) = values.iter().enumerate().find(|(_, v)| !v.is_finite()) {
        return Err(Error::value(
            func,
            format!("{arg}[{}]", unravel(i, t.dims())),
            "finite",
            v,
        ));
    }
    Ok(())
}

/// Checks every element of `t` is exactly 0 or 1 (a mask); returns the number of ones.
pub fn expect_binary_mask(func: &str, arg: &str, t: &Tensor) -> Result<usize> {
    let values = flat_f64(func, t)?;
    let mut ones = 0;
    for (i, &v) in values.iter().enumerate() {
        if v == 1.0 {
            ones += 1;
        } else if v != 0.0 {
            return Err(Error::value(
                func,
                format!("{arg}[{}]", unravel(i, t.dims())),
                "0 or 1",
                v,
            ));
        }
    }
    Ok(ones)
}

/// The elements of `t`, flattened row-major, as f64.
pub fn flat_f64(func: &str, t: &Tensor) -> Result<Vec<f64>> {
    t.flatten_all()
        .and_then(|f| f.to_dtype(DType::F64))
        .and_then(|f| f.to_vec1::<f64>())
        .ctx(func)
}

/// A one-element tensor of any float dtype as f64 (detached: reading a loss does not extend
/// its graph).
///
/// # Errors
/// [`Error::Candle`] naming `func` when `t` has more than one element.
///
/// ```
/// let t = candle_core::Tensor::new(2.5f32, &candle_core::Device::Cpu)?;
/// assert_eq!(atomrl_core::shape::scalar_f64("example", &t)?, 2.5);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn scalar_f64(func: &str, t: &Tensor) -> Result<f64> {
    t.detach()
        .to_dtype(DType::F64)
        .and_then(|x| x.to_scalar::<f64>())
        .ctx(func)
}

/// `Σ values · mask` over every element (detached, summed in the tensors' dtype), as f64: the
/// masked token sums of losses and statistics.
///
/// # Errors
/// [`Error::Candle`] naming `func` when the shapes do not broadcast.
///
/// ```
/// use candle_core::{Device, Tensor};
/// let values = Tensor::new(&[[1f32, 2., 3.]], &Device::Cpu)?;
/// let mask = Tensor::new(&[[1f32, 0., 1.]], &Device::Cpu)?;
/// assert_eq!(atomrl_core::shape::masked_sum("example", &values, &mask)?, 4.0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn masked_sum(func: &str, values: &Tensor, mask: &Tensor) -> Result<f64> {
    let sum = values
        .detach()
        .broadcast_mul(mask)
        .and_then(|x| x.sum_all())
        .ctx(func)?;
    scalar_f64(func, &sum)
}

/// Formats a flat index as a multi-index: `7` in `[2, 4]` is `"1, 3"`.
pub fn unravel(mut flat: usize, dims: &[usize]) -> String {
    if dims.len() <= 1 {
        return flat.to_string();
    }
    let mut idx = vec![0; dims.len()];
    for (slot, &d) in idx.iter_mut().zip(dims).rev() {
        *slot = flat % d.max(1);
        flat /= d.max(1);
    }
    idx.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn rank_error_names_argument_and_shapes() {
        let t = Tensor::zeros((2, 3), DType::F32, &Device::Cpu).unwrap();
        let err = expect_rank("f", "rewards", &t, 1, "[N]")
            .unwrap_err()
            .to_string();
        assert_eq!(err, "f: `rewards` has shape [2, 3], expected [N]");
    }

    #[test]
    fn finite_check_gives_multi_index() {
        let t = Tensor::new(&[[0f32, 1.0], [f32::NAN, 2.0]], &Device::Cpu).unwrap();
        let err = expect_finite("f", "x", &t).unwrap_err().to_string();
        assert_eq!(err, "f: `x[1, 0]` must be finite, got NaN");
    }

    #[test]
    fn mask_check_counts_ones_and_rejects_other_values() {
        let m = Tensor::new(&[1f32, 0.0, 1.0], &Device::Cpu).unwrap();
        assert_eq!(expect_binary_mask("f", "mask", &m).unwrap(), 2);
        let bad = Tensor::new(&[1f32, 0.5], &Device::Cpu).unwrap();
        assert!(expect_binary_mask("f", "mask", &bad).is_err());
    }
}
