//! [`StaticDecode`]: decode steps over buffers at fixed addresses, replayed on CUDA as one
//! captured graph.
//!
//! An eager decode step on a GPU is bound by the host, not by memory: candle queues each of
//! its ~600 tensor ops (~25 per decoder layer) one at a time, at 5–8 µs of host work each,
//! while the GPU needs ~0.3 ms to read the weights (docs/cuda.md). A CUDA graph queues a
//! whole step with one call, but it replays fixed kernels with fixed arguments on fixed
//! buffers. So nothing a step changes may be an argument or an allocation that outlives it:
//!
//! - the KV cache is one buffer per layer with room for every position the run will reach
//!   (`[B, KV, cap, d]`, zeros where not yet written), and attention reads all `cap` columns
//!   under a mask;
//! - token ids, positions and the cache column to write live in one small device block that
//!   the host overwrites before each replay; the kernels of `cuda/decode.cu` read them there
//!   (RoPE at each row's position and the key/value write in one kernel, the step's mask in
//!   another);
//! - the logits land in a buffer of the graph's own, copied out after each replay.
//!
//! On the CPU (and with `ATOMRL_CUDA_FUSED=0`) the same step runs from tensor ops with the
//! values on the host: the reference the CUDA form is checked against, and what the tests
//! compare with [`crate::CausalLm::forward`]'s cached decoding.

#[cfg(feature = "cuda")]
mod cuda;
mod op_times;

pub use op_times::{static_decode_op_times, OpTime};

use atomrl_core::{CandleContext, Error, Result};
use candle_core::{DType, Device, Tensor};

use crate::cache::KvCache;
use crate::input::MASK_VALUE;
use crate::kernels::KeyMask;
use crate::network::{MergedLayer, Network, Projections, StepCache};
use crate::ops::{apply_rope_ops, rope_tables};
use crate::CausalLm;

/// A batch of `B` rows decoding one token per step over a KV cache of fixed capacity, every
/// buffer allocated up front; on CUDA (with AtomRL's kernels on) each step after the first
/// replays a captured CUDA graph (`ATOMRL_CUDA_GRAPHS=0` runs the same kernels one by one).
///
/// Rows never leave the batch: a finished row keeps decoding whatever token it is fed (the
/// caller ignores its logits) until the caller compacts the batch with
/// [`StaticDecode::select_rows`]. [`StaticDecode::with_capacity`] makes room for more
/// positions. Each returns a new decoder whose first step captures a new graph.
///
/// A capture records everything queued on the device's stream meanwhile: while one thread
/// decodes this way, no other thread may run work on the same GPU (AtomRL's trainer runs one
/// worker per GPU; `ATOMRL_CUDA_GRAPHS=0` turns graphs off for programs that share a GPU
/// between threads).
///
/// # Shapes
/// Built from a [`KvCache`] of `[B, KV, W, d]` per layer (a prefill's) and each row's
/// count of leading padding columns `starts [B]`. [`StaticDecode::step`]: `B` token ids and
/// `B` positions → logits `[B, V]` in the compute dtype; the step's keys and values go to
/// column `W` (then `W + 1`, ...). Columns before `starts[b]` are masked for row `b`.
///
/// ```
/// use atomrl_model::{CausalLm, ForwardInput, StaticDecode};
/// use candle_core::{DType, Device, Tensor};
/// let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/reference/models/tiny-qwen2");
/// let model = CausalLm::from_hf_dir(dir, DType::F32, &Device::Cpu)?;
/// let view = model.generation_view();
/// // Prefill two prompts, the second left-padded by one column.
/// let mut cache = view.new_kv_cache();
/// let ids = Tensor::new(&[[1u32, 5, 6], [0, 1, 7]], &Device::Cpu)?;
/// let mask = Tensor::new(&[[1u32, 1, 1], [0, 1, 1]], &Device::Cpu)?;
/// view.forward(&ForwardInput::new(ids).with_attention_mask(mask), Some(&mut cache))?;
/// let mut dec = StaticDecode::new(&view, &cache, &[0, 1], 8)?;
/// // One step: tokens 9 and 10 at positions 3 and 2.
/// let logits = dec.step(&[9, 10], &[3, 2])?;
/// assert_eq!((logits.dims(), dec.width()), (&[2, 512][..], 4));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct StaticDecode {
    net: Network,
    device: Device,
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    dtype: DType,
    /// Query heads, key/value heads, head dimension.
    heads: (usize, usize, usize),
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    vocab: usize,
    width: usize,
    starts: Vec<usize>,
    k: Vec<Tensor>,
    v: Vec<Tensor>,
    /// RoPE tables `[cap, d]` (rotate-half, duplicated halves) in the compute dtype.
    cos: Tensor,
    sin: Tensor,
    /// The CUDA form: the kernels of `cuda/decode.cu` reading the step from `step_in`.
    kernels: bool,
    /// u32 `[ids (B), positions (B), slot]` on the device (the CUDA form's inputs).
    step_in: Tensor,
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    starts_dev: Tensor,
    /// Each layer's merged projections (shared by the decoders `select_rows` and
    /// `with_capacity` make).
    merged: std::sync::Arc<Vec<MergedLayer>>,
    graph: GraphState,
}

