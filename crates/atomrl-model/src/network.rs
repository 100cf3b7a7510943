//! The decoder network: attention, SwiGLU MLP, decoder layers, built from named tensors.

use atomrl_core::profile;
use candle_core::{DType, Result, Tensor};

use crate::attention::{attend, grouped_attention};
use crate::cache::KvCache;
use crate::config::{Architecture, ModelConfig};
use crate::input::AttentionBias;
use crate::linear::{Linear, LoraAdapter, TensorFn};
use crate::ops::{apply_rope, repeat_kv, rms_norm, softmax_last};

/// What a static decode step ([`crate::static_decode`]) supplies to the network for each
/// layer: the new token's attention inputs written to the cache, the cache, and the mask.
pub(crate) trait StepCache {
    /// The new token's rotated queries `[B, H, d]` from its projections (biases not yet added
    /// where they come apart); writes its key and value into layer `layer`'s cache.
    fn qkv(&self, layer: usize, proj: &Projections<'_>) -> Result<Tensor>;
    /// Layer `layer`'s keys and values `[B, KV, cap, d]`.
    fn kv(&self, layer: usize) -> (&Tensor, &Tensor);
    /// Which cache columns each row attends to.
    fn mask(&self) -> &crate::kernels::KeyMask;
    /// Layer `layer`'s merged projection weights, where the decoder made them.
    fn merged(&self, layer: usize) -> Option<&MergedLayer>;
}

/// The new token's query, key and value projections as a decode step hands them on.
pub(crate) enum Projections<'a> {
    /// `q [B, H·d]`, `k`, `v [B, KV·d]`, and their biases (not yet added) when given.
    Apart {
        q: &'a Tensor,
        k: &'a Tensor,
        v: &'a Tensor,
        bias: Option<[&'a Tensor; 3]>,
    },
    /// One merged projection `[B, (H + 2·KV)·d]` (each row q | k | v) and its merged bias
    /// `[(H + 2·KV)·d]` (not yet added) when the layer has one.
    Merged {
        qkv: &'a Tensor,
        bias: Option<&'a Tensor>,
    },
}

/// A decoder layer's projections merged for decoding, where they can be: one matmul for q, k
/// and v (`[(H + 2·KV)·d, hidden]` and the merged bias), one for gate and up (`[2·I, hidden]`).
/// A decode step at a small batch is bound by kernel count, not by bytes: each merge saves
/// launches and reads the same weights (docs/cuda.md).
#[derive(Debug, Clone)]
pub(crate) struct MergedLayer {
    pub qkv: Option<(Tensor, Option<Tensor>)>,
    pub gate_up: Option<Tensor>,
}

/// Where the network's tensors come from: the base weight by HF name (already detached when
/// frozen), and the LoRA adapter of a module path, if any.
pub(crate) trait TensorSource {
    /// The tensor `name`.
    fn get(&self, name: &str) -> Result<Tensor>;
    /// Whether `name` exists.
    fn has(&self, name: &str) -> bool;
    /// Whether base linear weights are frozen (no gradient work).
    fn frozen(&self) -> bool;
    /// The adapter of module `module` (`model.layers.0.self_attn.q_proj`).
    fn lora(&self, module: &str) -> Result<Option<LoraAdapter>>;
}

fn linear(src: &dyn TensorSource, module: &str, bias: bool) -> Result<Linear> {
    let bias_name = format!("{module}.bias");
    Ok(Linear {
        weight: src.get(&format!("{module}.weight"))?,
        bias: if bias || src.has(&bias_name) {
            Some(src.get(&bias_name)?)
        } else {
            None
        },
        frozen: src.frozen(),
        lora: src.lora(module)?,
        weight_t: None,
        product_t: false,
    })
}

#[derive(Debug, Clone)]
struct Attention {
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    q_norm: Option<Tensor>,
    k_norm: Option<Tensor>,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    eps: f64,
    /// Generation views: candle's forward-only RMSNorm/softmax/RoPE kernels and grouped-query
    /// attention (see [`Network::set_fused_kernels`]).
    fused: bool,
    /// Score elements an attention may hold at once before it runs in chunks of queries
    /// ([`crate::attention`]).
    scores_budget: usize,
}

impl Attention {
    fn map(&self, f: &mut TensorFn<'_>) -> Result<Self> {
        Ok(Self {
            q: self.q.map(f)?,
            k: self.k.map(f)?,
            v: self.v.map(f)?,
            o: self.o.map(f)?,
            q_norm: self.q_norm.as_ref().map(&mut *f).transpose()?,
            k_norm: self.k_norm.as_ref().map(&mut *f).transpose()?,
            ..*self
        })
    }

