//! The kernels' C signatures (`extern "C" __global__` in `../atomrl-core/cuda/*.cu`), element
//! pointers type-erased so that one table per dtype serves every generic kernel.
#![allow(unsafe_code, missing_docs)]

use std::ffi::c_void;

type In = *const c_void;
type Out = *mut c_void;

/// The dtype-generic kernels of model.cu, logprob.cu and decode.cu for one element type.
#[derive(Clone, Copy)]
pub(crate) struct Kernels {
    pub rms_norm_fwd: unsafe extern "C" fn(In, In, Out, i32, f32, i32),
    pub add_rms_norm_fwd: unsafe extern "C" fn(In, In, In, Out, Out, i32, f32),
    pub swiglu_packed_fwd: unsafe extern "C" fn(In, Out, i32, usize),
    pub rms_norm_inv: unsafe extern "C" fn(In, *mut f32, i32, f32),
    pub rms_norm_dx: unsafe extern "C" fn(In, In, In, *const f32, Out, i32),
    pub rms_norm_dw_part: unsafe extern "C" fn(In, In, *const f32, *mut f32, i32, i32, i32),
    pub swiglu_fwd: unsafe extern "C" fn(In, In, Out, usize),
    pub swiglu_bwd: unsafe extern "C" fn(In, In, In, Out, usize),
    pub rope: unsafe extern "C" fn(In, In, In, Out, i32, i32, i32, usize, i32, i32, i32),
    pub attn_softmax_fwd: unsafe extern "C" fn(In, In, Out, i32, i32, i32, i32, i32, f32, f32, i32),
    pub attn_softmax_bwd: unsafe extern "C" fn(In, In, Out, i32, f32),
    pub selective_fwd: unsafe extern "C" fn(In, *const u32, *mut f32, *mut f32, i32, f32, i32),
    pub selective_bwd: unsafe extern "C" fn(In, *const u32, *const f32, Out, i32, f32, i32),
    pub decode_bias: unsafe extern "C" fn(*const u32, *const u32, Out, i32, i32, f32),
    #[allow(clippy::type_complexity)]
    pub decode_qkv: unsafe extern "C" fn(
        In,
        In,
        In,
        In,
        In,
        In,
        i32,
        In,
        In,
        *const u32,
        Out,
        Out,
        Out,
        i32,
        i32,
        i32,
        i32,
        i32,
        i32,
        i32,
    ),
    pub pick_part:
        unsafe extern "C" fn(In, i32, u32, u32, *const u32, u32, f32, i32, i32, *mut PickState),
    pub pick_finish: unsafe extern "C" fn(In, *const PickState, i32, i32, f32, i32, *mut u32),
    pub flash_first_key: unsafe extern "C" fn(In, *mut i32, i32, i32),
    pub flash_fwd: FlashFwd,
    pub flash_bwd_dq: FlashBwdDq,
    pub flash_bwd_dkv: FlashBwdDkv,
    /// The tensor-core FlashAttention kernels (`atomrl_flash_*_tc_*`): the 16-bit dtypes only.
    pub flash_tc: Option<FlashTc>,
}

/// attention.cu's `FlashShape`: the scalar arguments of every FlashAttention kernel.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct FlashShape {
    /// Query heads.
    pub heads: i32,
    /// Key/value heads.
    pub kv_heads: i32,
    /// Queries per row.
    pub l: i32,
    /// Keys per row.
    pub s: i32,
    /// Head dim.
    pub d: i32,
    /// Cached positions before the queries.
    pub past: i32,
    /// 1 when keys after `past + i` are masked for query `i`.
    pub causal: i32,
    /// The scores' scale.
    pub scale: f32,
    /// The value added to masked scores.
    pub mask_value: f32,
    /// 1 when the key-padding bias is read.
    pub has_pad: i32,
}

/// decode.cu's `PickState`: a block's best Gumbel score and its index, and its log-sum-exp as
/// (max, sum).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct PickState {
    /// The best score.
    pub best: f32,
    /// Its column.
    pub idx: i32,
    /// The running maximum of the scaled logits.
    pub m: f32,
    /// Σ e^(x − m).
    pub s: f32,
}

