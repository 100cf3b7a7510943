//! A table of tricky completion / ground-truth pairs with the expected score of every text
//! reward (default options). `strict` correctness is checked on every row as
//! `correctness · hard_format`.

#![allow(clippy::unwrap_used)]

use atomrl_reward::{
    correctness_score, digit_score, is_hard_format, is_soft_format, mark_score, CorrectnessOptions,
    ExtractOptions, MarkOptions, Tags,
};

/// A well-formatted completion with reasoning `x` and the given answer line.
macro_rules! fmt {
    ($a:literal) => {
        concat!("<think>\nx\n</think>\n<answer>\n", $a, "\n</answer>")
    };
}

/// (completion, ground truth, correctness, digit, hard_format, soft_format, mark)
#[rustfmt::skip]
const ROWS: &[(&str, &str, f32, f32, f32, f32, f32)] = &[
    // --- thousands separators and currency
    (fmt!("1,000"), "1000", 1.0, 1.0, 1.0, 1.0, 0.5),
    ("<answer>$1,234.56</answer>", "1234.56", 1.0, 1.0, 0.0, 0.0, 0.0),
    ("The total is $12.", "12", 1.0, 1.0, 0.0, 0.0, 0.0),
    ("It costs $ 5", "5", 1.0, 1.0, 0.0, 0.0, 0.0),
    ("1,000,000", "1000000", 1.0, 1.0, 0.0, 0.0, 0.0),
    ("1,00", "100", 0.0, 1.0, 0.0, 0.0, 0.0),
    ("12,345.6789", "12345.6789", 1.0, 1.0, 0.0, 0.0, 0.0),
    ("the answer is 1 000", "1000", 0.0, 1.0, 0.0, 0.0, 0.0),
    ("<answer>1 000</answer>", "1000", 1.0, 1.0, 0.0, 0.0, 0.0),
    ("Total: 5,000 dollars", "5000", 1.0, 1.0, 0.0, 0.0, 0.0),
    ("<answer>12,000</answer>", "12", 0.0, 1.0, 0.0, 0.0, 0.0),
    // --- signs
    ("<answer>-5</answer>", "-5", 1.0, 1.0, 0.0, 0.0, 0.0),
    ("<answer>\u{2212}5</answer>", "-5", 1.0, 1.0, 0.0, 0.0, 0.0),
    ("<answer>5</answer>", "-5", 0.0, 1.0, 0.0, 0.0, 0.0),
    ("The result is 3-8=-5", "-5", 1.0, 1.0, 0.0, 0.0, 0.0),
    ("<answer>-0</answer>", "0", 1.0, 1.0, 0.0, 0.0, 0.0),
    ("<answer>+7</answer>", "7", 1.0, 1.0, 0.0, 0.0, 0.0),
    ("<answer>-$5</answer>", "-5", 1.0, 1.0, 0.0, 0.0, 0.0),
    // --- decimals and tolerance
    (fmt!("12.00"), "12", 1.0, 1.0, 1.0, 1.0, 0.5),
    ("<answer>12.0</answer>", "12", 1.0, 1.0, 0.0, 0.0, 0.0),
    ("<answer>0.5</answer>", ".5", 1.0, 1.0, 0.0, 0.0, 0.0),
    ("<answer>3.14159</answer>", "3.14", 0.0, 1.0, 0.0, 0.0, 0.0),
    ("<answer>2.5000001</answer>", "2.5", 1.0, 1.0, 0.0, 0.0, 0.0),
    ("<answer>2.50001</answer>", "2.5", 0.0, 1.0, 0.0, 0.0, 0.0),
    ("<answer>0.1</answer>", "0.10", 1.0, 1.0, 0.0, 0.0, 0.0),
    // --- fractions
    ("<answer>1/2</answer>", "0.5", 1.0, 1.0, 0.0, 0.0, 0.0),
    ("<answer>\\frac{1}{2}</answer>", "1/2", 1.0, 1.0, 0.0, 0.0, 0.0),
    ("<answer>\\dfrac{3}{4}</answer>", "0.75", 1.0, 1.0, 0.0, 0.0, 0.0),
    ("<answer>2/4</answer>", "1/2", 1.0, 1.0, 0.0, 0.0, 0.0),
    ("<answer>1/3</answer>", "0.333", 0.0, 1.0, 0.0, 0.0, 0.0),
    ("<answer>0.3333333</answer>", "1/3", 1.0, 1.0, 0.0, 0.0, 0.0),
    ("<answer>-\\frac{1}{2}</answer>", "-0.5", 1.0, 1.0, 0.0, 0.0, 0.0),
    ("<answer>1/0</answer>", "0", 0.0, 0.0, 0.0, 0.0, 0.0),
    ("so $\\boxed{\\frac{7}{2}}$", "3.5", 1.0, 1.0, 0.0, 0.0, 0.0),
    ("<answer>\\frac12</answer>", "0.5", 1.0, 1.0, 0.0, 0.0, 0.0),
    // --- several numbers in the text
    ("First 3, then 5, finally 8", "8", 1.0, 1.0, 0.0, 0.0, 0.0),
    ("First 3, then 5, finally 8", "3", 0.0, 1.0, 0.0, 0.0, 0.0),
    ("<answer>12</answer> Actually 13", "12", 1.0, 1.0, 0.0, 0.0, 0.0),
    ("<answer>x = 12</answer>", "12", 1.0, 0.0, 0.0, 0.0, 0.0),
    ("<answer>12 apples</answer>", "12", 1.0, 1.0, 0.0, 0.0, 0.0),
    ("<answer>5 or 6</answer>", "6", 1.0, 0.0, 0.0, 0.0, 0.0),
    ("Step 1: 48/2 = 24. Step 2: 48 + 24 = 72.", "72", 1.0, 1.0, 0.0, 0.0, 0.0),
    ("48 + 24 = 72\n#### 72", "72", 1.0, 1.0, 0.0, 0.0, 0.0),
    ("blah\n#### 1,234\nmore 5", "1234", 1.0, 1.0, 0.0, 0.0, 0.0),
    ("The answer is 72.\n#### 70", "72", 0.0, 1.0, 0.0, 0.0, 0.0),
    // --- missing, nested, duplicated, misplaced tags
    ("<think>\nx\n</think>\n<answer>\n12\n", "12", 1.0, 1.0, 0.0, 0.0, 0.375),
    ("<answer>\n12\n</answer>", "12", 1.0, 1.0, 0.0, 0.0, 0.125),
    ("<think>\nx\n</think>\n<answer>\n<answer>\n12\n</answer>\n</answer>", "12", 1.0, 1.0, 0.0, 1.0, 0.375),
    ("<think>\nx\n</think>\n<answer>\n1\n</answer>\n<answer>\n2\n</answer>", "2", 1.0, 1.0, 0.0, 1.0, 0.25),
    ("<think>\nx\n</think>\n<answer>\n1\n</answer>\n<answer>\n2\n</answer>", "1", 0.0, 1.0, 0.0, 1.0, 0.25),
    ("<answer>7</answer><think>\nx\n</think>", "7", 1.0, 1.0, 0.0, 0.0, 0.125),
    ("<ANSWER>7</ANSWER>", "7", 1.0, 1.0, 0.0, 0.0, 0.0),
    ("<answer></answer>", "0", 0.0, 0.0, 0.0, 0.0, 0.0),
    ("<answer>  </answer> 42", "42", 1.0, 1.0, 0.0, 0.0, 0.0),
    ("<think>x</think><answer>9</answer>", "9", 1.0, 1.0, 0.0, 1.0, 0.0),
    ("Sure!\n<think>\nx\n</think>\n<answer>\n9\n</answer>", "9", 1.0, 1.0, 0.0, 1.0, 0.5),
    ("<think>\n\n</think>\n<answer>\n\n</answer>", "0", 0.0, 0.0, 1.0, 1.0, 0.5),
    // --- text after </answer>
    (concat!(fmt!("12"), "\nI hope this helps."), "12", 1.0, 1.0, 0.0, 1.0, 0.482),
    (concat!(fmt!("12"), "\n"), "12", 1.0, 1.0, 0.0, 1.0, 0.5),
    (concat!(fmt!("12"), " 13"), "12", 1.0, 1.0, 0.0, 1.0, 0.498),
    (concat!(fmt!("12"), "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"), "12", 1.0, 1.0, 0.0, 1.0, 0.375),
    // --- unicode digits and spaces
    ("<answer>１２</answer>", "12", 1.0, 1.0, 0.0, 0.0, 0.0),
    ("<answer>١٢</answer>", "12", 1.0, 1.0, 0.0, 0.0, 0.0),
    ("<answer>१०</answer>", "10", 1.0, 1.0, 0.0, 0.0, 0.0),
    ("the answer is 𝟒𝟐", "42", 1.0, 1.0, 0.0, 0.0, 0.0),
    ("<answer>1\u{00A0}000</answer>", "1000", 1.0, 1.0, 0.0, 0.0, 0.0),
    ("<answer>1\u{202F}234\u{202F}567</answer>", "1234567", 1.0, 1.0, 0.0, 0.0, 0.0),
    ("about 1\u{2009}000 people", "1000", 1.0, 1.0, 0.0, 0.0, 0.0),
    ("<answer>12</answer>", "１２", 1.0, 1.0, 0.0, 0.0, 0.0),
    ("<answer>１，２３４．５</answer>", "1234.5", 1.0, 1.0, 0.0, 0.0, 0.0),
    // --- empty strings
    ("", "12", 0.0, 0.0, 0.0, 0.0, 0.0),
    ("12", "", 0.0, 1.0, 0.0, 0.0, 0.0),
    ("", "", 0.0, 0.0, 0.0, 0.0, 0.0),
    ("   \n  ", "0", 0.0, 0.0, 0.0, 0.0, 0.0),
    // --- huge numbers
    ("<answer>123456789012345678901</answer>", "123456789012345678901", 1.0, 1.0, 0.0, 0.0, 0.0),
    ("<answer>123456789012345678901</answer>", "123456789012345678902", 0.0, 1.0, 0.0, 0.0, 0.0),
    ("<answer>1e30</answer>", "1000000000000000000000000000000", 1.0, 1.0, 0.0, 0.0, 0.0),
    ("<answer>99999999999999999999999999999999999999999999</answer>", "1e44", 0.0, 1.0, 0.0, 0.0, 0.0),
    ("<answer>1e400</answer>", "1e400", 1.0, 1.0, 0.0, 0.0, 0.0),
    ("<answer>1e9999999</answer>", "1", 0.0, 0.0, 0.0, 0.0, 0.0),
    // --- scientific notation, percent, units
    ("<answer>1.5e3</answer>", "1500", 1.0, 1.0, 0.0, 0.0, 0.0),
    ("<answer>2 × 10^3</answer>", "2000", 1.0, 1.0, 0.0, 0.0, 0.0),
    ("<answer>2\\times10^{-2}</answer>", "0.02", 1.0, 1.0, 0.0, 0.0, 0.0),
    ("<answer>50%</answer>", "50", 1.0, 1.0, 0.0, 0.0, 0.0),
    ("<answer>\\$12</answer>", "12", 1.0, 1.0, 0.0, 0.0, 0.0),
    ("<answer>12 cm</answer>", "12", 1.0, 1.0, 0.0, 0.0, 0.0),
    ("The speed is 60 km/h", "60", 1.0, 1.0, 0.0, 0.0, 0.0),
    // --- boxed
    ("\\boxed{12}", "12", 1.0, 1.0, 0.0, 0.0, 0.0),
    ("\\boxed{1{,}000}", "1000", 1.0, 1.0, 0.0, 0.0, 0.0),
    ("\\boxed{12} but wait \\boxed{13}", "13", 1.0, 1.0, 0.0, 0.0, 0.0),
    ("<answer>\\boxed{12}</answer>", "12", 1.0, 1.0, 0.0, 0.0, 0.0),
    ("\\boxed{12", "12", 1.0, 1.0, 0.0, 0.0, 0.0),
    // --- non-numeric ground truths and GSM8K references
    ("<answer>B</answer>", "b", 1.0, 0.0, 0.0, 0.0, 0.0),
    ("<answer>x^2+1</answer>", "x^2 + 1", 1.0, 0.0, 0.0, 0.0, 0.0),
    ("<answer>C</answer>", "B", 0.0, 0.0, 0.0, 0.0, 0.0),
    ("<answer>72</answer>", "Natalia sold 48+24 = 72 clips\n#### 72", 1.0, 1.0, 0.0, 0.0, 0.0),
    ("<answer>1200</answer>", "#### 1,200", 1.0, 1.0, 0.0, 0.0, 0.0),
];

