//! SingleProcess and ThreadGroup: rank-ordered sums bit for bit, broadcasts from every root,
//! all_gather, barrier, and failures that end every member's wait instead of hanging.
#![allow(clippy::unwrap_used)]

use std::sync::mpsc;
use std::time::{Duration, Instant};

use atomrl_dist::{
    sum_in_rank_order_f32, sum_in_rank_order_f64, Collective, DistError, SingleProcess,
    ThreadGroup, ThreadMember,
};
use proptest::prelude::*;

/// Runs `f(member)` for every member of a new group of `w`, each on its own thread; results
/// in rank order.
fn run_group<T: Send>(w: usize, f: impl Fn(&ThreadMember) -> T + Sync) -> Vec<T> {
    let members = ThreadGroup::new(w).unwrap();
    let f = &f;
    std::thread::scope(|scope| {
        let handles: Vec<_> = members
            .into_iter()
            .map(|m| scope.spawn(move || f(&m)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn shard_strategy() -> impl Strategy<Value = (usize, Vec<Vec<f32>>)> {
    (1usize..=3, 0usize..64).prop_flat_map(|(w, n)| {
        let value = prop_oneof![
            -1e6f32..1e6,
            -1.0f32..1.0,
            Just(0.0f32),
            Just(-0.0f32),
            (-1e30f32..1e30),
        ];
        (
            Just(w),
            prop::collection::vec(prop::collection::vec(value, n), w),
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn all_reduce_f32_is_the_rank_ordered_sum((w, shards) in shard_strategy()) {
        let expected = bits(&sum_in_rank_order_f32(&shards));
        let results = run_group(w, |m| {
            let mut buf = shards[m.rank()].clone();
            m.all_reduce_sum_f32(&mut buf).map(|()| buf)
        });
        for r in results {
            prop_assert_eq!(bits(&r.unwrap()), expected.clone());
        }
    }

    #[test]
    fn all_reduce_f64_is_the_rank_ordered_sum((w, shards) in shard_strategy()) {
        let shards: Vec<Vec<f64>> = shards
            .iter()
            .map(|s| s.iter().map(|&x| f64::from(x) / 3.0).collect())
            .collect();
        let expected: Vec<u64> = sum_in_rank_order_f64(&shards).iter().map(|x| x.to_bits()).collect();
        let results = run_group(w, |m| {
            let mut buf = shards[m.rank()].clone();
            m.all_reduce_sum_f64(&mut buf).map(|()| buf)
        });
        for r in results {
            let got: Vec<u64> = r.unwrap().iter().map(|x| x.to_bits()).collect();
            prop_assert_eq!(got, expected.clone());
        }
    }
}

#[test]
fn rank_order_is_visible_in_f32() {
    // (1e8 + 1) - 1e8 = 0 in f32 but 1e8 + (1 - 1e8) = 8: the order matters, and the group
    // uses rank order.
    let shards = [vec![1e8f32], vec![1.0], vec![-1e8]];
    let results = run_group(3, |m| {
        let mut buf = shards[m.rank()].clone();
        m.all_reduce_sum_f32(&mut buf).map(|()| buf[0])
    });
    for r in results {
        assert_eq!(r.unwrap().to_bits(), 0.0f32.to_bits());
    }
}

#[test]
fn single_process_is_the_identity() {
    let c = SingleProcess;
    let mut f = vec![1.5f32, -2.0];
    c.all_reduce_sum_f32(&mut f).unwrap();
    c.broadcast_f32(&mut f, 0).unwrap();
    assert_eq!(f, vec![1.5, -2.0]);
    let mut d = vec![3.0f64];
    c.all_reduce_sum_f64(&mut d).unwrap();
    assert_eq!(d, vec![3.0]);
    let mut b = b"abc".to_vec();
    c.broadcast_bytes(&mut b, 0).unwrap();
    assert_eq!(b, b"abc");
    assert_eq!(c.all_gather_f64(&[1.0, 2.0]).unwrap(), vec![vec![1.0, 2.0]]);
    c.barrier().unwrap();
    let err = c.broadcast_bytes(&mut b, 1).unwrap_err();
    assert!(
        matches!(
            err,
            DistError::Invalid {
                op: "broadcast_bytes",
                rank: 0,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn broadcasts_from_every_root() {
    for w in 1..=3 {
        for root in 0..w {
            let results = run_group(w, |m| {
                let r = m.rank();
                let mut f = vec![r as f32 + 0.25; 5];
                m.broadcast_f32(&mut f, root)?;
                let mut b = if r == root {
                    format!("state of rank {r}").repeat(r + 1).into_bytes()
                } else {
                    vec![0xff; 3]
                };
                m.broadcast_bytes(&mut b, root)?;
                Ok::<_, DistError>((f, b))
            });
            for res in results {
                let (f, b) = res.unwrap();
                assert_eq!(f, vec![root as f32 + 0.25; 5], "w={w} root={root}");
                assert_eq!(
                    b,
                    format!("state of rank {root}")
                        .repeat(root + 1)
                        .into_bytes(),
                    "w={w} root={root}"
                );
            }
        }
    }
}

#[test]
fn all_gather_and_barrier() {
    for w in 1..=3 {
        let results = run_group(w, |m| {
            m.barrier()?;
            let local = vec![m.rank() as f64; m.rank() + 1];
            let g = m.all_gather_f64(&local)?;
            let bytes = m.all_gather_bytes(&vec![m.rank() as u8; m.rank()])?;
            m.barrier()?;
            Ok::<_, DistError>((g, bytes))
        });
        let expected: Vec<Vec<f64>> = (0..w).map(|r| vec![r as f64; r + 1]).collect();
        let expected_bytes: Vec<Vec<u8>> = (0..w).map(|r| vec![r as u8; r]).collect();
        for g in results {
            let (g, bytes) = g.unwrap();
            assert_eq!(g, expected);
            assert_eq!(bytes, expected_bytes);
        }
    }
}

#[test]
fn many_operations_in_sequence() {
    // The published result of one operation must not be overwritten before every member read
    // it: run many back-to-back operations with different sizes.
    let results = run_group(3, |m| {
        let mut acc = 0.0f64;
        for i in 0..500usize {
            let mut buf = vec![(m.rank() + i) as f64; 1 + i % 7];
            m.all_reduce_sum_f64(&mut buf)?;
            acc += buf[0];
        }
        Ok::<_, DistError>(acc)
    });
    let expected: f64 = (0..500usize).map(|i| (3 * i + 3) as f64).sum();
    for r in results {
        assert_eq!(r.unwrap(), expected);
    }
}

/// Member `bad` fails (error or drop) after one good barrier; every other member must get an
/// error from its next collective within a second.
fn failing_member_releases_others(w: usize, bad: usize, drop_instead: bool) {
    let members = ThreadGroup::new(w).unwrap();
    let (tx, rx) = mpsc::channel();
    let start = Instant::now();
    std::thread::scope(|scope| {
        for m in members {
            let tx = tx.clone();
            scope.spawn(move || {
                m.barrier().unwrap();
                if m.rank() == bad {
                    if drop_instead {
                        drop(m);
                    } else {
                        m.fail("reward function failed");
                        // Its own later operations fail too.
                        assert!(m.barrier().is_err());
                    }
                    return;
                }
                let mut buf = vec![1.0f32; 16];
                let res = m.all_reduce_sum_f32(&mut buf);
                tx.send((m.rank(), res)).unwrap();
            });
        }
        drop(tx);
        for _ in 0..w - 1 {
            let (rank, res) = rx
                .recv_timeout(Duration::from_secs(1))
                .expect("a member hung");
            let err = res.unwrap_err();
            match &err {
                DistError::Broken {
                    op,
                    rank: r,
                    reason,
                } => {
                    assert_eq!(*op, "all_reduce_sum_f32");
                    assert_eq!(*r, rank);
                    assert!(reason.contains(&format!("rank {bad}")), "{err}");
                }
                other => panic!("unexpected error {other}"),
            }
        }
    });
    assert!(start.elapsed() < Duration::from_secs(1));
}

#[test]
fn failing_member_makes_others_fail() {
    for w in 2..=3 {
        for bad in 0..w {
            failing_member_releases_others(w, bad, false);
            failing_member_releases_others(w, bad, true);
        }
    }
}

#[test]
fn panicking_member_makes_others_fail() {
    let mut members = ThreadGroup::new(2).unwrap();
    let m1 = members.pop().unwrap();
    let m0 = members.pop().unwrap();
    let handle = std::thread::spawn(move || {
        let _member = m1;
        panic!("boom (expected by the test)");
    });
    let res = m0.barrier();
    assert!(handle.join().is_err());
    let err = res.unwrap_err();
    assert!(err.to_string().contains("rank 1 panicked"), "{err}");
}

#[test]
fn mismatched_operations_and_lengths_are_errors() {
    let results = run_group(2, |m| {
        if m.rank() == 0 {
            m.barrier()
        } else {
            let mut b = vec![0.0f32; 2];
            m.all_reduce_sum_f32(&mut b)
        }
    });
    for r in results {
        let err = r.unwrap_err();
        assert!(err.to_string().contains("different operations"), "{err}");
    }
    let results = run_group(2, |m| {
        let mut b = vec![0.0f32; 2 + m.rank()];
        m.all_reduce_sum_f32(&mut b)
    });
    for r in results {
        let err = r.unwrap_err();
        assert!(err.to_string().contains("lengths differ"), "{err}");
    }
    let results = run_group(2, |m| {
        let mut b = vec![0.0f32; 2];
        m.broadcast_f32(&mut b, 5)
    });
    for r in results {
        assert!(r.is_err());
    }
}

#[test]
fn empty_group_is_an_error() {
    assert!(matches!(ThreadGroup::new(0), Err(DistError::Setup { .. })));
}
