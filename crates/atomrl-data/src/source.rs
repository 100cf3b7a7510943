//! Where a dataset comes from, as written on the command line or in a config file.

use std::fmt;
use std::path::{Path, PathBuf};

use atomrl_core::{Error, Result};

use crate::example::Example;
use crate::hub::{hub_cache_dir, resolve_hub_dataset_shards};
use crate::jsonl::load_jsonl;
use crate::parquet::load_parquet;
use crate::synthetic::{synthetic_splits_with, SyntheticConfig};

/// A dataset location: a local file or a hub dataset in the local hub cache.
///
/// ```
/// use atomrl_data::DataSource;
/// let src = DataSource::parse("openai/gsm8k:main")?;
/// assert_eq!(src, DataSource::Hub {
///     repo_id: "openai/gsm8k".into(), revision: None, config: Some("main".into()) });
/// assert_eq!(src.to_string(), "openai/gsm8k:main");
/// let pinned = DataSource::parse("openai/gsm8k@v1.0:socratic")?;
/// assert_eq!(pinned.to_string(), "openai/gsm8k@v1.0:socratic");
/// # Ok::<(), atomrl_core::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum DataSource {
    /// A JSON Lines (or JSON array) file, read by [`load_jsonl`].
    Jsonl(PathBuf),
    /// A parquet file, read by [`load_parquet`] (GSM8K, preference pairs, prompts).
    Parquet(PathBuf),
    /// A hub dataset (`org/name[@revision][:config]`), read from the hub cache or, through
    /// [`DataSource::load_with`], fetched by the caller (the trainer downloads it).
    Hub {
        /// `org/name`, e.g. `openai/gsm8k`.
        repo_id: String,
        /// A branch, tag or commit; `None` is `main`.
        revision: Option<String>,
        /// The dataset config (subfolder), e.g. `main`; `openai/gsm8k` defaults to `main`.
        config: Option<String>,
    },
    /// Synthetic grade-school word problems made by [`synthetic_splits_with`] (offline; written
    /// `synthetic`, `synthetic:TRAIN:EVAL:SEED` or `synthetic:TRAIN:EVAL:SEED:OPS:MAX_VALUE`
    /// with `OPS` one count or a range such as `1-3`). Split `train` gives the training
    /// problems, any other split the held-out ones (never among the training problems).
    Synthetic {
        /// Training problems.
        train: usize,
        /// Held-out problems.
        eval: usize,
        /// Seed of both streams.
        seed: u64,
        /// Fewest arithmetic steps per problem (1 to 3).
        min_ops: usize,
        /// Most arithmetic steps per problem (`min_ops` to 3).
        max_ops: usize,
        /// Largest quantity drawn for a story (10 to 10 000).
        max_value: i64,
    },
}

/// `synthetic` means 20,000 training and 500 held-out problems of this seed (the embedded
/// example's and `cargo xtask tiny-model`'s).
pub const SYNTHETIC_DEFAULT: (usize, usize, u64) = (20_000, 500, 20_261_121);

/// The problems of `synthetic` (and of a spec that leaves `OPS:MAX_VALUE` out): one or two
/// arithmetic steps on quantities up to 10 (counts up to 12), the difficulty at which the
/// embedded ~1M-parameter model is weak after a short SFT yet learns quickly under GRPO (see
/// `examples/grpo_gsm8k/model/BUILD.md` for the calibration against harder settings).
pub const SYNTHETIC_DEFAULT_PROBLEMS: (usize, usize, i64) = (1, 2, 10);

