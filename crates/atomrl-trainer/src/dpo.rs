//! The `dpo` recipe's step: preference pairs — offline from the dataset's `chosen` /
//! `rejected` completions, or online, each prompt's best sampled completion against its worst
//! (`atomrl_rollout::best_worst_pairs`) — their summed log-probs under the frozen reference,
//! then DPO's loss (`atomrl_loss::compute_dpo_loss`) over the pairs.

use std::sync::Arc;
use std::time::Instant;

use atomrl_core::shape::scalar_f64;
use atomrl_core::{CandleContext, Result};
use atomrl_loss::{compute_dpo_loss, DpoOptions};
use atomrl_model::CausalLm;
use atomrl_reward::{Accuracy, WeightedRewards};
use atomrl_rollout::parallel::Parallel;
use atomrl_rollout::{
    best_worst_pairs, experience_log_probs, pair_sums, sharded_log_probs, Experience,
};
use candle_core::Tensor;

use crate::accumulate::{accumulate_and_step, MicroStatistics, StepSettings};
use crate::config::GRPOArgs;
use crate::data::EpochSampler;
use crate::grpo::{step_report, GrpoStep, UpdateStats};
use crate::logging::keys;
use crate::recipe::{held_out_pairs, HeldOut, RecipeStep, RunData, StepExperience, StepReport};
use crate::state::TrainState;

/// The function errors name.
const FUNC: &str = "dpo_step";

/// The `dpo` recipe's step: GRPO's rollouts (scored groups), the frozen reference model (with
/// LoRA, the base weights with the adapters off, as TRL), and the loss settings.
pub(crate) struct DpoStep {
    rollouts: GrpoStep,
    reference: CausalLm,
    options: DpoOptions,
    settings: StepSettings,
    iterations: usize,
    /// Whether the pairs come from the dataset (known after the first look at it).
    offline: Option<bool>,
}

impl DpoStep {
    pub(crate) fn new(
        args: &GRPOArgs,
        model: &CausalLm,
        rewards: WeightedRewards,
        accuracy: Arc<Accuracy>,
    ) -> Result<Self> {
        // The rollouts need no reference of their own: the pairs' reference log-probs are
        // computed on the two kept rows of a group, not on all `G`.
        let rollout_args = GRPOArgs {
            beta: 0.0,
            ..args.clone()
        };
        Ok(Self {
            rollouts: GrpoStep::new(&rollout_args, model, rewards, accuracy)?,
            reference: model.frozen_copy()?,
            options: args.dpo_options(),
            settings: args.step_settings(),
            iterations: args.num_iterations.max(1),
            offline: None,
        })
    }

    /// Whether the training set holds pairs (offline DPO) or prompts (online).
    fn offline(&mut self, run: &RunData) -> Result<bool> {
        if self.offline.is_none() {
            self.offline = Some(atomrl_data::is_preference_dataset(&run.train_set)?);
        }
        Ok(self.offline == Some(true))
    }

    /// The reference log-probs of `pairs`' rows, on the update's micro-batches and shards.
    fn attach_reference(
        &self,
        run: &RunData,
        state: &TrainState,
        pairs: &mut Experience,
    ) -> Result<()> {
        if pairs.num_rows() > 0 {
            let par = Parallel {
                workers: run.args.workers,
                comm: state.comm.as_ref(),
            };
            let accumulation = self.settings.accumulation;
            pairs.ref_log_probs = Some(sharded_log_probs(
                &self.reference,
                pairs,
                par,
                accumulation,
                1.0,
            )?);
        }
        Ok(())
    }
}

impl RecipeStep for DpoStep {
    /// Offline: `batch_size` pairs of the dataset. Online: GRPO's scored groups and their
    /// best-against-worst pairs. Then the pairs' reference log-probs (sharded as the update's
    /// micro-batches).
    fn experience(
        &mut self,
        run: &RunData,
        state: &TrainState,
        step: u64,
        sampler: &mut EpochSampler,
    ) -> Result<StepExperience> {
        let started = Instant::now();
        let (mut pairs, rollouts) = if self.offline(run)? {
            let picked = run.next_examples(sampler);
            (run.encode_pairs(&picked, state.model.device())?, None)
        } else {
            let made = self.rollouts.experience(run, state, step, sampler)?;
            (best_worst_pairs(&made.experience)?, made.rollouts)
        };
        self.attach_reference(run, state, &mut pairs)?;
        Ok(StepExperience {
            experience: pairs,
            rollouts,
            seconds: started.elapsed().as_secs_f64(),
        })
    }

