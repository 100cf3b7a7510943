//! decode.cu's step kernels run on the CPU by atomrl-cuda-sim, with the launches of `cuda.rs`,
//! against the tensor-op forms: `decode_qkv` (bias, RoPE at each row's position, the key and
//! value written to the cache's column `slot`, and nothing else written) for projections apart
//! and merged, and `decode_bias` against the host's key mask.
#![allow(clippy::unwrap_used)]

use atomrl_core::launch_dims;
use atomrl_cuda_sim::kernels::{self, QkvStep};
use atomrl_cuda_sim::{Elem, Launch};
use candle_core::{DType, Device, Tensor};
use half::bf16;

use super::host_mask;
use crate::kernels::testing::flat;
use crate::ops::apply_rope_ops;

/// Values exact in bf16 (multiples of 1/16 in [−2, 2)), from `seed`.
fn values(n: usize, seed: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 37 + seed * 101) % 64) as f32 / 16.0 - 2.0)
        .collect()
}

/// `x` rounded to the dtype of `T`'s kernels (`to` and back).
fn rounded(x: &Tensor, dtype: DType) -> Tensor {
    x.to_dtype(dtype).unwrap().to_dtype(DType::F32).unwrap()
}

const SENTINEL: f32 = 7.0;

fn check_qkv<T: Elem + Default>(
    of: fn(f32) -> T,
    to: fn(T) -> f32,
    dtype: DType,
    merged: bool,
    bias: bool,
    tol: f32,
) {
    let (rows, heads, kv, d, cap, table) = (3usize, 4usize, 2usize, 8usize, 6usize, 10usize);
    let (qw, kvw) = (heads * d, kv * d);
    let width = qw + 2 * kvw;
    let proj = values(rows * width, 1);
    let (qb, kb, vb) = (values(qw, 2), values(kvw, 3), values(kvw, 4));
    let (cos, sin) = (values(table * d, 5), values(table * d, 6));
    let positions = [4u32, 0, 9];
    let slot = 2u32;
    let step: Vec<u32> = [7, 8, 9]
        .iter()
        .chain(&positions)
        .chain(&[slot])
        .copied()
        .collect();

    // The tensor-op form, in f32 on the same values, each sum rounded to the dtype as the
    // tensor-op form's separate add would round it.
    let dev = Device::Cpu;
    let p = Tensor::from_vec(proj.clone(), (rows, width), &dev).unwrap();
    let part = |from: usize, n: usize, b: &[f32]| {
        let x = p.narrow(1, from, n).unwrap();
        if bias {
            rounded(
                &x.broadcast_add(&Tensor::new(b, &dev).unwrap()).unwrap(),
                dtype,
            )
        } else {
            x
        }
    };
    let (q, k, v) = (
        part(0, qw, &qb),
        part(qw, kvw, &kb),
        part(qw + kvw, kvw, &vb),
    );
    let pos = Tensor::new(&positions, &dev).unwrap();
    let table_of = |t: &[f32]| {
        Tensor::from_vec(t.to_vec(), (table, d), &dev)
            .unwrap()
            .index_select(&pos, 0)
            .unwrap()
            .reshape((rows, 1, 1, d))
            .unwrap()
    };
    let (c, s) = (table_of(&cos), table_of(&sin));
    let q0 = flat(&apply_rope_ops(&q.reshape((rows, heads, 1, d)).unwrap(), &c, &s).unwrap());
    let k0 = flat(&apply_rope_ops(&k.reshape((rows, kv, 1, d)).unwrap(), &c, &s).unwrap());
    let v0 = flat(&v);

    // The kernel, on the dtype's values: apart (three buffers) or views into one merged row.
    let cast = |x: &[f32]| x.iter().map(|&a| of(a)).collect::<Vec<T>>();
    let pt = cast(&proj);
    let (qa, ka, va) = (
        cast(&flat(&p.narrow(1, 0, qw).unwrap())),
        cast(&flat(&p.narrow(1, qw, kvw).unwrap())),
        cast(&flat(&p.narrow(1, qw + kvw, kvw).unwrap())),
    );
    let (qbt, kbt, vbt, ct, st) = (cast(&qb), cast(&kb), cast(&vb), cast(&cos), cast(&sin));
    let a = QkvStep {
        q: if merged { &pt[..] } else { &qa[..] },
        k: if merged { &pt[qw..] } else { &ka[..] },
        v: if merged { &pt[qw + kvw..] } else { &va[..] },
        ld: if merged { (width, width) } else { (qw, kvw) },
        bias: bias.then_some((&qbt[..], &kbt[..], &vbt[..])),
        cos: &ct,
        sin: &st,
        step: &step,
        dims: (heads, kv, d, cap),
    };
    let mut q_out = vec![T::default(); rows * qw];
    let mut k_cache = vec![of(SENTINEL); rows * kv * cap * d];
    let mut v_cache = k_cache.clone();
    let l = Launch::from_dims(launch_dims::elementwise(rows * (heads + 2 * kv) * d / 2));
    kernels::decode_qkv(l, a, &mut q_out, &mut k_cache, &mut v_cache);

    let what = format!("{dtype:?}, merged {merged}, bias {bias}");
    let close = |a: f32, b: f32, at: &str| {
        assert!(
            (a - b).abs() <= tol * b.abs().max(1.0),
            "{at} ({what}): {a} against {b}"
        )
    };
    for (i, (&a, &b)) in q_out.iter().zip(&q0).enumerate() {
        close(to(a), b, &format!("q[{i}]"));
    }
    for (cache, want, name) in [(&k_cache, &k0, "k"), (&v_cache, &v0, "v")] {
        for (i, &x) in cache.iter().enumerate() {
            let (e, col, bh) = (i % d, (i / d) % cap, i / (d * cap));
            let (b, h) = (bh / kv, bh % kv);
            if col == slot as usize {
                close(
                    to(x),
                    want[(b * kv + h) * d + e],
                    &format!("{name} cache [{b}, {h}, slot, {e}]"),
                );
            } else {
                assert_eq!(
                    to(x),
                    SENTINEL,
                    "{name} cache [{b}, {h}, {col}, {e}] written ({what})"
                );
            }
        }
    }
}

#[test]
fn decode_qkv_is_the_tensor_op_form() {
    for merged in [false, true] {
        for bias in [false, true] {
            check_qkv::<f32>(|a| a, |a| a, DType::F32, merged, bias, 1e-6);
            check_qkv::<bf16>(
                bf16::from_f32,
                bf16::to_f32,
                DType::BF16,
                merged,
                bias,
                1e-2,
            );
        }
    }
}

#[test]
fn decode_bias_is_the_host_mask() {
    let (starts, slot, cap) = ([0u32, 2, 1, 5], 3u32, 6usize);
    let step: Vec<u32> = [0u32; 8].iter().chain(&[slot]).copied().collect();
    let mask_value = crate::MASK_VALUE as f32;
    let mut bias = vec![0f32; starts.len() * cap];
    kernels::decode_bias(
        Launch::from_dims(launch_dims::elementwise(bias.len())),
        &starts,
        &step,
        &mut bias,
        cap,
        mask_value,
    );
    let host = host_mask(&starts.map(|s| s as usize), slot as usize, cap);
    let want: Vec<f32> = host
        .pad
        .unwrap()
        .iter()
        .map(|&m| if m { mask_value } else { 0.0 })
        .collect();
    assert_eq!(bias, want);
}
