//! The SFT corpus of the tiny model: the synthetic training split, part of it answered without
//! working.

use atomrl_trainer::data::{Example, SplitMix64};

/// Stream of [`SplitMix64::derive`] that picks the bare-answer rows (the data streams use 1, 2).
const BARE_STREAM: u64 = 3;

/// The completion of a demonstration that answers without working: an empty `<think>` block.
/// Still the hard format, so the format reward does not tell the two styles apart.
pub fn bare_completion(answer: &str) -> String {
    format!("<think>\n\n</think>\n<answer>\n{answer}\n</answer>")
}

/// `train` with a seeded `fraction` of its completions replaced by [`bare_completion`]s.
///
/// Why: web text, from which real models learn, holds worked solutions next to bare answers, and
/// a pretrained model imitates both; a small model that answers a two-step problem without
/// working is usually wrong. Mixing both styles in the SFT corpus gives the tiny model that
/// trait, so GRPO has to find out — from the reward alone — that working pays (and, more
/// slowly, to get the working right). Prompts and ground truths are unchanged.
pub fn with_bare_answers(mut train: Vec<Example>, fraction: f64, seed: u64) -> Vec<Example> {
    let mut rng = SplitMix64::derive(seed, BARE_STREAM);
    // Compare in integer units (1e-6) so the choice does not depend on float rounding.
    let threshold = (fraction.clamp(0.0, 1.0) * 1e6).round() as u64;
    for e in &mut train {
        if rng.below(1_000_000) < threshold {
            e.completion = Some(bare_completion(&e.ground_truth));
        }
    }
    train
}

#[cfg(test)]
mod tests {
    use super::*;
    use atomrl_trainer::data::synthetic_splits;

    #[test]
    fn the_fraction_is_respected_and_seeded() {
        let (train, _) = synthetic_splits(2000, 10, 5);
        let mixed = with_bare_answers(train.clone(), 0.6, 5);
        let bare = mixed
            .iter()
            .filter(|e| e.completion.as_deref() == Some(&bare_completion(&e.ground_truth)))
            .count();
        assert!((1100..1300).contains(&bare), "{bare}");
        assert_eq!(mixed, with_bare_answers(train.clone(), 0.6, 5));
        assert_eq!(with_bare_answers(train.clone(), 0.0, 5), train);
        assert!(mixed
            .iter()
            .zip(&train)
            .all(|(m, t)| m.prompt == t.prompt && m.ground_truth == t.ground_truth));
    }
}