    /// `num_iterations` optimizer steps of DPO's loss, averaged over the step's pairs; the
    /// rollouts' metrics and `rewards/*`, `logps/*`.
    fn update(
        &mut self,
        run: &RunData,
        state: &mut TrainState,
        made: &StepExperience,
        step: u64,
        lr: f64,
    ) -> Result<StepReport> {
        let started = Instant::now();
        let exp = &made.experience;
        let pairs = exp.num_rows() / 2;
        let mut outcome = None;
        let mut stats = PairStats::default();
        let iterations = if pairs > 0 { self.iterations } else { 0 };
        for _ in 0..iterations {
            let model = &state.model;
            let (o, micro) = accumulate_and_step(
                &state.params,
                &mut state.optimizer,
                exp,
                StepSettings {
                    lr,
                    ..self.settings
                },
                state.comm.as_ref(),
                model.share_weight_casts(),
                |_, mb| pair_loss(model, mb, pairs as f64, &self.options),
            )?;
            stats = micro.iter().fold(PairStats::default(), PairStats::add);
            let skipped = o.skipped.is_some();
            outcome = Some(o);
            if skipped {
                break;
            }
        }
        let train_s = started.elapsed().as_secs_f64();
        let reason = match &outcome {
            None => Some("no prompt whose completions' rewards differ: no pair".to_string()),
            Some(o) => o.skipped.clone(),
        };
        let update = outcome.as_ref().map(|o| UpdateStats {
            loss: o.loss,
            grad_norm: o.grad_norm,
            kl: f64::NAN,
            entropy: f64::NAN,
            ..Default::default()
        });
        let mut report = if made.rollouts.is_some() {
            step_report(run, made, update.as_ref(), reason, step, lr, train_s)
        } else {
            dataset_report(update.as_ref(), reason, step, lr, made.seconds + train_s)
        };
        stats.record(&mut report.row, pairs);
        Ok(report)
    }

    /// Offline DPO's held-out pairs: their mean DPO loss (`eval/loss`) and the share whose
    /// implicit rewards rank them right (`eval/pair_accuracy`).
    fn held_out(&self, run: &RunData, state: &TrainState) -> Result<HeldOut> {
        let view = state.model.detached();
        let measured = held_out_pairs(run, state, |mut exp, total| {
            let reference = experience_log_probs(&self.reference, &exp, 1.0, false)?;
            exp.ref_log_probs = Some(reference.log_probs);
            let Some((loss, s)) = pair_loss(&view, &exp, total, &self.options)? else {
                return Ok(None);
            };
            Ok(Some((scalar_f64(FUNC, &loss)?, s.correct)))
        })?;
        Ok(HeldOut {
            loss: measured.map(|m| m.0),
            pair_accuracy: measured.map(|m| m.1),
            ..HeldOut::default()
        })
    }
}

/// The report of an offline step: the update's loss and gradient norm (NaN when none ran), the
/// learning rate, the skip flag and its warning, the step time.
fn dataset_report(
    update: Option<&UpdateStats>,
    skip_reason: Option<String>,
    step: u64,
    lr: f64,
    seconds: f64,
) -> StepReport {
    let mut row = crate::logging::MetricRow::new(step);
    row.push(keys::LOSS, update.map_or(f64::NAN, |u| u.loss));
    row.push(keys::GRAD_NORM, update.map_or(f64::NAN, |u| u.grad_norm));
    row.push(keys::LR, lr);
    row.push(
        keys::SKIPPED_STEP,
        f64::from(u8::from(skip_reason.is_some())),
    );
    row.push(keys::TIME_STEP_S, seconds);
    StepReport {
        row,
        warnings: skip_reason
            .map(|r| format!("step {step}: update skipped: {r}"))
            .into_iter()
            .collect(),
        records: Vec::new(),
    }
}

/// Sums over a micro-batch's pairs of what DPO reports (TRL's `rewards/*` and `logps/*`).
#[derive(Debug, Clone, Copy, Default)]
struct PairStats {
    pairs: f64,
    chosen_rewards: f64,
    rejected_rewards: f64,
    correct: f64,
    chosen_logps: f64,
    rejected_logps: f64,
}

