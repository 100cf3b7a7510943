//! A critic's part of the experience (PPO): the values of the completion tokens, sharded like
//! the other log-prob passes, then per-token advantages and returns by GAE.

use std::sync::Mutex;

use atomrl_advantage::compute_gae;
use atomrl_core::shape::flat_f64;
use atomrl_core::{CandleContext, Error, Result};
use atomrl_model::ValueModel;
use candle_core::Tensor;

use crate::experience::Experience;
use crate::parallel::{sharded_chunks, Parallel};

/// How [`attach_values_and_gae`] turns rewards and values into advantages.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GaeConfig {
    /// Discount γ (LLM PPO: 1).
    pub gamma: f64,
    /// GAE λ (verl, TRL: 0.95): of the returns the critic learns, and of the advantages
    /// unless `actor_lam` is set.
    pub lam: f64,
    /// λ of the advantages alone (VC-PPO's decoupled GAE: the returns keep `lam`). `None`:
    /// `lam`.
    pub actor_lam: Option<f64>,
    /// Standardise the advantages over the batch's valid tokens.
    pub whiten: bool,
    /// Micro-batches per worker of the update: the value pass uses the update's micro-batches
    /// and shard rule.
    pub micro_batches: usize,
}

/// Adds a critic's view to `exp`: `values [R, T]` (the value of the state before each
/// completion token, without a graph, micro-batch by micro-batch on the worker and rank that
/// will train on it, then shared), and — from the token-level rewards (each row's total
/// reward on its last token in the loss) — per-token `advantages [R, T]` and `returns [R, T]`
/// by [`compute_gae`] over the loss mask (tool observations are gaps the recursion carries
/// across). The rows' own advantages are replaced. With a [`GaeConfig::actor_lam`] other than
/// `lam`, the advantages come from a second recursion with that λ and the returns from the
/// first (unwhitened).
///
/// # Errors
/// An experience without rewards (e.g. SFT's), `compute_gae`'s errors (γ or λ outside
/// `[0, 1]`, whitening with fewer than 2 valid tokens), model failures, a failed collective.
///
/// ```
/// use atomrl_dist::SingleProcess;
/// use atomrl_model::{CausalLm, ValueModel};
/// use atomrl_rollout::parallel::Parallel;
/// use atomrl_rollout::{attach_values_and_gae, Experience, GaeConfig};
/// use candle_core::{DType, Device};
/// let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/reference/models/tiny-qwen2");
/// let critic = ValueModel::from_policy(&CausalLm::from_hf_dir(dir, DType::F32, &Device::Cpu)?)?;
/// let rows: [(&[u32], &[u32], &[bool]); 2] = [(&[1, 2], &[3, 4], &[true; 2]), (&[1, 2], &[5], &[true])];
/// let mut exp = Experience::from_rows(&rows, &[0.0, 0.0], &[true; 2], 0, &Device::Cpu)?;
/// exp.rewards = vec![1.0, 0.0];
/// let gae = GaeConfig { gamma: 1.0, lam: 1.0, actor_lam: None, whiten: false, micro_batches: 1 };
/// attach_values_and_gae(&mut exp, &critic, Parallel { workers: 1, comm: &SingleProcess }, &gae)?;
/// // A fresh critic predicts 0: each token's advantage is its row's reward.
/// assert_eq!(exp.advantages.to_vec2::<f32>()?, [[1.0, 1.0], [0.0, 0.0]]);
/// assert_eq!(exp.returns.unwrap().to_vec2::<f32>()?, [[1.0, 1.0], [0.0, 0.0]]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn attach_values_and_gae(
    exp: &mut Experience,
    critic: &ValueModel,
    par: Parallel<'_>,
    config: &GaeConfig,
) -> Result<()> {
    let rewards = outcome_token_rewards(exp)?;
    attach_values_and_gae_with(exp, critic, par, config, &rewards)
}

/// [`attach_values_and_gae`] with the token-level rewards given: [`outcome_token_rewards`]
/// plus any per-token terms, e.g. PPO's KL penalty (`atomrl_loss::apply_kl_penalty`).
///
/// # Shapes
/// `token_rewards [R, T]`, as the experience's loss mask.
///
/// # Errors
/// As [`attach_values_and_gae`]; token rewards of another shape.
pub fn attach_values_and_gae_with(
    exp: &mut Experience,
    critic: &ValueModel,
    par: Parallel<'_>,
    config: &GaeConfig,
    token_rewards: &Tensor,
) -> Result<()> {
    attach(exp, critic, par, config, token_rewards, false).map(drop)
}

