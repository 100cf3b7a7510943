//! Safe calls of each kernel: the slices' lengths are checked against what the kernel reads
//! and writes under the given [`Launch`], then the kernel runs on the CPU. Shapes are those of
//! the `.cu` files' comments; each function names its kernel.
#![allow(unsafe_code, clippy::too_many_arguments)]

use crate::ffi::{self, FlashShape, PickState};
use crate::launch::{launch, Launch, Ptr};
use crate::Elem;

fn check(what: &str, len: usize, want: usize) {
    assert!(len == want, "{what}: expected {want} elements, got {len}");
}

/// The row kernels reduce over the block with `block_sum`/`block_max` (common.cuh): whole warps.
fn check_row_block(l: Launch) {
    assert!(
        l.block.0 % 32 == 0 && l.block.1 == 1 && l.block.2 == 1,
        "a row kernel's block must be a multiple of 32 threads along x, got {:?}",
        l.block
    );
}

fn i32_of(what: &str, v: usize) -> i32 {
    i32::try_from(v).unwrap_or_else(|_| panic!("{what} = {v} does not fit the kernel's int"))
}

// ---- optim.cu (f32)

/// `atomrl_add_assign_f32`: `a += b` elementwise.
pub fn add_assign_f32(l: Launch, a: &mut [f32], b: &[f32]) {
    check("b", b.len(), a.len());
    let (pa, pb, n) = (Ptr::of_mut(a), Ptr::of(b), a.len());
    // SAFETY: `a` and `b` hold `n` elements each (checked); the kernel touches `0..n`.
    launch(l, &|| unsafe {
        ffi::atomrl_add_assign_f32(pa.get_mut(), pb.get(), n)
    });
}

/// `atomrl_scale_f32`: `a = a · s + 0` elementwise.
pub fn scale_f32(l: Launch, a: &mut [f32], s: f32) {
    let (pa, n) = (Ptr::of_mut(a), a.len());
    // SAFETY: the kernel touches `a[0..n]`.
    launch(l, &|| unsafe { ffi::atomrl_scale_f32(pa.get_mut(), s, n) });
}

/// The scalars of one AdamW update (`atomrl-optim`'s `UpdateScalars`).
#[derive(Debug, Clone, Copy)]
pub struct AdamWScalars {
    /// The gradient's factor (clipping, averaging), when there is one.
    pub grad_scale: Option<f32>,
    /// β₁.
    pub beta1: f32,
    /// 1 − β₁.
    pub one_minus_beta1: f32,
    /// β₂.
    pub beta2: f32,
    /// 1 − β₂.
    pub one_minus_beta2: f32,
    /// 1 / (1 − β₁ᵗ).
    pub inv1: f32,
    /// 1 / (1 − β₂ᵗ).
    pub inv2: f32,
    /// ε.
    pub eps: f32,
    /// The learning rate.
    pub lr: f32,
    /// The decoupled weight decay's factor `1 − lr · λ`, when there is decay.
    pub decay: Option<f32>,
}

/// `atomrl_sq_norm_part_f32`: `part[b]` = Σ a² over the elements block `b` strides over; one
/// partial sum per block of the grid.
pub fn sq_norm_part_f32(l: Launch, a: &[f32], part: &mut [f32]) {
    check_row_block(l);
    check("part (one per block)", part.len(), l.grid.0 as usize);
    let (pa, pp, n) = (Ptr::of(a), Ptr::of_mut(part), a.len());
    // SAFETY: reads `a[0..n]`, writes `part[blockIdx.x]` for each of the grid's blocks.
    launch(l, &|| unsafe {
        ffi::atomrl_sq_norm_part_f32(pa.get(), pp.get_mut(), n)
    });
}

/// One parameter of [`adamw_multi_f32`]: its values, both moments and its gradient, of one
/// length.
#[derive(Debug)]
pub struct AdamWTensors<'a> {
    /// The parameter.
    pub theta: &'a mut [f32],
    /// The first moment.
    pub m: &'a mut [f32],
    /// The second moment.
    pub v: &'a mut [f32],
    /// The gradient.
    pub g: &'a [f32],
}

impl AdamWScalars {
    fn args(&self) -> ffi::AdamWArgs {
        ffi::AdamWArgs {
            grad_scale: self.grad_scale.unwrap_or(1.0),
            has_scale: i32::from(self.grad_scale.is_some()),
            beta1: self.beta1,
            one_minus_beta1: self.one_minus_beta1,
            beta2: self.beta2,
            one_minus_beta2: self.one_minus_beta2,
            inv1: self.inv1,
            inv2: self.inv2,
            eps: self.eps,
            lr: self.lr,
            decay: self.decay.unwrap_or(1.0),
            has_decay: i32::from(self.decay.is_some()),
        }
    }
}

/// The table of a multi-tensor launch: tensor `i` owns `blocks[i]` consecutive blocks of the
/// grid, which must be their sum.
fn multi_tensor_table(
    l: Launch,
    blocks: &[usize],
    tensors: impl Iterator<Item = ([u64; 4], usize)>,
) -> Vec<ffi::MultiTensorEntry> {
    assert!(
        l.grid.1 == 1 && l.grid.2 == 1,
        "a multi-tensor grid is one-dimensional, got {:?}",
        l.grid
    );
    let total: usize = blocks.iter().sum();
    check("grid (Σ blocks)", l.grid.0 as usize, total);
    let mut first = 0;
    let table: Vec<_> = tensors
        .zip(blocks)
        .map(|((buf, n), &b)| {
            assert!(b > 0, "every tensor of a multi-tensor launch needs a block");
            let e = ffi::MultiTensorEntry {
                buf,
                n: n as u64,
                first_block: first as u64,
                blocks: b as u64,
            };
            first += b;
            e
        })
        .collect();
    check("blocks (one per tensor)", blocks.len(), table.len());
    assert!(!table.is_empty(), "a multi-tensor launch needs a tensor");
    table
}

