//! A run's logged completions (`samples.jsonl`) by step, for the rollout browser.

use std::path::Path;

use atomrl_metrics::{SAMPLES_FILE, STEP_KEY};
use serde_json::Value;

/// The logged completions of a run: the steps that have some, or one step's records.
///
/// Each line is an object with `step` and `index` and the fields of
/// [`atomrl_core::RolloutRecord`]; older runs logged only `prompt`, `completion` and `reward`,
/// and their lines are passed on as they are (the page shows what a line has). A line being
/// written (no newline yet) is left for the next read; a corrupt one is skipped with a
/// message naming `samples.jsonl:LINE`.
///
/// ```
/// use atomrl_dashboard::Rollouts;
/// let dir = std::env::temp_dir().join(format!("atomrl-doc-rollouts-{}", std::process::id()));
/// std::fs::create_dir_all(&dir)?;
/// std::fs::write(dir.join("samples.jsonl"), concat!(
///     "{\"step\":10,\"index\":0,\"prompt\":\"2+2?\",\"completion\":\"4\",\"reward\":1.0}\n",
///     "oops\n",
///     "{\"step\":20,\"index\":0,\"prompt\":\"3+3?\",\"completion\":\"6\",\"reward\":1.0}\n",
/// ))?;
/// let r = Rollouts::read(&dir);
/// assert_eq!(r.steps(), [10, 20]);
/// assert_eq!(r.at(20)[0]["completion"], "6");
/// assert!(r.messages[0].contains("samples.jsonl:2"));
/// # std::fs::remove_dir_all(&dir)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Default)]
pub struct Rollouts {
    records: Vec<(u64, Value)>,
    /// What could not be read.
    pub messages: Vec<String>,
}

impl Rollouts {
    /// Reads the run folder's `samples.jsonl` (none: no records, no message).
    pub fn read(dir: &Path) -> Self {
        let path = dir.join(SAMPLES_FILE);
        let mut out = Self::default();
        let text = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return out,
            Err(e) => {
                out.messages.push(format!("{}: {e}", path.display()));
                return out;
            }
        };
        let complete = text.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        for (i, line) in text[..complete].split(|&b| b == b'\n').enumerate() {
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let parsed = serde_json::from_slice::<Value>(line)
                .ok()
                .and_then(|v| Some((v.get(STEP_KEY)?.as_u64()?, v)));
            match parsed {
                Some(r) => out.records.push(r),
                None if out.messages.len() < 20 => out.messages.push(format!(
                    "{}:{}: not a sample record; line skipped",
                    path.display(),
                    i + 1
                )),
                None => {}
            }
        }
        out
    }

    /// The steps with records, increasing.
    pub fn steps(&self) -> Vec<u64> {
        let mut s: Vec<u64> = self.records.iter().map(|(s, _)| *s).collect();
        s.sort_unstable();
        s.dedup();
        s
    }

    /// The records of `step`, in file order.
    pub fn at(&self, step: u64) -> Vec<&Value> {
        self.records
            .iter()
            .filter(|(s, _)| *s == step)
            .map(|(_, v)| v)
            .collect()
    }
}
