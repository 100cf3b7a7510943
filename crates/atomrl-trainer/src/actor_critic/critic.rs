//! The critic of the actor-critic recipes: a [`ValueModel`] with its own AdamW, trained on the
//! experience's returns by the clipped value loss, saved and restored with the checkpoints.

use std::path::Path;

use atomrl_core::shape::masked_sum;
use atomrl_core::{CandleContext, Error, Result};
use atomrl_dist::Collective;
use atomrl_loss::{compute_value_loss, AggOptions};
use atomrl_model::{CausalLm, PolicyCut, ValueModel};
use atomrl_rollout::{experience_values, Experience};
use candle_core::{Tensor, Var};

use crate::accumulate::{accumulate_and_step, with_step_normalizer, MicroStatistics, StepSettings};
use crate::config::{CriticArgs, GRPOArgs};
use crate::grpo::ValueTerm;
use crate::optim::AdamW;

/// The critic's folder inside a checkpoint (transformers' token-classification layout).
pub const CRITIC_DIR: &str = "critic";

/// What a critic update measured.
#[derive(Debug, Clone, Default)]
pub(crate) struct CriticStats {
    /// The value loss (times `vf_coef`), last epoch.
    pub value_loss: f64,
    /// Token share with the value clip active, last epoch.
    pub clip_frac: f64,
    /// Gradient norm before clipping, last epoch.
    pub grad_norm: f64,
    /// Why an epoch was skipped, if one was.
    pub skipped: Option<String>,
}

/// A micro-batch's token-weighted clip fraction.
#[derive(Debug, Clone, Copy, Default)]
struct ClipCount {
    clipped: f64,
    tokens: f64,
}

impl MicroStatistics for ClipCount {
    fn to_f64s(&self) -> Vec<f64> {
        vec![self.clipped, self.tokens]
    }
    fn from_f64s(v: &[f64]) -> Self {
        let at = |i: usize| v.get(i).copied().unwrap_or(0.0);
        Self {
            clipped: at(0),
            tokens: at(1),
        }
    }
}

/// The critic, its trainable parameters and its optimizer.
pub(crate) struct Critic {
    pub model: ValueModel,
    params: Vec<(String, Var)>,
    optimizer: AdamW,
    settings: CriticArgs,
    lr: f64,
}

impl Critic {
    /// The critic of `args` for `policy`: a copy of the policy's transformer (its first
    /// `critic.num_layers` layers, its MLPs cut to `critic.intermediate_size` neurons, its
    /// attentions to `critic.num_attention_heads` query heads) with a
    /// zero head, or `critic.model`'s weights; with `[lora]`, adapters of its own; the
    /// policy's compute dtype and gradient checkpointing. With `critic.share_backbone`, a zero
    /// head on the policy's own transformer (only the head is this critic's to train).
    pub fn new(args: &GRPOArgs, policy: &CausalLm) -> Result<Self> {
        let settings = args.critic();
        let lr = settings
            .lr
            .ok_or_else(|| Error::missing("config", "critic.lr", "the critic's learning rate"))?;
        let model = if settings.share_backbone {
            // The policy's transformer, its adapters, dtype and checkpointing included.
            ValueModel::sharing_backbone(policy)?
        } else {
            let mut model = match &settings.model {
                Some(dir) => load_critic(dir, policy)?,
                None => {
                    let s = &settings;
                    let cut =
                        PolicyCut::new(s.num_layers, s.intermediate_size, s.num_attention_heads);
                    ValueModel::from_policy_cut(policy, cut).map_err(|e| e.in_table("critic"))?
                }
            };
            if let Some(l) = &args.lora {
                // Its own seed: the critic's adapters do not start as the actor's.
                model
                    .add_lora(crate::runtime::lora_config(l)?, args.seed.wrapping_add(1))
                    .map_err(|e| e.in_table("lora"))?;
            }
            model.set_compute_dtype(policy.compute_dtype())?;
            model.set_gradient_checkpointing(policy.gradient_checkpointing());
            model.set_attention_scores_budget(policy.attention_scores_budget());
            model
        };
        let params = model.trainable_vars();
        let optimizer = AdamW::new(params.clone(), args.adamw())?;
        Ok(Self {
            model,
            params,
            optimizer,
            settings,
            lr,
        })
    }