/// Where a decoder stands with its CUDA graph.
#[derive(Debug)]
enum GraphState {
    /// No graph: the CPU form, graphs switched off, or a capture that failed.
    Off,
    /// The next step runs eagerly, as the warm-up of a capture (kernel modules loaded, the
    /// strided ops' parameters uploaded and cached on the device).
    Pending,
    /// Warmed up: the next step captures.
    Warm,
    /// Captured: each step replays it, and its logits are in `logits`.
    #[cfg(feature = "cuda")]
    Ready { graph: cuda::Graph, logits: Tensor },
}

impl StaticDecode {
    /// A decoder continuing from `cache` (a prefill of `model`, see the type's docs) with room
    /// for `capacity` positions per row; `starts[b]` leading columns of row `b` are padding.
    ///
    /// # Errors
    /// [`Error::Value`] when `model`'s dtype has no static form on its device (CPU: f32 and
    /// f64; CUDA: f32, bf16 and f16 with AtomRL's kernels on), the cache is empty or
    /// incomplete, `starts` does not have one entry per row or `capacity` is below the
    /// cache's width; [`Error::Candle`] when the buffers cannot be allocated.
    ///
    /// See [`StaticDecode`] for an example.
    pub fn new(
        model: &CausalLm,
        cache: &KvCache,
        starts: &[usize],
        capacity: usize,
    ) -> Result<Self> {
        let func = "StaticDecode::new";
        let dtype = model.compute_dtype();
        let device = model.device().clone();
        let kernels = match Self::form(&device, dtype) {
            Some(k) => k,
            None => {
                return Err(Error::value(
                    func,
                    "model",
                    "f32 or f64 on the CPU; f32, bf16 or f16 on CUDA with ATOMRL_CUDA_FUSED on",
                    format!("{dtype:?} on {device:?}"),
                ))
            }
        };
        let c = model.config();
        let layers: Vec<(Tensor, Tensor)> = cache.layers.iter().flatten().cloned().collect();
        if layers.len() != c.num_hidden_layers {
            return Err(Error::value(
                func,
                "cache",
                format!("keys and values of all {} layers", c.num_hidden_layers),
                format!("{} layers filled", layers.len()),
            ));
        }
        let (b, kv, width, d) = layers[0].0.dims4().ctx(func)?;
        if starts.len() != b || starts.iter().any(|&s| s >= width) {
            return Err(Error::value(
                func,
                "starts",
                format!("{b} padding counts below the cache width {width}"),
                format!("{starts:?}"),
            ));
        }
        if capacity <= width {
            return Err(Error::value(
                func,
                "capacity",
                format!("more than the cache width {width}"),
                capacity,
            ));
        }
        let alloc = |t: &Tensor| -> candle_core::Result<Tensor> {
            let buf = Tensor::zeros((b, kv, capacity, d), dtype, &device)?;
            buf.slice_set(&t.to_dtype(dtype)?.contiguous()?, 2, 0)?;
            Ok(buf)
        };
        let (mut ks, mut vs) = (Vec::new(), Vec::new());
        for (k, v) in &layers {
            ks.push(alloc(k).ctx(func)?);
            vs.push(alloc(v).ctx(func)?);
        }
        let net = model.static_network().ctx(func)?;
        // None merged (`ATOMRL_DECODE_MERGE=0`): every layer projects apart.
        let merged = if atomrl_core::device::decode_merge() {
            net.merged_layers().ctx(func)?
        } else {
            Vec::new()
        };
        let shared = (net, std::sync::Arc::new(merged));
        Self::assemble(model, shared, ks, vs, starts.to_vec(), width, kernels).ctx(func)
    }

