//! The closed sets of choices of the run configuration that are not an atomic crate's own enum:
//! the compute dtype, the device and where to resume from. Each one is parsed once, when the
//! configuration loads, and serialises back to the name it was written as.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use atomrl_core::{Error, Result};
use candle_core::DType;
use serde::{Deserialize, Serialize};

const FUNC: &str = "config";

/// Compute dtype of the forward and backward (`dtype`): `f32`, `bf16` or `f16`.
///
/// ```
/// use atomrl_trainer::config::ComputeDtype;
/// let d: ComputeDtype = "bf16".parse()?;
/// assert_eq!((d, d.to_string(), d.dtype()), (ComputeDtype::Bf16, "bf16".to_string(), candle_core::DType::BF16));
/// # Ok::<(), atomrl_core::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ComputeDtype {
    /// 32-bit floats (the default; exact on every device).
    #[default]
    F32,
    /// bfloat16 (the usual choice on CUDA).
    Bf16,
    /// IEEE half precision.
    F16,
}

impl ComputeDtype {
    /// Every name, in declaration order.
    pub const NAMES: [&'static str; 3] = ["f32", "bf16", "f16"];

    /// The candle dtype.
    pub fn dtype(self) -> DType {
        match self {
            Self::F32 => DType::F32,
            Self::Bf16 => DType::BF16,
            Self::F16 => DType::F16,
        }
    }

    /// The configuration name (`f32`, `bf16`, `f16`).
    pub fn name(self) -> &'static str {
        Self::NAMES[self as usize]
    }
}

impl fmt::Display for ComputeDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ComputeDtype {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "f32" => Ok(Self::F32),
            "bf16" => Ok(Self::Bf16),
            "f16" => Ok(Self::F16),
            other => Err(Error::unknown_choice(FUNC, "dtype", &Self::NAMES, other)),
        }
    }
}

/// The device a run computes on (`device`): `cpu`, `cuda` (GPU 0) or `cuda:N`.
///
/// ```
/// use atomrl_trainer::config::DeviceSpec;
/// assert_eq!("cuda:1".parse::<DeviceSpec>()?, DeviceSpec::Cuda(Some(1)));
/// assert_eq!("cuda".parse::<DeviceSpec>()?.to_string(), "cuda");
/// assert!("tpu".parse::<DeviceSpec>().unwrap_err().to_string().contains("device"));
/// # Ok::<(), atomrl_core::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum DeviceSpec {
    /// The CPU.
    #[default]
    Cpu,
    /// A CUDA GPU: `None` is `cuda` (GPU 0), `Some(n)` is `cuda:n`.
    Cuda(Option<usize>),
}

impl DeviceSpec {
    /// Whether this is the CPU.
    pub fn is_cpu(self) -> bool {
        self == Self::Cpu
    }
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Cpu => f.write_str("cpu"),
            Self::Cuda(None) => f.write_str("cuda"),
            Self::Cuda(Some(n)) => write!(f, "cuda:{n}"),
        }
    }
}

impl FromStr for DeviceSpec {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "cpu" => Ok(Self::Cpu),
            "cuda" => Ok(Self::Cuda(None)),
            d => match d.strip_prefix("cuda:").map(str::parse::<usize>) {
                Some(Ok(n)) => Ok(Self::Cuda(Some(n))),
                Some(Err(_)) => Err(Error::value(FUNC, "device", "cuda:N with N a GPU index", d)),
                None => Err(Error::value(FUNC, "device", "cpu, cuda or cuda:N", d)),
            },
        }
    }
}

impl TryFrom<String> for DeviceSpec {
    type Error = Error;

    fn try_from(s: String) -> Result<Self> {
        s.parse()
    }
}

impl From<DeviceSpec> for String {
    fn from(d: DeviceSpec) -> Self {
        d.to_string()
    }
}

/// Where a run resumes from (`resume`): `auto` (the latest complete checkpoint in
/// `output_dir`, if any), `never`, or a checkpoint folder.
///
/// ```
/// use atomrl_trainer::config::Resume;
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
        for name in ComputeDtype::NAMES {
            let d: ComputeDtype = serde_json::from_value(name.into()).unwrap();
            assert_eq!(
                (d.name(), serde_json::to_value(d).unwrap()),
                (name, name.into())
            );
        }
        for name in ["cpu", "cuda", "cuda:3"] {
            let d: DeviceSpec = serde_json::from_value(name.into()).unwrap();
            assert_eq!(serde_json::to_value(d).unwrap(), serde_json::json!(name));
        }
        for name in ["auto", "never", "runs/x/checkpoint-2"] {
            let r: Resume = serde_json::from_value(name.into()).unwrap();
            assert_eq!(serde_json::to_value(&r).unwrap(), serde_json::json!(name));
        }
        assert!(serde_json::from_value::<DeviceSpec>("cuda:x".into()).is_err());
        assert!(serde_json::from_value::<ComputeDtype>("f64".into()).is_err());
    }
}