/// The signature of `atomrl_flash_fwd_*` and `atomrl_flash_fwd_tc_*`.
pub(crate) type FlashFwd =
    unsafe extern "C" fn(In, In, In, In, *const i32, Out, *mut f32, FlashShape);

/// The signature of `atomrl_flash_bwd_dq_*` and `atomrl_flash_bwd_dq_tc_*`.
pub(crate) type FlashBwdDq =
    unsafe extern "C" fn(In, In, In, In, In, *const f32, In, *const i32, Out, *mut f32, FlashShape);

/// The signature of `atomrl_flash_bwd_dkv_*` and `atomrl_flash_bwd_dkv_tc_*`.
pub(crate) type FlashBwdDkv = unsafe extern "C" fn(
    In,
    In,
    In,
    In,
    *const f32,
    *const f32,
    In,
    *const i32,
    Out,
    Out,
    FlashShape,
);

/// attention.cu's tensor-core FlashAttention kernels for one 16-bit dtype.
#[derive(Clone, Copy)]
pub(crate) struct FlashTc {
    pub fwd: FlashFwd,
    pub bwd_dq: FlashBwdDq,
    pub bwd_dkv: FlashBwdDkv,
}

macro_rules! dtype_kernels {
    ($module:ident, $table:ident, $suffix:literal, $tc:expr) => {
        mod $module {
            use super::{FlashShape, In, Out, PickState};
            extern "C" {
                #[link_name = concat!("atomrl_rms_norm_fwd_", $suffix)]
                pub fn rms_norm_fwd(x: In, w: In, y: Out, h: i32, eps: f32, round_xhat: i32);
                #[link_name = concat!("atomrl_add_rms_norm_fwd_", $suffix)]
                pub fn add_rms_norm_fwd(x: In, r: In, w: In, s: Out, y: Out, h: i32, eps: f32);
                #[link_name = concat!("atomrl_swiglu_packed_fwd_", $suffix)]
                pub fn swiglu_packed_fwd(gu: In, y: Out, inter: i32, n: usize);
                #[link_name = concat!("atomrl_rms_norm_inv_", $suffix)]
                pub fn rms_norm_inv(x: In, inv: *mut f32, h: i32, eps: f32);
                #[link_name = concat!("atomrl_rms_norm_dx_", $suffix)]
                pub fn rms_norm_dx(x: In, w: In, g: In, inv: *const f32, dx: Out, h: i32);
                #[link_name = concat!("atomrl_rms_norm_dw_part_", $suffix)]
                pub fn rms_norm_dw_part(
                    x: In,
                    g: In,
                    inv: *const f32,
                    part: *mut f32,
                    rows: i32,
                    h: i32,
                    chunk: i32,
                );
                #[link_name = concat!("atomrl_swiglu_fwd_", $suffix)]
                pub fn swiglu_fwd(gate: In, up: In, y: Out, n: usize);
                #[link_name = concat!("atomrl_swiglu_bwd_", $suffix)]
                pub fn swiglu_bwd(gate: In, up: In, grad: In, out: Out, n: usize);
                #[link_name = concat!("atomrl_rope_", $suffix)]
                pub fn rope(
                    x: In,
                    cos: In,
                    sin: In,
                    y: Out,
                    heads: i32,
                    l: i32,
                    d: i32,
                    rows: usize,
                    back: i32,
                    x_tm: i32,
                    y_tm: i32,
                );
                #[link_name = concat!("atomrl_attn_softmax_fwd_", $suffix)]
                pub fn attn_softmax_fwd(
                    scores: In,
                    pad: In,
                    p: Out,
                    heads: i32,
                    l: i32,
                    s: i32,
                    past: i32,
                    causal: i32,
                    scale: f32,
                    mask_value: f32,
                    has_pad: i32,
                );
                #[link_name = concat!("atomrl_attn_softmax_bwd_", $suffix)]
                pub fn attn_softmax_bwd(p: In, g: In, dx: Out, s: i32, scale: f32);
                #[link_name = concat!("atomrl_selective_log_softmax_fwd_", $suffix)]
                pub fn selective_fwd(
                    logits: In,
                    tokens: *const u32,
                    lp: *mut f32,
                    ent: *mut f32,
                    v: i32,
                    inv_t: f32,
                    with_entropy: i32,
                );
                #[link_name = concat!("atomrl_selective_log_softmax_bwd_", $suffix)]
                pub fn selective_bwd(
                    logits: In,
                    tokens: *const u32,
                    g: *const f32,
                    dx: Out,
                    v: i32,
                    inv_t: f32,
                    with_entropy: i32,
                );
                #[link_name = concat!("atomrl_decode_bias_", $suffix)]
                pub fn decode_bias(
                    starts: *const u32,
                    step: *const u32,
                    bias: Out,
                    rows: i32,
                    cap: i32,
                    mask_value: f32,
                );
                #[link_name = concat!("atomrl_decode_qkv_", $suffix)]
                pub fn decode_qkv(
                    q: In,
                    k: In,
                    v: In,
                    qb: In,
                    kb: In,
                    vb: In,
                    has_bias: i32,
                    cos: In,
                    sin: In,
                    step: *const u32,
                    q_out: Out,
                    k_cache: Out,
                    v_cache: Out,
                    rows: i32,
                    heads: i32,
                    kv_heads: i32,
                    d: i32,
                    cap: i32,
                    ld_q: i32,
                    ld_kv: i32,
                );
                #[link_name = concat!("atomrl_pick_part_", $suffix)]
                pub fn pick_part(
                    logits: In,
                    has_noise: i32,
                    seed_lo: u32,
                    seed_hi: u32,
                    row_ids: *const u32,
                    step: u32,
                    inv_t: f32,
                    v: i32,
                    span: i32,
                    parts: *mut PickState,
                );
                #[link_name = concat!("atomrl_pick_finish_", $suffix)]
                pub fn pick_finish(
                    logits: In,
                    parts: *const PickState,
                    rows: i32,
                    chunks: i32,
                    inv_t: f32,
                    v: i32,
                    out: *mut u32,
                );
                #[link_name = concat!("atomrl_flash_first_key_", $suffix)]
                pub fn flash_first_key(pad: In, first_key: *mut i32, s: i32, has_pad: i32);
                #[link_name = concat!("atomrl_flash_fwd_", $suffix)]
                pub fn flash_fwd(
                    q: In,
                    k: In,
                    v: In,
                    pad: In,
                    first_key: *const i32,
                    o: Out,
                    stats: *mut f32,
                    f: FlashShape,
                );
                #[link_name = concat!("atomrl_flash_bwd_dq_", $suffix)]
                pub fn flash_bwd_dq(
                    q: In,
                    k: In,
                    v: In,
                    o: In,
                    dout: In,
                    stats: *const f32,
                    pad: In,
                    first_key: *const i32,
                    dq: Out,
                    delta: *mut f32,
                    f: FlashShape,
                );
                #[link_name = concat!("atomrl_flash_bwd_dkv_", $suffix)]
                pub fn flash_bwd_dkv(
                    q: In,
                    k: In,
                    v: In,
                    dout: In,
                    stats: *const f32,
                    delta: *const f32,
                    pad: In,
                    first_key: *const i32,
                    dk: Out,
                    dv: Out,
                    f: FlashShape,
                );
            }
        }

        pub(crate) const $table: Kernels = Kernels {
            rms_norm_fwd: $module::rms_norm_fwd,
            add_rms_norm_fwd: $module::add_rms_norm_fwd,
            swiglu_packed_fwd: $module::swiglu_packed_fwd,
            rms_norm_inv: $module::rms_norm_inv,
            rms_norm_dx: $module::rms_norm_dx,
            rms_norm_dw_part: $module::rms_norm_dw_part,
            swiglu_fwd: $module::swiglu_fwd,
            swiglu_bwd: $module::swiglu_bwd,
            rope: $module::rope,
            attn_softmax_fwd: $module::attn_softmax_fwd,
            attn_softmax_bwd: $module::attn_softmax_bwd,
            selective_fwd: $module::selective_fwd,
            selective_bwd: $module::selective_bwd,
            decode_bias: $module::decode_bias,
            decode_qkv: $module::decode_qkv,
            pick_part: $module::pick_part,
            pick_finish: $module::pick_finish,
            flash_first_key: $module::flash_first_key,
            flash_fwd: $module::flash_fwd,
            flash_bwd_dq: $module::flash_bwd_dq,
            flash_bwd_dkv: $module::flash_bwd_dkv,
            flash_tc: $tc,
        };
    };
}