#[test]
fn table_has_enough_rows() {
    assert!(ROWS.len() >= 60, "{} rows", ROWS.len());
}

#[test]
fn every_row_scores_as_expected() {
    let tags = Tags::default();
    let correct = CorrectnessOptions::default();
    let strict = CorrectnessOptions::default().with_strict(true);
    let extract = ExtractOptions::default();
    let mark = MarkOptions::default();
    let mut failures = Vec::new();
    for (i, &(c, gt, want_correct, want_digit, want_hard, want_soft, want_mark)) in
        ROWS.iter().enumerate()
    {
        let got = [
            correctness_score(c, gt, &correct),
            correctness_score(c, gt, &strict),
            digit_score(c, &extract),
            f32::from(u8::from(is_hard_format(c, &tags))),
            f32::from(u8::from(is_soft_format(c, &tags))),
            mark_score(c, &mark),
        ];
        let want = [
            want_correct,
            want_correct * want_hard,
            want_digit,
            want_hard,
            want_soft,
            want_mark,
        ];
        let names = [
            "correctness",
            "strict",
            "digit",
            "hard_format",
            "soft_format",
            "mark",
        ];
        for k in 0..6 {
            if (got[k] - want[k]).abs() > 1e-6 {
                failures.push(format!(
                    "row {i} {}: {c:?} vs {gt:?}: expected {}, got {}",
                    names[k], want[k], got[k]
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
