//! Launches of the in-place CUDA kernels of atomrl-core's `cuda/optim.cu`
//! ([`atomrl_core::cuda::OPTIM_PTX`]), loaded once per device as one custom module.
// Kernel launches are FFI (`atomrl_core::launch_kernel!`); each says what the kernel touches.
#![allow(unsafe_code)]

use atomrl_core::cuda::{contiguous_range as range, elementwise_launch as config};
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, LaunchConfig};
use candle_core::{CudaDevice, CudaStorage, Layout, Result, Tensor};

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

/// optim.cu's `AdamWArgs`: the scalars of one AdamW step, passed by value.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct AdamWArgs {
    grad_scale: f32,
    has_scale: i32,
    beta1: f32,
    one_minus_beta1: f32,
    beta2: f32,
    one_minus_beta2: f32,
    inv1: f32,
    inv2: f32,
    eps: f32,
    lr: f32,
    decay: f32,
    has_decay: i32,
}

// SAFETY: plain `#[repr(C)]` data, field for field optim.cu's `AdamWArgs`.
unsafe impl candle_core::cuda_backend::cudarc::driver::DeviceRepr for AdamWArgs {}

impl From<&crate::adamw_kernel::UpdateScalars> for AdamWArgs {
    fn from(s: &crate::adamw_kernel::UpdateScalars) -> Self {
        Self {
            grad_scale: s.grad_scale.unwrap_or(1.0),
            has_scale: i32::from(s.grad_scale.is_some()),
            beta1: s.beta1,
            one_minus_beta1: s.one_minus_beta1,
            beta2: s.beta2,
            one_minus_beta2: s.one_minus_beta2,
            inv1: s.inv1,
            inv2: s.inv2,
            eps: s.eps,
            lr: s.lr,
            decay: s.decay.unwrap_or(1.0),
            has_decay: i32::from(s.decay.is_some()),
        }
    }
}

/// The CUDA device of `t`.
fn cuda_device(t: &Tensor, op: &str) -> Result<CudaDevice> {
    match t.device() {
        candle_core::Device::Cuda(d) => Ok(d.clone()),
        _ => candle_core::bail!("{op}: CUDA tensors expected"),
    }
}

/// Runs `f` on the device address and element count of each of `ts` (contiguous f32 tensors on
/// `dev`), their storages held until `f` returns.
///
/// A multi-tensor launch reads its tensors' addresses from a table, not from one candle
/// storage per argument, so it cannot go through candle's (in-place) custom ops, which hand a
/// kernel one or two storages. The storages' read locks keep every buffer alive and unmoved
/// while the launch is queued; the kernels write the parameters and moments through these
/// addresses, which no other host thread touches during an optimizer step. A tensor listed
/// twice (an in-place sum is both its output and its first term) is locked once: taking a
/// read lock the thread already holds may deadlock.
fn with_addresses<R>(
    dev: &CudaDevice,
    ts: &[&Tensor],
    op: &str,
    f: impl FnOnce(&[(u64, usize)]) -> Result<R>,
) -> Result<R> {
    use candle_core::cuda_backend::cudarc::driver::DevicePtr;
    let stream = dev.cuda_stream();
    // Each tensor once, and for each of `ts` its place among them.
    let mut place = std::collections::HashMap::with_capacity(ts.len());
    let mut distinct: Vec<&Tensor> = Vec::with_capacity(ts.len());
    let which: Vec<usize> = ts
        .iter()
        .map(|&t| {
            *place.entry(t.id()).or_insert_with(|| {
                distinct.push(t);
                distinct.len() - 1
            })
        })
        .collect();
    let held: Vec<_> = distinct.iter().map(|t| t.storage_and_layout()).collect();
    let mut syncs = Vec::with_capacity(held.len());
    let mut distinct_addresses = Vec::with_capacity(held.len());
    for (storage, layout) in &held {
        let candle_core::Storage::Cuda(s) = &**storage else {
            candle_core::bail!("{op}: CUDA tensors expected");
        };
        if s.device().id() != dev.id() {
            candle_core::bail!("{op}: tensors on two CUDA devices");
        }
        let (start, end) = range(layout, "tensor")?;
        let (base, sync) = s.as_cuda_slice::<f32>()?.device_ptr(&stream);
        syncs.push(sync);
        distinct_addresses.push((
            base + (start * std::mem::size_of::<f32>()) as u64,
            end - start,
        ));
    }
    let addresses: Vec<(u64, usize)> = which.iter().map(|&k| distinct_addresses[k]).collect();
    let out = f(&addresses);
    // The buffers' events (when cudarc tracks them) are recorded after the launch.
    drop(syncs);
    out
}

