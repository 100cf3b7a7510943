//! Input checks shared by the loss functions.

use atomrl_core::shape::{
    expect_binary_mask, expect_dims, expect_float, expect_rank, flat_f64, unravel,
};
use atomrl_core::{CandleContext, Error, Result};
use candle_core::Tensor;

/// A checked `[N, T]` token batch: the mask in the working dtype and as a `u8` predicate.
#[derive(Debug, Clone)]
pub(crate) struct TokenMask {
    /// Rows.
    pub n: usize,
    /// Columns.
    pub t: usize,
    /// Number of valid (mask = 1) tokens.
    pub valid: usize,
    /// The mask as 0/1 in the working dtype.
    pub float: Tensor,
    /// The mask as a `u8` predicate for `where_cond`.
    pub pred: Tensor,
    /// The mask values, row-major (for checks on the host).
    pub host: Vec<f64>,
}

impl TokenMask {
    /// `t` with every masked-out position replaced by 0 (no gradient flows to those positions,
    /// and NaN/inf there cannot leak into the result).
    pub fn select(&self, func: &str, t: &Tensor) -> Result<Tensor> {
        let zeros = t.zeros_like().ctx(func)?;
        self.pred.where_cond(t, &zeros).ctx(func)
    }

    /// Masked mean `Σ x·m / Σ m` of a (detached) `[N, T]` tensor, as f64.
    pub fn mean_of(&self, func: &str, x: &Tensor) -> Result<f64> {
        Ok(self.sum_of(func, x)? / self.valid as f64)
    }

    /// Masked sum `Σ x·m` of a (detached) `[N, T]` tensor, as f64.
    pub fn sum_of(&self, func: &str, x: &Tensor) -> Result<f64> {
        let x = x.detach().to_dtype(self.float.dtype()).ctx(func)?;
        self.select(func, &x)?
            .sum_all()
            .and_then(|s| s.to_dtype(candle_core::DType::F64))
            .and_then(|s| s.to_scalar::<f64>())
            .ctx(func)
    }
}

/// Checks `lead` (`[N, T]`, float) and the mask (`[N, T]`, 0/1, at least one 1) and returns the
/// mask in `lead`'s dtype.
pub(crate) fn check_mask(
    func: &str,
    lead_name: &str,
    lead: &Tensor,
    mask: &Tensor,
) -> Result<TokenMask> {
    let dims = expect_rank(func, lead_name, lead, 2, "[N, T]")?;
    let (n, t) = (dims[0], dims[1]);
    expect_float(func, lead_name, lead)?;
    let same = format!("[N, T] (same as {lead_name})");
    expect_dims(func, "mask", mask, &[n, t], &same)?;
    let valid = expect_binary_mask(func, "mask", mask)?;
    if valid == 0 {
        return Err(Error::value(
            func,
            "mask",
            "at least one 1 (an entirely masked batch has no loss)",
            "all zeros",
        ));
    }
    let float = mask.to_dtype(lead.dtype()).ctx(func)?;
    let pred = mask.ne(0.0).ctx(func)?;
    let host = flat_f64(func, mask)?;
    Ok(TokenMask {
        n,
        t,
        valid,
        float,
        pred,
        host,
    })
}

/// Checks that `x` has `[N, T]` dims like `lead_name` and is float, converts it to `dtype`.
pub(crate) fn check_same(
    func: &str,
    name: &str,
    x: &Tensor,
    lead_name: &str,
    m: &TokenMask,
) -> Result<Tensor> {
    expect_dims(
        func,
        name,
        x,
        &[m.n, m.t],
        &format!("[N, T] (same as {lead_name})"),
    )?;
    expect_float(func, name, x)?;
    x.to_dtype(m.float.dtype()).ctx(func)
}

/// Checks that `x` (`[N, T]`) is finite wherever the mask is 1, naming the first bad index.
pub(crate) fn check_finite_where_valid(
    func: &str,
    name: &str,
    x: &Tensor,
    m: &TokenMask,
) -> Result<()> {
    let values = flat_f64(func, x)?;
    let bad = values
        .iter()
        .zip(&m.host)
        .enumerate()
        .find(|(_, (v, mv))| **mv != 0.0 && !v.is_finite());
    if let Some((i, (v, _))) = bad {
        return Err(Error::value(
            func,
            format!("{name}[{}]", unravel(i, x.dims())),
            "finite where mask = 1",
            v,
        ));
    }
    Ok(())
}

/// Checks `x` and returns it in the working dtype with masked positions set to 0.
pub(crate) fn checked_tokens(
    func: &str,
    name: &str,
    x: &Tensor,
    lead_name: &str,
    m: &TokenMask,
) -> Result<Tensor> {
    let x = check_same(func, name, x, lead_name, m)?;
    check_finite_where_valid(func, name, &x, m)?;
    m.select(func, &x)
}

/// Checks an option that must be finite and `>= 0`.
pub(crate) fn non_negative(func: &str, name: &str, x: f64) -> Result<()> {
    if x >= 0.0 && x.is_finite() {
        Ok(())
    } else {
        Err(Error::value(func, name, ">= 0 and finite", x))
    }
}

/// Checks an option that must be finite and `> 0`.
pub(crate) fn positive(func: &str, name: &str, x: f64) -> Result<()> {
    if x > 0.0 && x.is_finite() {
        Ok(())
    } else {
        Err(Error::value(func, name, "> 0 and finite", x))
    }
}
