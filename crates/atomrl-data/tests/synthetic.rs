//! Synthetic word problems: determinism, checked arithmetic, template coverage, disjoint
//! splits, and completions that the reward functions score as perfect.
#![allow(clippy::unwrap_used)]

use std::collections::HashSet;

use atomrl_data::{
    synthetic_problems, synthetic_splits, synthetic_splits_with, synthetic_word_problems, Example,
    Op, SyntheticConfig, SYNTHETIC_TEMPLATES,
};
use atomrl_reward::{correctness_score, is_hard_format, CorrectnessOptions, Tags};

fn cfg(num_examples: usize, seed: u64) -> SyntheticConfig {
    SyntheticConfig {
        num_examples,
        seed,
        ..Default::default()
    }
}

/// The reasoning lines of a completion, parsed as `(a, op, b, c)` from `a op b=c`.
fn parse_steps(completion: &str) -> Vec<(i64, Op, i64, i64)> {
    let think = completion
        .strip_prefix("<think>\n")
        .and_then(|r| r.split("\n</think>\n").next())
        .unwrap();
    think
        .lines()
        .map(|line| {
            let (lhs, c) = line.split_once('=').unwrap();
            // Operands are non-negative, so the operator is the first non-digit.
            let at = lhs.find(|ch: char| !ch.is_ascii_digit()).unwrap();
            let op = Op::from_symbol(lhs[at..].chars().next().unwrap()).unwrap();
            let (a, b) = (&lhs[..at], &lhs[at + 1..]);
            (
                a.parse().unwrap(),
                op,
                b.parse().unwrap(),
                c.parse().unwrap(),
            )
        })
        .collect()
}

/// Tokens with a digit-per-token tokenizer: each digit, operator, `=` and newline is one
/// token, each tag one token.
fn completion_tokens(c: &str) -> usize {
    let tags = ["<think>", "</think>", "<answer>", "</answer>"];
    let rest = tags.iter().fold(c.to_string(), |s, t| s.replace(t, ""));
    4 + rest
        .chars()
        .filter(|ch| !ch.is_whitespace() || *ch == '\n')
        .count()
}

#[test]
fn deterministic_for_a_seed() {
    assert_eq!(
        synthetic_word_problems(&cfg(300, 5)),
        synthetic_word_problems(&cfg(300, 5))
    );
    assert_ne!(
        synthetic_word_problems(&cfg(50, 5)),
        synthetic_word_problems(&cfg(50, 6))
    );
    // A longer run starts with the shorter one.
    assert_eq!(
        synthetic_word_problems(&cfg(500, 5))[..300],
        synthetic_word_problems(&cfg(300, 5))[..]
    );
}

#[test]
fn stated_steps_recompute_the_ground_truth() {
    for seed in 0..5 {
        for ex in synthetic_word_problems(&cfg(1000, seed)) {
            let completion = ex.completion.as_deref().unwrap();
            let steps = parse_steps(completion);
            assert!((1..=3).contains(&steps.len()), "{completion}");
            for &(a, op, b, c) in &steps {
                assert_eq!(op.apply(a, b), Some(c), "{}\n{completion}", ex.prompt);
            }
            let answer = steps.last().unwrap().3;
            assert_eq!(ex.ground_truth, answer.to_string());
            assert!(answer >= 0);
            let q = ex.prompt.as_text().unwrap();
            assert!(q.ends_with('?') && !q.contains("  "), "{q}");
        }
    }
}

#[test]
fn every_template_and_op_count_is_used() {
    let problems = synthetic_problems(&cfg(2000, 11));
    let templates: HashSet<&str> = problems.iter().map(|p| p.template).collect();
    assert_eq!(templates.len(), SYNTHETIC_TEMPLATES.len(), "{templates:?}");
    assert!(SYNTHETIC_TEMPLATES.len() >= 10);
    for ops in 1..=3 {
        assert!(problems.iter().any(|p| p.steps.len() == ops));
    }
    let ops_used: HashSet<Op> = problems
        .iter()
        .flat_map(|p| p.steps.iter().map(|s| s.op))
        .collect();
    assert_eq!(ops_used.len(), 4, "+, -, *, / all appear");
    // Each (template, op count) pair appears, i.e. every template supports 1 to 3 steps.
    let pairs: HashSet<(&str, usize)> = problems
        .iter()
        .map(|p| (p.template, p.steps.len()))
        .collect();
    assert_eq!(pairs.len(), SYNTHETIC_TEMPLATES.len() * 3);
}

