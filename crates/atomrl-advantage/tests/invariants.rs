//! Property tests of the advantage estimators' invariants.

#![allow(clippy::unwrap_used)]

use approx::relative_eq;
use atomrl_advantage::{compute_advantages, filter_groups, AdvantageMode, DEFAULT_EPS};
use candle_core::{Device, Tensor};
use proptest::prelude::*;

/// Rewards of `groups` groups of `g` completions, bounded like real rewards; some groups are
/// made flat so the exact-zero rule is exercised.
fn grouped_rewards() -> impl Strategy<Value = (Vec<f32>, usize)> {
    (2usize..=8, 1usize..=6).prop_flat_map(|(g, groups)| {
        (
            prop::collection::vec(prop::collection::vec(-100f32..100.0, g), groups),
            prop::collection::vec(any::<bool>(), groups),
        )
            .prop_map(move |(rows, flat)| {
                let r = rows
                    .into_iter()
                    .zip(flat)
                    .flat_map(|(row, f)| if f { vec![row[0]; g] } else { row })
                    .collect();
                (r, g)
            })
    })
}

fn advantages(r: &[f32], g: usize, mode: AdvantageMode) -> Vec<f64> {
    let t = Tensor::new(r, &Device::Cpu).unwrap();
    let out = compute_advantages(&t, g, mode, DEFAULT_EPS).unwrap();
    out.advantages
        .to_dtype(candle_core::DType::F64)
        .unwrap()
        .to_vec1()
        .unwrap()
}

const CENTRING: [AdvantageMode; 5] = [
    AdvantageMode::Grpo,
    AdvantageMode::GrpoNoStd,
    AdvantageMode::Batch,
    AdvantageMode::Rloo,
    AdvantageMode::ReinforcePp,
];

proptest! {
    #[test]
    fn group_sums_are_zero((r, g) in grouped_rewards()) {
        for mode in [AdvantageMode::Grpo, AdvantageMode::GrpoNoStd, AdvantageMode::Rloo] {
            let a = advantages(&r, g, mode);
            for group in a.chunks(g) {
                let scale = group.iter().map(|x| x.abs()).fold(1.0, f64::max);
                prop_assert!(group.iter().sum::<f64>().abs() <= 1e-5 * scale, "{mode}: {group:?}");
            }
        }
    }

    #[test]
    fn flat_groups_are_exactly_zero((r, g) in grouped_rewards()) {
        for mode in CENTRING {
            let a = advantages(&r, g, mode);
            for (rg, ag) in r.chunks(g).zip(a.chunks(g)) {
                if rg.iter().all(|&x| x == rg[0]) {
                    prop_assert!(ag.iter().all(|&x| x == 0.0), "{mode}: {ag:?}");
                }
            }
        }
    }

    #[test]
    fn shifting_one_group_changes_nothing_in_group_normalised_modes(
        (r, g) in grouped_rewards(), shift in -50f32..50.0, which in 0usize..6,
    ) {
        let groups = r.len() / g;
        let k = which % groups;
        let mut shifted = r.clone();
        shifted[k * g..(k + 1) * g].iter_mut().for_each(|x| *x += shift);
        for mode in [AdvantageMode::Grpo, AdvantageMode::GrpoNoStd, AdvantageMode::Rloo] {
            let (a, b) = (advantages(&r, g, mode), advantages(&shifted, g, mode));
            for (x, y) in a.iter().zip(&b) {
                // f32 rounding of the shifted inputs bounds the agreement.
                prop_assert!(relative_eq!(x, y, epsilon = 2e-3, max_relative = 1e-3), "{mode}: {x} vs {y}");
            }
        }
    }

    #[test]
    fn grpo_is_scale_invariant((r, g) in grouped_rewards(), scale in 0.5f32..20.0) {
        let scaled: Vec<f32> = r.iter().map(|x| x * scale).collect();
        let (a, b) = (advantages(&r, g, AdvantageMode::Grpo), advantages(&scaled, g, AdvantageMode::Grpo));
        for (x, y) in a.iter().zip(&b) {
            prop_assert!(relative_eq!(x, y, epsilon = 1e-3, max_relative = 1e-3), "{x} vs {y}");
        }
    }

    #[test]
    fn raw_is_the_identity((r, g) in grouped_rewards()) {
        let a = advantages(&r, g, AdvantageMode::Raw);
        let expected: Vec<f64> = r.iter().map(|&x| x as f64).collect();
        prop_assert_eq!(a, expected);
    }

    #[test]
    fn filter_keeps_exactly_the_groups_with_spread((r, g) in grouped_rewards()) {
        let t = Tensor::new(r.as_slice(), &Device::Cpu).unwrap();
        let f = filter_groups(&t, g).unwrap();
        let expected: Vec<usize> = r
            .chunks(g)
            .enumerate()
            .filter(|(_, c)| c.iter().any(|&x| x != c[0]))
            .map(|(i, _)| i)
            .collect();
        prop_assert_eq!(&f.kept_groups, &expected);
        prop_assert_eq!(f.num_kept + f.num_dropped, r.len() / g);
    }
}
