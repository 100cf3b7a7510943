//! Where and in what precision a model computes: [`DeviceSpec`] (`cpu`, `cuda`, `cuda:N`) and
//! [`ComputeDtype`] (`f32`, `bf16`, `f16`). Both are parsed once, from a run configuration or
//! a command-line flag, and write back the name they were parsed from; every AtomRL command
//! picks its device and dtype through them, so they accept and reject the same names.

use std::fmt;
use std::str::FromStr;

use candle_core::{DType, Device};
use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// The function named by parse errors: these names are keys of the run configuration.
const FUNC: &str = "config";

/// Compute dtype of the forward and backward (`dtype`): `f32`, `bf16` or `f16`.
///
/// ```
/// use atomrl_core::ComputeDtype;
/// let d: ComputeDtype = "bf16".parse()?;
/// assert_eq!((d, d.to_string(), d.dtype()), (ComputeDtype::Bf16, "bf16".to_string(), candle_core::DType::BF16));
/// assert!("f64".parse::<ComputeDtype>().is_err());
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
    ///
    /// ```
    /// assert_eq!(atomrl_core::ComputeDtype::NAMES[1], "bf16");
    /// ```
    pub const NAMES: [&'static str; 3] = ["f32", "bf16", "f16"];

    /// The candle dtype.
    ///
    /// ```
    /// assert_eq!(atomrl_core::ComputeDtype::F16.dtype(), candle_core::DType::F16);
    /// ```
    pub fn dtype(self) -> DType {
        match self {
            Self::F32 => DType::F32,
            Self::Bf16 => DType::BF16,
            Self::F16 => DType::F16,
        }
    }

    /// The configuration name (`f32`, `bf16`, `f16`).
    ///
    /// ```
    /// assert_eq!(atomrl_core::ComputeDtype::Bf16.name(), "bf16");
    /// ```
    pub fn name(self) -> &'static str {
        Self::NAMES[self as usize]
    }
}

