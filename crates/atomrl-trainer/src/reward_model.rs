//! The `reward` recipe: a reward model — the policy's transformer with a scalar head read at
//! each sequence's last token ([`ValueModel`] in the [`HeadLayout::Sequence`] layout) — trained
//! on the dataset's preference pairs by the Bradley-Terry loss (`compute_reward_model_loss`,
//! TRL's `RewardTrainer`), saved with every checkpoint as `reward_model/`, the folder
//! `transformers` loads as `AutoModelForSequenceClassification`.

use std::path::Path;
use std::time::Instant;

use atomrl_core::shape::scalar_f64;
use atomrl_core::{CandleContext, Result};
use atomrl_loss::compute_reward_model_loss;
use atomrl_model::{CausalLm, HeadLayout, ValueModel};
use atomrl_rollout::{experience_scores, pair_margins, split_pairs, Experience};
use candle_core::{Tensor, Var};

use crate::accumulate::{accumulate_and_step, MicroStatistics, StepSettings};
use crate::config::GRPOArgs;
use crate::data::EpochSampler;
use crate::logging::{keys, MetricRow};
use crate::optim::AdamW;
use crate::recipe::{held_out_pairs, HeldOut, RecipeStep, RunData, StepExperience, StepReport};
use crate::state::TrainState;

/// The reward model's folder inside a checkpoint (and the trained model a run leaves).
pub const REWARD_MODEL_DIR: &str = "reward_model";

/// The function errors name.
const FUNC: &str = "reward_model_step";

/// Micro-batches per worker at least (`gradient_accumulation_steps` if more), filled with
/// pairs of similar length ([`Experience::pairs_by_length`]) so that each is about as wide as
/// its own pairs; the loss is a mean over the step's pairs whatever the split. The embedded
/// example's one-layer reward model (2-core AMD EPYC, 64 pairs a step): 0.106 → 0.075 s.
const LENGTH_BUCKETS: usize = 4;

/// The `reward` recipe's step: the reward model, its trainable parameters and optimizer (the
/// run's AdamW settings and learning-rate schedule; the policy itself is not trained).
pub(crate) struct RewardModelStep {
    model: ValueModel,
    params: Vec<(String, Var)>,
    optimizer: AdamW,
    settings: StepSettings,
    center: Option<f64>,
    iterations: usize,
    /// The data was checked and the pad id set ([`RewardModelStep::prepare`]).
    prepared: bool,
}

impl RewardModelStep {
    /// A reward model starting from `policy`'s weights (its first `reward_model.num_layers`
    /// layers) with a zero head (with `[lora]`, adapters of its own on the transformer), in
    /// the policy's compute dtype.
    pub(crate) fn new(args: &GRPOArgs, policy: &CausalLm) -> Result<Self> {
        let mut model = match args.reward_model().num_layers {
            None => ValueModel::reward_model_from_policy(policy)?,
            Some(n) => ValueModel::reward_model_from_policy_layers(policy, n)
                .map_err(|_| crate::runtime::layers_error("reward_model.num_layers", policy, n))?,
        };
        if let Some(l) = &args.lora {
            model
                .add_lora(crate::runtime::lora_config(l)?, args.seed.wrapping_add(1))
                .map_err(|e| e.in_table("lora"))?;
        }
        model.set_compute_dtype(policy.compute_dtype())?;
        model.set_gradient_checkpointing(policy.gradient_checkpointing());
        let params = model.trainable_vars();
        let mut settings = args.step_settings();
        settings.accumulation = settings.accumulation.max(LENGTH_BUCKETS);
        Ok(Self {
            optimizer: AdamW::new(params.clone(), args.adamw())?,
            params,
            model,
            settings,
            center: args.reward_model().center_rewards_coefficient,
            iterations: args.num_iterations.max(1),
            prepared: false,
        })
    }

    /// Gives the reward model the tokenizer's pad id (its saved config needs it), once; the
    /// training set was checked by [`RecipeStep::check_data`].
    fn prepare(&mut self, run: &RunData) -> Result<()> {
        if !self.prepared {
            self.model.set_pad_token_id(run.tokenizer.pad_token_id());
            self.prepared = true;
        }
        Ok(())
    }
}