    /// Attention of the queries at positions `from..L` of `x [N, L, H]` over the keys and
    /// values of every position (and the cache's): `[N, L - from, H]`. Every position's key
    /// and value still go into the cache.
    fn forward(
        &self,
        x: &Tensor,
        rope: (&Tensor, &Tensor),
        bias: &AttentionBias,
        slot: Option<(&mut KvCache, usize)>,
        train: bool,
        from: usize,
    ) -> Result<Tensor> {
        let (n, l, _) = x.dims3()?;
        let (nh, nkv, hd) = (self.heads, self.kv_heads, self.head_dim);
        let lq = l - from;
        let xq = if from > 0 {
            x.narrow(1, from, lq)?
        } else {
            x.clone()
        };
        let mut q = self.q.forward(&xq, train)?.reshape((n, lq, nh, hd))?;
        let mut k = self.k.forward(x, train)?.reshape((n, l, nkv, hd))?;
        let v = self.v.forward(x, train)?.reshape((n, l, nkv, hd))?;
        if let (Some(qn), Some(kn)) = (&self.q_norm, &self.k_norm) {
            q = rms_norm(&q, qn, self.eps, self.fused)?;
            k = rms_norm(&k, kn, self.eps, self.fused)?;
        }
        // Head-major views of the projections; the RoPE kernel reads them as they lie and
        // writes head-major, so neither is copied to transpose it (nor its gradient).
        let (q, k) = (q.transpose(1, 2)?, k.transpose(1, 2)?);
        let (q, k) = if self.fused {
            // `rope` holds the half-width tables `[N, L, d/2]` here (`Network::hidden`).
            let (cos, sin) = query_tables(rope, 1, from, lq)?;
            (
                candle_nn::rotary_emb::rope(&q.contiguous()?, &cos, &sin)?,
                candle_nn::rotary_emb::rope(&k.contiguous()?, rope.0, rope.1)?,
            )
        } else {
            let (cos, sin) = query_tables(rope, 2, from, lq)?;
            (apply_rope(&q, &cos, &sin)?, apply_rope(&k, rope.0, rope.1)?)
        };
        let queries_bias;
        let bias = if from > 0 {
            queries_bias = bias.queries_from(from)?;
            &queries_bias
        } else {
            bias
        };
        let v = v.transpose(1, 2)?.contiguous()?;
        let (k, v) = match slot {
            Some((cache, layer)) => cache.append(layer, &k, &v)?,
            None => (k, v),
        };
        let scale = 1.0 / (hd as f64).sqrt();
        // AtomRL's fused softmax (one launch, the mask from its description) wherever it runs,
        // the generation view's decode steps included; candle-nn's forward-only softmax after a
        // scale and bias adds (three to five launches) for the view's other dtypes.
        let out = if self.fused && !crate::kernels::fused_on(&q) {
            grouped_attention(&q, &k, &v, |s| {
                softmax_last(&bias.apply(&(s * scale)?)?, true)
            })?
        } else if crate::kernels::fused_on(&q) {
            attend(&q, &k, &v, scale, &bias.keys, self.scores_budget)?
        } else {
            let k = repeat_kv(&k, nh / nkv)?;
            let v = repeat_kv(&v, nh / nkv)?;
            let scores = q.matmul(&k.t()?)?;
            softmax_last(&bias.apply(&(scores * scale)?)?, false)?.matmul(&v)?
        };
        let out = out.transpose(1, 2)?.reshape((n, lq, nh * hd))?;
        self.o.forward(&out, train)
    }
}

/// The rotary tables of the queries at positions `from..from + len` (all of them when
/// `from` is 0), the position axis being `axis`.
fn query_tables(
    rope: (&Tensor, &Tensor),
    axis: usize,
    from: usize,
    len: usize,
) -> Result<(Tensor, Tensor)> {
    if from == 0 {
        return Ok((rope.0.clone(), rope.1.clone()));
    }
    Ok((
        rope.0.narrow(axis, from, len)?.contiguous()?,
        rope.1.narrow(axis, from, len)?.contiguous()?,
    ))
}

impl Attention {
    /// One decode step of a static batch: `x [B, hidden]` → `[B, hidden]`, attending over the
    /// whole cache of `s` under its mask (see [`crate::static_decode`]).
    fn decode_static(&self, x: &Tensor, layer: usize, s: &dyn StepCache) -> Result<Tensor> {
        let b = x.dim(0)?;
        let (nh, nkv, hd) = (self.heads, self.kv_heads, self.head_dim);
        let q = if let Some((w, bias)) = s.merged(layer).and_then(|m| m.qkv.as_ref()) {
            let qkv = x.matmul(&w.t()?)?;
            s.qkv(
                layer,
                &Projections::Merged {
                    qkv: &qkv,
                    bias: bias.as_ref(),
                },
            )?
        } else {
            self.decode_qkv_apart(x, layer, s)?
        };
        let (kc, vc) = s.kv(layer);
        let cap = kc.dim(2)?;
        let group = nh / nkv;
        let scores = q.reshape((b, nkv, group, hd))?.matmul(&kc.t()?)?;
        let scale = 1.0 / (hd as f64).sqrt();
        let p =
            crate::kernels::attention_softmax(&scores.reshape((b, nh, 1, cap))?, scale, s.mask())?;
        let out = p.reshape((b, nkv, group, cap))?.matmul(vc)?;
        self.o.forward(&out.reshape((b, nh * hd))?, false)
    }

