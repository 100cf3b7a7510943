//! The pure sampling step on hand-made logits: kept token sets and sampling frequencies.

#![allow(clippy::unwrap_used)] // helpers panic on failure, as the tests do

use atomrl_sample::{
    process_logits, process_logits_row, sample_from_processed, sample_tokens, RowRng,
    SamplingParams,
};
use candle_core::{Device, Tensor};

fn kept(row: &[f32], params: &SamplingParams) -> Vec<usize> {
    let mut r = row.to_vec();
    process_logits_row(&mut r, params, &[]);
    r.iter()
        .enumerate()
        .filter(|(_, l)| l.is_finite())
        .map(|(i, _)| i)
        .collect()
}

fn p(f: impl FnOnce(&mut SamplingParams)) -> SamplingParams {
    let mut x = SamplingParams::default();
    f(&mut x);
    x
}

/// Logits whose softmax is exactly `probs` (up to f32 rounding).
fn logits_of(probs: &[f64]) -> Vec<f32> {
    probs.iter().map(|q| q.ln() as f32).collect()
}

#[test]
fn top_k_keeps_the_k_largest_and_ties_at_the_kth() {
    let row = [0.5f32, 3.0, -1.0, 2.0, 2.0, 1.0];
    assert_eq!(kept(&row, &p(|x| x.top_k = 1)), vec![1]);
    assert_eq!(kept(&row, &p(|x| x.top_k = 2)), vec![1, 3, 4]); // tie at the 2nd value
    assert_eq!(kept(&row, &p(|x| x.top_k = 4)), vec![1, 3, 4, 5]);
    assert_eq!(kept(&row, &p(|x| x.top_k = 6)), vec![0, 1, 2, 3, 4, 5]);
    assert_eq!(kept(&row, &p(|x| x.top_k = 100)), vec![0, 1, 2, 3, 4, 5]);
    // Temperature does not change the kept set.
    assert_eq!(
        kept(&row, &p(|x| (x.top_k, x.temperature) = (2, 0.3))),
        vec![1, 3, 4]
    );
}

#[test]
fn top_p_keeps_the_smallest_prefix_reaching_p() {
    // probs 0.5, 0.25, 0.15, 0.1 in the order 2, 0, 3, 1.
    let row = logits_of(&[0.25, 0.1, 0.5, 0.15]);
    assert_eq!(kept(&row, &p(|x| x.top_p = 0.4)), vec![2]);
    assert_eq!(kept(&row, &p(|x| x.top_p = 0.6)), vec![0, 2]);
    assert_eq!(kept(&row, &p(|x| x.top_p = 0.8)), vec![0, 2, 3]);
    assert_eq!(kept(&row, &p(|x| x.top_p = 0.95)), vec![0, 1, 2, 3]);
    assert_eq!(kept(&row, &p(|x| x.top_p = 1e-9)), vec![2]); // the top token always stays
                                                             // top_p applies after top_k, renormalised over the k kept tokens: 0.5/0.75 = 0.667.
    assert_eq!(kept(&row, &p(|x| (x.top_k, x.top_p) = (2, 0.6))), vec![2]);
    assert_eq!(
        kept(&row, &p(|x| (x.top_k, x.top_p) = (2, 0.7))),
        vec![0, 2]
    );
    // ...and after the temperature: T = 0.5 squares the probabilities, so the top token's
    // becomes 0.25 / (0.25 + 0.0625 + 0.0225 + 0.01) = 0.7246.
    assert_eq!(
        kept(&row, &p(|x| (x.temperature, x.top_p) = (0.5, 0.72))),
        vec![2]
    );
    assert_eq!(
        kept(&row, &p(|x| (x.temperature, x.top_p) = (0.5, 0.73))),
        vec![0, 2]
    );
}

