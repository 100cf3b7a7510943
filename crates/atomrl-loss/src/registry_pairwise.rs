//! Registration of the pairwise preference losses (DPO, reward model) with `atomrl-fn`.

use atomrl_core::shape::scalar_f64;
use atomrl_core::{ArgSpec, AtomicFn, FnSpec, Inputs, OutputSpec, Outputs, Result};

use crate::{DpoLossType, DpoOptions};

/// The pairwise losses' entries.
pub(crate) fn functions() -> Vec<AtomicFn> {
    vec![
        AtomicFn {
            spec: COMPUTE_DPO_LOSS,
            run: run_compute_dpo_loss,
        },
        AtomicFn {
            spec: COMPUTE_REWARD_MODEL_LOSS,
            run: run_compute_reward_model_loss,
        },
    ]
}

const COMPUTE_DPO_LOSS: FnSpec = FnSpec {
    name: "compute_dpo_loss",
    crate_name: "atomrl-loss",
    summary: "DPO loss of preference pairs from summed completion log-probs (sigmoid, hinge, ipo, robust), with the implicit rewards",
    formula: "\
delta   = (chosen - ref_chosen) - (rejected - ref_rejected)          TRL 1.16 DPOTrainer, reverse KL
sigmoid = -logsigmoid(beta * delta)
hinge   = relu(1 - beta * delta)
ipo     = (chosen_ratio / chosen_len - rejected_ratio / rejected_len - 1 / (2 beta))^2   (lengths clamped >= 1)
robust  = ((1 - eps) * -logsigmoid(beta * delta) - eps * -logsigmoid(-beta * delta)) / (1 - 2 eps)
loss = mean(losses); chosen_rewards = beta * (chosen - ref_chosen); rejected_rewards likewise
reward_accuracy = mean(chosen_rewards > rejected_rewards); reward_margin = mean(chosen_rewards - rejected_rewards)
eps = label_smoothing is read by robust only (in [0, 0.5)), as in TRL 1.16. Differentiable w.r.t.
the policy's log-probs.",
    inputs: &[
        ArgSpec::tensor("chosen_log_probs", "[N]", "f32", "policy log-prob of each chosen completion, summed over its tokens"),
        ArgSpec::tensor("rejected_log_probs", "[N]", "f32", "policy log-prob of each rejected completion, summed"),
        ArgSpec::tensor("ref_chosen_log_probs", "[N]", "f32", "reference log-prob of each chosen completion, summed"),
        ArgSpec::tensor("ref_rejected_log_probs", "[N]", "f32", "reference log-prob of each rejected completion, summed"),
        ArgSpec::option("beta", "f64", "0.1", "strength of the implicit KL to the reference (> 0)"),
        ArgSpec::option("loss_type", "string", "sigmoid", "sigmoid | hinge | ipo | robust"),
        ArgSpec::option("label_smoothing", "f64", "0", "assumed share of flipped labels (robust only; in [0, 0.5))"),
        ArgSpec::optional_tensor("chosen_lengths", "[N]", "f32", "completion token counts of the chosen side (required by ipo)"),
        ArgSpec::optional_tensor("rejected_lengths", "[N]", "f32", "completion token counts of the rejected side (required by ipo)"),
    ],
    outputs: &[
        OutputSpec::new("losses", "[N]", "f32", "the loss of each pair"),
        OutputSpec::new("loss", "scalar", "f32", "mean of losses"),
        OutputSpec::new("chosen_rewards", "[N]", "f32", "beta * (chosen - ref_chosen)"),
        OutputSpec::new("rejected_rewards", "[N]", "f32", "beta * (rejected - ref_rejected)"),
        OutputSpec::new("reward_accuracy", "scalar", "f64", "share of pairs with chosen_rewards > rejected_rewards"),
        OutputSpec::new("reward_margin", "scalar", "f64", "mean of chosen_rewards - rejected_rewards"),
    ],
    example_input: r#"{"chosen_log_probs": [-5.0, -9.0], "rejected_log_probs": [-7.0, -6.0], "ref_chosen_log_probs": [-6.0, -8.0], "ref_rejected_log_probs": [-6.0, -7.0], "beta": 0.1}"#,
    example_output: r#"{"losses": {"shape": [2], "data": [0.5981389, 0.7981389]}, "loss": 0.6981389, "chosen_rewards": {"shape": [2], "data": [0.1, -0.1]}, "rejected_rewards": {"shape": [2], "data": [-0.1, 0.1]}, "reward_accuracy": 0.5, "reward_margin": 0.0}"#,
};