    /// The rotated queries `[B, H, d]` of a decode step from q, k and v projected apart (the
    /// per-head q/k norms of Qwen3, LoRA adapters, mixed biases), the key and value written.
    fn decode_qkv_apart(&self, x: &Tensor, layer: usize, s: &dyn StepCache) -> Result<Tensor> {
        let b = x.dim(0)?;
        let (nh, nkv, hd) = (self.heads, self.kv_heads, self.head_dim);
        let (q, k, v, bias) = if let (Some(qn), Some(kn)) = (&self.q_norm, &self.k_norm) {
            let qp = self.q.forward(x, false)?.reshape((b, nh, hd))?;
            let kp = self.k.forward(x, false)?.reshape((b, nkv, hd))?;
            let q = rms_norm(&qp, qn, self.eps, self.fused)?;
            let k = rms_norm(&kp, kn, self.eps, self.fused)?;
            (q, k, self.v.forward(x, false)?, None)
        } else {
            let (qp, qb) = self.q.split_bias(x)?;
            let (kp, kb) = self.k.split_bias(x)?;
            let (vp, vb) = self.v.split_bias(x)?;
            match (qb, kb, vb) {
                // All three biases: the kernel adds them.
                (Some(qb), Some(kb), Some(vb)) => (qp, kp, vp, Some([qb, kb, vb])),
                (qb, kb, vb) => {
                    let add = |t: Tensor, b: Option<Tensor>| match b {
                        Some(b) => t.broadcast_add(&b),
                        None => Ok(t),
                    };
                    (add(qp, qb)?, add(kp, kb)?, add(vp, vb)?, None)
                }
            }
        };
        let proj = Projections::Apart {
            q: &q,
            k: &k,
            v: &v,
            bias: bias.as_ref().map(|[a, b, c]| [a, b, c]),
        };
        s.qkv(layer, &proj)
    }