    /// `iterations` optimizer steps of the critic on `exp` (which has `values` and
    /// `returns`): the clipped value loss `vf_coef · 0.5 · agg(max((V − R)², (clip(V) −
    /// R)²))` with the step's normaliser, accumulated over the micro-batches of every worker
    /// and rank like the policy's.
    ///
    /// `first_epoch`: the critic's values of each micro-batch with their graph, from the value
    /// pass that made `exp` (`attach_values_and_gae_keeping_graphs`, same weights): the first
    /// epoch backpropagates through them instead of running the critic's forward again. A
    /// micro-batch without one (another rank's, or a shape that no longer fits) runs it.
    pub fn update(
        &mut self,
        exp: &Experience,
        steps: StepSettings,
        agg: AggOptions,
        iterations: usize,
        comm: &dyn Collective,
        first_epoch: Option<&[Option<Tensor>]>,
    ) -> Result<CriticStats> {
        let func = "critic update";
        let agg = with_step_normalizer(agg, &exp.normalizer);
        let settings = StepSettings {
            lr: self.lr,
            ..steps
        };
        // A shared transformer is the actor's to train: the head learns on its detached
        // states, and the backward pass stops at the head.
        let view;
        let model = if self.model.shares_backbone() {
            view = self.model.detached();
            &view
        } else {
            &self.model
        };
        let c = &self.settings;
        let micro_loss = |kept: Option<&[Option<Tensor>]>, i: usize, mb: &Experience| {
            let (Some(old), Some(returns)) = (&mb.values, &mb.returns) else {
                return Err(Error::missing(
                    func,
                    "values",
                    "the experience's values and returns (attach_values_and_gae)",
                ));
            };
            let values = match kept.and_then(|k| k.get(i)).and_then(Option::as_ref) {
                Some(v) if v.dims() == mb.loss_mask.dims() => v.clone(),
                _ => experience_values(model, mb)?,
            };
            if !masked_sum(func, &values, &mb.loss_mask)?.is_finite() {
                return Ok(None);
            }
            let out = compute_value_loss(
                &values,
                old,
                returns,
                &mb.loss_mask,
                c.clip_range_value,
                &agg,
            )?;
            let tokens = mb.loss_tokens(func)?;
            let loss = (out.loss * c.vf_coef).ctx(func)?;
            let count = ClipCount {
                clipped: out.clip_frac * tokens,
                tokens,
            };
            Ok(Some((loss, count)))
        };
        let mut stats = CriticStats::default();
        for epoch in 0..iterations {
            let kept = if epoch == 0 { first_epoch } else { None };
            let (outcome, counts) = accumulate_and_step(
                &self.params,
                &mut self.optimizer,
                exp,
                settings,
                comm,
                self.model.backbone().share_weight_casts(),
                |i, mb| micro_loss(kept, i, mb),
            )?;
            let (clipped, tokens) = counts
                .iter()
                .fold((0.0, 0.0), |(a, b), c| (a + c.clipped, b + c.tokens));
            stats.value_loss = outcome.loss;
            stats.grad_norm = outcome.grad_norm;
            stats.clip_frac = if tokens > 0.0 { clipped / tokens } else { 0.0 };
            if outcome.skipped.is_some() {
                stats.skipped = outcome.skipped;
            }
        }
        Ok(stats)
    }

    /// Whether the head reads the policy's transformer (`critic.share_backbone`).
    pub fn shares_backbone(&self) -> bool {
        self.model.shares_backbone()
    }

    /// The head's part of the actor's update when the transformer is shared.
    pub fn value_term(&mut self) -> ValueTerm<'_> {
        ValueTerm {
            critic: &self.model,
            optimizer: &mut self.optimizer,
            lr: self.lr,
            vf_coef: self.settings.vf_coef,
            clip_range_value: self.settings.clip_range_value,
        }
    }

    /// Writes the critic (`dir/critic/`, transformers' layout) and its optimizer.
    pub fn save(&self, dir: &Path) -> Result<()> {
        let out = dir.join(CRITIC_DIR);
        self.model.save_hf(&out)?;
        self.optimizer
            .save(&out.join(crate::checkpoint::OPTIMIZER_FILE))
    }

    /// Restores what [`Critic::save`] wrote to `dir`.
    pub fn load(&mut self, dir: &Path) -> Result<()> {
        let from = dir.join(CRITIC_DIR);
        self.model.load_trainable(&from)?;
        self.optimizer
            .load(&from.join(crate::checkpoint::OPTIMIZER_FILE))
    }
}

