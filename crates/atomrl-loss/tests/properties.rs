//! Property tests (proptest) of the loss functions on small random batches: dims 1..=6, values
//! in −30..=30 (so log-ratios reach ±60, far beyond the ±20 clamp).

#![allow(clippy::unwrap_used)]

use approx::relative_eq;
use atomrl_loss::{
    aggregate_loss, compute_kl_penalty, compute_policy_loss, entropy_from_logits, AggOptions,
    KlEstimator, LossAgg, PolicyLossOptions, RatioLevel,
};
use candle_core::{Device, Tensor, Var};
use proptest::prelude::*;

/// A random `[N, T]` batch: log-probs, old log-probs, token advantages, row advantages, mask
/// (at least one 1), and replacement values for the masked positions.
#[derive(Debug, Clone)]
struct Batch {
    n: usize,
    t: usize,
    logp: Vec<f64>,
    old: Vec<f64>,
    adv_tok: Vec<f64>,
    adv_row: Vec<f64>,
    mask: Vec<f64>,
    junk: Vec<f64>,
}

fn batch() -> impl Strategy<Value = Batch> {
    (1usize..=6, 1usize..=6).prop_flat_map(|(n, t)| {
        let k = n * t;
        (
            prop::collection::vec(-30.0f64..=30.0, k),
            prop::collection::vec(-30.0f64..=30.0, k),
            prop::collection::vec(-3.0f64..=3.0, k),
            prop::collection::vec(-3.0f64..=3.0, n),
            prop::collection::vec(prop::bool::ANY, k),
            0..k,
            prop::collection::vec(-1e3f64..=1e3, k),
        )
            .prop_map(move |(logp, old, adv_tok, adv_row, bits, forced, junk)| {
                let mut mask: Vec<f64> = bits.iter().map(|&b| if b { 1.0 } else { 0.0 }).collect();
                mask[forced] = 1.0;
                Batch {
                    n,
                    t,
                    logp,
                    old,
                    adv_tok,
                    adv_row,
                    mask,
                    junk,
                }
            })
    })
}

fn options() -> impl Strategy<Value = PolicyLossOptions> {
    (
        0.0f64..=0.5,
        0.0f64..=0.5,
        prop::option::of(1.01f64..=10.0),
        prop::sample::select(LossAgg::NAMES.to_vec()),
        prop::option::of(1usize..=12),
        prop::bool::ANY,
    )
        .prop_map(
            |(clip_low, clip_high, c, mode, max_len, seq)| PolicyLossOptions {
                clip_low,
                clip_high,
                clip_ratio_c: c,
                ratio_level: if seq {
                    RatioLevel::Sequence
                } else {
                    RatioLevel::Token
                },
                agg: AggOptions {
                    max_len,
                    ..AggOptions::new(mode.parse().expect("mode"))
                },
            },
        )
}

fn t2(v: &[f64], n: usize, t: usize) -> Tensor {
    Tensor::from_vec(v.to_vec(), (n, t), &Device::Cpu).expect("tensor")
}

fn t1(v: &[f64]) -> Tensor {
    Tensor::from_vec(v.to_vec(), v.len(), &Device::Cpu).expect("tensor")
}

fn scalar(t: &Tensor) -> f64 {
    t.to_scalar::<f64>().expect("scalar")
}

fn flat(t: &Tensor) -> Vec<f64> {
    t.flatten_all()
        .and_then(|f| f.to_vec1::<f64>())
        .expect("vec")
}

/// `v` with its masked-out positions replaced by `junk` (and a NaN at the first one).
fn scramble(v: &[f64], mask: &[f64], junk: &[f64]) -> Vec<f64> {
    let mut first = true;
    v.iter()
        .zip(mask)
        .zip(junk)
        .map(|((&x, &m), &j)| {
            if m != 0.0 {
                x
            } else if std::mem::take(&mut first) {
                f64::NAN
            } else {
                j
            }
        })
        .collect()
}

