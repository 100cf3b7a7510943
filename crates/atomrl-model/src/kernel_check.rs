//! Each fused decoder kernel alone on a device, for `xtask device-check`: the same random
//! inputs through the fused kernel or its tensor-op form, with the output and the gradient of
//! every input, so that a device can be compared kernel by kernel with the CPU and with the
//! tensor-op forms on the same device.

use std::sync::Arc;

use candle_core::{DType, Device, Result, Tensor, Var, D};

use crate::kernels::{self, KeyMask};
use crate::ops;

/// The mask value of the checks' masks (see [`masks`]).
const MASK_VALUE: f32 = -1_073_741_824.0;

/// A kernel's output and its inputs' gradients, by name (`out`, `d/x`, ...).
pub type KernelOutputs = Vec<(String, Tensor)>;

/// Deterministic values in about `[-2, 2]`.
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % 4001) as f32 / 1000.0 - 2.0
        })
        .collect()
}

fn input(dims: &[usize], seed: u64, dtype: DType, device: &Device) -> Result<Var> {
    let n = dims.iter().product();
    let t = Tensor::from_vec(values(n, seed), dims, &Device::Cpu)?
        .to_dtype(dtype)?
        .to_device(device)?;
    Var::from_tensor(&t)
}

/// `out` and the gradients of `Σ out · r` (fixed random `r`) with respect to `inputs`.
fn outputs(out: Tensor, inputs: &[(&str, &Var)]) -> Result<KernelOutputs> {
    let r = input(out.dims(), 99, out.dtype(), out.device())?;
    let grads = (&out * r.as_tensor())?
        .to_dtype(DType::F32)?
        .sum_all()?
        .backward()?;
    let mut named = vec![("out".to_string(), out)];
    for (name, v) in inputs {
        if let Some(g) = grads.get(v.as_tensor()) {
            named.push((format!("d/{name}"), g.clone()));
        }
    }
    Ok(named)
}

/// The fused kernel when `fused` and the device and dtype have one, else the tensor-op form.
fn pick(fused: bool, t: &Tensor) -> bool {
    fused && kernels::fused_on(t)
}

/// The kernel names [`run`] takes.
pub const KERNELS: [&str; 9] = [
    "rms-norm",
    "swiglu",
    "rope",
    "rope-token-major",
    "attention-softmax",
    "add-rms-norm",
    "swiglu-packed",
    "chunked-attention",
    "flash-attention",
];

