//! The CUDA forms of the fused kernels (`crates/atomrl-core/cuda/model.cu`, PTX built by
//! atomrl-core's build script): forward passes as the custom ops' `cuda_fwd`, backward passes
//! as functions the ops' `bwd` calls for CUDA tensors. f32, bf16 and f16, computing in f32.
// Kernel launches are FFI (`atomrl_core::launch_kernel!`) and buffers are allocated
// uninitialised; each says what the kernel reads and writes.
#![allow(unsafe_code)]

use atomrl_core::cuda::{
    contiguous_range as range, elementwise_launch as elementwise_config,
    rows_launch as rows_config, tensor_from_slice as tensor, with_cuda,
};
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::DeviceRepr;
use candle_core::cuda_backend::CudaDType;
use candle_core::op::BackpropOp;
use candle_core::{CudaStorage, DType, Layout, Result, Storage, Tensor};

use super::rope::RopeLayout;
use super::KeyMask;

/// The module name the device caches the PTX under.
const MODULE: &str = "atomrl_model";

/// The PTX of `model.cu`.
fn ptx() -> &'static str {
    atomrl_core::cuda::MODEL_PTX
}

use atomrl_core::cuda::kernel_name as kernel;

/// Whether the CUDA kernels take tensors of `dtype`.
pub(crate) fn supports(dtype: DType) -> bool {
    matches!(dtype, DType::F32 | DType::BF16 | DType::F16)
}

/// Dispatches a generic function on the element type of `dtype`.
macro_rules! by_dtype {
    ($dtype:expr, $f:ident($($arg:expr),*)) => {
        match $dtype {
            DType::F32 => $f::<f32>($($arg),*),
            DType::BF16 => $f::<half::bf16>($($arg),*),
            DType::F16 => $f::<half::f16>($($arg),*),
            dt => candle_core::bail!("atomrl CUDA kernel: unsupported dtype {dt:?}"),
        }
    };
}

/// The element type bounds every kernel needs.
trait Elem: CudaDType + DeviceRepr {}
impl<T: CudaDType + DeviceRepr> Elem for T {}

// ---- RMSNorm

/// `y = w · round(x · inv)` of `x [R, H]`, `w [H]` (`round_xhat`; else `round(w · x · inv)`).
pub(crate) fn rms_norm_fwd(
    x: &CudaStorage,
    lx: &Layout,
    w: &CudaStorage,
    lw: &Layout,
    eps: f64,
    round_xhat: bool,
) -> Result<CudaStorage> {
    fn run<T: Elem>(
        x: &CudaStorage,
        lx: &Layout,
        w: &CudaStorage,
        lw: &Layout,
        eps: f64,
        round_xhat: bool,
    ) -> Result<CudaStorage> {
        let (rx, rw) = (range(lx, "x")?, range(lw, "weight")?);
        let h = rw.1 - rw.0;
        let n = rx.1 - rx.0;
        if h == 0 || n % h != 0 {
            candle_core::bail!("atomrl-rms-norm: {n} elements are not rows of {h}");
        }
        let dev = x.device();
        let func =
            dev.get_or_load_custom_func(&kernel("rms_norm_fwd", x.dtype())?, MODULE, ptx())?;
        let xs = x.as_cuda_slice::<T>()?.slice(rx.0..rx.1);
        let ws = w.as_cuda_slice::<T>()?.slice(rw.0..rw.1);
        // SAFETY: every element is written by the kernel below before it is read.
        let out = unsafe { dev.alloc::<T>(n)? };
        let (hi, e, r) = (h as i32, eps as f32, i32::from(round_xhat));
        // Launch: reads n elements of x and h of w, writes n of out; types as in model.cu.
        atomrl_core::launch_kernel!(func, rows_config(n / h, h), &xs, &ws, &out, &hi, &e, &r)?;
        Ok(T::wrap_cuda_slice(out, dev.clone()))
    }
    by_dtype!(x.dtype(), run(x, lx, w, lw, eps, round_xhat))
}