/// `atomrl_adamw_multi_f32`: AdamW's update of every parameter of `tensors` in place (`theta`,
/// `m` and `v` from `g`) in one launch, parameter `i` over `blocks[i]` blocks of the grid
/// (whose size is their sum).
pub fn adamw_multi_f32(
    l: Launch,
    blocks: &[usize],
    tensors: &mut [AdamWTensors<'_>],
    s: &AdamWScalars,
) {
    for (i, t) in tensors.iter().enumerate() {
        let n = t.theta.len();
        check(&format!("m of tensor {i}"), t.m.len(), n);
        check(&format!("v of tensor {i}"), t.v.len(), n);
        check(&format!("g of tensor {i}"), t.g.len(), n);
    }
    let addr = |p: *const f32| p as usize as u64;
    let table = multi_tensor_table(
        l,
        blocks,
        tensors.iter_mut().map(|t| {
            (
                [
                    addr(t.theta.as_mut_ptr()),
                    addr(t.m.as_mut_ptr()),
                    addr(t.v.as_mut_ptr()),
                    addr(t.g.as_ptr()),
                ],
                t.theta.len(),
            )
        }),
    );
    let (pt, count, args) = (Ptr::of(&table), i32_of("tensors", table.len()), s.args());
    // SAFETY: each entry names four distinct buffers of its `n` elements (checked), which the
    // entry's blocks alone touch; the table outlives the launch.
    launch(l, &|| unsafe {
        ffi::atomrl_adamw_multi_f32(pt.get(), count, args)
    });
}

/// One sum of [`add_multi_f32`]: `out = a + b`, or `out += b` without `a`.
#[derive(Debug)]
pub struct AddTensors<'a> {
    /// The sum.
    pub out: &'a mut [f32],
    /// The first term when it is not `out` itself.
    pub a: Option<&'a [f32]>,
    /// The second term.
    pub b: &'a [f32],
}