/// Runs kernel `name` (one of [`KERNELS`]) on `device` in `dtype`, fused when `fused` (and
/// available for the device and dtype), else in its tensor-op form.
///
/// Shapes: RMSNorm `x [3, 5, 96]`, `w [96]`; SwiGLU `[3, 5, 80]`; RoPE `x [2, 3, 6, 16]` with
/// tables `[2, 1, 6, 16]`, and token-major (the attention's projections `[2, 6, 3, 16]` read
/// as their `transpose(1, 2)`, the gradient written back in their layout); attention softmax scores `[2, 3, 4, 7]` after 3 cached positions,
/// causal, with the second row's first two keys padded. Attention in chunks of queries
/// (`crate::attention`, against the unchunked tensor-op form): `q [2, 4, 6, 8]` after 2 cached
/// positions over `k, v [2, 2, 8, 8]`, the second row's first three keys padded (so its first
/// query sees only padding), two queries a chunk. FlashAttention (CUDA; elsewhere the fused
/// unchunked form), against the tensor-op form: `q [2, 4, 37, 16]` after 5 cached positions
/// over `k, v [2, 2, 42, 16]`, the second row's first 9 keys padded (its first 4 queries see
/// only padding): several tiles of queries and keys. The decode step's forward-only
/// kernels give no gradients: the residual add with RMSNorm `x`, `r [15, 96]` (outputs `sum`
/// and `out`), SwiGLU of a merged gate/up `[15, 160]`.
///
/// # Errors
/// An unknown `name`, or a tensor failure on the device.
///
/// ```
/// use atomrl_model::kernel_check::{run, KERNELS};
/// use candle_core::{DType, Device};
/// for k in KERNELS {
///     let fused = run(k, &Device::Cpu, DType::F32, true)?;
///     let plain = run(k, &Device::Cpu, DType::F32, false)?;
///     assert_eq!(fused.len(), plain.len());
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn run(name: &str, device: &Device, dtype: DType, fused: bool) -> Result<KernelOutputs> {
    match name {
        "rms-norm" => {
            let x = input(&[3, 5, 96], 1, dtype, device)?;
            let w = input(&[96], 2, dtype, device)?;
            let out = if pick(fused, x.as_tensor()) {
                kernels::rms_norm(x.as_tensor(), w.as_tensor(), 1e-6)?
            } else {
                ops::rms_norm_ops(x.as_tensor(), w.as_tensor(), 1e-6)?
            };
            outputs(out, &[("x", &x), ("w", &w)])
        }
        "swiglu" => {
            let g = input(&[3, 5, 80], 3, dtype, device)?;
            let u = input(&[3, 5, 80], 4, dtype, device)?;
            let out = if pick(fused, g.as_tensor()) {
                kernels::swiglu(g.as_tensor(), u.as_tensor())?
            } else {
                (g.as_tensor().silu()? * u.as_tensor())?
            };
            outputs(out, &[("gate", &g), ("up", &u)])
        }
        "rope" => {
            let x = input(&[2, 3, 6, 16], 5, dtype, device)?;
            outputs(rope(x.as_tensor(), 6, device, dtype, fused)?, &[("x", &x)])
        }
        "rope-token-major" => {
            let x = input(&[2, 6, 3, 16], 12, dtype, device)?;
            let view = x.as_tensor().transpose(1, 2)?;
            outputs(rope(&view, 13, device, dtype, fused)?, &[("x", &x)])
        }
        "attention-softmax" => attention(device, dtype, fused),
        "chunked-attention" => chunked_attention(device, dtype, fused),
        "flash-attention" => flash_attention(device, dtype, fused),
        "add-rms-norm" => {
            let x = input(&[15, 96], 8, dtype, device)?.as_tensor().detach();
            let r = input(&[15, 96], 9, dtype, device)?.as_tensor().detach();
            let w = input(&[96], 10, dtype, device)?.as_tensor().detach();
            let (sum, out) = if pick(fused, &x) {
                kernels::add_rms_norm(&x, &r, &w, 1e-6, true)?
            } else {
                // Rounded once after the weight, as the kernel (the generation view's norm).
                let sum = (&x + &r)?;
                let f32s = |t: &Tensor| t.to_dtype(DType::F32);
                let out = ops::rms_norm_ops(&f32s(&sum)?, &f32s(&w)?, 1e-6)?.to_dtype(dtype)?;
                (sum, out)
            };
            Ok(vec![("sum".to_string(), sum), ("out".to_string(), out)])
        }
        "swiglu-packed" => {
            let gu = input(&[15, 160], 11, dtype, device)?.as_tensor().detach();
            let out = if pick(fused, &gu) {
                kernels::swiglu_packed(&gu)?
            } else {
                (gu.narrow(1, 0, 80)?.silu()? * gu.narrow(1, 80, 80)?)?
            };
            Ok(vec![("out".to_string(), out)])
        }
        other => candle_core::bail!(
            "kernel_check: unknown kernel `{other}`, expected one of {KERNELS:?}"
        ),
    }
}

/// Runs every kernel on `device` in f32, fused and in its tensor-op form, and checks that
/// each output and gradient agrees to 1e-4 (relative L2 norm) and is finite: the self-check
/// the CUDA kernels pass before a process uses them on a GPU. FlashAttention has a check of its
/// own ([`flash_self_check`]), so that it cannot turn the other kernels off.
///
/// # Errors
/// The first disagreement, naming the kernel and the tensor, or a tensor failure.
///
/// ```
/// atomrl_model::kernel_check::self_check(&candle_core::Device::Cpu)?;
/// # Ok::<(), String>(())
/// ```
pub fn self_check(device: &Device) -> std::result::Result<(), String> {
    for k in KERNELS.into_iter().filter(|&k| k != "flash-attention") {
        agrees_with_tensor_ops(k, device, DType::F32, 1e-4)?;
    }
    Ok(())
}

/// FlashAttention's self-check, before a process first uses it on a GPU: in f32 (its
/// CUDA-core kernels) to 1e-4, and in bf16 (the tensor-core kernels that bf16 and f16 take) to
/// 2e-2, the device check's bound for a kernel in bf16, against the tensor-op attention.
///
/// # Errors
/// The first disagreement, naming the tensor and the dtype, or a tensor failure.
///
/// ```
/// atomrl_model::kernel_check::flash_self_check(&candle_core::Device::Cpu)?;
/// # Ok::<(), String>(())
/// ```
pub fn flash_self_check(device: &Device) -> std::result::Result<(), String> {
    agrees_with_tensor_ops("flash-attention", device, DType::F32, 1e-4)?;
    agrees_with_tensor_ops("flash-attention", device, DType::BF16, 2e-2)
}