/// `(dx, dw)` of RMSNorm for CUDA tensors `x [.., H]`, `w [H]`, `g` like `x`; `dw` only when
/// `want_dw` (summed over row chunks in order: deterministic).
pub(crate) fn rms_norm_bwd(
    x: &Tensor,
    w: &Tensor,
    g: &Tensor,
    eps: f64,
    want_dw: bool,
) -> Result<(Tensor, Option<Tensor>)> {
    fn run<T: Elem>(
        x: &Tensor,
        w: &Tensor,
        g: &Tensor,
        eps: f64,
        want_dw: bool,
    ) -> Result<(Tensor, Option<Tensor>)> {
        const CHUNK: usize = 64;
        let h = w.elem_count();
        let n = x.elem_count();
        let rows = n / h.max(1);
        with_cuda(x, |xs, lx| {
            with_cuda(w, |ws, lw| {
                with_cuda(g, |gs, lg| {
                    let dev = xs.device();
                    let dt = xs.dtype();
                    let (rx, rw, rg) = (range(lx, "x")?, range(lw, "w")?, range(lg, "g")?);
                    let xv = xs.as_cuda_slice::<T>()?.slice(rx.0..rx.1);
                    let wv = ws.as_cuda_slice::<T>()?.slice(rw.0..rw.1);
                    let gv = gs.as_cuda_slice::<T>()?.slice(rg.0..rg.1);
                    let (hi, e) = (h as i32, eps as f32);
                    // SAFETY (allocations): each kernel below writes all of its output.
                    let inv = unsafe { dev.alloc::<f32>(rows)? };
                    let f =
                        dev.get_or_load_custom_func(&kernel("rms_norm_inv", dt)?, MODULE, ptx())?;
                    // Launch: reads `rows × h` of x, writes `rows` of inv.
                    atomrl_core::launch_kernel!(f, rows_config(rows, h), &xv, &inv, &hi, &e)?;
                    let dx = unsafe { dev.alloc::<T>(n)? };
                    let f =
                        dev.get_or_load_custom_func(&kernel("rms_norm_dx", dt)?, MODULE, ptx())?;
                    // Launch: reads x, g (n), w (h), inv (rows); writes n of dx.
                    atomrl_core::launch_kernel!(
                        f,
                        rows_config(rows, h),
                        &xv,
                        &wv,
                        &gv,
                        &inv,
                        &dx,
                        &hi
                    )?;
                    let dx = tensor(dx, dev, x.shape().clone());
                    if !want_dw {
                        return Ok((dx, None));
                    }
                    let chunks = rows.div_ceil(CHUNK).max(1);
                    let part = unsafe { dev.alloc::<f32>(chunks * h)? };
                    let f = dev.get_or_load_custom_func(
                        &kernel("rms_norm_dw_part", dt)?,
                        MODULE,
                        ptx(),
                    )?;
                    let (ri, ci) = (rows as i32, CHUNK as i32);
                    let cfg = atomrl_core::cuda::launch_config(
                        atomrl_core::launch_dims::rms_norm_dw(h, chunks),
                    );
                    // Launch: reads x, g, inv; writes chunks × h of part (threads past h return).
                    atomrl_core::launch_kernel!(f, cfg, &xv, &gv, &inv, &part, &ri, &hi, &ci)?;
                    let dw = tensor(part, dev, (chunks, h)).sum(0)?.to_dtype(w.dtype())?;
                    Ok((dx, Some(dw.reshape(w.shape())?)))
                })
            })
        })
    }
    by_dtype!(x.dtype(), run(x, w, g, eps, want_dw))
}

// ---- SwiGLU

/// `silu(gate) · up`.
pub(crate) fn swiglu_fwd(
    g: &CudaStorage,
    lg: &Layout,
    u: &CudaStorage,
    lu: &Layout,
) -> Result<CudaStorage> {
    fn run<T: Elem>(
        g: &CudaStorage,
        lg: &Layout,
        u: &CudaStorage,
        lu: &Layout,
    ) -> Result<CudaStorage> {
        let (rg, ru) = (range(lg, "gate")?, range(lu, "up")?);
        let n = rg.1 - rg.0;
        if ru.1 - ru.0 != n {
            candle_core::bail!("atomrl-swiglu: gate and up differ in size");
        }
        let dev = g.device();
        let func = dev.get_or_load_custom_func(&kernel("swiglu_fwd", g.dtype())?, MODULE, ptx())?;
        let gv = g.as_cuda_slice::<T>()?.slice(rg.0..rg.1);
        let uv = u.as_cuda_slice::<T>()?.slice(ru.0..ru.1);
        // SAFETY: written in full by the kernel.
        let out = unsafe { dev.alloc::<T>(n)? };
        // Launch: n elements of each; types as in model.cu.
        atomrl_core::launch_kernel!(func, elementwise_config(n), &gv, &uv, &out, &n)?;
        Ok(T::wrap_cuda_slice(out, dev.clone()))
    }
    by_dtype!(g.dtype(), run(g, lg, u, lu))
}

