//! What one forward pass takes: token ids, an optional key-padding mask, optional positions.

use atomrl_core::{CandleContext, Error, Result};
use candle_core::{DType, Device, Tensor};

/// The finite value added to masked attention scores (−inf would turn fully masked query rows,
/// such as the pad positions of a left-padded batch, into NaN).
pub const MASK_VALUE: f64 = -1e9;

/// Inputs of [`CausalLm::forward`](crate::CausalLm::forward).
///
/// # Shapes
/// - `input_ids [N, L]` (u32): the new tokens.
/// - `attention_mask [N, P + L]` (optional, any numeric dtype, 1 = real token, 0 = padding):
///   covers the `P` cached positions and the new ones, as in transformers. Left padding
///   (generation) and right padding (training) both work.
/// - `position_ids [N, L]` (optional, u32): by default `cumsum(mask) − 1` clamped at 0, taken
///   at the new positions (transformers' rule for left padding), or `P..P+L` without a mask.
///
/// ```
/// use atomrl_model::ForwardInput;
/// use candle_core::{Device, Tensor};
/// let ids = Tensor::new(&[[5u32, 6, 7]], &Device::Cpu)?;
/// let input = ForwardInput::new(ids).with_attention_mask(Tensor::new(&[[0u32, 1, 1]], &Device::Cpu)?);
/// assert!(input.position_ids.is_none());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct ForwardInput {
    /// Token ids `[N, L]`.
    pub input_ids: Tensor,
    /// Key-padding mask `[N, P + L]`.
    pub attention_mask: Option<Tensor>,
    /// Positions `[N, L]`.
    pub position_ids: Option<Tensor>,
    /// The first of the new positions whose state is wanted (0: all of them). The last decoder
    /// layer computes its queries, attention output and MLP at positions `outputs_from..L`
    /// alone, and [`CausalLm::forward_hidden`](crate::CausalLm::forward_hidden) returns
    /// `[N, L - outputs_from, H]`. Every position's keys and values still go into the cache.
    pub outputs_from: usize,
}

