//! model.cu's kernels run on the CPU by atomrl-cuda-sim, with the launches of `cuda.rs`,
//! against the CPU kernels of this module: values, and gradients through candle's backward of
//! the CPU ops. f32 to ~1e-6; bf16 and f16 against the f32 CPU kernels on the same (rounded)
//! inputs, to their precision. What `xtask device-check` compares on a GPU, checked on every
//! CPU test run.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use atomrl_core::launch_dims;
use atomrl_cuda_sim::kernels::{self, RopeLayout, SoftmaxMask};
use atomrl_cuda_sim::{Elem, Launch};
use candle_core::{DType, Device, Tensor, Var};
use half::{bf16, f16};

use super::testing::{flat, var};
use super::{attention_softmax, attention_softmax_backward, rms_norm, rope, swiglu, KeyMask};

/// An element type of the kernels, with its conversions and the tolerance it is held to.
trait Host: Elem + Default {
    fn of(x: f32) -> Self;
    fn f(self) -> f32;
    /// Largest difference allowed per unit of magnitude.
    const TOL: f32;
}

impl Host for f32 {
    fn of(x: f32) -> Self {
        x
    }
    fn f(self) -> f32 {
        self
    }
    const TOL: f32 = 3e-6;
}

impl Host for bf16 {
    fn of(x: f32) -> Self {
        bf16::from_f32(x)
    }
    fn f(self) -> f32 {
        self.to_f32()
    }
    const TOL: f32 = 2e-2;
}

impl Host for f16 {
    fn of(x: f32) -> Self {
        f16::from_f32(x)
    }
    fn f(self) -> f32 {
        self.to_f32()
    }
    const TOL: f32 = 3e-3;
}

/// Random `[dims]` values in about [−2, 2], already exact in `T`, as an f32 CPU variable.
fn input<T: Host>(dims: &[usize], seed: u64) -> Var {
    let v = var(dims, DType::F32, seed);
    let rounded: Vec<f32> = flat(v.as_tensor()).iter().map(|&x| T::of(x).f()).collect();
    Var::from_tensor(&Tensor::from_vec(rounded, dims, &Device::Cpu).unwrap()).unwrap()
}

fn cast<T: Host>(x: &[f32]) -> Vec<T> {
    x.iter().map(|&v| T::of(v)).collect()
}

fn back<T: Host>(x: &[T]) -> Vec<f32> {
    x.iter().map(|&v| v.f()).collect()
}

fn assert_close<T: Host>(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        let tol = T::TOL * b.abs().max(1.0);
        assert!(
            (a - b).abs() <= tol,
            "{what}[{i}]: {a} against {b} ({})",
            std::any::type_name::<T>()
        );
    }
}

/// `f(inputs)` on the CPU and the gradients of `sum(f · g)` for each input.
fn cpu_with_grads(
    inputs: &[&Var],
    g: &Tensor,
    f: impl Fn(&[Tensor]) -> Tensor,
) -> (Vec<f32>, Vec<Vec<f32>>) {
    let ts: Vec<Tensor> = inputs.iter().map(|v| v.as_tensor().clone()).collect();
    let y = f(&ts);
    let grads = (&y * g).unwrap().sum_all().unwrap().backward().unwrap();
    let gs = inputs
        .iter()
        .map(|v| flat(grads.get(v.as_tensor()).unwrap()))
        .collect();
    (flat(&y), gs)
}

