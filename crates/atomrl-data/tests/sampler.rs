//! Epoch sampling with exact resume, and the seeded train/eval split.
#![allow(clippy::unwrap_used)]

use atomrl_data::{train_eval_split, EpochSampler, Example, SamplerState};
use proptest::prelude::*;

/// `count` batches of the given sizes (cycled).
fn batches(s: &mut EpochSampler, sizes: &[usize], count: usize) -> Vec<Vec<usize>> {
    (0..count)
        .map(|i| s.next_batch(sizes[i % sizes.len()]))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Saving the state at any point (through JSON, as a checkpoint does) and resuming gives
    /// exactly the batches an uninterrupted sampler gives.
    #[test]
    fn resume_matches_uninterrupted(
        n in 1usize..40,
        seed in any::<u64>(),
        sizes in prop::collection::vec(0usize..25, 1..4),
        before in 0usize..12,
        after in 1usize..12,
    ) {
        let mut straight = EpochSampler::new(n, seed);
        let _ = batches(&mut straight, &sizes, before);
        let expected = batches(&mut straight, &sizes[..], after);

        let mut first = EpochSampler::new(n, seed);
        let _ = batches(&mut first, &sizes, before);
        let json = serde_json::to_string(&first.state()).unwrap();
        drop(first);
        let state: SamplerState = serde_json::from_str(&json).unwrap();
        let mut resumed = EpochSampler::from_state(n, seed, &state).unwrap();
        prop_assert_eq!(resumed.epoch(), state.epoch);
        prop_assert_eq!(batches(&mut resumed, &sizes, after), expected);
        prop_assert_eq!(resumed.state(), straight.state());
    }

    /// Every epoch visits every index exactly once.
    #[test]
    fn epochs_are_permutations(n in 1usize..60, seed in any::<u64>(), bs in 1usize..17) {
        let mut s = EpochSampler::new(n, seed);
        let total = n * 3;
        let mut seen = Vec::new();
        while seen.len() < total {
            seen.extend(s.next_batch(bs));
        }
        for epoch in seen[..total].chunks(n) {
            let mut e = epoch.to_vec();
            e.sort_unstable();
            prop_assert_eq!(e, (0..n).collect::<Vec<_>>());
        }
    }
}

#[test]
fn epoch_counter_and_reshuffle() {
    let mut s = EpochSampler::new(100, 7);
    let e0: Vec<usize> = batches(&mut s, &[10], 10).concat();
    assert_eq!(s.epoch(), 1);
    assert_eq!(
        s.state(),
        SamplerState {
            epoch: 1,
            position: 0
        }
    );
    let e1: Vec<usize> = batches(&mut s, &[10], 10).concat();
    assert_ne!(e0, e1, "a new order every epoch");
    assert_ne!(e0, (0..100).collect::<Vec<_>>(), "shuffled");
    // Same seed, same orders; another seed, another order.
    let mut again = EpochSampler::new(100, 7);
    assert_eq!(batches(&mut again, &[100], 1)[0], e0);
    let mut other = EpochSampler::new(100, 8);
    assert_ne!(batches(&mut other, &[100], 1)[0], e0);
}

#[test]
fn a_batch_crosses_the_epoch_boundary() {
    let mut s = EpochSampler::new(5, 1);
    let first = s.next_batch(3);
    let second = s.next_batch(4);
    assert_eq!(
        s.state(),
        SamplerState {
            epoch: 1,
            position: 2
        }
    );
    let mut fresh = EpochSampler::new(5, 1);
    let epoch0 = fresh.next_batch(5);
    let epoch1_head = fresh.next_batch(2);
    assert_eq!(&epoch0[..3], &first[..]);
    assert_eq!(&second[..2], &epoch0[3..]);
    assert_eq!(&second[2..], &epoch1_head[..]);
}

#[test]
fn resume_rejects_a_changed_dataset() {
    let err = EpochSampler::from_state(
        10,
        0,
        &SamplerState {
            epoch: 1,
            position: 10,
        },
    )
    .unwrap_err();
    assert!(err.to_string().contains("state.position"), "{err}");
}

#[test]
fn split_is_deterministic_and_disjoint() {
    let rows: Vec<Example> = (0..200)
        .map(|i| Example::new(format!("q{i}"), i.to_string()))
        .collect();
    let (train, eval) = train_eval_split(rows.clone(), 20, 3).unwrap();
    assert_eq!((train.len(), eval.len()), (180, 20));
    let (train2, eval2) = train_eval_split(rows.clone(), 20, 3).unwrap();
    assert_eq!((&train, &eval), (&train2, &eval2));
    assert!(eval.iter().all(|e| !train.contains(e)));
    let (_, eval_other) = train_eval_split(rows.clone(), 20, 4).unwrap();
    assert_ne!(eval, eval_other);
    let err = train_eval_split(rows, 200, 3).unwrap_err();
    assert!(err.to_string().contains("eval_size"), "{err}");
}