/// `atomrl_add_multi_f32`: every sum of `sums` in one launch, sum `i` over `blocks[i]` blocks.
pub fn add_multi_f32(l: Launch, blocks: &[usize], sums: &mut [AddTensors<'_>]) {
    for (i, s) in sums.iter().enumerate() {
        check(&format!("b of sum {i}"), s.b.len(), s.out.len());
        if let Some(a) = s.a {
            check(&format!("a of sum {i}"), a.len(), s.out.len());
        }
    }
    let table = multi_tensor_table(
        l,
        blocks,
        sums.iter_mut().map(|s| {
            let out = s.out.as_mut_ptr() as usize as u64;
            let a = s.a.map_or(out, |a| a.as_ptr() as usize as u64);
            ([out, a, s.b.as_ptr() as usize as u64, 0], s.out.len())
        }),
    );
    let (pt, count) = (Ptr::of(&table), i32_of("tensors", table.len()));
    // SAFETY: each entry names buffers of its `n` elements (checked), `out` distinct from `b`
    // and from `a` unless it is `a`, touched by the entry's blocks alone; the table outlives
    // the launch.
    launch(l, &|| unsafe { ffi::atomrl_add_multi_f32(pt.get(), count) });
}

/// `atomrl_sq_norm_multi_f32`: [`sq_norm_part_f32`] on every tensor of `tensors` in one launch,
/// tensor `i` over `blocks[i]` blocks; `part` gets one partial sum per block of the grid.
pub fn sq_norm_multi_f32(l: Launch, blocks: &[usize], tensors: &[&[f32]], part: &mut [f32]) {
    check_row_block(l);
    check("part (one per block)", part.len(), l.grid.0 as usize);
    let table = multi_tensor_table(
        l,
        blocks,
        tensors
            .iter()
            .map(|t| ([t.as_ptr() as usize as u64, 0, 0, 0], t.len())),
    );
    let (pt, count, pp) = (
        Ptr::of(&table),
        i32_of("tensors", table.len()),
        Ptr::of_mut(part),
    );
    // SAFETY: the entries' buffers hold their `n` elements; one partial per block is written.
    launch(l, &|| unsafe {
        ffi::atomrl_sq_norm_multi_f32(pt.get(), count, pp.get_mut())
    });
}

// ---- model.cu

/// `atomrl_rms_norm_fwd_*`: `y = w · round(x / rms(x))` per row of `h` (one block per row:
/// `l.grid.0` rows); `round_xhat = false` rounds once, as the generation view does.
pub fn rms_norm_fwd<T: Elem>(l: Launch, x: &[T], w: &[T], y: &mut [T], eps: f32, round_xhat: bool) {
    check_row_block(l);
    let h = w.len();
    check("x (rows × h)", x.len(), l.grid.0 as usize * h);
    check("y", y.len(), x.len());
    let (px, pw, py, hi) = (Ptr::of(x), Ptr::of(w), Ptr::of_mut(y), i32_of("h", h));
    // SAFETY: one block per row reads `x` and `w`, writes `y` (lengths checked).
    launch(l, &|| unsafe {
        (T::KERNELS.rms_norm_fwd)(
            px.get(),
            pw.get(),
            py.get_mut(),
            hi,
            eps,
            i32::from(round_xhat),
        )
    });
}

/// `atomrl_add_rms_norm_fwd_*`: `s = round(x + r)`, `y = round(w · s / rms(s))` per row.
pub fn add_rms_norm_fwd<T: Elem>(
    l: Launch,
    x: &[T],
    r: &[T],
    w: &[T],
    s: &mut [T],
    y: &mut [T],
    eps: f32,
) {
    check_row_block(l);
    let h = w.len();
    check("x (rows × h)", x.len(), l.grid.0 as usize * h);
    for (what, len) in [("r", r.len()), ("s", s.len()), ("y", y.len())] {
        check(what, len, x.len());
    }
    let (px, pr, pw) = (Ptr::of(x), Ptr::of(r), Ptr::of(w));
    let (ps, py, hi) = (Ptr::of_mut(s), Ptr::of_mut(y), i32_of("h", h));
    // SAFETY: one block per row; lengths checked.
    launch(l, &|| unsafe {
        (T::KERNELS.add_rms_norm_fwd)(
            px.get(),
            pr.get(),
            pw.get(),
            ps.get_mut(),
            py.get_mut(),
            hi,
            eps,
        )
    });
}

/// `atomrl_rms_norm_inv_*`: `inv[r] = 1 / rms(x_r)` (f32), one block per row.
pub fn rms_norm_inv<T: Elem>(l: Launch, x: &[T], inv: &mut [f32], h: usize, eps: f32) {
    check_row_block(l);
    check("inv (one per row)", inv.len(), l.grid.0 as usize);
    check("x (rows × h)", x.len(), inv.len() * h);
    let (px, pi, hi) = (Ptr::of(x), Ptr::of_mut(inv), i32_of("h", h));
    // SAFETY: one block per row; lengths checked.
    launch(l, &|| unsafe {
        (T::KERNELS.rms_norm_inv)(px.get(), pi.get_mut(), hi, eps)
    });
}

/// `atomrl_rms_norm_dx_*`: the input's gradient from `g`, with `inv` from [`rms_norm_inv`].
pub fn rms_norm_dx<T: Elem>(l: Launch, x: &[T], w: &[T], g: &[T], inv: &[f32], dx: &mut [T]) {
    check_row_block(l);
    let h = w.len();
    check("inv (one per row)", inv.len(), l.grid.0 as usize);
    check("x (rows × h)", x.len(), inv.len() * h);
    check("g", g.len(), x.len());
    check("dx", dx.len(), x.len());
    let (px, pw, pg, pi, pd) = (
        Ptr::of(x),
        Ptr::of(w),
        Ptr::of(g),
        Ptr::of(inv),
        Ptr::of_mut(dx),
    );
    let hi = i32_of("h", h);
    // SAFETY: one block per row; lengths checked.
    launch(l, &|| unsafe {
        (T::KERNELS.rms_norm_dx)(px.get(), pw.get(), pg.get(), pi.get(), pd.get_mut(), hi)
    });
}

/// `atomrl_rms_norm_dw_part_*`: `part [chunks, h]`, chunk `c` summing `g · x · inv` over its
/// `chunk` rows; grid `(⌈h / threads⌉, chunks)`.
pub fn rms_norm_dw_part<T: Elem>(
    l: Launch,
    x: &[T],
    g: &[T],
    inv: &[f32],
    part: &mut [f32],
    h: usize,
    chunk: usize,
) {
    let rows = inv.len();
    check("x (rows × h)", x.len(), rows * h);
    check("g", g.len(), x.len());
    check("part (chunks × h)", part.len(), l.grid.1 as usize * h);
    assert!(
        l.grid.1 as usize * chunk >= rows,
        "{} chunks of {chunk} rows miss some of {rows}",
        l.grid.1
    );
    let (px, pg, pi, pp) = (Ptr::of(x), Ptr::of(g), Ptr::of(inv), Ptr::of_mut(part));
    let (ri, hi, ci) = (i32_of("rows", rows), i32_of("h", h), i32_of("chunk", chunk));
    // SAFETY: threads past `h` return; rows past `rows` are not read; lengths checked.
    launch(l, &|| unsafe {
        (T::KERNELS.rms_norm_dw_part)(px.get(), pg.get(), pi.get(), pp.get_mut(), ri, hi, ci)
    });
}

/// `atomrl_swiglu_fwd_*`: `y = silu(gate) · up`.
pub fn swiglu_fwd<T: Elem>(l: Launch, gate: &[T], up: &[T], y: &mut [T]) {
    let n = gate.len();
    check("up", up.len(), n);
    check("y", y.len(), n);
    let (pg, pu, py) = (Ptr::of(gate), Ptr::of(up), Ptr::of_mut(y));
    // SAFETY: grid-stride over `n` elements of each (checked).
    launch(l, &|| unsafe {
        (T::KERNELS.swiglu_fwd)(pg.get(), pu.get(), py.get_mut(), n)
    });
}

/// `atomrl_swiglu_bwd_*`: `out = [dgate | dup]` (`2n`) from the output's gradient `grad`.
pub fn swiglu_bwd<T: Elem>(l: Launch, gate: &[T], up: &[T], grad: &[T], out: &mut [T]) {
    let n = gate.len();
    check("up", up.len(), n);
    check("grad", grad.len(), n);
    check("out (dgate | dup)", out.len(), 2 * n);
    let (pg, pu, pr, po) = (Ptr::of(gate), Ptr::of(up), Ptr::of(grad), Ptr::of_mut(out));
    // SAFETY: grid-stride over `n`; writes `out[i]` and `out[n + i]` (checked).
    launch(l, &|| unsafe {
        (T::KERNELS.swiglu_bwd)(pg.get(), pu.get(), pr.get(), po.get_mut(), n)
    });
}

/// `atomrl_swiglu_packed_fwd_*`: `y [R, I] = silu(gate) · up` of `gu [R, 2·I]` (gate | up).
pub fn swiglu_packed_fwd<T: Elem>(l: Launch, gu: &[T], y: &mut [T], inter: usize) {
    let n = y.len();
    check("gu (rows × 2·I)", gu.len(), 2 * n);
    assert!(
        inter > 0 && n % inter == 0,
        "y of {n} is not rows of {inter}"
    );
    let (pg, py, ii) = (Ptr::of(gu), Ptr::of_mut(y), i32_of("inter", inter));
    // SAFETY: grid-stride over `n` outputs, each reading its row of `gu` (checked).
    launch(l, &|| unsafe {
        (T::KERNELS.swiglu_packed_fwd)(pg.get(), py.get_mut(), ii, n)
    });
}

/// Where a RoPE operand lies in memory: `[N, H, L, d]` as such, or token-major (`[N, L, H, d]`
/// in memory, read or written as its `transpose(1, 2)`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeLayout {
    /// Row-major `[N, H, L, d]`.
    HeadMajor,
    /// Row-major `[N, L, H, d]`: the projections' own layout.
    TokenMajor,
}

impl RopeLayout {
    fn flag(self) -> i32 {
        i32::from(self == Self::TokenMajor)
    }
}