/// A multi-tensor launch's table in device memory: optim.cu's `MultiTensorEntry` for each
/// group of up to four buffers (their addresses, the element count, the first block and the
/// block count), as 7 u64s.
fn upload_table(dev: &CudaDevice, groups: &[&[(u64, usize)]], op: &str) -> Result<Table> {
    let lens = groups
        .iter()
        .map(|g| match g.split_first() {
            Some((&(_, n), rest)) if rest.iter().all(|&(_, m)| m == n) => Ok(n),
            _ => candle_core::bail!("{op}: the buffers of a tensor differ in length"),
        })
        .collect::<Result<Vec<_>>>()?;
    let (dims, blocks) = atomrl_core::launch_dims::multi_tensor(&lens);
    let mut table = Vec::with_capacity(groups.len() * 7);
    let mut first = 0u64;
    for ((group, n), b) in groups.iter().zip(&lens).zip(&blocks) {
        let mut buf = [0u64; 4];
        for (slot, &(address, _)) in buf.iter_mut().zip(group.iter()) {
            *slot = address;
        }
        table.extend(buf);
        table.extend([*n as u64, first, *b as u64]);
        first += *b as u64;
    }
    let count = match i32::try_from(groups.len()) {
        Ok(c) => c,
        Err(_) => candle_core::bail!("{op}: {} tensors in one launch", groups.len()),
    };
    Ok(Table {
        entries: dev.clone_htod(&table)?,
        count,
        config: atomrl_core::cuda::launch_config(dims),
        blocks,
    })
}

/// A multi-tensor table on the device and its launch.
struct Table {
    /// The entries, 7 u64s each.
    entries: CudaSlice<u64>,
    /// The number of entries.
    count: i32,
    /// The launch: the entries' blocks in one grid.
    config: LaunchConfig,
    /// Each entry's block count.
    blocks: Vec<usize>,
}

/// Runs `launch(device, table)` for a multi-tensor launch over `groups` (each a tensor's `K`
/// buffers: contiguous f32 tensors of one length on one CUDA device), the table uploaded and
/// the storages held until it returns; `None` when there is no group. `op` names the launch
/// in errors.
fn launch_multi<const K: usize, R>(
    groups: &[[&Tensor; K]],
    op: &str,
    launch: impl FnOnce(&CudaDevice, &Table) -> Result<R>,
) -> Result<Option<R>> {
    let Some(first) = groups.first() else {
        return Ok(None);
    };
    let dev = cuda_device(first[0], op)?;
    let flat: Vec<&Tensor> = groups.iter().flatten().copied().collect();
    with_addresses(&dev, &flat, op, |addresses| {
        let entries: Vec<&[(u64, usize)]> = addresses.chunks(K).collect();
        let table = upload_table(&dev, &entries, op)?;
        launch(&dev, &table).map(Some)
    })
}

/// AdamW's update (see `adamw_kernel::UpdateScalars::apply`) of every `[θ, m, v, g]` of
/// `params` in place, in one launch: contiguous f32 tensors on one CUDA device, each group of
/// one length, `θ`, `m` and `v` distinct buffers.
pub(crate) fn adamw_multi(
    params: &[[&Tensor; 4]],
    s: &crate::adamw_kernel::UpdateScalars,
) -> Result<()> {
    let args = AdamWArgs::from(s);
    launch_multi(params, "atomrl_adamw_multi_f32", |dev, t| {
        let func = dev.get_or_load_custom_func("atomrl_adamw_multi_f32", MODULE, PTX)?;
        // Launch: each table entry holds four buffers of its `n` f32 elements, alive and
        // distinct (above); argument types as in optim.cu.
        atomrl_core::launch_kernel!(func, t.config, &t.entries, &t.count, &args)?;
        Ok(())
    })?;
    Ok(())
}