/// The critic in folder (or hub id) `dir`, checked against the policy: the same vocabulary
/// (the critic reads the policy's tokens).
fn load_critic(dir: &str, policy: &CausalLm) -> Result<ValueModel> {
    let path = crate::runtime::resolve_model_dir(dir)?;
    let critic = ValueModel::from_hf_dir(&path, policy.device())?;
    let (theirs, ours) = (
        critic.backbone().config().vocab_size,
        policy.config().vocab_size,
    );
    if theirs != ours {
        return Err(Error::value(
            "config",
            "critic.model",
            format!("a critic over the policy's {ours}-token vocabulary"),
            format!("{} with vocab_size {theirs}", path.display()),
        ));
    }
    Ok(critic)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use atomrl_config::{CriticArgs, Recipe};
    use atomrl_dist::SingleProcess;
    use atomrl_rollout::parallel::Parallel;
    use atomrl_rollout::{attach_values_and_gae_keeping_graphs, outcome_token_rewards, GaeConfig};
    use candle_core::{DType, Device};

    /// The critic's first epoch through the value pass's graphs updates the weights exactly as
    /// running its forward again does.
    #[test]
    fn the_first_epoch_through_the_value_pass_graphs_gives_the_same_weights() {
        let dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/fixtures/reference/models/tiny-qwen2"
        );
        let policy = CausalLm::from_hf_dir(dir, DType::F32, &Device::Cpu).unwrap();
        let mut args = GRPOArgs::preset(Recipe::Ppo);
        args.critic = Some(CriticArgs {
            lr: Some(1e-2),
            ..CriticArgs::default()
        });
        let rows: [(&[u32], &[u32], &[bool]); 4] = [
            (&[1, 2], &[3, 4, 5], &[true; 3]),
            (&[1, 2], &[6], &[true]),
            (&[7], &[8, 9], &[true; 2]),
            (&[7], &[10, 11, 12], &[true; 3]),
        ];
        let mut exp = Experience::from_rows(&rows, &[0.0; 4], &[true; 4], 0, &Device::Cpu).unwrap();
        exp.rewards = vec![1.0, 0.0, 0.5, -1.0];
        let gae = GaeConfig {
            gamma: 1.0,
            lam: 0.95,
            actor_lam: None,
            whiten: true,
            micro_batches: 1,
        };
        let rewards = outcome_token_rewards(&exp).unwrap();
        let par = Parallel {
            workers: 2,
            comm: &SingleProcess,
        };
        let mut reused = Critic::new(&args, &policy).unwrap();
        let mut rerun = Critic::new(&args, &policy).unwrap();
        let kept =
            attach_values_and_gae_keeping_graphs(&mut exp, &reused.model, par, &gae, &rewards)
                .unwrap();
        assert!(kept.iter().all(Option::is_some));
        let steps = StepSettings {
            accumulation: 1,
            workers: 2,
            max_grad_norm: 1.0,
            lr: 0.0,
        };
        let agg = AggOptions::default();
        for (critic, first) in [(&mut reused, Some(kept.as_slice())), (&mut rerun, None)] {
            let stats = critic
                .update(&exp, steps, agg, 2, &SingleProcess, first)
                .unwrap();
            assert!(stats.value_loss > 0.0 && stats.skipped.is_none());
        }
        let bits = |c: &Critic| -> Vec<Vec<u32>> {
            c.model
                .named_vars()
                .iter()
                .map(|(_, v)| {
                    let t = v
                        .as_tensor()
                        .flatten_all()
                        .unwrap()
                        .to_vec1::<f32>()
                        .unwrap();
                    t.iter().map(|x| x.to_bits()).collect()
                })
                .collect()
        };
        assert_eq!(bits(&reused), bits(&rerun));
        let start = Critic::new(&args, &policy).unwrap();
        assert_ne!(bits(&reused), bits(&start), "the update moved the weights");
    }
}