fn check_rms_norm<T: Host>(rows: usize, h: usize) {
    let eps = 1e-6;
    let (x, w, g) = (
        input::<T>(&[rows, h], 1),
        input::<T>(&[h], 2),
        input::<T>(&[rows, h], 3),
    );
    let (y0, grads) = cpu_with_grads(&[&x, &w], g.as_tensor(), |t| {
        rms_norm(&t[0], &t[1], eps).unwrap()
    });
    let (xs, ws, gs) = (
        cast::<T>(&flat(x.as_tensor())),
        cast::<T>(&flat(w.as_tensor())),
        cast::<T>(&flat(g.as_tensor())),
    );
    let rows_l = Launch::from_dims(launch_dims::rows(rows, h));

    let mut y = vec![T::default(); rows * h];
    kernels::rms_norm_fwd(rows_l, &xs, &ws, &mut y, eps as f32, true);
    assert_close::<T>(&back(&y), &y0, "rms_norm y");

    let mut inv = vec![0f32; rows];
    kernels::rms_norm_inv(rows_l, &xs, &mut inv, h, eps as f32);
    let mut dx = vec![T::default(); rows * h];
    kernels::rms_norm_dx(rows_l, &xs, &ws, &gs, &inv, &mut dx);
    assert_close::<T>(&back(&dx), &grads[0], "rms_norm dx");

    // cuda.rs: chunks of 64 rows.
    const CHUNK: usize = 64;
    let chunks = rows.div_ceil(CHUNK);
    let mut part = vec![0f32; chunks * h];
    let dw_l = Launch::from_dims(launch_dims::rms_norm_dw(h, chunks));
    kernels::rms_norm_dw_part(dw_l, &xs, &gs, &inv, &mut part, h, CHUNK);
    let dw: Vec<f32> = (0..h)
        .map(|j| T::of((0..chunks).map(|c| part[c * h + j]).sum()).f())
        .collect();
    // dw sums `rows` products: its error grows with them.
    let dw_scaled: Vec<f32> = dw.iter().map(|v| v / rows as f32).collect();
    let want: Vec<f32> = grads[1].iter().map(|v| v / rows as f32).collect();
    assert_close::<T>(&dw_scaled, &want, "rms_norm dw / rows");
}

#[test]
fn rms_norm_kernels_match_the_cpu_kernel() {
    // 40 wide: one block of 64 threads a row, most of a warp idle; 300 wide: 256 threads
    // striding. 130 rows: three chunks of the weight's gradient, the last one short.
    for (rows, h) in [(130, 40), (5, 300)] {
        check_rms_norm::<f32>(rows, h);
        check_rms_norm::<bf16>(rows, h);
        check_rms_norm::<f16>(rows, h);
    }
}

fn check_add_rms_norm<T: Host>() {
    let (rows, h, eps) = (4, 72, 1e-5);
    let (x, r, w) = (
        input::<T>(&[rows, h], 4),
        input::<T>(&[rows, h], 5),
        input::<T>(&[h], 6),
    );
    // The tensor-op form rounds the sum to T, then norms it rounding once.
    let s0: Vec<f32> = flat(x.as_tensor())
        .iter()
        .zip(flat(r.as_tensor()))
        .map(|(a, b)| T::of(a + b).f())
        .collect();
    let s_t = Tensor::from_vec(s0.clone(), (rows, h), &Device::Cpu).unwrap();
    let y0 = flat(&super::rms_norm_rounding_once(&s_t, w.as_tensor(), eps).unwrap());
    let (xs, rs, ws) = (
        cast::<T>(&flat(x.as_tensor())),
        cast::<T>(&flat(r.as_tensor())),
        cast::<T>(&flat(w.as_tensor())),
    );
    let (mut s, mut y) = (vec![T::default(); rows * h], vec![T::default(); rows * h]);
    kernels::add_rms_norm_fwd(
        Launch::from_dims(launch_dims::rows(rows, h)),
        &xs,
        &rs,
        &ws,
        &mut s,
        &mut y,
        eps as f32,
    );
    assert_eq!(back(&s), s0, "the rounded sum");
    assert_close::<T>(&back(&y), &y0, "add_rms_norm y");
    // The rounding-once form without the add.
    let mut y1 = vec![T::default(); rows * h];
    kernels::rms_norm_fwd(
        Launch::from_dims(launch_dims::rows(rows, h)),
        &cast::<T>(&s0),
        &ws,
        &mut y1,
        eps as f32,
        false,
    );
    assert_close::<T>(&back(&y1), &y0, "rms_norm rounding once");
}