/// `atomrl_rope_*`: rotate-half RoPE of `x [N, H, L, d]` with tables `[N, 1, L, d]`, or its
/// backward (`back`); `layouts` says how `x` and `y` lie in memory.
#[allow(clippy::too_many_arguments)]
pub fn rope<T: Elem>(
    l: Launch,
    x: &[T],
    cos: &[T],
    sin: &[T],
    y: &mut [T],
    (heads, len, d): (usize, usize, usize),
    back: bool,
    (x_layout, y_layout): (RopeLayout, RopeLayout),
) {
    assert!(
        d % 2 == 0 && heads * len * d > 0,
        "RoPE needs an even d and a non-empty [H, L, d]"
    );
    check("x (N × H × L × d)", x.len() % (heads * len * d), 0);
    let n = x.len() / (heads * len * d);
    check("cos (N × L × d)", cos.len(), n * len * d);
    check("sin", sin.len(), cos.len());
    check("y", y.len(), x.len());
    let rows = x.len() / d;
    let (px, pc, ps, py) = (Ptr::of(x), Ptr::of(cos), Ptr::of(sin), Ptr::of_mut(y));
    let (hi, li, di) = (i32_of("heads", heads), i32_of("l", len), i32_of("d", d));
    let (xf, yf) = (x_layout.flag(), y_layout.flag());
    // SAFETY: grid-stride over `rows · d / 2` pairs; either layout addresses the same
    // `N · H · L · d` elements (lengths checked).
    launch(l, &|| unsafe {
        (T::KERNELS.rope)(
            px.get(),
            pc.get(),
            ps.get(),
            py.get_mut(),
            hi,
            li,
            di,
            rows,
            i32::from(back),
            xf,
            yf,
        )
    });
}

/// The mask of an attention softmax, as `KeyMask` describes it: causal from `past`, and a
/// key-padding bias `[N, S]` (0 or `mask_value`).
#[derive(Debug, Clone, Copy)]
pub struct SoftmaxMask<'a, T> {
    /// Keys after `past + i` are masked for query `i`.
    pub causal: bool,
    /// Cached positions before the queries.
    pub past: usize,
    /// The value added to masked scores.
    pub mask_value: f32,
    /// The key-padding bias `[N, S]`, when there is padding.
    pub pad: Option<&'a [T]>,
}

/// `atomrl_attn_softmax_fwd_*`: probabilities of `scale · scores + mask` over keys, scores
/// `[N, H, L, S]`, one block per row (`l.grid.0 = N·H·L`).
pub fn attn_softmax_fwd<T: Elem>(
    l: Launch,
    scores: &[T],
    p: &mut [T],
    (heads, len, s): (usize, usize, usize),
    scale: f32,
    mask: SoftmaxMask<'_, T>,
) {
    check_row_block(l);
    let rows = l.grid.0 as usize;
    check("scores (N·H·L × S)", scores.len(), rows * s);
    check("p", p.len(), scores.len());
    assert!(
        heads * len > 0 && rows % (heads * len) == 0,
        "rows {rows} are not N × {heads} × {len}"
    );
    let n = rows / (heads * len);
    if let Some(pad) = mask.pad {
        check("pad (N × S)", pad.len(), n * s);
    }
    let (ps, pp) = (Ptr::of(scores), Ptr::of_mut(p));
    let pad = mask.pad.map_or(ps, Ptr::of);
    let (hi, li, si) = (i32_of("heads", heads), i32_of("l", len), i32_of("s", s));
    let past = i32_of("past", mask.past);
    let (causal, has_pad) = (i32::from(mask.causal), i32::from(mask.pad.is_some()));
    // SAFETY: one block per row of `s` scores; the pad row of its batch entry (checked).
    launch(l, &|| unsafe {
        (T::KERNELS.attn_softmax_fwd)(
            ps.get(),
            pad.get(),
            pp.get_mut(),
            hi,
            li,
            si,
            past,
            causal,
            scale,
            mask.mask_value,
            has_pad,
        )
    });
}

/// `atomrl_attn_softmax_bwd_*`: `dx = scale · p · (g − Σ g·p)` per row of `s`.
pub fn attn_softmax_bwd<T: Elem>(l: Launch, p: &[T], g: &[T], dx: &mut [T], s: usize, scale: f32) {
    check_row_block(l);
    check("p (rows × S)", p.len(), l.grid.0 as usize * s);
    check("g", g.len(), p.len());
    check("dx", dx.len(), p.len());
    let (pp, pg, pd, si) = (Ptr::of(p), Ptr::of(g), Ptr::of_mut(dx), i32_of("s", s));
    // SAFETY: one block per row (checked).
    launch(l, &|| unsafe {
        (T::KERNELS.attn_softmax_bwd)(pp.get(), pg.get(), pd.get_mut(), si, scale)
    });
}

// ---- logprob.cu

fn check_tokens(tokens: &[u32], rows: usize, v: usize) {
    check("tokens (one per row)", tokens.len(), rows);
    if let Some(t) = tokens.iter().find(|&&t| t as usize >= v) {
        panic!("token {t} is outside the vocabulary of {v}");
    }
}

/// `atomrl_selective_log_softmax_fwd_*`: per row of `v` logits, the log-prob of its token in
/// softmax(x · inv_t) and, when `ent` is given, the entropy. One block per row.
pub fn selective_log_softmax_fwd<T: Elem>(
    l: Launch,
    logits: &[T],
    tokens: &[u32],
    lp: &mut [f32],
    ent: Option<&mut [f32]>,
    v: usize,
    inv_t: f32,
) {
    check_row_block(l);
    let rows = l.grid.0 as usize;
    check("logits (rows × V)", logits.len(), rows * v);
    check_tokens(tokens, rows, v);
    check("lp", lp.len(), rows);
    let with_entropy = ent.is_some();
    let pe = match ent {
        Some(e) => {
            check("ent", e.len(), rows);
            Ptr::of_mut(e)
        }
        // Not written without entropy.
        None => Ptr::of_mut(lp),
    };
    let (px, pt, pl, vi) = (
        Ptr::of(logits),
        Ptr::of(tokens),
        Ptr::of_mut(lp),
        i32_of("v", v),
    );
    // SAFETY: one block per row; lengths and tokens checked.
    launch(l, &|| unsafe {
        (T::KERNELS.selective_fwd)(
            px.get(),
            pt.get(),
            pl.get_mut(),
            pe.get_mut(),
            vi,
            inv_t,
            i32::from(with_entropy),
        )
    });
}