/// Whether kernel `k` on `device` in `dtype`, fused, agrees with its tensor-op form: every
/// output and gradient to `bound` (relative L2 norm), and finite.
fn agrees_with_tensor_ops(
    k: &str,
    device: &Device,
    dtype: DType,
    bound: f32,
) -> std::result::Result<(), String> {
    let fused = run(k, device, dtype, true).map_err(|e| format!("{k}: {e}"))?;
    let plain = run(k, device, dtype, false).map_err(|e| format!("{k}: {e}"))?;
    for ((name, a), (_, b)) in fused.iter().zip(&plain) {
        let rel = relative_difference(a, b).map_err(|e| format!("{k} {name}: {e}"))?;
        if rel.is_nan() || rel > bound {
            return Err(format!(
                "{k} {name} ({dtype:?}) differs from the tensor-op form by {rel:e}"
            ));
        }
    }
    if fused.len() != plain.len() {
        return Err(format!(
            "{k}: {} outputs against {}",
            fused.len(),
            plain.len()
        ));
    }
    Ok(())
}

/// `‖a − b‖₂ / ‖b‖₂` in f32 on the CPU (NaN when either is not finite).
fn relative_difference(a: &Tensor, b: &Tensor) -> Result<f32> {
    let a = a.to_device(&Device::Cpu)?.to_dtype(DType::F32)?;
    let b = b.to_device(&Device::Cpu)?.to_dtype(DType::F32)?;
    let err = (&a - &b)?.sqr()?.sum_all()?.to_scalar::<f32>()?.sqrt();
    let norm = b.sqr()?.sum_all()?.to_scalar::<f32>()?.sqrt();
    let sum = a.sum_all()?.to_scalar::<f32>()?;
    Ok(if sum.is_finite() {
        err / norm.max(1e-30)
    } else {
        f32::NAN
    })
}

/// The mask of `l` causal queries after `past` cached positions over `s` keys, with the keys
/// `pad` padded: as [`KeyMask`] for the fused kernels, and as the bias tensors
/// `([1, 1, L, S], [N, 1, 1, S])` the tensor-op form adds to the scores.
fn masks(
    l: usize,
    past: usize,
    pad: Vec<bool>,
    dtype: DType,
    device: &Device,
) -> Result<(KeyMask, Tensor, Tensor)> {
    let s = past + l;
    let n = pad.len() / s;
    // −2³⁰ rather than the model's −1e9: exact in bf16, so a query that sees only padding
    // spreads over the same keys whether the pad bias is a bf16 tensor (the device's bf16 rows)
    // or added in f32 (the CPU's f32 reference). With −1e9 the bf16 pad bias rounds to
    // −998,244,352, above the causal bias, and such a query spreads over its padded keys only.
    let neg = MASK_VALUE;
    let pad_bias: Vec<f32> = pad.iter().map(|&p| if p { neg } else { 0.0 }).collect();
    let pad_bias = Tensor::from_vec(pad_bias, (n, 1, 1, s), &Device::Cpu)?
        .to_dtype(dtype)?
        .to_device(device)?;
    let mut causal = vec![0f32; l * s];
    for i in 0..l {
        for j in (past + i + 1)..s {
            causal[i * s + j] = neg;
        }
    }
    let causal = Tensor::from_vec(causal, (1, 1, l, s), &Device::Cpu)?
        .to_dtype(dtype)?
        .to_device(device)?;
    let mask = KeyMask {
        causal: true,
        past,
        pad: Some(Arc::new(pad)),
        mask_value: f64::from(MASK_VALUE),
        pad_bias: Some(pad_bias.clone()),
    };
    Ok((mask, causal, pad_bias))
}

/// The tensor-op form of the training forward's probabilities: scale, add the bias tensors,
/// softmax.
fn probs_ops(scores: &Tensor, scale: f64, causal: &Tensor, pad: &Tensor) -> Result<Tensor> {
    let x = (scores * scale)?
        .broadcast_add(causal)?
        .broadcast_add(pad)?;
    ops::softmax_last(&x, false)
}

/// RoPE of `x [2, 3, 6, 16]` (any layout) with tables `[2, 1, 6, 16]` drawn from seeds
/// `seed` and `seed + 1`: fused when `fused` (and available), else its tensor-op form.
fn rope(x: &Tensor, seed: u64, device: &Device, dtype: DType, fused: bool) -> Result<Tensor> {
    let table = |s| -> Result<Tensor> {
        Ok(input(&[2, 1, 6, 16], s, dtype, device)?
            .as_tensor()
            .detach())
    };
    let (cos, sin) = (table(seed)?, table(seed + 1)?);
    if pick(fused, x) && kernels::rope_fits(x, &cos, &sin) {
        kernels::rope(x, &cos, &sin)
    } else {
        ops::apply_rope_ops(x, &cos, &sin)
    }
}