/// `(dgate, dup)` of SwiGLU: one kernel writes both.
pub(crate) fn swiglu_bwd(gate: &Tensor, up: &Tensor, grad: &Tensor) -> Result<(Tensor, Tensor)> {
    fn run<T: Elem>(gate: &Tensor, up: &Tensor, grad: &Tensor) -> Result<(Tensor, Tensor)> {
        let n = gate.elem_count();
        let both = with_cuda(gate, |gs, lg| {
            with_cuda(up, |us, lu| {
                with_cuda(grad, |rs, lr| {
                    let dev = gs.device();
                    let (a, b_, c) = (range(lg, "gate")?, range(lu, "up")?, range(lr, "grad")?);
                    let gv = gs.as_cuda_slice::<T>()?.slice(a.0..a.1);
                    let uv = us.as_cuda_slice::<T>()?.slice(b_.0..b_.1);
                    let rv = rs.as_cuda_slice::<T>()?.slice(c.0..c.1);
                    let f = dev.get_or_load_custom_func(
                        &kernel("swiglu_bwd", gs.dtype())?,
                        MODULE,
                        ptx(),
                    )?;
                    // SAFETY: written in full by the kernel.
                    let out = unsafe { dev.alloc::<T>(2 * n)? };
                    // Launch: reads n of each input, writes 2n of out.
                    atomrl_core::launch_kernel!(f, elementwise_config(n), &gv, &uv, &rv, &out, &n)?;
                    Ok(tensor(out, dev, (2, n)))
                })
            })
        })?;
        let dg = both.narrow(0, 0, 1)?.reshape(gate.shape())?;
        let du = both.narrow(0, 1, 1)?.reshape(up.shape())?;
        Ok((dg, du))
    }
    by_dtype!(gate.dtype(), run(gate, up, grad))
}

// ---- The decode step's forward-only kernels

/// `(s, y)`: `s = x + r` and `y` its RMSNorm with `w [H]`, for CUDA tensors `x`, `r [R, H]`.
pub(crate) fn add_rms_norm(
    x: &Tensor,
    r: &Tensor,
    w: &Tensor,
    eps: f64,
) -> Result<(Tensor, Tensor)> {
    fn run<T: Elem>(x: &Tensor, r: &Tensor, w: &Tensor, eps: f64) -> Result<(Tensor, Tensor)> {
        let h = w.elem_count();
        let n = x.elem_count();
        if h == 0 || n % h != 0 || r.elem_count() != n {
            candle_core::bail!(
                "atomrl-add-rms-norm: x {:?}, r {:?} are not rows of {h}",
                x.dims(),
                r.dims()
            );
        }
        with_cuda(x, |xs, lx| {
            with_cuda(r, |rs, lr| {
                with_cuda(w, |ws, lw| {
                    let dev = xs.device();
                    let (a, b, c) = (range(lx, "x")?, range(lr, "r")?, range(lw, "w")?);
                    let xv = xs.as_cuda_slice::<T>()?.slice(a.0..a.1);
                    let rv = rs.as_cuda_slice::<T>()?.slice(b.0..b.1);
                    let wv = ws.as_cuda_slice::<T>()?.slice(c.0..c.1);
                    let f = dev.get_or_load_custom_func(
                        &kernel("add_rms_norm_fwd", xs.dtype())?,
                        MODULE,
                        ptx(),
                    )?;
                    // SAFETY: the kernel writes every element of both.
                    let (sum, y) = unsafe { (dev.alloc::<T>(n)?, dev.alloc::<T>(n)?) };
                    let (hi, e) = (h as i32, eps as f32);
                    // Launch: reads n of x and r, h of w; writes n of sum and of y.
                    atomrl_core::launch_kernel!(
                        f,
                        rows_config(n / h, h),
                        &xv,
                        &rv,
                        &wv,
                        &sum,
                        &y,
                        &hi,
                        &e
                    )?;
                    Ok((
                        tensor(sum, dev, x.shape().clone()),
                        tensor(y, dev, x.shape().clone()),
                    ))
                })
            })
        })
    }
    by_dtype!(x.dtype(), run(x, r, w, eps))
}