/// `atomrl_selective_log_softmax_bwd_*`: `dx [R, V]` from `g [R, 2]` (the log-prob's and the
/// entropy's gradients).
pub fn selective_log_softmax_bwd<T: Elem>(
    l: Launch,
    logits: &[T],
    tokens: &[u32],
    g: &[f32],
    dx: &mut [T],
    v: usize,
    inv_t: f32,
    with_entropy: bool,
) {
    check_row_block(l);
    let rows = l.grid.0 as usize;
    check("logits (rows × V)", logits.len(), rows * v);
    check_tokens(tokens, rows, v);
    check("g (rows × 2)", g.len(), 2 * rows);
    check("dx", dx.len(), logits.len());
    let (px, pt, pg, pd) = (
        Ptr::of(logits),
        Ptr::of(tokens),
        Ptr::of(g),
        Ptr::of_mut(dx),
    );
    let vi = i32_of("v", v);
    // SAFETY: one block per row; lengths and tokens checked.
    launch(l, &|| unsafe {
        (T::KERNELS.selective_bwd)(
            px.get(),
            pt.get(),
            pg.get(),
            pd.get_mut(),
            vi,
            inv_t,
            i32::from(with_entropy),
        )
    });
}

// ---- decode.cu

/// `atomrl_decode_bias_*`: the key bias `[B, cap]` of a decode step, `step` being its u32
/// block `[ids (B), positions (B), slot]`.
pub fn decode_bias<T: Elem>(
    l: Launch,
    starts: &[u32],
    step: &[u32],
    bias: &mut [T],
    cap: usize,
    mask_value: f32,
) {
    let rows = starts.len();
    check("step (2·B + 1)", step.len(), 2 * rows + 1);
    check("bias (B × cap)", bias.len(), rows * cap);
    let (ps, pt, pb) = (Ptr::of(starts), Ptr::of(step), Ptr::of_mut(bias));
    let (ri, ci) = (i32_of("rows", rows), i32_of("cap", cap));
    // SAFETY: grid-stride over `rows · cap` (checked).
    launch(l, &|| unsafe {
        (T::KERNELS.decode_bias)(ps.get(), pt.get(), pb.get_mut(), ri, ci, mask_value)
    });
}

/// The inputs of [`decode_qkv`]: the new token's projections with their row strides, the
/// biases, the RoPE tables `[P, d]` and the step block `[ids (B), positions (B), slot]`.
#[derive(Debug, Clone, Copy)]
pub struct QkvStep<'a, T> {
    /// Queries `[B, ld_q]`, the first `H·d` of each row used.
    pub q: &'a [T],
    /// Keys `[B, ld_kv]` (from their first element).
    pub k: &'a [T],
    /// Values `[B, ld_kv]`.
    pub v: &'a [T],
    /// The row strides of `q` and of `k`/`v`.
    pub ld: (usize, usize),
    /// The q, k and v biases (`H·d`, `KV·d`, `KV·d`), when the layer has them.
    pub bias: Option<(&'a [T], &'a [T], &'a [T])>,
    /// RoPE's cosines `[P, d]`.
    pub cos: &'a [T],
    /// RoPE's sines `[P, d]`.
    pub sin: &'a [T],
    /// The step's u32 block.
    pub step: &'a [u32],
    /// Query heads, key/value heads, head width and cache columns.
    pub dims: (usize, usize, usize, usize),
}

/// `atomrl_decode_qkv_*`: the rotated queries into `q_out [B, H, d]`, the rotated key and the
/// value into column `slot` of `k_cache`, `v_cache` `[B, KV, cap, d]`.
pub fn decode_qkv<T: Elem>(
    l: Launch,
    a: QkvStep<'_, T>,
    q_out: &mut [T],
    k_cache: &mut [T],
    v_cache: &mut [T],
) {
    let (heads, kv, d, cap) = a.dims;
    let rows = q_out.len() / (heads * d).max(1);
    check("q_out (B × H × d)", q_out.len(), rows * heads * d);
    check("step (2·B + 1)", a.step.len(), 2 * rows + 1);
    check(
        "k_cache (B × KV × cap × d)",
        k_cache.len(),
        rows * kv * cap * d,
    );
    check("v_cache", v_cache.len(), k_cache.len());
    let (ld_q, ld_kv) = a.ld;
    assert!(
        ld_q >= heads * d && ld_kv >= kv * d,
        "row strides {:?} too short",
        a.ld
    );
    let last = |ld: usize, width: usize| {
        if rows == 0 {
            0
        } else {
            (rows - 1) * ld + width
        }
    };
    assert!(
        a.q.len() >= last(ld_q, heads * d),
        "q too short for {rows} rows"
    );
    assert!(
        a.k.len() >= last(ld_kv, kv * d) && a.v.len() >= last(ld_kv, kv * d),
        "k or v too short"
    );
    assert!(
        (a.step[2 * rows] as usize) < cap,
        "slot {} outside {cap} columns",
        a.step[2 * rows]
    );
    let table_rows = a.cos.len() / d;
    check("sin", a.sin.len(), a.cos.len());
    if let Some(p) = a.step[rows..2 * rows]
        .iter()
        .find(|&&p| p as usize >= table_rows)
    {
        panic!("position {p} outside the {table_rows} rows of the RoPE tables");
    }
    let (qb, kb, vb) = match a.bias {
        Some((qb, kb, vb)) => {
            check("q bias", qb.len(), heads * d);
            check("k bias", kb.len(), kv * d);
            check("v bias", vb.len(), kv * d);
            (Ptr::of(qb), Ptr::of(kb), Ptr::of(vb))
        }
        // Not read without biases.
        None => (Ptr::of(a.q), Ptr::of(a.k), Ptr::of(a.v)),
    };
    let (pq, pk, pv) = (Ptr::of(a.q), Ptr::of(a.k), Ptr::of(a.v));
    let (pc, ps, pt) = (Ptr::of(a.cos), Ptr::of(a.sin), Ptr::of(a.step));
    let (po, pkc, pvc) = (
        Ptr::of_mut(q_out),
        Ptr::of_mut(k_cache),
        Ptr::of_mut(v_cache),
    );
    let has_bias = i32::from(a.bias.is_some());
    let ints = [rows, heads, kv, d, cap, ld_q, ld_kv].map(|x| i32_of("a decode_qkv size", x));
    // SAFETY: grid-stride over `rows · (H + 2·KV) · d / 2`; every index checked above.
    launch(l, &|| unsafe {
        (T::KERNELS.decode_qkv)(
            pq.get(),
            pk.get(),
            pv.get(),
            qb.get(),
            kb.get(),
            vb.get(),
            has_bias,
            pc.get(),
            ps.get(),
            pt.get(),
            po.get_mut(),
            pkc.get_mut(),
            pvc.get_mut(),
            ints[0],
            ints[1],
            ints[2],
            ints[3],
            ints[4],
            ints[5],
            ints[6],
        )
    });
}