impl PairStats {
    fn add(self, o: &Self) -> Self {
        Self {
            pairs: self.pairs + o.pairs,
            chosen_rewards: self.chosen_rewards + o.chosen_rewards,
            rejected_rewards: self.rejected_rewards + o.rejected_rewards,
            correct: self.correct + o.correct,
            chosen_logps: self.chosen_logps + o.chosen_logps,
            rejected_logps: self.rejected_logps + o.rejected_logps,
        }
    }

    /// The means over the step's pairs (NaN without a pair), and the pair count.
    fn record(&self, row: &mut crate::logging::MetricRow, pairs: usize) {
        let mean = |v: f64| {
            if self.pairs > 0.0 {
                v / self.pairs
            } else {
                f64::NAN
            }
        };
        row.push(keys::DPO_PAIRS, pairs as f64);
        row.push(keys::DPO_REWARDS_CHOSEN, mean(self.chosen_rewards));
        row.push(keys::DPO_REWARDS_REJECTED, mean(self.rejected_rewards));
        row.push(keys::DPO_REWARDS_ACCURACIES, mean(self.correct));
        row.push(
            keys::DPO_REWARDS_MARGINS,
            mean(self.chosen_rewards - self.rejected_rewards),
        );
        row.push(keys::DPO_LOGPS_CHOSEN, mean(self.chosen_logps));
        row.push(keys::DPO_LOGPS_REJECTED, mean(self.rejected_logps));
    }
}

impl MicroStatistics for PairStats {
    fn to_f64s(&self) -> Vec<f64> {
        vec![
            self.pairs,
            self.chosen_rewards,
            self.rejected_rewards,
            self.correct,
            self.chosen_logps,
            self.rejected_logps,
        ]
    }

    fn from_f64s(v: &[f64]) -> Self {
        let at = |i: usize| v.get(i).copied().unwrap_or(f64::NAN);
        Self {
            pairs: at(0),
            chosen_rewards: at(1),
            rejected_rewards: at(2),
            correct: at(3),
            chosen_logps: at(4),
            rejected_logps: at(5),
        }
    }
}

