//! [`Resume`], where a run resumes from: parsed once, when the configuration loads, and
//! serialised back to the name it was written as. (The compute dtype and the device,
//! [`atomrl_core::ComputeDtype`] and [`atomrl_core::DeviceSpec`], live in `atomrl-core`, which
//! every command that picks them shares.)

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use atomrl_core::{Error, Result};
use serde::{Deserialize, Serialize};

const FUNC: &str = "config";

/// Where a run resumes from (`resume`): `auto` (the latest complete checkpoint in
/// `output_dir`, if any), `never`, or a checkpoint folder.
///
/// ```
/// use atomrl_config::Resume;
/// assert_eq!("auto".parse::<Resume>()?, Resume::Auto);
/// assert_eq!("runs/a/checkpoint-10".parse::<Resume>()?.to_string(), "runs/a/checkpoint-10");
/// # Ok::<(), atomrl_core::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Resume {
    /// The latest complete checkpoint in `output_dir`; a fresh start when there is none.
    Auto,
    /// Always a fresh start.
    #[default]
    Never,
    /// This checkpoint folder.
    From(PathBuf),
}

impl Resume {
    /// The checkpoint folder of [`Resume::From`].
    pub fn path(&self) -> Option<&Path> {
        match self {
            Self::From(p) => Some(p),
            _ => None,
        }
    }
}

impl fmt::Display for Resume {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Auto => f.write_str("auto"),
            Self::Never => f.write_str("never"),
            Self::From(p) => write!(f, "{}", p.display()),
        }
    }
}

impl FromStr for Resume {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "auto" => Ok(Self::Auto),
            "never" => Ok(Self::Never),
            "" => Err(Error::value(
                FUNC,
                "resume",
                "auto, never or a checkpoint folder",
                "an empty string",
            )),
            p => Ok(Self::From(PathBuf::from(p))),
        }
    }
}

impl TryFrom<String> for Resume {
    type Error = Error;

    fn try_from(s: String) -> Result<Self> {
        s.parse()
    }
}

impl From<Resume> for String {
    fn from(r: Resume) -> Self {
        r.to_string()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_through_serde() {
        for name in ["auto", "never", "runs/x/checkpoint-2"] {
            let r: Resume = serde_json::from_value(name.into()).unwrap();
            assert_eq!(serde_json::to_value(&r).unwrap(), serde_json::json!(name));
        }
    }
}
