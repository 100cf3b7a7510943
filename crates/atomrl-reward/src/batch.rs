//! Small helpers shared by the batch functions.

use atomrl_core::{CandleContext, Error, Result};
use candle_core::{Device, Tensor};

/// `[N]` f32 CPU tensor from per-completion rewards.
pub(crate) fn rewards_tensor(func: &str, values: Vec<f32>) -> Result<Tensor> {
    let n = values.len();
    Tensor::from_vec(values, n, &Device::Cpu).ctx(func)
}

/// Checks that a per-completion argument has one entry per completion.
pub(crate) fn check_len(func: &str, arg: &str, got: usize, n: usize) -> Result<()> {
    if got != n {
        return Err(Error::value(
            func,
            arg,
            format!("N = {n} entries (one per completion)"),
            format!("{got} entries"),
        ));
    }
    Ok(())
}