/// The attention-softmax case of [`run`].
fn attention(device: &Device, dtype: DType, fused: bool) -> Result<KernelOutputs> {
    let (n, s, past, l) = (2, 7, 3, 4);
    let scores = input(&[n, 3, l, s], 8, dtype, device)?;
    let pad: Vec<bool> = (0..n * s).map(|i| i / s == 1 && i % s < 2).collect();
    let (mask, causal, pad) = masks(l, past, pad, dtype, device)?;
    let scale = 0.35;
    let out = if pick(fused, scores.as_tensor()) {
        kernels::attention_softmax(scores.as_tensor(), scale, &mask)?
    } else {
        probs_ops(scores.as_tensor(), scale, &causal, &pad)?
    };
    debug_assert_eq!(out.dim(D::Minus1)?, s);
    outputs(out, &[("scores", &scores)])
}

/// The chunked-attention case of [`run`]: two queries a chunk.
fn chunked_attention(device: &Device, dtype: DType, fused: bool) -> Result<KernelOutputs> {
    let budget = 2 * 4 * 8 * 2;
    attention_case(
        device,
        dtype,
        fused,
        (6, 2, 8, 3),
        12,
        0.3,
        |q, k, v, scale, mask| crate::attention::attend(q, k, v, scale, mask, budget),
    )
}

/// The flash-attention case of [`run`].
fn flash_attention(device: &Device, dtype: DType, fused: bool) -> Result<KernelOutputs> {
    attention_case(
        device,
        dtype,
        fused,
        (37, 5, 16, 9),
        15,
        0.25,
        crate::attention::attend_flash,
    )
}

/// An attention case of [`run`]: `q [2, 4, l, d]` after `past` cached positions over
/// `k, v [2, 2, past + l, d]` (inputs seeded from `seed`), causal, the second row's first
/// `padded` keys padded; `fused_form` when fused, else the tensor-op form.
fn attention_case(
    device: &Device,
    dtype: DType,
    fused: bool,
    (l, past, d, padded): (usize, usize, usize, usize),
    seed: u64,
    scale: f64,
    fused_form: impl Fn(&Tensor, &Tensor, &Tensor, f64, &KeyMask) -> Result<Tensor>,
) -> Result<KernelOutputs> {
    let (n, h, kv) = (2, 4, 2);
    let s = past + l;
    let q = input(&[n, h, l, d], seed, dtype, device)?;
    let k = input(&[n, kv, s, d], seed + 1, dtype, device)?;
    let v = input(&[n, kv, s, d], seed + 2, dtype, device)?;
    let pad: Vec<bool> = (0..n * s).map(|i| i / s == 1 && i % s < padded).collect();
    let (mask, causal, pad) = masks(l, past, pad, dtype, device)?;
    let (qt, kt, vt) = (q.as_tensor(), k.as_tensor(), v.as_tensor());
    let out = if pick(fused, qt) {
        fused_form(qt, kt, vt, scale, &mask)?
    } else {
        let (k, v) = (ops::repeat_kv(kt, h / kv)?, ops::repeat_kv(vt, h / kv)?);
        let scores = qt.matmul(&k.t()?)?;
        probs_ops(&scores, scale, &causal, &pad)?.matmul(&v)?
    };
    outputs(out, &[("q", &q), ("k", &k), ("v", &v)])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_kernels_pass_the_self_check_and_a_nan_fails_it() {
        assert_eq!(self_check(&Device::Cpu), Ok(()));
        assert_eq!(flash_self_check(&Device::Cpu), Ok(()));
        let a = Tensor::new(&[1f32, f32::NAN], &Device::Cpu).expect("a");
        let b = Tensor::new(&[1f32, 2.0], &Device::Cpu).expect("b");
        assert!(relative_difference(&a, &b).expect("diff").is_nan());
        assert_eq!(relative_difference(&b, &b).expect("diff"), 0.0);
    }

    #[test]
    fn an_unknown_kernel_is_named_in_the_error() {
        let err = run("layer-norm", &Device::Cpu, DType::F32, true).unwrap_err();
        assert!(
            err.to_string().contains("unknown kernel `layer-norm`"),
            "{err}"
        );
    }
}