#[test]
fn the_decode_step_norms_match_the_cpu_kernels() {
    check_add_rms_norm::<f32>();
    check_add_rms_norm::<bf16>();
    check_add_rms_norm::<f16>();
}

fn check_swiglu<T: Host>() {
    let (rows, inter) = (7, 150);
    let n = rows * inter;
    let (gate, up, g) = (
        input::<T>(&[rows, inter], 7),
        input::<T>(&[rows, inter], 8),
        input::<T>(&[rows, inter], 9),
    );
    let (y0, grads) = cpu_with_grads(&[&gate, &up], g.as_tensor(), |t| {
        swiglu(&t[0], &t[1]).unwrap()
    });
    let (gs, us, grs) = (
        cast::<T>(&flat(gate.as_tensor())),
        cast::<T>(&flat(up.as_tensor())),
        cast::<T>(&flat(g.as_tensor())),
    );
    // The elementwise launch, and a 2-block grid that strides.
    for l in [
        Launch::from_dims(launch_dims::elementwise(n)),
        Launch::linear(2, 256),
    ] {
        let mut y = vec![T::default(); n];
        kernels::swiglu_fwd(l, &gs, &us, &mut y);
        assert_close::<T>(&back(&y), &y0, "swiglu y");
        let mut out = vec![T::default(); 2 * n];
        kernels::swiglu_bwd(l, &gs, &us, &grs, &mut out);
        assert_close::<T>(&back(&out[..n]), &grads[0], "swiglu dgate");
        assert_close::<T>(&back(&out[n..]), &grads[1], "swiglu dup");
    }
    // The merged gate | up rows of the decode step.
    let packed: Vec<T> = (0..rows)
        .flat_map(|r| {
            gs[r * inter..(r + 1) * inter]
                .iter()
                .chain(&us[r * inter..(r + 1) * inter])
                .copied()
        })
        .collect();
    let mut y = vec![T::default(); n];
    kernels::swiglu_packed_fwd(
        Launch::from_dims(launch_dims::elementwise(n)),
        &packed,
        &mut y,
        inter,
    );
    assert_close::<T>(&back(&y), &y0, "swiglu packed");
}

#[test]
fn swiglu_kernels_match_the_cpu_kernel() {
    check_swiglu::<f32>();
    check_swiglu::<bf16>();
    check_swiglu::<f16>();
}

/// RoPE forward and backward against the CPU kernel: `x` head-major, or token-major (the
/// projections' `[N, L, H, d]`, read as their `transpose(1, 2)`, the gradient written back so).
fn check_rope<T: Host>(token_major: bool) {
    let (n, heads, l, d) = (2, 3, 5, 8);
    let (x, view) = if token_major {
        let x = input::<T>(&[n, l, heads, d], 10);
        let view = x.as_tensor().transpose(1, 2).unwrap();
        (x, view)
    } else {
        let x = input::<T>(&[n, heads, l, d], 10);
        let view = x.as_tensor().clone();
        (x, view)
    };
    let cos = input::<T>(&[n, 1, l, d], 11).as_tensor().detach();
    let sin = input::<T>(&[n, 1, l, d], 12).as_tensor().detach();
    let g = input::<T>(&[n, heads, l, d], 13);
    let (y0, grads) = cpu_with_grads(&[&x], g.as_tensor(), |t| {
        let v = if token_major {
            t[0].transpose(1, 2).unwrap()
        } else {
            t[0].clone()
        };
        rope(&v, &cos, &sin).unwrap()
    });
    assert_eq!(view.dims(), [n, heads, l, d]);
    let (xs, cs, ss, gs) = (
        cast::<T>(&flat(x.as_tensor())),
        cast::<T>(&flat(&cos)),
        cast::<T>(&flat(&sin)),
        cast::<T>(&flat(g.as_tensor())),
    );
    let lie = if token_major {
        RopeLayout::TokenMajor
    } else {
        RopeLayout::HeadMajor
    };
    let l_ = Launch::from_dims(launch_dims::elementwise(n * heads * l * d / 2));
    let mut y = vec![T::default(); xs.len()];
    let dims = (heads, l, d);
    kernels::rope(
        l_,
        &xs,
        &cs,
        &ss,
        &mut y,
        dims,
        false,
        (lie, RopeLayout::HeadMajor),
    );
    assert_close::<T>(&back(&y), &y0, "rope y");
    let mut dx = vec![T::default(); xs.len()];
    kernels::rope(
        l_,
        &gs,
        &cs,
        &ss,
        &mut dx,
        dims,
        true,
        (RopeLayout::HeadMajor, lie),
    );
    // The CPU gradient is the variable's, in `x`'s own (row-major) layout.
    assert_close::<T>(&back(&dx), &grads[0], "rope dx");
}