/// `silu(gate) · up` of a CUDA tensor `gu [R, 2·I]` holding gate | up per row → `[R, I]`.
pub(crate) fn swiglu_packed(gu: &Tensor) -> Result<Tensor> {
    fn run<T: Elem>(gu: &Tensor) -> Result<Tensor> {
        let (rows, two_i) = gu.dims2()?;
        if two_i % 2 != 0 {
            candle_core::bail!("atomrl-swiglu-packed: odd width {two_i}");
        }
        let inter = two_i / 2;
        let n = rows * inter;
        with_cuda(gu, |gs, lg| {
            let dev = gs.device();
            let a = range(lg, "gate/up")?;
            let gv = gs.as_cuda_slice::<T>()?.slice(a.0..a.1);
            let f = dev.get_or_load_custom_func(
                &kernel("swiglu_packed_fwd", gs.dtype())?,
                MODULE,
                ptx(),
            )?;
            // SAFETY: written in full by the kernel.
            let out = unsafe { dev.alloc::<T>(n)? };
            let ii = inter as i32;
            // Launch: reads 2n of gu, writes n of out.
            atomrl_core::launch_kernel!(f, elementwise_config(n), &gv, &out, &ii, &n)?;
            Ok(tensor(out, dev, (rows, inter)))
        })
    }
    by_dtype!(gu.dtype(), run(gu))
}

// ---- RoPE

/// Rotary embeddings of `x [N, H, L, d]` (its layout and elements' range `a..b`, as
/// [`RopeLayout::of`] gives them) or their backward (`back`); `layouts`: how `x` and the result
/// lie in memory.
pub(crate) fn rope(
    x: &CudaStorage,
    (lx, a, b): (&Layout, usize, usize),
    cos: &Tensor,
    sin: &Tensor,
    back: bool,
    layouts: (RopeLayout, RopeLayout),
) -> Result<CudaStorage> {
    fn run<T: Elem>(
        x: &CudaStorage,
        (lx, a, b): (&Layout, usize, usize),
        cos: &Tensor,
        sin: &Tensor,
        back: bool,
        (x_lie, y_lie): (RopeLayout, RopeLayout),
    ) -> Result<CudaStorage> {
        let (n_, heads, l, d) = match lx.dims() {
            &[a, b, c, e] => (a, b, c, e),
            dims => candle_core::bail!("atomrl-rope: x must be [N, H, L, d], got {dims:?}"),
        };
        let rows = n_ * heads * l;
        with_cuda(cos, |cs, lc| {
            with_cuda(sin, |ss, ls| {
                let dev = x.device();
                let (rc, rs) = (range(lc, "cos")?, range(ls, "sin")?);
                let xv = x.as_cuda_slice::<T>()?.slice(a..b);
                let cv = cs.as_cuda_slice::<T>()?.slice(rc.0..rc.1);
                let sv = ss.as_cuda_slice::<T>()?.slice(rs.0..rs.1);
                let f = dev.get_or_load_custom_func(&kernel("rope", x.dtype())?, MODULE, ptx())?;
                // SAFETY: written in full by the kernel.
                let out = unsafe { dev.alloc::<T>(rows * d)? };
                let (hi, li, di, bi) = (heads as i32, l as i32, d as i32, i32::from(back));
                let (xt, yt) = (
                    i32::from(x_lie == RopeLayout::TokenMajor),
                    i32::from(y_lie == RopeLayout::TokenMajor),
                );
                // Launch: reads rows × d of x (either layout spans a..b) and N × L × d of the
                // tables (checked by `rope_fits`), writes rows × d of out.
                atomrl_core::launch_kernel!(
                    f,
                    elementwise_config(rows * d / 2),
                    &xv,
                    &cv,
                    &sv,
                    &out,
                    &hi,
                    &li,
                    &di,
                    &rows,
                    &bi,
                    &xt,
                    &yt
                )?;
                Ok(T::wrap_cuda_slice(out, dev.clone()))
            })
        })
    }
    by_dtype!(x.dtype(), run(x, (lx, a, b), cos, sin, back, layouts))
}

/// [`rope`]'s transpose applied to a gradient tensor, the result laid out as `layouts.1`.
pub(crate) fn rope_bwd(
    g: &Tensor,
    cos: &Tensor,
    sin: &Tensor,
    layouts: (RopeLayout, RopeLayout),
) -> Result<Tensor> {
    let g = g.contiguous()?;
    let storage = with_cuda(&g, |gs, lg| {
        let (a, b) = range(lg, "g")?;
        rope(gs, (lg, a, b), cos, sin, true, layouts)
    })?;
    match (layouts.1, g.dims()) {
        (RopeLayout::TokenMajor, &[n, h, l, d]) => {
            let t = Tensor::from_storage(
                Storage::Cuda(storage),
                (n, l, h, d),
                BackpropOp::none(),
                false,
            );
            t.transpose(1, 2)
        }
        _ => Ok(Tensor::from_storage(
            Storage::Cuda(storage),
            g.shape().clone(),
            BackpropOp::none(),
            false,
        )),
    }
}

// ---- Attention softmax