dtype_kernels!(f32_kernels, F32, "f32", None);
dtype_kernels!(
    bf16_kernels,
    BF16,
    "bf16",
    Some(FlashTc {
        fwd: atomrl_flash_fwd_tc_bf16,
        bwd_dq: atomrl_flash_bwd_dq_tc_bf16,
        bwd_dkv: atomrl_flash_bwd_dkv_tc_bf16,
    })
);
dtype_kernels!(
    f16_kernels,
    F16,
    "f16",
    Some(FlashTc {
        fwd: atomrl_flash_fwd_tc_f16,
        bwd_dq: atomrl_flash_bwd_dq_tc_f16,
        bwd_dkv: atomrl_flash_bwd_dkv_tc_f16,
    })
);

// attention.cu's tensor-core kernels, for the 16-bit dtypes.
extern "C" {
    fn atomrl_flash_fwd_tc_bf16(
        q: In,
        k: In,
        v: In,
        pad: In,
        first_key: *const i32,
        o: Out,
        stats: *mut f32,
        f: FlashShape,
    );
    fn atomrl_flash_bwd_dq_tc_bf16(
        q: In,
        k: In,
        v: In,
        o: In,
        dout: In,
        stats: *const f32,
        pad: In,
        first_key: *const i32,
        dq: Out,
        delta: *mut f32,
        f: FlashShape,
    );
    fn atomrl_flash_bwd_dkv_tc_bf16(
        q: In,
        k: In,
        v: In,
        dout: In,
        stats: *const f32,
        delta: *const f32,
        pad: In,
        first_key: *const i32,
        dk: Out,
        dv: Out,
        f: FlashShape,
    );
    fn atomrl_flash_fwd_tc_f16(
        q: In,
        k: In,
        v: In,
        pad: In,
        first_key: *const i32,
        o: Out,
        stats: *mut f32,
        f: FlashShape,
    );
    fn atomrl_flash_bwd_dq_tc_f16(
        q: In,
        k: In,
        v: In,
        o: In,
        dout: In,
        stats: *const f32,
        pad: In,
        first_key: *const i32,
        dq: Out,
        delta: *mut f32,
        f: FlashShape,
    );
    fn atomrl_flash_bwd_dkv_tc_f16(
        q: In,
        k: In,
        v: In,
        dout: In,
        stats: *const f32,
        delta: *const f32,
        pad: In,
        first_key: *const i32,
        dk: Out,
        dv: Out,
        f: FlashShape,
    );
}

