//! `org/name[@revision]`: a repository on the hub and the revision to read.

use std::fmt;

use atomrl_core::{Error, Result};

/// Whether a repository holds a model or a dataset (their URLs and cache folders differ).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RepoKind {
    /// `/{id}/resolve/…`, cached under `models--org--name`.
    Model,
    /// `/datasets/{id}/resolve/…`, cached under `datasets--org--name`.
    Dataset,
}

impl RepoKind {
    /// The cache folder prefix and the API path segment: `models` or `datasets`.
    ///
    /// ```
    /// assert_eq!(atomrl_hub::RepoKind::Dataset.plural(), "datasets");
    /// ```
    pub fn plural(self) -> &'static str {
        match self {
            Self::Model => "models",
            Self::Dataset => "datasets",
        }
    }
}

/// A hub repository id and revision, parsed from `org/name[@revision]` (a legacy id without an
/// organisation, such as `gpt2`, is accepted too).
///
/// ```
/// use atomrl_hub::RepoSpec;
/// let spec = RepoSpec::parse("Qwen/Qwen2.5-0.5B-Instruct@v1.0")?;
/// assert_eq!((spec.id.as_str(), spec.revision.as_str()), ("Qwen/Qwen2.5-0.5B-Instruct", "v1.0"));
/// assert_eq!(RepoSpec::parse("openai/gsm8k")?.revision, "main");
/// assert!(RepoSpec::parse("a/b/c").is_err());
/// # Ok::<(), atomrl_core::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RepoSpec {
    /// `org/name`.
    pub id: String,
    /// A branch, tag or commit hash (`main` when none is given).
    pub revision: String,
}

impl RepoSpec {
    /// Parses `org/name[@revision]`.
    ///
    /// # Errors
    /// [`Error::Value`] naming the text when it is not a hub id: empty parts, more than one
    /// `/`, characters other than letters, digits, `-`, `_` and `.`, a part starting with `.`.
    pub fn parse(text: &str) -> Result<Self> {
        let text = text.trim();
        let (id, revision) = match text.split_once('@') {
            Some((id, rev)) => (id, rev),
            None => (text, "main"),
        };
        let plain = |p: &str| {
            !p.is_empty()
                && !p.starts_with('.')
                && p.len() <= 96
                && p.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        };
        let parts: Vec<&str> = id.split('/').collect();
        if parts.len() > 2 || !parts.iter().all(|p| plain(p)) || !plain(revision) {
            return Err(Error::value(
                "RepoSpec::parse",
                "repo",
                "a local folder or a hub id `org/name[@revision]`",
                format!("`{text}`"),
            ));
        }
        Ok(Self {
            id: id.to_string(),
            revision: revision.to_string(),
        })
    }

    /// The repository's folder name in the hub cache: `models--org--name`.
    ///
    /// ```
    /// use atomrl_hub::{RepoKind, RepoSpec};
    /// let spec = RepoSpec::parse("openai/gsm8k")?;
    /// assert_eq!(spec.cache_folder(RepoKind::Dataset), "datasets--openai--gsm8k");
    /// # Ok::<(), atomrl_core::Error>(())
    /// ```
    pub fn cache_folder(&self, kind: RepoKind) -> String {
        format!("{}--{}", kind.plural(), self.id.replace('/', "--"))
    }
}

impl fmt::Display for RepoSpec {
    /// `org/name`, with `@revision` unless it is `main`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.id)?;
        if self.revision != "main" {
            write!(f, "@{}", self.revision)?;
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn forms() {
        assert_eq!(RepoSpec::parse("gpt2").unwrap().id, "gpt2");
        let s = RepoSpec::parse("org/tiny@abc").unwrap();
        assert_eq!(s.to_string(), "org/tiny@abc");
        assert_eq!(RepoSpec::parse("org/tiny").unwrap().to_string(), "org/tiny");
        for bad in [
            "", "/x", "a/", "a/b/c", "../x", "a/b@", "a b/c", "a/b@x/y", "./a",
        ] {
            let err = RepoSpec::parse(bad).unwrap_err().to_string();
            assert!(err.contains("org/name[@revision]"), "{bad}: {err}");
        }
    }
}