    /// Whether decoding in `dtype` on `device` has a static form: `Some(true)` for the CUDA
    /// kernels, `Some(false)` for the tensor-op form (CPU), `None` for neither.
    fn form(device: &Device, dtype: DType) -> Option<bool> {
        if device.is_cpu() {
            return matches!(dtype, DType::F32 | DType::F64).then_some(false);
        }
        let probe = Tensor::zeros(1, dtype, device).ok()?;
        (cfg!(feature = "cuda") && device.is_cuda() && crate::kernels::fused_on(&probe))
            .then_some(true)
    }

    /// Whether [`StaticDecode::new`] accepts `model` (its compute dtype on its device).
    ///
    /// ```
    /// use atomrl_model::{Architecture, CausalLm, ModelConfig, StaticDecode};
    /// let c = ModelConfig::new(Architecture::Qwen2, 16, 8, 8, 1, 2, 1)?;
    /// let m = CausalLm::from_config_random(c, 1, candle_core::DType::F32, &candle_core::Device::Cpu)?;
    /// assert!(StaticDecode::supports(&m));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn supports(model: &CausalLm) -> bool {
        Self::form(model.device(), model.compute_dtype()).is_some()
    }

    fn assemble(
        model: &CausalLm,
        (net, merged): (Network, std::sync::Arc<Vec<MergedLayer>>),
        k: Vec<Tensor>,
        v: Vec<Tensor>,
        starts: Vec<usize>,
        width: usize,
        kernels: bool,
    ) -> candle_core::Result<Self> {
        let c = model.config();
        let device = model.device().clone();
        let dtype = model.compute_dtype();
        let (b, capacity) = (k[0].dim(0)?, k[0].dim(2)?);
        let positions = Tensor::arange(0u32, capacity as u32, &device)?.unsqueeze(0)?;
        let (cos, sin) = rope_tables(&positions, c.head_dim, c.rope_theta, dtype)?;
        let table = |t: Tensor| t.reshape((capacity, c.head_dim))?.contiguous();
        let starts_u32: Vec<u32> = starts.iter().map(|&s| s as u32).collect();
        let graph = if kernels && atomrl_core::device::cuda_graphs() {
            GraphState::Pending
        } else {
            GraphState::Off
        };
        Ok(Self {
            net,
            merged,
            dtype,
            heads: (c.num_attention_heads, c.num_key_value_heads, c.head_dim),
            vocab: c.vocab_size,
            width,
            k,
            v,
            cos: table(cos)?,
            sin: table(sin)?,
            kernels,
            step_in: Tensor::zeros(2 * b + 1, DType::U32, &device)?,
            starts_dev: Tensor::from_vec(starts_u32, b, &device)?,
            starts,
            graph,
            device,
        })
    }

    /// The network and merged projections a derived decoder shares with this one.
    fn shared(&self) -> (Network, std::sync::Arc<Vec<MergedLayer>>) {
        (self.net.clone(), self.merged.clone())
    }

    /// Number of rows `B`.
    ///
    /// See [`StaticDecode`] for an example.
    pub fn rows(&self) -> usize {
        self.starts.len()
    }

    /// Positions each row has room for (the cache's `cap`).
    ///
    /// See [`StaticDecode`] for an example.
    pub fn capacity(&self) -> usize {
        self.cos.dims()[0]
    }

    /// Cache columns written so far (the prefill's width plus one per step).
    ///
    /// See [`StaticDecode`] for an example.
    pub fn width(&self) -> usize {
        self.width
    }

    /// Whether steps replay a captured CUDA graph now.
    ///
    /// ```
    /// # use atomrl_model::{Architecture, CausalLm, ModelConfig, StaticDecode, ForwardInput};
    /// # use candle_core::{DType, Device, Tensor};
    /// # let c = ModelConfig::new(Architecture::Qwen2, 16, 8, 8, 1, 2, 1)?;
    /// # let m = CausalLm::from_config_random(c, 1, DType::F32, &Device::Cpu)?;
    /// # let mut cache = m.new_kv_cache();
    /// # m.forward(&ForwardInput::new(Tensor::new(&[[1u32, 2]], &Device::Cpu)?), Some(&mut cache))?;
    /// let dec = StaticDecode::new(&m, &cache, &[0], 4)?;
    /// assert!(!dec.replays_graph()); // never on the CPU
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn replays_graph(&self) -> bool {
        !matches!(
            self.graph,
            GraphState::Off | GraphState::Pending | GraphState::Warm
        )
    }

    /// Decodes one token per row: `tokens[b]` at position `positions[b]` (RoPE), attending to
    /// row `b`'s columns from `starts[b]` through the new one. Returns the next-token logits
    /// `[B, V]` (a tensor of its own: later steps do not change it).
    ///
    /// # Errors
    /// [`Error::Value`] when `tokens` or `positions` does not have `B` entries, a token is
    /// outside the vocabulary, a position is not below the capacity, or the cache is full
    /// ([`StaticDecode::with_capacity`] makes room).
    ///
    /// See [`StaticDecode`] for an example.
    pub fn step(&mut self, tokens: &[u32], positions: &[u32]) -> Result<Tensor> {
        let func = "StaticDecode::step";
        let (b, cap) = (self.rows(), self.capacity());
        for (arg, v) in [("tokens", tokens), ("positions", positions)] {
            if v.len() != b {
                return Err(Error::value(
                    func,
                    arg,
                    format!("{b} entries (one per row)"),
                    v.len(),
                ));
            }
        }
        let checks = [
            ("tokens", tokens, self.vocab),
            ("positions", positions, cap),
        ];
        for (arg, v, limit) in checks {
            if let Some(i) = v.iter().position(|&x| x as usize >= limit) {
                return Err(Error::value(
                    func,
                    format!("{arg}[{i}]"),
                    format!("below {limit}"),
                    v[i],
                ));
            }
        }
        if self.width >= cap {
            return Err(Error::value(
                func,
                "capacity",
                format!("room for column {} (with_capacity makes more)", self.width),
                cap,
            ));
        }
        let logits = if self.kernels {
            self.step_on_device(tokens, positions)?
        } else {
            let host = HostStep {
                positions,
                slot: self.width,
            };
            let ids = Tensor::new(tokens, &self.device).ctx(func)?;
            let mask = host_mask(&self.starts, self.width, cap);
            let ctx = StepContext {
                dec: self,
                mask,
                host: Some(host),
            };
            self.net.decode_static(&ids, &ctx).ctx(func)?
        };
        self.width += 1;
        Ok(logits)
    }

    /// The CUDA form of a step: the inputs uploaded to `step_in`, then the kernels queued one by
    /// one, captured, or replayed.
    fn step_on_device(&mut self, tokens: &[u32], positions: &[u32]) -> Result<Tensor> {
        let func = "StaticDecode::step";
        let mut block = Vec::with_capacity(2 * tokens.len() + 1);
        block.extend_from_slice(tokens);
        block.extend_from_slice(positions);
        block.push(self.width as u32);
        let upload = Tensor::from_vec(block, 2 * tokens.len() + 1, &self.device).ctx(func)?;
        self.step_in.slice_set(&upload, 0, 0).ctx(func)?;
        match std::mem::replace(&mut self.graph, GraphState::Off) {
            GraphState::Off => self.device_step().ctx(func),
            GraphState::Pending => {
                // The warm-up: candle uploads some ops' shapes and strides from the host (the
                // embedding's index_select: the ids' dims and strides, every call); with its
                // cache on they are kept on the device, keyed by value, where the capture's copy
                // of the same op finds them (a capture cannot read host memory later). The
                // entries are per batch size, so the cache stays small.
                let logits = with_htod_cache(&self.device, || self.device_step()).ctx(func)?;
                self.graph = GraphState::Warm;
                Ok(logits)
            }
            GraphState::Warm => {
                self.graph = self.capture();
                self.check_first_replay().ctx(func)
            }
            #[cfg(feature = "cuda")]
            ready => {
                self.graph = ready;
                self.replay().ctx(func)
            }
        }
    }

    /// The first replay of a new graph, checked against the same step queued op by op (the
    /// step is idempotent: it writes the same keys and values to the same column). A graph
    /// whose logits differ is dropped with a warning, so that a driver or candle change that
    /// breaks capture costs speed, not correctness.
    fn check_first_replay(&mut self) -> candle_core::Result<Tensor> {
        if !self.replays_graph() {
            return self.device_step();
        }
        let replayed = self.replay()?;
        let eager = self.device_step()?;
        let largest = |t: &Tensor| -> candle_core::Result<f32> {
            t.to_dtype(DType::F32)?.abs()?.max_all()?.to_scalar::<f32>()
        };
        let diff = largest(&(&replayed - &eager)?)?;
        let scale = largest(&eager)?;
        if diff.is_finite() && diff <= 1e-3 * scale.max(1e-6) {
            return Ok(replayed);
        }
        eprintln!(
            "warning: a replayed CUDA graph of a decode step disagreed with the step run op by op \
             (max |diff| {diff:e}, max |logit| {scale:e}); decoding without graphs"
        );
        self.graph = GraphState::Off;
        Ok(eager)
    }

    /// Captures a step into a graph writing its logits to a buffer of its own; a capture that
    /// fails leaves the decoder without graphs (a warning says why) and nothing changed.
    #[cfg(feature = "cuda")]
    fn capture(&self) -> GraphState {
        let captured =
            Tensor::zeros((self.rows(), self.vocab), self.dtype, &self.device).and_then(|logits| {
                let graph = with_htod_cache(&self.device, || {
                    cuda::Graph::capture(&self.device, || {
                        let l = self.device_step()?;
                        logits.slice_set(&l, 0, 0)
                    })
                })?;
                Ok(GraphState::Ready { graph, logits })
            });
        captured.unwrap_or_else(|e| {
            eprintln!("warning: AtomRL could not capture a decode step as a CUDA graph ({e}); decoding without graphs");
            GraphState::Off
        })
    }

    #[cfg(not(feature = "cuda"))]
    fn capture(&self) -> GraphState {
        GraphState::Off
    }

    /// Runs the step: replays the graph, or queues the kernels when there is none.
    fn replay(&self) -> candle_core::Result<Tensor> {
        match &self.graph {
            #[cfg(feature = "cuda")]
            GraphState::Ready { graph, logits } => {
                graph.replay()?;
                logits.copy()
            }
            _ => self.device_step(),
        }
    }

    /// The step's work on the device, every per-step value read from `step_in`.
    fn device_step(&self) -> candle_core::Result<Tensor> {
        let b = self.rows();
        let bias = self.device_bias()?;
        let mask = KeyMask {
            causal: false,
            past: 0,
            pad: None,
            mask_value: MASK_VALUE,
            pad_bias: Some(bias),
        };
        let ids = self.step_in.narrow(0, 0, b)?;
        let ctx = StepContext {
            dec: self,
            mask,
            host: None,
        };
        self.net.decode_static(&ids, &ctx)
    }

    #[cfg(feature = "cuda")]
    fn device_bias(&self) -> candle_core::Result<Tensor> {
        cuda::decode_bias(
            &self.starts_dev,
            &self.step_in,
            self.capacity(),
            self.dtype,
            MASK_VALUE,
        )
    }

    #[cfg(not(feature = "cuda"))]
    fn device_bias(&self) -> candle_core::Result<Tensor> {
        candle_core::bail!("the CUDA form of StaticDecode needs the `cuda` feature")
    }

    /// A decoder for the rows `rows` of this one (indices, in the new order), with the same
    /// width and capacity: what a caller makes once enough rows have finished that decoding
    /// them costs more than a new graph.
    ///
    /// # Errors
    /// [`Error::Value`] for an empty list or an index `≥ B`.
    ///
    /// ```
    /// # use atomrl_model::{Architecture, CausalLm, ModelConfig, StaticDecode, ForwardInput};
    /// # use candle_core::{DType, Device, Tensor};
    /// # let c = ModelConfig::new(Architecture::Qwen2, 16, 8, 8, 1, 2, 1)?;
    /// # let m = CausalLm::from_config_random(c, 1, DType::F32, &Device::Cpu)?;
    /// # let mut cache = m.new_kv_cache();
    /// # m.forward(&ForwardInput::new(Tensor::new(&[[1u32, 2], [3, 4], [5, 6]], &Device::Cpu)?), Some(&mut cache))?;
    /// let dec = StaticDecode::new(&m, &cache, &[0, 0, 0], 4)?;
    /// let two = dec.select_rows(&m, &[2, 0])?;
    /// assert_eq!((two.rows(), two.width()), (2, 2));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn select_rows(&self, model: &CausalLm, rows: &[usize]) -> Result<Self> {
        let func = "StaticDecode::select_rows";
        let b = self.rows();
        if rows.is_empty() || rows.iter().any(|&r| r >= b) {
            return Err(Error::value(
                func,
                "rows",
                format!("row indices below {b}"),
                format!("{rows:?}"),
            ));
        }
        let idx: Vec<u32> = rows.iter().map(|&r| r as u32).collect();
        let idx = Tensor::new(idx, &self.device).ctx(func)?;
        let pick = |ts: &[Tensor]| -> candle_core::Result<Vec<Tensor>> {
            ts.iter().map(|t| t.index_select(&idx, 0)).collect()
        };
        let (k, v) = (pick(&self.k).ctx(func)?, pick(&self.v).ctx(func)?);
        let starts = rows.iter().map(|&r| self.starts[r]).collect();
        Self::assemble(model, self.shared(), k, v, starts, self.width, self.kernels).ctx(func)
    }

    /// The same decoder with room for `capacity` positions per row.
    ///
    /// # Errors
    /// [`Error::Value`] when `capacity` is not above the current capacity.
    ///
    /// ```
    /// # use atomrl_model::{Architecture, CausalLm, ModelConfig, StaticDecode, ForwardInput};
    /// # use candle_core::{DType, Device, Tensor};
    /// # let c = ModelConfig::new(Architecture::Qwen2, 16, 8, 8, 1, 2, 1)?;
    /// # let m = CausalLm::from_config_random(c, 1, DType::F32, &Device::Cpu)?;
    /// # let mut cache = m.new_kv_cache();
    /// # m.forward(&ForwardInput::new(Tensor::new(&[[1u32, 2]], &Device::Cpu)?), Some(&mut cache))?;
    /// let dec = StaticDecode::new(&m, &cache, &[0], 3)?;
    /// assert_eq!(dec.with_capacity(&m, 8)?.capacity(), 8);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with_capacity(&self, model: &CausalLm, capacity: usize) -> Result<Self> {
        let func = "StaticDecode::with_capacity";
        if capacity <= self.capacity() {
            return Err(Error::value(
                func,
                "capacity",
                format!("more than {}", self.capacity()),
                capacity,
            ));
        }
        let grow = |ts: &[Tensor]| -> candle_core::Result<Vec<Tensor>> {
            ts.iter()
                .map(|t| {
                    let (b, kv, _, d) = t.dims4()?;
                    let buf = Tensor::zeros((b, kv, capacity, d), t.dtype(), t.device())?;
                    buf.slice_set(t, 2, 0)?;
                    Ok(buf)
                })
                .collect()
        };
        let (k, v) = (grow(&self.k).ctx(func)?, grow(&self.v).ctx(func)?);
        Self::assemble(
            model,
            self.shared(),
            k,
            v,
            self.starts.clone(),
            self.width,
            self.kernels,
        )
        .ctx(func)
    }
}