impl DataSource {
    /// Parses a source: an existing file ending in `.jsonl` or `.json` is [`DataSource::Jsonl`],
    /// one ending in `.parquet` is [`DataSource::Parquet`]; `org/name[@revision][:config]`
    /// that is not an existing path is [`DataSource::Hub`].
    ///
    /// # Errors
    /// [`Error::File`] for a path with a dataset extension that does not exist, or an existing
    /// file of another kind; [`Error::Value`] for anything else.
    ///
    /// ```
    /// use atomrl_data::DataSource;
    /// assert!(matches!(DataSource::parse("openai/gsm8k")?, DataSource::Hub { config: None, .. }));
    /// assert!(DataSource::parse("missing/train.jsonl").unwrap_err().to_string().contains("not found"));
    /// assert!(DataSource::parse("not a source").is_err());
    /// # Ok::<(), atomrl_core::Error>(())
    /// ```
    pub fn parse(s: &str) -> Result<Self> {
        let s = s.trim();
        if let Some(rest) = s.strip_prefix("synthetic") {
            return parse_synthetic(s, rest);
        }
        let path = Path::new(s);
        let ext = path
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase);
        let kind = match ext.as_deref() {
            Some("jsonl" | "json") => Some(false),
            Some("parquet") => Some(true),
            _ => None,
        };
        if !s.is_empty() && path.exists() {
            return match kind {
                _ if !path.is_file() => Err(Error::file(s, "is not a file")),
                Some(false) => Ok(Self::Jsonl(path.to_path_buf())),
                Some(true) => Ok(Self::Parquet(path.to_path_buf())),
                None => Err(Error::file(
                    s,
                    "unknown dataset file type; expected a .jsonl, .json or .parquet file",
                )),
            };
        }
        if kind.is_some() {
            return Err(Error::file(s, "dataset file not found"));
        }
        let (repo_rev, config) = match s.split_once(':') {
            Some((r, c)) => (r, Some(c)),
            None => (s, None),
        };
        let (repo_id, revision) = match repo_rev.split_once('@') {
            Some((r, rev)) => (r, Some(rev)),
            None => (repo_rev, None),
        };
        let name_ok = |p: &str| {
            !p.is_empty()
                && !p.starts_with('.')
                && p.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        };
        let repo_ok = repo_id
            .split_once('/')
            .is_some_and(|(org, name)| name_ok(org) && name_ok(name));
        if !repo_ok || !config.is_none_or(name_ok) || !revision.is_none_or(name_ok) {
            return Err(Error::value(
                "DataSource::parse",
                "dataset",
                "an existing .jsonl/.json/.parquet file or a hub dataset \
                 `org/name[@revision][:config]`",
                format!("`{s}`"),
            ));
        }
        Ok(Self::Hub {
            repo_id: repo_id.to_string(),
            revision: revision.map(str::to_string),
            config: config.map(str::to_string),
        })
    }

    /// Loads the examples. `split` (`train`, `test`, …) picks the file of a hub dataset and is
    /// ignored for local files. Hub datasets are read from [`hub_cache_dir`].
    ///
    /// # Errors
    /// Those of [`load_jsonl`], [`load_parquet`] and [`resolve_hub_dataset_shards`].
    ///
    /// ```
    /// use atomrl_data::DataSource;
    /// let path = std::env::temp_dir().join("atomrl_doctest_source.jsonl");
    /// std::fs::write(&path, "{\"prompt\": \"1+1?\", \"ground_truth\": \"2\"}\n").unwrap();
    /// let src = DataSource::parse(path.to_str().unwrap())?;
    /// assert_eq!(src.load("train")?.len(), 1);
    /// # Ok::<(), atomrl_core::Error>(())
    /// ```
    pub fn load(&self, split: &str) -> Result<Vec<Example>> {
        self.load_from_cache(&hub_cache_dir(), split)
    }

    /// [`DataSource::load`] with an explicit hub cache folder.
    ///
    /// # Errors
    /// As [`DataSource::load`].
    pub fn load_from_cache(&self, cache_dir: &Path, split: &str) -> Result<Vec<Example>> {
        self.load_with(split, |repo_id, revision, config, split| match revision {
            None | Some("main") => resolve_hub_dataset_shards(cache_dir, repo_id, config, split),
            Some(rev) => Err(Error::file(
                repo_id,
                format!("revision `{rev}`: the cache-only reader reads `main`; load it with a hub client"),
            )),
        })
    }

    /// Loads the examples, asking `fetch(repo_id, revision, config, split)` for the local files
    /// of a hub split (parquet or JSONL shards, in order); other sources ignore it. This is how
    /// a caller with a hub client (`atomrl-hub`) downloads what is missing, while this crate
    /// stays free of network code.
    ///
    /// # Errors
    /// Those of `fetch`, [`load_jsonl`] and [`load_parquet`].
    ///
    /// ```
    /// use atomrl_data::DataSource;
    /// let file = std::env::temp_dir().join("atomrl_doctest_load_with.jsonl");
    /// std::fs::write(&file, "{\"prompt\": \"2+2?\", \"ground_truth\": \"4\"}\n").unwrap();
    /// let src = DataSource::parse("org/maths@v2")?;
    /// let examples = src.load_with("train", |repo, revision, _config, split| {
    ///     assert_eq!((repo, revision, split), ("org/maths", Some("v2"), "train"));
    ///     Ok(vec![file.clone()])
    /// })?;
    /// assert_eq!(examples[0].ground_truth, "4");
    /// # Ok::<(), atomrl_core::Error>(())
    /// ```
    pub fn load_with<F>(&self, split: &str, fetch: F) -> Result<Vec<Example>>
    where
        F: FnOnce(&str, Option<&str>, Option<&str>, &str) -> Result<Vec<PathBuf>>,
    {
        match self {
            Self::Jsonl(p) => load_jsonl(p),
            Self::Parquet(p) => load_parquet(p),
            Self::Synthetic {
                train,
                eval,
                seed,
                min_ops,
                max_ops,
                max_value,
            } => {
                let cfg = synthetic_config(*seed, *min_ops, *max_ops, *max_value)?;
                let (train_set, eval_set) = synthetic_splits_with(&cfg, *train, *eval);
                Ok(if split == "train" {
                    train_set
                } else {
                    eval_set
                })
            }
            Self::Hub {
                repo_id,
                revision,
                config,
            } => {
                let config = config.as_deref().or(default_config(repo_id));
                let mut out = Vec::new();
                for shard in fetch(repo_id, revision.as_deref(), config, split)? {
                    let jsonl = shard
                        .extension()
                        .is_some_and(|e| e == "jsonl" || e == "json");
                    out.extend(if jsonl {
                        load_jsonl(&shard)?
                    } else {
                        load_parquet(&shard)?
                    });
                }
                Ok(out)
            }
        }
    }
}

