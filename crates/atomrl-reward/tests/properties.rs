//! Property tests: no reward panics on arbitrary Unicode input, and every output is finite and
//! within the function's declared range.

#![allow(clippy::unwrap_used)]

use atomrl_reward::{
    answer_number, answers_match, correctness_reward, correctness_score, digit_score,
    extract_answer, extract_gsm8k_ground_truth, hard_format_reward, is_hard_format, mark_reward,
    mark_score, normalize_text, overlong_penalty, soft_format_reward, whole_number,
    CorrectnessOptions, ExtractOptions, MarkOptions, Number, OverlongOptions, OverlongVariant,
    RewardContext, Tags, WeightedRewards,
};
use proptest::prelude::*;
use serde_json::json;

/// Arbitrary Unicode mixed with the fragments the parsers look for, so the interesting paths are
/// reached often.
fn text() -> impl Strategy<Value = String> {
    let fragment = prop_oneof![
        any::<String>(),
        "[0-9,. \u{00A0}\u{2009}$%+\u{2212}-]{0,12}",
        Just("<think>\n".to_string()),
        Just("\n</think>\n".to_string()),
        Just("<answer>".to_string()),
        Just("\n</answer>".to_string()),
        Just("\\boxed{".to_string()),
        Just("\\frac{".to_string()),
        Just("}".to_string()),
        Just("{".to_string()),
        Just("#### ".to_string()),
        Just("e".to_string()),
        Just("/".to_string()),
        Just(" × 10^".to_string()),
        "[０-９٠-٩𝟎-𝟗]{1,4}",
    ];
    prop::collection::vec(fragment, 0..8).prop_map(|parts| parts.concat())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn text_rewards_never_panic_and_stay_in_range(c in text(), gt in text()) {
        let strict = CorrectnessOptions::default().with_strict(true);
        for score in [
            correctness_score(&c, &gt, &CorrectnessOptions::default()),
            correctness_score(&c, &gt, &strict),
            digit_score(&c, &ExtractOptions::default()),
        ] {
            prop_assert!(score == 0.0 || score == 1.0, "{score}");
        }
        let m = mark_score(&c, &MarkOptions::default());
        prop_assert!(m.is_finite() && (0.0..=0.5).contains(&m), "{m}");
        // The parsers themselves.
        let _ = normalize_text(&c);
        let _ = extract_answer(&c, &ExtractOptions::default());
        let _ = extract_gsm8k_ground_truth(&c);
        let _ = whole_number(&c);
        let _ = answers_match(&c, &gt, 1e-6);
        if let Some(n) = answer_number(&c) {
            let v = n.to_f64();
            prop_assert!(!v.is_nan(), "{n} -> NaN");
            // The canonical form parses back to the same number.
            prop_assert_eq!(Number::parse(&n.to_string()), Some(n.clone()));
            prop_assert!(n.matches(&n, 0.0));
        }
    }

    #[test]
    fn batch_rewards_are_finite_and_in_range(cs in prop::collection::vec(text(), 0..6)) {
        let gt: Vec<String> = cs.iter().rev().cloned().collect();
        let tags = Tags::default();
        let c = correctness_reward(&cs, &gt, &CorrectnessOptions::default()).unwrap().to_vec1::<f32>().unwrap();
        let h = hard_format_reward(&cs, &tags).unwrap().to_vec1::<f32>().unwrap();
        let s = soft_format_reward(&cs, &tags).unwrap().to_vec1::<f32>().unwrap();
        let m = mark_reward(&cs, &MarkOptions::default()).unwrap().to_vec1::<f32>().unwrap();
        for v in c.iter().chain(&h).chain(&s) {
            prop_assert!(*v == 0.0 || *v == 1.0);
        }
        for v in &m {
            prop_assert!(v.is_finite() && (0.0..=0.5).contains(v));
        }
        // A hard-formatted completion is also soft-formatted.
        for (i, x) in cs.iter().enumerate() {
            if is_hard_format(x, &tags) {
                prop_assert_eq!(s[i], 1.0);
            }
        }
    }

    #[test]
    fn composition_total_is_the_weighted_sum(cs in prop::collection::vec(text(), 1..5), w1 in -3f32..3.0, w2 in -3f32..3.0) {
        let rewards = WeightedRewards::from_config(&json!([
            {"name": "correctness", "weight": w1},
            {"name": "mark", "weight": w2}
        ])).unwrap();
        let ctx = RewardContext::new().with_ground_truth(cs.clone());
        let b = rewards.score(&cs, &ctx).unwrap();
        let total = b.total.to_vec1::<f32>().unwrap();
        let per = b.per_fn.to_vec2::<f32>().unwrap();
        for (t, row) in total.iter().zip(&per) {
            prop_assert!(t.is_finite());
            prop_assert!((t - (w1 * row[0] + w2 * row[1])).abs() < 1e-5);
        }
    }

    #[test]
    fn overlong_penalty_is_in_range(
        max_len in 1usize..50_000,
        buffer_frac in 0.0f64..=1.0,
        factor in 0.0f64..10.0,
        raw in prop::collection::vec(0.0f64..=1.5, 0..20),
        trl in any::<bool>(),
    ) {
        let buffer_len = ((max_len as f64 * buffer_frac) as usize).clamp(1, max_len);
        let variant = if trl { OverlongVariant::Trl } else { OverlongVariant::Dapo };
        let opts = OverlongOptions { max_len, buffer_len, penalty_factor: factor, variant };
        let lengths: Vec<usize> = raw.iter().map(|x| (x * max_len as f64) as usize).collect();
        match overlong_penalty(&lengths, &opts) {
            Ok(p) => {
                for (v, len) in p.to_vec1::<f32>().unwrap().iter().zip(&lengths) {
                    prop_assert!(v.is_finite() && *v <= 0.0 && *v >= -(factor as f32) * (1.0 + 1e-6), "{v}");
                    if *len <= max_len - buffer_len {
                        prop_assert_eq!(*v, 0.0);
                    }
                }
            }
            Err(e) => {
                prop_assert!(!trl && lengths.iter().any(|&l| l > max_len), "unexpected error {e}");
            }
        }
    }
}