#[test]
fn op_range_is_respected() {
    let c = SyntheticConfig {
        num_examples: 300,
        min_ops: 1,
        max_ops: 2,
        ..Default::default()
    };
    assert!(synthetic_problems(&c)
        .iter()
        .all(|p| (1..=2).contains(&p.steps.len())));
    let c = SyntheticConfig {
        min_ops: 3,
        max_ops: 3,
        ..c
    };
    assert!(synthetic_problems(&c).iter().all(|p| p.steps.len() == 3));
}

#[test]
fn completions_score_perfectly_with_the_rewards() {
    let tags = Tags::default();
    let strict = CorrectnessOptions::default().with_strict(true);
    for ex in synthetic_word_problems(&cfg(1000, 2)) {
        let c = ex.completion.as_deref().unwrap();
        assert!(is_hard_format(c, &tags), "{c:?}");
        assert_eq!(
            correctness_score(c, &ex.ground_truth, &Default::default()),
            1.0,
            "{c:?}"
        );
        assert_eq!(correctness_score(c, &ex.ground_truth, &strict), 1.0);
    }
}

#[test]
fn completions_are_short() {
    let rows = synthetic_word_problems(&cfg(2000, 3));
    let lens: Vec<usize> = rows
        .iter()
        .map(|e| completion_tokens(e.completion.as_deref().unwrap()))
        .collect();
    let max = *lens.iter().max().unwrap();
    let mean = lens.iter().sum::<usize>() as f64 / lens.len() as f64;
    assert!(max <= 48, "longest completion {max} tokens");
    assert!(
        (15.0..=40.0).contains(&mean),
        "mean completion {mean} tokens"
    );
    let words = rows
        .iter()
        .map(|e| e.prompt.as_text().unwrap().split_whitespace().count());
    assert!(words.max().unwrap() <= 45);
}

#[test]
fn splits_are_disjoint_and_stable() {
    let (train, eval) = synthetic_splits(3000, 300, 9);
    assert_eq!((train.len(), eval.len()), (3000, 300));
    let question = |e: &Example| e.prompt.as_text().unwrap().to_string();
    let train_q: HashSet<String> = train.iter().map(question).collect();
    let eval_q: HashSet<String> = eval.iter().map(question).collect();
    assert_eq!(train_q.len(), 3000, "no repeats within train");
    assert_eq!(eval_q.len(), 300, "no repeats within eval");
    assert!(train_q.is_disjoint(&eval_q));
    // The eval set does not depend on the train size; everything depends on the seed.
    assert_eq!(synthetic_splits(10, 300, 9).1, eval);
    assert_eq!(synthetic_splits(3000, 300, 9), (train, eval.clone()));
    assert_ne!(synthetic_splits(10, 300, 10).1, eval);
}

#[test]
fn tiny_value_space_gives_short_sets_instead_of_looping() {
    // 1-step problems at the smallest max_value still have many distinct questions, so ask for
    // a lot and only check termination and disjointness.
    let c = SyntheticConfig {
        min_ops: 1,
        max_ops: 1,
        max_value: 10,
        ..Default::default()
    };
    let (train, eval) = synthetic_splits_with(&c, 5000, 100);
    assert_eq!(eval.len(), 100);
    assert!(train.len() <= 5000);
    let eval_q: HashSet<_> = eval.iter().map(|e| e.prompt.clone()).collect();
    assert!(train.iter().all(|e| !eval_q.contains(&e.prompt)));
}
