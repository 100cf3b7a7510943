//! With one compute thread the gradient norm starts no thread: rayon's global pool, once
//! started by it, held a malloc arena meant for a data-parallel worker for the rest of the run
//! (`atomrl_core::allocator::arenas_for_workers`). One test in its own process, so that no
//! other test starts threads meanwhile.
#![allow(clippy::unwrap_used)]

use atomrl_optim::Gradients;
use candle_core::{Device, Var};

/// The threads of this process (Linux's `/proc/self/task`).
fn threads() -> Option<usize> {
    std::fs::read_dir("/proc/self/task").ok().map(|d| d.count())
}

#[test]
fn the_norm_of_a_one_thread_plan_starts_no_thread() {
    // Before any tensor work: candle and rayon read it when their pools start.
    std::env::set_var("RAYON_NUM_THREADS", "1");
    assert_eq!(candle_core::utils::get_num_threads(), 1);
    let w = Var::new(&[3f32, 4.0], &Device::Cpu).unwrap();
    let b = Var::new(&[12f32], &Device::Cpu).unwrap();
    let params = [("w".to_string(), w.clone()), ("b".to_string(), b.clone())];
    let loss = ((w.as_tensor().sqr().unwrap().sum_all().unwrap() * 0.5).unwrap()
        + (b.as_tensor().sqr().unwrap().sum_all().unwrap() * 0.5).unwrap())
    .unwrap();
    let store = loss.backward().unwrap();
    let mut grads = Gradients::new();
    grads.accumulate(&store, &params).unwrap();
    let before = threads();
    // The gradients are w and b themselves: sqrt(9 + 16 + 144) = 13.
    assert_eq!(grads.global_norm().unwrap(), 13.0);
    assert_eq!(threads(), before, "the norm started a thread");
}
