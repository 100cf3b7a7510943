//! `status.json`: whether a run is running, finished or failed, and which process runs it, so
//! that a reader (the dashboard) can tell a live run from a killed one.

use std::fs;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use atomrl_core::{Error, Result};

/// File name of the run's status in the output folder.
pub const STATUS_FILE: &str = "status.json";

/// What a run's process last said of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunState {
    /// Training (or killed while training: see [`RunStatus::process_alive`]).
    Running,
    /// Ended normally.
    Finished,
    /// Ended with an error.
    Failed,
}

/// The content of `status.json`, written by the run's logger at the start (`running`), at the
/// end (`finished`) and on an error (`failed`). A process killed outright (SIGKILL, power
/// loss) leaves `running` behind with a process that no longer exists: a reader tells that
/// from a live run with [`RunStatus::process_alive`].
///
/// ```
/// use atomrl_metrics::{RunState, RunStatus};
/// let dir = std::env::temp_dir().join(format!("atomrl-doc-status-{}", std::process::id()));
/// RunStatus::start(&dir, 40)?;
/// let s = RunStatus::read(&dir)?.expect("written");
/// assert_eq!((s.state, s.steps_planned), (RunState::Running, 40));
/// assert_eq!(s.process_alive(), Some(true)); // this process
/// RunStatus::end(&dir, Err("out of memory"))?;
/// let s = RunStatus::read(&dir)?.expect("written");
/// assert_eq!((s.state, s.error.as_deref()), (RunState::Failed, Some("out of memory")));
/// # std::fs::remove_dir_all(&dir)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RunStatus {
    /// What the run's process last said.
    pub state: RunState,
    /// Steps the run plans.
    pub steps_planned: u64,
    /// When the run first started (kept across resumes), Unix seconds.
    pub started_at: f64,
    /// When this status was written, Unix seconds.
    pub updated_at: f64,
    /// The process's id.
    pub pid: u32,
    /// The process's name (`/proc/self/comm`), to tell a reused process id from the run.
    #[serde(default)]
    pub process: Option<String>,
    /// The machine's name, to tell whether the process can be looked up from here.
    #[serde(default)]
    pub host: Option<String>,
    /// The error a failed run ended with.
    #[serde(default)]
    pub error: Option<String>,
}

impl RunStatus {
    /// Writes a `running` status for this process into `dir`, planning `steps_planned` steps;
    /// the start time of an earlier status in `dir` (a resumed run) is kept.
    ///
    /// # Errors
    /// [`Error::File`] when the file cannot be written.
    ///
    /// See [`RunStatus`] for an example.
    pub fn start(dir: &Path, steps_planned: u64) -> Result<Self> {
        let now = unix_now();
        let started_at = Self::read(dir).ok().flatten().map_or(now, |s| s.started_at);
        let status = Self {
            state: RunState::Running,
            steps_planned,
            started_at,
            updated_at: now,
            pid: std::process::id(),
            process: process_name(std::process::id()),
            host: host_name(),
            error: None,
        };
        status.write(dir)?;
        Ok(status)
    }

    /// Marks the run in `dir` `finished` (`Ok`) or `failed` with its error (`Err`).
    ///
    /// # Errors
    /// [`Error::File`] when the file cannot be read or written.
    ///
    /// See [`RunStatus`] for an example.
    pub fn end(dir: &Path, outcome: std::result::Result<(), &str>) -> Result<()> {
        let mut status = match Self::read(dir)? {
            Some(s) => s,
            None => Self::start(dir, 0)?,
        };
        status.updated_at = unix_now();
        match outcome {
            Ok(()) => status.state = RunState::Finished,
            Err(e) => {
                status.state = RunState::Failed;
                status.error = Some(e.to_string());
            }
        }
        status.write(dir)
    }

    /// The status of the run in `dir` (`None` when it has none: a run from before runs wrote
    /// it).
    ///
    /// # Errors
    /// [`Error::File`] for an unreadable or malformed file.
    ///
    /// See [`RunStatus`] for an example.
    pub fn read(dir: &Path) -> Result<Option<Self>> {
        let path = dir.join(STATUS_FILE);
        let text = match fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Error::file(path.display(), e)),
        };
        serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| Error::file(path.display(), e))
    }

    /// Whether the process that wrote a `running` status still runs: `Some(true)` or
    /// `Some(false)` when it can be looked up from here (same machine, a `/proc` file
    /// system), `None` when it cannot.
    ///
    /// See [`RunStatus`] for an example.
    pub fn process_alive(&self) -> Option<bool> {
        if self.host != host_name() || !Path::new("/proc/self").exists() {
            return None;
        }
        let name = process_name(self.pid);
        Some(name.is_some() && (self.process.is_none() || name == self.process))
    }

    /// Writes the status atomically (a temporary file renamed over it), so that a reader never
    /// sees half a file.
    fn write(&self, dir: &Path) -> Result<()> {
        fs::create_dir_all(dir).map_err(|e| Error::file(dir.display(), e))?;
        let path = dir.join(STATUS_FILE);
        let tmp = dir.join(format!("{STATUS_FILE}.tmp"));
        let text =
            serde_json::to_string_pretty(self).map_err(|e| Error::file(path.display(), e))?;
        fs::write(&tmp, text).map_err(|e| Error::file(tmp.display(), e))?;
        fs::rename(&tmp, &path).map_err(|e| Error::file(path.display(), e))
    }
}

/// Seconds since the Unix epoch.
pub fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// The name of process `pid` (Linux's `/proc/PID/comm`).
fn process_name(pid: u32) -> Option<String> {
    fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|s| s.trim().to_string())
}

/// This machine's name (`/proc/sys/kernel/hostname`, else `$HOSTNAME`).
fn host_name() -> Option<String> {
    fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .or_else(|| std::env::var("HOSTNAME").ok())
}