/// Loss, per-token loss, statistics and gradient w.r.t. log_probs.
fn run(
    b: &Batch,
    logp: &[f64],
    old: &[f64],
    adv: &Tensor,
    o: &PolicyLossOptions,
) -> (f64, Vec<f64>, Vec<f64>, Vec<f64>) {
    let var = Var::from_tensor(&t2(logp, b.n, b.t)).expect("var");
    let out = compute_policy_loss(
        var.as_tensor(),
        &t2(old, b.n, b.t),
        adv,
        &t2(&b.mask, b.n, b.t),
        o,
    )
    .expect("loss");
    let grads = out.loss.backward().expect("backward");
    let g = flat(grads.get(var.as_tensor()).expect("gradient"));
    let stats = vec![
        out.clip_frac,
        out.clip_frac_low,
        out.clip_frac_high,
        out.clip_frac_lower.unwrap_or(-1.0),
        out.ppo_kl,
        out.ratio_mean,
        out.ratio_max,
    ];
    (scalar(&out.loss), flat(&out.per_token_loss), stats, g)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn masked_positions_change_nothing(b in batch(), o in options()) {
        let adv = t2(&b.adv_tok, b.n, b.t);
        let reference = run(&b, &b.logp, &b.old, &adv, &o);
        let adv2 = t2(&scramble(&b.adv_tok, &b.mask, &b.junk), b.n, b.t);
        let logp2 = scramble(&b.logp, &b.mask, &b.junk);
        let old2 = scramble(&b.old, &b.mask, &b.junk);
        let other = run(&b, &logp2, &old2, &adv2, &o);
        prop_assert_eq!(reference.0.to_bits(), other.0.to_bits());
        prop_assert_eq!(&reference.1, &other.1);
        prop_assert_eq!(&reference.2, &other.2);
        prop_assert_eq!(&reference.3, &other.3);
        for (g, m) in reference.3.iter().zip(&b.mask) {
            prop_assert!(g.is_finite());
            if *m == 0.0 {
                prop_assert_eq!(*g, 0.0);
            }
        }

        let refp = t2(&b.old, b.n, b.t);
        let kl = compute_kl_penalty(&t2(&b.logp, b.n, b.t), &refp, &t2(&b.mask, b.n, b.t), KlEstimator::K3).expect("kl");
        let kl2 = compute_kl_penalty(&t2(&logp2, b.n, b.t), &t2(&old2, b.n, b.t), &t2(&b.mask, b.n, b.t), KlEstimator::K3).expect("kl");
        prop_assert_eq!(flat(&kl.kl), flat(&kl2.kl));
    }

    #[test]
    fn on_policy_loss_is_minus_the_aggregated_advantage(b in batch(), o in options(), per_token in prop::bool::ANY) {
        let adv = if per_token { t2(&b.adv_tok, b.n, b.t) } else { t1(&b.adv_row) };
        let (loss, per_tok, stats, _) = run(&b, &b.logp, &b.logp, &adv, &o);
        let adv_nt = adv.reshape((b.n, ())).and_then(|a| a.broadcast_as((b.n, b.t))).expect("adv");
        let expected = -scalar(&aggregate_loss(&adv_nt.contiguous().expect("c"), &t2(&b.mask, b.n, b.t), &o.agg).expect("agg"));
        prop_assert!(relative_eq!(loss, expected, epsilon = 1e-12, max_relative = 1e-12), "{loss} vs {expected}");
        let a = flat(&adv_nt.contiguous().expect("c"));
        for ((l, a), m) in per_tok.iter().zip(&a).zip(&b.mask) {
            prop_assert_eq!(*l, if *m == 0.0 { 0.0 } else { -a });
        }
        prop_assert_eq!(stats[0], 0.0); // nothing clipped
        prop_assert_eq!(stats[4], 0.0); // ppo_kl
        prop_assert_eq!(stats[5], 1.0); // ratio_mean
        prop_assert_eq!(stats[6], 1.0); // ratio_max
    }

    #[test]
    fn statistics_are_fractions_and_outputs_finite(b in batch(), o in options(), per_token in prop::bool::ANY) {
        let adv = if per_token { t2(&b.adv_tok, b.n, b.t) } else { t1(&b.adv_row) };
        let (loss, per_tok, stats, grad) = run(&b, &b.logp, &b.old, &adv, &o);
        prop_assert!(loss.is_finite());
        prop_assert!(per_tok.iter().chain(&grad).chain(&stats).all(|x| x.is_finite()));
        for &f in &stats[..3] {
            prop_assert!((0.0..=1.0).contains(&f), "{stats:?}");
        }
        prop_assert!(relative_eq!(stats[0], stats[1] + stats[2], epsilon = 1e-12));
        match o.clip_ratio_c {
            Some(_) => prop_assert!((0.0..=1.0).contains(&stats[3])),
            None => prop_assert_eq!(stats[3], -1.0),
        }
        prop_assert!(stats[6] <= (20f64).exp() * (1.0 + 1e-12) && stats[6] > 0.0);

        let mask = t2(&b.mask, b.n, b.t);
        for est in KlEstimator::NAMES {
            let lp = Var::from_tensor(&t2(&b.logp, b.n, b.t)).expect("var");
            let kl = compute_kl_penalty(lp.as_tensor(), &t2(&b.old, b.n, b.t), &mask, est.parse().expect("est")).expect("kl");
            prop_assert!(flat(&kl.kl).iter().all(|x| x.is_finite()), "{est}");
            let g = kl.kl_mean.backward().expect("backward");
            prop_assert!(flat(g.get(lp.as_tensor()).expect("grad")).iter().all(|x| x.is_finite()), "{est}");
            if est != "k1" {
                prop_assert!(scalar(&kl.kl_mean) >= 0.0, "{est}");
            }
        }
    }

    #[test]
    fn micro_batches_with_global_normaliser_sum_to_the_full_batch(b in batch(), o in options(), split in 0usize..6) {
        prop_assume!(b.n >= 2);
        let split = 1 + split % (b.n - 1);
        let rows = |v: &[f64], a: usize, k: usize| v[a * b.t..(a + k) * b.t].to_vec();
        let part_valid = |a: usize, k: usize| rows(&b.mask, a, k).iter().sum::<f64>() > 0.0;
        prop_assume!(part_valid(0, split) && part_valid(split, b.n - split));
        let full = run(&b, &b.logp, &b.old, &t1(&b.adv_row), &o);
        let global = PolicyLossOptions {
            agg: AggOptions {
                global_tokens: Some(b.mask.iter().sum()),
                global_seqs: Some(b.n as f64),
                max_len: Some(o.agg.max_len.unwrap_or(b.t)),
                ..o.agg
            },
            ..o
        };
        let mut loss_sum = 0.0;
        let mut grad = Vec::new();
        for (a, k) in [(0, split), (split, b.n - split)] {
            let part = Batch {
                n: k,
                mask: rows(&b.mask, a, k),
                adv_row: b.adv_row[a..a + k].to_vec(),
                ..b.clone()
            };
            let (l, _, _, g) = run(&part, &rows(&b.logp, a, k), &rows(&b.old, a, k), &t1(&part.adv_row), &global);
            loss_sum += l;
            grad.extend(g);
        }
        prop_assert!(relative_eq!(loss_sum, full.0, epsilon = 1e-9, max_relative = 1e-9), "{loss_sum} vs {}", full.0);
        for (x, y) in grad.iter().zip(&full.3) {
            prop_assert!(relative_eq!(*x, *y, epsilon = 1e-12, max_relative = 1e-9));
        }
    }

    #[test]
    fn entropy_is_between_zero_and_log_v(n in 1usize..=4, t in 1usize..=4, v in 1usize..=6, seed in prop::collection::vec(-30.0f64..=30.0, 96)) {
        let logits = Tensor::from_vec(seed[..n * t * v].to_vec(), (n, t, v), &Device::Cpu).expect("logits");
        let mask = Tensor::ones((n, t), candle_core::DType::F64, &Device::Cpu).expect("mask");
        let h = flat(&entropy_from_logits(&logits, &mask).expect("entropy"));
        for x in h {
            prop_assert!(x >= -1e-12 && x <= (v as f64).ln() + 1e-12, "{x}");
        }
    }
}

#[test]
fn token_mean_without_global_normaliser_is_not_additive() {
    // TRL issue #3021: averaging per-micro-batch token means weighs short micro-batches more.
    let l = Tensor::new(&[[1.0f64, 1.0, 1.0], [4.0, 0.0, 0.0]], &Device::Cpu).expect("t");
    let m = Tensor::new(&[[1.0f64, 1.0, 1.0], [1.0, 0.0, 0.0]], &Device::Cpu).expect("t");
    let agg = |a, k, o: &AggOptions| {
        scalar(
            &aggregate_loss(
                &l.narrow(0, a, k).expect("n"),
                &m.narrow(0, a, k).expect("n"),
                o,
            )
            .expect("agg"),
        )
    };
    let full = scalar(&aggregate_loss(&l, &m, &AggOptions::default()).expect("agg"));
    let local = (agg(0, 1, &AggOptions::default()) + agg(1, 1, &AggOptions::default())) / 2.0;
    let global = AggOptions {
        global_tokens: Some(4.0),
        ..AggOptions::default()
    };
    assert_eq!(full, 7.0 / 4.0);
    assert_eq!(local, 2.5);
    assert_eq!(agg(0, 1, &global) + agg(1, 1, &global), full);
}
