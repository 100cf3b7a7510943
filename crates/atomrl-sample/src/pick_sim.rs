//! The CUDA draw (`atomrl_pick_part_*`, `atomrl_pick_finish_*` in decode.cu) run on the CPU by
//! atomrl-cuda-sim with the launches of `pick_cuda.rs`, against the tensor-op draw with the
//! same Philox noise made on the host: what the kernel's first-use self-check and
//! `device-check` compare on a GPU, checked here on every CPU test run.
#![allow(clippy::unwrap_used)]

use atomrl_core::launch_dims::{self, PICK_THREADS as THREADS};
use atomrl_cuda_sim::kernels::{self, PickNoise};
use atomrl_cuda_sim::{Elem, Launch, PickState};
use candle_core::{DType, Device, Tensor};

use crate::device_pick::{chunking, draw, effective};
use crate::philox::StepNoise;

/// `pick_cuda::pick`'s two launches, emulated: tokens and log-probs of `logits [B, V]`.
fn kernel_draw<T: Elem + Default>(
    logits: &[T],
    rows: usize,
    v: usize,
    temperature: f64,
    noise: Option<(&StepNoise, &[u32])>,
) -> (Vec<u32>, Vec<f32>) {
    let (chunks, span) = chunking(rows, v, THREADS as usize);
    let inv_t = (1.0 / effective(temperature)) as f32;
    let noise = noise.map(|(n, ids)| PickNoise {
        seed: n.seed,
        row_ids: ids,
        step: n.step,
    });
    let mut parts = vec![PickState::default(); rows * chunks];
    let part = Launch::from_dims(launch_dims::pick_part(chunks, rows));
    kernels::pick_part(part, logits, noise, inv_t, v, span, &mut parts);
    let mut out = vec![0u32; 2 * rows];
    let finish = Launch::from_dims(launch_dims::pick_finish(rows));
    kernels::pick_finish(finish, logits, &parts, chunks, inv_t, v, &mut out);
    let log_probs = out[rows..].iter().map(|&w| f32::from_bits(w)).collect();
    (out[..rows].to_vec(), log_probs)
}

/// The emulated kernel against the tensor-op draw, sampled at `temperature` and greedy, on
/// `logits` stored as `dtype`.
fn check(x: &[f32], rows: usize, v: usize, temperature: f64, dtype: DType) {
    let logits = Tensor::from_vec(x.to_vec(), (rows, v), &Device::Cpu)
        .unwrap()
        .to_dtype(dtype)
        .unwrap();
    let noise = StepNoise {
        seed: 0x1234_5678_9abc,
        step: 7,
    };
    let ids: Vec<u32> = (0..rows as u32).map(|r| 3 * r + 1).collect();
    for (t, noise) in [(temperature, Some((&noise, &ids[..]))), (0.0, None)] {
        let (want_tokens, want_lp) = draw(&logits, t, noise, false).unwrap();
        let (tokens, lp) = match dtype {
            DType::F32 => kernel_draw(
                &logits.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                rows,
                v,
                t,
                noise,
            ),
            DType::BF16 => kernel_draw(
                &logits
                    .flatten_all()
                    .unwrap()
                    .to_vec1::<half::bf16>()
                    .unwrap(),
                rows,
                v,
                t,
                noise,
            ),
            _ => kernel_draw(
                &logits
                    .flatten_all()
                    .unwrap()
                    .to_vec1::<half::f16>()
                    .unwrap(),
                rows,
                v,
                t,
                noise,
            ),
        };
        assert_eq!(
            tokens, want_tokens,
            "tokens at T = {t}, {dtype:?}, {rows} × {v}"
        );
        for (a, b) in lp.iter().zip(&want_lp) {
            assert!(
                (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
                "log-prob {a} against {b} at T = {t}, {dtype:?}"
            );
        }
    }
}

#[test]
fn the_cuda_draw_is_the_tensor_op_draw_with_the_same_noise() {
    // The self-check's case: 3 rows of 5,003 logits, 4 blocks a row at 256 threads.
    let (rows, v) = (3, 5_003);
    let x = crate::kernel_check::grid_logits(rows, v);
    check(&x, rows, v, 0.7, DType::F32);
}

#[test]
fn the_cuda_draw_matches_in_bf16_and_f16() {
    let (rows, v) = (2, 3_001);
    let x = crate::kernel_check::grid_logits(rows, v);
    check(&x, rows, v, 1.3, DType::BF16);
    check(&x, rows, v, 0.9, DType::F16);
}

#[test]
fn the_cuda_draw_matches_where_a_row_is_one_block_or_many_small_ones() {
    // One row of a small vocabulary (a single chunk, most threads idle), and many rows (one
    // chunk each, the finishing launch over two blocks of 64) with a last partial chunk.
    let x: Vec<f32> = (0..77)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 9.0)
        .collect();
    check(&x, 1, 77, 1.0, DType::F32);
    let (rows, v) = (70, 1_030);
    let x = crate::kernel_check::grid_logits(rows, v);
    check(&x, rows, v, 0.5, DType::F32);
}

#[test]
fn the_layout_of_the_launches_covers_every_column_once() {
    for (rows, v) in [(1, 77), (3, 5_003), (64, 151_936), (256, 32_000)] {
        let (chunks, span) = chunking(rows, v, THREADS as usize);
        assert!(
            span % 4 == 0 && chunks * span >= v && (chunks - 1) * span < v,
            "{rows} × {v}"
        );
    }
}