/// The DPO loss of micro-batch `mb` (whole pairs) under `model`: the sum of its pairs' losses
/// over the step's `total_pairs`, so that the micro-batches add up to the step's mean; `None`
/// when the policy's log-probs are not finite.
fn pair_loss(
    model: &CausalLm,
    mb: &Experience,
    total_pairs: f64,
    options: &DpoOptions,
) -> Result<Option<(Tensor, PairStats)>> {
    let Some(reference) = &mb.ref_log_probs else {
        return Err(atomrl_core::Error::missing(
            FUNC,
            "ref_log_probs",
            "the pairs' reference log-probs",
        ));
    };
    let policy = experience_log_probs(model, mb, 1.0, false)?.log_probs;
    let (chosen, rejected) = pair_sums(mb, &policy)?;
    let finite = |t: &Tensor| -> Result<bool> {
        Ok(t.to_vec1::<f32>().ctx(FUNC)?.iter().all(|v| v.is_finite()))
    };
    if !finite(&chosen)? || !finite(&rejected)? {
        return Ok(None);
    }
    let (ref_chosen, ref_rejected) = pair_sums(mb, reference)?;
    let (chosen_len, rejected_len) = pair_sums(mb, &mb.loss_mask)?;
    let out = compute_dpo_loss(
        &chosen,
        &rejected,
        &ref_chosen,
        &ref_rejected,
        Some((&chosen_len, &rejected_len)),
        options,
    )?;
    let loss = (out.losses.sum_all().ctx(FUNC)? / total_pairs).ctx(FUNC)?;
    let n = (mb.num_rows() / 2) as f64;
    let total = |t: &Tensor| -> Result<f64> {
        t.sum_all()
            .and_then(|s| s.to_dtype(candle_core::DType::F64))
            .and_then(|s| s.to_scalar::<f64>())
            .ctx(FUNC)
    };
    let stats = PairStats {
        pairs: n,
        chosen_rewards: total(&out.chosen_rewards)?,
        rejected_rewards: total(&out.rejected_rewards)?,
        correct: out.reward_accuracy * n,
        chosen_logps: total(&chosen.detach())?,
        rejected_logps: total(&rejected.detach())?,
    };
    Ok(Some((loss, stats)))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use atomrl_logprob::{get_sequence_log_probs, SequenceBatch};
    use candle_core::{DType, Device};

    const MODEL: &str = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/fixtures/reference/models/tiny-qwen2"
    );

    /// Three pairs: (prompt, chosen, rejected), prompts and sides of different lengths.
    const PAIRS: [(&[u32], &[u32], &[u32]); 3] = [
        (&[5, 6, 7], &[8, 9], &[10]),
        (&[11], &[12, 13, 14], &[15, 16]),
        (&[17, 18], &[19], &[20, 21, 22, 23]),
    ];

    /// One side of `PAIRS` right-padded, as `get_sequence_log_probs` takes it.
    fn side(chosen: bool) -> SequenceBatch {
        let seqs: Vec<(Vec<u32>, usize)> = PAIRS
            .iter()
            .map(|(p, c, r)| {
                let s = if chosen { c } else { r };
                ([*p, *s].concat(), p.len())
            })
            .collect();
        let l = seqs.iter().map(|(s, _)| s.len()).max().unwrap();
        let (mut ids, mut att, mut comp) = (Vec::new(), Vec::new(), Vec::new());
        for (s, p) in &seqs {
            for j in 0..l {
                ids.push(s.get(j).copied().unwrap_or(0));
                att.push(f32::from(u8::from(j < s.len())));
                comp.push(f32::from(u8::from(j >= *p && j < s.len())));
            }
        }
        let d = Device::Cpu;
        SequenceBatch {
            input_ids: Tensor::from_vec(ids, (PAIRS.len(), l), &d).unwrap(),
            attention_mask: Tensor::from_vec(att, (PAIRS.len(), l), &d).unwrap(),
            completion_mask: Tensor::from_vec(comp, (PAIRS.len(), l), &d).unwrap(),
        }
    }

    /// The DPO loss of the whole batch equals the sum over pair-aligned micro-batches, and
    /// both equal `compute_dpo_loss` on `get_sequence_log_probs`'s sums (another padding and
    /// another log-prob path: no shared prompt pass, right padding).
    #[test]
    fn the_pair_loss_adds_up_over_micro_batches_and_matches_the_sequence_path() {
        let reference = CausalLm::from_hf_dir(MODEL, DType::F32, &Device::Cpu).unwrap();
        let policy = CausalLm::from_hf_dir(MODEL, DType::F32, &Device::Cpu).unwrap();
        for (_, v) in policy.named_vars() {
            v.set(&(v.as_tensor() * 1.1).unwrap()).unwrap();
        }
        let mut exp = Experience::from_pairs(&PAIRS, 0, &Device::Cpu).unwrap();
        exp.ref_log_probs = Some(
            experience_log_probs(&reference, &exp, 1.0, false)
                .unwrap()
                .log_probs,
        );
        for loss_type in ["sigmoid", "ipo"] {
            let opts = DpoOptions {
                beta: 0.5,
                loss_type: loss_type.parse().unwrap(),
                label_smoothing: 0.0,
            };
            let value = |mb: &Experience| -> (f64, PairStats) {
                let (loss, stats) = pair_loss(&policy, mb, PAIRS.len() as f64, &opts)
                    .unwrap()
                    .unwrap();
                (loss.to_scalar::<f32>().unwrap() as f64, stats)
            };
            let (whole, stats) = value(&exp);
            let (a, sa) = value(&exp.rows(0, 4).unwrap());
            let (b, sb) = value(&exp.rows(4, 2).unwrap());
            assert!(
                (whole - (a + b)).abs() < 1e-5 * whole.abs(),
                "{loss_type}: {whole} vs {a} + {b}"
            );
            let summed = sa.add(&sb);
            assert_eq!(summed.pairs, 3.0);
            assert!((summed.chosen_logps - stats.chosen_logps).abs() < 1e-4);

            let (pc, pr) = (side(true), side(false));
            let pol = get_sequence_log_probs(&policy, &pc, &pr, 1.0).unwrap();
            let refs = get_sequence_log_probs(&reference, &pc, &pr, 1.0).unwrap();
            let want = compute_dpo_loss(
                &pol.chosen,
                &pol.rejected,
                &refs.chosen,
                &refs.rejected,
                Some((&pol.chosen_lengths, &pol.rejected_lengths)),
                &opts,
            )
            .unwrap();
            let want = want.loss.to_scalar::<f32>().unwrap() as f64;
            assert!(
                (whole - want).abs() < 1e-5 * want.abs().max(1.0),
                "{loss_type}: {whole} vs {want}"
            );
            assert!(whole > 0.0);
        }
    }
}
