//! FlashAttention on CUDA: `softmax(scale · q·kᵀ + mask)·v` as one graph node whose forward is
//! one kernel and whose backward is two (`atomrl-core/cuda/attention.cu`), with neither the
//! `[N, H, L, S]` scores nor the probabilities in memory, only each query row's max and
//! log-sum for backward (Dao et al. 2022; the deterministic backward split of Dao 2023).
//!
//! Which attentions take it is [`FlashPolicy`] (`ATOMRL_FLASH_ATTENTION`). By default, those in
//! bf16 and f16 whose scores pass the score budget, where the tensor-op form would run in chunks
//! of queries (`crate::attention`): in those dtypes all three kernels' products run on tensor
//! cores (WMMA, f32 accumulators), and nothing of `[L, S]` is in memory where the chunks hold
//! one chunk's scores at a time. `long` takes f32 too (CUDA-core kernels), `1` every attention
//! the kernels can run, `0` none. Below the budget (the bench's 320 tokens) the tensor-op form
//! stays the default until a GPU has timed both there (`xtask/gpu-run.sh` steps `flash`,
//! `long` and `attention`; docs/cuda.md).
// Kernel launches are FFI (`atomrl_core::launch_kernel!`) and buffers are allocated
// uninitialised; each says what the kernel reads and writes.
#![cfg_attr(feature = "cuda", allow(unsafe_code))]

use std::sync::OnceLock;

/// The environment variable that chooses FlashAttention on CUDA ([`FlashPolicy`]).
pub const FLASH_ATTENTION_ENV: &str = "ATOMRL_FLASH_ATTENTION";

/// Which attentions on CUDA run as FlashAttention kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlashPolicy {
    /// None: the tensor-op forms (`0`, `false`, `off` or `no`).
    Off,
    /// The default (unset or empty): the attentions in bf16 or f16 (whose kernels run on
    /// tensor cores) whose scores would pass the score budget.
    PastBudgetOnTensorCores,
    /// Those whose scores would pass the score budget, in any dtype (`long`).
    PastBudget,
    /// Every attention the kernels can run (`1`, `true`, `on` or `yes`).
    Always,
}

impl FlashPolicy {
    /// The policy a value of [`FLASH_ATTENTION_ENV`] asks for; `None` for a value it does not
    /// know.
    ///
    /// ```
    /// use atomrl_model::FlashPolicy;
    /// assert_eq!(FlashPolicy::parse(None), Some(FlashPolicy::PastBudgetOnTensorCores));
    /// assert_eq!(FlashPolicy::parse(Some("0")), Some(FlashPolicy::Off));
    /// assert_eq!(FlashPolicy::parse(Some("1")), Some(FlashPolicy::Always));
    /// assert_eq!(FlashPolicy::parse(Some(" Long ")), Some(FlashPolicy::PastBudget));
    /// assert_eq!(FlashPolicy::parse(Some("sometimes")), None);
    /// ```
    pub fn parse(value: Option<&str>) -> Option<Self> {
        match value.map(|v| v.trim().to_ascii_lowercase()).as_deref() {
            None | Some("") => Some(Self::PastBudgetOnTensorCores),
            Some("0" | "false" | "off" | "no") => Some(Self::Off),
            Some("1" | "true" | "on" | "yes") => Some(Self::Always),
            Some("long") => Some(Self::PastBudget),
            Some(_) => None,
        }
    }

    /// Whether this policy runs an attention in `dtype` as FlashAttention (where the kernels
    /// can run it), given whether its scores pass the score budget.
    ///
    /// ```
    /// use atomrl_model::FlashPolicy;
    /// use candle_core::DType;
    /// let default = FlashPolicy::PastBudgetOnTensorCores;
    /// assert!(default.takes(DType::BF16, true) && default.takes(DType::F16, true));
    /// assert!(!default.takes(DType::BF16, false) && !default.takes(DType::F32, true));
    /// assert!(FlashPolicy::PastBudget.takes(DType::F32, true));
    /// assert!(FlashPolicy::Always.takes(DType::F32, false));
    /// assert!(!FlashPolicy::Off.takes(DType::BF16, true));
    /// ```
    pub fn takes(self, dtype: candle_core::DType, past_budget: bool) -> bool {
        use candle_core::DType;
        match self {
            Self::Always => true,
            Self::PastBudget => past_budget,
            Self::PastBudgetOnTensorCores => {
                past_budget && matches!(dtype, DType::BF16 | DType::F16)
            }
            Self::Off => false,
        }
    }