    /// q, k and v merged into one projection (weight and bias), when the layer projects them
    /// alike: no per-head norms, no LoRA adapter, biases on all three or on none.
    fn merged_qkv(&self) -> Result<Option<(Tensor, Option<Tensor>)>> {
        let lin = [&self.q, &self.k, &self.v];
        if self.q_norm.is_some() || lin.iter().any(|l| l.lora.is_some()) {
            return Ok(None);
        }
        let weight = Tensor::cat(&[&self.q.weight, &self.k.weight, &self.v.weight], 0)?;
        match (&self.q.bias, &self.k.bias, &self.v.bias) {
            (Some(a), Some(b), Some(c)) => Ok(Some((weight, Some(Tensor::cat(&[a, b, c], 0)?)))),
            (None, None, None) => Ok(Some((weight, None))),
            _ => Ok(None),
        }
    }
}

#[derive(Debug, Clone)]
struct Mlp {
    gate: Linear,
    up: Linear,
    down: Linear,
}

impl Mlp {
    fn map(&self, f: &mut TensorFn<'_>) -> Result<Self> {
        Ok(Self {
            gate: self.gate.map(f)?,
            up: self.up.map(f)?,
            down: self.down.map(f)?,
        })
    }

    fn forward(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        let g = self.gate.forward(x, train)?;
        let u = self.up.forward(x, train)?;
        let h = if crate::kernels::fused_on(&g) && u.dtype() == g.dtype() {
            crate::kernels::swiglu(&g, &u)?
        } else {
            (g.silu()? * u)?
        };
        self.down.forward(&h, train)
    }

    /// The MLP of a decode step `x [B, hidden]`, with the merged gate/up weight when given.
    fn decode(&self, x: &Tensor, gate_up: Option<&Tensor>) -> Result<Tensor> {
        let Some(w) = gate_up else {
            return self.forward(x, false);
        };
        let gu = x.matmul(&w.t()?)?;
        let h = crate::kernels::swiglu_packed(&gu)?;
        self.down.forward(&h, false)
    }

    /// gate and up merged into one weight `[2·I, hidden]`, when neither has a bias or adapter.
    fn merged_gate_up(&self) -> Result<Option<Tensor>> {
        let plain = |l: &Linear| l.bias.is_none() && l.lora.is_none();
        if !(plain(&self.gate) && plain(&self.up)) {
            return Ok(None);
        }
        Tensor::cat(&[&self.gate.weight, &self.up.weight], 0).map(Some)
    }
}

#[derive(Debug, Clone)]
pub(crate) struct DecoderLayer {
    attn: Attention,
    mlp: Mlp,
    input_norm: Tensor,
    post_attn_norm: Tensor,
    eps: f64,
    fused: bool,
}

impl DecoderLayer {
    /// The same layer with `f` applied to each tensor, in a fixed order.
    pub fn map(&self, f: &mut TensorFn<'_>) -> Result<Self> {
        Ok(Self {
            attn: self.attn.map(f)?,
            mlp: self.mlp.map(f)?,
            input_norm: f(&self.input_norm)?,
            post_attn_norm: f(&self.post_attn_norm)?,
            eps: self.eps,
            fused: self.fused,
        })
    }

    /// The layer's seven projections.
    fn linears(&self) -> [&Linear; 7] {
        let (a, m) = (&self.attn, &self.mlp);
        [&a.q, &a.k, &a.v, &a.o, &m.gate, &m.up, &m.down]
    }

    /// The layer's seven projections, to change.
    fn linears_mut(&mut self) -> [&mut Linear; 7] {
        let (a, m) = (&mut self.attn, &mut self.mlp);
        [
            &mut a.q,
            &mut a.k,
            &mut a.v,
            &mut a.o,
            &mut m.gate,
            &mut m.up,
            &mut m.down,
        ]
    }

    /// Whether some adapter of the layer applies dropout in training mode.
    pub fn has_dropout(&self) -> bool {
        self.linears().iter().any(|l| l.has_dropout())
    }