#[test]
fn rope_kernel_matches_the_cpu_kernel() {
    for token_major in [false, true] {
        check_rope::<f32>(token_major);
        check_rope::<bf16>(token_major);
        check_rope::<f16>(token_major);
    }
}

fn check_softmax<T: Host>(dims: [usize; 4], causal: bool, past: usize, padded: &[usize]) {
    let [n, heads, l, s] = dims;
    let scale = 0.35;
    let scores = input::<T>(&dims, 14);
    // Keys `padded` of the last batch entry are padding.
    let pad: Vec<bool> = (0..n * s)
        .map(|i| i / s == n - 1 && padded.contains(&(i % s)))
        .collect();
    let mask = KeyMask {
        causal,
        past,
        pad: (!padded.is_empty()).then(|| Arc::new(pad.clone())),
        mask_value: crate::MASK_VALUE,
        pad_bias: None,
    };
    let p0 = attention_softmax(scores.as_tensor(), scale, &mask).unwrap();
    let g = input::<T>(&dims, 15);
    let dx0 = flat(&attention_softmax_backward(&p0, g.as_tensor(), scale).unwrap());
    let p0 = flat(&p0);

    let bias: Vec<T> = pad
        .iter()
        .map(|&m| T::of(if m { crate::MASK_VALUE as f32 } else { 0.0 }))
        .collect();
    let l_ = Launch::from_dims(launch_dims::rows(n * heads * l, s));
    let mut p = vec![T::default(); n * heads * l * s];
    let kmask = SoftmaxMask {
        causal,
        past,
        mask_value: crate::MASK_VALUE as f32,
        pad: (!padded.is_empty()).then_some(&bias[..]),
    };
    kernels::attn_softmax_fwd(
        l_,
        &cast::<T>(&flat(scores.as_tensor())),
        &mut p,
        (heads, l, s),
        scale as f32,
        kmask,
    );
    assert_close::<T>(&back(&p), &p0, "softmax p");
    // The backward from the CPU's probabilities, so that only the backward is compared.
    let mut dx = vec![T::default(); p.len()];
    kernels::attn_softmax_bwd(
        l_,
        &cast::<T>(&p0),
        &cast::<T>(&flat(g.as_tensor())),
        &mut dx,
        s,
        scale as f32,
    );
    assert_close::<T>(&back(&dx), &dx0, "softmax dx");
}

#[test]
fn attention_softmax_kernels_match_the_cpu_kernel() {
    for (dims, causal, past, padded) in [
        ([2, 2, 5, 7], true, 2, &[0usize, 1][..]),
        ([2, 3, 4, 4], true, 0, &[][..]),
        ([1, 2, 3, 300], false, 0, &[5, 6, 299][..]),
    ] {
        check_softmax::<f32>(dims, causal, past, padded);
        check_softmax::<bf16>(dims, causal, past, padded);
        check_softmax::<f16>(dims, causal, past, padded);
    }
}

/// A FlashAttention forward of atomrl-cuda-sim ([`kernels::flash_fwd`] or its tensor-core form).
type Forward<T> =
    for<'a> fn(Launch, kernels::Flash<'a, T>, (&[T], &[T], &[T]), &[i32], &mut [T], &mut [f32]);