/// The noise of a sampled draw: the seed, each row's index in its call, and the step.
#[derive(Debug, Clone, Copy)]
pub struct PickNoise<'a> {
    /// The sampling seed (Philox's key).
    pub seed: u64,
    /// Each row's index in the call.
    pub row_ids: &'a [u32],
    /// Tokens drawn before in the call.
    pub step: u32,
}

/// `atomrl_pick_part_*`: block `(c, b)` draws over columns `[c·span, (c + 1)·span)` of row `b`
/// of `logits [B, V]` (greedy without `noise`) into `parts [B, chunks]`; grid `(chunks, B)`.
pub fn pick_part<T: Elem>(
    l: Launch,
    logits: &[T],
    noise: Option<PickNoise<'_>>,
    inv_t: f32,
    v: usize,
    span: usize,
    parts: &mut [PickState],
) {
    let (chunks, rows) = (l.grid.0 as usize, l.grid.1 as usize);
    check("logits (B × V)", logits.len(), rows * v);
    check("parts (B × chunks)", parts.len(), rows * chunks);
    assert!(
        span % 4 == 0 && chunks * span >= v,
        "{chunks} chunks of {span} do not cover {v}"
    );
    assert!(
        l.block.0 <= 256 && l.block.0.is_power_of_two(),
        "PICK_THREADS is 256"
    );
    let (seed, ids, step) = match noise {
        Some(n) => {
            check("row_ids", n.row_ids.len(), rows);
            (n.seed, n.row_ids, n.step)
        }
        None => (0, &[][..], 0),
    };
    let (px, pi, pp) = (Ptr::of(logits), Ptr::of(ids), Ptr::of_mut(parts));
    let has_noise = i32::from(noise.is_some());
    let (vi, si) = (i32_of("v", v), i32_of("span", span));
    // SAFETY: block (c, b) reads row b's columns of its chunk and writes parts[b·chunks + c].
    launch(l, &|| unsafe {
        (T::KERNELS.pick_part)(
            px.get(),
            has_noise,
            seed as u32,
            (seed >> 32) as u32,
            pi.get(),
            step,
            inv_t,
            vi,
            si,
            pp.get_mut(),
        )
    });
}

/// `atomrl_pick_finish_*`: each row's token (`out[b]`) and the bits of its log-prob
/// (`out[B + b]`) from its `chunks` parts, merged in order.
pub fn pick_finish<T: Elem>(
    l: Launch,
    logits: &[T],
    parts: &[PickState],
    chunks: usize,
    inv_t: f32,
    v: usize,
    out: &mut [u32],
) {
    let rows = out.len() / 2;
    check("out (2·B)", out.len(), 2 * rows);
    check("logits (B × V)", logits.len(), rows * v);
    check("parts (B × chunks)", parts.len(), rows * chunks);
    let (px, pp, po) = (Ptr::of(logits), Ptr::of(parts), Ptr::of_mut(out));
    let (ri, ci, vi) = (
        i32_of("rows", rows),
        i32_of("chunks", chunks),
        i32_of("v", v),
    );
    // SAFETY: one thread per row (threads past `rows` return); lengths checked.
    launch(l, &|| unsafe {
        (T::KERNELS.pick_finish)(px.get(), pp.get(), ri, ci, inv_t, vi, po.get_mut())
    });
}

// ---- attention.cu

/// The shapes and mask of a FlashAttention launch (`attention.cu`): `q [n, heads, l, d]` and
/// `k, v [n, kv_heads, s, d]`, contiguous, with the attention softmax's mask.
#[derive(Debug, Clone, Copy)]
pub struct Flash<'a, T> {
    /// Batch rows.
    pub n: usize,
    /// Query heads, a multiple of `kv_heads`.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Queries per row.
    pub l: usize,
    /// Keys per row.
    pub s: usize,
    /// Head dim, at most `atomrl_core::launch_dims::FLASH_MAX_HEAD_DIM`.
    pub d: usize,
    /// The scores' scale.
    pub scale: f32,
    /// Causality and key padding (`pad [n, s]`).
    pub mask: SoftmaxMask<'a, T>,
}

impl<T: Elem> Flash<'_, T> {
    fn check(&self, q: &[T], k: &[T], v: &[T]) -> FlashShape {
        assert!(
            self.kv_heads > 0 && self.heads % self.kv_heads == 0,
            "heads {} are not a multiple of kv_heads {}",
            self.heads,
            self.kv_heads
        );
        assert!(
            (1..=FLASH_MAX_HEAD_DIM).contains(&self.d),
            "head dim {} is outside 1..={}",
            self.d,
            FLASH_MAX_HEAD_DIM
        );
        check(
            "q (N·H·L·d)",
            q.len(),
            self.n * self.heads * self.l * self.d,
        );
        check(
            "k (N·KV·S·d)",
            k.len(),
            self.n * self.kv_heads * self.s * self.d,
        );
        check("v", v.len(), k.len());
        if let Some(pad) = self.mask.pad {
            check("pad (N × S)", pad.len(), self.n * self.s);
        }
        FlashShape {
            heads: i32_of("heads", self.heads),
            kv_heads: i32_of("kv_heads", self.kv_heads),
            l: i32_of("l", self.l),
            s: i32_of("s", self.s),
            d: i32_of("d", self.d),
            past: i32_of("past", self.mask.past),
            causal: i32::from(self.mask.causal),
            scale: self.scale,
            mask_value: self.mask.mask_value,
            has_pad: i32::from(self.mask.pad.is_some()),
        }
    }

    fn pad_ptr(&self, fallback: &[T]) -> Ptr {
        self.mask.pad.map_or(Ptr::of(fallback), Ptr::of)
    }
}

