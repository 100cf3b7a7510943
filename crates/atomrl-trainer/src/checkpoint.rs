//! Checkpoints: `output_dir/checkpoint-STEP/` in Hugging Face format (full model, or a PEFT
//! adapter with LoRA) plus the trainer state, written atomically and rotated.
//!
//! A checkpoint folder is first written as `.checkpoint-STEP.tmp` and renamed into place only
//! when complete, so a run killed mid-save leaves the previous checkpoint as the latest one.

use std::path::{Path, PathBuf};

use atomrl_core::{Error, Result};
use atomrl_model::CausalLm;
use serde::{Deserialize, Serialize};

use crate::config::Recipe;
use crate::data::SamplerState;
use crate::optim::AdamW;

/// File of the trainer state inside a checkpoint.
pub const TRAINER_STATE_FILE: &str = "trainer_state.json";
/// File of the optimizer moments inside a checkpoint.
pub const OPTIMIZER_FILE: &str = "optimizer.safetensors";

/// Everything besides weights and optimizer moments that a resumed run needs to continue
/// exactly where the saved one was.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainerState {
    /// Optimizer steps completed.
    pub step: u64,
    /// Position of the data sampler (epoch, index).
    pub sampler: SamplerState,
    /// Steps skipped because the loss or gradient norm was not finite.
    pub skipped_steps: u64,
    /// The seed of the run (sampling seeds are derived from it and the step).
    pub seed: u64,
    /// Last held-out accuracy, if evaluated.
    pub eval_accuracy: Option<f64>,
    /// The recipe, for information.
    pub recipe: Recipe,
    /// Data-parallel processes (MPI ranks) of the run; a resume must use as many, since the
    /// shards and the sampling seeds follow from it. 1 in checkpoints from before it was kept.
    #[serde(default = "one")]
    pub world_size: usize,
}

fn one() -> usize {
    1
}

/// Writes `output_dir/checkpoint-{state.step}` atomically: the model (HF folder, or PEFT adapter
/// plus `config.json` when LoRA is on), `optimizer.safetensors`, `trainer_state.json`, and
/// whatever `extra` writes into the folder (a recipe's critic). Then deletes the oldest
/// checkpoints beyond `keep` (0 keeps all). Returns the folder.
///
/// # Errors
/// [`Error::File`] naming the path that could not be written.
pub fn save_checkpoint(
    output_dir: &Path,
    model: &CausalLm,
    optimizer: &AdamW,
    state: &TrainerState,
    keep: usize,
    extra: &dyn Fn(&Path) -> Result<()>,
) -> Result<PathBuf> {
    let final_dir = output_dir.join(format!("checkpoint-{}", state.step));
    let tmp = output_dir.join(format!(".checkpoint-{}.tmp", state.step));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(|e| Error::file(tmp.display(), e))?;
    }
    std::fs::create_dir_all(&tmp).map_err(|e| Error::file(tmp.display(), e))?;
    if model.lora_config().is_some() {
        model.save_lora(&tmp)?;
    } else {
        model.save_hf(&tmp)?;
    }
    optimizer.save(&tmp.join(OPTIMIZER_FILE))?;
    extra(&tmp)?;
    let json =
        serde_json::to_string_pretty(state).map_err(|e| Error::file(TRAINER_STATE_FILE, e))?;
    let state_path = tmp.join(TRAINER_STATE_FILE);
    std::fs::write(&state_path, json).map_err(|e| Error::file(state_path.display(), e))?;
    if final_dir.exists() {
        std::fs::remove_dir_all(&final_dir).map_err(|e| Error::file(final_dir.display(), e))?;
    }
    std::fs::rename(&tmp, &final_dir).map_err(|e| Error::file(final_dir.display(), e))?;
    rotate(output_dir, keep)?;
    Ok(final_dir)
}

/// Complete checkpoints in `output_dir` (those with a trainer state), oldest first.
///
/// # Errors
/// [`Error::File`] when `output_dir` exists but cannot be listed.
pub fn list_checkpoints(output_dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    if !output_dir.is_dir() {
        return Ok(Vec::new());
    }
    let entries =
        std::fs::read_dir(output_dir).map_err(|e| Error::file(output_dir.display(), e))?;
    let mut found: Vec<(u64, PathBuf)> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().to_string();
            let step = name.strip_prefix("checkpoint-")?.parse::<u64>().ok()?;
            let path = e.path();
            path.join(TRAINER_STATE_FILE)
                .is_file()
                .then_some((step, path))
        })
        .collect();
    found.sort();
    Ok(found)
}

/// The latest complete checkpoint in `output_dir`, if any.
///
/// # Errors
/// As [`list_checkpoints`].
pub fn latest_checkpoint(output_dir: &Path) -> Result<Option<PathBuf>> {
    Ok(list_checkpoints(output_dir)?.pop().map(|(_, p)| p))
}

/// Reads a checkpoint's trainer state.
///
/// # Errors
/// [`Error::File`] for a missing or malformed `trainer_state.json`.
pub fn load_trainer_state(checkpoint: &Path) -> Result<TrainerState> {
    let path = checkpoint.join(TRAINER_STATE_FILE);
    let text = std::fs::read_to_string(&path).map_err(|e| Error::file(path.display(), e))?;
    serde_json::from_str(&text).map_err(|e| Error::file(path.display(), e))
}

fn rotate(output_dir: &Path, keep: usize) -> Result<()> {
    if keep == 0 {
        return Ok(());
    }
    let all = list_checkpoints(output_dir)?;
    for (_, path) in all.iter().take(all.len().saturating_sub(keep)) {
        std::fs::remove_dir_all(path).map_err(|e| Error::file(path.display(), e))?;
    }
    Ok(())
}