// optim.cu: f32 only.
extern "C" {
    pub(crate) fn atomrl_add_assign_f32(a: *mut f32, b: *const f32, n: usize);
    pub(crate) fn atomrl_scale_f32(a: *mut f32, s: f32, n: usize);
    pub(crate) fn atomrl_sq_norm_part_f32(a: *const f32, part: *mut f32, n: usize);
    pub(crate) fn atomrl_adamw_multi_f32(table: *const MultiTensorEntry, count: i32, s: AdamWArgs);
    pub(crate) fn atomrl_add_multi_f32(table: *const MultiTensorEntry, count: i32);
    pub(crate) fn atomrl_sq_norm_multi_f32(
        table: *const MultiTensorEntry,
        count: i32,
        part: *mut f32,
    );
}

/// optim.cu's `MultiTensorEntry`: one tensor of a multi-tensor launch, its buffers as
/// addresses.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct MultiTensorEntry {
    pub buf: [u64; 4],
    pub n: u64,
    pub first_block: u64,
    pub blocks: u64,
}

/// optim.cu's `AdamWArgs`: the scalars of one AdamW step.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct AdamWArgs {
    pub grad_scale: f32,
    pub has_scale: i32,
    pub beta1: f32,
    pub one_minus_beta1: f32,
    pub beta2: f32,
    pub one_minus_beta2: f32,
    pub inv1: f32,
    pub inv2: f32,
    pub eps: f32,
    pub lr: f32,
    pub decay: f32,
    pub has_decay: i32,
}
