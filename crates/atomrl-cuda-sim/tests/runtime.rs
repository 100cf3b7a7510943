//! The emulation itself: block-wide reductions (warp shuffles, `__shared__` memory and
//! `__syncthreads`) and the dtype conversions of `sim/cuda_bf16.h` and `sim/cuda_fp16.h`.
#![allow(clippy::unwrap_used)]

use atomrl_cuda_sim::{kernels, Launch};
use half::{bf16, f16};

/// A reproducible spread of values (no RNG crate needed).
fn values(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i as f32 * 0.618_034).fract() - 0.5) * (1.0 + (i % 7) as f32))
        .collect()
}

#[test]
fn a_block_reduction_sums_every_element_once() {
    // 5 blocks of 256 threads over 10,007 elements: 8 warps a block, each reduced by shuffles,
    // then the warps' sums through shared memory, between barriers.
    let a = values(10_007);
    let mut part = vec![0f32; 5];
    kernels::sq_norm_part_f32(Launch::linear(5, 256), &a, &mut part);
    let want: f64 = a.iter().map(|&x| f64::from(x) * f64::from(x)).sum();
    let got: f64 = part.iter().map(|&x| f64::from(x)).sum();
    assert!((got - want).abs() <= 1e-5 * want, "{got} against {want}");
    // Block b strides over i ≡ b·256 + t (mod 1,280): its own share, nobody else's.
    for (b, &p) in part.iter().enumerate() {
        let share: f64 = a
            .iter()
            .enumerate()
            .filter(|(i, _)| (i % 1280) / 256 == b)
            .map(|(_, &x)| f64::from(x) * f64::from(x))
            .sum();
        assert!(
            (f64::from(p) - share).abs() <= 1e-5 * share,
            "block {b}: {p} against {share}"
        );
    }
}

#[test]
fn a_reduction_is_the_same_on_every_run() {
    let a = values(3_000);
    let mut first = vec![0f32; 3];
    kernels::sq_norm_part_f32(Launch::linear(3, 64), &a, &mut first);
    for _ in 0..3 {
        let mut again = vec![0f32; 3];
        kernels::sq_norm_part_f32(Launch::linear(3, 64), &a, &mut again);
        assert_eq!(
            first.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            again.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        );
    }
}

/// `from_f<T>(x)` of the kernels, through `decode_bias`: one row whose only column lies
/// before its start, so the kernel writes the mask value rounded to `T`.
fn round_in_kernel<T: atomrl_cuda_sim::Elem + Default>(x: f32) -> T {
    let mut bias = [T::default()];
    kernels::decode_bias(Launch::linear(1, 1), &[1], &[0, 0, 0], &mut bias, 1, x);
    bias[0]
}

fn conversion_cases() -> Vec<f32> {
    let mut xs = vec![
        0.0,
        -0.0,
        1.0,
        -1.0,
        65504.0,
        65519.99,
        65520.0,
        1e-8,
        5.96e-8,
        2.98e-8,
        6.1e-5,
        f32::MAX,
        f32::MIN_POSITIVE,
        f32::INFINITY,
        f32::NEG_INFINITY,
        -3.4e38,
    ];
    // Every rounding boundary shape: values whose dropped bits are just under, at and over a
    // half, with even and odd kept parts.
    for base in [1.0f32, 3.0, 1000.5, 6.5e-5, 1e-6, 1e30] {
        let b = base.to_bits();
        for d in [
            0u32, 1, 0x0fff, 0x1000, 0x1001, 0x2000, 0x3000, 0x7fff, 0x8000, 0x8001, 0x18000,
        ] {
            xs.push(f32::from_bits(b + d));
            xs.push(-f32::from_bits(b + d));
        }
    }
    xs.extend(values(2_000).iter().map(|x| x * 1e3));
    xs
}

#[test]
fn bf16_conversion_rounds_to_nearest_even_as_cuda_does() {
    for x in conversion_cases() {
        let got: bf16 = round_in_kernel(x);
        assert_eq!(got.to_bits(), bf16::from_f32(x).to_bits(), "bf16 of {x:e}");
    }
    let nan: bf16 = round_in_kernel(f32::NAN);
    assert!(nan.is_nan());
}

#[test]
fn f16_conversion_rounds_to_nearest_even_with_subnormals_and_overflow() {
    for x in conversion_cases() {
        let got: f16 = round_in_kernel(x);
        assert_eq!(got.to_bits(), f16::from_f32(x).to_bits(), "f16 of {x:e}");
    }
    let nan: f16 = round_in_kernel(f32::NAN);
    assert!(nan.is_nan());
}

#[test]
#[should_panic(expected = "parts (B × chunks)")]
fn a_slice_of_the_wrong_length_is_refused_before_the_kernel_runs() {
    let logits = vec![0f32; 8];
    let mut parts = vec![atomrl_cuda_sim::PickState::default(); 1];
    kernels::pick_part(
        Launch {
            grid: (2, 1, 1),
            block: (256, 1, 1),
        },
        &logits,
        None,
        1.0,
        8,
        4,
        &mut parts,
    );
}