#[test]
fn min_p_keeps_tokens_above_a_fraction_of_the_top_probability() {
    let row = logits_of(&[0.25, 0.1, 0.5, 0.15]);
    assert_eq!(kept(&row, &p(|x| x.min_p = 0.49)), vec![0, 2]); // 0.25 >= 0.245
    assert_eq!(kept(&row, &p(|x| x.min_p = 0.51)), vec![2]);
    assert_eq!(kept(&row, &p(|x| x.min_p = 0.25)), vec![0, 2, 3]); // 0.15 >= 0.125 > 0.1
    assert_eq!(kept(&row, &p(|x| x.min_p = 0.19)), vec![0, 1, 2, 3]);
    assert_eq!(kept(&row, &p(|x| x.min_p = 1.0)), vec![2]);
    // min-p on the tempered distribution: T = 2 gives p ∝ sqrt(q): sqrt(0.1/0.5) = 0.447.
    assert_eq!(
        kept(&row, &p(|x| (x.temperature, x.min_p) = (2.0, 0.44))),
        vec![0, 1, 2, 3]
    );
    assert_eq!(
        kept(&row, &p(|x| (x.temperature, x.min_p) = (2.0, 0.45))),
        vec![0, 2, 3]
    );
}

#[test]
fn repetition_penalty_divides_positive_and_multiplies_negative_logits_once() {
    let mut row = vec![2.0f32, -1.0, 4.0, 1.0];
    let params = p(|x| x.repetition_penalty = 2.0);
    process_logits_row(&mut row, &params, &[0, 1, 1, 0]);
    assert_eq!(row, vec![1.0, -2.0, 4.0, 1.0]);
    // Greedy picks the argmax after the penalty.
    let greedy = p(|x| (x.repetition_penalty, x.temperature) = (4.0, 0.0));
    let logits = Tensor::new(&[[3.0f32, 2.0, 0.0]], &Device::Cpu).unwrap();
    let out = sample_tokens(&logits, &greedy, &[vec![0]], &mut [RowRng::new(0, 0)]).unwrap();
    assert_eq!(out.tokens, vec![1]);
    // The reported log-prob is the raw one (no penalty): log softmax([3, 2, 0])[1].
    let raw = (2f64 - (3f64.exp() + 2f64.exp() + 1.0).ln()) as f32;
    assert!((out.log_probs[0] - raw).abs() < 1e-6);
}

#[test]
fn process_logits_on_a_batch_and_typed_errors() {
    let logits = Tensor::new(&[[0f32, 1.0, 2.0], [5.0, 4.0, 3.0]], &Device::Cpu).unwrap();
    let out = process_logits(&logits, &p(|x| x.top_k = 1), &[])
        .unwrap()
        .to_vec2::<f32>()
        .unwrap();
    let ninf = f32::NEG_INFINITY;
    assert_eq!(out, vec![vec![ninf, ninf, 2.0], vec![5.0, ninf, ninf]]);
    let e = process_logits(&logits, &p(|x| x.min_p = 2.0), &[])
        .unwrap_err()
        .to_string();
    assert!(e.contains("`min_p`"), "{e}");
    let e = process_logits(&logits, &SamplingParams::default(), &[vec![1]])
        .unwrap_err()
        .to_string();
    assert!(e.contains("`histories`"), "{e}");
    let flat = Tensor::new(&[1f32, 2.0], &Device::Cpu).unwrap();
    assert!(process_logits(&flat, &SamplingParams::default(), &[])
        .unwrap_err()
        .to_string()
        .contains("`logits`"));
    for (bad, field) in [
        (p(|x| x.num_generations = 0), "num_generations"),
        (p(|x| x.max_new_tokens = 0), "max_new_tokens"),
        (p(|x| x.temperature = f64::NAN), "temperature"),
        (p(|x| x.top_p = 1.5), "top_p"),
        (p(|x| x.repetition_penalty = 0.0), "repetition_penalty"),
        (
            p(|x| x.stop_strings = vec![String::new()]),
            "stop_strings[0]",
        ),
    ] {
        let e = bad.validate().unwrap_err().to_string();
        assert!(e.contains(&format!("`{field}`")), "{e}");
    }
}

