//! Launches of the in-place CUDA kernels of atomrl-core's `cuda/optim.cu`
//! ([`atomrl_core::cuda::OPTIM_PTX`]), loaded once per device as one custom module.
// Kernel launches are FFI (`atomrl_core::launch_kernel!`); each says what the kernel touches.
#![allow(unsafe_code)]

use atomrl_core::cuda::{contiguous_range as range, elementwise_launch as config};
use candle_core::backend::BackendStorage;
use candle_core::{CudaStorage, Layout, Result};

/// The kernels' PTX.
const PTX: &str = atomrl_core::cuda::OPTIM_PTX;
/// The module name the device caches the PTX under.
const MODULE: &str = "atomrl_optim";

/// Checks that two element ranges have the same length.
fn same_len(a: (usize, usize), b: (usize, usize), op: &str) -> Result<usize> {
    let n = a.1 - a.0;
    if b.1 - b.0 != n {
        candle_core::bail!("{op}: {n} elements against {}", b.1 - b.0);
    }
    Ok(n)
}

/// `a += b` (f32).
pub(crate) fn add_assign(
    a: &mut CudaStorage,
    la: &Layout,
    b: &CudaStorage,
    lb: &Layout,
) -> Result<()> {
    let (ra, rb) = (range(la, "a")?, range(lb, "b")?);
    let n = same_len(ra, rb, "atomrl-add-assign")?;
    let func = a
        .device()
        .get_or_load_custom_func("atomrl_add_assign_f32", MODULE, PTX)?;
    let bv = b.as_cuda_slice::<f32>()?.slice(rb.0..rb.1);
    let mut av = a.as_cuda_slice_mut::<f32>()?.slice_mut(ra.0..ra.1);
    // Launch: the kernel reads and writes `n` elements of the two views, whose lengths were
    // checked; the argument types match its signature in optim.cu.
    atomrl_core::launch_kernel!(func, config(n), &mut av, &bv, &n)?;
    Ok(())
}

/// `a = a * s + 0` (f32).
pub(crate) fn scale(a: &mut CudaStorage, la: &Layout, s: f32) -> Result<()> {
    let ra = range(la, "a")?;
    let n = ra.1 - ra.0;
    let func = a
        .device()
        .get_or_load_custom_func("atomrl_scale_f32", MODULE, PTX)?;
    let mut av = a.as_cuda_slice_mut::<f32>()?.slice_mut(ra.0..ra.1);
    // Launch: `n` elements of the view; argument types as in optim.cu.
    atomrl_core::launch_kernel!(func, config(n), &mut av, &s, &n)?;
    Ok(())
}

/// A CUDA storage and its layout.
pub(crate) type Part<'a> = (&'a CudaStorage, &'a Layout);
/// A CUDA storage to write and its layout.
pub(crate) type PartMut<'a> = (&'a mut CudaStorage, &'a Layout);

/// AdamW's update in place, both moments and the parameter in one kernel (see
/// `adamw_kernel::UpdateScalars::apply`).
pub(crate) fn adamw(
    theta: PartMut<'_>,
    m: PartMut<'_>,
    v: PartMut<'_>,
    g: Part<'_>,
    s: &crate::adamw_kernel::UpdateScalars,
) -> Result<()> {
    let (rt, rm) = (range(theta.1, "parameter")?, range(m.1, "m")?);
    let (rv, rg) = (range(v.1, "v")?, range(g.1, "gradient")?);
    let n = same_len(rt, rm, "atomrl-adamw")?;
    same_len(rt, rv, "atomrl-adamw")?;
    same_len(rt, rg, "atomrl-adamw")?;
    let func = theta
        .0
        .device()
        .get_or_load_custom_func("atomrl_adamw_f32", MODULE, PTX)?;
    let gv = g.0.as_cuda_slice::<f32>()?.slice(rg.0..rg.1);
    let mut mv = m.0.as_cuda_slice_mut::<f32>()?.slice_mut(rm.0..rm.1);
    let mut vv = v.0.as_cuda_slice_mut::<f32>()?.slice_mut(rv.0..rv.1);
    let mut tv = theta.0.as_cuda_slice_mut::<f32>()?.slice_mut(rt.0..rt.1);
    let (grad_scale, has_scale) = (
        s.grad_scale.unwrap_or(1.0),
        i32::from(s.grad_scale.is_some()),
    );
    let (decay, has_decay) = (s.decay.unwrap_or(1.0), i32::from(s.decay.is_some()));
    // Launch: `n` elements of each of the four views (lengths checked, distinct tensors);
    // argument types as in optim.cu.
    atomrl_core::launch_kernel!(
        func,
        config(n),
        &mut tv,
        &mut mv,
        &mut vv,
        &gv,
        &grad_scale,
        &has_scale,
        &s.beta1,
        &s.one_minus_beta1,
        &s.beta2,
        &s.one_minus_beta2,
        &s.inv1,
        &s.inv2,
        &s.eps,
        &s.lr,
        &decay,
        &has_decay,
        &n
    )?;
    Ok(())
}

/// Blocks of the squared-norm kernel per tensor: enough to keep every SM of a large GPU busy
/// on a large tensor, one per 2,048 elements on a small one.
fn sq_norm_blocks(n: usize) -> usize {
    atomrl_core::launch_dims::sq_norm(n).0[0] as usize
}

/// `Σ x²` of each f32 tensor of `ts` (all on one CUDA device), each as f32 partial sums of a
/// fixed grid added in f64 on the host, with one device-to-host copy for all of them: the same
/// value on every run, where candle's `sum_all` reduced each tensor in a single block.
pub(crate) fn squared_norms(ts: &[&candle_core::Tensor]) -> Result<Vec<f64>> {
    let Some(first) = ts.first() else {
        return Ok(Vec::new());
    };
    let dev = match first.device() {
        candle_core::Device::Cuda(d) => d.clone(),
        _ => candle_core::bail!("atomrl-sq-norm: CUDA tensors expected"),
    };
    let blocks: Vec<usize> = ts.iter().map(|t| sq_norm_blocks(t.elem_count())).collect();
    let total: usize = blocks.iter().sum();
    // SAFETY: every element is written by one block of one launch below.
    let mut parts = unsafe { dev.alloc::<f32>(total)? };
    let func = dev.get_or_load_custom_func("atomrl_sq_norm_part_f32", MODULE, PTX)?;
    let mut offset = 0;
    for (t, &b) in ts.iter().zip(&blocks) {
        atomrl_core::cuda::with_cuda(t, |s, l| {
            let r = range(l, "gradient")?;
            let n = r.1 - r.0;
            let xv = s.as_cuda_slice::<f32>()?.slice(r.0..r.1);
            let mut pv = parts.slice_mut(offset..offset + b);
            let config = atomrl_core::cuda::launch_config(atomrl_core::launch_dims::sq_norm(n));
            // Launch: reads the `n` elements of the view, writes `b` partial sums; argument
            // types as in optim.cu.
            atomrl_core::launch_kernel!(func, config, &xv, &mut pv, &n)
        })?;
        offset += b;
    }
    let host = dev.clone_dtoh(&parts)?;
    let mut out = Vec::with_capacity(ts.len());
    let mut start = 0;
    for b in blocks {
        out.push(host[start..start + b].iter().map(|&x| f64::from(x)).sum());
        start += b;
    }
    Ok(out)
}
