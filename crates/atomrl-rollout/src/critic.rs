//! A critic's part of the experience (PPO): the values of the completion tokens, sharded like
//! the other log-prob passes, then per-token advantages and returns by GAE.

use atomrl_advantage::compute_gae;
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
    /// GAE λ (verl, TRL: 0.95).
    pub lam: f64,
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
/// across). The rows' own advantages are replaced.
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
/// let gae = GaeConfig { gamma: 1.0, lam: 1.0, whiten: false, micro_batches: 1 };
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
    let func = "attach_values_and_gae";
    if exp.rewards.len() != exp.num_rows() {
        return Err(Error::value(
            func,
            "exp.rewards",
            format!("{} rewards (one per row)", exp.num_rows()),
            exp.rewards.len(),
        ));
    }
    let micro = par.micro_batches(exp.num_rows(), config.micro_batches);
    let parts = sharded_chunks(
        func,
        micro.len(),
        par.workers,
        par.comm,
        exp.input_ids.device(),
        |c| {
            let mb = exp.rows(micro[c].start, micro[c].len())?;
            Ok(critic
                .completion_values(&mb.input_ids, &mb.attention_mask, mb.completion_len)?
                .detach())
        },
    )?;
    let values = Tensor::cat(&parts, 0).ctx(func)?;
    let rewards = token_rewards(exp)?;
    let gae = compute_gae(
        &rewards,
        &values,
        &exp.loss_mask,
        config.gamma,
        config.lam,
        config.whiten,
    )?;
    exp.advantages = gae.advantages;
    exp.returns = Some(gae.returns);
    exp.values = Some(values);
    Ok(())
}

/// Each row's total reward on its last token in the loss, 0 elsewhere: `[R, T]`.
fn token_rewards(exp: &Experience) -> Result<Tensor> {
    let func = "attach_values_and_gae";
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
