//! Download progress: a bar per file on a terminal, one line per file otherwise.

use std::io::IsTerminal;

use indicatif::{HumanBytes, ProgressBar, ProgressStyle};

/// `hf_hub`'s progress callbacks for one file, labelled `org/name/file`.
pub(crate) struct FileProgress {
    label: String,
    bar: Option<ProgressBar>,
    size: usize,
    enabled: bool,
}

impl FileProgress {
    pub(crate) fn new(label: String, enabled: bool) -> Self {
        Self {
            label,
            bar: None,
            size: 0,
            enabled,
        }
    }
}

impl hf_hub::api::Progress for FileProgress {
    fn init(&mut self, size: usize, _filename: &str) {
        self.size = size;
        // hf-hub calls `init` again when it resumes after a dropped connection.
        if !self.enabled || self.bar.is_some() || !std::io::stderr().is_terminal() {
            return;
        }
        let bar = ProgressBar::new(size as u64);
        if let Ok(style) = ProgressStyle::with_template(
            "{msg} [{elapsed_precise}] [{wide_bar}] {bytes}/{total_bytes} {bytes_per_sec} ({eta})",
        ) {
            bar.set_style(style);
        }
        bar.set_message(self.label.clone());
        self.bar = Some(bar);
    }

    fn update(&mut self, size: usize) {
        if let Some(bar) = &self.bar {
            bar.inc(size as u64);
        }
    }

    fn finish(&mut self) {
        match self.bar.take() {
            Some(bar) => bar.finish(),
            None if self.enabled => {
                eprintln!(
                    "downloaded {} ({})",
                    self.label,
                    HumanBytes(self.size as u64)
                );
            }
            None => {}
        }
    }
}