    /// This process's policy, read from [`FLASH_ATTENTION_ENV`] once; a value it does not know
    /// is warned about and read as the default, [`FlashPolicy::PastBudgetOnTensorCores`].
    pub fn current() -> Self {
        static POLICY: OnceLock<FlashPolicy> = OnceLock::new();
        *POLICY.get_or_init(|| {
            let value = std::env::var(FLASH_ATTENTION_ENV).ok();
            Self::parse(value.as_deref()).unwrap_or_else(|| {
                // A library's one-time notice, as the kernels' self-check gives its own.
                eprintln!(
                    "warning: {FLASH_ATTENTION_ENV}={value:?} is not one of 0, 1 or long: \
                     FlashAttention keeps its default (bf16 and f16 past the score budget)"
                );
                Self::PastBudgetOnTensorCores
            })
        })
    }
}

#[cfg(feature = "cuda")]
pub(crate) use cuda::{flash_attention, usable};

#[cfg(feature = "cuda")]
mod cuda {
    use std::sync::Mutex;

    use atomrl_core::cuda::{contiguous_range as range, kernel_name as kernel, launch_config};
    use atomrl_core::launch_dims::{self, FLASH_MAX_HEAD_DIM};
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::{CudaSlice, CudaView, DeviceRepr};
    use candle_core::cuda_backend::CudaDType;
    use candle_core::{
        CpuStorage, CudaDevice, CudaStorage, CustomOp3, DType, Layout, Result, Shape, Tensor,
    };

    use crate::kernels::KeyMask;

    /// The module name the device caches the PTX under.
    const MODULE: &str = "atomrl_attention";

    /// Whether the kernels can run the attention of `q [N, H, L, d]` over `k [N, KV, S, d]`
    /// under `mask`: on CUDA with the fused kernels on and verified, a head dim up to
    /// [`FLASH_MAX_HEAD_DIM`], `H` a multiple of `KV`, key padding (if any) on the device, and
    /// FlashAttention's own self-check passed on that GPU
    /// ([`crate::kernel_check::flash_self_check`]; a failure keeps the tensor-op attention
    /// there, the other kernels on).
    pub(crate) fn usable(q: &Tensor, k: &Tensor, mask: &KeyMask) -> bool {
        let (Ok((_, h, _, d)), Ok((_, kv, _, _))) = (q.dims4(), k.dims4()) else {
            return false;
        };
        q.device().is_cuda()
            && crate::kernels::fused_on(q)
            && (1..=FLASH_MAX_HEAD_DIM).contains(&d)
            && kv > 0
            && h % kv == 0
            && (mask.pad.is_none() || mask.pad_bias.is_some())
            && crate::kernels::passes_once(
                q.device(),
                "AtomRL's FlashAttention kernels",
                "the tensor-op attention (ATOMRL_FLASH_ATTENTION=0 skips the check)",
                crate::kernel_check::flash_self_check,
            )
    }

    /// FlashAttention of `q [N, H, L, d]` over `k, v [N, KV, S, d]` → `[N, H, L, d]`, as one
    /// graph node (see the module docs). The inputs are made contiguous first (a copy where
    /// they are views).
    pub(crate) fn flash_attention(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        scale: f64,
        mask: &KeyMask,
    ) -> Result<Tensor> {
        let pad = match &mask.pad_bias {
            Some(p) => Some(p.to_dtype(q.dtype())?.contiguous()?),
            None => None,
        };
        let op = FlashAttention {
            scale,
            causal: mask.causal,
            past: mask.past,
            mask_value: mask.mask_value,
            pad,
            saved: Mutex::new(None),
        };
        q.contiguous()?
            .apply_op3(&k.contiguous()?, &v.contiguous()?, op)
    }