    /// The layer's output `[N, L - from, H]` at positions `from..L` of `x [N, L, H]` (`from`
    /// 0: every position): the keys and values of every position go into the cache and are
    /// attended to, but the queries, the attention's output and the MLP are computed at
    /// `from..L` only (a prompt pass's last layer needs its last position alone).
    pub fn forward(
        &self,
        x: &Tensor,
        rope: (&Tensor, &Tensor),
        bias: &AttentionBias,
        slot: Option<(&mut KvCache, usize)>,
        train: bool,
        from: usize,
    ) -> Result<Tensor> {
        let x = {
            let _p = profile::phase("forward.layer.attention", x.device());
            let h = rms_norm(x, &self.input_norm, self.eps, self.fused)?;
            let a = self.attn.forward(&h, rope, bias, slot, train, from)?;
            if from > 0 {
                let l = x.dim(1)?;
                (x.narrow(1, from, l - from)? + a)?
            } else {
                (x + a)?
            }
        };
        let _p = profile::phase("forward.layer.mlp", x.device());
        let h = rms_norm(&x, &self.post_attn_norm, self.eps, self.fused)?;
        x + self.mlp.forward(&h, train)?
    }
}

impl DecoderLayer {
    /// One decode step of a static batch through this layer: the residual stream `x [B, hidden]`
    /// and `h`, `x` through this layer's input norm, → the stream after the layer and that
    /// through `next_norm` (the next layer's input norm, or the final norm). Each residual add
    /// runs with the norm after it as one kernel on CUDA ([`crate::kernels::add_rms_norm`]).
    fn decode_static(
        &self,
        (x, h): (&Tensor, &Tensor),
        layer: usize,
        s: &dyn StepCache,
        next_norm: &Tensor,
    ) -> Result<(Tensor, Tensor)> {
        let merged = s.merged(layer);
        let a = self.attn.decode_static(h, layer, s)?;
        let (x, h) =
            crate::kernels::add_rms_norm(x, &a, &self.post_attn_norm, self.eps, self.fused)?;
        let m = self
            .mlp
            .decode(&h, merged.and_then(|m| m.gate_up.as_ref()))?;
        crate::kernels::add_rms_norm(&x, &m, next_norm, self.eps, self.fused)
    }

    /// This layer's projections merged for decoding ([`MergedLayer`]).
    fn merged(&self) -> Result<MergedLayer> {
        Ok(MergedLayer {
            qkv: self.attn.merged_qkv()?,
            gate_up: self.mlp.merged_gate_up()?,
        })
    }
}

/// `[N, 1, L, d]` rotate-half tables (duplicated halves) → the `[N, L, d/2]` form of
/// `candle_nn::rotary_emb::rope`.
fn half_table(t: &Tensor) -> Result<Tensor> {
    let d = t.dim(3)?;
    t.narrow(3, 0, d / 2)?.squeeze(1)?.contiguous()
}

/// The whole network with its tensors.
#[derive(Debug, Clone)]
pub(crate) struct Network {
    embed: Tensor,
    layers: Vec<DecoderLayer>,
    norm: Tensor,
    lm_head: Linear,
    eps: f64,
    hidden: usize,
    /// Whether `lm_head` shares the embedding.
    tied: bool,
    /// Recompute each decoder layer in backward instead of keeping its activations.
    pub checkpoint: bool,
    /// See [`Network::set_fused_kernels`].
    pub(crate) fused: bool,
}

impl Network {
    pub fn build(c: &ModelConfig, src: &dyn TensorSource) -> Result<Self> {
        let embed = src.get("model.embed_tokens.weight")?;
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        for i in 0..c.num_hidden_layers {
            let p = format!("model.layers.{i}");
            let a = format!("{p}.self_attn");
            let qk_norm = c.architecture == Architecture::Qwen3;
            let attn = Attention {
                q: linear(src, &format!("{a}.q_proj"), c.qkv_bias)?,
                k: linear(src, &format!("{a}.k_proj"), c.qkv_bias)?,
                v: linear(src, &format!("{a}.v_proj"), c.qkv_bias)?,
                o: linear(src, &format!("{a}.o_proj"), c.o_bias)?,
                q_norm: if qk_norm {
                    Some(src.get(&format!("{a}.q_norm.weight"))?)
                } else {
                    None
                },
                k_norm: if qk_norm {
                    Some(src.get(&format!("{a}.k_norm.weight"))?)
                } else {
                    None
                },
                heads: c.num_attention_heads,
                kv_heads: c.num_key_value_heads,
                head_dim: c.head_dim,
                eps: c.rms_norm_eps,
                fused: false,
                scores_budget: crate::attention::DEFAULT_SCORES_BUDGET,
            };
            let mlp = Mlp {
                gate: linear(src, &format!("{p}.mlp.gate_proj"), false)?,
                up: linear(src, &format!("{p}.mlp.up_proj"), false)?,
                down: linear(src, &format!("{p}.mlp.down_proj"), false)?,
            };
            layers.push(DecoderLayer {
                attn,
                mlp,
                input_norm: src.get(&format!("{p}.input_layernorm.weight"))?,
                post_attn_norm: src.get(&format!("{p}.post_attention_layernorm.weight"))?,
                eps: c.rms_norm_eps,
                fused: false,
            });
        }
        let head_weight = if c.tie_word_embeddings {
            embed.clone()
        } else {
            src.get("lm_head.weight")?
        };
        Ok(Self {
            embed,
            layers,
            norm: src.get("model.norm.weight")?,
            lm_head: Linear {
                weight: head_weight,
                bias: None,
                frozen: src.frozen(),
                lora: None,
                weight_t: None,
                product_t: false,
            },
            eps: c.rms_norm_eps,
            hidden: c.hidden_size,
            tied: c.tie_word_embeddings,
            checkpoint: false,
            fused: false,
        })
    }

