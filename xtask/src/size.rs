//! `cargo xtask size`: the size limits of the crates that hold the training step — the
//! trainer's non-test lines (at most [`TRAINER_LINES`]) and every function of the trainer,
//! the rollouts and the sampler (at most 80 lines). Counted as issue 20 counts them: a file's
//! lines up to its first `#[cfg(test)]`.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

/// The trainer's non-test lines, at most: 3,000 held the loop, GRPO, DAPO and SFT (issue 20);
/// the actor-critic recipes (PPO, A2C, TRPO: ~900 lines, with their pieces in the atomic
/// crates) took it to ~3,100, DPO (offline and online pairs, its metrics and held-out loss:
/// ~380 lines; the pairs, their sums and the preference data live in `atomrl-rollout` and
/// `atomrl-data`) to ~3,500, and the reward-model recipe with `sample_own_pairs` (~440 lines;
/// the model, its loss and `ModelReward` live in `atomrl-model`, `atomrl-loss` and
/// `atomrl-rollout`) to ~3,950, and PPO's value head on the actor (the policy-and-value
/// update, the multi-optimizer step, the smaller critic: ~260 lines) to ~4,230, the reward
/// step's length buckets to ~4,300, the actor's skipping of flat groups (the rows live in
/// `atomrl-rollout`) to ~4,305, and the `attention_scores_budget` key (set on the policy and
/// on a critic loaded from its own folder; chunked attention lives in `atomrl-model`) to
/// ~4,326. The CPU plan (threads and workers) moved to `atomrl-core` with its two-worker rule:
/// ~4,260. The micro-batches of a step sharing one mixed-precision cast of the weights (the
/// scope lives in `atomrl-model`; each step opens it around its micro-batches): ~4,281.
pub const TRAINER_LINES: usize = 4_285;
/// A function's lines (signature to closing brace), at most.
pub const FUNCTION_LINES: usize = 80;
/// The crates whose functions are held to [`FUNCTION_LINES`].
const FUNCTION_CRATES: [&str; 3] = ["atomrl-trainer", "atomrl-rollout", "atomrl-sample"];

/// A function longer than the limit.
#[derive(Debug, PartialEq)]
pub struct LongFunction {
    pub file: PathBuf,
    pub line: usize,
    pub lines: usize,
    pub name: String,
}

/// The lines of `text` before its first `#[cfg(test)]`.
pub fn non_test_lines(text: &str) -> usize {
    text.lines()
        .take_while(|l| !l.trim_start().starts_with("#[cfg(test)]"))
        .count()
}

/// The functions of `text` longer than `limit` lines, outside its test module: from a `fn`
/// line to the `}` at the same indentation (rustfmt's layout).
pub fn long_functions(file: &Path, text: &str, limit: usize) -> Vec<LongFunction> {
    let lines: Vec<&str> = text.lines().collect();
    let end = non_test_lines(text);
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate().take(end) {
        let body = line.trim_start();
        let indent = &line[..line.len() - body.len()];
        let signature = [
            "fn ",
            "pub fn ",
            "pub(crate) fn ",
            "const fn ",
            "pub const fn ",
        ]
        .iter()
        .find_map(|p| body.strip_prefix(p));
        let Some(rest) = signature else { continue };
        // A body opened and closed on its own line (`fn f() {}`) ends there.
        if rest.contains('{') && rest.matches('{').count() == rest.matches('}').count() {
            continue;
        }
        let close = format!("{indent}}}");
        if let Some(j) = lines[i + 1..].iter().position(|l| *l == close) {
            let n = j + 2;
            if n > limit {
                out.push(LongFunction {
                    file: file.to_path_buf(),
                    line: i + 1,
                    lines: n,
                    name: rest.split(['(', '<']).next().unwrap_or("").to_string(),
                });
            }
        }
    }
    out
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            out.extend(rust_files(&path)?);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    out.sort();
    Ok(out)
}

/// The trainer's non-test lines and the long functions, from the workspace at `root`.
pub fn measure(root: &Path) -> Result<(usize, Vec<LongFunction>)> {
    let mut trainer = 0;
    for file in rust_files(&root.join("crates/atomrl-trainer/src"))? {
        trainer += non_test_lines(&std::fs::read_to_string(&file)?);
    }
    let mut long = Vec::new();
    for krate in FUNCTION_CRATES {
        for file in rust_files(&root.join("crates").join(krate).join("src"))? {
            let text = std::fs::read_to_string(&file)?;
            long.extend(long_functions(&file, &text, FUNCTION_LINES));
        }
    }
    Ok((trainer, long))
}

/// Prints the figures; fails when a limit is passed.
pub fn run() -> Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let (trainer, long) = measure(&root)?;
    println!("atomrl-trainer: {trainer} non-test lines (limit {TRAINER_LINES})");
    for f in &long {
        println!(
            "{}:{}: fn {} has {} lines (limit {FUNCTION_LINES})",
            f.file.display(),
            f.line,
            f.name,
            f.lines
        );
    }
    if trainer > TRAINER_LINES || !long.is_empty() {
        bail!("size limits passed");
    }
    println!(
        "functions of {}: none over {FUNCTION_LINES} lines",
        FUNCTION_CRATES.join(", ")
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_function_is_found_and_tests_are_not_counted() {
        let body = "    let x = 1;\n".repeat(85);
        let text = format!(
            "fn short() {{\n}}\n\npub fn long(a: u8) {{\n{body}}}\n#[cfg(test)]\nfn t() {{}}\n"
        );
        let found = long_functions(Path::new("x.rs"), &text, 80);
        assert_eq!(found.len(), 1);
        assert_eq!(
            (found[0].name.as_str(), found[0].line, found[0].lines),
            ("long", 4, 87)
        );
        assert_eq!(non_test_lines(&text), 4 + 85 + 1);
        // A one-line body is not measured up to the next brace at its indent.
        let one_liner =
            format!("impl T for () {{\n    fn f(_: u8) -> Self {{}}\n{body}    }}\n}}\n");
        assert!(long_functions(Path::new("y.rs"), &one_liner, 80).is_empty());
    }

    /// The step's crates stay within the limits issue 30 set.
    #[test]
    fn the_training_step_crates_stay_small() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let (trainer, long) = measure(&root).expect("sources");
        assert!(
            trainer <= TRAINER_LINES,
            "atomrl-trainer: {trainer} non-test lines"
        );
        assert!(long.is_empty(), "{long:?}");
    }
}