    /// attention.cu's `FlashShape`: the scalar arguments of every kernel, passed by value.
    #[repr(C)]
    #[derive(Debug, Clone, Copy)]
    struct FlashShape {
        heads: i32,
        kv_heads: i32,
        l: i32,
        s: i32,
        d: i32,
        past: i32,
        causal: i32,
        scale: f32,
        mask_value: f32,
        has_pad: i32,
    }

    // SAFETY: plain `#[repr(C)]` data, field for field the kernels' `FlashShape`.
    unsafe impl DeviceRepr for FlashShape {}

    /// What the forward keeps for backward: each query row's `(max, log-sum)` and each batch
    /// row's first unpadded key.
    struct Saved {
        stats: CudaSlice<f32>,
        first_key: CudaSlice<i32>,
    }

    struct FlashAttention {
        scale: f64,
        causal: bool,
        past: usize,
        mask_value: f64,
        /// The key-padding bias `[N, S]` in the inputs' dtype (0 or `mask_value`).
        pad: Option<Tensor>,
        saved: Mutex<Option<Saved>>,
    }

    /// The contiguous elements of `st` that `lt` describes.
    fn view<'a, T: Elem>(st: &'a CudaStorage, lt: &Layout, what: &str) -> Result<CudaView<'a, T>> {
        let r = range(lt, what)?;
        Ok(st.as_cuda_slice::<T>()?.slice(r.0..r.1))
    }

    fn poisoned() -> candle_core::Error {
        candle_core::Error::Msg("atomrl-flash-attention: a lock was poisoned".into())
    }

    /// The shapes of one call: `(n, heads, kv_heads, l, s, d)`.
    type Dims = (usize, usize, usize, usize, usize, usize);

    fn dims(lq: &Layout, lk: &Layout, lv: &Layout) -> Result<Dims> {
        let (n, h, l, d) = lq.shape().dims4()?;
        let (nk, kv, s, dk) = lk.shape().dims4()?;
        if nk != n || dk != d || lv.shape() != lk.shape() || kv == 0 || h % kv != 0 {
            candle_core::bail!(
                "atomrl-flash-attention: q {:?}, k {:?} and v {:?} are not [N, H, L, d] and \
                 [N, KV, S, d] with H a multiple of KV",
                lq.dims(),
                lk.dims(),
                lv.dims()
            );
        }
        Ok((n, h, kv, l, s, d))
    }

    /// Elements of a kernel's element type.
    trait Elem: CudaDType + DeviceRepr {}
    impl<T: CudaDType + DeviceRepr> Elem for T {}

    impl FlashAttention {
        /// The scalar arguments every kernel takes after its buffers.
        fn shape(&self, (_, h, kv, l, s, d): Dims) -> FlashShape {
            FlashShape {
                heads: h as i32,
                kv_heads: kv as i32,
                l: l as i32,
                s: s as i32,
                d: d as i32,
                past: self.past as i32,
                causal: i32::from(self.causal),
                scale: self.scale as f32,
                mask_value: self.mask_value as f32,
                has_pad: i32::from(self.pad.is_some()),
            }
        }

        /// Runs `f` with the padding bias as a device slice (`q`'s when there is none: the
        /// kernels do not read it then).
        fn with_pad<T: Elem, R>(
            &self,
            q: &CudaView<'_, T>,
            n: usize,
            s: usize,
            f: impl FnOnce(&CudaView<'_, T>) -> Result<R>,
        ) -> Result<R> {
            match &self.pad {
                None => f(q),
                Some(p) => atomrl_core::cuda::with_cuda(p, |ps, lp| {
                    let r = range(lp, "pad bias")?;
                    if r.1 - r.0 != n * s {
                        candle_core::bail!(
                            "atomrl-flash-attention: a pad bias of {} for [{n}, {s}]",
                            r.1 - r.0
                        );
                    }
                    f(&ps.as_cuda_slice::<T>()?.slice(r.0..r.1))
                }),
            }
        }

        fn forward<T: Elem>(
            &self,
            (sq, lq): (&CudaStorage, &Layout),
            (sk, lk): (&CudaStorage, &Layout),
            (sv, lv): (&CudaStorage, &Layout),
        ) -> Result<(CudaStorage, Shape)> {
            let dims @ (n, h, _, l, s, d) = dims(lq, lk, lv)?;
            let dev: &CudaDevice = sq.device();
            let (rq, rk, rv) = (range(lq, "q")?, range(lk, "k")?, range(lv, "v")?);
            let q = sq.as_cuda_slice::<T>()?.slice(rq.0..rq.1);
            let k = sk.as_cuda_slice::<T>()?.slice(rk.0..rk.1);
            let v = sv.as_cuda_slice::<T>()?.slice(rv.0..rv.1);
            let dt = sq.dtype();
            let shape = self.shape(dims);
            // SAFETY (allocations): each kernel below writes all of its output.
            let first_key = unsafe { dev.alloc::<i32>(n.max(1))? };
            let o = unsafe { dev.alloc::<T>(n * h * l * d)? };
            let stats = unsafe { dev.alloc::<f32>(2 * n * h * l)? };
            self.with_pad::<T, ()>(&q, n, s, |pad| {
                let f =
                    dev.get_or_load_custom_func(&kernel("flash_first_key", dt)?, MODULE, ptx())?;
                let (si, has_pad) = (s as i32, shape.has_pad);
                // Launch: reads row b of pad (when has_pad), writes first_key[b].
                atomrl_core::launch_kernel!(
                    f,
                    launch_config(launch_dims::flash_first_key(n)),
                    pad,
                    &first_key,
                    &si,
                    &has_pad
                )?;
                // bf16 and f16 take the tensor-core forward; f32 the CUDA-core one.
                let (name, dims) = if dt == DType::F32 {
                    ("flash_fwd", launch_dims::flash_fwd(n, h, l))
                } else {
                    ("flash_fwd_tc", launch_dims::flash_fwd_tc(n, h, l))
                };
                let f = dev.get_or_load_custom_func(&kernel(name, dt)?, MODULE, ptx())?;
                // Launch: reads q, k, v (and pad), first_key; writes all of o and stats.
                atomrl_core::launch_kernel!(
                    f,
                    launch_config(dims),
                    &q,
                    &k,
                    &v,
                    pad,
                    &first_key,
                    &o,
                    &stats,
                    &shape
                )?;
                Ok(())
            })?;
            *self.saved.lock().map_err(|_| poisoned())? = Some(Saved { stats, first_key });
            Ok((T::wrap_cuda_slice(o, dev.clone()), lq.shape().clone()))
        }

        fn backward<T: Elem>(
            &self,
            q: &Tensor,
            k: &Tensor,
            v: &Tensor,
            o: &Tensor,
            grad: &Tensor,
        ) -> Result<(Tensor, Tensor, Tensor)> {
            use atomrl_core::cuda::{tensor_from_slice as tensor, with_cuda};
            let saved = self.saved.lock().map_err(|_| poisoned())?;
            let Some(saved) = saved.as_ref() else {
                candle_core::bail!("atomrl-flash-attention: backward before forward");
            };
            with_cuda(q, |sq, lq| {
                with_cuda(k, |sk, lk| {
                    with_cuda(v, |sv, lv| {
                        with_cuda(o, |so, lo| {
                            with_cuda(grad, |sg, lg| {
                                let dims @ (n, h, kv, l, s, d) = dims(lq, lk, lv)?;
                                let dev = sq.device();
                                let dt = sq.dtype();

                                let (qs, ks, vs) = (
                                    view::<T>(sq, lq, "q")?,
                                    view::<T>(sk, lk, "k")?,
                                    view::<T>(sv, lv, "v")?,
                                );
                                let (os, gs) =
                                    (view::<T>(so, lo, "o")?, view::<T>(sg, lg, "grad")?);
                                let shape = self.shape(dims);
                                // SAFETY (allocations): each kernel below writes all of its output.
                                let dq = unsafe { dev.alloc::<T>(n * h * l * d)? };
                                let delta = unsafe { dev.alloc::<f32>(n * h * l)? };
                                let dk = unsafe { dev.alloc::<T>(n * kv * s * d)? };
                                let dv = unsafe { dev.alloc::<T>(n * kv * s * d)? };
                                // bf16 and f16 take the tensor-core kernels; f32 the
                                // CUDA-core ones.
                                let (dq_name, dq_dims, dkv_name, dkv_dims) = if dt == DType::F32 {
                                    (
                                        "flash_bwd_dq",
                                        launch_dims::flash_bwd_dq(n, h, l),
                                        "flash_bwd_dkv",
                                        launch_dims::flash_bwd_dkv(n, kv, s),
                                    )
                                } else {
                                    (
                                        "flash_bwd_dq_tc",
                                        launch_dims::flash_bwd_dq_tc(n, h, l),
                                        "flash_bwd_dkv_tc",
                                        launch_dims::flash_bwd_dkv_tc(n, kv, s),
                                    )
                                };
                                self.with_pad::<T, ()>(&qs, n, s, |pad| {
                                    let f = dev.get_or_load_custom_func(
                                        &kernel(dq_name, dt)?,
                                        MODULE,
                                        ptx(),
                                    )?;
                                    // Launch: reads q, k, v, o, grad, stats (and pad), first_key;
                                    // writes all of dq and delta.
                                    atomrl_core::launch_kernel!(
                                        f,
                                        launch_config(dq_dims),
                                        &qs,
                                        &ks,
                                        &vs,
                                        &os,
                                        &gs,
                                        &saved.stats,
                                        pad,
                                        &saved.first_key,
                                        &dq,
                                        &delta,
                                        &shape
                                    )?;
                                    let f = dev.get_or_load_custom_func(
                                        &kernel(dkv_name, dt)?,
                                        MODULE,
                                        ptx(),
                                    )?;
                                    // Launch (after the one above, on the same stream): reads q, k,
                                    // v, grad, stats, delta (and pad), first_key; writes all of
                                    // dk and dv.
                                    atomrl_core::launch_kernel!(
                                        f,
                                        launch_config(dkv_dims),
                                        &qs,
                                        &ks,
                                        &vs,
                                        &gs,
                                        &saved.stats,
                                        &delta,
                                        pad,
                                        &saved.first_key,
                                        &dk,
                                        &dv,
                                        &shape
                                    )?;
                                    Ok(())
                                })?;
                                Ok((
                                    tensor(dq, dev, q.shape().clone()),
                                    tensor(dk, dev, k.shape().clone()),
                                    tensor(dv, dev, v.shape().clone()),
                                ))
                            })
                        })
                    })
                })
            })
        }
    }

    fn ptx() -> &'static str {
        atomrl_core::cuda::ATTENTION_PTX
    }

    impl CustomOp3 for FlashAttention {
        fn name(&self) -> &'static str {
            "atomrl-flash-attention"
        }

        fn cpu_fwd(
            &self,
            _: &CpuStorage,
            _: &Layout,
            _: &CpuStorage,
            _: &Layout,
            _: &CpuStorage,
            _: &Layout,
        ) -> Result<(CpuStorage, Shape)> {
            candle_core::bail!("atomrl-flash-attention: CUDA tensors only")
        }

        fn cuda_fwd(
            &self,
            sq: &CudaStorage,
            lq: &Layout,
            sk: &CudaStorage,
            lk: &Layout,
            sv: &CudaStorage,
            lv: &Layout,
        ) -> Result<(CudaStorage, Shape)> {
            match sq.dtype() {
                DType::F32 => self.forward::<f32>((sq, lq), (sk, lk), (sv, lv)),
                DType::BF16 => self.forward::<half::bf16>((sq, lq), (sk, lk), (sv, lv)),
                DType::F16 => self.forward::<half::f16>((sq, lq), (sk, lk), (sv, lv)),
                dt => candle_core::bail!("atomrl-flash-attention: unsupported dtype {dt:?}"),
            }
        }

        fn bwd(
            &self,
            q: &Tensor,
            k: &Tensor,
            v: &Tensor,
            res: &Tensor,
            grad: &Tensor,
        ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
            let grad = grad.to_dtype(q.dtype())?;
            let (dq, dk, dv) = match q.dtype() {
                DType::F32 => self.backward::<f32>(q, k, v, res, &grad)?,
                DType::BF16 => self.backward::<half::bf16>(q, k, v, res, &grad)?,
                DType::F16 => self.backward::<half::f16>(q, k, v, res, &grad)?,
                dt => candle_core::bail!("atomrl-flash-attention: unsupported dtype {dt:?}"),
            };
            Ok((Some(dq), Some(dk), Some(dv)))
        }
    }
}