/// The step's values on the host (the tensor-op form).
struct HostStep<'a> {
    positions: &'a [u32],
    slot: usize,
}

/// What [`Network::decode_static`] asks of a decoder for one step.
struct StepContext<'a> {
    dec: &'a StaticDecode,
    mask: KeyMask,
    host: Option<HostStep<'a>>,
}

impl StepCache for StepContext<'_> {
    fn qkv(&self, layer: usize, proj: &Projections<'_>) -> candle_core::Result<Tensor> {
        let d = self.dec;
        match &self.host {
            Some(host) => qkv_ops(d, layer, proj, host),
            None => qkv_device(d, layer, proj),
        }
    }

    fn kv(&self, layer: usize) -> (&Tensor, &Tensor) {
        (&self.dec.k[layer], &self.dec.v[layer])
    }

    fn mask(&self) -> &KeyMask {
        &self.mask
    }

    fn merged(&self, layer: usize) -> Option<&MergedLayer> {
        self.dec.merged.get(layer)
    }
}

#[cfg(feature = "cuda")]
fn qkv_device(
    d: &StaticDecode,
    layer: usize,
    proj: &Projections<'_>,
) -> candle_core::Result<Tensor> {
    cuda::decode_qkv(
        proj,
        (&d.cos, &d.sin),
        &d.step_in,
        (&d.k[layer], &d.v[layer]),
        d.heads,
    )
}