/// A FlashAttention dq/delta kernel of atomrl-cuda-sim ([`kernels::flash_bwd_dq`] or its
/// tensor-core form).
type BackwardQueries<T> = for<'a> fn(
    Launch,
    kernels::Flash<'a, T>,
    (&[T], &[T], &[T]),
    (&[T], &[T], &[f32]),
    &[i32],
    &mut [T],
    &mut [f32],
);

/// A FlashAttention dk/dv kernel of atomrl-cuda-sim ([`kernels::flash_bwd_dkv`] or its
/// tensor-core form).
type BackwardKeys<T> = for<'a> fn(
    Launch,
    kernels::Flash<'a, T>,
    (&[T], &[T], &[T]),
    (&[T], &[f32], &[f32]),
    &[i32],
    &mut [T],
    &mut [T],
);

/// attention.cu's FlashAttention against the CPU's grouped attention with the fused softmax
/// (`crate::attention::grouped_attention`): output, and the gradients of q, k and v.
fn check_flash<T: Host>(
    [n, heads, kv, l, past, d]: [usize; 6],
    causal: bool,
    padded: &[(usize, usize)],
) {
    let s = past + l;
    let scale = 1.0 / (d as f64).sqrt();
    let q = input::<T>(&[n, heads, l, d], 21);
    let k = input::<T>(&[n, kv, s, d], 22);
    let v = input::<T>(&[n, kv, s, d], 23);
    let g = input::<T>(&[n, heads, l, d], 24);
    // Keys `j` of row `b` for each `(b, j)` of `padded`.
    let pad: Vec<bool> = (0..n * s)
        .map(|i| padded.contains(&(i / s, i % s)))
        .collect();
    let mask = KeyMask {
        causal,
        past,
        pad: (!padded.is_empty()).then(|| Arc::new(pad.clone())),
        mask_value: crate::MASK_VALUE,
        pad_bias: None,
    };
    let (o0, grads) = cpu_with_grads(&[&q, &k, &v], g.as_tensor(), |t| {
        crate::attention::grouped_attention(&t[0], &t[1], &t[2], |x| {
            attention_softmax(x, scale, &mask)
        })
        .unwrap()
    });

    let bias: Vec<T> = pad
        .iter()
        .map(|&m| T::of(if m { crate::MASK_VALUE as f32 } else { 0.0 }))
        .collect();
    let f = kernels::Flash {
        n,
        heads,
        kv_heads: kv,
        l,
        s,
        d,
        scale: scale as f32,
        mask: SoftmaxMask {
            causal,
            past,
            mask_value: crate::MASK_VALUE as f32,
            pad: (!padded.is_empty()).then_some(&bias[..]),
        },
    };
    let (qs, ks, vs, gs) = (
        cast::<T>(&flat(q.as_tensor())),
        cast::<T>(&flat(k.as_tensor())),
        cast::<T>(&flat(v.as_tensor())),
        cast::<T>(&flat(g.as_tensor())),
    );
    let mut first_key = vec![-1i32; n];
    kernels::flash_first_key(
        Launch::from_dims(launch_dims::flash_first_key(n)),
        f.mask.pad,
        &mut first_key,
        s,
    );
    let want_first: Vec<i32> = (0..n)
        .map(|b| {
            let row = &pad[b * s..(b + 1) * s];
            row.iter().position(|&p| !p).unwrap_or(s) as i32
        })
        .collect();
    assert_eq!(first_key, want_first, "first unpadded keys");

    // The CUDA-core kernels, and the tensor-core ones where the dtype has them: each backward
    // from its own forward's output and stats.
    let forwards = if kernels::has_flash_tc::<T>() {
        &[false, true][..]
    } else {
        &[false][..]
    };
    for &tc in forwards {
        let what = if tc { "flash (tensor cores)" } else { "flash" };
        let mut o = vec![T::default(); qs.len()];
        let mut stats = vec![0f32; 2 * n * heads * l];
        let (forward, dims) = if tc {
            let f: Forward<T> = kernels::flash_fwd_tc;
            (f, launch_dims::flash_fwd_tc(n, heads, l))
        } else {
            let f: Forward<T> = kernels::flash_fwd;
            (f, launch_dims::flash_fwd(n, heads, l))
        };
        let inputs = (&qs[..], &ks[..], &vs[..]);
        forward(
            Launch::from_dims(dims),
            f,
            inputs,
            &first_key,
            &mut o,
            &mut stats,
        );
        assert_close::<T>(&back(&o), &o0, &format!("{what} o"));

        let mut dq = vec![T::default(); qs.len()];
        let mut delta = vec![0f32; n * heads * l];
        let (dq_kernel, dq_dims): (BackwardQueries<T>, _) = if tc {
            (
                kernels::flash_bwd_dq_tc,
                launch_dims::flash_bwd_dq_tc(n, heads, l),
            )
        } else {
            (
                kernels::flash_bwd_dq,
                launch_dims::flash_bwd_dq(n, heads, l),
            )
        };
        dq_kernel(
            Launch::from_dims(dq_dims),
            f,
            (&qs, &ks, &vs),
            (&o, &gs, &stats),
            &first_key,
            &mut dq,
            &mut delta,
        );
        let mut dk = vec![T::default(); ks.len()];
        let mut dv = vec![T::default(); ks.len()];
        let (dkv_kernel, dkv_dims): (BackwardKeys<T>, _) = if tc {
            (
                kernels::flash_bwd_dkv_tc,
                launch_dims::flash_bwd_dkv_tc(n, kv, s),
            )
        } else {
            (kernels::flash_bwd_dkv, launch_dims::flash_bwd_dkv(n, kv, s))
        };
        dkv_kernel(
            Launch::from_dims(dkv_dims),
            f,
            (&qs, &ks, &vs),
            (&gs, &stats, &delta),
            &first_key,
            &mut dk,
            &mut dv,
        );
        assert_close::<T>(&back(&dq), &grads[0], &format!("{what} dq"));
        assert_close::<T>(&back(&dk), &grads[1], &format!("{what} dk"));
        assert_close::<T>(&back(&dv), &grads[2], &format!("{what} dv"));
    }
}