/// The generator options of a synthetic source, checked (the set sizes go to
/// [`synthetic_splits_with`] instead of `num_examples`).
fn synthetic_config(
    seed: u64,
    min_ops: usize,
    max_ops: usize,
    max_value: i64,
) -> Result<SyntheticConfig> {
    let cfg = SyntheticConfig {
        num_examples: 0,
        seed,
        min_ops,
        max_ops,
        max_value,
    };
    cfg.validate()?;
    Ok(cfg)
}

fn parse_synthetic(s: &str, rest: &str) -> Result<DataSource> {
    let (mut train, mut eval, mut seed) = SYNTHETIC_DEFAULT;
    let (mut min_ops, mut max_ops, mut max_value) = SYNTHETIC_DEFAULT_PROBLEMS;
    let bad = || {
        Error::value(
            "DataSource::parse",
            "dataset",
            "`synthetic`, `synthetic:TRAIN:EVAL:SEED` or `synthetic:TRAIN:EVAL:SEED:OPS:MAX_VALUE` \
             (OPS one count or a range such as 1-3)",
            format!("`{s}`"),
        )
    };
    if !rest.is_empty() {
        let parts: Vec<&str> = rest.strip_prefix(':').ok_or_else(bad)?.split(':').collect();
        let (sizes, problems) = match parts.as_slice() {
            [t, e, sd] => ((t, e, sd), None),
            [t, e, sd, ops, mv] => ((t, e, sd), Some((ops, mv))),
            _ => return Err(bad()),
        };
        train = sizes.0.parse().map_err(|_| bad())?;
        eval = sizes.1.parse().map_err(|_| bad())?;
        seed = sizes.2.parse().map_err(|_| bad())?;
        if let Some((ops, mv)) = problems {
            (min_ops, max_ops) = match ops.split_once('-') {
                Some((lo, hi)) => (
                    lo.parse().map_err(|_| bad())?,
                    hi.parse().map_err(|_| bad())?,
                ),
                None => {
                    let n = ops.parse().map_err(|_| bad())?;
                    (n, n)
                }
            };
            max_value = mv.parse().map_err(|_| bad())?;
        }
    }
    synthetic_config(seed, min_ops, max_ops, max_value)?;
    Ok(DataSource::Synthetic {
        train,
        eval,
        seed,
        min_ops,
        max_ops,
        max_value,
    })
}