fn run_compute_dpo_loss(inputs: &Inputs) -> Result<Outputs> {
    let func = inputs.func();
    let opts = DpoOptions {
        beta: inputs.opt_f64("beta")?.unwrap_or(0.1),
        loss_type: inputs
            .opt_str("loss_type")?
            .unwrap_or("sigmoid")
            .parse::<DpoLossType>()?,
        label_smoothing: inputs.opt_f64("label_smoothing")?.unwrap_or(0.0),
    };
    let chosen_len = inputs.opt_float_tensor("chosen_lengths")?;
    let rejected_len = inputs.opt_float_tensor("rejected_lengths")?;
    let lengths = match (&chosen_len, &rejected_len) {
        (Some(c), Some(r)) => Some((c, r)),
        (Some(_), None) => {
            return Err(atomrl_core::Error::missing(
                func,
                "rejected_lengths",
                "both sides' lengths",
            ))
        }
        (None, Some(_)) => {
            return Err(atomrl_core::Error::missing(
                func,
                "chosen_lengths",
                "both sides' lengths",
            ))
        }
        (None, None) => None,
    };
    let out = crate::compute_dpo_loss(
        &inputs.float_tensor("chosen_log_probs")?,
        &inputs.float_tensor("rejected_log_probs")?,
        &inputs.float_tensor("ref_chosen_log_probs")?,
        &inputs.float_tensor("ref_rejected_log_probs")?,
        lengths,
        &opts,
    )?;
    Ok(Outputs::new()
        .tensor("losses", &out.losses)
        .scalar("loss", scalar_f64(func, &out.loss)?)
        .tensor("chosen_rewards", &out.chosen_rewards)
        .tensor("rejected_rewards", &out.rejected_rewards)
        .scalar("reward_accuracy", out.reward_accuracy)
        .scalar("reward_margin", out.reward_margin))
}

const COMPUTE_REWARD_MODEL_LOSS: FnSpec = FnSpec {
    name: "compute_reward_model_loss",
    crate_name: "atomrl-loss",
    summary: "Bradley-Terry loss of a reward model on preference pairs, with accuracy and margin (TRL RewardTrainer)",
    formula: "\
loss = -mean(logsigmoid(chosen_rewards - rejected_rewards - margin))      margin = 0 when absent
       + center_rewards_coefficient * mean((chosen_rewards + rejected_rewards)^2)   when given
accuracy = mean(chosen_rewards > rejected_rewards); margin = mean(chosen_rewards - rejected_rewards)
TRL 1.16 RewardTrainer.compute_loss. Differentiable w.r.t. both rewards.",
    inputs: &[
        ArgSpec::tensor("chosen_rewards", "[N]", "f32", "the reward model's score of each chosen completion"),
        ArgSpec::tensor("rejected_rewards", "[N]", "f32", "its score of each rejected completion"),
        ArgSpec::optional_tensor("margin", "[N]", "f32", "a required gap per pair (the dataset's `margin`)"),
        ArgSpec::optional("center_rewards_coefficient", "f64", "weight of the centring term (>= 0)"),
    ],
    outputs: &[
        OutputSpec::new("loss", "scalar", "f32", "the loss"),
        OutputSpec::new("accuracy", "scalar", "f64", "share of pairs with chosen > rejected"),
        OutputSpec::new("margin", "scalar", "f64", "mean of chosen - rejected"),
    ],
    example_input: r#"{"chosen_rewards": [1.0, 0.0], "rejected_rewards": [0.0, 0.5]}"#,
    example_output: r#"{"loss": 0.6436697, "accuracy": 0.5, "margin": 0.25}"#,
};

fn run_compute_reward_model_loss(inputs: &Inputs) -> Result<Outputs> {
    let func = inputs.func();
    let margin = inputs.opt_float_tensor("margin")?;
    let out = crate::compute_reward_model_loss(
        &inputs.float_tensor("chosen_rewards")?,
        &inputs.float_tensor("rejected_rewards")?,
        margin.as_ref(),
        inputs.opt_f64("center_rewards_coefficient")?,
    )?;
    Ok(Outputs::new()
        .scalar("loss", scalar_f64(func, &out.loss)?)
        .scalar("accuracy", out.accuracy)
        .scalar("margin", out.margin))
}