#[test]
fn flash_attention_kernels_match_the_cpu_attention() {
    // [n, heads, kv_heads, l, past, d]: several tiles of queries and keys, grouped heads, a
    // cached past; the second row's first 9 keys padded, so its first 4 queries see only
    // padding (the plain softmax spreads them over the whole row). In bf16 and f16 the pad
    // bias itself is rounded (−1e9 is −inf in f16), so such a query's spread differs from the
    // f32 reference's, on a GPU as here: those dtypes take a padding every query sees past.
    let left: Vec<(usize, usize)> = (0..9).map(|j| (1, j)).collect();
    check_flash::<f32>([2, 4, 2, 37, 5, 16], true, &left);
    let short: Vec<(usize, usize)> = (0..4).map(|j| (1, j)).collect();
    check_flash::<bf16>([2, 4, 2, 37, 5, 16], true, &short);
    check_flash::<f16>([2, 4, 2, 37, 5, 16], true, &short);
    // Not causal, no padding, a head dim of 72 (three dims a lane, the last partly used).
    check_flash::<f32>([1, 2, 2, 20, 0, 72], false, &[]);
    check_flash::<bf16>([1, 2, 2, 20, 0, 72], false, &[]);
    // Right padding (keys past a row's length), causal, a head dim of the maximum, 128.
    let right: Vec<(usize, usize)> = (12..19).map(|j| (0, j)).collect();
    check_flash::<f32>([2, 3, 1, 19, 0, 128], true, &right);
    check_flash::<bf16>([2, 3, 1, 19, 0, 128], true, &right);
    // Qwen2.5-0.5B's heads: 7 query heads a key/value head, head dim 64; two key tiles, and
    // (in the dk/dv pass) two query tiles, one of them partial.
    let first_three: Vec<(usize, usize)> = (0..3).map(|j| (0, j)).collect();
    check_flash::<bf16>([1, 7, 1, 45, 3, 64], true, &first_three);
}
