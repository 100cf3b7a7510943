//! The step of a recipe, in two phases the shared training loop ([`crate::Trainer::train`])
//! calls once per optimizer step: make the experience (reading the state), then update the
//! state from it. GRPO/DAPO (`grpo::step`) and SFT ([`crate::sft`]) implement it; the loop
//! does not branch on the recipe.

use atomrl_core::Result;
use atomrl_rollout::{Experience, PromptEncoder, RolloutSummary};
use atomrl_sample::ChatTokenizer;
use atomrl_tools::ToolSet;

use crate::config::GRPOArgs;
use crate::data::{EpochSampler, Example};
use crate::logging::MetricRow;
use crate::state::TrainState;

/// What a run reads and never changes: its settings, tokenizer, data, prompt encoding and
/// tools.
pub(crate) struct RunData {
    pub args: GRPOArgs,
    pub tokenizer: ChatTokenizer,
    pub train_set: Vec<Example>,
    pub eval_set: Vec<Example>,
    pub encoder: PromptEncoder,
    /// The tools of multi-turn rollouts and evaluation (empty: single-turn).
    pub tools: ToolSet,
}

impl RunData {
    /// The run's tools with their turn limit (`None` without tools).
    pub fn tool_use(&self) -> Option<atomrl_sample::ToolUse<'_>> {
        (!self.tools.is_empty()).then_some(atomrl_sample::ToolUse {
            tools: &self.tools,
            max_tool_turns: self.args.max_tool_turns,
        })
    }

    /// `batch_size` examples from `sampler`.
    pub fn next_examples(&self, sampler: &mut EpochSampler) -> Vec<&Example> {
        sampler
            .next_batch(self.args.batch_size)
            .into_iter()
            .map(|i| &self.train_set[i])
            .collect()
    }
}

/// A step's experience, with what the metrics need from its making.
pub(crate) struct StepExperience {
    /// What the update trains on.
    pub experience: Experience,
    /// The rollouts' measurements (recipes that generate).
    pub rollouts: Option<RolloutSummary>,
    /// Seconds spent making it.
    pub seconds: f64,
}

/// What a step reports: its metrics, its warnings (printed by the loop through the logger,
/// above the progress bar), and a few samples for the log.
#[derive(Default)]
pub(crate) struct StepReport {
    pub row: MetricRow,
    pub warnings: Vec<String>,
    pub samples: Vec<(String, String, f64)>,
}

/// One recipe's optimizer step on the shared loop (sampling, checkpoints, resume, metrics and
/// evaluation are the loop's).
pub(crate) trait RecipeStep: Send {
    /// Step `step`'s (1-based) experience, from the examples `sampler` gives; reads the state.
    fn experience(
        &mut self,
        run: &RunData,
        state: &TrainState,
        step: u64,
        sampler: &mut EpochSampler,
    ) -> Result<StepExperience>;

    /// The update of `state` on `made` at learning rate `lr`; the step's report.
    fn update(
        &mut self,
        run: &RunData,
        state: &mut TrainState,
        made: &StepExperience,
        step: u64,
        lr: f64,
    ) -> Result<StepReport>;

    /// Writes what the recipe holds besides the policy and its optimizer (a critic, a KL
    /// coefficient) into checkpoint folder `dir`.
    fn save(&self, _dir: &std::path::Path) -> Result<()> {
        Ok(())
    }

    /// Restores what [`RecipeStep::save`] wrote to checkpoint folder `dir`.
    fn load(&mut self, _dir: &std::path::Path) -> Result<()> {
        Ok(())
    }

    /// The held-out loss, for a recipe that has one (SFT's teacher-forced loss).
    fn eval_loss(&self, _run: &RunData, _state: &TrainState) -> Result<Option<f64>> {
        Ok(None)
    }
}