impl ForwardInput {
    /// Token ids only (no padding, positions `P..P+L`).
    ///
    /// ```
    /// use candle_core::{Device, Tensor};
    /// let input = atomrl_model::ForwardInput::new(Tensor::new(&[[1u32, 2]], &Device::Cpu)?);
    /// assert!(input.attention_mask.is_none());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new(input_ids: Tensor) -> Self {
        Self {
            input_ids,
            attention_mask: None,
            position_ids: None,
            outputs_from: 0,
        }
    }

    /// Adds a key-padding mask `[N, P + L]`.
    ///
    /// ```
    /// use candle_core::{Device, Tensor};
    /// let d = Device::Cpu;
    /// let input = atomrl_model::ForwardInput::new(Tensor::new(&[[1u32, 0]], &d)?)
    ///     .with_attention_mask(Tensor::new(&[[1f32, 0.0]], &d)?);
    /// assert!(input.attention_mask.is_some());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with_attention_mask(mut self, mask: Tensor) -> Self {
        self.attention_mask = Some(mask);
        self
    }

    /// Sets explicit positions `[N, L]`.
    ///
    /// ```
    /// use candle_core::{Device, Tensor};
    /// let d = Device::Cpu;
    /// let input = atomrl_model::ForwardInput::new(Tensor::new(&[[9u32]], &d)?)
    ///     .with_position_ids(Tensor::new(&[[4u32]], &d)?);
    /// assert!(input.position_ids.is_some());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with_position_ids(mut self, positions: Tensor) -> Self {
        self.position_ids = Some(positions);
        self
    }

    /// Asks for the states of positions `from..L` alone ([`ForwardInput::outputs_from`]): the
    /// same numbers as those columns of the full pass, up to float rounding, for less work in
    /// the last decoder layer (scoring a completion reads the states from the prompt's last
    /// token on; what the last layer computes at earlier positions feeds nothing).
    ///
    /// ```
    /// use atomrl_model::{Architecture, CausalLm, ForwardInput, ModelConfig};
    /// use candle_core::{DType, Device, Tensor};
    /// let config = ModelConfig::new(Architecture::Qwen2, 16, 8, 8, 2, 2, 1)?;
    /// let m = CausalLm::from_config_random(config, 1, DType::F32, &Device::Cpu)?;
    /// let ids = Tensor::new(&[[1u32, 2, 3, 4]], &Device::Cpu)?;
    /// let full = m.forward_hidden(&ForwardInput::new(ids.clone()), None)?;
    /// let tail = m.forward_hidden(&ForwardInput::new(ids).with_outputs_from(1), None)?;
    /// assert_eq!(tail.dims(), &[1, 3, 8]);
    /// let diff = (tail - full.narrow(1, 1, 3)?)?.abs()?.max_all()?.to_scalar::<f32>()?;
    /// assert!(diff < 1e-5);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with_outputs_from(mut self, from: usize) -> Self {
        self.outputs_from = from;
        self
    }

    /// Asks for the last position's state alone (a prompt pass before decoding): see
    /// [`ForwardInput::with_outputs_from`].
    ///
    /// ```
    /// use atomrl_model::{Architecture, CausalLm, ForwardInput, ModelConfig};
    /// use candle_core::{DType, Device, Tensor};
    /// let config = ModelConfig::new(Architecture::Qwen2, 16, 8, 8, 2, 2, 1)?;
    /// let m = CausalLm::from_config_random(config, 1, DType::F32, &Device::Cpu)?;
    /// let ids = Tensor::new(&[[1u32, 2, 3]], &Device::Cpu)?;
    /// let full = m.forward_hidden(&ForwardInput::new(ids.clone()), None)?;
    /// let last = m.forward_hidden(&ForwardInput::new(ids).with_last_position_only(), None)?;
    /// assert_eq!(last.dims(), &[1, 1, 8]);
    /// let diff = (last - full.narrow(1, 2, 1)?)?.abs()?.max_all()?.to_scalar::<f32>()?;
    /// assert!(diff < 1e-5);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with_last_position_only(self) -> Self {
        let l = self.input_ids.dims().last().copied().unwrap_or(1);
        self.with_outputs_from(l.saturating_sub(1))
    }
}

/// Positions from a key-padding mask, as transformers computes them for left padding:
/// `cumsum(mask, -1) − 1`, clamped at 0, for the last `new_len` columns.
///
/// # Shapes
/// `mask [N, S]` → `[N, new_len]` (u32), `new_len ≤ S`.
///
/// # Errors
/// [`Error::Shape`] when `mask` is not rank 2 or `new_len > S`.
///
/// ```
/// use candle_core::{Device, Tensor};
/// let mask = Tensor::new(&[[0u32, 0, 1, 1, 1], [1, 1, 1, 1, 0]], &Device::Cpu)?;
/// let pos = atomrl_model::position_ids_from_mask(&mask, 5)?;
/// assert_eq!(pos.to_vec2::<u32>()?, vec![vec![0, 0, 0, 1, 2], vec![0, 1, 2, 3, 3]]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn position_ids_from_mask(mask: &Tensor, new_len: usize) -> Result<Tensor> {
    let func = "position_ids_from_mask";
    let rows = mask_rows(func, mask)?;
    let s = mask.dim(1).ctx(func)?;
    if new_len > s {
        return Err(Error::shape(
            func,
            "attention_mask",
            format!("[N, S] with S >= {new_len}"),
            mask.dims(),
        ));
    }
    let n = rows.len();
    let mut out = Vec::with_capacity(n * new_len);
    for row in &rows {
        let mut acc = 0i64;
        let cums: Vec<u32> = row
            .iter()
            .map(|&m| {
                acc += i64::from(m != 0.0);
                (acc - 1).max(0) as u32
            })
            .collect();
        out.extend_from_slice(&cums[s - new_len..]);
    }
    Tensor::from_vec(out, (n, new_len), mask.device()).ctx(func)
}

