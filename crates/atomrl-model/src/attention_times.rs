//! Where a training attention's time goes, form by form: the causal attention of one
//! micro-batch at a model's shape, forward alone and forward with backward, as the tensor-op
//! form, in chunks of queries, and, on CUDA where its kernels can run it, as FlashAttention.
//! Each form runs `reps` times after a warm-up call, the device synchronised before and after,
//! so a figure is the form's time in an eager training step, its launches included. Which
//! form is faster at which length decides where FlashAttention is the default
//! ([`crate::FlashPolicy`]); `xtask bench --attention-ops` prints these figures, and
//! `xtask/gpu-run.sh` takes them at the bench's length and at a long one.

use std::time::Instant;

use atomrl_core::{CandleContext, Result};
use candle_core::{DType, Device, Tensor, Var};

use crate::attention::attend_in_chunks;
use crate::input::MASK_VALUE;
use crate::kernels::KeyMask;
use crate::ModelConfig;

/// One attention form's time per call.
#[derive(Debug, Clone, PartialEq)]
pub struct AttentionTime {
    /// The form: `tensor ops`, `chunks of C queries` or `flash attention`.
    pub form: String,
    /// Milliseconds per forward, on inputs that need no gradient.
    pub forward_ms: f64,
    /// Milliseconds per forward and backward (the gradients of q, k and v).
    pub forward_backward_ms: f64,
}

/// Times the causal attention of `rows` sequences of `seq` tokens at `config`'s heads,
/// `q [rows, H, seq, d]` over `k, v [rows, KV, seq, d]`, in `dtype` on `device` (random
/// values: the time does not depend on them): the tensor-op form, four chunks of queries
/// (`⌈seq / 4⌉` each), and FlashAttention where its kernels can run it (CUDA); `reps` calls
/// each (at least 1).
///
/// # Errors
/// A tensor failure on the device.
///
/// ```
/// use atomrl_model::{attention_times, Architecture, ModelConfig};
/// use candle_core::{DType, Device};
/// let c = ModelConfig::new(Architecture::Qwen2, 64, 32, 64, 1, 4, 2)?;
/// let times = attention_times(&c, 2, 12, DType::F32, &Device::Cpu, 2)?;
/// assert_eq!(times[0].form, "tensor ops");
/// assert_eq!(times[1].form, "chunks of 3 queries");
/// assert!(times.iter().all(|t| t.forward_ms > 0.0 && t.forward_backward_ms > 0.0));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn attention_times(
    config: &ModelConfig,
    rows: usize,
    seq: usize,
    dtype: DType,
    device: &Device,
    reps: usize,
) -> Result<Vec<AttentionTime>> {
    let func = "attention_times";
    let (h, kv, d) = (
        config.num_attention_heads,
        config.num_key_value_heads,
        config.head_dim,
    );
    let rand = |dims: &[usize]| -> Result<Tensor> {
        Tensor::randn(0f32, 1.0, dims, device)
            .and_then(|t| t.to_dtype(dtype))
            .ctx(func)
    };
    let (q, k, v) = (
        rand(&[rows, h, seq, d])?,
        rand(&[rows, kv, seq, d])?,
        rand(&[rows, kv, seq, d])?,
    );
    let g = rand(&[rows, h, seq, d])?;
    let mask = KeyMask {
        causal: true,
        past: 0,
        pad: None,
        mask_value: MASK_VALUE,
        pad_bias: None,
    };
    let scale = 1.0 / (d as f64).sqrt();
    // As `crate::attention::attend` chooses: the CPU transposes the keys once for all chunks.
    let transpose_once = device.is_cpu();
    let chunk = seq.div_ceil(4).max(1);
    type Form<'a> = Box<dyn Fn(&Tensor, &Tensor, &Tensor) -> candle_core::Result<Tensor> + 'a>;
    #[cfg_attr(not(feature = "cuda"), allow(unused_mut))]
    let mut forms: Vec<(String, Form<'_>)> = vec![
        (
            "tensor ops".to_string(),
            Box::new(|q, k, v| attend_in_chunks(q, k, v, scale, &mask, seq, transpose_once)),
        ),
        (
            format!("chunks of {chunk} queries"),
            Box::new(|q, k, v| attend_in_chunks(q, k, v, scale, &mask, chunk, transpose_once)),
        ),
    ];
    #[cfg(feature = "cuda")]
    if crate::flash_attention::usable(&q, &k, &mask) {
        forms.push((
            "flash attention".to_string(),
            Box::new(|q, k, v| crate::flash_attention::flash_attention(q, k, v, scale, &mask)),
        ));
    }
    let reps = reps.max(1);
    let mut times = Vec::with_capacity(forms.len());
    for (form, attend) in &forms {
        let forward_ms = time_calls(device, reps, &|| attend(&q, &k, &v).map(drop)).ctx(func)?;
        let (qv, kv_, vv) = (
            Var::from_tensor(&q).ctx(func)?,
            Var::from_tensor(&k).ctx(func)?,
            Var::from_tensor(&v).ctx(func)?,
        );
        let forward_backward_ms = time_calls(device, reps, &|| {
            let out = attend(qv.as_tensor(), kv_.as_tensor(), vv.as_tensor())?;
            (out * &g)?.sum_all()?.backward().map(drop)
        })
        .ctx(func)?;
        times.push(AttentionTime {
            form: form.clone(),
            forward_ms,
            forward_backward_ms,
        });
    }
    Ok(times)
}

/// Milliseconds per call of `call`: one warm-up call, then `reps` calls between two
/// synchronisations of `device`.
fn time_calls(
    device: &Device,
    reps: usize,
    call: &dyn Fn() -> candle_core::Result<()>,
) -> candle_core::Result<f64> {
    call()?;
    device.synchronize()?;
    let t = Instant::now();
    for _ in 0..reps {
        call()?;
    }
    device.synchronize()?;
    Ok(t.elapsed().as_secs_f64() * 1e3 / reps as f64)
}