impl RecipeStep for RewardModelStep {
    /// The training set must be preference pairs.
    fn check_data(&self, run: &RunData) -> Result<()> {
        atomrl_data::require_preference_dataset(&run.train_set, "--recipe reward")
    }

    /// `batch_size` pairs of the dataset (which must be preference pairs).
    fn experience(
        &mut self,
        run: &RunData,
        state: &TrainState,
        _step: u64,
        sampler: &mut EpochSampler,
    ) -> Result<StepExperience> {
        let started = Instant::now();
        self.prepare(run)?;
        let picked = run.next_examples(sampler);
        let pairs = run.encode_pairs(&picked, state.model.device())?;
        let par = crate::parallel::Parallel {
            workers: self.settings.workers,
            comm: state.comm.as_ref(),
        };
        let chunks = par.micro_batches(pairs.num_rows() / 2, self.settings.accumulation);
        Ok(StepExperience {
            experience: pairs.pairs_by_length(&chunks, par.shards())?,
            rollouts: None,
            seconds: started.elapsed().as_secs_f64(),
        })
    }

    /// `num_iterations` optimizer steps of the reward model on the pairs, at the run's
    /// learning rate; `rewards/*` are the scores' means, accuracy and margin.
    fn update(
        &mut self,
        _run: &RunData,
        state: &mut TrainState,
        made: &StepExperience,
        step: u64,
        lr: f64,
    ) -> Result<StepReport> {
        let started = Instant::now();
        let exp = &made.experience;
        let pairs = (exp.num_rows() / 2) as f64;
        let (model, center) = (&self.model, self.center);
        let mut report = StepReport::default();
        let mut row = MetricRow::new(step);
        let mut stats = ScoreStats::default();
        for _ in 0..self.iterations {
            let (outcome, micro) = accumulate_and_step(
                &self.params,
                &mut self.optimizer,
                exp,
                StepSettings {
                    lr,
                    ..self.settings
                },
                state.comm.as_ref(),
                model.backbone().share_weight_casts(),
                |_, mb| pair_score_loss(model, &mb.compact()?, pairs, center),
            )?;
            stats = micro.iter().fold(ScoreStats::default(), |a, b| a.add(b));
            row.push(keys::LOSS, outcome.loss);
            row.push(keys::GRAD_NORM, outcome.grad_norm);
            if let Some(reason) = outcome.skipped {
                report
                    .warnings
                    .push(format!("step {step}: update skipped: {reason}"));
                row.push(keys::SKIPPED_STEP, 1.0);
                break;
            }
            row.push(keys::SKIPPED_STEP, 0.0);
        }
        row.push(keys::LR, lr);
        row.push(
            keys::TIME_STEP_S,
            made.seconds + started.elapsed().as_secs_f64(),
        );
        stats.record(&mut row);
        report.row = row;
        Ok(report)
    }

    /// Writes the reward model (`dir/reward_model/`, transformers' sequence-classification
    /// layout) and its optimizer.
    fn save(&self, dir: &Path) -> Result<()> {
        let out = dir.join(REWARD_MODEL_DIR);
        self.model.save_hf(&out)?;
        self.optimizer
            .save(&out.join(crate::checkpoint::OPTIMIZER_FILE))
    }

    /// Restores what [`RewardModelStep::save`] wrote to `dir`.
    fn load(&mut self, dir: &Path) -> Result<()> {
        let from = dir.join(REWARD_MODEL_DIR);
        self.model.load_trainable(&from)?;
        self.optimizer
            .load(&from.join(crate::checkpoint::OPTIMIZER_FILE))
    }

    /// The held-out pairs: their mean loss (`eval/loss`), the share the scores rank right
    /// (`eval/pair_accuracy`) and the scores' spread (`eval/score_std`); no decoding (the
    /// policy is not what this recipe trains).
    fn held_out(&self, run: &RunData, state: &TrainState) -> Result<HeldOut> {
        let mut all = ScoreStats::default();
        let measured = held_out_pairs(run, state, |exp, total| {
            let Some((loss, s)) = pair_score_loss(&self.model, &exp, total, self.center)? else {
                return Ok(None);
            };
            all = all.add(&s);
            Ok(Some((scalar_f64(FUNC, &loss)?, s.correct)))
        })?;
        Ok(HeldOut {
            loss: measured.map(|m| m.0),
            pair_accuracy: measured.map(|m| m.1),
            score_std: measured.map(|_| all.score_std()),
            generation: false,
        })
    }
}