/// The config used when none is given: `main` for `openai/gsm8k`.
fn default_config(repo_id: &str) -> Option<&'static str> {
    matches!(repo_id, "openai/gsm8k" | "gsm8k/gsm8k").then_some("main")
}

impl fmt::Display for DataSource {
    /// The form [`DataSource::parse`] reads.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Jsonl(p) | Self::Parquet(p) => write!(f, "{}", p.display()),
            Self::Hub {
                repo_id,
                revision,
                config,
            } => {
                f.write_str(repo_id)?;
                if let Some(r) = revision {
                    write!(f, "@{r}")?;
                }
                if let Some(c) = config {
                    write!(f, ":{c}")?;
                }
                Ok(())
            }
            Self::Synthetic {
                train,
                eval,
                seed,
                min_ops,
                max_ops,
                max_value,
            } => {
                write!(f, "synthetic:{train}:{eval}:{seed}:{min_ops}")?;
                if max_ops != min_ops {
                    write!(f, "-{max_ops}")?;
                }
                write!(f, ":{max_value}")
            }
        }
    }
}

impl std::str::FromStr for DataSource {
    type Err = Error;

    /// [`DataSource::parse`].
    fn from_str(s: &str) -> Result<Self> {
        Self::parse(s)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn parse_forms() {
        assert_eq!(
            DataSource::parse("openai/gsm8k").unwrap(),
            DataSource::Hub {
                repo_id: "openai/gsm8k".into(),
                revision: None,
                config: None
            }
        );
        let pinned = DataSource::parse("org/data@abc123:main").unwrap();
        assert_eq!(
            pinned,
            DataSource::Hub {
                repo_id: "org/data".into(),
                revision: Some("abc123".into()),
                config: Some("main".into())
            }
        );
        assert_eq!(DataSource::parse(&pinned.to_string()).unwrap(), pinned);
        for bad in [
            "", "gsm8k", "a/b/c", "a/b:", "/abs/dir", "a/b:c/d", "./x", "a/b@", "a/b@x/y",
        ] {
            assert!(DataSource::parse(bad).is_err(), "{bad}");
        }
        assert!(DataSource::parse("x.parquet")
            .unwrap_err()
            .to_string()
            .contains("not found"));
        let dir = std::env::temp_dir();
        let err = DataSource::parse(dir.to_str().unwrap()).unwrap_err();
        assert!(err.to_string().contains("not a file"), "{err}");
    }

    #[test]
    fn synthetic_sources() {
        let src = DataSource::parse("synthetic:40:5:3").unwrap();
        let (min_ops, max_ops, max_value) = SYNTHETIC_DEFAULT_PROBLEMS;
        assert_eq!(
            src,
            DataSource::Synthetic {
                train: 40,
                eval: 5,
                seed: 3,
                min_ops,
                max_ops,
                max_value,
            }
        );
        assert_eq!(src.to_string(), "synthetic:40:5:3:1-2:10");
        assert_eq!(DataSource::parse("synthetic:40:5:3:1-2:10").unwrap(), src);
        let hard = DataSource::parse("synthetic:40:5:3:3:50").unwrap();
        assert_eq!(hard.to_string(), "synthetic:40:5:3:3:50");
        assert!(hard.load("train").unwrap().iter().all(|e| e
            .completion
            .as_deref()
            .unwrap()
            .matches('=')
            .count()
            == 3));
        for bad in [
            "synthetic:40:5:3:4:50",
            "synthetic:40:5:3:1-2",
            "synthetic:40:5:3:2-1:50",
        ] {
            let err = DataSource::parse(bad).unwrap_err().to_string();
            assert!(err.contains("ops") || err.contains("OPS"), "{bad}: {err}");
        }
        assert_eq!(
            (
                src.load("train").unwrap().len(),
                src.load("test").unwrap().len()
            ),
            (40, 5)
        );
        assert!(DataSource::parse("synthetic:1:2").is_err());
        assert!(matches!(
            DataSource::parse("synthetic").unwrap(),
            DataSource::Synthetic { train: 20_000, .. }
        ));
    }
}