/// `FA_MAX_D` of attention.cu (`atomrl_core::launch_dims::FLASH_MAX_HEAD_DIM`).
const FLASH_MAX_HEAD_DIM: usize = 128;

fn check_block(l: Launch, threads: u32, what: &str) {
    assert!(
        l.block == (threads, 1, 1),
        "{what}: a block of ({threads}, 1, 1) threads, got {:?}",
        l.block
    );
}

/// `atomrl_flash_first_key_*`: each batch row's first unpadded key (`s` when none; 0 without
/// padding). One warp per row.
pub fn flash_first_key<T: Elem>(l: Launch, pad: Option<&[T]>, first_key: &mut [i32], s: usize) {
    check_block(l, 32, "flash_first_key");
    let n = l.grid.0 as usize;
    check("first_key (N)", first_key.len(), n);
    let dummy = [0i32; 1];
    let pp = match pad {
        Some(p) => {
            check("pad (N × S)", p.len(), n * s);
            Ptr::of(p)
        }
        None => Ptr::of(&dummy),
    };
    let (pf, si, has) = (
        Ptr::of_mut(first_key),
        i32_of("s", s),
        i32::from(pad.is_some()),
    );
    // SAFETY: block b reads row b of pad (when has_pad) and writes first_key[b].
    launch(l, &|| unsafe {
        (T::KERNELS.flash_first_key)(pp.get(), pf.get_mut(), si, has)
    });
}

/// `atomrl_flash_fwd_*`: `o = softmax(scale · q·kᵀ + mask)·v` (`[N, H, L, d]`) and each row's max and
/// log-sum `stats [N, H, L, 2]`, with the launch of `launch_dims::flash_fwd`.
pub fn flash_fwd<T: Elem>(
    l: Launch,
    f: Flash<'_, T>,
    qkv: (&[T], &[T], &[T]),
    first_key: &[i32],
    o: &mut [T],
    stats: &mut [f32],
) {
    check_block(l, 16 * 32, "flash_fwd");
    flash_forward(l, f, qkv, first_key, (o, stats), T::KERNELS.flash_fwd);
}

/// Whether `T` has tensor-core FlashAttention kernels ([`flash_fwd_tc`], [`flash_bwd_dq_tc`],
/// [`flash_bwd_dkv_tc`]): bf16 and f16.
pub fn has_flash_tc<T: Elem>() -> bool {
    T::KERNELS.flash_tc.is_some()
}

/// `T`'s tensor-core FlashAttention kernels, or a panic naming `what`.
fn flash_tc<T: Elem>(what: &str) -> ffi::FlashTc {
    match T::KERNELS.flash_tc {
        Some(tc) => tc,
        None => panic!("{what}: no tensor-core kernel for this dtype (bf16 and f16 only)"),
    }
}

/// `atomrl_flash_fwd_tc_*` (bf16 and f16): [`flash_fwd`] with its two products on tensor cores
/// (`nvcuda::wmma`, emulated by `sim/mma.h`); 4 warps a block.
///
/// # Panics
/// For f32, which has no tensor-core forward; as [`flash_fwd`] for shapes.
pub fn flash_fwd_tc<T: Elem>(
    l: Launch,
    f: Flash<'_, T>,
    qkv: (&[T], &[T], &[T]),
    first_key: &[i32],
    o: &mut [T],
    stats: &mut [f32],
) {
    let kernel = flash_tc::<T>("flash_fwd_tc").fwd;
    check_block(l, 4 * 32, "flash_fwd_tc");
    flash_forward(l, f, qkv, first_key, (o, stats), kernel);
}

/// A FlashAttention forward `kernel` on the grid of 16-query tiles, shapes checked.
fn flash_forward<T: Elem>(
    l: Launch,
    f: Flash<'_, T>,
    (q, k, v): (&[T], &[T], &[T]),
    first_key: &[i32],
    (o, stats): (&mut [T], &mut [f32]),
    kernel: ffi::FlashFwd,
) {
    let sc = f.check(q, k, v);
    check("first_key (N)", first_key.len(), f.n);
    check("o", o.len(), q.len());
    check("stats (N·H·L·2)", stats.len(), 2 * f.n * f.heads * f.l);
    assert!(
        l.grid == (f.l.div_ceil(16).max(1) as u32, f.heads as u32, f.n as u32),
        "flash forward grid {:?}",
        l.grid
    );
    let (pq, pk, pv, pad, pf) = (
        Ptr::of(q),
        Ptr::of(k),
        Ptr::of(v),
        f.pad_ptr(q),
        Ptr::of(first_key),
    );
    let (po, pl) = (Ptr::of_mut(o), Ptr::of_mut(stats));
    // SAFETY: shapes checked above; each block writes its own query rows of o and stats.
    launch(l, &|| unsafe {
        kernel(
            pq.get(),
            pk.get(),
            pv.get(),
            pad.get(),
            pf.get(),
            po.get_mut(),
            pl.get_mut(),
            sc,
        )
    });
}

/// `atomrl_flash_bwd_dq_*`: `dq [N, H, L, d]` and `delta = Σ dO·O [N, H, L]` from the forward's
/// `o` and `stats` and the output gradient `dout`, with the launch of `launch_dims::flash_bwd_dq`.
pub fn flash_bwd_dq<T: Elem>(
    l: Launch,
    f: Flash<'_, T>,
    qkv: (&[T], &[T], &[T]),
    saved: (&[T], &[T], &[f32]),
    first_key: &[i32],
    dq: &mut [T],
    delta: &mut [f32],
) {
    check_block(l, 8 * 32, "flash_bwd_dq");
    let kernel = T::KERNELS.flash_bwd_dq;
    flash_backward_queries(l, 8, f, qkv, saved, first_key, (dq, delta), kernel);
}