/// Sums over a micro-batch's pairs of what the reward model reports.
#[derive(Debug, Clone, Copy, Default)]
struct ScoreStats {
    pairs: f64,
    chosen: f64,
    rejected: f64,
    correct: f64,
    /// Sum of both sides' squared scores.
    squares: f64,
}

impl ScoreStats {
    fn add(self, o: &Self) -> Self {
        Self {
            pairs: self.pairs + o.pairs,
            chosen: self.chosen + o.chosen,
            rejected: self.rejected + o.rejected,
            correct: self.correct + o.correct,
            squares: self.squares + o.squares,
        }
    }

    /// The population standard deviation of the scores of both sides (NaN without a pair).
    fn score_std(&self) -> f64 {
        let n = 2.0 * self.pairs;
        let mean = (self.chosen + self.rejected) / n;
        (self.squares / n - mean * mean).max(0.0).sqrt()
    }

    /// `rewards/chosen`, `rewards/rejected` (mean scores), `rewards/accuracies`,
    /// `rewards/margins` and `pairs`.
    fn record(&self, row: &mut MetricRow) {
        let mean = |v: f64| {
            if self.pairs > 0.0 {
                v / self.pairs
            } else {
                f64::NAN
            }
        };
        row.push(keys::DPO_PAIRS, self.pairs);
        row.push(keys::DPO_REWARDS_CHOSEN, mean(self.chosen));
        row.push(keys::DPO_REWARDS_REJECTED, mean(self.rejected));
        row.push(keys::DPO_REWARDS_ACCURACIES, mean(self.correct));
        row.push(keys::DPO_REWARDS_MARGINS, mean(self.chosen - self.rejected));
    }
}

impl MicroStatistics for ScoreStats {
    fn to_f64s(&self) -> Vec<f64> {
        vec![
            self.pairs,
            self.chosen,
            self.rejected,
            self.correct,
            self.squares,
        ]
    }

    fn from_f64s(v: &[f64]) -> Self {
        let at = |i: usize| v.get(i).copied().unwrap_or(f64::NAN);
        Self {
            pairs: at(0),
            chosen: at(1),
            rejected: at(2),
            correct: at(3),
            squares: at(4),
        }
    }
}

/// The reward-model loss of micro-batch `mb` (whole pairs): TRL's mean over its pairs, scaled
/// by its share of the step's `total_pairs` so that the micro-batches add up to the step's
/// mean; `None` when a score is not finite.
fn pair_score_loss(
    model: &ValueModel,
    mb: &Experience,
    total_pairs: f64,
    center: Option<f64>,
) -> Result<Option<(Tensor, ScoreStats)>> {
    debug_assert_eq!(model.layout(), HeadLayout::Sequence);
    let scores = experience_scores(model, mb)?;
    let host: Vec<f32> = scores.to_vec1().ctx(FUNC)?;
    if host.iter().any(|v| !v.is_finite()) {
        return Ok(None);
    }
    let (chosen, rejected) = split_pairs(&scores)?;
    let margins = pair_margins(mb)?;
    // Read on the host: the roles carry the margins, no device round trip is needed.
    let any_margin = mb.pairs.iter().flatten().any(|r| r.margin != 0.0);
    let out =
        compute_reward_model_loss(&chosen, &rejected, any_margin.then_some(&margins), center)?;
    let n = (mb.num_rows() / 2) as f64;
    let loss = (out.loss * (n / total_pairs)).ctx(FUNC)?;
    let side = |i: usize| {
        host.iter()
            .skip(i)
            .step_by(2)
            .map(|&v| f64::from(v))
            .sum::<f64>()
    };
    let stats = ScoreStats {
        pairs: n,
        chosen: side(0),
        rejected: side(1),
        correct: out.accuracy * n,
        squares: host.iter().map(|&v| f64::from(v).powi(2)).sum(),
    };
    Ok(Some((loss, stats)))
}
