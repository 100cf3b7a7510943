//! The CUDA side of [`super::StaticDecode`]: the launches of `cuda/decode.cu` (whose per-step
//! values are read from device memory) and the capture of a decode step into a CUDA graph.
// Kernel launches and graph capture are FFI; each launch says what the kernel reads and writes.
#![allow(unsafe_code)]

use atomrl_core::cuda::{contiguous_range, elementwise_launch};
use candle_core::cuda_backend::cudarc::driver::{sys, CudaGraph, CudaView, DeviceRepr};
use candle_core::cuda_backend::CudaDType;
use candle_core::{DType, Device, Result, Storage, Tensor, WithDType};

use super::Projections;

/// The module name the device caches the PTX under.
const MODULE: &str = "atomrl_decode";

use atomrl_core::cuda::kernel_name as kernel;

/// The CUDA device of `t`.
fn cuda_device(t: &Tensor) -> Result<candle_core::CudaDevice> {
    match t.device() {
        Device::Cuda(d) => Ok(d.clone()),
        _ => candle_core::bail!("atomrl decode kernel: a CUDA tensor was expected"),
    }
}

/// Runs `f` on the device views of `ts` (contiguous tensors of one element type `T`, each
/// named in errors by `names`).
fn with_views<T: CudaDType + DeviceRepr, R>(
    ts: &[&Tensor],
    names: &[&str],
    f: impl FnOnce(&[CudaView<'_, T>]) -> Result<R>,
) -> Result<R> {
    let guards: Vec<_> = ts.iter().map(|t| t.storage_and_layout()).collect();
    let mut views = Vec::with_capacity(ts.len());
    for ((storage, layout), name) in guards.iter().zip(names) {
        let (a, b) = contiguous_range(layout, name)?;
        match &**storage {
            Storage::Cuda(s) => views.push(s.as_cuda_slice::<T>()?.slice(a..b)),
            _ => candle_core::bail!("atomrl decode kernel: {name} must be a CUDA tensor"),
        }
    }
    f(&views)
}

/// The step's key-padding bias `[B, 1, 1, cap]` in `dtype`: 0 where `starts[b] ≤ j ≤ slot`,
/// `mask_value` elsewhere (`step` is the u32 input block `[ids, positions, slot]`).
pub(super) fn decode_bias(
    starts: &Tensor,
    step: &Tensor,
    cap: usize,
    dtype: DType,
    mask_value: f64,
) -> Result<Tensor> {
    fn run<T: CudaDType + DeviceRepr + WithDType>(
        starts: &Tensor,
        step: &Tensor,
        cap: usize,
        mask_value: f64,
    ) -> Result<Tensor> {
        let dev = cuda_device(starts)?;
        let rows = starts.elem_count();
        let func = dev.get_or_load_custom_func(
            &kernel("decode_bias", T::DTYPE)?,
            MODULE,
            atomrl_core::cuda::DECODE_PTX,
        )?;
        // SAFETY: the kernel writes every element.
        let out = unsafe { dev.alloc::<T>(rows * cap)? };
        with_views::<u32, _>(&[starts, step], &["starts", "step"], |v| {
            let (r, c, m) = (rows as i32, cap as i32, mask_value as f32);
            // Launch: reads `rows` starts and the slot, writes rows × cap of out.
            atomrl_core::launch_kernel!(
                func,
                elementwise_launch(rows * cap),
                &v[0],
                &v[1],
                &out,
                &r,
                &c,
                &m
            )
        })?;
        Ok(atomrl_core::cuda::tensor_from_slice(
            out,
            &dev,
            (rows, 1, 1, cap),
        ))
    }
    let (starts, step) = (starts.contiguous()?, step.contiguous()?);
    match dtype {
        DType::F32 => run::<f32>(&starts, &step, cap, mask_value),
        DType::BF16 => run::<half::bf16>(&starts, &step, cap, mask_value),
        DType::F16 => run::<half::f16>(&starts, &step, cap, mask_value),
        dt => candle_core::bail!("atomrl decode kernel: unsupported dtype {dt:?}"),
    }
}

/// The new token's projections through `decode_qkv` (see [`Projections`]): biases added when
/// given, RoPE from the tables `[P, d]` at each row's position; writes the key and value into
/// column `slot` of `k_cache`, `v_cache [B, KV, cap, d]` and returns the rotated queries
/// `[B, H, d]`.
pub(super) fn decode_qkv(
    proj: &Projections<'_>,
    rope: (&Tensor, &Tensor),
    step: &Tensor,
    cache: (&Tensor, &Tensor),
    heads: (usize, usize, usize),
) -> Result<Tensor> {
    /// Where the kernel reads: `ts` = [q, k, v, q bias, k bias, v bias, cos, sin, k cache,
    /// v cache], each at `offsets[i]` elements into its tensor; q rows `ld_q` apart, k and v
    /// rows `ld_kv` apart.
    struct Reads<'a> {
        ts: [&'a Tensor; 10],
        offsets: [usize; 6],
        ld: (usize, usize),
        has_bias: bool,
    }
    fn run<T: CudaDType + DeviceRepr + WithDType>(
        r: &Reads<'_>,
        step: &Tensor,
        rows: usize,
        (h, kv, d): (usize, usize, usize),
        cap: usize,
    ) -> Result<Tensor> {
        let dev = cuda_device(step)?;
        let func = dev.get_or_load_custom_func(
            &kernel("decode_qkv", T::DTYPE)?,
            MODULE,
            atomrl_core::cuda::DECODE_PTX,
        )?;
        // SAFETY: the kernel writes every element (each (row, head, k) pair writes k, k + d/2).
        let q_out = unsafe { dev.alloc::<T>(rows * h * d)? };
        let names = [
            "q", "k", "v", "q bias", "k bias", "v bias", "cos", "sin", "k cache", "v cache",
        ];
        with_views::<T, _>(&r.ts, &names, |t| {
            let at = |i: usize| t[i].slice(r.offsets[i]..);
            let (q, k, v, qb, kb, vb) = (at(0), at(1), at(2), at(3), at(4), at(5));
            with_views::<u32, _>(&[step], &["step"], |s| {
                let (hb, rr, hh, kk, dd, c) = (
                    i32::from(r.has_bias),
                    rows as i32,
                    h as i32,
                    kv as i32,
                    d as i32,
                    cap as i32,
                );
                let (ldq, ldkv) = (r.ld.0 as i32, r.ld.1 as i32);
                // Launch: reads q, k, v (and their biases when has_bias) at their row strides,
                // one table row per row and the step block; writes q_out and column `slot` of
                // both caches.
                atomrl_core::launch_kernel!(
                    func,
                    elementwise_launch(rows * (h + 2 * kv) * d / 2),
                    &q,
                    &k,
                    &v,
                    &qb,
                    &kb,
                    &vb,
                    &hb,
                    &t[6],
                    &t[7],
                    &s[0],
                    &q_out,
                    &t[8],
                    &t[9],
                    &rr,
                    &hh,
                    &kk,
                    &dd,
                    &c,
                    &ldq,
                    &ldkv
                )
            })
        })?;
        Ok(atomrl_core::cuda::tensor_from_slice(
            q_out,
            &dev,
            (rows, h, d),
        ))
    }
    let (h, kv, d) = heads;
    let cap = cache.0.dim(2)?;
    let step = step.contiguous()?;
    let (rows, parts, ld, bias_parts, has_bias, offsets) = match *proj {
        Projections::Apart { q, k, v, bias } => {
            let parts = [q.contiguous()?, k.contiguous()?, v.contiguous()?];
            // Without biases the kernel reads none; q stands in for the pointers.
            let biases = match bias {
                Some([a, b, c]) => [a.contiguous()?, b.contiguous()?, c.contiguous()?],
                None => [parts[0].clone(), parts[0].clone(), parts[0].clone()],
            };
            let ld = (h * d, kv * d);
            (q.dim(0)?, parts, ld, biases, bias.is_some(), [0; 6])
        }
        Projections::Merged { qkv, bias } => {
            let qkv = qkv.contiguous()?;
            let b = match bias {
                Some(b) => b.contiguous()?,
                None => qkv.clone(),
            };
            let w = (h + 2 * kv) * d;
            // k and v start H·d and (H + KV)·d elements into each row, and into the bias (or
            // its stand-in, qkv itself, which the kernel does not read).
            let (ok, ov) = (h * d, (h + kv) * d);
            (
                qkv.dim(0)?,
                [qkv.clone(), qkv.clone(), qkv],
                (w, w),
                [b.clone(), b.clone(), b],
                bias.is_some(),
                [0, ok, ov, 0, ok, ov],
            )
        }
    };
    let reads = Reads {
        ts: [
            &parts[0],
            &parts[1],
            &parts[2],
            &bias_parts[0],
            &bias_parts[1],
            &bias_parts[2],
            rope.0,
            rope.1,
            cache.0,
            cache.1,
        ],
        offsets,
        ld,
        has_bias,
    };
    match parts[0].dtype() {
        DType::F32 => run::<f32>(&reads, &step, rows, heads, cap),
        DType::BF16 => run::<half::bf16>(&reads, &step, rows, heads, cap),
        DType::F16 => run::<half::f16>(&reads, &step, rows, heads, cap),
        dt => candle_core::bail!("atomrl decode kernel: unsupported dtype {dt:?}"),
    }
}

/// A decode step captured as a CUDA graph, replayed with [`Graph::replay`].
pub(super) struct Graph(CudaGraph);

impl std::fmt::Debug for Graph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Graph")
    }
}