/// Chi-square goodness of fit of `n` draws against `expected` probabilities.
fn chi_square(counts: &[usize], expected: &[f64], n: usize) -> f64 {
    counts
        .iter()
        .zip(expected)
        .map(|(&c, &q)| (c as f64 - n as f64 * q).powi(2) / (n as f64 * q))
        .sum()
}

#[test]
fn sampling_frequencies_match_softmax_of_logits_over_temperature() {
    let logits = [1.0f32, 0.0, -0.5, 2.0, 0.3, -1.0, 1.5, 0.0];
    let n = 40_000;
    // Critical value of chi-square with 7 degrees of freedom at p = 0.001.
    let critical = 24.32;
    for t in [1.0f64, 0.7, 1.6] {
        let z: Vec<f64> = logits.iter().map(|&l| f64::from(l) / t).collect();
        let m = z.iter().copied().fold(f64::MIN, f64::max);
        let sum: f64 = z.iter().map(|x| (x - m).exp()).sum();
        let expected: Vec<f64> = z.iter().map(|x| (x - m).exp() / sum).collect();
        let params = p(|x| x.temperature = t);
        let mut rng = RowRng::new(1234, 0);
        let mut counts = vec![0usize; logits.len()];
        for _ in 0..n {
            let mut row = logits.to_vec();
            process_logits_row(&mut row, &params, &[]);
            counts[sample_from_processed(&row, false, &mut rng) as usize] += 1;
        }
        let chi = chi_square(&counts, &expected, n);
        assert!(
            chi < critical,
            "T = {t}: chi-square {chi} >= {critical}; counts {counts:?}, expected {expected:?}"
        );
        // And through the batched entry point (a different code path for T = 1).
        let batch = Tensor::new(&logits[..], &Device::Cpu)
            .unwrap()
            .unsqueeze(0)
            .unwrap()
            .repeat((n / 10, 1))
            .unwrap();
        let mut rngs: Vec<RowRng> = (0..n / 10).map(|r| RowRng::new(99, r)).collect();
        let out = sample_tokens(&batch, &params, &[], &mut rngs).unwrap();
        let mut counts = vec![0usize; logits.len()];
        out.tokens.iter().for_each(|&t| counts[t as usize] += 1);
        let chi = chi_square(&counts, &expected, n / 10);
        assert!(
            chi < critical,
            "batched T = {t}: chi-square {chi}; counts {counts:?}"
        );
    }
}

#[test]
fn filtered_sampling_frequencies_match_the_renormalised_kept_set() {
    // top_k = 3 on probs [0.4, 0.3, 0.2, 0.1] → [4/9, 3/9, 2/9, 0].
    let logits = logits_of(&[0.4, 0.3, 0.2, 0.1]);
    let params = p(|x| x.top_k = 3);
    let n = 30_000;
    let mut rng = RowRng::new(5, 0);
    let mut counts = vec![0usize; 4];
    for _ in 0..n {
        let mut row = logits.clone();
        process_logits_row(&mut row, &params, &[]);
        counts[sample_from_processed(&row, false, &mut rng) as usize] += 1;
    }
    assert_eq!(counts[3], 0);
    let chi = chi_square(&counts[..3], &[4.0 / 9.0, 3.0 / 9.0, 2.0 / 9.0], n);
    assert!(chi < 13.82, "chi-square {chi}, counts {counts:?}"); // 2 dof, p = 0.001
}

#[test]
fn same_seed_same_draws() {
    let logits = Tensor::new(&[[0.1f32, 0.2, 0.3, 0.4, 0.5]; 64], &Device::Cpu).unwrap();
    let params = SamplingParams::default();
    let draw = |seed| {
        let mut rngs: Vec<RowRng> = (0..64).map(|r| RowRng::new(seed, r)).collect();
        sample_tokens(&logits, &params, &[], &mut rngs)
            .unwrap()
            .tokens
    };
    assert_eq!(draw(3), draw(3));
    assert_ne!(draw(3), draw(4));
}