impl fmt::Display for ComputeDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // `pad`, not `write_str`: tables print it with a width (`{d:>4}`).
        f.pad(self.name())
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
/// use atomrl_core::DeviceSpec;
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
    ///
    /// ```
    /// assert!(atomrl_core::DeviceSpec::Cpu.is_cpu());
    /// ```
    pub fn is_cpu(self) -> bool {
        self == Self::Cpu
    }

    /// Opens the device.
    ///
    /// # Errors
    /// [`Error::Value`] for a CUDA device in a build without CUDA (saying how to build with
    /// it), or a CUDA device that cannot be opened.
    ///
    /// ```
    /// assert!(atomrl_core::DeviceSpec::Cpu.open()?.is_cpu());
    /// # Ok::<(), atomrl_core::Error>(())
    /// ```
    pub fn open(self) -> Result<Device> {
        let ordinal = match self {
            Self::Cpu => return Ok(Device::Cpu),
            Self::Cuda(n) => n.unwrap_or(0),
        };
        // Checked first so that a CPU-only build says how to get CUDA instead of candle's
        // generic "not compiled with cuda" error.
        if !candle_core::utils::cuda_is_available() {
            return Err(Error::value(
                "device",
                "device",
                "a device this binary supports (rebuild with `--features cuda` for CUDA)",
                self,
            ));
        }
        let device = Device::new_cuda(ordinal).map_err(|e| {
            Error::value(
                "device",
                "device",
                "an available CUDA device",
                format!("{self}: {e}"),
            )
        })?;
        #[cfg(feature = "cuda")]
        if let Device::Cuda(d) = &device {
            crate::cuda::configure_device(d);
        }
        Ok(device)
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

/// The environment variable that turns AtomRL's own CUDA kernels off: `ATOMRL_CUDA_FUSED=0`.
pub const CUDA_FUSED_ENV: &str = "ATOMRL_CUDA_FUSED";

/// Whether AtomRL's own CUDA kernels (in-place optimizer and gradient kernels, and the fused
/// model kernels as they land) are used on CUDA tensors: on unless the environment sets
/// [`CUDA_FUSED_ENV`] to `0`, `false`, `off` or `no`, in which case every CUDA op takes the
/// tensor-op form of earlier releases (the off switch for a user who hits a bad kernel).
/// Read once per process.
///
/// ```
/// // Unset in tests: on.
/// assert!(atomrl_core::device::cuda_fused_kernels() || std::env::var("ATOMRL_CUDA_FUSED").is_ok());
/// assert!(!atomrl_core::device::fused_switch_value(Some("0")));
/// assert!(atomrl_core::device::fused_switch_value(None));
/// ```
pub fn cuda_fused_kernels() -> bool {
    FUSED.get()
}

/// A process-wide on/off switch read from an environment variable once, which the process can
/// override.
struct Switch {
    env: &'static str,
    from_env: std::sync::OnceLock<bool>,
    /// 0: follow the environment; 1: on; 2: off.
    forced: std::sync::atomic::AtomicU8,
}

impl Switch {
    const fn new(env: &'static str) -> Self {
        Self {
            env,
            from_env: std::sync::OnceLock::new(),
            forced: std::sync::atomic::AtomicU8::new(0),
        }
    }

    fn get(&self) -> bool {
        match self.forced.load(std::sync::atomic::Ordering::Relaxed) {
            1 => true,
            2 => false,
            _ => *self
                .from_env
                .get_or_init(|| fused_switch_value(std::env::var(self.env).ok().as_deref())),
        }
    }

    fn set(&self, on: Option<bool>) {
        let v = match on {
            None => 0,
            Some(true) => 1,
            Some(false) => 2,
        };
        self.forced.store(v, std::sync::atomic::Ordering::Relaxed);
    }
}

static FUSED: Switch = Switch::new(CUDA_FUSED_ENV);
static GRAPHS: Switch = Switch::new(CUDA_GRAPHS_ENV);
static DECODE_MERGE: Switch = Switch::new(DECODE_MERGE_ENV);

/// Overrides [`cuda_fused_kernels`] for this process (`None`: follow the environment again),
/// so that one process can compare the fused kernels with the tensor-op forms
/// (`xtask device-check`).
pub fn set_cuda_fused_kernels(on: Option<bool>) {
    FUSED.set(on);
}

/// The environment variable that turns CUDA graphs off for decoding: `ATOMRL_CUDA_GRAPHS=0`
/// (decoding then takes the eager cached steps of earlier releases; a static decoder asked for
/// explicitly runs its kernels one by one, as a graph would replay them).
pub const CUDA_GRAPHS_ENV: &str = "ATOMRL_CUDA_GRAPHS";

/// Whether decode steps on CUDA are captured into a CUDA graph and replayed: on unless
/// [`CUDA_GRAPHS_ENV`] reads as off (the same values as [`CUDA_FUSED_ENV`]) or
/// [`set_cuda_graphs`] says otherwise.
///
/// ```
/// assert!(atomrl_core::device::cuda_graphs() || std::env::var("ATOMRL_CUDA_GRAPHS").is_ok());
/// ```
pub fn cuda_graphs() -> bool {
    GRAPHS.get()
}

/// Overrides [`cuda_graphs`] for this process (`None`: follow the environment again), so that
/// one process can measure decoding with and without graphs (`xtask bench`).
///
/// ```
/// atomrl_core::device::set_cuda_graphs(Some(false));
/// assert!(!atomrl_core::device::cuda_graphs());
/// atomrl_core::device::set_cuda_graphs(None);
/// ```
pub fn set_cuda_graphs(on: Option<bool>) {
    GRAPHS.set(on);
}

/// The environment variable that turns the decode step's merges off: `ATOMRL_DECODE_MERGE=0`
/// (q, k and v projected apart, gate and up apart, each residual add apart from the RMSNorm
/// after it: three to five kernels more per decoder layer, for an A/B or a suspect merge).
pub const DECODE_MERGE_ENV: &str = "ATOMRL_DECODE_MERGE";

/// Whether static decode steps merge the q/k/v and the gate/up projections into one matmul
/// each and run each residual add with the RMSNorm after it as one kernel: on unless
/// [`DECODE_MERGE_ENV`] reads as off or [`set_decode_merge`] says otherwise.
///
/// ```
/// assert!(atomrl_core::device::decode_merge() || std::env::var("ATOMRL_DECODE_MERGE").is_ok());
/// ```
pub fn decode_merge() -> bool {
    DECODE_MERGE.get()
}

/// Overrides [`decode_merge`] for this process (`None`: follow the environment again).
///
/// ```
/// atomrl_core::device::set_decode_merge(Some(false));
/// assert!(!atomrl_core::device::decode_merge());
/// atomrl_core::device::set_decode_merge(None);
/// ```
pub fn set_decode_merge(on: Option<bool>) {
    DECODE_MERGE.set(on);
}

/// How a value of [`CUDA_FUSED_ENV`] reads (`None`: unset, which means on).
pub fn fused_switch_value(value: Option<&str>) -> bool {
    !matches!(
        value.map(|v| v.trim().to_ascii_lowercase()).as_deref(),
        Some("0" | "false" | "off" | "no")
    )
}

/// Whether a fast path (a kernel of AtomRL's, or a library call) may be used in this process:
/// `check` runs once per `cell`, on first use, and says what differs from the reference form
/// (`None`: they agree). A disagreement or a failure prints a warning naming `what` and
/// `fallback`, and the caller keeps the fallback, so a bad fast path costs speed, not
/// correctness.
///
/// ```
/// use std::sync::OnceLock;
/// static CHECKED: OnceLock<bool> = OnceLock::new();
/// let ok = atomrl_core::device::verified_once(&CHECKED, "a kernel", "its tensor-op form", || {
///     Ok::<_, String>(Some("off by 1".to_string()))
/// });
/// assert!(!ok); // warned once; later calls return the same answer without checking
/// assert!(!atomrl_core::device::verified_once(&CHECKED, "a kernel", "its tensor-op form", || {
///     Ok::<_, String>(None)
/// }));
/// ```
pub fn verified_once<E: fmt::Display>(
    cell: &std::sync::OnceLock<bool>,
    what: &str,
    fallback: &str,
    check: impl FnOnce() -> std::result::Result<Option<String>, E>,
) -> bool {
    *cell.get_or_init(|| match check() {
        Ok(None) => true,
        Ok(Some(diff)) => {
            eprintln!(
                "warning: {what} disagrees with {fallback} on this GPU ({diff}); using {fallback}"
            );
            false
        }
        Err(e) => {
            eprintln!("warning: {what} failed its self-check ({e}); using {fallback}");
            false
        }
    })
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
        assert!(serde_json::from_value::<DeviceSpec>("cuda:x".into()).is_err());
        assert!(serde_json::from_value::<ComputeDtype>("f64".into()).is_err());
    }
}