/// `softmax(scale · scores + bias)` of `scores [N, H, L, S]`, the bias from `mask` (its
/// padding part from `pad_bias [N, S]`, a device tensor in the scores' dtype).
pub(crate) fn attn_softmax_fwd(
    scores: &CudaStorage,
    l: &Layout,
    scale: f64,
    mask: &KeyMask,
) -> Result<CudaStorage> {
    fn run<T: Elem>(
        scores: &CudaStorage,
        l: &Layout,
        scale: f64,
        mask: &KeyMask,
    ) -> Result<CudaStorage> {
        let (n_, heads, len, s) = match l.dims() {
            &[a, b, c, e] => (a, b, c, e),
            dims => candle_core::bail!(
                "atomrl-attention-softmax: scores must be [N, H, L, S], got {dims:?}"
            ),
        };
        let r = range(l, "scores")?;
        let dev = scores.device();
        let sv = scores.as_cuda_slice::<T>()?.slice(r.0..r.1);
        let launch = |pad: Option<&CudaStorage>, lp: Option<&Layout>| -> Result<CudaStorage> {
            let f = dev.get_or_load_custom_func(
                &kernel("attn_softmax_fwd", scores.dtype())?,
                MODULE,
                ptx(),
            )?;
            // SAFETY: written in full by the kernel.
            let out = unsafe { dev.alloc::<T>(r.1 - r.0)? };
            let pv = match (pad, lp) {
                (Some(p), Some(lp)) => {
                    let rp = range(lp, "pad bias")?;
                    if rp.1 - rp.0 != n_ * s {
                        candle_core::bail!(
                            "atomrl-attention-softmax: pad bias of {} for [{n_}, {s}]",
                            rp.1 - rp.0
                        );
                    }
                    p.as_cuda_slice::<T>()?.slice(rp.0..rp.1)
                }
                // Not read when has_pad = 0.
                _ => scores.as_cuda_slice::<T>()?.slice(r.0..r.1),
            };
            let (hi, li, si, past) = (heads as i32, len as i32, s as i32, mask.past as i32);
            let causal = i32::from(mask.causal);
            let (sc, mv, has_pad) = (
                scale as f32,
                mask.mask_value as f32,
                i32::from(pad.is_some()),
            );
            // Launch: reads the scores (and N × S of the pad bias when has_pad), writes as
            // many probabilities; types as in model.cu.
            atomrl_core::launch_kernel!(
                f,
                rows_config(n_ * heads * len, s),
                &sv,
                &pv,
                &out,
                &hi,
                &li,
                &si,
                &past,
                &causal,
                &sc,
                &mv,
                &has_pad
            )?;
            Ok(T::wrap_cuda_slice(out, dev.clone()))
        };
        match &mask.pad_bias {
            Some(pad) => {
                let pad = pad.to_dtype(scores.dtype())?;
                with_cuda(&pad, |ps, lp| launch(Some(ps), Some(lp)))
            }
            None => launch(None, None),
        }
    }
    by_dtype!(scores.dtype(), run(scores, l, scale, mask))
}

/// `dscores = scale · p · (g − Σ g·p)` per row of `p`, `g [N, H, L, S]`.
pub(crate) fn attn_softmax_bwd(p: &Tensor, g: &Tensor, scale: f64) -> Result<Tensor> {
    fn run<T: Elem>(p: &Tensor, g: &Tensor, scale: f64) -> Result<Tensor> {
        let s = p.dim(candle_core::D::Minus1)?;
        let n = p.elem_count();
        with_cuda(p, |ps, lp| {
            with_cuda(g, |gs, lg| {
                let dev = ps.device();
                let (rp, rg) = (range(lp, "p")?, range(lg, "g")?);
                let pv = ps.as_cuda_slice::<T>()?.slice(rp.0..rp.1);
                let gv = gs.as_cuda_slice::<T>()?.slice(rg.0..rg.1);
                let f = dev.get_or_load_custom_func(
                    &kernel("attn_softmax_bwd", ps.dtype())?,
                    MODULE,
                    ptx(),
                )?;
                // SAFETY: written in full by the kernel.
                let dx = unsafe { dev.alloc::<T>(n)? };
                let (si, sc) = (s as i32, scale as f32);
                // Launch: n elements of p, g and dx.
                atomrl_core::launch_kernel!(
                    f,
                    rows_config(n / s.max(1), s),
                    &pv,
                    &gv,
                    &dx,
                    &si,
                    &sc
                )?;
                Ok(tensor(dx, dev, p.shape().clone()))
            })
        })
    }
    by_dtype!(p.dtype(), run(p, g, scale))
}