/// `atomrl_flash_bwd_dq_tc_*` (bf16 and f16): [`flash_bwd_dq`] with its products on tensor
/// cores, 16 queries and 4 warps a block (`launch_dims::flash_bwd_dq_tc`).
///
/// # Panics
/// For f32, which has no tensor-core kernels; as [`flash_bwd_dq`] for shapes.
pub fn flash_bwd_dq_tc<T: Elem>(
    l: Launch,
    f: Flash<'_, T>,
    qkv: (&[T], &[T], &[T]),
    saved: (&[T], &[T], &[f32]),
    first_key: &[i32],
    dq: &mut [T],
    delta: &mut [f32],
) {
    let kernel = flash_tc::<T>("flash_bwd_dq_tc").bwd_dq;
    check_block(l, 4 * 32, "flash_bwd_dq_tc");
    flash_backward_queries(l, 16, f, qkv, saved, first_key, (dq, delta), kernel);
}

/// A FlashAttention dq `kernel` on the grid of `rows`-query tiles, shapes checked.
#[allow(clippy::too_many_arguments)]
fn flash_backward_queries<T: Elem>(
    l: Launch,
    rows: usize,
    f: Flash<'_, T>,
    (q, k, v): (&[T], &[T], &[T]),
    (o, dout, stats): (&[T], &[T], &[f32]),
    first_key: &[i32],
    (dq, delta): (&mut [T], &mut [f32]),
    kernel: ffi::FlashBwdDq,
) {
    let sc = f.check(q, k, v);
    check("first_key (N)", first_key.len(), f.n);
    check("o", o.len(), q.len());
    check("dout", dout.len(), q.len());
    check("stats (N·H·L·2)", stats.len(), 2 * f.n * f.heads * f.l);
    check("dq", dq.len(), q.len());
    check("delta (N·H·L)", delta.len(), f.n * f.heads * f.l);
    assert!(
        l.grid == (f.l.div_ceil(rows).max(1) as u32, f.heads as u32, f.n as u32),
        "flash dq grid {:?}",
        l.grid
    );
    let (pq, pk, pv, po, pdo, pl) = (
        Ptr::of(q),
        Ptr::of(k),
        Ptr::of(v),
        Ptr::of(o),
        Ptr::of(dout),
        Ptr::of(stats),
    );
    let (pad, pf, pdq, pd) = (
        f.pad_ptr(q),
        Ptr::of(first_key),
        Ptr::of_mut(dq),
        Ptr::of_mut(delta),
    );
    // SAFETY: shapes checked above; each block writes its own query rows of dq and delta.
    launch(l, &|| unsafe {
        kernel(
            pq.get(),
            pk.get(),
            pv.get(),
            po.get(),
            pdo.get(),
            pl.get(),
            pad.get(),
            pf.get(),
            pdq.get_mut(),
            pd.get_mut(),
            sc,
        )
    });
}

/// `atomrl_flash_bwd_dkv_*`: `dk, dv [N, KV, S, d]` from `stats` and [`flash_bwd_dq`]'s `delta`,
/// with the launch of `launch_dims::flash_bwd_dkv`.
pub fn flash_bwd_dkv<T: Elem>(
    l: Launch,
    f: Flash<'_, T>,
    qkv: (&[T], &[T], &[T]),
    saved: (&[T], &[f32], &[f32]),
    first_key: &[i32],
    dk: &mut [T],
    dv: &mut [T],
) {
    check_block(l, 8 * 32, "flash_bwd_dkv");
    let kernel = T::KERNELS.flash_bwd_dkv;
    flash_backward_keys(l, 8, f, qkv, saved, first_key, (dk, dv), kernel);
}

/// `atomrl_flash_bwd_dkv_tc_*` (bf16 and f16): [`flash_bwd_dkv`] with its products on tensor
/// cores, 16 keys and 4 warps a block (`launch_dims::flash_bwd_dkv_tc`).
///
/// # Panics
/// For f32, which has no tensor-core kernels; as [`flash_bwd_dkv`] for shapes.
pub fn flash_bwd_dkv_tc<T: Elem>(
    l: Launch,
    f: Flash<'_, T>,
    qkv: (&[T], &[T], &[T]),
    saved: (&[T], &[f32], &[f32]),
    first_key: &[i32],
    dk: &mut [T],
    dv: &mut [T],
) {
    let kernel = flash_tc::<T>("flash_bwd_dkv_tc").bwd_dkv;
    check_block(l, 4 * 32, "flash_bwd_dkv_tc");
    flash_backward_keys(l, 16, f, qkv, saved, first_key, (dk, dv), kernel);
}

/// A FlashAttention dk/dv `kernel` on the grid of `rows`-key tiles, shapes checked.
#[allow(clippy::too_many_arguments)]
fn flash_backward_keys<T: Elem>(
    l: Launch,
    rows: usize,
    f: Flash<'_, T>,
    (q, k, v): (&[T], &[T], &[T]),
    (dout, stats, delta): (&[T], &[f32], &[f32]),
    first_key: &[i32],
    (dk, dv): (&mut [T], &mut [T]),
    kernel: ffi::FlashBwdDkv,
) {
    let sc = f.check(q, k, v);
    check("first_key (N)", first_key.len(), f.n);
    check("dout", dout.len(), q.len());
    check("stats (N·H·L·2)", stats.len(), 2 * f.n * f.heads * f.l);
    check("delta (N·H·L)", delta.len(), f.n * f.heads * f.l);
    check("dk", dk.len(), k.len());
    check("dv", dv.len(), k.len());
    assert!(
        l.grid
            == (
                f.s.div_ceil(rows).max(1) as u32,
                f.kv_heads as u32,
                f.n as u32
            ),
        "flash dk/dv grid {:?}",
        l.grid
    );
    let (pq, pk, pv, pdo, pl, pd) = (
        Ptr::of(q),
        Ptr::of(k),
        Ptr::of(v),
        Ptr::of(dout),
        Ptr::of(stats),
        Ptr::of(delta),
    );
    let (pad, pf, pdk, pdv) = (
        f.pad_ptr(q),
        Ptr::of(first_key),
        Ptr::of_mut(dk),
        Ptr::of_mut(dv),
    );
    // SAFETY: shapes checked above; each block writes its own keys of dk and dv.
    launch(l, &|| unsafe {
        kernel(
            pq.get(),
            pk.get(),
            pv.get(),
            pdo.get(),
            pl.get(),
            pd.get(),
            pad.get(),
            pf.get(),
            pdk.get_mut(),
            pdv.get_mut(),
            sc,
        )
    });
}