/// Gradient sums in one launch: `sum += g` for every `[sum, g]` of `in_place`, and a new tensor
/// `a + b` for every `[a, b]` of `new_sums`, returned in order. Contiguous f32 tensors on one
/// CUDA device, each pair of one shape, every `sum` a distinct buffer.
pub(crate) fn add_multi(
    in_place: &[[&Tensor; 2]],
    new_sums: &[[&Tensor; 2]],
) -> Result<Vec<Tensor>> {
    let Some(first) = in_place.first().or(new_sums.first()) else {
        return Ok(Vec::new());
    };
    let dev = cuda_device(first[0], "atomrl-add-multi")?;
    let made = new_sums
        .iter()
        .map(|[a, _]| {
            // SAFETY: every element is written by the launch below before the tensor is returned.
            let slice = unsafe { dev.alloc::<f32>(a.elem_count())? };
            Ok(atomrl_core::cuda::tensor_from_slice(slice, &dev, a.shape()))
        })
        .collect::<Result<Vec<_>>>()?;
    let groups: Vec<[&Tensor; 3]> = in_place
        .iter()
        .map(|&[sum, g]| [sum, sum, g])
        .chain(new_sums.iter().zip(&made).map(|(&[a, b], out)| [out, a, b]))
        .collect();
    launch_multi(&groups, "atomrl_add_multi_f32", |dev, t| {
        let func = dev.get_or_load_custom_func("atomrl_add_multi_f32", MODULE, PTX)?;
        // Launch: each table entry holds three buffers of its `n` f32 elements, alive (above),
        // the sum distinct from the second term; argument types as in optim.cu.
        atomrl_core::launch_kernel!(func, t.config, &t.entries, &t.count)?;
        Ok(())
    })?;
    Ok(made)
}

/// `Σ x²` of each f32 tensor of `ts` (all on one CUDA device), each as f32 partial sums of a
/// fixed grid added in f64 on the host, in one launch and one device-to-host copy for all of
/// them: the same value on every run, where candle's `sum_all` reduced each tensor in a
/// single block.
pub(crate) fn squared_norms(ts: &[&Tensor]) -> Result<Vec<f64>> {
    // A backward's gradient may be a strided view; the kernel reads contiguous elements.
    let contiguous = ts
        .iter()
        .map(|t| t.contiguous())
        .collect::<Result<Vec<_>>>()?;
    let groups: Vec<[&Tensor; 1]> = contiguous.iter().map(|t| [t]).collect();
    let launched = launch_multi(&groups, "atomrl_sq_norm_multi_f32", |dev, t| {
        let func = dev.get_or_load_custom_func("atomrl_sq_norm_multi_f32", MODULE, PTX)?;
        // SAFETY: every element is written by one block of the launch below.
        let mut parts = unsafe { dev.alloc::<f32>(t.config.grid_dim.0 as usize)? };
        // Launch: each entry's buffer holds its `n` f32 elements; one partial sum per block;
        // argument types as in optim.cu.
        atomrl_core::launch_kernel!(func, t.config, &t.entries, &t.count, &mut parts)?;
        Ok((dev.clone(), parts, t.blocks.clone()))
    })?;
    let Some((dev, parts, blocks)) = launched else {
        return Ok(Vec::new());
    };
    let host = dev.clone_dtoh(&parts)?;
    let mut out = Vec::with_capacity(ts.len());
    let mut start = 0;
    for b in blocks {
        out.push(host[start..start + b].iter().map(|&x| f64::from(x)).sum());
        start += b;
    }
    Ok(out)
}