/// [`attach_values_and_gae_with`] that also returns, by micro-batch, the values this process
/// computed with their graph (`None`: another rank's micro-batch): with `critic` not detached,
/// the critic's first update epoch on these micro-batches can backpropagate through them
/// instead of running its forward again (the same weights give the same values).
/// `exp.values` holds them without a graph, as always.
///
/// # Errors
/// As [`attach_values_and_gae_with`].
///
/// ```
/// use atomrl_dist::SingleProcess;
/// use atomrl_model::{CausalLm, ValueModel};
/// use atomrl_rollout::parallel::Parallel;
/// use atomrl_rollout::{attach_values_and_gae_keeping_graphs, outcome_token_rewards, Experience, GaeConfig};
/// use candle_core::{DType, Device};
/// let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/reference/models/tiny-qwen2");
/// let critic = ValueModel::from_policy(&CausalLm::from_hf_dir(dir, DType::F32, &Device::Cpu)?)?;
/// let rows: [(&[u32], &[u32], &[bool]); 2] = [(&[1, 2], &[3, 4], &[true; 2]), (&[1, 2], &[5], &[true])];
/// let mut exp = Experience::from_rows(&rows, &[0.0, 0.0], &[true; 2], 0, &Device::Cpu)?;
/// exp.rewards = vec![1.0, 0.0];
/// let gae = GaeConfig { gamma: 1.0, lam: 1.0, actor_lam: None, whiten: false, micro_batches: 1 };
/// let rewards = outcome_token_rewards(&exp)?;
/// let par = Parallel { workers: 2, comm: &SingleProcess };
/// let kept = attach_values_and_gae_keeping_graphs(&mut exp, &critic, par, &gae, &rewards)?;
/// assert_eq!(kept.len(), 2); // one micro-batch per worker, both on this process
/// let first = kept[0].as_ref().unwrap();
/// let stored = exp.values.as_ref().unwrap().narrow(0, 0, 1)?;
/// assert_eq!(first.to_vec2::<f32>()?, stored.to_vec2::<f32>()?);
/// let grads = first.sum_all()?.backward()?; // the graph reaches the critic's weights
/// assert!(critic.trainable_vars().iter().all(|(_, v)| grads.get(v.as_tensor()).is_some()));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn attach_values_and_gae_keeping_graphs(
    exp: &mut Experience,
    critic: &ValueModel,
    par: Parallel<'_>,
    config: &GaeConfig,
    token_rewards: &Tensor,
) -> Result<Vec<Option<Tensor>>> {
    attach(exp, critic, par, config, token_rewards, true)
}

fn attach(
    exp: &mut Experience,
    critic: &ValueModel,
    par: Parallel<'_>,
    config: &GaeConfig,
    token_rewards: &Tensor,
    keep: bool,
) -> Result<Vec<Option<Tensor>>> {
    let func = "attach_values_and_gae";
    if token_rewards.dims() != exp.loss_mask.dims() {
        return Err(Error::value(
            func,
            "token_rewards",
            format!("shape {:?} (the loss mask's)", exp.loss_mask.dims()),
            format!("{:?}", token_rewards.dims()),
        ));
    }
    let micro = par.micro_batches(exp.num_rows(), config.micro_batches);
    let kept = Mutex::new(vec![None; micro.len()]);
    let poisoned = || Error::missing(func, "values", "a worker that did not panic");
    let parts = sharded_chunks(
        func,
        micro.len(),
        par.workers,
        par.comm,
        exp.input_ids.device(),
        |c| {
            let mb = exp.rows(micro[c].start, micro[c].len())?;
            let values = experience_values(critic, &mb)?;
            if keep {
                kept.lock().map_err(|_| poisoned())?[c] = Some(values.clone());
            }
            Ok(values.detach())
        },
    )?;
    let values = Tensor::cat(&parts, 0).ctx(func)?;
    let gae = |lam, whiten| {
        compute_gae(
            token_rewards,
            &values,
            &exp.loss_mask,
            config.gamma,
            lam,
            whiten,
        )
    };
    let (advantages, returns) = match config.actor_lam {
        Some(actor_lam) if actor_lam != config.lam => (
            gae(actor_lam, config.whiten)?.advantages,
            gae(config.lam, false)?.returns,
        ),
        _ => {
            let out = gae(config.lam, config.whiten)?;
            (out.advantages, out.returns)
        }
    };
    exp.advantages = advantages;
    exp.returns = Some(returns);
    exp.values = Some(values);
    kept.into_inner().map_err(|_| poisoned())
}

/// The critic's values of the states before each completion token of `exp`, `[R, T]`
/// (differentiable): rows that share prompts run each prompt once
/// ([`atomrl_logprob::get_shared_prompt_hidden`], as [`crate::experience_log_probs`] does for
/// the policy), else [`ValueModel::completion_values`] on the padded rows.
///
/// # Errors
/// Model failures.
///
/// ```
/// use atomrl_model::{CausalLm, ValueModel};
/// use atomrl_rollout::{experience_values, Experience};
/// use candle_core::{DType, Device};
/// let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/reference/models/tiny-qwen2");
/// let critic = ValueModel::from_policy(&CausalLm::from_hf_dir(dir, DType::F32, &Device::Cpu)?)?;
/// let rows: [(&[u32], &[u32], &[bool]); 2] = [(&[1, 2], &[3, 4], &[true; 2]), (&[1, 2], &[5], &[true])];
/// let exp = Experience::from_rows(&rows, &[0.0, 0.0], &[true; 2], 0, &Device::Cpu)?;
/// assert_eq!(experience_values(&critic, &exp)?.dims(), [2, 2]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn experience_values(critic: &ValueModel, exp: &Experience) -> Result<Tensor> {
    let func = "experience_values";
    if !critic.backbone().gradient_checkpointing() {
        if let Some(shared) = exp.shared_prompts()? {
            let hidden = atomrl_logprob::get_shared_prompt_hidden(critic.backbone(), &shared)?;
            let values = critic.head(&hidden)?;
            return values.contiguous().ctx(func);
        }
    }
    critic.completion_values(&exp.input_ids, &exp.attention_mask, exp.completion_len)
}

