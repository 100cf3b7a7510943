//! The step of a recipe: what the shared training loop ([`crate::Trainer::train`]) calls once
//! per optimizer step. GRPO/DAPO (`grpo::step`) and SFT ([`crate::sft`]) implement it; the
//! loop does not branch on the recipe.

use atomrl_core::{Error, Result};

use crate::data::EpochSampler;
use crate::grpo::Trainer;
use crate::logging::MetricRow;

/// One recipe's optimizer step on the shared loop (sampling, checkpoints, resume, metrics and
/// evaluation are the loop's).
pub(crate) trait RecipeStep: Send {
    /// Step `step` (1-based) at learning rate `lr`, drawing its examples from `sampler`;
    /// returns the step's metrics.
    fn step(
        &mut self,
        trainer: &mut Trainer,
        step: u64,
        lr: f64,
        sampler: &mut EpochSampler,
    ) -> Result<MetricRow>;

    /// The held-out loss, for a recipe that has one (SFT's teacher-forced loss).
    fn eval_loss(&self, _trainer: &Trainer) -> Result<Option<f64>> {
        Ok(None)
    }
}

/// Stands in the trainer for its recipe while the recipe runs a step (the step borrows the
/// trainer mutably); never asked to step itself.
pub(crate) struct Stepping;

impl RecipeStep for Stepping {
    fn step(&mut self, _: &mut Trainer, _: u64, _: f64, _: &mut EpochSampler) -> Result<MetricRow> {
        Err(Error::value(
            "Trainer",
            "recipe",
            "a recipe to step",
            "a step already in progress",
        ))
    }
}
