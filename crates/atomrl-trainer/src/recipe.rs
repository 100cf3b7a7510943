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

    /// The pair experience of preference `examples` (each prompt encoded, each side with EOS,
    /// cut to `max_completion_length`) on `device`: DPO's and the reward model's rows.
    pub fn encode_pairs(
        &self,
        examples: &[&Example],
        device: &candle_core::Device,
    ) -> Result<Experience> {
        let max = self.args.max_completion_length;
        self.encoder
            .encode_pairs(&self.tokenizer, examples, max, device)
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
/// above the progress bar), and the completions for the sample log.
#[derive(Default)]
pub(crate) struct StepReport {
    pub row: MetricRow,
    pub warnings: Vec<String>,
    pub records: Vec<atomrl_core::RolloutRecord>,
}

/// One recipe's optimizer step on the shared loop (sampling, checkpoints, resume, metrics and
/// evaluation are the loop's).
pub(crate) trait RecipeStep: Send {
    /// Rejects a training set this recipe cannot train on, before the run does any work (the
    /// opening evaluation included), with the key named.
    fn check_data(&self, _run: &RunData) -> Result<()> {
        Ok(())
    }

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

    /// The recipe's own held-out measures: a loss (SFT's teacher-forced loss, the pairs' DPO
    /// or reward-model loss), the share of held-out pairs ranked right, and whether greedy
    /// decoding of the held-out prompts is also worth measuring (not for a reward model).
    fn held_out(&self, _run: &RunData, _state: &TrainState) -> Result<HeldOut> {
        Ok(HeldOut::default())
    }
}

/// What [`RecipeStep::held_out`] measured.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HeldOut {
    pub loss: Option<f64>,
    pub pair_accuracy: Option<f64>,
    /// A reward model's held-out score spread ([`atomrl_rollout::EvalResult::score_std`]).
    pub score_std: Option<f64>,
    /// Greedy decoding of the held-out prompts measures this recipe's model.
    pub generation: bool,
}

impl Default for HeldOut {
    fn default() -> Self {
        Self {
            loss: None,
            pair_accuracy: None,
            score_std: None,
            generation: true,
        }
    }
}

/// Held-out pairs per forward of [`held_out_pairs`].
const EVAL_PAIRS_BATCH: usize = 16;

/// The held-out preference pairs of `run` (its evaluation examples that have one), encoded in
/// batches; `score(batch, total_pairs)` gives each batch's share of the mean loss and its
/// pairs ranked right (`None`: not finite). `(mean loss, pair accuracy)`; the loss is NaN when
/// a batch was not finite; `None` without held-out pairs.
pub(crate) fn held_out_pairs(
    run: &RunData,
    state: &TrainState,
    mut score: impl FnMut(Experience, f64) -> Result<Option<(f64, f64)>>,
) -> Result<Option<(f64, f64)>> {
    let pairs: Vec<&Example> = run
        .eval_set
        .iter()
        .filter(|e| e.preference.is_some())
        .collect();
    if pairs.is_empty() {
        return Ok(None);
    }
    let total = pairs.len() as f64;
    let (mut loss, mut correct) = (0.0, 0.0);
    for chunk in pairs.chunks(EVAL_PAIRS_BATCH) {
        match score(run.encode_pairs(chunk, state.model.device())?, total)? {
            Some((l, c)) => {
                loss += l;
                correct += c;
            }
            None => loss = f64::NAN,
        }
    }
    Ok(Some((loss, correct / total)))
}