/// How well a critic's values fit the returns of an experience (`values_statistics`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ValueStatistics {
    /// Masked mean of the values.
    pub values_mean: f64,
    /// Masked mean of the returns.
    pub returns_mean: f64,
    /// `1 − Var(R − V) / Var(R)` over the loss mask: 1 for a perfect critic, 0 for one that
    /// predicts the mean, NaN when the returns do not vary.
    pub explained_variance: f64,
}

/// The [`ValueStatistics`] of an experience with values and returns (NaN everywhere without
/// them, or without a token in the loss).
///
/// # Errors
/// Tensor failures.
///
/// ```
/// use atomrl_rollout::{values_statistics, Experience};
/// use candle_core::{Device, Tensor};
/// let rows: [(&[u32], &[u32], &[bool]); 2] = [(&[1], &[3, 4], &[true; 2]), (&[1], &[5, 6], &[true; 2])];
/// let mut exp = Experience::from_rows(&rows, &[0.0, 0.0], &[true; 2], 0, &Device::Cpu)?;
/// exp.returns = Some(Tensor::new(&[[1f32, 1.0], [0.0, 0.0]], &Device::Cpu)?);
/// exp.values = Some(Tensor::new(&[[1f32, 1.0], [0.0, 0.0]], &Device::Cpu)?);
/// let s = values_statistics(&exp)?;
/// assert_eq!((s.values_mean, s.returns_mean, s.explained_variance), (0.5, 0.5, 1.0));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn values_statistics(exp: &Experience) -> Result<ValueStatistics> {
    let func = "values_statistics";
    let none = ValueStatistics {
        values_mean: f64::NAN,
        returns_mean: f64::NAN,
        explained_variance: f64::NAN,
    };
    let (Some(v), Some(r)) = (&exp.values, &exp.returns) else {
        return Ok(none);
    };
    let (v, r, m) = (
        flat_f64(func, v)?,
        flat_f64(func, r)?,
        flat_f64(func, &exp.loss_mask)?,
    );
    let n: f64 = m.iter().sum();
    if n == 0.0 {
        return Ok(none);
    }
    let mean = |x: &dyn Fn(usize) -> f64| (0..m.len()).map(|i| m[i] * x(i)).sum::<f64>() / n;
    let var = |x: &dyn Fn(usize) -> f64| {
        let mu = mean(x);
        mean(&|i| (x(i) - mu).powi(2))
    };
    let var_r = var(&|i| r[i]);
    Ok(ValueStatistics {
        values_mean: mean(&|i| v[i]),
        returns_mean: mean(&|i| r[i]),
        explained_variance: if var_r > 0.0 {
            1.0 - var(&|i| r[i] - v[i]) / var_r
        } else {
            f64::NAN
        },
    })
}

/// Each row's total reward on its last token in the loss, 0 elsewhere: `[R, T]` (a row with
/// no token in the loss gets none).
///
/// # Errors
/// Rewards that are not one per row.
///
/// ```
/// use atomrl_rollout::{outcome_token_rewards, Experience};
/// use candle_core::Device;
/// let rows: [(&[u32], &[u32], &[bool]); 2] = [(&[1], &[3, 4, 5], &[true; 3]), (&[1], &[5], &[true])];
/// let mut exp = Experience::from_rows(&rows, &[0.0, 0.0], &[true; 2], 0, &Device::Cpu)?;
/// exp.rewards = vec![1.0, 0.5];
/// assert_eq!(outcome_token_rewards(&exp)?.to_vec2::<f32>()?, [[0.0, 0.0, 1.0], [0.5, 0.0, 0.0]]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn outcome_token_rewards(exp: &Experience) -> Result<Tensor> {
    let func = "outcome_token_rewards";
    if exp.rewards.len() != exp.num_rows() {
        return Err(Error::value(
            func,
            "exp.rewards",
            format!("{} rewards (one per row)", exp.num_rows()),
            exp.rewards.len(),
        ));
    }
    let mask: Vec<Vec<f32>> = exp.loss_mask.to_vec2().ctx(func)?;
    let t = exp.completion_len;
    let mut out = vec![0f32; exp.num_rows() * t];
    for (r, row) in mask.iter().enumerate() {
        if let Some(last) = row.iter().rposition(|&m| m != 0.0) {
            out[r * t + last] = exp.rewards[r];
        }
    }
    Tensor::from_vec(out, (exp.num_rows(), t), exp.loss_mask.device()).ctx(func)
}