#[cfg(not(feature = "cuda"))]
fn qkv_device(_: &StaticDecode, _: usize, _: &Projections<'_>) -> candle_core::Result<Tensor> {
    candle_core::bail!("the CUDA form of StaticDecode needs the `cuda` feature")
}

/// The tensor-op form of `cuda/decode.cu`'s `decode_qkv`: biases added, RoPE at the host's
/// positions, key and value written to column `slot`; the rotated queries `[B, H, d]`.
fn qkv_ops(
    d: &StaticDecode,
    layer: usize,
    proj: &Projections<'_>,
    host: &HostStep<'_>,
) -> candle_core::Result<Tensor> {
    let (h, kv, hd) = d.heads;
    let (q, k, v) = match *proj {
        Projections::Apart { q, k, v, bias } => match bias {
            Some([qb, kb, vb]) => (
                q.broadcast_add(qb)?,
                k.broadcast_add(kb)?,
                v.broadcast_add(vb)?,
            ),
            None => (q.clone(), k.clone(), v.clone()),
        },
        Projections::Merged { qkv, bias } => {
            let qkv = match bias {
                Some(b) => qkv.broadcast_add(b)?,
                None => qkv.clone(),
            };
            (
                qkv.narrow(1, 0, h * hd)?,
                qkv.narrow(1, h * hd, kv * hd)?,
                qkv.narrow(1, (h + kv) * hd, kv * hd)?,
            )
        }
    };
    let b = q.dim(0)?;
    let pos = Tensor::new(host.positions, q.device())?;
    let cos = d.cos.index_select(&pos, 0)?.reshape((b, 1, 1, hd))?;
    let sin = d.sin.index_select(&pos, 0)?.reshape((b, 1, 1, hd))?;
    let q = apply_rope_ops(&q.reshape((b, h, 1, hd))?, &cos, &sin)?;
    let k = apply_rope_ops(&k.reshape((b, kv, 1, hd))?, &cos, &sin)?;
    d.k[layer].slice_set(&k.contiguous()?, 2, host.slot)?;
    d.v[layer].slice_set(&v.reshape((b, kv, 1, hd))?.contiguous()?, 2, host.slot)?;
    q.reshape((b, h, hd))
}

/// The tensor-op form's key mask: row `b` sees columns `starts[b] ..= slot` of `cap`.
fn host_mask(starts: &[usize], slot: usize, cap: usize) -> KeyMask {
    let pad = starts
        .iter()
        .flat_map(|&s| (0..cap).map(move |j| j < s || j > slot))
        .collect();
    KeyMask {
        causal: false,
        past: 0,
        pad: Some(std::sync::Arc::new(pad)),
        mask_value: MASK_VALUE,
        pad_bias: None,
    }
}

/// Runs `f` with candle's cache of host-to-device parameter uploads on (a CUDA device): the
/// shapes and strides some ops upload (index_select, strided element-wise ops) are kept on the
/// device, keyed by value, so that a capture of the same ops reads them there instead of from
/// host memory freed long before a replay.
fn with_htod_cache<R>(device: &Device, f: impl FnOnce() -> R) -> R {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(d) = device {
        let _cache = d.enable_cuda_graph_htod_cache();
        return f();
    }
    let _ = device;
    f()
}

#[cfg(test)]
mod sim_tests;
#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