pub(crate) fn mask_rows(func: &str, mask: &Tensor) -> Result<Vec<Vec<f32>>> {
    if mask.rank() != 2 {
        return Err(Error::shape(func, "attention_mask", "[N, S]", mask.dims()));
    }
    mask.to_dtype(DType::F32)
        .and_then(|m| m.to_vec2::<f32>())
        .ctx(func)
}

/// The additive attention bias, kept as two broadcast factors so that no `[N, 1, L, P + L]`
/// tensor is materialised: a causal part `[1, 1, L, P + L]` ([`MASK_VALUE`] where key `j` lies
/// after query `i`, i.e. `j > P + i`) and a key-padding part `[N, 1, 1, P + L]`
/// ([`MASK_VALUE`] on padded keys). Both are `None` when they would be all zeros.
#[derive(Debug, Clone, Default)]
pub(crate) struct AttentionBias {
    causal: Option<Tensor>,
    pad: Option<Tensor>,
    /// The same bias as a description, for the fused CPU softmax.
    pub keys: crate::kernels::KeyMask,
}

impl AttentionBias {
    /// The bias of the queries `from..L` alone: the causal part's rows `from..L`, the key
    /// padding as it is.
    pub fn queries_from(&self, from: usize) -> candle_core::Result<Self> {
        let causal = match &self.causal {
            Some(c) => {
                let l = c.dim(2)?;
                Some(c.narrow(2, from, l - from)?.contiguous()?)
            }
            None => None,
        };
        let mut keys = self.keys.clone();
        keys.past += from;
        Ok(Self {
            causal,
            pad: self.pad.clone(),
            keys,
        })
    }

    /// Adds the bias to attention scores `[N, heads, L, P + L]`.
    pub fn apply(&self, scores: &Tensor) -> candle_core::Result<Tensor> {
        let mut s = scores.clone();
        if let Some(c) = &self.causal {
            s = s.broadcast_add(c)?;
        }
        if let Some(p) = &self.pad {
            s = s.broadcast_add(p)?;
        }
        Ok(s)
    }
}

/// Builds the [`AttentionBias`] of `l` new queries after `past` cached positions.
pub(crate) fn attention_bias(
    func: &str,
    mask: Option<&Tensor>,
    n: usize,
    l: usize,
    past: usize,
    dtype: DType,
    device: &Device,
) -> Result<AttentionBias> {
    let s = past + l;
    let neg = MASK_VALUE as f32;
    let causal = if l > 1 {
        let mut bias = vec![0f32; l * s];
        for i in 0..l {
            for j in (past + i + 1)..s {
                bias[i * s + j] = neg;
            }
        }
        let t = Tensor::from_vec(bias, (1, 1, l, s), device)
            .and_then(|t| t.to_dtype(dtype))
            .ctx(func)?;
        Some(t)
    } else {
        None
    };
    let mut pad_keys = None;
    let pad = match mask {
        Some(m) => {
            if m.dims() != [n, s] {
                return Err(Error::shape(
                    func,
                    "attention_mask",
                    format!("[N, P + L] = [{n}, {s}]"),
                    m.dims(),
                ));
            }
            let rows = mask_rows(func, m)?;
            if rows.iter().flatten().all(|&x| x != 0.0) {
                None
            } else {
                pad_keys = Some(std::sync::Arc::new(
                    rows.iter().flatten().map(|&x| x == 0.0).collect(),
                ));
                let bias: Vec<f32> = rows
                    .iter()
                    .flatten()
                    .map(|&x| if x != 0.0 { 0.0 } else { neg })
                    .collect();
                let t = Tensor::from_vec(bias, (n, 1, 1, s), device)
                    .and_then(|t| t.to_dtype(dtype))
                    .ctx(func)?;
                Some(t)
            }
        }
        None => None,
    };
    let keys = crate::kernels::KeyMask {
        causal: causal.is_some(),
        past,
        pad: pad_keys,
        mask_value: MASK_VALUE,
        pad_bias: pad.clone(),
    };
    Ok(AttentionBias { causal, pad, keys })
}