impl Graph {
    /// Records the work `f` queues on `device`'s stream (nothing runs) as a graph. Fails when
    /// `f` fails or does something a capture cannot hold (a host synchronisation, a copy from
    /// pageable memory): the capture is ended either way and the stream stays usable.
    pub fn capture(device: &Device, f: impl FnOnce() -> Result<()>) -> Result<Self> {
        let Device::Cuda(dev) = device else {
            candle_core::bail!("CUDA graph capture needs a CUDA device");
        };
        let stream = dev.cuda_stream();
        stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(|e| candle_core::Error::Msg(format!("begin capture: {e:?}")))?;
        let ran = f();
        let ended = stream.end_capture(sys::CUgraphInstantiate_flags_enum(0));
        // A failed capture may leave an error recorded by frees queued while it was invalid.
        let _ = stream.context().check_err();
        ran?;
        match ended {
            Ok(Some(g)) => Ok(Self(g)),
            Ok(None) => candle_core::bail!("CUDA graph capture recorded nothing"),
            Err(e) => candle_core::bail!("CUDA graph capture failed: {e:?}"),
        }
    }

    /// Queues the captured work on the stream it was captured from.
    pub fn replay(&self) -> Result<()> {
        self.0
            .launch()
            .map_err(|e| candle_core::Error::Msg(format!("CUDA graph launch: {e:?}")))
    }
}