    /// The same network with `f` applied to each tensor (a tied head follows the embedding).
    pub fn map(&self, f: &mut TensorFn<'_>) -> Result<Self> {
        let embed = f(&self.embed)?;
        let layers = self
            .layers
            .iter()
            .map(|l| l.map(f))
            .collect::<Result<Vec<_>>>()?;
        let norm = f(&self.norm)?;
        let lm_head = if self.tied {
            Linear {
                weight: embed.clone(),
                weight_t: None,
                ..self.lm_head.clone()
            }
        } else {
            self.lm_head.map(f)?
        };
        Ok(Self {
            embed,
            layers,
            norm,
            lm_head,
            ..*self
        })
    }

    /// The network computing in `dtype`: each tensor cast with a differentiable `to_dtype`
    /// (gradients reach the original tensors in their dtype); tensors already in `dtype` are
    /// shared.
    pub fn cast(&self, dtype: DType) -> Result<Self> {
        self.map(&mut |t| t.to_dtype(dtype))
    }

    /// The LM head cast to `dtype` (see [`Network::cast`]).
    pub fn head_cast(&self, dtype: DType) -> Result<Linear> {
        self.lm_head.map(&mut |t| t.to_dtype(dtype))
    }

    /// Final-normed hidden states `[N, L - from, H]` at positions `from..L` (the last decoder
    /// layer computes nothing at the others; every position's keys and values still reach
    /// `cache`).
    pub fn hidden(
        &self,
        ids: &Tensor,
        rope: (&Tensor, &Tensor),
        bias: &AttentionBias,
        mut cache: Option<&mut KvCache>,
        train: bool,
        from: usize,
    ) -> Result<Tensor> {
        let (n, l) = ids.dims2()?;
        let mut x =
            self.embed
                .index_select(&ids.flatten_all()?, 0)?
                .reshape((n, l, self.hidden))?;
        // Fused layers take the half-width tables candle's rope kernel reads, made once here.
        let half;
        let rope = if self.fused {
            half = (half_table(rope.0)?, half_table(rope.1)?);
            (&half.0, &half.1)
        } else {
            rope
        };
        let last_layer = self.layers.len().checked_sub(1);
        for (i, layer) in self.layers.iter().enumerate() {
            let slot = cache.as_deref_mut().map(|c| (c, i));
            // A last layer trimmed to a few positions keeps little for its backward; it is
            // not checkpointed.
            x = if from > 0 && Some(i) == last_layer {
                layer.forward(&x, rope, bias, slot, train, from)?
            } else if self.checkpoint && slot.is_none() {
                crate::checkpoint::forward(layer, &x, rope, bias, train)?
            } else {
                layer.forward(&x, rope, bias, slot, train, 0)?
            };
        }
        if from > 0 && last_layer.is_none() {
            x = x.narrow(1, from, l - from)?;
        }
        rms_norm(&x, &self.norm, self.eps, self.fused)
    }

