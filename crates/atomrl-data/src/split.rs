//! A seeded train / held-out split, and the training and held-out sets of a run.

use atomrl_core::{Error, Result};

use crate::example::Example;
use crate::shuffle::seeded_permutation;
use crate::source::DataSource;

/// Splits `examples` into `(train, eval)`: a seeded shuffle ([`seeded_permutation`]), then the
/// first `eval_size` examples of the shuffled order are `eval` and the rest `train` (both in
/// shuffled order).
///
/// Deterministic for a seed and stable across dependency versions; a larger `eval_size` with
/// the same seed keeps the smaller eval set as its prefix.
///
/// # Errors
/// [`Error::Value`] when `eval_size >= examples.len()` (the train set would be empty).
///
/// ```
/// use atomrl_data::{train_eval_split, Example};
/// let rows: Vec<Example> = (0..10).map(|i| Example::new(format!("q{i}"), i.to_string())).collect();
/// let (train, eval) = train_eval_split(rows.clone(), 3, 7)?;
/// assert_eq!((train.len(), eval.len()), (7, 3));
/// assert_eq!(train_eval_split(rows.clone(), 3, 7)?.1, eval);
/// assert!(train_eval_split(rows, 10, 7).is_err());
/// # Ok::<(), atomrl_core::Error>(())
/// ```
pub fn train_eval_split(
    examples: Vec<Example>,
    eval_size: usize,
    seed: u64,
) -> Result<(Vec<Example>, Vec<Example>)> {
    let n = examples.len();
    if eval_size >= n {
        return Err(Error::value(
            "train_eval_split",
            "eval_size",
            format!("smaller than the number of examples ({n})"),
            eval_size,
        ));
    }
    let mut slots: Vec<Option<Example>> = examples.into_iter().map(Some).collect();
    let mut shuffled = seeded_permutation(n, seed)
        .into_iter()
        .filter_map(|i| slots.get_mut(i).and_then(Option::take));
    let eval: Vec<Example> = shuffled.by_ref().take(eval_size).collect();
    let train: Vec<Example> = shuffled.collect();
    Ok((train, eval))
}

/// The training and held-out examples of a run: the `train` split of `dataset`, and the
/// `test` split of `eval_dataset` when given (its first `eval_size` examples when that is not
/// 0), else `eval_size` examples split off the training data with [`train_eval_split`] (none
/// when 0). Sources are parsed with [`DataSource::parse`].
///
/// # Errors
/// Unparsable or unloadable sources; an `eval_size` that leaves no training example.
///
/// ```
/// use atomrl_data::load_splits;
/// let (train, eval) = load_splits("synthetic:40:5:3", None, 4, 7)?;
/// assert_eq!((train.len(), eval.len()), (40 - 4, 4));
/// let (train, eval) = load_splits("synthetic:40:5:3", Some("synthetic:40:5:3"), 0, 7)?;
/// assert_eq!((train.len(), eval.len()), (40, 5));
/// # Ok::<(), atomrl_core::Error>(())
/// ```
pub fn load_splits(
    dataset: &str,
    eval_dataset: Option<&str>,
    eval_size: usize,
    seed: u64,
) -> Result<(Vec<Example>, Vec<Example>)> {
    load_splits_with(dataset, eval_dataset, eval_size, seed, &|source, split| {
        source.load(split)
    })
}

/// [`load_splits`] with each source loaded by `load(source, split)` — for a caller that
/// fetches hub datasets itself (the trainer passes one that downloads them, through
/// [`DataSource::load_with`]).
///
/// # Errors
/// As [`load_splits`], and those of `load`.
///
/// ```
/// use atomrl_data::{load_splits_with, DataSource};
/// let mut asked = std::cell::RefCell::new(Vec::new());
/// let load = |s: &DataSource, split: &str| {
///     asked.borrow_mut().push(split.to_string());
///     s.load(split)
/// };
/// let (train, eval) = load_splits_with("synthetic:40:5:3", Some("synthetic:40:5:3"), 0, 7, &load)?;
/// assert_eq!((train.len(), eval.len(), asked.take()), (40, 5, vec!["train".into(), "test".into()]));
/// # Ok::<(), atomrl_core::Error>(())
/// ```
pub fn load_splits_with(
    dataset: &str,
    eval_dataset: Option<&str>,
    eval_size: usize,
    seed: u64,
    load: &dyn Fn(&DataSource, &str) -> Result<Vec<Example>>,
) -> Result<(Vec<Example>, Vec<Example>)> {
    let train = load(&DataSource::parse(dataset)?, "train")?;
    match eval_dataset {
        Some(eval) => {
            let mut eval = load(&DataSource::parse(eval)?, "test")?;
            if eval_size > 0 {
                eval.truncate(eval_size);
            }
            Ok((train, eval))
        }
        None if eval_size > 0 => train_eval_split(train, eval_size, seed),
        None => Ok((train, Vec::new())),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn rows(n: usize) -> Vec<Example> {
        (0..n).map(|i| Example::new(format!("q{i}"), "0")).collect()
    }

    #[test]
    fn partition_and_prefix() {
        let (train, eval) = train_eval_split(rows(50), 10, 1).unwrap();
        let mut all: Vec<String> = train
            .iter()
            .chain(&eval)
            .map(|e| e.prompt.to_string())
            .collect();
        all.sort();
        let mut want: Vec<String> = rows(50).iter().map(|e| e.prompt.to_string()).collect();
        want.sort();
        assert_eq!(all, want);
        let (_, eval12) = train_eval_split(rows(50), 12, 1).unwrap();
        assert_eq!(&eval12[..10], &eval[..]);
        let (_, other) = train_eval_split(rows(50), 10, 2).unwrap();
        assert_ne!(other, eval);
        let (train, eval) = train_eval_split(rows(3), 0, 1).unwrap();
        assert_eq!((train.len(), eval.len()), (3, 0));
        assert!(train_eval_split(Vec::new(), 0, 1).is_err());
    }
}