    /// Logits `[B, V]` of one static decode step: token ids `[B]` (u32, on the device)
    /// through every layer over the caches of `s` (see [`crate::static_decode`]).
    pub fn decode_static(&self, ids: &Tensor, s: &dyn StepCache) -> Result<Tensor> {
        let mut x = self.embed.index_select(ids, 0)?;
        let Some(first) = self.layers.first() else {
            let h = rms_norm(&x, &self.norm, self.eps, self.fused)?;
            return self.lm_head.forward(&h, false);
        };
        let mut h = rms_norm(&x, &first.input_norm, self.eps, self.fused)?;
        for (i, layer) in self.layers.iter().enumerate() {
            let next_norm = self
                .layers
                .get(i + 1)
                .map_or(&self.norm, |next| &next.input_norm);
            (x, h) = layer.decode_static((&x, &h), i, s, next_norm)?;
        }
        self.lm_head.forward(&h, false)
    }

    /// The network with every projection's transposed weight ([`Linear::weight_t`], made on
    /// first use): the products of decode steps on the CPU read it without gemm copying the
    /// weight first. Up to a copy of every projection weight; only for a network whose weights
    /// no longer change (a view for decoding).
    pub fn with_transposed_weights(&self) -> Self {
        self.with_each_projection(Linear::keep_transposed)
    }

    /// The network with every projection's few-row products computed as `(W · xᵀ)ᵀ`
    /// ([`Linear::transpose_products`]): the decode steps' products skip gemm's copy of each
    /// weight without a transposed copy of it. Only for a view for decoding.
    pub fn with_transposed_products(&self) -> Self {
        self.with_each_projection(Linear::transpose_products)
    }

    /// A copy of the network with `f` applied to every projection, the LM head's included.
    fn with_each_projection(&self, f: impl Fn(&mut Linear)) -> Self {
        let mut net = self.clone();
        for layer in &mut net.layers {
            for linear in layer.linears_mut() {
                f(linear);
            }
        }
        f(&mut net.lm_head);
        net
    }

    /// Bytes of the projection weights, the LM head's included: what
    /// [`Network::with_transposed_weights`] copies.
    pub fn projection_bytes(&self) -> usize {
        let bytes = |l: &Linear| l.weight.elem_count() * l.weight.dtype().size_in_bytes();
        let layers: usize = self
            .layers
            .iter()
            .flat_map(DecoderLayer::linears)
            .map(bytes)
            .sum();
        layers + bytes(&self.lm_head)
    }

    /// Every layer's projections merged for decoding, where they can be ([`MergedLayer`]).
    pub fn merged_layers(&self) -> Result<Vec<MergedLayer>> {
        self.layers.iter().map(DecoderLayer::merged).collect()
    }

    /// Uses candle's forward-only RMSNorm, softmax and RoPE kernels and grouped-query attention
    /// (`true`; only for a network of detached tensors) or the differentiable tensor-op forms
    /// (see [`crate::ops`]).
    pub fn set_fused_kernels(&mut self, fused: bool) {
        self.fused = fused;
        for layer in &mut self.layers {
            layer.fused = fused;
            layer.attn.fused = fused;
        }
    }

    /// Score elements `[N, H, L, S]` an attention may hold at once; past it, it runs in chunks
    /// of queries ([`crate::attention`]).
    pub fn set_attention_scores_budget(&mut self, elements: usize) {
        for layer in &mut self.layers {
            layer.attn.scores_budget = elements.max(1);
        }
    }

    /// The LM head's weight `[V, H]`.
    pub fn head_weight(&self) -> &Tensor {
        &self.lm_head.weight
    }

    /// Logits `[.., V]` of hidden states `[.., H]`.
    pub fn logits(&self, hidden: &Tensor) -> Result<Tensor> {
        self.lm_head.forward(hidden, false)
    }
}
